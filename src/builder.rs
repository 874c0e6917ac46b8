//! Configuration of a limiter: rate and policy, validated in one place.

use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::core::{Bursty, Policy, State, WarmingUp};
use crate::{Error, RateLimiter};

/// The default cold factor of the warming-up policy: a cold limiter starts
/// three times slower than its stable rate.
pub const DEFAULT_COLD_FACTOR: f64 = 3.0;

/// The rate and policy options shared by every limiter's builder.
#[derive(Debug, Clone, Default)]
pub(crate) struct PolicyConfig {
    pub(crate) permits_per_second: Option<f64>,
    pub(crate) max_burst: Option<Duration>,
    pub(crate) warmup: Option<Duration>,
    pub(crate) cold_factor: Option<f64>,
}

impl PolicyConfig {
    /// Checks the options and returns the policy and rate they describe.
    pub(crate) fn policy(&self) -> Result<(Policy, f64), Error> {
        let rate = self.permits_per_second.ok_or_else(|| {
            Error::InvalidArgument(
                "no rate was given: call .permits_per_second(rate) on the builder".to_owned(),
            )
        })?;
        crate::core::stable_interval_micros(rate)?;
        let policy = match (self.warmup, self.max_burst) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "max_burst applies to the bursty policy only, but warmup was also set \
                     (which chooses the warming-up policy): set one of them"
                        .to_owned(),
                ));
            }
            (Some(warmup), None) => {
                let cold_factor = self.cold_factor.unwrap_or(DEFAULT_COLD_FACTOR);
                if !(cold_factor.is_finite() && cold_factor >= 1.0) {
                    return Err(Error::InvalidArgument(format!(
                        "cold_factor must be a finite number >= 1.0 (got {cold_factor})"
                    )));
                }
                Policy::WarmingUp(WarmingUp::new(warmup, cold_factor))
            }
            (None, max_burst) => {
                if let Some(cold_factor) = self.cold_factor {
                    return Err(Error::InvalidArgument(format!(
                        "cold_factor ({cold_factor}) applies to the warming-up policy only: \
                         also set warmup, or remove cold_factor"
                    )));
                }
                Policy::Bursty(max_burst.map(Bursty::new).unwrap_or_default())
            }
        };
        Ok((policy, rate))
    }
}

/// The rate and policy setters every builder has (a builder has a
/// `config: PolicyConfig` field).
macro_rules! policy_setters {
    () => {
        /// The stable rate, in permits per second: required. Must be positive;
        /// `f64::INFINITY` means no limit.
        ///
        /// Precision: waits are whole microseconds, but the schedule carries
        /// each cost to 2^-20 µs, so a busy limiter achieves this rate within
        /// 0.01% (single permits up to 10^7/s, chunks of 64 or more up to
        /// 10^9/s; see "Exact at every rate" in [`core`](crate::core)).
        pub fn permits_per_second(mut self, permits_per_second: f64) -> Self {
            self.config.permits_per_second = Some(permits_per_second);
            self
        }

        /// Bursty policy: how much idle time is saved up as permits usable at
        /// once. Default one second, i.e. a burst of `rate` permits.
        /// `Duration::ZERO` allows no burst at all.
        pub fn max_burst(mut self, max_burst: Duration) -> Self {
            self.config.max_burst = Some(max_burst);
            self
        }

        /// Chooses the warming-up policy: a limiter idle for this long starts
        /// slow and takes this long to reach its stable rate.
        pub fn warmup(mut self, warmup: Duration) -> Self {
            self.config.warmup = Some(warmup);
            self
        }

        /// Warming-up policy: how much slower than stable a cold limiter starts.
        /// Default 3.0; must be finite and `>= 1.0`.
        pub fn cold_factor(mut self, cold_factor: f64) -> Self {
            self.config.cold_factor = Some(cold_factor);
            self
        }
    };
}
pub(crate) use policy_setters;

/// Builds a [`RateLimiter`] with options; see [`RateLimiter::builder`].
///
/// Setting [`warmup`](Builder::warmup) chooses the warming-up policy;
/// otherwise the limiter is bursty.
///
/// ```
/// use std::time::Duration;
/// use throttler::RateLimiter;
/// use throttler::clock::FakeClock;
///
/// let clock = FakeClock::new();
/// let limiter = RateLimiter::builder()
///     .permits_per_second(2.0)
///     .warmup(Duration::from_secs(4))
///     .cold_factor(3.0)
///     .clock(clock.clone())
///     .build()?;
/// assert_eq!(limiter.rate(), 2.0);
///
/// // Contradictory options are an error, not a guess.
/// let err = RateLimiter::builder()
///     .permits_per_second(2.0)
///     .max_burst(Duration::from_secs(1))
///     .warmup(Duration::from_secs(4))
///     .build();
/// assert!(err.is_err());
/// # Ok::<(), throttler::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build() is called"]
pub struct Builder<C = SystemClock> {
    config: PolicyConfig,
    clock: C,
}

impl Builder<SystemClock> {
    pub(crate) fn new() -> Self {
        Builder {
            config: PolicyConfig::default(),
            clock: SystemClock::new(),
        }
    }
}

impl<C: Clock> Builder<C> {
    policy_setters!();

    /// The clock the limiter reads and sleeps on. Default: [`SystemClock`].
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<C2> {
        Builder {
            config: self.config,
            clock,
        }
    }

    /// Checks the options and creates the limiter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if no rate was given, the rate is zero,
    /// negative or NaN, the cold factor is below 1 or not finite, or options
    /// of both policies were set.
    pub fn build(self) -> Result<RateLimiter<C>, Error> {
        let (policy, rate) = self.config.policy()?;
        let now = self.clock.now_micros();
        let state = State::new(policy, rate, now)?;
        Ok(RateLimiter::from_parts(state, self.clock))
    }
}
