//! The rate-limiting algorithm, as pure arithmetic over `now`.
//!
//! Nothing in this module reads a clock, sleeps, locks or does I/O: every
//! function takes the current time (`now_micros`, integer microseconds on a
//! monotonic timeline) and returns numbers.
//!
//! One algorithm, [`Limits`]: one limit or several that every request must
//! satisfy together, each a [`State`], with the log that makes give-backs
//! exact. The [`RateLimiter`](crate::RateLimiter) and each key of the
//! [`KeyedRateLimiter`](crate::KeyedRateLimiter) run it under a lock or, for
//! one bursty limit with nothing logged, folded into a single word updated by
//! one compare-and-swap (the lock-free fast path, `src/core/word.rs`). The
//! Redis limiter runs a line-by-line mirror of it in Lua (`lua/`) on the
//! server's clock. Differential tests keep them in agreement.
//!
//! How the algorithm works, and why, is told in [`design`](crate::design)
//! (public, for readers of the docs), in the names used here.

mod bursty;
mod cost;
mod learn;
mod limits;
mod snapshot;
mod state;
#[cfg(test)]
mod test_rng;
mod warming_up;
pub(crate) mod word;

pub use bursty::Bursty;
pub use cost::Cost;
pub(crate) use learn::Adopted;
pub use learn::{Learning, Lesson, Reported};
#[cfg(feature = "internals")]
pub use limits::LOG_CAPACITY;
#[cfg(feature = "redis")]
pub(crate) use limits::first_rate_scaled;
pub use limits::{Granted, Limits};
pub(crate) use limits::{Shape, reshape};
pub use snapshot::Snapshot;
pub use state::State;
pub use warming_up::WarmingUp;

use std::fmt;
use std::time::Duration;

/// A rate the algorithm cannot run at: zero, negative or NaN. The crate's
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidRate {
    permits_per_second: f64,
}

impl fmt::Display for InvalidRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "permits_per_second must be a positive number or +infinity (got {})",
            self.permits_per_second
        )
    }
}

impl std::error::Error for InvalidRate {}

/// Time saturates here, at 2^53 µs (see [Numbers](crate::design#numbers)): a
/// wait or a ticket that would lie further in the future reads as this.
pub const MAX_MICROS: u64 = 1 << 53;

/// Microseconds in one second.
const MICROS_PER_SECOND: f64 = 1_000_000.0;

/// The ticket keeps this many bits below the microsecond:
/// [`State::next_free_fraction`] counts units of 2^-20 µs.
pub const FRACTION_BITS: u32 = 20;

/// One microsecond in fraction units: 2^20.
const FRACTION_ONE: u64 = 1 << FRACTION_BITS;

/// Costs below this many microseconds (2^32) are charged to the fraction unit,
/// longer ones to the whole microsecond ([`State::charge`]; why: [the module
/// docs](crate::design#exact-at-every-rate)).
pub(crate) const FINE_CHARGE_LIMIT_MICROS: f64 = 4_294_967_296.0;

/// The stable interval for a rate, in microseconds:
/// `1e6 / permits_per_second`, `0.0` for an infinite rate, capped at
/// [`MAX_MICROS`].
///
/// # Errors
///
/// [`InvalidRate`] for a zero, negative or NaN rate.
pub(crate) fn stable_interval_micros(permits_per_second: f64) -> Result<f64, InvalidRate> {
    if permits_per_second.is_nan() || permits_per_second <= 0.0 {
        return Err(InvalidRate { permits_per_second });
    }
    Ok((MICROS_PER_SECOND / permits_per_second).min(MAX_MICROS as f64))
}

/// `fraction` of `rate` (a fallback's share, in `(0, 1]`, of a rate
/// configured or learned), never rounded to 0: the share of a positive rate
/// that does is the least double, the slowest rate, not none (nor a rate to
/// drop, which would leave the limit at a share of a looser one). An
/// invalid rate stays invalid.
pub(crate) fn share_of(rate: f64, fraction: f64) -> f64 {
    let share = rate * fraction;
    if share == 0.0 && rate > 0.0 {
        f64::from_bits(1)
    } else {
        share
    }
}

/// The slowest of `rates`: what a limiter with several limits sustains.
pub(crate) fn slowest(rates: impl IntoIterator<Item = f64>) -> f64 {
    rates.into_iter().fold(f64::INFINITY, f64::min)
}

/// A duration in whole microseconds, saturating at [`MAX_MICROS`].
///
/// ```
/// # #[cfg(feature = "internals")] {
/// use std::time::Duration;
/// use paceline::core::{micros, MAX_MICROS};
/// assert_eq!(micros(Duration::from_millis(3)), 3_000);
/// assert_eq!(micros(Duration::MAX), MAX_MICROS);
/// # }
/// ```
#[inline]
pub fn micros(duration: Duration) -> u64 {
    // Whole seconds and the µs of the rest, with no 128-bit division.
    duration
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(duration.subsec_micros()))
        .min(MAX_MICROS)
}

/// Microseconds as an integer, truncated and saturating at [`MAX_MICROS`]. No
/// caller passes NaN; should one appear it reads as "wait forever", never "no
/// wait": the limiter fails closed.
#[inline]
fn to_micros(micros: f64) -> u64 {
    if micros < MAX_MICROS as f64 {
        micros as u64
    } else {
        MAX_MICROS
    }
}

/// What stored permits cost, and how fast they come back: the one thing in
/// which the two kinds of limiter differ.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// Stored permits are free: an idle limiter allows a burst.
    Bursty(Bursty),
    /// Stored permits are expensive: an idle limiter starts slow.
    WarmingUp(WarmingUp),
}

impl Policy {
    /// The wait, in microseconds, for spending `permits` of `stored` permits.
    fn stored_permits_to_wait_micros(&self, stored: f64, permits: f64, stable: f64) -> f64 {
        match self {
            Policy::Bursty(_) => 0.0,
            Policy::WarmingUp(w) => w.stored_permits_to_wait_micros(stored, permits, stable),
        }
    }

    /// How long, in microseconds, an idle limiter takes to store one permit.
    fn cool_down_interval_micros(&self, stable: f64, max_permits: f64) -> f64 {
        match self {
            Policy::Bursty(_) => stable,
            Policy::WarmingUp(w) => w.cool_down_interval_micros(stable, max_permits),
        }
    }

    /// Recomputes the policy's derived values for a new stable interval and
    /// returns the new `max_permits`.
    fn set_stable_interval(&mut self, stable: f64, permits_per_second: f64) -> f64 {
        match self {
            Policy::Bursty(b) => b.max_permits(permits_per_second),
            Policy::WarmingUp(w) => w.set_stable_interval(stable),
        }
    }

    /// Stored permits for a limiter created now: none (bursty) or full,
    /// i.e. cold (warming-up).
    fn initial_stored_permits(&self, max_permits: f64) -> f64 {
        match self {
            Policy::Bursty(_) => 0.0,
            Policy::WarmingUp(_) => max_permits,
        }
    }

    /// Stored permits after leaving an infinite rate: full, i.e. ready to
    /// burst (bursty), or none, i.e. warm (warming-up).
    fn stored_permits_after_infinite_rate(&self, max_permits: f64) -> f64 {
        match self {
            Policy::Bursty(_) => max_permits,
            Policy::WarmingUp(_) => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stable_interval_of_a_rate() {
        assert_eq!(stable_interval_micros(5.0).unwrap(), 200_000.0);
        assert_eq!(stable_interval_micros(f64::INFINITY).unwrap(), 0.0);
        assert!(stable_interval_micros(0.0).is_err());
        assert!(stable_interval_micros(-1.0).is_err());
        assert!(stable_interval_micros(f64::NAN).is_err());
    }

    #[test]
    fn a_share_of_a_positive_rate_is_never_none() {
        assert_eq!(share_of(10.0, 0.5), 5.0);
        assert_eq!(share_of(f64::INFINITY, 5e-324), f64::INFINITY);
        // One a day at the least share: the slowest rate, not 0.
        assert_eq!(share_of(1.0 / 86_400.0, 1e-320), 5e-324);
        assert!(share_of(0.0, 0.5) == 0.0 && share_of(f64::NAN, 0.5).is_nan());
    }

    #[test]
    fn micros_truncates_and_saturates_like_the_128_bit_count() {
        let seconds = MAX_MICROS / 1_000_000;
        for duration in [
            Duration::ZERO,
            Duration::from_nanos(999),
            Duration::from_micros(1),
            Duration::from_micros(MAX_MICROS - 1),
            Duration::from_micros(MAX_MICROS),
            Duration::from_micros(MAX_MICROS + 1),
            Duration::new(seconds - 1, 999_999_999),
            Duration::new(seconds, 0),
            Duration::new(seconds, 999_999_999),
            Duration::new(u64::MAX / 1_000_000, 0),
            Duration::new(u64::MAX / 1_000_000 + 1, 0),
            Duration::MAX,
        ] {
            let expected = u64::try_from(duration.as_micros())
                .unwrap_or(u64::MAX)
                .min(MAX_MICROS);
            assert_eq!(micros(duration), expected, "{duration:?}");
        }
    }

    #[test]
    fn nan_wait_fails_closed() {
        assert_eq!(to_micros(f64::NAN), MAX_MICROS);
        assert_eq!(to_micros(f64::INFINITY), MAX_MICROS);
        assert_eq!(to_micros(12.9), 12);
    }

    #[test]
    fn rejects_bad_rates() {
        for rate in [0.0, -0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            assert!(stable_interval_micros(rate).is_err());
        }
    }
}
