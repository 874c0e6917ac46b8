//! [`State`]: one limiter's numbers, and the algorithm over them.

use super::{
    FINE_CHARGE_LIMIT_MICROS, FRACTION_BITS, FRACTION_ONE, InvalidRate, MAX_MICROS, Policy,
    stable_interval_micros, to_micros,
};

/// The limiter's whole state, and the algorithm over it ([how it
/// works](crate::design)).
///
/// ```
/// # #[cfg(feature = "internals")] {
/// use paceline::core::{Bursty, Policy, State};
///
/// // 5 permits per second, no stored permits yet, created at t = 0.
/// let mut state = State::new(Policy::Bursty(Bursty::default()), 5.0, 0).unwrap();
/// assert_eq!(state.reserve(1, 0), 0); // the first request is free...
/// assert_eq!(state.reserve(1, 0), 200_000); // ...the next one pays its debt
/// assert_eq!(state.try_reserve(1, 0, 100_000), None); // 400 ms > 100 ms timeout
/// assert_eq!(state.try_reserve(1, 300_000, 100_000), Some(100_000));
/// # }
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
    /// The ticket, in whole microseconds: [`State::next_free_micros`].
    pub(crate) next_free_micros: u64,
    /// The ticket below the microsecond: [`State::next_free_fraction`].
    pub(crate) next_free_fraction: u32,
    /// The rate as the user set it.
    pub(crate) permits_per_second: f64,
    /// What stored permits cost.
    pub(crate) policy: Policy,
}

impl State {
    /// A limiter at `permits_per_second`, created at `now_micros`: no stored
    /// permits (bursty) or full, i.e. cold (warming-up), and the first request
    /// at or after `now_micros` goes at once.
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

    /// A limiter at `permits_per_second` idle long enough to be full at
    /// `now_micros`: every permit it can store is stored (bursty: a whole
    /// burst; warming-up: cold) and nothing is owed. A key never seen starts
    /// so in a keyed limiter, as a missing key does in Redis.
    ///
    /// ```
    /// # #[cfg(feature = "internals")] {
    /// use paceline::core::{Bursty, Policy, State};
    ///
    /// let state = State::full(Policy::Bursty(Bursty::default()), 5.0, 7).unwrap();
    /// assert_eq!((state.stored_permits(), state.max_permits()), (5.0, 5.0));
    /// assert_eq!(state.next_free_micros(), 7);
    /// # }
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

    /// Permits saved up while idle, from `0.0` to
    /// [`max_permits`](State::max_permits), as of the last operation (a
    /// [`resync`](State::resync) brings them up to `now`).
    #[cfg(feature = "internals")]
    pub fn stored_permits(&self) -> f64 {
        self.stored_permits
    }

    /// The most permits that can be stored: the burst past the one request
    /// that goes at the ticket (bursty), or the permits of a cold limiter
    /// (warming-up).
    #[cfg(feature = "internals")]
    pub fn max_permits(&self) -> f64 {
        self.max_permits
    }

    /// Microseconds between two permits at the stable rate (`0.0` for an
    /// infinite rate; at most [`MAX_MICROS`]).
    #[cfg(feature = "internals")]
    pub fn stable_interval_micros(&self) -> f64 {
        self.stable_interval_micros
    }

    /// The ticket: the moment the next request may go, in whole microseconds
    /// (the rest is [`next_free_fraction`](State::next_free_fraction)). In the
    /// past while the limiter is idle, until the next operation resyncs it to
    /// `now`.
    pub fn next_free_micros(&self) -> u64 {
        self.next_free_micros
    }

    /// The ticket's part below the microsecond, in units of
    /// 2^-[`FRACTION_BITS`] µs (`0..2^20`): the ticket is
    /// `next_free_micros + next_free_fraction / 2^20` µs. It carries what
    /// whole-µs waits leave out ([exact at every
    /// rate](crate::design#exact-at-every-rate)).
    #[cfg(any(test, feature = "internals"))]
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

    /// Converts the idle time from the ticket to `now_micros` into stored
    /// permits and moves the ticket up to `now_micros`; does nothing while the
    /// ticket is still ahead.
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

    /// Pushes the ticket forward by `cost_micros` (`>= 0`): to the 2^-20 µs
    /// below 2^32 µs, to the whole microsecond (truncated) from there,
    /// saturating at [`MAX_MICROS`] (fraction dropped). NaN pushes it to
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
    /// used: the ticket before this request pushed it ([step by
    /// step](crate::design#one-reservation-step-by-step)).
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

    /// Reserves `permits` at `now_micros` and returns the wait in microseconds
    /// (zero if due).
    #[cfg(any(test, feature = "internals"))]
    pub fn reserve(&mut self, permits: u32, now_micros: u64) -> u64 {
        self.reserve_earliest_available(permits, now_micros)
            .saturating_sub(now_micros)
    }

    /// The earliest moment a request could go, without reserving anything.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn query_earliest_available(&self) -> u64 {
        self.next_free_micros
    }

    /// When the state reads as full if nothing more is reserved (µs): its
    /// ticket, then the idle time that stores the permits it lacks
    /// (saturating at [`MAX_MICROS`]).
    pub(crate) fn full_at(&self) -> u64 {
        let cool_down = self
            .policy
            .cool_down_interval_micros(self.stable_interval_micros, self.max_permits);
        let missing = (self.max_permits - self.stored_permits).max(0.0);
        let idle = to_micros((missing * cool_down).ceil());
        self.next_free_micros.saturating_add(idle).min(MAX_MICROS)
    }

    /// The refill period: microseconds of idle time that store every permit
    /// from none, after which an idle limiter with no debt is full (rounded
    /// up, saturating at [`MAX_MICROS`]).
    pub(crate) fn refill_micros(&self) -> u64 {
        let cool_down = self
            .policy
            .cool_down_interval_micros(self.stable_interval_micros, self.max_permits);
        to_micros((self.max_permits * cool_down).ceil())
    }

    /// Whether the state reads as full at `now_micros`, as [`State::full`]
    /// starts: the ticket, fraction included, has passed and idle time to
    /// `now_micros` fills every stored permit.
    pub(crate) fn reads_as_full(&self, now_micros: u64) -> bool {
        // A ticket at `now` with a fraction still lies ahead.
        if self.next_free_micros > now_micros
            || (self.next_free_micros == now_micros && self.next_free_fraction > 0)
        {
            return false;
        }
        let mut state = self.clone();
        state.resync(now_micros);
        state.stored_permits >= state.max_permits
    }

    /// Whether a request at `now_micros` would wait at most `timeout_micros`
    /// (only earlier debt counts, not this request's size).
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn can_acquire(&self, now_micros: u64, timeout_micros: u64) -> bool {
        self.query_earliest_available()
            .saturating_sub(timeout_micros)
            <= now_micros
    }

    /// Reserves `permits` and returns the wait if it fits in `timeout_micros`;
    /// otherwise `None`, changing nothing.
    #[cfg(any(test, feature = "internals"))]
    pub fn try_reserve(
        &mut self,
        permits: u32,
        now_micros: u64,
        timeout_micros: u64,
    ) -> Option<u64> {
        self.can_acquire(now_micros, timeout_micros)
            .then(|| self.reserve(permits, now_micros))
    }

    /// Carries a debt into the state at `now_micros`, as a limiter coming back
    /// from a fallback does: resynced at `now_micros`, a bursty limit drops
    /// its stored permits (a warming-up one keeps them: they slow it down,
    /// and dropping them would make a cold limit run warm), and the ticket
    /// (at least `now_micros`) moves forward by `debt_micros`, saturating at
    /// [`MAX_MICROS`] (fraction dropped).
    ///
    /// ```
    /// use paceline::core::{Bursty, Policy, State};
    ///
    /// let mut state = State::full(Policy::Bursty(Bursty::default()), 5.0, 0).unwrap();
    /// state.resume(300_000, 1_000_000);
    /// assert_eq!((state.stored_permits(), state.next_free_micros()), (0.0, 1_300_000));
    /// ```
    #[cfg(feature = "internals")]
    pub fn resume(&mut self, debt_micros: u64, now_micros: u64) {
        self.resync(now_micros);
        if let Policy::Bursty(_) = self.policy {
            self.stored_permits = 0.0;
        }
        let ticket = self.next_free_micros.saturating_add(debt_micros);
        if ticket >= MAX_MICROS {
            self.next_free_micros = MAX_MICROS;
            self.next_free_fraction = 0;
        } else {
            self.next_free_micros = ticket;
        }
    }

    /// Changes the rate at `now_micros`, as [rate
    /// changes](crate::design#rate-changes) tells: idle time so far at the old
    /// rate, the debt kept, stored permits rescaled. An invalid rate
    /// ([`InvalidRate`]) changes nothing.
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
    use crate::core::Bursty;

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
    fn smallest_positive_rate_is_finite() {
        let mut s = bursty(f64::from_bits(1)); // 5e-324
        assert_eq!(s.stable_interval_micros, MAX_MICROS as f64);
        assert_eq!(s.reserve(1, 0), 0);
        assert_eq!(s.reserve(1, 1_000), MAX_MICROS - 1_000);
    }
}
