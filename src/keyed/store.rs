//! The keyed limiter as an [engine](crate::store): its shards answer at once.

use std::borrow::Borrow;
use std::hash::Hash;

use super::Keyed;
use crate::clock::Clock;
use crate::core::Cost;
use crate::store::AtOnce;
use crate::{Key, Reservation, Snapshot};

impl<K, C, Q> AtOnce<Q> for Keyed<K, C>
where
    K: Key + Borrow<Q>,
    C: Clock,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    #[inline]
    fn reserve_at_once(&self, key: &Q, permits: u32, timeout: u64) -> Option<Reservation<'_>> {
        let grant = self.reserve_micros(key, permits, timeout, true);
        grant.map(|grant| self.to_reservation(key, grant))
    }

    #[inline]
    fn wait_at_once(&self, key: &Q, permits: u32, timeout: u64) -> Option<u64> {
        let grant = self.reserve_micros(key, permits, timeout, false);
        grant.map(|(wait, _, _)| wait)
    }

    fn call_at_once(&self, key: &Q, cost: &Cost, timeout: u64) -> Option<Reservation<'_>> {
        let grant = self.open_call(key, cost, timeout);
        grant.map(|grant| self.to_reservation(key, grant))
    }

    fn snapshot_at_once(&self, key: &Q) -> Snapshot {
        self.snapshot_of(key)
    }

    fn paused_at_once(&self, key: &Q) -> Option<u64> {
        self.paused_until(key)
    }
}
