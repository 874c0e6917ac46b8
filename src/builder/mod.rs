//! [`Builder`]: the one way to make a limiter, of any kind.

mod limit;

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

pub use limit::{DEFAULT_COLD_FACTOR, Limit};
pub(crate) use limit::{PolicyConfig, concurrency, limit_states};

use crate::clock::{Clock, SystemClock};
use crate::core::Limits;
use crate::error::invalid;
use crate::limiter::{Key, Local, NoKey, PerKey, Store};
use crate::meter::Metrics;
use crate::{Error, KeyedRateLimiter, RateLimiter};

/// Builds a limiter: [`RateLimiter::builder`] for one rate,
/// [`KeyedRateLimiter::builder`] for one per key. The same setters shape
/// both: a rate and its policy, or several [`Limit`]s; the clock; and
/// where the state lives, in this process by default or in Redis with
/// [`redis`](Builder::redis) (feature `redis`).
///
/// Setting [`warmup`](Builder::warmup) chooses the warming-up policy;
/// otherwise the limiter is bursty. Contradictory options are an error from
/// [`build`](Builder::build), not a guess.
///
/// ```
/// use std::time::Duration;
/// use paceline::{KeyedRateLimiter, Limit, RateLimiter};
/// use paceline::clock::FakeClock;
///
/// let clock = FakeClock::new();
/// let limiter = RateLimiter::builder()
///     .limit(Limit::per_second(2.0).warmup(Duration::from_secs(4)).cold_factor(5.0))
///     .clock(clock.clone())
///     .build()?;
/// assert_eq!(limiter.rate(), 2.0);
///
/// // 100 a minute per tenant, at most 10 000 tenants held.
/// let per_tenant = KeyedRateLimiter::<u64>::builder()
///     .limit(Limit::per(100.0, Duration::from_secs(60)))
///     .max_keys(10_000)
///     .build()?;
/// assert!(per_tenant.try_reserve(&7, 1, Duration::ZERO)?.is_some());
///
/// let err = RateLimiter::builder()
///     .permits_per_second(2.0)
///     .max_burst(Duration::from_secs(1))
///     .warmup(Duration::from_secs(4))
///     .build();
/// assert!(err.is_err());
/// # Ok::<(), paceline::Error>(())
/// ```
#[must_use = "a builder does nothing until .build() is called"]
pub struct Builder<K = NoKey, S: Store = Local, C = SystemClock> {
    config: PolicyConfig,
    /// `None` until [`clock`](Builder::clock) is called: the system clock,
    /// made only by `build` (making one calibrates the processor's counter
    /// once per process, which a program that brings its own clock never
    /// needs).
    clock: Option<C>,
    name: Option<String>,
    max_keys: Option<usize>,
    learning: crate::outbound::Learning,
    store: S::Settings,
    shape: PhantomData<fn(K)>,
}

/// A builder is a template: clone it to build several limiters of one
/// configuration (one per tenant, or one here and one through Redis).
impl<K, S: Store, C: Clone> Clone for Builder<K, S, C> {
    fn clone(&self) -> Self {
        Builder {
            config: self.config.clone(),
            clock: self.clock.clone(),
            name: self.name.clone(),
            max_keys: self.max_keys,
            learning: self.learning,
            store: self.store.clone(),
            shape: PhantomData,
        }
    }
}

impl<K> Builder<K> {
    pub(crate) fn new() -> Self {
        Builder {
            config: PolicyConfig::default(),
            clock: None,
            name: None,
            max_keys: None,
            learning: crate::outbound::Learning::default(),
            store: (),
            shape: PhantomData,
        }
    }
}

/// # What every limiter has
impl<K, S: Store, C: Clock> Builder<K, S, C> {
    /// The stable rate, in permits per second: required, unless the limits
    /// are given with [`limit`](Self::limit). Must be positive;
    /// `f64::INFINITY` means no limit.
    ///
    /// Precision: waits are whole microseconds, but the schedule carries
    /// each cost to 2^-20 µs, so a busy limiter achieves this rate within
    /// 0.01% (single permits up to 10^7/s, chunks of 64 or more up to
    /// 10^9/s; see [exact at every rate](crate::design#exact-at-every-rate)).
    ///
    /// How it starts: a `RateLimiter` in this process starts with nothing
    /// stored, as the classic algorithm's new limiter does (the first
    /// request goes at once, the next waits its interval; a warming-up one
    /// starts cold). Every key of a keyed limiter, a Redis limiter, and a
    /// [`Limit`] start full, their burst there at once: a key not held, or
    /// missing in Redis, reads as full, which is what lets it be forgotten.
    /// So the same options through Redis let one burst more go at start.
    pub fn permits_per_second(mut self, permits_per_second: f64) -> Self {
        self.config.permits_per_second = Some(permits_per_second);
        self
    }

    /// Bursty policy: how much idle time is saved up as permits usable at
    /// once, the classic way: `max_burst × rate` permits stored, so one
    /// more than that goes at once. Default one second. `Duration::ZERO`
    /// stores nothing: exact spacing. ([`Limit::burst`] counts requests
    /// at once instead.)
    pub fn max_burst(mut self, max_burst: Duration) -> Self {
        self.config.max_burst = Some(max_burst);
        self
    }

    /// Chooses the warming-up policy: a limiter idle for this long starts
    /// slow, 3 times slower than stable, and takes this long to reach its
    /// stable rate. (Another cold factor:
    /// [`Limit::cold_factor`], on a [`limit`](Self::limit).)
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.config.warmup = Some(warmup);
        self
    }

    /// Adds a limit that every request must also satisfy: a request goes
    /// at the earliest moment every limit allows it, every limit is
    /// charged for it, a refused try charges none, and a give-back
    /// returns it to all of them. The rate set with
    /// [`permits_per_second`](Self::permits_per_second), if any, is the
    /// first limit, and the others follow in the order given. See
    /// [`Limit`].
    pub fn limit(mut self, limit: Limit) -> Self {
        self.config.limits.push(limit);
        self
    }

    /// The clock the limiter reads and sleeps on. Default: [`SystemClock`];
    /// a [`FakeClock`](crate::clock::FakeClock) in tests.
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, S, C2> {
        Builder {
            config: self.config,
            clock: Some(clock),
            name: self.name,
            max_keys: self.max_keys,
            learning: self.learning,
            store: self.store,
            shape: PhantomData,
        }
    }

    /// The limiter's name in its metrics (feature `metrics`; see
    /// `paceline::metrics`): never a key, so that clients cannot grow
    /// them. Default `default`. A Redis limiter's is its Redis key,
    /// whatever this says.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// The most keys held in this process: a cap for key spaces a
    /// client controls (addresses, tokens), on a keyed limiter; on a keyed
    /// Redis limiter, on the keys its fallback holds while Redis is down (a
    /// `RateLimiter` holds none in this process and one key in a fallback,
    /// and refuses it). Without
    /// it, a keyed limiter's memory follows the keys active within about
    /// one refill period (at least a second). It counts every key held,
    /// whichever shard it falls in: below it nothing is dropped. At the
    /// cap, a new key's shard (or, if it holds less than its share of the
    /// cap, the shard holding the most) drops its keys that read as full
    /// first, then those nearest to full, which lose their debt (counted in
    /// [`Stats::dropped_unfinished`](crate::Stats)). New keys arriving at
    /// once on several shards may pass it by one each, for a moment. Must
    /// be at least 1.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// How the limiter learns the limit of an upstream it paces calls to,
    /// from the answers its [`Call`](crate::outbound::Call)s feed back
    /// (default [`Learning::default`](crate::outbound::Learning)). Name the
    /// limits with [`Limit::named`] to match the upstream's names for
    /// them.
    pub fn learning(mut self, learning: crate::outbound::Learning) -> Self {
        self.learning = learning;
        self
    }

    /// What the limiter knows of the upstream it paces calls to; an error if
    /// its learning holds a value out of range.
    pub(crate) fn upstream(&self) -> Result<crate::outbound::Upstream, Error> {
        self.learning.check()?;
        let first = self.config.permits_per_second.map(|_| None);
        let names = first
            .into_iter()
            .chain(
                (self.config.limits.iter())
                    .filter(|l| l.is_rate())
                    .map(|l| l.name().map(Box::from)),
            )
            .collect();
        Ok(crate::outbound::Upstream {
            learning: self.learning,
            names,
        })
    }

    /// The clock, the metrics and the cap, checked.
    pub(crate) fn parts(&mut self) -> Result<(C, Metrics, Option<usize>), Error> {
        if self.max_keys == Some(0) {
            return invalid(
                "max_keys must be at least 1 (got 0): a limiter that holds no key cannot \
                 limit; leave max_keys unset for no cap",
            );
        }
        let clock = match self.clock.take() {
            Some(clock) => clock,
            None => system_clock(),
        };
        Ok((clock, Metrics::named(self.name.as_deref()), self.max_keys))
    }

    /// The options, for a store's own build.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// The store's settings, for its own build.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store(&self) -> &S::Settings {
        &self.store
    }

    /// This builder with another store.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_store<S2: Store>(self, store: S2::Settings) -> Builder<K, S2, C> {
        Builder {
            config: self.config,
            clock: self.clock,
            name: self.name,
            max_keys: self.max_keys,
            learning: self.learning,
            store,
            shape: PhantomData,
        }
    }

    /// The store's settings, to change.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store_mut(&mut self) -> &mut S::Settings {
        &mut self.store
    }
}

/// The system clock for a builder whose clock was never set: only
/// `Builder::new` leaves it unset, and that builder's clock type is
/// [`SystemClock`].
fn system_clock<C: Clock>() -> C {
    let system: Box<dyn Any> = Box::new(SystemClock::new());
    match system.downcast::<C>() {
        Ok(clock) => *clock,
        Err(_) => unreachable!("only a builder on the system clock leaves its clock unset"),
    }
}

/// # In this process
impl<C: Clock> Builder<NoKey, Local, C> {
    /// Checks the options and creates the limiter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if no rate was given, the rate is zero,
    /// negative or NaN, the cold factor is below 1 or above 10^6, a limit
    /// is invalid, options of both policies were set, a
    /// [`learning`](Self::learning) value is out of its range, or
    /// `max_keys` was (this limiter holds no keys).
    pub fn build(mut self) -> Result<RateLimiter<Local, C>, Error> {
        let (clock, metrics, max_keys) = self.parts()?;
        if max_keys.is_some() {
            return invalid(
                "max_keys caps the keys of a keyed limiter (or a Redis limiter's fallback), \
                 and a RateLimiter in this process holds none: remove it, or build a \
                 KeyedRateLimiter",
            );
        }
        let states = limit_states(&self.config, clock.now_micros())?;
        let limits = Limits::new(states).expect("at least one limit");
        Ok(RateLimiter {
            engine: crate::local::Single::from_limits(limits, clock).with_metrics(metrics),
            upstream: self.upstream()?,
            slots: crate::outbound::LocalSlots::new(concurrency(&self.config)?),
        })
    }
}

/// # In this process, per key
impl<K: Key, C: Clock> Builder<PerKey<K>, Local, C> {
    /// Checks the options and creates the limiter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] as for one rate, but for `max_keys`,
    /// which caps this limiter's keys (0 is refused).
    pub fn build(mut self) -> Result<KeyedRateLimiter<K, Local, C>, Error> {
        let (clock, metrics, max_keys) = self.parts()?;
        let states = limit_states(&self.config, 0)?;
        let engine =
            crate::keyed::Keyed::from_limits(states, clock, max_keys, crate::keyed::Mode::Full);
        Ok(KeyedRateLimiter {
            engine: engine.with_metrics(metrics),
            upstream: self.upstream()?,
            slots: crate::outbound::LocalSlots::new(concurrency(&self.config)?),
        })
    }
}

impl<K, S: Store, C: fmt::Debug> fmt::Debug for Builder<K, S, C>
where
    S::Settings: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .field("name", &self.name)
            .field("max_keys", &self.max_keys)
            .field("store", &self.store)
            .finish()
    }
}
