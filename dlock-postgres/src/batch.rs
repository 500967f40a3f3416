//! Grants and releases of one lock session that travel together.
//!
//! A session's backend runs its statements one after another, and most of what a grant or a
//! release costs it is the statement around the work (setting up its plan, its transaction,
//! its answer), not the work on one key. So while a grant is on its way, the session's next
//! grants wait, and go together as one statement when it is answered
//! ([`sql::GRANT_MANY`]); releases likewise ([`sql::RELEASE_MANY`]). A grant or release that
//! finds none of its kind on its way goes alone, at once, as the statement of one key it always
//! was: a lone task waits for nothing.
//!
//! Each key of a statement keeps its own answer (its token, its place in the queue, whether it
//! was held), decided as if it had gone alone: no two grants of one statement share a name or a
//! key, and no two releases a hold (a second one goes alone, beside it). A statement that fails
//! fails for each of its keys, and each caller undoes its own grant as it would after its own
//! statement failed.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use dlock_core::{Error, Result};
use tokio::sync::oneshot;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::error::BACKEND;
use crate::session::Session;
use crate::sql::{self, KeyParams};

/// The most requests that wait for one statement; one that finds this many goes alone, beside
/// them.
const MOST: usize = 128;

/// A request that can share a statement with others of its kind.
pub(crate) trait Together: Sized + Send + 'static {
    /// Whether the two may not go in one statement.
    fn clashes(&self, other: &Self) -> bool;
    /// Runs the request alone: the rows of its own statement.
    fn alone(&self, session: &Session) -> impl Future<Output = Result<Vec<Row>>> + Send;
    /// Runs the requests as one statement: one row each, in their order.
    fn together(
        requests: &[Self],
        session: &Session,
    ) -> impl Future<Output = Result<Vec<Row>>> + Send;
}

/// The requests of one kind waiting for the one on its way.
pub(crate) struct Group<R> {
    state: Mutex<Waiting<R>>,
}

type Answer = oneshot::Sender<Result<Vec<Row>>>;

struct Waiting<R> {
    /// A statement of this kind is on its way: new requests wait.
    busy: bool,
    requests: Vec<(R, Answer)>,
}

impl<R> Default for Group<R> {
    fn default() -> Self {
        Group {
            state: Mutex::new(Waiting {
                busy: false,
                requests: Vec::new(),
            }),
        }
    }
}

impl<R: Together> Group<R> {
    fn state(&self) -> MutexGuard<'_, Waiting<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a request does when it arrives.
enum Turn<R> {
    /// Nothing of its kind is on its way: it goes now, and hands on to those that wait after.
    Lead(R),
    /// It clashes with one that waits (or too many wait): it goes now, beside them.
    Beside(R),
    /// It waits for a statement with others.
    Wait(oneshot::Receiver<Result<Vec<Row>>>),
}

/// Runs `request` on `session`, in the group `group` picks from it: alone if none of its kind
/// is on its way, otherwise with the others that arrive meanwhile. The rows are those its own
/// statement would have answered (one row for a request that went with others).
///
/// A request's statement is sent even if the caller stops waiting for it, as a request sent
/// alone is once written to the connection.
pub(crate) async fn run<R: Together>(
    session: &Arc<Session>,
    group: fn(&Session) -> &Group<R>,
    request: R,
) -> Result<Vec<Row>> {
    let turn = {
        let mut state = group(session).state();
        if !state.busy {
            state.busy = true;
            Turn::Lead(request)
        } else if state.requests.len() >= MOST
            || state.requests.iter().any(|(r, _)| r.clashes(&request))
        {
            Turn::Beside(request)
        } else {
            let (answer, answered) = oneshot::channel();
            state.requests.push((request, answer));
            Turn::Wait(answered)
        }
    };
    match turn {
        Turn::Lead(request) => {
            let _hand_on = HandOn { session, group };
            request.alone(session).await
        }
        Turn::Beside(request) => request.alone(session).await,
        Turn::Wait(answered) => answered.await.unwrap_or_else(|_| {
            Err(Error::backend(
                BACKEND,
                true,
                "the statement this request waited for was dropped",
            ))
        }),
    }
}

/// Hands on when the request that led is answered, or dropped.
struct HandOn<'a, R: Together> {
    session: &'a Arc<Session>,
    group: fn(&Session) -> &Group<R>,
}

impl<R: Together> Drop for HandOn<'_, R> {
    fn drop(&mut self) {
        hand_on(self.session, self.group);
    }
}

/// After a statement of the group: those that waited meanwhile go together, in a task of their
/// own (the request that led returns at once), and so do those that wait after them, until none
/// does.
fn hand_on<R: Together>(session: &Arc<Session>, group: fn(&Session) -> &Group<R>) {
    {
        let mut state = group(session).state();
        if state.requests.is_empty() {
            state.busy = false;
            return;
        }
    }
    let driver = Driver {
        session: session.clone(),
        group,
        done: false,
    };
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(driver.run());
    }
}

/// Sends the requests that wait, together, until none does. If it stops before that (its task
/// is dropped with a runtime that shuts down, before or while it runs), those that wait are
/// answered with an error and the next request leads: none waits for a statement that will not
/// come.
struct Driver<R: Together> {
    session: Arc<Session>,
    group: fn(&Session) -> &Group<R>,
    done: bool,
}

impl<R: Together> Driver<R> {
    async fn run(mut self) {
        loop {
            let requests = {
                let mut state = (self.group)(&self.session).state();
                if state.requests.is_empty() {
                    state.busy = false;
                    self.done = true;
                    return;
                }
                std::mem::take(&mut state.requests)
            };
            let (requests, answers): (Vec<R>, Vec<Answer>) = requests.into_iter().unzip();
            let rows = match requests.as_slice() {
                [one] => one.alone(&self.session).await,
                many => R::together(many, &self.session).await,
            };
            match rows {
                Ok(rows) if rows.len() == answers.len() => {
                    for (row, answer) in rows.into_iter().zip(answers) {
                        let _ = answer.send(Ok(vec![row]));
                    }
                }
                Ok(rows) => {
                    let message = format!(
                        "a statement of {} requests answered {} rows",
                        answers.len(),
                        rows.len()
                    );
                    for answer in answers {
                        let _ = answer.send(Err(Error::backend(BACKEND, false, message.clone())));
                    }
                }
                Err(error) => {
                    for answer in answers {
                        let _ = answer.send(Err(copy_of(&error)));
                    }
                }
            }
        }
    }
}

impl<R: Together> Drop for Driver<R> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = (self.group)(&self.session).state();
            state.busy = false;
            state.requests.clear();
        }
    }
}

/// The error of a statement, for each of its requests: unreachable stays unreachable, and
/// every other error keeps its message and whether it is temporary.
fn copy_of(error: &Error) -> Error {
    match error {
        Error::Unavailable {
            source: Some(source),
            ..
        } => Error::unreachable(source.to_string()),
        Error::Backend {
            temporary, source, ..
        } => Error::backend(BACKEND, *temporary, source.to_string()),
        other => Error::backend(BACKEND, other.is_temporary(), other.to_string()),
    }
}

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// A grant of the lock ([`sql::grant`]).
pub(crate) struct GrantRequest {
    pub(crate) key: KeyParams,
    pub(crate) name: String,
    pub(crate) record: String,
    pub(crate) waiter: String,
    /// The client's wake tag; none for a waiter that waits in the lock manager.
    pub(crate) tag: Option<Arc<str>>,
    pub(crate) lifetime: i64,
    pub(crate) may_take: bool,
}

impl Together for GrantRequest {
    fn clashes(&self, other: &Self) -> bool {
        self.name == other.name || self.key.payload == other.key.payload
    }

    async fn alone(&self, session: &Session) -> Result<Vec<Row>> {
        let statement = sql::grant(&self.key, "pg_try_advisory_lock");
        let tag = self.tag.as_deref().unwrap_or("");
        let rest: [Param<'_>; 10] = [
            (&self.name, Type::TEXT),
            (&self.record, Type::TEXT),
            (&self.key.key1, Type::INT8),
            (&self.key.key2, Type::INT8),
            (&self.key.space, Type::INT2),
            (&self.key.payload, Type::TEXT),
            (&self.waiter, Type::TEXT),
            (&tag, Type::TEXT),
            (&self.lifetime, Type::INT8),
            (&self.may_take, Type::BOOL),
        ];
        session
            .query(&statement, &self.key.with(&rest), "take the lock")
            .await
    }

    async fn together(requests: &[Self], session: &Session) -> Result<Vec<Row>> {
        let (single, high, low) = parts(requests.iter().map(|r| &r.key));
        let column = |f: fn(&Self) -> &str| requests.iter().map(f).collect::<Vec<&str>>();
        let (names, records) = (column(|r| &r.name), column(|r| &r.record));
        let (payloads, waiters, tags) = (
            column(|r| &r.key.payload),
            column(|r| &r.waiter),
            column(|r| r.tag.as_deref().unwrap_or("")),
        );
        let key1: Vec<i64> = requests.iter().map(|r| r.key.key1).collect();
        let key2: Vec<i64> = requests.iter().map(|r| r.key.key2).collect();
        let space: Vec<i16> = requests.iter().map(|r| r.key.space).collect();
        let lifetime: Vec<i64> = requests.iter().map(|r| r.lifetime).collect();
        let may_take: Vec<bool> = requests.iter().map(|r| r.may_take).collect();
        let params: [Param<'_>; 13] = [
            (&single, Type::INT8_ARRAY),
            (&high, Type::INT4_ARRAY),
            (&low, Type::INT4_ARRAY),
            (&names, Type::TEXT_ARRAY),
            (&records, Type::TEXT_ARRAY),
            (&key1, Type::INT8_ARRAY),
            (&key2, Type::INT8_ARRAY),
            (&space, Type::INT2_ARRAY),
            (&payloads, Type::TEXT_ARRAY),
            (&waiters, Type::TEXT_ARRAY),
            (&tags, Type::TEXT_ARRAY),
            (&lifetime, Type::INT8_ARRAY),
            (&may_take, Type::BOOL_ARRAY),
        ];
        session.query(&sql::GRANT_MANY, &params, "take locks").await
    }
}

/// A release of a hold ([`sql::release`]): the lock's, a reader's (`shared`) or a permit's.
pub(crate) struct ReleaseRequest {
    pub(crate) key: KeyParams,
    pub(crate) shared: bool,
    pub(crate) name: String,
    pub(crate) token: i64,
    pub(crate) payload: String,
    pub(crate) kind: &'static str,
    pub(crate) holder: String,
}

impl Together for ReleaseRequest {
    /// Only the same hold twice: holds of one key (readers, or permits whose releases announce
    /// one payload) are given back together, each by its own row, and PostgreSQL sends a
    /// notification repeated in one transaction once.
    fn clashes(&self, other: &Self) -> bool {
        self.name == other.name && self.kind == other.kind && self.holder == other.holder
    }

    async fn alone(&self, session: &Session) -> Result<Vec<Row>> {
        let function = if self.shared {
            "pg_advisory_unlock_shared"
        } else {
            "pg_advisory_unlock"
        };
        let statement = sql::release(&self.key, function);
        let rest: [Param<'_>; 5] = [
            (&self.name, Type::TEXT),
            (&self.token, Type::INT8),
            (&self.payload, Type::TEXT),
            (&self.kind, Type::TEXT),
            (&self.holder, Type::TEXT),
        ];
        session
            .query(&statement, &self.key.with(&rest), "release the lock")
            .await
    }

    async fn together(requests: &[Self], session: &Session) -> Result<Vec<Row>> {
        let (single, high, low) = parts(requests.iter().map(|r| &r.key));
        let column = |f: fn(&Self) -> &str| requests.iter().map(f).collect::<Vec<&str>>();
        let space: Vec<i16> = requests.iter().map(|r| r.key.space).collect();
        let shared: Vec<bool> = requests.iter().map(|r| r.shared).collect();
        let tokens: Vec<i64> = requests.iter().map(|r| r.token).collect();
        let (names, payloads) = (column(|r| &r.name), column(|r| &r.payload));
        let (kinds, holders) = (column(|r| r.kind), column(|r| &r.holder));
        let params: [Param<'_>; 10] = [
            (&single, Type::INT8_ARRAY),
            (&high, Type::INT4_ARRAY),
            (&low, Type::INT4_ARRAY),
            (&space, Type::INT2_ARRAY),
            (&shared, Type::BOOL_ARRAY),
            (&names, Type::TEXT_ARRAY),
            (&tokens, Type::INT8_ARRAY),
            (&payloads, Type::TEXT_ARRAY),
            (&kinds, Type::TEXT_ARRAY),
            (&holders, Type::TEXT_ARRAY),
        ];
        session
            .query(&sql::RELEASE_MANY, &params, "release locks")
            .await
    }
}

/// The keys' `$1`–`$3` as three arrays.
fn parts<'a>(keys: impl Iterator<Item = &'a KeyParams>) -> (Vec<i64>, Vec<i32>, Vec<i32>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for key in keys {
        let (single, high, low) = key.parts();
        columns.0.push(single);
        columns.1.push(high);
        columns.2.push(low);
    }
    columns
}
