//! Giving a reservation back to its key, or keeping it.

use super::*;

impl<K: Hash + Eq + Clone> Table<K> {
    /// Gives back the reservation `ticket` of `key` at `now` (see
    /// [`Limits::give_back`]), if the key is still held as the entry it was
    /// logged in. Otherwise it gives nothing back: the entry went back to a
    /// word (its log had emptied: the reservation's moment had passed, or
    /// a rate changed), or the key was dropped (to the cap), and through its
    /// log the reservation would give nothing back either.
    pub(in crate::keyed) fn give_back<Q>(&mut self, key: &Q, ticket: LogId, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_entry(key, ticket, now, |limits| limits.give_back(ticket.id, now))
    }

    /// Keeps the reservation `ticket` of `key`: it will not be given back
    /// (see [`Limits::keep`]), and the key may be a word again sooner.
    pub(in crate::keyed) fn keep<Q>(&mut self, key: &Q, ticket: LogId, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_entry(key, ticket, now, |limits| limits.keep(ticket.id, now))
    }

    /// Runs `call` on the limits of `key` if they are the entry `ticket` was
    /// logged in, then holds the key as a word if it can be one again.
    fn on_entry<Q>(
        &mut self,
        key: &Q,
        ticket: LogId,
        now: u64,
        call: impl FnOnce(&mut Limits) -> bool,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let Some(entry) = self.limits.get_mut(key) else {
            return false;
        };
        if entry.serial != ticket.serial {
            return false;
        }
        let done = call(&mut entry.limits);
        self.settle(key, now);
        done
    }
}
