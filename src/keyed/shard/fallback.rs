//! The shard operations a Redis limiter's fallback uses (see
//! `keyed/fallback.rs`).

use super::*;

impl<K: Hash + Eq + Clone> Table<K> {
    /// The ticket of `key` (at `now`), if held.
    pub(in crate::keyed) fn ticket<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        held_entry(&self.words, &self.states, self.config.as_ref(), key, now)
            .map(|entry| entry.next_free_micros)
    }

    /// The keys held.
    pub(in crate::keyed) fn keys(&self) -> impl Iterator<Item = &K> {
        self.states.keys().chain(self.words.keys())
    }

    /// Removes `key` if its ticket (at `now`) is at most `until`; whether
    /// it is no longer held.
    pub(in crate::keyed) fn forget_if_paid<Q>(&mut self, key: &Q, until: u64, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.ticket(key, now) {
            None => true,
            Some(ticket) if ticket <= until => {
                if !self.ledgers.is_empty() {
                    self.forget_ledger(key);
                }
                self.states.remove(key);
                self.words.remove(key);
                true
            }
            Some(_) => false,
        }
    }

    /// Holds `key` with nothing stored and the ticket at `until`, unless it
    /// is held already.
    pub(in crate::keyed) fn open<Q>(&mut self, key: &Q, until: u64, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.states.contains_key(key) || self.words.contains_key(key) {
            return Dropped::default();
        }
        let dropped = self.make_room(now);
        let mut state = self.full_state(now);
        state.stored_permits = 0.0;
        state.next_free_micros = until.max(now);
        self.put(key, &state, now);
        dropped
    }
}
