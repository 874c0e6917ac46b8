//! Giving a reservation back to its key, keeping it, or settling a call.

use super::*;
use crate::core::Cost;

impl<K: Hash + Eq + Clone> Table<K> {
    /// Settles the open call `ticket` of `key` (see [`Limits::settle`]), if
    /// the key is still held as the entry it was logged in; else what
    /// `actual` counts past `charged` is [`charge`](Self::charge)d.
    pub(in crate::keyed) fn settle_call<Q>(
        &mut self,
        key: &Q,
        ticket: LogId,
        charged: &Cost,
        actual: &Cost,
        now: u64,
    ) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let logged = self
            .limits
            .get(key)
            .is_some_and(|e| e.serial == ticket.serial);
        if logged {
            self.on_entry(key, ticket, now, |limits, id, now| {
                limits.settle(id, charged, actual, now);
                true
            });
            return Dropped::default();
        }
        self.charge(
            key,
            &actual.more_than(charged, self.template.states().len()),
            now,
        )
    }

    /// Charges `cost` to `key` at `now` as a request that does not wait:
    /// the limits' answer to the settle of a call their log let go (no
    /// call has id 0).
    pub(in crate::keyed) fn charge<Q>(&mut self, key: &Q, cost: &Cost, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let nothing = Cost::new(0);
        let (_, dropped) = self.update(key, now, |limits| {
            limits.settle(0, &nothing, cost, now);
            Some(())
        });
        dropped
    }

    /// Runs `call` ([`Limits::give_back`], [`Limits::keep`] or a settle) on
    /// the limits of `key`, with `ticket`'s id in their log and `now`, if the
    /// key is still held as the entry `ticket` was logged in, then holds the
    /// key as a word if it can be one again; what `call` answers. Otherwise
    /// it does nothing: the entry went back to a word (its log had emptied:
    /// the moment passed, or a rate changed) or was dropped to the cap, and
    /// through its log the reservation would give nothing back either.
    pub(in crate::keyed) fn on_entry<Q>(
        &mut self,
        key: &Q,
        ticket: LogId,
        now: u64,
        call: impl FnOnce(&mut Limits, u64, u64) -> bool,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let Some(entry) = self
            .limits
            .get_mut(key)
            .filter(|e| e.serial == ticket.serial)
        else {
            return false;
        };
        let done = call(&mut entry.limits, ticket.id, now);
        self.settle(key, now);
        done
    }
}
