//! The keyed limiter as a [store](crate::store): its shards answer at once.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use super::KeyedRateLimiter;
use crate::clock::Clock;
use crate::core::micros;
use crate::error::check_permits;
use crate::metrics::Metrics;
use crate::store::{Keyed, Now, Rate, in_process_store};
use crate::{Error, Reservation, Snapshot};

/// A timeout in µs for the shards: `u64::MAX` is no timeout.
fn timeout_micros(timeout: Option<Duration>) -> u64 {
    timeout.map_or(u64::MAX, |t| micros(t).min(u64::MAX - 1))
}

impl<K, C, Q> Now<Q> for KeyedRateLimiter<K, C>
where
    K: Borrow<Q> + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    fn take_wait_now(&self, key: &Q, permits: u32, timeout: Option<Duration>) -> Option<Duration> {
        let grant = self.reserve_micros(key, permits, timeout_micros(timeout), false);
        grant.map(|(wait, _, _)| Duration::from_micros(wait))
    }

    fn take_now(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Option<Reservation<'_>> {
        let grant = self.reserve_micros(key, permits, timeout_micros(timeout), true);
        grant.map(|grant| self.to_reservation(key, grant))
    }

    fn next_free_now(&self, key: &Q) -> Duration {
        self.wait_of(key)
    }

    fn snapshot_now(&self, key: &Q) -> Snapshot {
        self.snapshot_of(key)
    }

    fn take_if_free_now(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        let free = check_permits(permits).map(|()| {
            self.reserve_micros(key, permits, 0, false)
                .is_some_and(|(wait, _, _)| wait == 0)
        });
        Some(free)
    }
}

in_process_store!(
    impl<K, C, Q> for KeyedRateLimiter<K, C>, key Q, where
    K: Borrow<Q> + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
);

impl<K, C> Rate for KeyedRateLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        KeyedRateLimiter::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        KeyedRateLimiter::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl<K, C> Keyed<K> for KeyedRateLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Store = Self;

    fn store(&self) -> &Self {
        self
    }
}
