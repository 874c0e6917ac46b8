//! A limiter's rates and policies, validated in one place: [`Limit`], and the
//! builder's own options.

use std::time::Duration;

use crate::Error;
use crate::core::{Bursty, MAX_MICROS, Policy, State, WarmingUp};
use crate::error::invalid;

/// The default cold factor of the warming-up policy: a cold limiter starts
/// three times slower than its stable rate.
pub const DEFAULT_COLD_FACTOR: f64 = 3.0;

/// The largest cold factor: past about 10^15 the warm-up's ramp,
/// `2 × warmup / (stable × (1 + cold_factor))` permits, is lost in rounding
/// beside the flat part (`warmup / (2 × stable)`), and a colder factor
/// would start faster. 10^6 keeps it exact to about 10^-10.
const MAX_COLD_FACTOR: f64 = 1e6;

/// The rate and policy options shared by every limiter's builder.
#[derive(Debug, Clone, Default)]
pub(crate) struct PolicyConfig {
    pub(crate) permits_per_second: Option<f64>,
    pub(crate) max_burst: Option<Duration>,
    pub(crate) warmup: Option<Duration>,
    pub(crate) cold_factor: Option<f64>,
    /// The limits given with `.limit()`, after the one above (if set).
    pub(crate) limits: Vec<Limit>,
}

impl PolicyConfig {
    /// Checks the options and returns the policy and rate they describe.
    pub(crate) fn policy(&self) -> Result<(Policy, f64), Error> {
        let Some(rate) = self.permits_per_second else {
            return invalid("no rate was given: call .permits_per_second(rate) on the builder");
        };
        crate::core::stable_interval_micros(rate)?;
        let policy = match (self.warmup, self.max_burst) {
            (Some(_), Some(_)) => {
                return invalid(
                    "max_burst applies to the bursty policy only, but warmup was also set \
                     (which chooses the warming-up policy): set one of them",
                );
            }
            (Some(warmup), None) => {
                let cold_factor = self.cold_factor.unwrap_or(DEFAULT_COLD_FACTOR);
                if !(1.0..=MAX_COLD_FACTOR).contains(&cold_factor) {
                    return invalid(format!(
                        "cold_factor must be a number from 1.0 to 1e6 (got {cold_factor})"
                    ));
                }
                Policy::WarmingUp(WarmingUp::new(warmup, cold_factor))
            }
            (None, max_burst) => {
                if let Some(cold_factor) = self.cold_factor {
                    return invalid(format!(
                        "cold_factor ({cold_factor}) applies to the warming-up policy only: \
                         also set warmup, or remove cold_factor"
                    ));
                }
                Policy::Bursty(max_burst.map(Bursty::new).unwrap_or_default())
            }
        };
        Ok((policy, rate))
    }
}

/// One of several limits a limiter enforces together; see
/// [`Builder::limit`](crate::Builder::limit).
///
/// A limit is a rate and its *burst*: how many requests may go at once after
/// an idle spell. Made with a period
/// (`Limit::per(1000.0, Duration::from_secs(3600))`), its burst is the
/// period's whole permits: a quota of 1 000 an hour lets 1 000 requests go
/// at once, then refills at 1 000 an hour. [`burst`](Limit::burst) sets
/// another count, [`warmup`](Limit::warmup) the warming-up policy instead. A
/// limit starts full, its burst there at once (a local `RateLimiter`'s
/// `permits_per_second` starts with nothing stored).
///
/// A burst of `n` is `n` requests of one permit at once, no more: the limit
/// stores `n − 1` permits while idle, and the request that goes when nothing
/// is owed makes the `n`th (the next request pays its cost). The builder's
/// [`max_burst`](crate::Builder::max_burst), a duration of stored permits,
/// keeps the classic meaning: `max_burst × rate` permits stored, one more at
/// once.
///
/// **A long window's burst.** A per-hour limit whose burst is one second of
/// its rate (the single-limit builder's default) is just a slow rate: one
/// permit every 3.6 s at 1 000 an hour. A quota wants the whole window as its
/// burst, the default here.
///
/// **Against a fixed window.** A full bucket drained at its rate admits up to
/// about twice its quota in one sliding window: 1 000 at once, then 1 000 more
/// over the hour that follows (a fixed window admits twice its quota across
/// its boundary too). If the sliding window must hold the quota, give the
/// limit half the window as its burst (`.burst(500)`: at most 1 500 in any
/// hour), or add a second, tighter limit
/// (`Limit::per(20.0, Duration::from_secs(60))`) to pace the spending.
///
/// ```
/// use std::time::Duration;
/// use paceline::{Limit, RateLimiter};
/// use paceline::clock::FakeClock;
///
/// let limiter = RateLimiter::builder()
///     .limit(Limit::per_second(10.0).burst(20))
///     .limit(Limit::per(1000.0, Duration::from_secs(3600)))
///     .clock(FakeClock::new())
///     .build()?;
/// assert_eq!(limiter.rate(), 10.0);
/// // A burst of 20 is 20 at once, and the 21st waits.
/// for _ in 0..20 {
///     assert!(limiter.try_reserve(1, Duration::ZERO)?.is_some());
/// }
/// assert!(limiter.try_reserve(1, Duration::ZERO)?.is_none());
/// # Ok::<(), paceline::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a limit does nothing until given to a builder's .limit()"]
pub struct Limit {
    config: PolicyConfig,
    /// Set by [`burst`](Limit::burst); `None`: the period's whole permits.
    burst: Option<u64>,
    /// The permits per period it was made with.
    period_permits: f64,
    /// Why it cannot be built, found when it was made.
    invalid: Option<String>,
    /// The upstream's name for it (see [`named`](Limit::named)).
    name: Option<Box<str>>,
    /// Calls in flight at most, for [`Limit::concurrent`]: then not a rate.
    concurrent: Option<u32>,
}

impl Limit {
    /// `permits` per `period`, with a burst of the period's whole permits (at
    /// least 1). A zero period is an [`Error::InvalidArgument`] when built.
    pub fn per(permits: f64, period: Duration) -> Limit {
        let invalid = if period.is_zero() {
            Some("its period must be longer than zero".to_owned())
        } else if permits.is_nan() || permits <= 0.0 {
            Some(format!(
                "its permits must be a positive number or +infinity (got {permits})"
            ))
        } else if permits / period.as_secs_f64() == 0.0 {
            Some(format!(
                "its rate, {permits} permits per {period:?}, is too small to hold (it \
                 rounds to 0 permits per second)"
            ))
        } else {
            None
        };
        Limit {
            invalid,
            config: PolicyConfig {
                permits_per_second: Some(permits / period.as_secs_f64()),
                max_burst: Some(period),
                ..PolicyConfig::default()
            },
            burst: None,
            period_permits: permits,
            name: None,
            concurrent: None,
        }
    }

    /// At most `calls` calls in flight at once: not a rate but a cap on the
    /// [`Call`](crate::outbound::Call)s that
    /// [`RateLimiter::call`](crate::RateLimiter::call) and
    /// [`KeyedRateLimiter::call`](crate::KeyedRateLimiter::call) (per key)
    /// hand out and that have not ended. A call takes a *slot* first, waiting
    /// while all are taken (first come, first served in this process: a
    /// slot given back is kept 50 ms for the call that has waited longest,
    /// then is free to the first call that looks), then
    /// its place in the schedule; the slot is free again as soon as the `Call`
    /// is dropped. From when it takes its slot, the call's future holds it
    /// as the `Call` will: one that took its slot and is then kept without
    /// being polled (or forgotten) holds it until it is dropped. Through
    /// Redis the slots are shared by every process, and so is the line of
    /// calls waiting for them (see [`outbound`](crate::outbound)).
    ///
    /// Only calls hold slots: `reserve`, `acquire` and the rest do not (their
    /// end is not known). It is not among the limits a [`Cost`](crate::Cost)
    /// counts for, and the limiter still needs a rate
    /// (`Limit::per_second(f64::INFINITY)` for none). Building is an
    /// [`Error::InvalidArgument`] with `calls` 0, with two of them, or with
    /// `burst`, `warmup`, `cold_factor` or `named` on it.
    pub fn concurrent(calls: u32) -> Limit {
        let mut limit = Limit::per_second(f64::INFINITY);
        limit.concurrent = Some(calls);
        limit
    }

    /// Whether it is a rate (not [`concurrent`](Limit::concurrent)).
    pub(crate) fn is_rate(&self) -> bool {
        self.concurrent.is_none()
    }

    /// `permits` per second: [`per`](Limit::per) one second.
    pub fn per_second(permits: f64) -> Limit {
        Limit::per(permits, Duration::from_secs(1))
    }

    /// How many requests of one permit may go at once after an idle spell: `n`
    /// at once, the `n + 1`th one interval after the first (`1`: exact
    /// spacing). Building with `0` is an [`Error::InvalidArgument`].
    ///
    /// Exact up to 10^6 permits a second. Above, a permit costs under a
    /// microsecond, the unit waits are counted in, so the count holds to a
    /// microsecond's worth: at 10^9 a second, `burst(1)` to `burst(1000)`
    /// each let about 1 000 go at once.
    ///
    /// The count holds at the rate the limit is built with. A new rate
    /// (`set_rate`, or one learned from an upstream) keeps the time the stored
    /// permits span, so the count follows the rate: `burst(20)` at 10/s stores
    /// 1.9 s of permits, 39 at once at 20/s, 10 at 5/s.
    pub fn burst(mut self, permits: u64) -> Limit {
        self.burst = Some(permits);
        self
    }

    /// The warming-up policy instead of a burst: idle for this long, the limit
    /// starts slow and takes this long to reach its rate. With a
    /// [`burst`](Limit::burst) too, building is an [`Error::InvalidArgument`].
    pub fn warmup(mut self, warmup: Duration) -> Limit {
        self.config.warmup = Some(warmup);
        // The period's burst, which a warming-up limit does not have.
        self.config.max_burst = None;
        self
    }

    /// The name an upstream gives this limit in its rate-limit headers
    /// (`requests`, `tokens`: a `RateLimit` policy's name, or the suffix of
    /// `X-RateLimit-Remaining-Tokens`), so that what it reports of it reaches
    /// this limit (see [`outbound`](crate::outbound)).
    pub fn named(mut self, name: &str) -> Limit {
        self.name = Some(name.into());
        self
    }

    /// The upstream's name for it.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Warming-up policy: how much slower than its rate a cold limit starts
    /// (default [`DEFAULT_COLD_FACTOR`]); from 1.0 to 10^6, as on the
    /// builder.
    pub fn cold_factor(mut self, cold_factor: f64) -> Limit {
        self.config.cold_factor = Some(cold_factor);
        self
    }

    /// The limit's core state at `now`.
    fn state(&self, now: u64) -> Result<State, Error> {
        if let Some(why) = &self.invalid {
            return invalid(why.as_str());
        }
        if let (Some(_), Some(_)) = (self.burst, self.config.warmup) {
            return invalid(
                "burst applies to the bursty policy only, but warmup was also set (which \
                 chooses the warming-up policy): set one of them",
            );
        }
        let mut config = self.config.clone();
        if let (Some(rate), None) = (config.permits_per_second, config.warmup) {
            let burst = match self.burst {
                Some(0) => {
                    return invalid(
                        "its burst must be at least 1 (got 0): one request always goes \
                         when nothing is owed; burst(1) is exact spacing",
                    );
                }
                Some(burst) => burst as f64,
                None => self.period_permits.floor().max(1.0),
            };
            let stored = stored_for(burst - 1.0, rate);
            // A count means what it says, given or the period's: one the
            // limiter cannot store (it holds 2^53 µs of idle time) is
            // refused, not cut.
            if stored > Duration::from_micros(MAX_MICROS) {
                let most = (MAX_MICROS as f64 * rate / 1e6).floor() + 1.0;
                let whose = if self.burst.is_some() {
                    ""
                } else {
                    " (its period's permits)"
                };
                // (As given: a count past 2^53 reads rounded as a double.)
                let burst = self
                    .burst
                    .map_or(burst.to_string(), |given| given.to_string());
                return invalid(format!(
                    "its burst of {burst}{whose} is more than the limiter stores at {rate} \
                     per second (2^53 µs of idle time, about 285 years: at most {most})"
                ));
            }
            config.max_burst = Some(stored);
        }
        let (policy, rate) = config.policy()?;
        // Full, as a key never seen starts (a warming-up limit is cold).
        Ok(State::full(policy, rate, now)?)
    }
}

/// The idle time that stores `permits` (whole, `>= 0`) at `rate`: rounded up
/// to the microsecond, so that at least `permits` are stored, and less than
/// one more (a burst of `n` lets `n` go at once, never `n + 1`).
///
/// A request goes at once while what is owed before it is under a
/// microsecond (waits are whole microseconds): after the stored permits,
/// the next request owes what they lack of a whole one. Where a
/// microsecond holds a good part of a permit (above 3.3 × 10^5 a second),
/// the rounding up may leave so little lacking that one more request goes
/// at once, or nearly (at 999 999/s, a burst of 2 stored 1.999998 permits
/// and let 3 go): a microsecond less is then stored, a little under
/// `permits`, which lets exactly `permits + 1` go, the last one on the
/// microsecond's worth.
///
/// Above 10^6 permits a second a microsecond stores a permit or more, and
/// rounding up would store as many more as a microsecond holds (at 10^9/s, a
/// burst of 5 would let 2 000 go at once), so it is then rounded down. What
/// that leaves out, under a microsecond's worth, goes anyway: the ticket's
/// part below the microsecond is not waited for.
fn stored_for(permits: f64, rate: f64) -> Duration {
    if permits <= 0.0 || rate.is_infinite() {
        return Duration::ZERO;
    }
    // Past 10^302 permits `permits × 1e6` overflows: divided first then
    // (not for every count, as that rounds otherwise).
    let exact = permits * 1e6 / rate;
    let exact = match exact.is_finite() {
        true => exact,
        false => permits / rate * 1e6,
    };
    // The limit's maximum is computed back as `micros × rate / 1e6`, kept
    // finite ([`Bursty`]); a rounding below `permits` would store one permit
    // fewer.
    let stores = |micros: f64| (micros * rate / 1e6).min(f64::MAX);
    let mut micros = exact.ceil();
    if stores(micros) < permits {
        micros += 1.0;
    }
    // What one microsecond stores (up to 1 here): what a request owing less
    // than a microsecond, so going at once, takes of its permit fresh. After
    // the stored permits, one more request must go at once on it, and the
    // one after must not. `over`, what is stored past `permits` (under that
    // worth), does so while `over + per_micro <= 1`; a microsecond less
    // stores `over − per_micro`, and does so while `over > 0`. The one
    // further from its edge is kept: the charges' rounding to 2^-20 µs adds
    // up over a burst.
    let per_micro = rate / 1e6;
    if per_micro <= 1.0 {
        let over = stores(micros) - permits;
        if over > (1.0 - per_micro) / 2.0 {
            micros -= 1.0;
        }
    } else if stores(micros) >= permits + 1.0 {
        micros = exact.floor();
    }
    Duration::from_micros(if micros < u64::MAX as f64 {
        micros as u64
    } else {
        u64::MAX
    })
}

/// The core states of a builder's limits at `now`: the one its own rate
/// describes, if set, then each rate [`Limit`] in order.
pub(crate) fn limit_states(config: &PolicyConfig, now: u64) -> Result<Vec<State>, Error> {
    let limits: Vec<&Limit> = config.limits.iter().filter(|l| l.is_rate()).collect();
    concurrency(config)?;
    let mut states = Vec::with_capacity(limits.len() + 1);
    if limits.is_empty() || config.permits_per_second.is_some() {
        if config.permits_per_second.is_none() && !config.limits.is_empty() {
            return invalid(
                "Limit::concurrent caps the calls in flight and is not a rate: give a rate \
                 too (.permits_per_second(rate) or a Limit::per_second; f64::INFINITY for \
                 none)",
            );
        }
        let (policy, rate) = config.policy()?;
        states.push(State::new(policy, rate, now)?);
    } else if config.max_burst.is_some() || config.warmup.is_some() {
        return invalid(
            "max_burst and warmup on the builder shape the rate set with \
             permits_per_second, which was not set: set them on each Limit instead",
        );
    }
    for limit in limits {
        // Which limit, counted as `set_limit_rate` counts them.
        let index = states.len();
        let state = limit.state(now).map_err(|error| match error {
            Error::InvalidArgument(why) => Error::InvalidArgument(match limit.name() {
                Some(name) => format!("limit {index} ({name:?}): {why}"),
                None => format!("limit {index}: {why}"),
            }),
            other => other,
        })?;
        states.push(state);
    }
    Ok(states)
}

/// How many calls may be in flight at once, if a [`Limit::concurrent`] says,
/// checked as it tells.
pub(crate) fn concurrency(config: &PolicyConfig) -> Result<Option<u32>, Error> {
    let mut found = None;
    for limit in &config.limits {
        let Some(calls) = limit.concurrent else {
            continue;
        };
        if found.is_some() {
            return invalid("a limiter takes one Limit::concurrent at most (got two)");
        }
        if calls == 0 {
            return invalid("Limit::concurrent must allow at least 1 call in flight (got 0)");
        }
        let shaped = limit.burst.is_some()
            || limit.config.warmup.is_some()
            || limit.config.cold_factor.is_some()
            || limit.name.is_some();
        if shaped {
            return invalid(
                "burst, warmup, cold_factor and named shape a rate, and Limit::concurrent is \
                 not one: give them to a rate limit",
            );
        }
        found = Some(calls);
    }
    Ok(found)
}
