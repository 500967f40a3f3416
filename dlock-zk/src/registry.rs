//! The locks this client holds: where their nodes are, when their TTL runs out, and the session
//! state each lease follows.
//!
//! A lease is valid no longer than the earlier of two bounds:
//!
//! * its TTL — kept on the client: when a lease's TTL passes without an extend, the keeper task
//!   deletes its node, so the lock is never held longer than asked while the holder lives;
//! * its session — kept by the server: a holder that dies or is cut off loses its node when the
//!   session expires, and the lease learns of the danger from the session's link state.
//!
//! Each lease gets its own [`SessionWatch`] carrying the session bound; dlock-core's lease keeps
//! its TTL deadline (with the caller's drift allowance) beside it and is valid until the earlier
//! of the two. The keeper deletes the node at the full TTL, never before the lease's own deadline.

use std::collections::{BTreeSet, HashMap};

use dlock_core::backend::{SessionState, SessionWatch};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::node_watch::NodeWatch;
use crate::session::Link;

/// One held lock.
#[derive(Debug)]
pub(crate) struct Held {
    /// The full path of its node.
    pub(crate) path: String,
    /// The session generation the node lives in.
    pub(crate) generation: u64,
    /// When the keeper deletes the node unless extended: the grant's send time plus the TTL.
    pub(crate) delete_at: Instant,
    /// The watch on the node that tells the lease when someone else deletes it; stopped with
    /// the entry.
    pub(crate) node_watch: Option<NodeWatch>,
    tx: watch::Sender<SessionState>,
}

/// The session state a lease should show.
pub(crate) fn lease_state(link: Link, until: Instant) -> SessionState {
    match link {
        Link::Connected => SessionState::Alive { until: Some(until) },
        Link::Disconnected => SessionState::Suspended { until },
        Link::Ended => SessionState::Expired,
    }
}

impl Held {
    /// A held lock and the watch its lease follows, starting in `state`.
    pub(crate) fn new(
        path: String,
        generation: u64,
        delete_at: Instant,
        state: SessionState,
    ) -> (Held, SessionWatch) {
        let (tx, rx) = watch::channel(state);
        (
            Held {
                path,
                generation,
                delete_at,
                node_watch: None,
                tx,
            },
            rx,
        )
    }

    /// Tells the lease its current state (nothing if unchanged).
    pub(crate) fn publish(&self, link: Link, vouched_until: Instant) {
        let state = lease_state(link, vouched_until);
        self.tx.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }

    /// The TTL ran out: nudges the lease once more, so that it records the expiry as the reason
    /// it ended, and lets it go.
    pub(crate) fn retire(self) {
        self.tx.send_modify(|_| ());
    }

    /// The session ended: the lease is lost.
    pub(crate) fn end(self) {
        self.tx.send_replace(SessionState::Expired);
    }

    /// Someone else deleted the node while the session lives on: the lease is lost, taken over.
    pub(crate) fn take_over(self) {
        self.tx.send_replace(SessionState::TakenOver);
    }
}

/// The held locks, by owner token.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    held: HashMap<u128, Held>,
    deadlines: BTreeSet<(Instant, u128)>,
    /// Owners whose TTL ran out recently, with when: their nodes may still exist for the moment
    /// the keeper's delete takes, and must read as expired meanwhile.
    retired: HashMap<u128, Instant>,
}

/// How long a retired owner is remembered.
const RETIRED_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

impl Registry {
    /// Adds a held lock.
    pub(crate) fn insert(&mut self, owner: u128, held: Held) {
        self.deadlines.insert((held.delete_at, owner));
        if let Some(old) = self.held.insert(owner, held) {
            self.deadlines.remove(&(old.delete_at, owner));
        }
    }

    /// Removes and returns `owner`'s lock.
    pub(crate) fn remove(&mut self, owner: u128) -> Option<Held> {
        let held = self.held.remove(&owner)?;
        self.deadlines.remove(&(held.delete_at, owner));
        Some(held)
    }

    /// Removes and returns `owner`'s lock if its node is `path`.
    pub(crate) fn remove_at(&mut self, owner: u128, path: &str) -> Option<Held> {
        if self.held.get(&owner)?.path != path {
            return None;
        }
        self.remove(owner)
    }

    /// `owner`'s lock.
    pub(crate) fn get(&self, owner: u128) -> Option<&Held> {
        self.held.get(&owner)
    }

    /// Moves the TTL of `owner`'s lock at `path`, unless it already ran out at `now` (the keeper
    /// deletes such a node; an extend never revives one). Returns the updated lock.
    pub(crate) fn re_arm(
        &mut self,
        owner: u128,
        path: &str,
        now: Instant,
        delete_at: Instant,
    ) -> Option<&Held> {
        let held = self.held.get_mut(&owner)?;
        if held.path != path || now >= held.delete_at {
            return None;
        }
        self.deadlines.remove(&(held.delete_at, owner));
        held.delete_at = delete_at;
        self.deadlines.insert((delete_at, owner));
        Some(held)
    }

    /// The earliest TTL end.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Removes and returns the locks whose TTL ended at or before `now`, remembering their
    /// owners as retired.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Held> {
        let mut due = Vec::new();
        while let Some(&(at, owner)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(held) = self.held.remove(&owner) {
                due.push(held);
                self.retired.insert(owner, now);
            }
        }
        if !due.is_empty() {
            self.retired
                .retain(|_, at| now.saturating_duration_since(*at) < RETIRED_MEMORY);
        }
        due
    }

    /// Whether `owner`'s TTL ran out recently (its node is gone or about to be).
    pub(crate) fn retired(&self, owner: u128) -> bool {
        self.retired.contains_key(&owner)
    }

    /// Removes and returns the locks of session `generation`.
    pub(crate) fn take_generation(&mut self, generation: u64) -> Vec<Held> {
        let owners: Vec<u128> = self
            .held
            .iter()
            .filter(|(_, h)| h.generation == generation)
            .map(|(owner, _)| *owner)
            .collect();
        owners
            .into_iter()
            .filter_map(|owner| self.remove(owner))
            .collect()
    }

    /// The locks of session `generation`.
    pub(crate) fn of_generation(&self, generation: u64) -> impl Iterator<Item = &Held> {
        self.held
            .values()
            .filter(move |h| h.generation == generation)
    }

    /// How many locks are held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn held(path: &str, generation: u64, at: Instant) -> (Held, SessionWatch) {
        Held::new(
            path.to_owned(),
            generation,
            at,
            SessionState::Alive { until: Some(at) },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn due_locks_come_out_in_order() {
        let now = Instant::now();
        let mut r = Registry::default();
        let (a, _ra) = held("/a", 1, now + Duration::from_secs(2));
        let (b, _rb) = held("/b", 1, now + Duration::from_secs(1));
        r.insert(1, a);
        r.insert(2, b);
        assert_eq!(r.next_deadline(), Some(now + Duration::from_secs(1)));
        let due = r.take_due(now + Duration::from_millis(1500));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].path, "/b");
        assert_eq!(r.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn re_arm_never_revives() {
        let now = Instant::now();
        let mut r = Registry::default();
        let (a, _ra) = held("/a", 1, now + Duration::from_secs(1));
        r.insert(1, a);
        let later = now + Duration::from_secs(5);
        assert!(r
            .re_arm(1, "/a", now + Duration::from_secs(1), later)
            .is_none());
        assert!(r.re_arm(1, "/other", now, later).is_none());
        assert!(r.re_arm(1, "/a", now, later).is_some());
        assert_eq!(r.next_deadline(), Some(later));
    }

    #[tokio::test(start_paused = true)]
    async fn lease_state_follows_the_link() {
        let now = Instant::now();
        let a = now + Duration::from_secs(1);
        assert_eq!(
            lease_state(Link::Connected, a),
            SessionState::Alive { until: Some(a) }
        );
        assert_eq!(
            lease_state(Link::Disconnected, a),
            SessionState::Suspended { until: a }
        );
        assert_eq!(lease_state(Link::Ended, a), SessionState::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_takeover_removes_only_the_node_it_saw_go() {
        let now = Instant::now();
        let mut r = Registry::default();
        let (a, rx) = held("/a", 1, now + Duration::from_secs(1));
        r.insert(1, a);
        assert!(r.remove_at(1, "/other").is_none());
        assert!(r.remove_at(2, "/a").is_none());
        r.remove_at(1, "/a").expect("held").take_over();
        assert_eq!(*rx.borrow(), SessionState::TakenOver);
        assert_eq!((r.len(), r.next_deadline()), (0, None));
    }

    #[tokio::test(start_paused = true)]
    async fn generations_are_taken_together() {
        let now = Instant::now();
        let mut r = Registry::default();
        for (owner, generation) in [(1, 1), (2, 2), (3, 1)] {
            let (h, _rx) = held("/x", generation, now);
            r.insert(owner, h);
        }
        assert_eq!(r.of_generation(1).count(), 2);
        assert_eq!(r.take_generation(1).len(), 2);
        assert_eq!(r.len(), 1);
        assert_eq!(r.next_deadline(), Some(now));
    }
}
