//! Replica acknowledgement: `WAIT` after every grant, extension and release.
//!
//! Redis replicates asynchronously, so a primary that fails right after a grant can be replaced by
//! a replica that never saw it, and the lock is granted twice. With `min_replicas` N > 0 the client
//! sends `WAIT N timeout` right behind each lock script, in the same write on the same connection
//! ([`Acknowledged`]), so the count it gets back is for that script's write (and any earlier one
//! on the connection), never for a write on another connection:
//!
//! * a grant acknowledged by fewer than N replicas in time is released again and reported as
//!   [`Error::Unavailable`] — never returned as held;
//! * an extension acknowledged by fewer is an [`Error::Unavailable`]: the existing path for an
//!   extension that got no answer, so an auto-renewed lease becomes uncertain (and is lost if no
//!   later renewal is acknowledged before its validity ends);
//! * a release acknowledged by fewer is an [`Error::Unavailable`] too: the key is gone from the
//!   primary, but a failover may bring it back until its TTL runs out (which blocks others, but
//!   grants nobody).
//!
//! This **narrows, not closes,** the failover window: `WAIT` does not make Redis strongly
//! consistent. The promoted replica may be one that did not acknowledge (Sentinel prefers the
//! most up-to-date replica, but a partition can leave it no choice), a replica that acknowledged
//! may restart without persistence, and a write acknowledged after the timeout is still applied
//! on the primary.
//!
//! `WAIT` blocks the connection it is sent on until it returns: on the client's one multiplexed
//! connection, requests behind it wait too. With healthy replicas it returns within a round trip
//! to them; with too few, every operation takes up to the replica timeout.

use std::time::Duration;

use dlock_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::{Cmd, RedisFuture, Value};

use crate::protocol::scripts::ttl_millis;

/// How many replicas must acknowledge each write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acks {
    /// N in `WAIT N timeout`; at least 1.
    pub(crate) replicas: u32,
    /// The timeout in `WAIT N timeout`.
    pub(crate) timeout: Duration,
}

impl Acks {
    /// Acknowledgement by `replicas` within `timeout`; `None` for 0 replicas (no `WAIT` at all).
    pub(crate) fn new(replicas: u32, timeout: Duration) -> Option<Self> {
        (replicas > 0).then_some(Acks { replicas, timeout })
    }

    /// Checks the count `WAIT` answered for `op`: an [`Error::Unavailable`] if too few
    /// replicas (the primary and the replicas that did count as the nodes reached).
    pub(crate) fn check(&self, op: &str, acknowledged: Option<i64>) -> Result<()> {
        let got = acknowledged.unwrap_or(0);
        if got >= i64::from(self.replicas) {
            return Ok(());
        }
        let needed = self.replicas as usize + 1;
        Err(Error::Unavailable {
            reached: usize::try_from(got).unwrap_or(0).saturating_add(1),
            needed,
            source: Some(
                format!(
                    "{op}: acknowledged by {got} of the {} replica(s) required within {:?}",
                    self.replicas, self.timeout
                )
                .into(),
            ),
        })
    }
}

/// A connection that sends `WAIT N timeout` right behind every single command, pipelined in the
/// same write, and keeps the count it answered.
pub(crate) struct Acknowledged<C> {
    inner: C,
    wait: Cmd,
    /// The count the last `WAIT` answered; `None` before one answered (or if it failed).
    pub(crate) acknowledged: Option<i64>,
}

impl<C> Acknowledged<C> {
    pub(crate) fn new(inner: C, acks: &Acks) -> Self {
        let mut wait = redis::cmd("WAIT");
        // `WAIT n 0` would block forever; the timeout is at least 1 ms.
        wait.arg(acks.replicas).arg(ttl_millis(acks.timeout).max(1));
        Acknowledged {
            inner,
            wait,
            acknowledged: None,
        }
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Acknowledged<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone()).add_command(self.wait.clone());
            let mut replies = self
                .inner
                .req_packed_commands(&pipe, 0, 2)
                .await?
                .into_iter();
            let reply = replies.next();
            self.acknowledged = match replies.next() {
                Some(Value::Int(count)) => Some(count),
                _ => None,
            };
            match reply {
                Some(value) => value.extract_error(),
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "no reply to a command followed by WAIT",
                ))),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_sends_no_wait() {
        assert_eq!(Acks::new(0, Duration::from_secs(1)), None);
    }

    #[test]
    fn too_few_acknowledgements_are_unavailability() {
        let acks = Acks::new(2, Duration::from_millis(300)).unwrap();
        assert!(acks.check("acquire", Some(2)).is_ok());
        assert!(acks.check("acquire", Some(3)).is_ok());
        match acks.check("acquire", Some(1)) {
            Err(Error::Unavailable {
                reached: 2,
                needed: 3,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let err = acks.check("extend", None).unwrap_err();
        assert!(err.is_temporary());
        let shown = format!(
            "{err} {:?}",
            std::error::Error::source(&err).map(ToString::to_string)
        );
        assert!(
            shown.contains("extend") && shown.contains("0 of the 2"),
            "{shown}"
        );
    }
}
