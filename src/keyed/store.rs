//! The keyed limiter as an [engine](crate::store): its shards answer at once.

use std::borrow::Borrow;
use std::future::{Future, ready};
use std::hash::Hash;
use std::time::Duration;

use super::Keyed;
use crate::clock::Clock;
use crate::core::Cost;
use crate::store::{Engine, timeout_micros, wait_of};
use crate::{Error, Key, Reservation, Snapshot};

impl<K, C, Q> Engine<Q> for Keyed<K, C>
where
    K: Key + Borrow<Q>,
    C: Clock,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    #[inline]
    fn take(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        let grant = self.reserve_micros(key, permits, timeout_micros(timeout), true);
        ready(Ok(grant.map(|grant| self.to_reservation(key, grant))))
    }

    #[inline]
    fn take_wait<T: Send>(
        &self,
        key: &Q,
        permits: Result<u32, Error>,
        timeout: Option<Duration>,
        then: impl FnOnce(Result<Option<Duration>, Error>) -> T + Send,
    ) -> impl Future<Output = T> + Send {
        let timeout = timeout_micros(timeout);
        let grant = permits.map(|permits| self.reserve_micros(key, permits, timeout, false));
        ready(then(
            grant.map(|grant| grant.map(|(wait, _, _)| wait_of(wait))),
        ))
    }

    fn take_call(
        &self,
        key: &Q,
        cost: &Cost,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        let grant = self.open_call(key, cost, timeout_micros(timeout));
        ready(Ok(grant.map(|grant| self.to_reservation(key, grant))))
    }

    fn snapshot(&self, key: &Q) -> impl Future<Output = Result<Snapshot, Error>> + Send {
        ready(Ok(self.snapshot_of(key)))
    }

    fn take_now(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        let grant = self.reserve_micros(key, permits, 0, false);
        Some(Ok(grant.is_some_and(|(wait, _, _)| wait == 0)))
    }

    fn snapshot_now(&self, key: &Q) -> Option<Snapshot> {
        Some(self.snapshot_of(key))
    }
}
