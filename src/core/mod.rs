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
//! # How the limiter is designed, and why
//!
//! A rate of `r` permits per second hands permits out one *stable interval*
//! (`1 / r` seconds) apart. The limiter remembers one instant, the ticket
//! **`next_free_micros`**: the earliest time the next request may proceed. A
//! request arriving at `now` waits until the ticket, and moves it forward by
//! the cost of what it took.
//!
//! ## Pre-consumption: the next caller pays
//!
//! A request is served as soon as the ticket is due, however many permits it
//! asks for, and its cost is added to the ticket for whoever comes next. So an
//! idle limiter grants `acquire(100)` at once, and the following `acquire(1)`
//! waits 100 intervals.
//!
//! Why: making a large request wait on an idle limiter wastes idle time that
//! is already there; charging its cost forward lets it start and keeps the
//! long-run rate exact. A request's wait is therefore only the debt left by
//! earlier callers, never its own size, and a refused [`State::try_reserve`]
//! only has to look at that debt: no request is "too big" to be tried.
//!
//! ## Stored permits: remembering idle time
//!
//! A strict "one interval apart" limiter forgets idle time: after ten idle
//! seconds, the next ten requests still go one interval apart, under-using a
//! resource that was idle. Remembering all of it allows an unbounded burst
//! after a long pause. The compromise is **`stored_permits`**: idle time
//! becomes permits (one per *cool-down interval*), saved up to
//! **`max_permits`**. A request spends stored permits first and is charged the
//! rest as *fresh* permits at the stable interval. [`resync`](State::resync)
//! converts idle time at the start of every operation (step 1 below).
//!
//! What a stored permit *costs* is the one question the two policies
//! ([`Policy`]) answer differently:
//!
//! * [`Bursty`]: nothing. An idle limiter lets `max_permits + 1` requests go
//!   at once (`max_permits` is one second's worth by default), then falls back
//!   to the stable rate. Right for a resource that was simply under-used: an
//!   API quota, a batch job that paused.
//! * [`WarmingUp`]: more than a fresh permit. A long-idle resource may be cold
//!   (empty caches, closed connections, a JIT that has not compiled yet), so
//!   after a pause the limiter starts at `cold_factor` times the stable
//!   interval and speeds up linearly to the stable rate as stored permits are
//!   used up. [`WarmingUp`] draws the curve.
//!
//! ## One reservation, step by step
//!
//! [`State::reserve_earliest_available`] for `permits` at `now`:
//!
//! 1. `resync(now)`: if `now > next_free_micros`, add
//!    `(now - next_free_micros) / cool_down_interval` stored permits (capped
//!    at `max_permits`); set `next_free_micros = now`.
//! 2. Remember `moment = next_free_micros`: this request may go then.
//! 3. Spend `min(permits, stored_permits)` stored permits at the policy's
//!    price; the rest are fresh, at `stable_interval_micros` each.
//! 4. Push the ticket forward by that total ([`State::charge`]).
//! 5. Return `moment`. The caller waits `moment - now`, or nothing if that is
//!    in the past.
//!
//! [`State::can_acquire`] asks, changing nothing, whether
//! `next_free_micros - timeout <= now`: whether the existing debt fits in the
//! caller's timeout. A try that does not fit reserves nothing.
//!
//! ## Giving a reservation back
//!
//! A caller may give up before its moment comes (`timeout(d, acquire(n))`, a
//! dropped future). Later callers should then be scheduled as if its
//! reservation had never been made, while callers already waiting keep their
//! slots.
//!
//! The state alone cannot do that in general. Moving the ticket back by what
//! the reservation charged is exact while the limiter stays in debt (every
//! request since found the ticket ahead and nothing stored, and would have
//! been charged the same from a ticket that much earlier), but not once
//! several are given back: a reservation `B` that keeps its slot after an
//! earlier `A` was given back holds a later slot than a limiter that never
//! made `A` would have given it, so a request `S` made while `B` waits finds
//! the limiter in debt where that limiter sat idle past its burst and dropped
//! the excess. Giving `B` back then moves `S`'s charge into that dropped time,
//! and the callers after `S` go early, by seconds and more (two reservations
//! of an hour each, given back in turn, let later callers in up to an hour
//! early). Nor can a reservation that spent stored permits (a cold warming-up
//! limiter) be undone in the numbers: their price depended on how many were
//! left.
//!
//! So while a reservation that may be given back waits, the limits keep a
//! *log*: their states before the oldest such reservation, and every request
//! since (its permits and its `now`). Giving one back takes it out and replays
//! the rest from the saved states, which then hold exactly what they would had
//! it never been made, stored permits and warm-up included, for either policy
//! and however many are given back in whatever order. A reservation leaves the
//! log once its moment has passed (it was used) or it is kept; a log with
//! nothing left that may be given back is empty, and costs nothing. When more
//! than [`LOG_CAPACITY`] requests follow the oldest that may be given back,
//! that one leaves the log and gives nothing back; a rate change empties the
//! log. Both err towards limiting. [`Limits`] has the details.
//!
//! ## Rate changes
//!
//! [`State::set_rate`] resyncs at the old rate first, so time already passed
//! is credited at the rate that was in force. The debt already in the ticket
//! is kept as is: the next caller repays the previous request at the old rate,
//! and only later requests are charged at the new one. Stored permits are
//! rescaled to the same fraction of the new `max_permits`.
//!
//! ## Numbers
//!
//! Time is integer microseconds, saturating at [`MAX_MICROS`] (2^53 µs, about
//! 285 years), the largest integer a double holds exactly, so that the Lua
//! mirror computes bit-for-bit the same values. Permit counts and intervals
//! are `f64`. The stable interval is capped at `MAX_MICROS` (slower rates all
//! mean "about never") and every quantity is kept finite, so no input produces
//! NaN or an overflow: [`stable_interval_micros`] rejects bad rates, anything
//! else saturates.
//!
//! ## Exact at every rate
//!
//! A wait is whole microseconds, what a clock can sleep: the integer part of
//! the ticket. The ticket itself is finer: `next_free_micros` plus
//! [`next_free_fraction`](State::next_free_fraction), in units of 2^-20 µs
//! (about a picosecond). [`State::charge`] rounds each reservation's
//! floating-point cost to that unit and adds it with the fraction, and a
//! resync counts idle time from the fractional ticket. So what one wait leaves
//! out is carried to the next, and the schedule never drifts: a saturated
//! limiter's achieved rate is its configured rate to the rounding of each cost
//! to 2^-20 µs, within 0.01% for one permit at a time up to 10^7 permits/s and
//! for chunks of 64 or more up to 10^9 permits/s (`tests/local/exactness.rs`
//! runs 100 000 reservations at each rate, with both policies and across a
//! rate change). Truncating each cost to whole microseconds instead, as the
//! classic formulation does, runs 11% fast at 300 000 permits/s and does not
//! limit at all above 10^6 permits/s.
//!
//! Costs of 2^32 µs (about 71 minutes) or more are charged in whole
//! microseconds, truncated: that keeps every intermediate value of the charge
//! below 2^53, so exact in the Lua mirror's doubles, and at such costs a
//! microsecond is a rounding of under 10^-9.
//!
//! Two choices differ from the classic formulation: a zero warm-up period
//! limits like a bursty limiter with no burst (instead of producing NaN and
//! not limiting at all), and extreme rates saturate instead of overflowing.

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
pub(crate) use limits::scaled_rates;
pub use limits::{Granted, Limits};
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

/// Time saturates here, at 2^53 µs (see [Numbers](crate::core#numbers)): a
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
/// docs](crate::core#exact-at-every-rate)).
pub(crate) const FINE_CHARGE_LIMIT_MICROS: f64 = 4_294_967_296.0;

/// The stable interval for a rate, in microseconds:
/// `1e6 / permits_per_second`, `0.0` for an infinite rate, capped at
/// [`MAX_MICROS`].
///
/// # Errors
///
/// [`InvalidRate`] for a zero, negative or NaN rate.
///
/// ```
/// use paceline::core::stable_interval_micros;
/// assert_eq!(stable_interval_micros(5.0).unwrap(), 200_000.0);
/// assert_eq!(stable_interval_micros(f64::INFINITY).unwrap(), 0.0);
/// assert!(stable_interval_micros(0.0).is_err());
/// ```
pub fn stable_interval_micros(permits_per_second: f64) -> Result<f64, InvalidRate> {
    if permits_per_second.is_nan() || permits_per_second <= 0.0 {
        return Err(InvalidRate { permits_per_second });
    }
    Ok((MICROS_PER_SECOND / permits_per_second).min(MAX_MICROS as f64))
}

/// A duration in whole microseconds, saturating at [`MAX_MICROS`].
///
/// ```
/// use std::time::Duration;
/// use paceline::core::{micros, MAX_MICROS};
/// assert_eq!(micros(Duration::from_millis(3)), 3_000);
/// assert_eq!(micros(Duration::MAX), MAX_MICROS);
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
