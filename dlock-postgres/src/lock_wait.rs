//! Waiting in PostgreSQL's lock manager: a waiter is woken by the server process whose release
//! concerns it, not by a notification every listening process hears.
//!
//! A release announced with `pg_notify` reaches the head's client alone, but PostgreSQL signals
//! every server process of the database that listens on any channel, at each notification, and
//! each of them reads the notification queue. So with many clients waiting, every announced
//! hand-off costs time in proportion to them: measured on one PostgreSQL 15 server, one
//! notification was delivered in 131 µs (p50) with no other listener and in 773–900 µs beside 40
//! listeners on other channels, while a server process blocked on an advisory lock was woken
//! 127–137 µs after the unlock, beside 0 or 40 listeners alike.
//!
//! So a waiting acquire takes a **seat**: a connection of its own on which it holds its
//! **ticket**, an advisory lock on a key of its own (the low 64 bits of its owner token), for as
//! long as it waits. On the seat it blocks in the lock manager:
//!
//! * as the head of the lock's queue, on the lock's key: the wait returns when the lock is given
//!   back by anyone (a dlock release, another library's `pg_advisory_unlock`, a session the
//!   server ended), and the waiter attempts the grant;
//! * behind another waiter, on that waiter's ticket: it returns when the waiter ahead leaves the
//!   queue (granted, withdrawn, or its connection gone), and the waiter attempts again, to learn
//!   its new place.
//!
//! Each wait takes the key and gives it back in one statement, so nothing but the ticket is held
//! on a seat. A release therefore wakes the head alone, and a grant the next waiter alone. A
//! seated waiter's queue entry carries no wake tag, so that releases to it are not announced.
//!
//! Whatever the lock manager says, the queue on the server decides who is granted: a wait that
//! returns early only leads to one more attempt. A waiter whose wait found its target free and
//! whose next attempt stands where it stood (the waiter ahead has not taken its ticket yet, or
//! has no seat: no seat was free, or another client version) waits once for the announcement
//! instead, with its tag written back, so that nothing spins. A seated waiter never waits for an
//! announcement longer than [`MAX_SLICE`]: a release that overlaps the attempt writing its tag back
//! reads the entry without it, and announces nothing.
//!
//! Each wait is bounded by `lock_timeout`, at most [`MAX_SLICE`], after which the waiter attempts
//! again (its queue entry needs refreshing anyway), and each statement on a seat by its wait plus
//! the request timeout: a seat without an answer is closed. A seat whose acquire was dropped is
//! closed, never reused: its server process ends once its statement does, within that bound,
//! which gives the ticket back. A client keeps at most `waiting_connections` seats (4 by
//! default; see `PgLockBuilder::with_waiting_connections`); waiters beyond them wait for the
//! announcement. An idle seat closes [`IDLE`] to 1.5 × [`IDLE`] after its last use.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use crate::builder::Settings;
use crate::error::BACKEND;
use crate::session::connect;
use crate::sql::{self, KeyParams};

/// The longest one wait in the lock manager blocks before the waiter attempts again: a dropped
/// wait keeps its server process blocked no longer than this. Below PostgreSQL's default
/// `deadlock_timeout` (1 s), so that a wait ends before the server runs a deadlock check for it
/// (which takes every partition of the lock table).
pub(crate) const MAX_SLICE: Duration = Duration::from_millis(900);

/// How long a seat stays open without a waiter.
pub(crate) const IDLE: Duration = Duration::from_secs(10);

/// What a seated waiter waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The lock's key, as the head of its queue.
    Lock,
    /// The ticket of the waiter ahead.
    Ticket(i64),
}

/// How one wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The target was free, or given back during the wait.
    Freed,
    /// The slice ran out with the target still held.
    TimedOut,
}

/// The ticket of the waiter with owner token `owner`.
pub(crate) fn ticket(owner: u128) -> i64 {
    // The low 64 bits, as the server's bigint: a reinterpretation, not a conversion.
    owner as u64 as i64
}

/// The ticket of the waiter named in the queue as `waiter` (its owner token in hex).
pub(crate) fn ticket_of(waiter: &str) -> Option<i64> {
    u128::from_str_radix(waiter, 16).ok().map(ticket)
}

/// A client's seats: those open and free, and how many are open.
#[derive(Default)]
pub(crate) struct Seats {
    free: Mutex<Vec<Free>>,
    open: AtomicUsize,
    /// Whether the task that closes idle seats runs.
    closing: AtomicBool,
}

struct Free {
    client: tokio_postgres::Client,
    since: Instant,
}

impl Seats {
    /// A free seat for the waiter with owner token `owner`, if one is open: taken before the
    /// first attempt, so that it can go into the queue without a wake tag.
    pub(crate) fn reuse(self: &Arc<Self>, settings: &Settings, owner: u128) -> Option<Seat> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(seat) = free.pop() {
            if !seat.client.is_closed() {
                return Some(Seat::new(
                    seat.client,
                    self,
                    owner,
                    settings.request_timeout,
                ));
            }
            self.open.fetch_sub(1, Ordering::AcqRel);
        }
        None
    }

    /// Opens a seat for the waiter with owner token `owner` if fewer than the settings'
    /// `waiting_connections` are open; `None` otherwise, or if it failed.
    pub(crate) async fn open(self: &Arc<Self>, settings: &Settings, owner: u128) -> Option<Seat> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < settings.waiting_connections).then_some(n + 1)
            })
            .ok()?;
        // Counted from here: given back if opening fails or is dropped.
        let counted = Counted(Arc::downgrade(self));
        let (client, connection) = match connect(settings, false).await {
            Ok(open) => open,
            Err(error) => {
                tracing::debug!(backend = BACKEND, %error, "no seat could be opened; waiting for the announcement");
                return None;
            }
        };
        tokio::spawn(async move {
            let _ = connection.await;
        });
        // A server-wide `statement_timeout` shorter than a wait would end every wait in an error.
        let unbounded = client.batch_execute("SET statement_timeout = 0");
        if tokio::time::timeout(settings.request_timeout, unbounded)
            .await
            .map_or(true, |done| done.is_err())
        {
            tracing::debug!(
                backend = BACKEND,
                "a seat could not be set up; waiting for the announcement"
            );
            return None;
        }
        std::mem::forget(counted);
        if !self.closing.swap(true, Ordering::AcqRel) {
            tokio::spawn(close_idle(Arc::downgrade(self)));
        }
        Some(Seat::new(client, self, owner, settings.request_timeout))
    }

    fn give_back(&self, client: tokio_postgres::Client) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(Free {
            client,
            since: Instant::now(),
        });
    }
}

/// A seat counted as open while it is being opened: uncounted if the opening fails or is dropped.
struct Counted(Weak<Seats>);

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(seats) = self.0.upgrade() {
            seats.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Closes the seats idle for [`IDLE`]; ends when none is open.
async fn close_idle(seats: Weak<Seats>) {
    loop {
        tokio::time::sleep(IDLE / 2).await;
        let Some(seats) = seats.upgrade() else {
            return;
        };
        {
            let mut free = seats.free.lock().unwrap_or_else(|e| e.into_inner());
            let before = free.len();
            free.retain(|seat| seat.since.elapsed() < IDLE && !seat.client.is_closed());
            seats.open.fetch_sub(before - free.len(), Ordering::AcqRel);
        }
        if seats.open.load(Ordering::Acquire) == 0 {
            seats.closing.store(false, Ordering::Release);
            // A seat opened meanwhile found the flag still set: this task stays for it.
            if seats.open.load(Ordering::Acquire) == 0 || seats.closing.swap(true, Ordering::AcqRel)
            {
                return;
            }
        }
    }
}

/// One waiting acquire's connection, holding its ticket once it has waited.
pub(crate) struct Seat {
    client: Option<tokio_postgres::Client>,
    seats: Weak<Seats>,
    ticket: i64,
    /// How long a request may wait for its answer beyond its own wait.
    request_timeout: Duration,
    /// Whether the ticket is held.
    ticketed: bool,
    /// No statement is under way: the seat can be given back.
    clean: bool,
}

impl Seat {
    fn new(
        client: tokio_postgres::Client,
        seats: &Arc<Seats>,
        owner: u128,
        request_timeout: Duration,
    ) -> Self {
        Seat {
            client: Some(client),
            seats: Arc::downgrade(seats),
            ticket: ticket(owner),
            request_timeout,
            ticketed: false,
            clean: true,
        }
    }

    /// Waits up to `slice` (at most [`MAX_SLICE`]) until `target` is free, as `waiter` (owner
    /// token in hex) in the queue of `key`; takes the ticket first if the seat has not waited
    /// yet, and clears the waiter's wake tag first unless its last attempt queued it `quiet`.
    /// `None` when the wait failed: the seat is then of no more use.
    pub(crate) async fn wait(
        &mut self,
        target: Target,
        key: &KeyParams,
        waiter: &str,
        quiet: bool,
        slice: Duration,
    ) -> Option<Waited> {
        let client = self.client.as_ref()?;
        // A statement is under way: if this is dropped, so is the seat, and it is closed.
        self.clean = false;
        let millis = slice.clamp(Duration::from_millis(1), MAX_SLICE).as_millis();
        let timeout = millis.to_string();
        let take = !self.ticketed;
        let entry: [(&(dyn ToSql + Sync), Type); 2] =
            [(&key.payload, Type::TEXT), (&waiter, Type::TEXT)];
        let own: [(&(dyn ToSql + Sync), Type); 3] = [
            (&timeout, Type::TEXT),
            (&self.ticket, Type::INT8),
            (&take, Type::BOOL),
        ];
        let (statement, params) = match &target {
            Target::Lock => (sql::wait_free(key), key.with(&own)),
            Target::Ticket(ahead) => {
                let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![(ahead, Type::INT8)];
                params.extend_from_slice(&own);
                (sql::wait_ticket(), params)
            }
        };
        let wait = client.query_typed(&statement, &params);
        let waiting = async {
            if quiet {
                return Ok(wait.await);
            }
            // One round trip: the wait is sent behind the tag's clearing without waiting.
            let (cleared, freed) = tokio::join!(client.query_typed(sql::QUIET, &entry), wait);
            cleared.map(|_| freed)
        };
        // An answer the server does not give within the slice and a request's time is lost: the
        // seat is given up (and closed).
        let answered = tokio::time::timeout(
            Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX)) + self.request_timeout,
            waiting,
        );
        let freed = match answered.await {
            Ok(Ok(freed)) => freed,
            Ok(Err(error)) => {
                tracing::debug!(backend = BACKEND, %error, "a wake tag could not be cleared; waiting for the announcement");
                return None;
            }
            Err(_) => {
                tracing::debug!(
                    backend = BACKEND,
                    "a wait in the lock manager got no answer; waiting for the announcement"
                );
                return None;
            }
        };
        let waited = match freed {
            Ok(rows) => match rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) {
                Some(true) => Waited::Freed,
                _ => {
                    tracing::debug!(
                        backend = BACKEND,
                        "a seat's ticket could not be taken; waiting for the announcement"
                    );
                    return None;
                }
            },
            // The ticket was taken before the wait, and session locks outlive the error.
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Waited::TimedOut,
            Err(error) => {
                tracing::debug!(backend = BACKEND, %error, "a wait in the lock manager failed; waiting for the announcement");
                return None;
            }
        };
        self.ticketed = true;
        self.clean = true;
        Some(waited)
    }

    /// Gives the ticket back, which wakes the waiter behind (in a task of its own), and the seat
    /// to the client.
    pub(crate) fn leave(mut self) {
        if !self.clean {
            return;
        }
        if !self.ticketed {
            self.return_to_pool();
            return;
        }
        tokio::spawn(async move {
            let Some(client) = self.client.as_ref() else {
                return;
            };
            let ticket: [(&(dyn ToSql + Sync), Type); 1] = [(&self.ticket, Type::INT8)];
            let unlocked = client.query_typed(sql::LEAVE_SEAT, &ticket);
            let given_back = tokio::time::timeout(self.request_timeout, unlocked)
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|rows| rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()));
            if given_back == Some(true) {
                self.return_to_pool();
            }
        });
    }

    /// Puts the connection, holding nothing, among the client's free seats.
    fn return_to_pool(&mut self) {
        if let (Some(client), Some(seats)) = (self.client.take(), self.seats.upgrade()) {
            seats.give_back(client);
        }
    }
}

impl Drop for Seat {
    /// A seat not given back is closed: its server process gives the ticket back as it ends.
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(client);
            if let Some(seats) = self.seats.upgrade() {
                seats.open.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiters_ticket_is_found_from_its_name_in_the_queue() {
        let owner = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210_u128;
        let named = crate::client::holder_of(owner);
        assert_eq!(ticket_of(&named), Some(ticket(owner)));
        assert_eq!(ticket(owner), 0xfedc_ba98_7654_3210_u64 as i64);
        assert_eq!(ticket_of("not a waiter"), None);
    }
}
