//! Asking every master at once and counting the answers.
//!
//! A request goes to all masters in parallel, each bounded by the per-node timeout, and the
//! caller stops listening as soon as the outcome is decided — a quorum agreed, or a quorum
//! answered and too few masters are left to agree — so one frozen master never delays an answer
//! the others already gave. When too few answer at all, the caller waits for every master (at
//! most the timeout), so that its error counts every master that could be reached.
//!
//! Requests still pending when the outcome is decided are not dropped: they were queued on their
//! masters' connections (a master without a connection fails at once, see `node.rs`), and a
//! background task waits for their answers, so that each runs on its master in the order the
//! client sent it — a release is never skipped, nor overtaken by the client's next request.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use dlock_core::backend::clock::ClockWatch;
use dlock_core::Error;
use dlock_redis::protocol::scripts::Timed;
use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::RedisResult;

use crate::node::{Node, NodeFailure};

/// One master's answer.
pub(crate) struct Reply<T> {
    /// The master's position in the client's list.
    pub(crate) index: usize,
    /// Whether the master counts towards a quorum in this round (see [`crate::restart`]).
    pub(crate) counts: bool,
    /// Its answer, or why there was none.
    pub(crate) result: Result<T, NodeFailure>,
}

/// Each master's renewal answer after the clock watch compared the server clock it carries with
/// that master's last one; `apply` folds how far the master's clock ran ahead into the answer.
pub(crate) fn watch_clocks<T, U>(
    clock: &ClockWatch,
    replies: Vec<Reply<Timed<T>>>,
    apply: impl Fn(T, Option<Duration>) -> U,
) -> Vec<Reply<U>> {
    replies
        .into_iter()
        .map(|reply| Reply {
            index: reply.index,
            counts: reply.counts,
            result: reply.result.map(|timed| {
                let ahead = clock.observe(reply.index as u64, timed.clock);
                apply(timed.answer, ahead)
            }),
        })
        .collect()
}

/// The answers so far, as the caller's stop condition sees them.
pub(crate) struct Progress<'a, T> {
    /// Every answer received so far.
    pub(crate) replies: &'a [Reply<T>],
    /// Masters still to answer that count towards a quorum.
    pub(crate) pending: usize,
}

/// Sends `call` to the masters at `targets` in parallel, each bounded by `timeout`, and collects
/// answers until `decided` says the outcome is known or every master has answered or timed out.
/// Requests still pending then finish in the background (see the module docs).
///
/// # Cancel safety
/// Dropping it drops the pending requests: each may or may not run on its master.
pub(crate) async fn gather<T, F, Fut>(
    nodes: &[Arc<Node>],
    targets: impl IntoIterator<Item = usize>,
    op: &'static str,
    timeout: Duration,
    call: F,
    mut decided: impl FnMut(Progress<'_, T>) -> bool,
) -> Vec<Reply<T>>
where
    T: Send + 'static,
    F: Fn(MultiplexedConnection) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = RedisResult<T>> + Send + 'static,
{
    // Who may count is read when the round starts. A master's exclusion only ever ends, except
    // that a restart, seen on a new connection, starts one: a request of this round can go out
    // on a connection opened after this read (the old one broke with the restart), so its
    // answer counts only if its master still counts when the answer comes (see below).
    let counting: Vec<bool> = nodes.iter().map(|n| n.counts()).collect();
    // The connection each request goes out on, so that a timeout retires that one and not a
    // newer one.
    let generations: Vec<Option<u64>> = nodes.iter().map(|n| n.generation()).collect();
    let mut outstanding: Vec<usize> = targets
        .into_iter()
        .filter(|index| *index < nodes.len())
        .collect();
    let mut pending: FuturesUnordered<_> = outstanding
        .iter()
        .map(|&index| {
            let (node, call, counts) = (nodes[index].clone(), call.clone(), counting[index]);
            async move {
                let result = node.run(op, call).await;
                // A connection opened during the round records a restart before it is used.
                let counts = counts && node.counts();
                Reply {
                    index,
                    counts,
                    result,
                }
            }
        })
        .collect();
    let mut replies = Vec::with_capacity(outstanding.len());
    // One timer for the whole round rather than one per master.
    let deadline = Instant::now() + timeout;
    let expiry = tokio::time::sleep_until(deadline);
    tokio::pin!(expiry);
    loop {
        let reply = tokio::select! {
            biased;
            reply = pending.next() => reply,
            () = &mut expiry => {
                for &index in &outstanding {
                    replies.push(Reply {
                        index,
                        counts: counting[index],
                        result: Err(nodes[index].timed_out(op, timeout, generations[index])),
                    });
                }
                return replies;
            }
        };
        let Some(reply) = reply else {
            return replies;
        };
        outstanding.retain(|&i| i != reply.index);
        replies.push(reply);
        let still_counting = outstanding.iter().filter(|&&i| counting[i]).count();
        if decided(Progress {
            replies: &replies,
            pending: still_counting,
        }) {
            break;
        }
    }
    if !pending.is_empty() {
        tokio::spawn(tokio::time::timeout_at(
            deadline,
            pending.for_each(|_| async {}),
        ));
    }
    replies
}

/// Why a quorum was not reached: how many masters answered, out of how many, and how many were
/// needed. Shown as the source of [`Error::Unavailable`].
#[derive(Debug)]
pub(crate) struct QuorumFailure {
    pub(crate) op: &'static str,
    pub(crate) reached: usize,
    pub(crate) total: usize,
    pub(crate) needed: usize,
    /// Masters left out of quorums after a restart.
    pub(crate) excluded: usize,
    /// The last master-level error, if any.
    pub(crate) last: Option<NodeFailure>,
}

impl fmt::Display for QuorumFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: reached {} of {} nodes, needed {}",
            self.op, self.reached, self.total, self.needed
        )?;
        if self.excluded > 0 {
            write!(f, " ({} left out for a delayed restart)", self.excluded)?;
        }
        if let Some(last) = &self.last {
            write!(f, "; last error: {last}")?;
        }
        Ok(())
    }
}

impl std::error::Error for QuorumFailure {}

impl QuorumFailure {
    /// The failure of `op` from its replies: `reached` is the number of counting masters that
    /// answered at all.
    pub(crate) fn of<T>(
        op: &'static str,
        replies: &[Reply<T>],
        nodes: &[Arc<Node>],
        needed: usize,
    ) -> Self {
        QuorumFailure {
            op,
            reached: replies
                .iter()
                .filter(|r| r.counts && r.result.is_ok())
                .count(),
            total: nodes.len(),
            needed,
            excluded: nodes.iter().filter(|n| !n.counts()).count(),
            last: replies
                .iter()
                .rev()
                .find_map(|r| r.result.as_ref().err().cloned()),
        }
    }

    /// As dlock's error: [`Error::Unavailable`], or a permanent [`Error::Backend`] if a master
    /// refused for a reason that waiting will not fix (a wrong password, a missing permission).
    pub(crate) fn into_error(self) -> Error {
        if self.last.as_ref().is_some_and(|l| !l.is_temporary()) {
            return Error::backend(crate::client::BACKEND, false, self);
        }
        Error::Unavailable {
            reached: self.reached,
            needed: self.needed,
            source: Some(Box::new(self)),
        }
    }
}

/// An error's message and its source's, as the quorum failures tell them: the counts are in the
/// source.
#[cfg(test)]
pub(crate) fn message_and_source(error: &Error) -> String {
    format!(
        "{error} / {}",
        std::error::Error::source(error)
            .map(ToString::to_string)
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_reached_of_total_and_needed() {
        let failure = QuorumFailure {
            op: "acquire",
            reached: 2,
            total: 5,
            needed: 3,
            excluded: 1,
            last: None,
        };
        let error = failure.into_error();
        assert!(matches!(
            error,
            Error::Unavailable {
                reached: 2,
                needed: 3,
                ..
            }
        ));
        let text = message_and_source(&error);
        assert!(text.contains("reached 2 of 5 nodes, needed 3"), "{text}");
        assert!(text.contains("1 left out for a delayed restart"), "{text}");
    }

    #[test]
    fn a_permanent_refusal_is_not_unavailability() {
        let failure = QuorumFailure {
            op: "acquire",
            reached: 0,
            total: 3,
            needed: 2,
            excluded: 0,
            last: Some(NodeFailure {
                endpoint: "redis://127.0.0.1:1".into(),
                error: Arc::new(Error::backend("redis", false, "NOPERM")),
            }),
        };
        let error = failure.into_error();
        assert!(!error.is_temporary());
        assert!(
            error.to_string().contains("reached 0 of 3 nodes, needed 2"),
            "{error}"
        );
    }
}
