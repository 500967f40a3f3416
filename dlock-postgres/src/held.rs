//! The locks one client holds, as the client knows them.
//!
//! A session-level advisory lock is re-entrant within its session: the server would grant a key
//! to a second owner of the same client. So the client keeps every key it holds or is taking in
//! this table and answers busy itself to a second owner, and it keeps each lease's TTL, since
//! advisory locks have none: the keeper gives back a lock whose TTL passed without an extend.

use std::collections::{BTreeSet, HashMap};

use tokio::time::Instant;

use crate::key::AdvisoryKey;

/// One lock of this client.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) key: AdvisoryKey,
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
    by_key: HashMap<AdvisoryKey, u128>,
    deadlines: BTreeSet<(Instant, u128)>,
}

impl Held {
    /// Reserves `key` for `owner` while its grant is under way; `false` if this client holds or
    /// takes it already.
    pub(crate) fn reserve(
        &mut self,
        owner: u128,
        key: AdvisoryKey,
        name: &str,
        until: Instant,
    ) -> bool {
        if self.by_key.contains_key(&key) || self.by_owner.contains_key(&owner) {
            return false;
        }
        self.by_key.insert(key, owner);
        self.by_owner.insert(
            owner,
            Entry {
                key,
                name: name.to_string(),
                grant: None,
                delete_at: until,
                abandoned: false,
            },
        );
        self.deadlines.insert((until, owner));
        true
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
        entry.grant = Some((token, generation));
        let old = entry.delete_at;
        entry.delete_at = delete_at;
        let entry = entry.clone();
        self.deadlines.remove(&(old, owner));
        self.deadlines.insert((delete_at, owner));
        Some(entry)
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
        if self.by_key.get(&entry.key) == Some(&owner) {
            self.by_key.remove(&entry.key);
        }
        Some(entry)
    }

    /// The earliest TTL deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(at, _)| *at)
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

    /// Whether any lock granted in `generation` is held.
    pub(crate) fn holds_in(&self, generation: u64) -> bool {
        self.by_owner
            .values()
            .any(|e| e.grant.is_some_and(|(_, g)| g == generation))
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
}
