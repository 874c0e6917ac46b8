//! What a Redis limiter's fallback needs of a keyed limiter: its keys'
//! tickets, opening a key at a floor, forgetting a key once paid.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::Ordering::Relaxed;

use super::Keyed;
use super::shard::Table;
use crate::clock::Clock;
use crate::core::Cost;
use crate::{Key, Snapshot};

/// # For a Redis limiter's fallback
///
/// The fallback holds the keys it served in
/// [`Mode::Empty`](super::Mode::Empty); what a key owes Redis is read from
/// its ticket.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl<K: Key, C: Clock> Keyed<K, C> {
    /// What `key` holds now (a key not held: as it would start).
    pub(crate) fn snapshot_of<Q>(&self, key: &Q) -> Snapshot
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_now(key, |table, now| table.snapshot_of(key, now))
    }

    /// The end of the pause a refusal learned by `key` started (µs on the
    /// clock), while it lasts; `None` if `key` is not held (a key that
    /// learned something is held by its limits, not a word).
    pub(crate) fn paused_until<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.ever_learned() {
            return None;
        }
        self.read_now(key, |table, now| table.paused_until(key, now))
    }

    /// The end of each limit's last pause of `key` (µs on the clock; 0:
    /// none), a refusal's or its own as the upstream said it is spent, if
    /// it is held and learned anything.
    pub(crate) fn pauses<Q>(&self, key: &Q) -> Option<Vec<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.ever_learned() {
            return None;
        }
        self.read_now(key, |table, _| table.pauses(key))
    }

    /// The latest ticket of `key`'s limits (µs on the clock), if it is held.
    pub(crate) fn ticket<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.tickets(key)?.into_iter().max()
    }

    /// Each limit's ticket of `key` (µs on the clock), if it is held; one
    /// for a limiter with one limit.
    pub(crate) fn tickets<Q>(&self, key: &Q) -> Option<Vec<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_now(key, |table, now| table.tickets(key, now))
    }

    /// What `ask` reads in `key`'s shard, read-locked, at the time now.
    fn read_now<Q: Hash + ?Sized, T>(&self, key: &Q, ask: impl FnOnce(&Table<K>, u64) -> T) -> T {
        let now = self.clock.now_micros();
        ask(&self.shard(key).read(), now)
    }

    /// Forgets `key` if none of its tickets lies after `until`; whether it
    /// is no longer held.
    pub(crate) fn forget_if_paid<Q>(&self, key: &Q, until: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (mut shard, now) = self.shard_now(key);
        shard.forget_if_paid(key, until, now)
    }

    /// The keys held now.
    pub(crate) fn keys(&self) -> Vec<K> {
        let mut keys = Vec::new();
        for shard in self.shards.iter() {
            keys.extend(shard.0.read().keys().cloned());
        }
        keys
    }

    /// Holds `key` with nothing stored and every ticket at `until` (µs on
    /// the clock), at the rates it `learned` in Redis (`None`: at its
    /// configured rates), unless it is held already.
    pub(crate) fn open<Q>(&self, key: &Q, until: u64, learned: Option<&crate::core::Adopted>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (mut shard, now) = self.shard_now(key);
        let dropped = shard.open(key, until, learned, now);
        drop(shard);
        self.count_dropped(dropped);
    }

    /// Charges `cost` to `key` now, as a request that does not wait (later
    /// callers wait for it): what a call cost past its charge, once its
    /// limits can no longer settle it exactly (see `Limits::settle`).
    pub(crate) fn charge<Q>(&self, key: &Q, cost: &Cost)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (mut shard, now) = self.shard_now(key);
        let dropped = shard.charge(key, cost, now);
        drop(shard);
        self.count_dropped(dropped);
    }

    /// At least the latest ticket of a key dropped to stay within the cap
    /// before it had passed (0 if none was).
    pub(crate) fn dropped_until(&self) -> u64 {
        self.dropped_until.load(Relaxed)
    }
}
