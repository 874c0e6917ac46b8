//! The keyed limiter's rates, size and clock, giving back to its keys, and
//! how it shows itself.

use std::fmt;
use std::sync::PoisonError;
use std::sync::atomic::Ordering::Relaxed;

use super::{Keyed, KeyedTaken};
use crate::clock::Clock;
use crate::core::{
    Cost, InvalidRate, Learning, Lesson, Limits, State, reshape, stable_interval_micros,
};
use crate::meter::Metered;
use crate::meter::Metrics;
use crate::reservation::{GiveBackId, GivesBack};
use crate::store::Rate;
use crate::{Error, Key, Stats};

/// # Rate, size and clock
impl<K: Key, C: Clock> Keyed<K, C> {
    /// Applies `change` to the limits every key runs under, then the rates
    /// it leaves to every key held (shard by shard; calls on other shards
    /// go on meanwhile), and sets the rate as last set. One change at a
    /// time.
    fn reconfigure(
        &self,
        change: impl FnOnce(&mut Limits, &mut Box<[f64]>) -> Result<(), InvalidRate>,
    ) -> Result<(), Error> {
        let mut shape = self
            .reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut template = self.shards[0].0.read().template().clone();
        change(&mut template, &mut shape)?;
        let rates: Vec<f64> = template
            .states()
            .iter()
            .map(State::permits_per_second)
            .collect();
        for shard in self.shards.iter() {
            let read = self.clock.now_micros();
            let (mut table, now) = shard.0.write_at(read);
            table.set_rates(&rates, now)?;
        }
        self.rate_bits.store(rates[0].to_bits(), Relaxed);
        Ok(())
    }

    /// The clock this limiter reads and sleeps on.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    /// The number of keys held now (those not known to read as full).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.0.read().len()).sum()
    }
}

impl<K, C: Clock> Metered for Keyed<K, C> {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl<K: Key, C: Clock> Rate for Keyed<K, C> {
    /// [`KeyedRateLimiter::set_rate`](crate::KeyedRateLimiter::set_rate)
    /// in this process: visits every key held
    /// ([`reconfigure`](Self::reconfigure)).
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        self.reconfigure(|limits, shape| limits.set_first_rate(shape, permits_per_second, 0))
    }

    /// The stable rate of every key, in permits per second, as last set.
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Relaxed))
    }

    fn slowest_rate(&self) -> f64 {
        let shard = self.shards[0].0.read();
        crate::core::slowest(
            shard
                .template()
                .states()
                .iter()
                .map(State::permits_per_second),
        )
    }

    /// [`KeyedRateLimiter::set_limit_rate`](crate::KeyedRateLimiter::set_limit_rate)
    /// in this process.
    fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        crate::error::check_limit(index, self.limits)?;
        self.reconfigure(|limits, shape| {
            limits.set_rate(Some(index), permits_per_second, 0)?;
            reshape(shape, &limits.ceilings());
            Ok(())
        })
    }

    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn limit_count(&self) -> usize {
        self.shards[0].0.read().template().states().len()
    }

    /// The keys held, and those dropped at the cap before they read as
    /// full.
    fn stats(&self) -> Stats {
        Stats {
            keys: self.len(),
            dropped_unfinished: self.dropped_unfinished.load(Relaxed),
            ..Stats::default()
        }
    }
}

impl<K: Key, C: Clock> GivesBack for Keyed<K, C> {
    fn give_back(&self, taken: GiveBackId) -> bool {
        self.on_ticket(&taken, |limits, id, now| limits.give_back(id, now))
    }

    fn keep(&self, taken: GiveBackId) {
        self.on_ticket(&taken, |limits, id, now| limits.keep(id, now));
    }

    fn settle(&self, taken: &GiveBackId, charged: &Cost, actual: &Cost) {
        if let Some(taken) = Self::ours(taken) {
            let (mut shard, now) = self.shard_now(&taken.key);
            let dropped = shard.settle_call(&taken.key, taken.ticket, charged, actual, now);
            drop(shard);
            self.count_dropped(dropped);
        }
    }

    fn learn(&self, taken: &GiveBackId, lesson: &Lesson, learning: &Learning) {
        if let Some(taken) = Self::ours(taken) {
            self.learn_key(&taken.key, lesson, learning);
        }
    }
}

impl<K: Key, C: Clock> Keyed<K, C> {
    /// `taken` as a reservation of this limiter's, if it is one.
    fn ours(taken: &GiveBackId) -> Option<&KeyedTaken<K>> {
        let GiveBackId::Boxed(taken) = taken else {
            return None;
        };
        taken.downcast_ref::<KeyedTaken<K>>()
    }

    /// The key of the reservation `taken`, if it is this limiter's.
    #[cfg(feature = "redis")]
    pub(crate) fn key_of(taken: &GiveBackId) -> Option<&K> {
        Self::ours(taken).map(|taken| &taken.key)
    }

    /// Runs `call` on the limits of the reservation `taken`, if it is this
    /// limiter's, with its id in their log and the time (see the shard's
    /// `on_entry`).
    fn on_ticket(
        &self,
        taken: &GiveBackId,
        call: impl FnOnce(&mut Limits, u64, u64) -> bool,
    ) -> bool {
        let Some(taken) = Self::ours(taken) else {
            return false;
        };
        let (mut shard, now) = self.shard_now(&taken.key);
        shard.on_entry(&taken.key, taken.ticket, now, call)
    }
}

impl<K, C: Clock> fmt::Debug for Keyed<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let template = self.shards[0].0.read().template().clone();
        let limits: Vec<_> = template
            .states()
            .iter()
            .map(|state| (state.permits_per_second(), state.policy().clone()))
            .collect();
        f.debug_struct("KeyedRateLimiter")
            .field("limits", &limits)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}
