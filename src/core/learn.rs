//! Learning an upstream's limit from its answers: [`Learning`] (the policy's
//! constants), [`Lesson`] (what one answer said, in the limits' terms) and
//! [`Limits::learn`].
//!
//! # The policy
//!
//! The [`outbound`](crate::outbound) module docs tell it as a user sees it;
//! here, in the limits' terms. The limits keep their configured rates as
//! *ceilings*, and each runs at `min(ceiling, cap × margin) × factor`, where
//! `cap` is the rate the upstream reported for that limit (its quota over its
//! window) and `factor` (from 0 to 1) is learned from its refusals:
//!
//! * A refusal (429) multiplies `factor` by `decrease`, down to `floor`, once
//!   per episode (the refusals of calls that went before the pause it
//!   started ended, whenever they come back, were sent before anyone knew),
//!   and [pauses](State::pause) every limit until its `Retry-After` (or for
//!   `pause`).
//! * A success of a call that went after the pause ended adds `increase`
//!   to `factor`, at most once per `interval`, up to 1 (one that went
//!   before answers the load the refusal answered: it raises nothing).
//! * A limit the upstream says is spent (`remaining` 0, with its `reset`) is
//!   paused until the reset; one with `remaining` (0 included, without a
//!   reset) keeps at most one fewer stored (none for 0), beside the one that
//!   goes whenever nothing is owed: `n` left, `n` at once. (Pauses and caps drop
//!   the stored permits of bursty limits only: a warming-up limit's slow it
//!   down, and it keeps them.)
//!
//! Rate changes and pauses apply to the states at `now` and, like
//! [`Limits::set_rate`], empty the give-back log (the calls it held open then
//! settle as [`Limits::settle`] tells). A cap on what is left applies to the
//! states at `now` too, and while the log holds anything it is logged, an
//! entry of its own that nothing can give back: a give-back or a settle
//! replays it at its place, so the limits then hold what they would had the
//! request given back never been made (or the call cost what it settled
//! at) and the upstream said the same at the same moment.

use super::{Limits, MAX_MICROS, Policy, State};

/// The constants of the policy by which a limiter learns an upstream's limit
/// (see the [`outbound`](crate::outbound) module).
///
/// ```
/// use std::time::Duration;
/// use paceline::RateLimiter;
/// use paceline::outbound::Learning;
///
/// let learning = Learning::default()
///     .decrease(0.5)
///     .increase(0.1)
///     .interval(Duration::from_millis(500));
/// // The margin stays at its default, 0.97.
/// assert_eq!(learning, learning.margin(0.97));
/// let limiter = RateLimiter::builder()
///     .permits_per_second(10.0)
///     .learning(learning)
///     .build()?;
/// # drop(limiter);
/// // A value out of range is refused when the limiter is built.
/// let built = RateLimiter::builder()
///     .permits_per_second(10.0)
///     .learning(learning.margin(1.5))
///     .build();
/// assert!(matches!(built, Err(paceline::Error::InvalidArgument(_))));
/// # Ok::<(), paceline::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learning {
    pub(crate) decrease: f64,
    pub(crate) increase: f64,
    pub(crate) interval_micros: u64,
    pub(crate) floor: f64,
    pub(crate) pause_micros: u64,
    pub(crate) margin: f64,
}

impl Default for Learning {
    /// The defaults each setter gives.
    fn default() -> Self {
        Learning {
            decrease: 0.7,
            increase: 0.05,
            interval_micros: 1_000_000,
            floor: 0.05,
            pause_micros: 1_000_000,
            margin: 0.97,
        }
    }
}

impl Learning {
    /// What a refusal multiplies the learned rate by, in `(0, 1]` (default
    /// 0.7). Here and in `increase`, `floor` and `margin`, a value out of
    /// range (NaN included) makes the limiter's `build` fail with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    #[must_use]
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = factor;
        self
    }

    /// What each [`interval`](Self::interval) of successes adds back, as
    /// a fraction of the configured rate, in `[0, 1]` (default 0.05).
    #[must_use]
    pub fn increase(mut self, fraction: f64) -> Self {
        self.increase = fraction;
        self
    }

    /// How often successes may raise the rate (default 1 s; at least 1 ms).
    #[must_use]
    pub fn interval(mut self, interval: std::time::Duration) -> Self {
        self.interval_micros = super::micros(interval).max(1_000);
        self
    }

    /// The lowest fraction of the configured rate refusals bring it to, in
    /// `(0, 1]` (default 0.05).
    #[must_use]
    pub fn floor(mut self, fraction: f64) -> Self {
        self.floor = fraction;
        self
    }

    /// How long a refusal without `Retry-After` pauses (default 1 s).
    #[must_use]
    pub fn pause(mut self, pause: std::time::Duration) -> Self {
        self.pause_micros = super::micros(pause);
        self
    }

    /// The fraction of a rate the upstream reports that the limiter runs at,
    /// in `(0, 1]` (default 0.97): a little under it, so that calls that
    /// arrive unevenly still find room.
    #[must_use]
    pub fn margin(mut self, fraction: f64) -> Self {
        self.margin = fraction;
        self
    }

    /// Each fraction in its range, or the error that names the first that
    /// is not.
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        let unit = |x: f64| x > 0.0 && x <= 1.0;
        let fields = [
            ("decrease", self.decrease, unit(self.decrease), "(0, 1]"),
            (
                "increase",
                self.increase,
                (0.0..=1.0).contains(&self.increase),
                "[0, 1]",
            ),
            ("floor", self.floor, unit(self.floor), "(0, 1]"),
            ("margin", self.margin, unit(self.margin), "(0, 1]"),
        ];
        match fields.into_iter().find(|field| !field.2) {
            Some((name, value, _, range)) => crate::error::invalid(format!(
                "the learning's {name} must be in {range} (got {value})"
            )),
            None => Ok(()),
        }
    }
}

/// What one answer from the upstream said, in the limits' terms: the digest of
/// a [`Feedback`](crate::outbound::Feedback) that [`Limits::learn`] applies.
/// Durations are from the moment it is learned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lesson {
    /// The upstream refused the call for rate (429).
    pub throttled: bool,
    /// The call succeeded.
    pub success: bool,
    /// How long the upstream asked to wait (`Retry-After`).
    pub retry_after_micros: Option<u64>,
    /// How long before it is learned the call it answers went (`None`: as
    /// if it went as it is learned). A refusal of a call that went before
    /// the last pause ended lowers nothing: it was sent before anyone knew;
    /// nor does its success raise anything.
    pub sent_ago_micros: Option<u64>,
    /// Per limit, in order: what the upstream reported for it.
    pub limits: Vec<Reported>,
}

/// What the upstream reported for one limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reported {
    /// Its rate, in permits per second (its quota over its window).
    pub rate: Option<f64>,
    /// What it has left in its window.
    pub remaining: Option<u64>,
    /// How long until its window is full again.
    pub reset_micros: Option<u64>,
}

/// What limits learned, as another copy of them reports it (Redis's, in a
/// reply): the factor, the margin, and each limit's cap (infinite where none
/// was reported); and the end of the last refusal's pause, on that copy's
/// clock (not adopted: a fallback's clock is its own).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adopted {
    pub(crate) factor: f64,
    pub(crate) margin: f64,
    pub(crate) caps: Box<[f64]>,
    pub(crate) paused_until: u64,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Adopted {
    /// Whether it changes nothing: limits at their configured rates.
    pub(crate) fn is_nothing(&self) -> bool {
        self.factor >= 1.0 && self.caps.iter().all(|c| c.is_infinite())
    }

    /// The rate a limit configured at `ceiling`, with `cap`, runs at
    /// (`Learned::rate`).
    pub(crate) fn rate_of(&self, ceiling: f64, cap: f64) -> f64 {
        learned_rate(ceiling, cap, self.margin, self.factor)
    }

    /// The same, its caps scaled by `fraction` (a fallback's share; see
    /// [`share_of`](super::share_of)).
    pub(crate) fn scaled(mut self, fraction: f64) -> Adopted {
        for cap in self.caps.iter_mut() {
            *cap = super::share_of(*cap, fraction);
        }
        self
    }
}

/// What the limits learned (see the module's documentation).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Learned {
    /// The rates the limits were configured at.
    ceilings: Vec<f64>,
    /// The rates the upstream reported (infinite where it did not).
    caps: Vec<f64>,
    /// The learned fraction of the rate, in `[floor, 1]`.
    factor: f64,
    /// The end of the last pause.
    paused_until: u64,
    /// The end of each limit's last pause: a refusal's, or its own, spent
    /// until its reset.
    pauses: Vec<u64>,
    /// When `factor` last rose.
    increased_at: u64,
    /// The fraction of a cap the limits run at.
    margin: f64,
}

impl Learned {
    fn new(states: &[State]) -> Self {
        Learned {
            ceilings: states.iter().map(|s| s.permits_per_second).collect(),
            caps: vec![f64::INFINITY; states.len()],
            factor: 1.0,
            paused_until: 0,
            pauses: vec![0; states.len()],
            increased_at: 0,
            margin: 1.0,
        }
    }

    /// The rate limit `i` runs at.
    fn rate(&self, i: usize) -> f64 {
        learned_rate(self.ceilings[i], self.caps[i], self.margin, self.factor)
    }
}

/// `min(ceiling, cap × margin) × factor`, the rate of [the policy](self). An
/// infinite ceiling scaled stays infinite. A product that rounds to 0 is no
/// rate: a `cap × margin` that does (a margin near the least double) is the
/// least double, the slowest rate, not none; a product with the factor that
/// does keeps the capped rate.
fn learned_rate(ceiling: f64, cap: f64, margin: f64, factor: f64) -> f64 {
    let capped = ceiling.min((cap * margin).max(f64::from_bits(1)));
    let rate = capped * factor;
    if rate > 0.0 { rate } else { capped }
}

impl Limits {
    /// Learns what an upstream said in answer to a call at `now_micros`, under
    /// `learning`'s constants, by the policy that `src/core/learn.rs` opens
    /// with.
    pub fn learn(&mut self, lesson: &Lesson, now_micros: u64, learning: &Learning) {
        let n = self.states.len();
        let learned = self
            .learned
            .get_or_insert_with(|| Box::new(Learned::new(&self.states)));
        let before = learned.clone();
        learned.margin = learning.margin;
        for (i, reported) in lesson.limits.iter().enumerate().take(n) {
            if let Some(rate) = reported.rate.filter(|r| *r > 0.0 && r.is_finite()) {
                learned.caps[i] = rate;
            }
        }
        let mut pause = None;
        // (When its call went: one that went before the last pause ended
        // lowers nothing, and raises nothing.)
        let sent = now_micros.saturating_sub(lesson.sent_ago_micros.unwrap_or(0));
        if lesson.throttled {
            if sent >= learned.paused_until {
                learned.factor = (learned.factor * learning.decrease).max(learning.floor);
            }
            let after = lesson.retry_after_micros.unwrap_or(learning.pause_micros);
            let until = now_micros.saturating_add(after).min(MAX_MICROS);
            learned.paused_until = learned.paused_until.max(until);
            learned.increased_at = learned.paused_until;
            pause = Some(until);
        } else if lesson.success
            && sent >= learned.paused_until
            && now_micros.saturating_sub(learned.increased_at) >= learning.interval_micros
            && learned.factor < 1.0
        {
            learned.factor = (learned.factor + learning.increase).min(1.0);
            learned.increased_at = now_micros;
        }
        if learned.factor != before.factor
            || learned.caps != before.caps
            || learned.margin != before.margin
        {
            let rates: Vec<f64> = (0..n).map(|i| learned.rate(i)).collect();
            // Every learned rate is positive, so valid.
            let _ = self.apply_rates(&rates, now_micros);
        }
        let spent = |i: usize| {
            let reported = lesson.limits.get(i)?;
            let until = now_micros.saturating_add(reported.reset_micros?);
            (reported.remaining == Some(0)).then_some(until.min(MAX_MICROS))
        };
        let pauses: Vec<Option<u64>> = (0..n).map(|i| pause.max(spent(i))).collect();
        if pauses
            .iter()
            .any(|p| p.is_some_and(|until| until > now_micros))
        {
            self.clear_log();
            let ends = match &mut self.learned {
                Some(learned) => &mut learned.pauses[..],
                None => &mut [],
            };
            for (i, (state, until)) in self.states.iter_mut().zip(pauses).enumerate() {
                if let Some(until) = until {
                    state.pause(until, now_micros);
                    if let Some(end) = ends.get_mut(i) {
                        *end = (*end).max(until);
                    }
                }
            }
        }
        for (i, reported) in lesson.limits.iter().enumerate().take(n) {
            // `n` left: `n - 1` stored, beside the one request that goes
            // whenever nothing is owed, so that `n` go at once. (0 too: a
            // spent bursty limit with no reset stores nothing and lets one
            // go; one with a reset is paused above, which stores nothing
            // already.)
            if let Some(remaining) = reported.remaining {
                // Logged while the log holds anything, binding or not, so
                // that a give-back or a settle replays it at its place.
                // (In doubles, as the script counts: above 2^53 `n - 1`
                // rounds as it does there.)
                let cap = (remaining as f64 - 1.0).max(0.0) as u64;
                self.keep_stored_at_most(i, cap, now_micros);
            }
        }
    }

    /// Runs the limits from `now_micros` at the rates `adopted` says another
    /// copy of them learned (the caps already in this copy's terms), and
    /// nothing else: a fallback that takes a key over from a limiter shared
    /// through Redis starts from what the key learned there. Numbers out of
    /// range change nothing. As a rate change, it empties the log.
    pub(crate) fn adopt(&mut self, adopted: &Adopted, now_micros: u64) {
        let valid = |x: f64| x > 0.0 && x <= 1.0;
        if !valid(adopted.factor)
            || !valid(adopted.margin)
            || !adopted.caps.iter().all(|c| *c > 0.0)
        {
            return;
        }
        let learned = self
            .learned
            .get_or_insert_with(|| Box::new(Learned::new(&self.states)));
        learned.factor = adopted.factor;
        learned.margin = adopted.margin;
        for (cap, adopted) in learned.caps.iter_mut().zip(adopted.caps.iter()) {
            *cap = *adopted;
        }
        let rates: Vec<f64> = (0..self.states.len()).map(|i| learned.rate(i)).collect();
        // Every learned rate is positive, so valid.
        let _ = self.apply_rates(&rates, now_micros);
    }

    /// The end of the pause the last refusal started (µs), while it lasts
    /// at `now_micros`: a caller that waited and wakes before it has its
    /// moment inside the pause, which it learned of too late.
    pub(crate) fn paused_until(&self, now_micros: u64) -> Option<u64> {
        let until = self.learned.as_ref()?.paused_until;
        (until > now_micros).then_some(until)
    }

    /// The end of each limit's last pause (µs; 0: none): a refusal's, or
    /// its own, spent until its reset; `None` if nothing was learned. A
    /// pause is time, not permits: a fallback carries it back at its
    /// length.
    pub(crate) fn pauses(&self) -> Option<&[u64]> {
        self.learned.as_ref().map(|learned| &learned.pauses[..])
    }

    /// The learned fraction of the configured rates (1 until a refusal).
    #[cfg(feature = "internals")]
    pub fn learned_factor(&self) -> f64 {
        self.learned.as_ref().map_or(1.0, |l| l.factor)
    }

    /// What the limits learned, if anything: the factor, the end of the last
    /// pause, when the factor last rose, the margin, and each limit's cap
    /// (infinite where none was reported). For the model tests, which hold
    /// Redis's copy to it.
    #[cfg(feature = "internals")]
    pub fn learned_numbers(&self) -> Option<(f64, u64, u64, f64, Vec<f64>)> {
        self.learned.as_ref().map(|l| {
            (
                l.factor,
                l.paused_until,
                l.increased_at,
                l.margin,
                l.caps.clone(),
            )
        })
    }

    /// The configured rates: the limits' own, or the ceilings learning keeps
    /// under them.
    pub(crate) fn ceilings(&self) -> Vec<f64> {
        match &self.learned {
            Some(learned) => learned.ceilings.clone(),
            None => self.states.iter().map(|s| s.permits_per_second).collect(),
        }
    }

    /// The rates the limits run at for configured rates `rates`, which
    /// learning keeps as its ceilings.
    pub(super) fn learned_rates(&mut self, rates: &[f64]) -> Vec<f64> {
        match &mut self.learned {
            Some(learned) => {
                learned.ceilings = rates.to_vec();
                (0..rates.len()).map(|i| learned.rate(i)).collect()
            }
            None => rates.to_vec(),
        }
    }
}

impl State {
    /// Pauses the limit until `until_micros`: its ticket moves there (if
    /// earlier) and, bursty, it drops every stored permit, so that it stores
    /// only the idle time after the pause and the callers that come back
    /// after it go one interval apart, never as a burst. A warming-up limit
    /// keeps what it stores: its stored permits make it slower (cold), and
    /// dropping them would make it run warm, faster than before the pause.
    pub(crate) fn pause(&mut self, until_micros: u64, now_micros: u64) {
        self.resync(now_micros);
        self.drop_stored_at_most(0.0);
        if until_micros > self.next_free_micros {
            self.next_free_micros = until_micros.min(MAX_MICROS);
            self.next_free_fraction = 0;
        }
    }

    /// Keeps at most `permits` stored (as of `now_micros`), bursty: a
    /// warming-up limit's stored permits are no burst (they slow it down),
    /// so it keeps them.
    pub(crate) fn keep_stored_at_most(&mut self, permits: u64, now_micros: u64) {
        self.resync(now_micros);
        self.drop_stored_at_most(permits as f64);
    }

    /// Keeps at most `permits` stored if stored permits are free (bursty).
    fn drop_stored_at_most(&mut self, permits: f64) {
        if let Policy::Bursty(_) = self.policy {
            self.stored_permits = self.stored_permits.min(permits);
        }
    }
}
