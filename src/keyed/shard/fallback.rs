//! The shard operations a Redis limiter's fallback uses (see
//! `keyed/fallback.rs`).

use super::*;

impl<K: Hash + Eq + Clone> Table<K> {
    /// Each limit's ticket of `key` (at `now`), if held.
    pub(in crate::keyed) fn tickets<Q>(&self, key: &Q, now: u64) -> Option<Vec<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(entry) = self.limits.get(key) {
            let states = entry.limits.states();
            return Some(states.iter().map(State::next_free_micros).collect());
        }
        let (config, cell) = (self.config.as_ref()?, self.words.get(key)?);
        Some(vec![
            word::decode(cell.load(Relaxed), now, config).next_free,
        ])
    }

    /// The end of each limit's last pause of `key` (see `Limits::pauses`),
    /// if it is held and learned anything.
    pub(in crate::keyed) fn pauses<Q>(&self, key: &Q) -> Option<Vec<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pauses = self.limits.get(key)?.limits.pauses()?;
        Some(pauses.to_vec())
    }

    /// The keys held.
    pub(in crate::keyed) fn keys(&self) -> Box<dyn Iterator<Item = &K> + '_> {
        match self.config {
            Some(_) => Box::new(self.words.keys()),
            None => Box::new(self.limits.keys()),
        }
    }

    /// Removes `key` if none of its tickets (at `now`) lies after `until`;
    /// whether it is no longer held.
    pub(in crate::keyed) fn forget_if_paid<Q>(&mut self, key: &Q, until: u64, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.tickets(key, now) {
            None => true,
            Some(tickets) if tickets.iter().all(|ticket| *ticket <= until) => {
                self.forget(key);
                true
            }
            Some(_) => false,
        }
    }

    /// Holds `key` with nothing stored and every ticket at `until`, at the
    /// rates it `learned` elsewhere (see `Limits::adopt`; `None`: at its
    /// configured rates), unless it is held already.
    pub(in crate::keyed) fn open<Q>(
        &mut self,
        key: &Q,
        until: u64,
        learned: Option<&crate::core::Adopted>,
        now: u64,
    ) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.limits.contains_key(key) || self.words.contains_key(key) {
            return Dropped::default();
        }
        let dropped = self.make_room(now);
        for state in self.template.states_mut() {
            start(state, Mode::Empty, until.max(now));
        }
        if let Some(learned) = learned {
            self.template.adopt(learned, now);
        }
        self.keep_scratch(key, now);
        dropped
    }
}
