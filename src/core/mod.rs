//! The rate-limiting algorithm, as pure arithmetic over `now`.
//!
//! Nothing in this module reads a clock, sleeps, locks or does I/O. Every
//! function takes the current time as an argument (`now_micros`, integer
//! microseconds on some monotonic timeline) and returns numbers. The local
//! [`RateLimiter`](crate::RateLimiter) runs it behind a lock; the Redis
//! limiter runs a line-by-line mirror of it in Lua (`lua/`) on the
//! server's clock. A differential test keeps the two in agreement.
//!
//! # How the limiter is designed, and why
//!
//! A rate of `r` permits per second means permits are handed out one
//! *stable interval* (`1 / r` seconds) apart. The simplest way to enforce
//! that is to remember one instant, **`next_free_micros`**: the earliest time
//! the next request may proceed. A request arriving at `now` waits until
//! `next_free_micros`, and moves it forward by the cost of what it took.
//!
//! ## Pre-consumption: the next caller pays
//!
//! Which caller waits for a request of `n` permits? Here it is the *next*
//! one. A request is served as soon as the ticket is due, however many
//! permits it asks for, and its cost is added to `next_free_micros` for
//! whoever comes after. So an idle limiter grants `acquire(100)` at once, and
//! the following `acquire(1)` waits 100 intervals.
//!
//! Why: a request that would be served immediately should not wait just
//! because it is large. If the limiter is idle, making a big request wait
//! wastes the idle time that is already there; charging its cost forward lets
//! it start while keeping the long-run rate exact. The wait returned for a
//! request is therefore only the debt left by earlier callers, never its
//! own size. It also means a refused [`State::try_reserve`] only has to look
//! at the existing debt: no request is "too big" to be tried.
//!
//! ## Stored permits: remembering idle time
//!
//! If the limiter is idle for a while, should that idle time count? A strict
//! "one interval apart" limiter forgets it: after ten idle seconds, the next
//! ten requests still go out one interval apart. That under-uses a resource
//! that was idle. The opposite, remembering all idle time, allows an
//! unbounded burst after a long pause.
//!
//! The compromise is **`stored_permits`**: idle time is converted to permits
//! (one per *cool-down interval*) and saved, up to **`max_permits`**. When a
//! request comes, stored permits are spent first, then the rest is charged as
//! *fresh* permits at the stable interval. Converting idle time into stored
//! permits is called [`resync`](State::resync): it runs at the start of every
//! operation and moves `next_free_micros` up to `now` when it lies in the past.
//!
//! What does a stored permit *cost*? That is the one question the two policies
//! answer differently ([`Policy`]):
//!
//! * [`Bursty`]: stored permits are free. An idle limiter then allows a burst
//!   of `max_permits` (by default one second's worth) before falling back to
//!   the stable rate. Right for a resource that was simply under-used: an API
//!   quota, a batch job that paused.
//! * [`WarmingUp`]: stored permits are *expensive*. A long-idle resource may be
//!   cold (empty caches, closed connections, a JIT that has not compiled yet),
//!   so after a pause the limiter starts slow, at `cold_factor` times the
//!   stable interval, and speeds up linearly to the stable rate as stored
//!   permits are used up. See [`WarmingUp`] for the curve.
//!
//! ## One reservation, step by step
//!
//! [`State::reserve_earliest_available`] for `permits` at `now`:
//!
//! 1. `resync(now)`: if `now > next_free_micros`, add
//!    `(now - next_free_micros) / cool_down_interval` stored permits (capped at
//!    `max_permits`) and set `next_free_micros = now`.
//! 2. Remember `moment = next_free_micros`: this request may go then.
//! 3. Spend `min(permits, stored_permits)` stored permits, at the policy's
//!    price; the rest are fresh, at `stable_interval_micros` each.
//! 4. Push the ticket forward by that total ([`State::charge`]: to 2^-20 µs,
//!    saturating).
//! 5. Return `moment`. The caller waits `moment - now`, or nothing if that is
//!    in the past.
//!
//! [`State::can_acquire`] asks, without changing anything, whether
//! `next_free_micros - timeout <= now`: whether the existing debt fits in the
//! caller's timeout. A try that does not fit reserves nothing.
//!
//! ## Giving a reservation back
//!
//! A caller may give up before its moment comes (`timeout(d, acquire(n))`,
//! a dropped future). Its reservation ([`Reserved`]) is then given back
//! ([`State::give_back`]): restored exactly, stored permits included, when it
//! is still the latest; otherwise the ticket moves back by what it charged
//! (never past `now`), so that later callers are scheduled as if it had
//! never been made while callers already waiting keep their slots. That
//! holds exactly while the limiter stays in debt. Once several
//! reservations are given back, moving the ticket back by each one's whole
//! charge can hand later callers idle time that a limiter without those
//! reservations would have dropped at its burst; a [`Ledger`] kept beside
//! the state remembers what was requested after each waiting reservation,
//! so that a give-back never moves the ticket below it (see
//! `src/core/ledger.rs` for how, and `src/core/give_back.rs` for the
//! rules). A reservation that spent stored permits (a cold warming-up
//! limiter) is given back only when it is the latest.
//!
//! ## Rate changes
//!
//! [`State::set_rate`] resyncs at the old rate first, so time already passed
//! is credited at the rate that was in force. The debt already in
//! `next_free_micros` is kept as is: the next caller repays the previous
//! request at the old rate, and only later requests are charged at the new
//! one. Stored permits are rescaled to the same fraction of the new
//! `max_permits`.
//!
//! ## Numbers
//!
//! Time is integer microseconds, saturating at [`MAX_MICROS`] (2^53 µs, about
//! 285 years), the largest integer a double holds exactly, so that the Lua
//! mirror computes bit-for-bit the same values. Permit counts and intervals
//! are `f64`. The stable interval is capped at `MAX_MICROS` (slower rates all
//! mean "about never"), and every quantity is kept finite, so no input
//! produces NaN or an overflow: bad rates are rejected by
//! [`stable_interval_micros`], anything else saturates.
//!
//! ## Exact at every rate
//!
//! A wait handed to a caller is whole microseconds: the integer part of the
//! ticket, what a clock can sleep. The ticket itself is finer:
//! `next_free_micros` plus [`next_free_fraction`](State::next_free_fraction),
//! its part below the microsecond in units of 2^-20 µs (about a picosecond).
//! Each reservation's cost, computed in floating point, is rounded to that
//! unit and added to the ticket with its fraction ([`State::charge`]), and a
//! resync counts idle time from the fractional ticket. So what one wait
//! leaves out is carried to the next, and the schedule never drifts: a
//! saturated limiter's achieved rate is its configured rate to the rounding
//! of each cost to 2^-20 µs. That is within 0.01% for one permit at a time
//! up to 10^7 permits/s and for chunks of 64 or more up to 10^9 permits/s
//! (`tests/local/exactness.rs` runs 100 000 reservations at each rate, with both
//! policies and across a rate change). Truncating each cost to whole
//! microseconds instead, as the classic formulation does, runs 11% fast at
//! 300 000 permits/s and does not limit at all above 10^6 permits/s.
//!
//! Costs of 2^32 µs (about 71 minutes) or more are charged in whole
//! microseconds, truncated, which keeps every intermediate value of the
//! charge below 2^53 and so exact in the Lua mirror's doubles; at such
//! costs a microsecond is a rounding of under 10^-9.
//!
//! Two choices differ from the classic formulation of this algorithm: a
//! zero warm-up period limits like a bursty limiter with no burst (instead of
//! producing NaN and not limiting at all), and extreme rates saturate instead
//! of overflowing.

mod bursty;
mod give_back;
mod ledger;
mod limits;
mod snapshot;
mod warming_up;
pub(crate) mod word;

pub use bursty::Bursty;
// The give-back's bookkeeping is public for the differential tests only.
#[doc(hidden)]
pub use give_back::{GiveBack, Reserved};
#[doc(hidden)]
pub use ledger::Ledger;
pub use limits::{Granted, LOG_CAPACITY, Limits};
pub use snapshot::Snapshot;
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

/// Time saturates here: 2^53 microseconds (about 285 years), the largest
/// integer a double represents exactly.
///
/// A wait or a ticket that would lie further in the future reads as this.
pub const MAX_MICROS: u64 = 1 << 53;

/// Microseconds in one second.
const MICROS_PER_SECOND: f64 = 1_000_000.0;

/// The ticket keeps this many bits below the microsecond: its fraction
/// ([`State::next_free_fraction`]) counts units of 2^-20 µs (about a
/// picosecond).
pub const FRACTION_BITS: u32 = 20;

/// One microsecond in fraction units: 2^20.
const FRACTION_ONE: u64 = 1 << FRACTION_BITS;

/// Costs below this many microseconds (2^32, about 71 minutes) are charged
/// to the fraction unit; longer ones to the whole microsecond (see
/// [`State::charge`]). It keeps every intermediate value below 2^53, so the
/// Lua mirror computes them exactly.
pub(crate) const FINE_CHARGE_LIMIT_MICROS: f64 = 4_294_967_296.0;

/// The stable interval for a rate, in microseconds: `1e6 / permits_per_second`.
///
/// Returns `0.0` for an infinite rate and caps very slow rates at
/// [`MAX_MICROS`]. Rejects zero, negative and NaN rates.
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

/// Converts a non-negative, non-NaN number of microseconds to an integer,
/// truncating and saturating at [`MAX_MICROS`].
///
/// No caller passes NaN; should one ever appear it reads as "wait forever",
/// never as "no wait": the limiter fails closed.
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

/// The limiter's whole state, and the algorithm over it.
///
/// See the [module documentation](self) for how it works.
///
/// ```
/// use paceline::core::{Bursty, Policy, State};
///
/// // 5 permits per second, no stored permits yet, created at t = 0.
/// let mut state = State::new(Policy::Bursty(Bursty::default()), 5.0, 0).unwrap();
/// assert_eq!(state.reserve(1, 0), 0); // the first request is free...
/// assert_eq!(state.reserve(1, 0), 200_000); // ...the next one pays its debt
/// assert_eq!(state.try_reserve(1, 0, 100_000), None); // 400 ms > 100 ms timeout
/// assert_eq!(state.try_reserve(1, 300_000, 100_000), Some(100_000));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// Permits saved up while idle, in `0.0..=max_permits`.
    pub(crate) stored_permits: f64,
    /// The most permits that can be stored.
    pub(crate) max_permits: f64,
    /// Microseconds between two permits at the stable rate; `0.0` for an
    /// infinite rate.
    pub(crate) stable_interval_micros: f64,
    /// The moment the next request may go, in whole microseconds. In the
    /// past when the limiter is idle (until the next
    /// [`resync`](State::resync) moves it to `now`).
    pub(crate) next_free_micros: u64,
    /// The ticket's part below the microsecond, in units of 2^-20 µs
    /// (`0..2^20`): the ticket is `next_free_micros + next_free_fraction /
    /// 2^20` µs. Waits are whole microseconds; this carries what they leave
    /// out, so that the schedule never drifts (see "Numbers" above).
    pub(crate) next_free_fraction: u32,
    /// The rate as the user set it.
    pub(crate) permits_per_second: f64,
    /// What stored permits cost.
    pub(crate) policy: Policy,
}

impl State {
    /// A limiter at `permits_per_second`, created at `now_micros`.
    ///
    /// It starts with no stored permits (bursty) or full, i.e. cold
    /// (warming-up), and the first request at or after `now_micros` goes at
    /// once.
    pub fn new(
        mut policy: Policy,
        permits_per_second: f64,
        now_micros: u64,
    ) -> Result<Self, InvalidRate> {
        let stable = stable_interval_micros(permits_per_second)?;
        let max_permits = policy.set_stable_interval(stable, permits_per_second);
        Ok(State {
            stored_permits: policy.initial_stored_permits(max_permits),
            max_permits,
            stable_interval_micros: stable,
            next_free_micros: now_micros.min(MAX_MICROS),
            next_free_fraction: 0,
            permits_per_second,
            policy,
        })
    }

    /// A limiter at `permits_per_second` that has been idle long enough to
    /// be full at `now_micros`: every permit it can store is stored (bursty:
    /// a whole burst; warming-up: cold) and nothing is owed. A key never seen
    /// starts so in a keyed limiter, as a missing key does in Redis.
    ///
    /// ```
    /// use paceline::core::{Bursty, Policy, State};
    ///
    /// let state = State::full(Policy::Bursty(Bursty::default()), 5.0, 7).unwrap();
    /// assert_eq!((state.stored_permits(), state.max_permits()), (5.0, 5.0));
    /// assert_eq!(state.next_free_micros(), 7);
    /// ```
    pub fn full(
        policy: Policy,
        permits_per_second: f64,
        now_micros: u64,
    ) -> Result<Self, InvalidRate> {
        let mut state = State::new(policy, permits_per_second, now_micros)?;
        state.stored_permits = state.max_permits;
        Ok(state)
    }

    /// Permits saved up while idle, as of the last operation (a
    /// [`resync`](State::resync) brings them up to `now`): from `0.0` to
    /// [`max_permits`](State::max_permits).
    pub fn stored_permits(&self) -> f64 {
        self.stored_permits
    }

    /// The most permits that can be stored: the burst past the one request
    /// that goes at the ticket (bursty), or the permits of a cold limiter
    /// (warming-up).
    pub fn max_permits(&self) -> f64 {
        self.max_permits
    }

    /// Microseconds between two permits at the stable rate (`0.0` for an
    /// infinite rate; at most [`MAX_MICROS`]).
    pub fn stable_interval_micros(&self) -> f64 {
        self.stable_interval_micros
    }

    /// The ticket: the moment the next request may go, in whole
    /// microseconds (the part below the microsecond is
    /// [`next_free_fraction`](State::next_free_fraction)). In the past while
    /// the limiter is idle, until the next operation resyncs it to `now`.
    pub fn next_free_micros(&self) -> u64 {
        self.next_free_micros
    }

    /// The ticket's part below the microsecond, in units of
    /// 2^-[`FRACTION_BITS`] µs (`0..2^20`): the ticket is
    /// `next_free_micros + next_free_fraction / 2^20` µs. Waits are whole
    /// microseconds; this carries what they leave out (see "Exact at every
    /// rate" in the [module documentation](self)).
    pub fn next_free_fraction(&self) -> u32 {
        self.next_free_fraction
    }

    /// The rate as last set, in permits per second.
    pub fn permits_per_second(&self) -> f64 {
        self.permits_per_second
    }

    /// What stored permits cost.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Converts the idle time between `next_free_micros` and `now_micros`
    /// into stored permits, and moves `next_free_micros` up to `now_micros`.
    /// Does nothing while `next_free_micros` is still in the future.
    pub fn resync(&mut self, now_micros: u64) {
        if now_micros > self.next_free_micros {
            let cool_down = self
                .policy
                .cool_down_interval_micros(self.stable_interval_micros, self.max_permits);
            // The ticket is `next_free_micros` plus its fraction (under one
            // µs), so `idle > 0`: an infinite quotient (cool_down == 0) is
            // fine and never NaN.
            let idle = (now_micros - self.next_free_micros) as f64
                - f64::from(self.next_free_fraction) / FRACTION_ONE as f64;
            let new_permits = idle / cool_down;
            self.stored_permits = (self.stored_permits + new_permits).min(self.max_permits);
            self.next_free_micros = now_micros.min(MAX_MICROS);
            self.next_free_fraction = 0;
        }
    }

    /// Pushes the ticket forward by `cost_micros` (a wait computed in
    /// floating point, `>= 0`), to the 2^-20 µs below 2^32 µs (about 71
    /// minutes) and to the whole microsecond (truncated) from there,
    /// saturating at
    /// [`MAX_MICROS`] (where the fraction is dropped). NaN pushes it to
    /// [`MAX_MICROS`]: the limiter fails closed.
    pub fn charge(&mut self, cost_micros: f64) {
        let (whole, fraction) = if cost_micros < FINE_CHARGE_LIMIT_MICROS {
            // Rounded to the nearest unit; below 2^52 + 1, exact in a double.
            let units = (cost_micros * FRACTION_ONE as f64 + 0.5) as u64
                + u64::from(self.next_free_fraction);
            (units >> FRACTION_BITS, (units & (FRACTION_ONE - 1)) as u32)
        } else {
            (to_micros(cost_micros), self.next_free_fraction)
        };
        let ticket = self.next_free_micros.saturating_add(whole);
        if ticket < MAX_MICROS {
            self.next_free_micros = ticket;
            self.next_free_fraction = fraction;
        } else {
            self.next_free_micros = MAX_MICROS;
            self.next_free_fraction = 0;
        }
    }

    /// Reserves `permits` at `now_micros` and returns the moment they may be
    /// used: the ticket as it was before this request pushed it forward.
    ///
    /// This is the whole algorithm: resync, spend stored permits first, charge
    /// the rest as fresh permits, push the ticket forward by both.
    pub fn reserve_earliest_available(&mut self, permits: u32, now_micros: u64) -> u64 {
        self.resync(now_micros);
        let moment = self.next_free_micros;
        let requested = f64::from(permits);
        let stored_to_spend = requested.min(self.stored_permits);
        let fresh = requested - stored_to_spend;
        let wait = self.policy.stored_permits_to_wait_micros(
            self.stored_permits,
            stored_to_spend,
            self.stable_interval_micros,
        ) + fresh * self.stable_interval_micros;
        self.charge(wait);
        self.stored_permits -= stored_to_spend;
        moment
    }

    /// Reserves `permits` at `now_micros` and returns how long the caller must
    /// wait, in microseconds (zero if the ticket is already due).
    pub fn reserve(&mut self, permits: u32, now_micros: u64) -> u64 {
        self.reserve_earliest_available(permits, now_micros)
            .saturating_sub(now_micros)
    }

    /// The earliest moment a request could go, without reserving anything.
    pub fn query_earliest_available(&self) -> u64 {
        self.next_free_micros
    }

    /// How long, in microseconds, idle time takes to refill every stored
    /// permit from none (rounded up, saturating at [`MAX_MICROS`]): the
    /// refill period after which an idle limiter with no debt is full.
    pub fn refill_micros(&self) -> u64 {
        let cool_down = self
            .policy
            .cool_down_interval_micros(self.stable_interval_micros, self.max_permits);
        let refill = (self.max_permits * cool_down).ceil();
        if refill < MAX_MICROS as f64 {
            refill as u64
        } else {
            MAX_MICROS
        }
    }

    /// Whether a request at `now_micros` would wait at most `timeout_micros`.
    /// Looks only at the debt of earlier requests, not at the size of this one.
    pub fn can_acquire(&self, now_micros: u64, timeout_micros: u64) -> bool {
        self.query_earliest_available()
            .saturating_sub(timeout_micros)
            <= now_micros
    }

    /// Reserves `permits` if the wait fits in `timeout_micros` and returns it;
    /// otherwise returns `None` and changes nothing.
    pub fn try_reserve(
        &mut self,
        permits: u32,
        now_micros: u64,
        timeout_micros: u64,
    ) -> Option<u64> {
        if self.can_acquire(now_micros, timeout_micros) {
            Some(self.reserve(permits, now_micros))
        } else {
            None
        }
    }

    /// Carries a debt into the state at `now_micros`, as a limiter coming
    /// back from a fallback does: the stored permits are dropped and the
    /// ticket (at least `now_micros`) moves forward by `debt_micros`,
    /// saturating at [`MAX_MICROS`] (where its fraction is dropped).
    ///
    /// ```
    /// use paceline::core::{Bursty, Policy, State};
    ///
    /// let mut state = State::full(Policy::Bursty(Bursty::default()), 5.0, 0).unwrap();
    /// state.resume(300_000, 1_000_000);
    /// assert_eq!((state.stored_permits(), state.next_free_micros()), (0.0, 1_300_000));
    /// ```
    pub fn resume(&mut self, debt_micros: u64, now_micros: u64) {
        if now_micros > self.next_free_micros {
            self.next_free_micros = now_micros.min(MAX_MICROS);
            self.next_free_fraction = 0;
        }
        self.stored_permits = 0.0;
        let ticket = self.next_free_micros.saturating_add(debt_micros);
        if ticket >= MAX_MICROS {
            self.next_free_micros = MAX_MICROS;
            self.next_free_fraction = 0;
        } else {
            self.next_free_micros = ticket;
        }
    }

    /// Changes the rate at `now_micros`.
    ///
    /// Idle time until now is credited at the old rate, the existing debt is
    /// kept, and stored permits keep their fraction of `max_permits`.
    pub fn set_rate(
        &mut self,
        permits_per_second: f64,
        now_micros: u64,
    ) -> Result<(), InvalidRate> {
        let stable = stable_interval_micros(permits_per_second)?;
        self.resync(now_micros);
        let was_infinite = self.stable_interval_micros == 0.0;
        let old_max = self.max_permits;
        let max_permits = self.policy.set_stable_interval(stable, permits_per_second);
        self.stored_permits = if was_infinite {
            self.policy.stored_permits_after_infinite_rate(max_permits)
        } else if old_max == 0.0 {
            self.policy.initial_stored_permits(max_permits)
        } else {
            // stored / old_max is in 0..=1, so this never overflows.
            self.stored_permits / old_max * max_permits
        };
        self.max_permits = max_permits;
        self.stable_interval_micros = stable;
        self.permits_per_second = permits_per_second;
        Ok(())
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

    fn bursty(rate: f64) -> State {
        State::new(Policy::Bursty(Bursty::default()), rate, 0).unwrap()
    }

    #[test]
    fn idle_time_is_stored_up_to_the_cap() {
        let mut s = bursty(5.0);
        s.resync(600_000);
        assert_eq!(s.stored_permits, 3.0);
        assert_eq!(s.next_free_micros, 600_000);
        s.resync(10_000_000);
        assert_eq!(s.stored_permits, 5.0);
    }

    #[test]
    fn resync_in_the_past_changes_nothing() {
        let mut s = bursty(5.0);
        s.reserve(10, 0);
        let before = s.clone();
        s.resync(1_000_000);
        assert_eq!(s, before);
    }

    #[test]
    fn ticket_saturates_instead_of_overflowing() {
        let mut s = bursty(1e-300);
        assert_eq!(s.stable_interval_micros, MAX_MICROS as f64);
        assert_eq!(s.reserve(u32::MAX, 0), 0);
        assert_eq!(s.next_free_micros, MAX_MICROS);
        assert_eq!(s.reserve(u32::MAX, 0), MAX_MICROS);
        assert_eq!(s.next_free_micros, MAX_MICROS);
    }

    #[test]
    fn can_acquire_with_huge_timeout() {
        let mut s = bursty(1e-300);
        s.reserve(1, 0);
        assert!(s.can_acquire(0, u64::MAX));
        assert!(!s.can_acquire(0, 0));
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

    #[test]
    fn smallest_positive_rate_is_finite() {
        let mut s = bursty(f64::from_bits(1)); // 5e-324
        assert_eq!(s.stable_interval_micros, MAX_MICROS as f64);
        assert_eq!(s.reserve(1, 0), 0);
        assert_eq!(s.reserve(1, 1_000), MAX_MICROS - 1_000);
    }
}
