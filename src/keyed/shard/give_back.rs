//! Giving a reservation back to its key, keeping it, and changing the
//! rate of every key in a shard.

use super::*;

impl<K: Hash + Eq + Clone> Table<K> {
    /// Forgets a reservation of `key` that will never be given back (its
    /// permits were kept), in the ledger it was noted in (see
    /// [`Ledger::keep`]): the ledger stays as small as what may still be
    /// given back, and goes once nothing is left in it to give back.
    pub(in crate::keyed) fn keep<Q>(&mut self, key: &Q, taken: &Recorded)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.ledgers.is_empty() {
            return;
        }
        let Some(waiting) = self.ledgers.get_mut(key) else {
            return;
        };
        if waiting.serial != taken.serial {
            return;
        }
        waiting.ledger.keep(&taken.reserved);
        if waiting.ledger.is_empty() {
            // Nothing left that could be given back, nor restored.
            self.forget_ledger(key);
        }
    }

    /// Gives back a reservation of `key`, through the ledger it was noted
    /// in (see [`Ledger::give_back`]).
    ///
    /// Without that ledger, nothing is given back: the key was dropped (as
    /// full, where it still reads as full, or to the cap), or its ledger was
    /// no longer needed (every reservation noted in it had passed its
    /// moment, and the last could no longer be restored), and through it
    /// the reservation would give nothing back either. A give-back still
    /// does to the key's present ledger, if any, what a give-back of a
    /// reservation it no longer holds does: it merges the groups whose
    /// moment has passed (so that their reservations are no longer the
    /// latest, as with one ledger all along).
    pub(in crate::keyed) fn give_back<Q>(&mut self, key: &Q, taken: &Recorded, now: u64) -> GiveBack
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.ledgers.is_empty() || !self.ledgers.contains_key(key) {
            return GiveBack::Nothing;
        }
        let mut state = self.get(key, now).expect("a key with a ledger is held");
        let waiting = self.ledgers.get_mut(key).expect("just seen");
        let outcome = if waiting.serial == taken.serial {
            let outcome = waiting.ledger.give_back(&mut state, &taken.reserved, now);
            if outcome == GiveBack::Restored {
                // The last reservation with a wait, undone.
                waiting.last = None;
            }
            outcome
        } else {
            // No group of this ledger, and a moment passed: nothing, once
            // the groups whose moment has passed have merged (as a
            // give-back through one ledger all along would merge them).
            waiting.ledger.expire(now);
            GiveBack::Nothing
        };
        if !waiting.needed(&Entry::of(&state), now) {
            self.forget_ledger(key);
        }
        self.put(key, &state, now);
        outcome
    }

    /// Changes every key's rate at `now`, as `State::set_rate` does for one
    /// limiter. The rate has been checked.
    pub(in crate::keyed) fn set_rate(&mut self, permits_per_second: f64, now: u64) {
        // Every key as numbers, under the old configuration...
        if let Some(config) = self.config.take() {
            let words = std::mem::take(&mut self.words);
            self.states.extend(
                words
                    .into_iter()
                    .map(|(key, cell)| (key, Entry::decoded(cell.into_inner(), now, &config))),
            );
        }
        let template = self.template.clone();
        for entry in self.states.values_mut() {
            let mut state = entry.state(&template);
            state
                .set_rate(permits_per_second, now)
                .expect("the rate was checked");
            *entry = Entry::of(&state);
        }
        // Terms at the old rate: what is waiting now gives back only what
        // the ledger can still vouch for (erring late).
        for waiting in self.ledgers.values_mut() {
            waiting.ledger.clear();
            waiting.last = None;
        }
        self.template
            .set_rate(permits_per_second, now)
            .expect("the rate was checked");
        self.sweep_period = sweep_period(&self.template);
        // ... then as words under the new one, where they fit.
        self.configure(now);
    }
}
