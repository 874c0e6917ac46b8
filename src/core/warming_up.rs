//! The warming-up policy: stored permits are expensive.

use std::time::Duration;

use super::micros;

/// Stored permits cost *more* than fresh ones, so a limiter that has been idle
/// (cold) starts slow and speeds up to its stable rate as it is used. Up to
/// `threshold_permits` stored, a stored permit costs the stable interval;
/// above, its price rises linearly to the cold interval
/// (`cold_factor × stable`) at `max_permits`:
///
/// ```text
///          ^ price of the next permit (µs)
///          |
///   cold   +                  /
/// interval |                 /.
///          |                / .
///          |               /  .   <-- the area of the trapezoid from
///          |              /   .       threshold to max is the warm-up
///          |             /    .       period: draining all stored permits
///          |            /     .       above the threshold takes `warmup`
///          |           /      .
///          |          /       .
///          |         /        .
///   stable +--------/  WARM-  .
/// interval |       .   UP     .
///          |       .  PERIOD  .
///          |  <- area = warmup / 2 ->
///          |       .          .
///          0-------+----------+-------> stored permits
///              threshold     max
/// ```
///
/// Spending `k` stored permits costs the area under that line over the `k`
/// rightmost stored permits; fresh permits cost the stable interval. Two
/// choices fix the shape:
///
/// * the ramp's area is `warmup`: a full limiter reaches the stable rate after
///   exactly `warmup` of continuous use, so
///   `max - threshold = 2 × warmup / (stable + cold)`;
/// * the flat area left of the threshold is `warmup / 2`, so
///   `threshold = 0.5 × warmup / stable` (the classic choice: at a cold factor
///   of 3 the flat part holds as many permits as the ramp). Spending every
///   stored permit of a cold limiter so takes `1.5 × warmup`.
///
/// Cooling down, from none to `max` stored permits, takes `warmup` whatever
/// the shape: an idle limiter stores one permit per `warmup / max`. (The
/// threshold moves the ramp along, not its shape: the waits of a cold start
/// do not depend on it, only how many permits are stored and how fast they
/// come back.)
///
/// A zero or sub-microsecond `warmup` makes `max_permits` zero: the limiter
/// then limits like a bursty one with no burst, never "not at all".
///
/// ```
/// # #[cfg(feature = "internals")] {
/// use std::time::Duration;
/// use paceline::core::{Policy, State, WarmingUp};
///
/// // 2 permits/s (stable 500 ms), 4 s warm-up, cold factor 3 (cold 1.5 s).
/// let policy = Policy::WarmingUp(WarmingUp::new(Duration::from_secs(4), 3.0));
/// let mut state = State::new(policy, 2.0, 0).unwrap();
/// assert_eq!(state.max_permits(), 8.0); // threshold 4 + ramp 4
/// let mut now = 0;
/// let mut waits = vec![];
/// for _ in 0..6 {
///     let wait = state.reserve(1, now);
///     now += wait; // sleep
///     waits.push(wait);
/// }
/// // Cold start: 1.375 s, then faster, down to the stable 0.5 s.
/// assert_eq!(waits, [0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000]);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct WarmingUp {
    /// How long a cold limiter takes to reach the stable rate, in
    /// microseconds (capped at [`MAX_MICROS`](super::MAX_MICROS)).
    pub warmup_micros: u64,
    /// The cold interval as a multiple of the stable interval (`>= 1`).
    pub cold_factor: f64,
    /// Stored permits above this cost more than the stable interval.
    threshold_permits: f64,
    /// How much dearer each stored permit above the threshold is, in
    /// microseconds per permit.
    slope: f64,
}

impl WarmingUp {
    /// A warming-up policy; `cold_factor` must be finite and at least 1 (the
    /// builder checks it).
    pub fn new(warmup: Duration, cold_factor: f64) -> Self {
        WarmingUp {
            warmup_micros: micros(warmup),
            cold_factor,
            threshold_permits: 0.0,
            slope: 0.0,
        }
    }

    /// Recomputes the threshold and slope for a stable interval, all finite;
    /// returns the new `max_permits`.
    pub(super) fn set_stable_interval(&mut self, stable: f64) -> f64 {
        if stable == 0.0 {
            // Infinite rate: every permit is free, nothing is stored.
            self.threshold_permits = 0.0;
            self.slope = 0.0;
            return 0.0;
        }
        let warmup = self.warmup_micros as f64;
        let cold = (stable * self.cold_factor).min(f64::MAX);
        self.threshold_permits = (0.5 * warmup / stable).min(f64::MAX);
        // `stable + cold` is finite: `cold <= f64::MAX`, and `stable <= 2^53`
        // is far below the last unit of `f64::MAX`.
        let max_permits = (self.threshold_permits + 2.0 * warmup / (stable + cold)).min(f64::MAX);
        self.slope = if max_permits > self.threshold_permits {
            ((cold - stable) / (max_permits - self.threshold_permits)).min(f64::MAX)
        } else {
            0.0
        };
        max_permits
    }

    /// The area under the price line over the `permits` rightmost of `stored`.
    pub(super) fn stored_permits_to_wait_micros(
        &self,
        stored: f64,
        mut permits: f64,
        stable: f64,
    ) -> f64 {
        let above_threshold = stored - self.threshold_permits;
        let mut micros = 0.0;
        if above_threshold > 0.0 {
            let take_above = above_threshold.min(permits);
            // A trapezoid: (price at the top + price at the bottom) / 2 ×
            // width.
            let length = self.permits_to_time(above_threshold, stable)
                + self.permits_to_time(above_threshold - take_above, stable);
            micros = take_above * length / 2.0;
            permits -= take_above;
        }
        micros + stable * permits
    }

    /// The price of a stored permit `permits_above` above the threshold.
    fn permits_to_time(&self, permits_above: f64, stable: f64) -> f64 {
        stable + permits_above * self.slope
    }

    /// An idle limiter goes from warm to cold in `warmup`.
    pub(super) fn cool_down_interval_micros(&self, stable: f64, max_permits: f64) -> f64 {
        if max_permits > 0.0 {
            self.warmup_micros as f64 / max_permits
        } else {
            stable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{MAX_MICROS, Policy, State};

    /// Whatever the warm-up, the cold factor and the rate, the threshold and
    /// the slope stay finite, so no price is ever NaN.
    #[test]
    fn the_threshold_and_the_slope_stay_finite() {
        let rates = [1e-300, 1e-3, 0.5, 1.0, 7.0, 1e3, 1e6, 1e300, f64::INFINITY];
        let warmups = [
            Duration::ZERO,
            Duration::from_nanos(500),
            Duration::from_micros(1),
            Duration::from_secs(1),
            Duration::from_secs(3600),
            Duration::MAX,
        ];
        for warmup in warmups {
            for cold_factor in [1.0, 3.0, 10.0, 1e12] {
                let policy = Policy::WarmingUp(WarmingUp::new(warmup, cold_factor));
                let mut state = State::new(policy, 1.0, 0).unwrap();
                for rate in rates {
                    state.set_rate(rate, 0).unwrap();
                    let Policy::WarmingUp(w) = &state.policy else {
                        unreachable!()
                    };
                    assert!(
                        w.slope.is_finite() && w.threshold_permits.is_finite(),
                        "{warmup:?} {cold_factor} {rate}: {w:?}"
                    );
                    let wait = w.stored_permits_to_wait_micros(
                        state.max_permits,
                        state.max_permits,
                        state.stable_interval_micros,
                    );
                    assert!(!wait.is_nan() && state.next_free_micros <= MAX_MICROS);
                }
            }
        }
    }
}
