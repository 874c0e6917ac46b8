//! Building a [`KeyedRateLimiter`].

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use super::KeyedRateLimiter;
use crate::Error;
use crate::builder::{PolicyConfig, limit_states, policy_setters};
use crate::clock::{Clock, SystemClock};

/// Builds a [`KeyedRateLimiter`]; see [`KeyedRateLimiter::builder`].
///
/// The policy setters are those of [`Builder`](crate::Builder): setting
/// [`warmup`](KeyedBuilder::warmup) chooses the warming-up policy, otherwise
/// every key is bursty.
///
/// ```
/// use std::time::Duration;
/// use paceline::KeyedRateLimiter;
///
/// // 100 requests a minute per tenant, at most 10 000 tenants held.
/// let limiter = KeyedRateLimiter::<u64>::builder()
///     .permits_per_second(100.0 / 60.0)
///     .max_burst(Duration::from_secs(60))
///     .max_keys(10_000)
///     .build()?;
/// assert!(limiter.try_reserve(&7, 1, Duration::ZERO)?.is_some());
///
/// // A cap of zero keys is an error, not a limiter that forgets at once.
/// assert!(KeyedRateLimiter::<u64>::builder().permits_per_second(1.0).max_keys(0).build().is_err());
/// # Ok::<(), paceline::Error>(())
/// ```
#[must_use = "a builder does nothing until .build() is called"]
pub struct KeyedBuilder<K, C = SystemClock> {
    config: PolicyConfig,
    max_keys: Option<usize>,
    clock: C,
    key: PhantomData<fn(K)>,
    name: Option<String>,
}

impl<K> KeyedBuilder<K, SystemClock> {
    pub(super) fn new() -> Self {
        KeyedBuilder {
            config: PolicyConfig::default(),
            max_keys: None,
            clock: SystemClock::new(),
            key: PhantomData,
            name: None,
        }
    }
}

impl<K, C: Clock> KeyedBuilder<K, C> {
    /// A builder whose limiter reads and sleeps on `clock`, without ever
    /// making a [`SystemClock`] (see
    /// [`Builder::with_clock`](crate::Builder::with_clock)).
    pub fn with_clock(clock: C) -> Self {
        KeyedBuilder {
            config: PolicyConfig::default(),
            max_keys: None,
            clock,
            key: PhantomData,
            name: None,
        }
    }

    policy_setters!();

    /// A hard cap on the keys held at once, for key spaces a client
    /// controls (addresses, tokens). Without it, memory follows the keys
    /// active within about one refill period (at least a second). At the cap, keys that read as full
    /// go first; then the least recently used ones, which lose their debt
    /// (counted in [`KeyedStats::dropped_unfinished`](super::KeyedStats)).
    /// Must be at least 1.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The clock to read and sleep on (default [`SystemClock`]); a
    /// [`FakeClock`](crate::clock::FakeClock) in tests.
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, C2> {
        KeyedBuilder {
            config: self.config,
            max_keys: self.max_keys,
            clock,
            key: PhantomData,
            name: self.name,
        }
    }

    /// The limiter's name in its metrics (feature `metrics`): never a
    /// key, so that clients cannot grow them. Default `default`.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a missing, zero, negative or NaN rate,
    /// contradictory policy options, or `max_keys(0)`.
    pub fn build(self) -> Result<KeyedRateLimiter<K, C>, Error>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        if self.max_keys == Some(0) {
            return Err(Error::InvalidArgument(
                "max_keys must be at least 1 (got 0): a limiter that holds no key cannot \
                 limit; leave max_keys unset for no cap"
                    .to_owned(),
            ));
        }
        let states = limit_states(&self.config, 0)?;
        let metrics = crate::metrics::Metrics::named(self.name.as_deref());
        Ok(
            KeyedRateLimiter::from_limits(states, self.clock, self.max_keys, super::Mode::Full)
                .with_metrics(metrics),
        )
    }
}

impl<K, C: fmt::Debug> fmt::Debug for KeyedBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.config)
            .field("max_keys", &self.max_keys)
            .field("clock", &self.clock)
            .finish()
    }
}
