//! The locks one client holds, as the client knows them.
//!
//! A session-level advisory lock is re-entrant within its session: the server would grant a key
//! to a second owner of the same client, and a shared and an exclusive hold of one key by the
//! same session never conflict either. So the client keeps every key it holds or is taking in
//! this table and applies each primitive's rules among its own owners itself, before the server
//! is asked:
//!
//! * an **exclusive** hold (the lock, a writer, a semaphore slot) needs the key unused here;
//! * a **shared** hold (a reader) needs no exclusive user of the key here, and no writer of this
//!   client waiting for it (a waiting writer holds back later readers, here as on the server);
//! * a semaphore permit is reserved without a key while its grant picks a slot (the slots this
//!   client uses are skipped), and placed on its slot's key once the server granted it.
//!
//! It also keeps each lease's TTL, since advisory locks have none: the keeper gives back a lock
//! whose TTL passed without an extend.

use std::collections::{BTreeSet, HashMap, HashSet};

use tokio::time::Instant;

use crate::key::AdvisoryKey;

/// What an entry holds, which decides how it is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lock, or the write side of the read-write lock: both are the exclusive advisory lock
    /// of the name's key.
    Lock,
    /// A read hold: a shared advisory lock of the name's key.
    Read,
    /// A semaphore permit: the exclusive advisory lock of one slot key; `announce` is the key
    /// whose payload the release is announced with (the semaphore's guard, which its waiters
    /// listen for).
    Permit {
        /// The slot's number, `0..permits`.
        slot: u32,
        /// The semaphore's guard key.
        announce: AdvisoryKey,
    },
}

impl Kind {
    /// Whether the entry's key is held shared.
    pub(crate) fn shared(self) -> bool {
        self == Kind::Read
    }
}

/// The local users of one key.
#[derive(Debug)]
enum Users {
    Exclusive(u128),
    Shared(HashSet<u128>),
}

/// One lock of this client.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The advisory key held; `None` for a permit whose slot is being picked.
    pub(crate) key: Option<AdvisoryKey>,
    pub(crate) kind: Kind,
    pub(crate) name: String,
    /// The grant, once the server answered: its token and session generation.
    pub(crate) grant: Option<(u64, u64)>,
    /// When the keeper gives it back.
    pub(crate) delete_at: Instant,
    /// Released while the grant was under way: give it back as soon as it lands.
    pub(crate) abandoned: bool,
}

/// The table: by owner token, by key, and by TTL deadline.
#[derive(Debug, Default)]
pub(crate) struct Held {
    by_owner: HashMap<u128, Entry>,
    by_key: HashMap<AdvisoryKey, Users>,
    deadlines: BTreeSet<(Instant, u128)>,
    /// How many writers of this client wait for each key.
    waiting_writers: HashMap<AdvisoryKey, usize>,
    /// How many granted entries each session generation holds.
    granted_in: HashMap<u64, usize>,
}

impl Held {
    /// Reserves `key` exclusively for `owner` while its grant is under way (the lock, a
    /// writer); `false` if this client holds or takes it already.
    pub(crate) fn reserve(
        &mut self,
        owner: u128,
        key: AdvisoryKey,
        name: &str,
        until: Instant,
    ) -> bool {
        self.reserve_as(owner, Some(key), Kind::Lock, name, until)
    }

    /// Reserves `key` for `owner` held as `kind` says (a permit's key may be `None` until its
    /// slot is known); `false` if the rules above refuse it here.
    pub(crate) fn reserve_as(
        &mut self,
        owner: u128,
        key: Option<AdvisoryKey>,
        kind: Kind,
        name: &str,
        until: Instant,
    ) -> bool {
        let entry = Entry {
            key,
            kind,
            name: name.to_string(),
            grant: None,
            delete_at: until,
            abandoned: false,
        };
        self.insert(owner, entry)
    }

    /// Puts `entry` in the table for `owner` if the rules allow it.
    pub(crate) fn insert(&mut self, owner: u128, entry: Entry) -> bool {
        if self.by_owner.contains_key(&owner) {
            return false;
        }
        if let Some(key) = entry.key {
            if !self.admits(key, entry.kind.shared()) {
                return false;
            }
            self.add_user(key, owner, entry.kind.shared());
        }
        self.deadlines.insert((entry.delete_at, owner));
        if let Some((_, generation)) = entry.grant {
            self.count(generation);
        }
        self.by_owner.insert(owner, entry);
        true
    }

    /// Whether this client may take `key` (shared or not) now.
    fn admits(&self, key: AdvisoryKey, shared: bool) -> bool {
        match self.by_key.get(&key) {
            None => !shared || self.waiting_writers.get(&key).is_none_or(|n| *n == 0),
            Some(Users::Shared(_)) if shared => {
                self.waiting_writers.get(&key).is_none_or(|n| *n == 0)
            }
            Some(_) => false,
        }
    }

    fn add_user(&mut self, key: AdvisoryKey, owner: u128, shared: bool) {
        if shared {
            let users = self
                .by_key
                .entry(key)
                .or_insert_with(|| Users::Shared(HashSet::new()));
            if let Users::Shared(set) = users {
                set.insert(owner);
            }
        } else {
            self.by_key.insert(key, Users::Exclusive(owner));
        }
    }

    fn remove_user(&mut self, key: AdvisoryKey, owner: u128) {
        let empty = match self.by_key.get_mut(&key) {
            Some(Users::Exclusive(o)) => *o == owner,
            Some(Users::Shared(set)) => {
                set.remove(&owner);
                set.is_empty()
            }
            None => false,
        };
        if empty {
            self.by_key.remove(&key);
        }
    }

    /// Places a permit whose slot the server picked on the slot's key; `false` if the entry is
    /// gone or the key is used here (the grant skips the slots this client uses, so it is not).
    pub(crate) fn place(&mut self, owner: u128, key: AdvisoryKey, slot: u32) -> bool {
        if self.by_key.contains_key(&key) {
            return false;
        }
        let Some(entry) = self.by_owner.get_mut(&owner) else {
            return false;
        };
        let Kind::Permit { announce, .. } = entry.kind else {
            return false;
        };
        entry.key = Some(key);
        entry.kind = Kind::Permit { slot, announce };
        self.by_key.insert(key, Users::Exclusive(owner));
        true
    }

    /// The keys this client uses (holds, or takes now) that `pick` picks.
    pub(crate) fn keys_where(&self, pick: impl Fn(AdvisoryKey) -> bool) -> Vec<AdvisoryKey> {
        self.by_key.keys().copied().filter(|k| pick(*k)).collect()
    }

    /// How many owners of this client use `key` shared.
    pub(crate) fn sharers(&self, key: AdvisoryKey) -> usize {
        match self.by_key.get(&key) {
            Some(Users::Shared(set)) => set.len(),
            _ => 0,
        }
    }

    /// A writer of this client begins to wait for `key`: readers of this client are held back
    /// until [`stop_waiting`](Self::stop_waiting).
    pub(crate) fn start_waiting(&mut self, key: AdvisoryKey) {
        *self.waiting_writers.entry(key).or_default() += 1;
    }

    /// A writer of this client stopped waiting for `key`.
    pub(crate) fn stop_waiting(&mut self, key: AdvisoryKey) {
        if let Some(n) = self.waiting_writers.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.waiting_writers.remove(&key);
            }
        }
    }

    /// Records the grant; returns the entry, which the caller gives back at once if it was
    /// abandoned meanwhile.
    pub(crate) fn grant(
        &mut self,
        owner: u128,
        token: u64,
        generation: u64,
        delete_at: Instant,
    ) -> Option<Entry> {
        let entry = self.by_owner.get_mut(&owner)?;
        let before = entry.grant.replace((token, generation));
        let old = entry.delete_at;
        entry.delete_at = delete_at;
        let entry = entry.clone();
        self.deadlines.remove(&(old, owner));
        self.deadlines.insert((delete_at, owner));
        if let Some((_, generation)) = before {
            self.uncount(generation);
        }
        self.count(generation);
        Some(entry)
    }

    fn count(&mut self, generation: u64) {
        *self.granted_in.entry(generation).or_default() += 1;
    }

    fn uncount(&mut self, generation: u64) {
        if let Some(n) = self.granted_in.get_mut(&generation) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.granted_in.remove(&generation);
            }
        }
    }

    /// The entry of `owner`.
    pub(crate) fn get(&self, owner: u128) -> Option<&Entry> {
        self.by_owner.get(&owner)
    }

    /// Marks a grant under way as released.
    pub(crate) fn abandon(&mut self, owner: u128) {
        if let Some(entry) = self.by_owner.get_mut(&owner) {
            entry.abandoned = true;
        }
    }

    /// Moves the TTL deadline of a granted entry of `generation`; `false` if there is none.
    pub(crate) fn re_arm(&mut self, owner: u128, generation: u64, delete_at: Instant) -> bool {
        let Some(entry) = self.by_owner.get_mut(&owner) else {
            return false;
        };
        if entry.grant.map(|(_, g)| g) != Some(generation) {
            return false;
        }
        let old = std::mem::replace(&mut entry.delete_at, delete_at);
        self.deadlines.remove(&(old, owner));
        self.deadlines.insert((delete_at, owner));
        true
    }

    /// Forgets `owner`'s entry.
    pub(crate) fn remove(&mut self, owner: u128) -> Option<Entry> {
        let entry = self.by_owner.remove(&owner)?;
        self.deadlines.remove(&(entry.delete_at, owner));
        if let Some(key) = entry.key {
            self.remove_user(key, owner);
        }
        if let Some((_, generation)) = entry.grant {
            self.uncount(generation);
        }
        Some(entry)
    }

    /// The earliest TTL deadline of a granted entry (a reservation whose grant is still under
    /// way is left to its grant, which wakes the keeper once it lands).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines
            .iter()
            .find(|(_, owner)| self.by_owner.get(owner).is_some_and(|e| e.grant.is_some()))
            .map(|(at, _)| *at)
    }

    /// Removes and returns the granted entries whose TTL passed by `now` (entries still being
    /// granted stay: their grant gives them a deadline of its own).
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<(u128, Entry)> {
        let due: Vec<u128> = self
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, owner)| *owner)
            .filter(|owner| self.by_owner.get(owner).is_some_and(|e| e.grant.is_some()))
            .collect();
        due.into_iter()
            .filter_map(|owner| self.remove(owner).map(|e| (owner, e)))
            .collect()
    }

    /// Removes and returns the entries granted in `generation` (its session ended).
    pub(crate) fn take_generation(&mut self, generation: u64) -> Vec<Entry> {
        let owners: Vec<u128> = self
            .by_owner
            .iter()
            .filter(|(_, e)| e.grant.is_some_and(|(_, g)| g == generation))
            .map(|(owner, _)| *owner)
            .collect();
        owners.into_iter().filter_map(|o| self.remove(o)).collect()
    }

    /// Counts a key held in `generation` outside the table (a waiting writer's companion key),
    /// so that its session stays open, and pinged, while it holds it.
    pub(crate) fn hold_outside(&mut self, generation: u64) {
        self.count(generation);
    }

    /// Stops counting a key [`hold_outside`](Self::hold_outside) counted.
    pub(crate) fn release_outside(&mut self, generation: u64) {
        self.uncount(generation);
    }

    /// Whether any lock granted in `generation` is held.
    pub(crate) fn holds_in(&self, generation: u64) -> bool {
        self.held_in(generation) > 0
    }

    /// How many locks granted in `generation` are held (with the keys held outside the table).
    pub(crate) fn held_in(&self, generation: u64) -> usize {
        self.granted_in.get(&generation).copied().unwrap_or(0)
    }

    /// How many entries there are.
    pub(crate) fn len(&self) -> usize {
        self.by_owner.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_key_is_reserved_once_and_freed_with_its_entry() {
        let now = Instant::now();
        let mut held = Held::default();
        let key = AdvisoryKey::Single(7);
        assert!(held.reserve(1, key, "a", now));
        assert!(
            !held.reserve(2, key, "a", now),
            "a second owner of the same key"
        );
        held.grant(1, 10, 0, now + Duration::from_secs(1)).unwrap();
        assert!(held.holds_in(0) && !held.holds_in(1));
        assert!(held.take_due(now).is_empty());
        assert_eq!(held.take_due(now + Duration::from_secs(1)).len(), 1);
        assert!(held.reserve(2, key, "a", now));
    }

    #[test]
    fn locks_are_counted_by_the_session_they_were_granted_in() {
        let now = Instant::now();
        let until = now + Duration::from_secs(1);
        let mut held = Held::default();
        for owner in 1..=3 {
            assert!(held.reserve(owner, AdvisoryKey::Single(owner as i64), "n", until));
        }
        assert_eq!(held.held_in(0), 0, "a reservation is not a lock held");
        held.grant(1, 10, 0, until).unwrap();
        held.grant(2, 11, 0, until).unwrap();
        held.grant(3, 12, 1, until).unwrap();
        assert_eq!((held.held_in(0), held.held_in(1)), (2, 1));
        let entry = held.remove(1).unwrap();
        assert_eq!(held.held_in(0), 1);
        assert!(held.insert(1, entry), "the expiry's re-reservation");
        assert_eq!(held.held_in(0), 2, "a re-inserted grant counts again");
        assert_eq!(held.take_generation(0).len(), 2);
        assert_eq!((held.held_in(0), held.held_in(1)), (0, 1));
        assert_eq!(held.take_due(until).len(), 1);
        assert!(!held.holds_in(1));
    }

    #[test]
    fn readers_share_and_exclude_writers_of_this_client() {
        let now = Instant::now();
        let until = now + Duration::from_secs(1);
        let mut held = Held::default();
        let key = AdvisoryKey::Single(7);
        assert!(held.reserve_as(1, Some(key), Kind::Read, "rw", until));
        assert!(held.reserve_as(2, Some(key), Kind::Read, "rw", until));
        assert_eq!(held.sharers(key), 2);
        assert!(
            !held.reserve(3, key, "rw", until),
            "a writer beside readers"
        );
        held.remove(1);
        assert!(
            !held.reserve(3, key, "rw", until),
            "a writer beside a reader"
        );
        held.remove(2);
        assert_eq!(held.sharers(key), 0);
        assert!(
            held.reserve(3, key, "rw", until),
            "a writer once the readers left"
        );
        assert!(
            !held.reserve_as(4, Some(key), Kind::Read, "rw", until),
            "a reader beside a writer"
        );
        assert!(!held.reserve(5, key, "rw", until), "a second writer");
    }

    #[test]
    fn a_waiting_writer_holds_back_new_readers_of_this_client() {
        let now = Instant::now();
        let until = now + Duration::from_secs(1);
        let mut held = Held::default();
        let key = AdvisoryKey::Single(7);
        assert!(held.reserve_as(1, Some(key), Kind::Read, "rw", until));
        held.start_waiting(key);
        assert!(
            !held.reserve_as(2, Some(key), Kind::Read, "rw", until),
            "a reader went ahead of a waiting writer"
        );
        held.start_waiting(key);
        held.stop_waiting(key);
        assert!(!held.reserve_as(2, Some(key), Kind::Read, "rw", until));
        held.stop_waiting(key);
        assert!(held.reserve_as(2, Some(key), Kind::Read, "rw", until));
    }

    #[test]
    fn a_permit_is_placed_on_a_slot_this_client_does_not_use() {
        let now = Instant::now();
        let until = now + Duration::from_secs(1);
        let mut held = Held::default();
        let announce = AdvisoryKey::Pair(1, 0x4000_0001);
        let kind = Kind::Permit { slot: 0, announce };
        let (slot0, slot1) = (
            AdvisoryKey::Pair(1, 0x0003_0001),
            AdvisoryKey::Pair(1, 0x0003_0005),
        );
        assert!(held.reserve_as(1, None, kind, "sem", until));
        assert!(
            held.reserve_as(2, None, kind, "sem", until),
            "grants under way share no key"
        );
        assert!(held.place(1, slot0, 0));
        assert!(!held.place(2, slot0, 0), "one slot twice");
        assert!(held.place(2, slot1, 1));
        assert_eq!(
            held.keys_where(|k| matches!(k, AdvisoryKey::Pair(1, _)))
                .len(),
            2
        );
        assert!(matches!(
            held.get(2).map(|e| e.kind),
            Some(Kind::Permit { slot: 1, .. })
        ));
        held.remove(1);
        assert_eq!(held.keys_where(|_| true), vec![slot1]);
        assert!(!held.place(9, slot0, 0), "no entry to place");
    }
}
