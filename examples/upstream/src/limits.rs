//! The buckets, the admission of a call and the charge of its tokens, and
//! the records of both, behind one lock so that every record carries the
//! very instant the buckets were read at.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::Config;
use crate::stats::{Recorder, Stats, Totals};

/// A token bucket: `rate` a second, holding at most `capacity`, full at
/// the start. Its level may fall below zero (tokens charged after the
/// call) and then refills from there.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: f64,
    capacity: f64,
    level: f64,
    /// When `level` was last brought up to date, in nanoseconds since the
    /// start.
    at: u64,
    window_secs: u32,
}

impl TokenBucket {
    fn new(rate: f64, window_secs: u32) -> TokenBucket {
        let capacity = rate * f64::from(window_secs);
        TokenBucket {
            rate,
            capacity,
            level: capacity,
            at: 0,
            window_secs,
        }
    }

    /// Brings the level up to `now`.
    fn refill(&mut self, now: u64) {
        if now > self.at {
            let gained = self.rate * (now - self.at) as f64 / 1e9;
            self.level = (self.level + gained).min(self.capacity);
            self.at = now;
        }
    }

    /// Seconds until the level reaches `level`.
    fn secs_until(&self, level: f64) -> f64 {
        ((level - self.level) / self.rate).max(0.0)
    }

    /// What it says of itself in the headers.
    fn view(&self) -> BucketView {
        BucketView {
            quota: (self.capacity + 1e-9).floor() as u64,
            window_secs: self.window_secs,
            remaining: self.level.max(0.0).floor() as u64,
            full_in: self.secs_until(self.capacity),
        }
    }
}

/// A bucket as the headers tell it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BucketView {
    /// What it holds when full, rounded down.
    pub(crate) quota: u64,
    /// The seconds' worth it holds when full.
    pub(crate) window_secs: u32,
    /// What it holds now, rounded down; 0 in debt.
    pub(crate) remaining: u64,
    /// Seconds until it is full.
    pub(crate) full_in: f64,
}

/// Both buckets as the headers tell them, each where it is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct View {
    pub(crate) requests: Option<BucketView>,
    pub(crate) tokens: Option<BucketView>,
}

/// A limit that refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Requests,
    Tokens,
    InFlight,
}

impl Limit {
    /// Its name in a refusal's body.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
            Limit::InFlight => "in_flight",
        }
    }
}

/// What became of a call on arrival.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Admitted: it costs `cost` tokens and is answered after `latency`.
    Admitted {
        cost: u64,
        latency: Duration,
        /// When it is due to finish, in nanoseconds since the start.
        due: u64,
    },
    /// Refused by `limits` (at least one); every one of them would admit
    /// a call after `wait`.
    Refused {
        limits: Vec<Limit>,
        wait: Duration,
        view: View,
    },
}

/// What the lock guards.
#[derive(Debug)]
struct State {
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
    in_flight: u32,
    /// When the calls in flight are due to finish (nanoseconds since the
    /// start), and how many at each.
    due: BTreeMap<u64, u32>,
    /// Calls admitted so far: the index of the next.
    admitted: u64,
    recorder: Recorder,
}

/// The upstream's state, shared by its handlers and its owner.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    start: Instant,
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Shared {
        let limits = config.limits;
        let bucket = |rate: Option<f64>| rate.map(|r| TokenBucket::new(r, limits.window_secs));
        let bucket_nanos = u64::try_from(config.stats_bucket.as_nanos()).unwrap_or(u64::MAX);
        Shared {
            state: Mutex::new(State {
                requests: bucket(limits.requests_per_second),
                tokens: bucket(limits.tokens_per_second),
                in_flight: 0,
                due: BTreeMap::new(),
                admitted: 0,
                recorder: Recorder::new(bucket_nanos),
            }),
            start: Instant::now(),
            config,
        }
    }

    /// The state, and now in nanoseconds since the start (read under the
    /// lock, so that the records are in order).
    fn lock(&self) -> (MutexGuard<'_, State>, u64) {
        // A handler cannot panic while it holds the lock; take the state
        // as it is if one somehow did.
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        (state, now)
    }

    /// Admits a call now, or refuses it.
    pub(crate) fn admit(&self) -> Admission {
        let (mut guard, now) = self.lock();
        let state = &mut *guard;
        let mut limits = Vec::new();
        let mut wait = 0.0_f64;
        if let Some(bucket) = &mut state.requests {
            bucket.refill(now);
            if bucket.level < 1.0 {
                limits.push(Limit::Requests);
                wait = wait.max(bucket.secs_until(1.0));
            }
        }
        if let Some(bucket) = &mut state.tokens {
            bucket.refill(now);
            if bucket.level < 0.0 {
                limits.push(Limit::Tokens);
                wait = wait.max(bucket.secs_until(0.0));
            }
        }
        let max_in_flight = self.config.limits.max_in_flight;
        if max_in_flight.is_some_and(|max| state.in_flight >= max) {
            limits.push(Limit::InFlight);
            let first_due = state.due.keys().next().copied().unwrap_or(now);
            wait = wait.max(first_due.saturating_sub(now) as f64 / 1e9);
        }
        if !limits.is_empty() {
            state.recorder.refused(now, state.in_flight, &limits);
            return Admission::Refused {
                limits,
                wait: Duration::from_secs_f64(wait.min(1e9)),
                view: state.view(),
            };
        }
        if let Some(bucket) = &mut state.requests {
            bucket.level -= 1.0;
        }
        let n = state.admitted;
        state.admitted += 1;
        let cost = self.config.token_cost(n);
        let latency = self.config.call_latency(n);
        let due = now.saturating_add(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        *state.due.entry(due).or_insert(0) += 1;
        state.recorder.admitted(now, state.in_flight);
        state.in_flight += 1;
        Admission::Admitted { cost, latency, due }
    }

    /// A call admitted with `cost` and `due` has finished: charges its
    /// tokens, and returns the buckets as its answer tells them.
    pub(crate) fn complete(&self, cost: u64, due: u64) -> View {
        let (mut guard, now) = self.lock();
        let state = &mut *guard;
        let mut level = None;
        if let Some(bucket) = &mut state.tokens {
            bucket.refill(now);
            bucket.level -= cost as f64;
            level = Some(bucket.level);
        }
        if let Some(requests) = &mut state.requests {
            requests.refill(now);
        }
        if let Some(count) = state.due.get_mut(&due) {
            *count -= 1;
            if *count == 0 {
                state.due.remove(&due);
            }
        }
        state.recorder.charged(now, state.in_flight, cost, level);
        state.in_flight -= 1;
        state.view()
    }

    /// A copy of the records; the exact times too if `events`.
    pub(crate) fn stats(&self, events: bool) -> Stats {
        let (state, now) = self.lock();
        let limits = self.config.limits;
        state.recorder.stats(now, state.in_flight, limits, events)
    }

    /// The totals.
    pub(crate) fn totals(&self) -> Totals {
        self.lock().0.recorder.totals()
    }
}

impl State {
    fn view(&self) -> View {
        View {
            requests: self.requests.as_ref().map(TokenBucket::view),
            tokens: self.tokens.as_ref().map(TokenBucket::view),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_continuously_up_to_its_capacity() {
        let mut bucket = TokenBucket::new(10.0, 2);
        assert_eq!(bucket.view().quota, 20);
        bucket.level = -5.0;
        bucket.refill(1_000_000_000);
        assert!((bucket.level - 5.0).abs() < 1e-9);
        assert_eq!(bucket.view().remaining, 5);
        assert!((bucket.view().full_in - 1.5).abs() < 1e-9);
        bucket.refill(10_000_000_000);
        assert_eq!(bucket.level, 20.0);
        bucket.level = -3.0;
        assert_eq!(bucket.view().remaining, 0);
        assert!((bucket.secs_until(0.0) - 0.3).abs() < 1e-9);
    }

    #[test]
    fn tokens_in_debt_refuse_until_they_refill() {
        let config = Config {
            tokens: 50..=50,
            latency: Duration::ZERO,
            limits: crate::Limits {
                requests_per_second: None,
                tokens_per_second: Some(100.0),
                max_in_flight: None,
                window_secs: 1,
            },
            ..Config::default()
        };
        let shared = Shared::new(config);
        let mut admitted = Vec::new();
        for _ in 0..3 {
            match shared.admit() {
                Admission::Admitted { cost, due, .. } => admitted.push((cost, due)),
                refused => panic!("{refused:?}"),
            }
        }
        for (cost, due) in admitted {
            shared.complete(cost, due);
        }
        // 100 - 150: about 50 in debt, refilled at 100 a second.
        match shared.admit() {
            Admission::Refused { limits, wait, view } => {
                assert_eq!(limits, [Limit::Tokens]);
                assert!(wait > Duration::from_millis(300), "{wait:?}");
                assert!(wait <= Duration::from_millis(500), "{wait:?}");
                assert_eq!(view.tokens.unwrap().remaining, 0);
                assert!(view.requests.is_none());
            }
            admitted => panic!("{admitted:?}"),
        }
        let stats = shared.stats(true);
        assert_eq!(stats.totals.admitted, 3);
        assert_eq!(stats.totals.tokens, 150);
        assert_eq!(stats.totals.refused, 1);
        assert_eq!(stats.totals.refused_by.tokens, 1);
        assert!((45..=50).contains(&stats.totals.max_token_debt));
    }

    #[test]
    fn the_in_flight_limit_waits_for_the_first_due() {
        let config = Config {
            latency: Duration::from_millis(700),
            limits: crate::Limits {
                requests_per_second: None,
                tokens_per_second: None,
                max_in_flight: Some(1),
                window_secs: 1,
            },
            ..Config::default()
        };
        let shared = Shared::new(config);
        let Admission::Admitted { cost, due, .. } = shared.admit() else {
            panic!("refused")
        };
        let Admission::Refused { limits, wait, view } = shared.admit() else {
            panic!("admitted")
        };
        assert_eq!(limits, [Limit::InFlight]);
        assert!(wait > Duration::from_millis(500) && wait <= Duration::from_millis(700));
        assert_eq!(
            view,
            View {
                requests: None,
                tokens: None
            }
        );
        shared.complete(cost, due);
        assert!(matches!(shared.admit(), Admission::Admitted { .. }));
        let totals = shared.totals();
        assert_eq!(
            (totals.admitted, totals.completed, totals.refused),
            (2, 1, 1)
        );
        assert_eq!(totals.max_in_flight, 1);
    }
}
