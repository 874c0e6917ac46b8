//! The limiter traits a fail-over serves through (see [the rule at every
//! switch](super)), and what its round trips tell it back.

use super::*;
use crate::core::{Cost, Learning, Lesson, reshape};
use crate::meter::Metered;
use crate::redis::backend::Scope;

/// The engine is the fail-over behind its `Arc`: it shares itself with
/// the tasks it starts.
impl<K, C, Q> Engine<Q> for Arc<Failover<K, C>>
where
    K: Key + Display + Borrow<Q>,
    C: Clock,
    Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    fn take(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        Failover::take(self, key, permits, timeout, true)
    }

    async fn take_wait<T: Send>(
        &self,
        key: &Q,
        permits: Result<u32, Error>,
        timeout: Option<Duration>,
        then: impl FnOnce(Result<Option<Duration>, Error>) -> T + Send,
    ) -> T {
        let taken = match permits {
            Ok(permits) => Failover::take(self, key, permits, timeout, false).await,
            Err(error) => Err(error),
        };
        then(taken.map(|taken| taken.map(Reservation::keep)))
    }

    /// The call runs on the backend's runtime while this thread blocks; a
    /// runtime that is gone or no longer driven puts Redis out of reach
    /// from here, and the fallback serves the call. While the key's part of
    /// Redis is down, the fallback serves it here, as it would there, so
    /// that a runtime no longer driven is waited for once, not per call
    /// (the probe, on that runtime, says when Redis is back).
    fn take_blocking(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        self.backend.may_block()?;
        let target = self.target(key);
        let failure = if self.is_down(&target) {
            None
        } else {
            let (this, owned) = (Arc::clone(self), key.to_owned());
            let work = async move {
                Engine::<K>::take_wait(&this, &owned, Ok(permits), timeout, |taken| taken).await
            };
            match self
                .backend
                .block_on(work, Some(self.backend.blocking_bound()))
            {
                Ok(taken) => return taken,
                Err(Error::Backend(failure)) => {
                    self.backend
                        .degrade(&failure, target.clone(), Scope::Backend);
                    Some(failure)
                }
                Err(error) => return Err(error),
            }
        };
        let take = |local| now(Engine::take(local, key, permits, timeout));
        match self.serve_locally(key, &target, failure, false, take) {
            Ok(served) => served.map(|taken| taken.map(Reservation::keep)),
            // (An impatient caller never waits for a carry-back.)
            Err(_) => Ok(None),
        }
    }

    fn take_call(
        &self,
        key: &Q,
        cost: &Cost,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        // A limiter that calls an upstream may be paused by its refusals.
        self.learns.store(true, Ordering::Relaxed);
        Failover::take_call(self, key, cost, timeout)
    }

    fn snapshot(&self, key: &Q) -> impl Future<Output = Result<Snapshot, Error>> + Send {
        self.status(key)
    }

    fn paused(&self, key: &Q) -> impl Future<Output = Option<u64>> + Send {
        Failover::paused(self, key)
    }

    /// The status runs on the backend's runtime while this thread blocks;
    /// as [`take_blocking`](Self::take_blocking), while the key's part of
    /// Redis is down or out of reach from here, the fallback answers.
    fn paused_blocking(&self, key: &Q) -> Option<u64> {
        if !self.learns.load(Ordering::Relaxed) {
            return None;
        }
        if self.is_down(&self.target(key)) {
            return self.paused_locally(key);
        }
        let (this, owned) = (Arc::clone(self), key.to_owned());
        let paused = self.backend.block_on(
            async move { Failover::paused(&this, owned.borrow()).await },
            Some(self.backend.blocking_bound()),
        );
        paused.unwrap_or_else(|_| self.paused_locally(key))
    }
}

impl<K: Key + Display, C: Clock> Rate for Arc<Failover<K, C>> {
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    fn slowest_rate(&self) -> f64 {
        crate::core::slowest(self.script_args.rates().iter().copied())
    }

    /// Changes the rate from now on, here and (with the next call of each
    /// key) in Redis.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        let shape = self.reconfiguring();
        self.set_first_rate(&shape, permits_per_second)
    }

    /// Changes the rate of limit `index` alone, here and (with the next
    /// call of each key) in Redis.
    fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        let mut shape = self.reconfiguring();
        let rates = self.script_args.rates();
        crate::error::check_limit(index, rates.len())?;
        if rates.len() == 1 {
            return self.set_first_rate(&shape, permits_per_second);
        }
        self.local
            .set_limit_rate(index, share_of(permits_per_second, self.local_fraction))?;
        let mut rates = rates.to_vec();
        rates[index] = permits_per_second;
        reshape(&mut shape, &rates);
        self.script_args.set_rates(rates.into());
        if index == 0 {
            self.rate_bits
                .store(permits_per_second.to_bits(), Ordering::Relaxed);
        }
        Ok(())
    }

    fn limit_count(&self) -> usize {
        self.script_args.rates().len()
    }

    fn stats(&self) -> Stats {
        // The fallback's keys, what it dropped and the calls it served; the
        // switches, the backend's.
        let local = self.local.stats();
        Stats {
            degraded: self.is_degraded(),
            keys: local.keys,
            dropped_unfinished: local.dropped_unfinished,
            fallback_calls: self.fallback_calls.load(Ordering::Relaxed),
            ..self.backend.health.stats()
        }
    }

    fn clock(&self) -> &dyn Clock {
        self.local.clock()
    }

    fn sleep_blocking(&self, wait: Duration) {
        blocking_section(|| self.local.clock().sleep_blocking(wait));
    }
}

impl<K, C: Clock> std::fmt::Debug for Failover<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("key", &self.describe())
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl<K, C: Clock> Failover<K, C> {
    /// The Redis key, or the keys' prefix.
    pub(crate) fn describe(&self) -> &str {
        match &self.naming {
            Naming::Single { key, .. } => key,
            Naming::Keyed { prefix } => prefix,
        }
    }
}

impl<K: Key + Display, C: Clock> Recover for Failover<K, C> {
    fn recovered(&self) {
        if self.active.load(Ordering::Acquire) {
            self.carry_all();
        }
    }
}

impl<K, C: Clock> Metered for Failover<K, C> {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl<K: Key + Display, C: Clock> GivesBack for Failover<K, C> {
    fn give_back(&self, taken: GiveBackId) -> bool {
        if let Some(call) = Self::redis_call(&taken) {
            self.give_back_call(call);
            return true;
        }
        match redis_taken(taken) {
            Ok(taken) => {
                self.give_back_in_redis(taken.key, taken.token);
                true
            }
            Err(local) => GivesBack::give_back(&self.local, local),
        }
    }

    fn keep(&self, taken: GiveBackId) {
        if let Some(call) = Self::redis_call(&taken) {
            return self.keep_call(call);
        }
        if let Err(local) = redis_taken(taken) {
            GivesBack::keep(&self.local, local);
        }
    }

    fn settle(&self, taken: &GiveBackId, charged: &Cost, actual: &Cost) {
        match Self::redis_call(taken) {
            Some(call) => self.settle_call(call, charged, actual),
            None => self.served_locally(taken, |local| {
                GivesBack::settle(local, taken, charged, actual);
            }),
        }
    }

    fn learn(&self, taken: &GiveBackId, lesson: &Lesson, learning: &Learning) {
        self.learns.store(true, Ordering::Relaxed);
        match Self::redis_call(taken) {
            Some(call) => self.learn_call(call, lesson, learning),
            None => self.served_locally(taken, |local| {
                GivesBack::learn(local, taken, lesson, learning);
            }),
        }
    }
}

impl<K: Key + Display, C: Clock> Failover<K, C> {
    /// Held by a rate change from reading the rates to writing them, so
    /// that two changes at once are made one after the other (neither
    /// undoes the other's limit): what `set_rate` scales.
    fn reconfiguring(&self) -> MutexGuard<'_, Box<[f64]>> {
        self.reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `set_rate`, under [`reconfiguring`](Self::reconfiguring): the first
    /// limit's rate becomes `permits_per_second` and the others of `shape`
    /// scale together ([`Shape`](crate::core::Shape)), here and in Redis.
    fn set_first_rate(&self, shape: &[f64], permits_per_second: f64) -> Result<(), Error> {
        self.local
            .set_rate(share_of(permits_per_second, self.local_fraction))?;
        let rates = crate::core::first_rate_scaled(shape, permits_per_second);
        self.script_args.set_rates(rates.into());
        self.rate_bits
            .store(permits_per_second.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// Runs `update` (a settle, a lesson) on a call the fallback served,
    /// `taken`, as the rule for calls says: in the fallback, even once
    /// Redis is back, with its key held there (opened at its floor if it
    /// was carried back meanwhile) and then carried back with what it
    /// changed.
    fn served_locally(&self, taken: &GiveBackId, update: impl FnOnce(&Keyed<K, C>)) {
        match Keyed::<K, C>::key_of(taken) {
            Some(key) => self.locally(key, update),
            None => update(&self.local),
        }
    }
}

/// `taken` as a reservation made in Redis, if it is one; else as it is,
/// the fallback's.
fn redis_taken(taken: GiveBackId) -> Result<Box<RedisKeyTaken>, GiveBackId> {
    match taken {
        GiveBackId::Boxed(taken) => (taken as Box<dyn std::any::Any + Send + Sync>)
            .downcast::<RedisKeyTaken>()
            .map_err(GiveBackId::Boxed),
        other => Err(other),
    }
}

impl<K: Key + Display, C: Clock> Late for Failover<K, C> {
    fn late(&self, key: &str, kept: Kept) {
        let now = self.now();
        let mut books = self.books();
        if kept.debt_micros > 0
            && (books.late.contains_key(key)
                || books.late.room(self.max_local_keys, now, |late| late.until))
        {
            let late = books.late.entry(key.into()).or_default();
            // (One that has ended counts for nothing: as if it had gone.)
            if late.until <= now {
                *late = LateGrants::default();
            }
            late.until = late.until.max(now.saturating_add(kept.debt_micros));
            late.charge = late.charge.saturating_add(kept.charge_micros);
        }
        drop(books);
        self.activate();
    }

    fn awaited(&self, key: &str, pending: bool) {
        let mut books = self.books();
        if pending {
            *books.awaited.entry(key.into()).or_default() += 1;
        } else if let Some(count) = books.awaited.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                books.awaited.remove(key);
            }
            drop(books);
            self.answered.notify_waiters();
        }
    }
}
