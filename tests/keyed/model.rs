//! What every key of a keyed limiter must behave as: its own core
//! `Limits`, started full.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::rng::Rng;
use paceline::Local;
use paceline::clock::FakeClock;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};
use paceline::{KeyedRateLimiter, Limit};

/// A configuration for both sides of the differential test.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Config {
    Bursty { burst: Duration },
    WarmingUp { warmup: Duration, cold_factor: f64 },
}

impl Config {
    pub(crate) fn random(rng: &mut Rng) -> Config {
        if rng.chance(0.5) {
            Config::Bursty {
                burst: Duration::from_millis(rng.below(3000)),
            }
        } else {
            Config::WarmingUp {
                warmup: Duration::from_millis(1 + rng.below(3000)),
                cold_factor: 1.0 + 4.0 * rng.f64(),
            }
        }
    }

    pub(crate) fn limiter(
        &self,
        rate: f64,
        clock: &FakeClock,
    ) -> KeyedRateLimiter<u32, Local, FakeClock> {
        let builder = KeyedRateLimiter::<u32>::builder().clock(clock.clone());
        match *self {
            Config::Bursty { burst } => builder.permits_per_second(rate).max_burst(burst),
            Config::WarmingUp {
                warmup,
                cold_factor,
            } => builder.limit(
                Limit::per_second(rate)
                    .warmup(warmup)
                    .cold_factor(cold_factor),
            ),
        }
        .build()
        .expect("a valid configuration")
    }

    /// The core state of a key first seen at `now`: full.
    pub(crate) fn full_state(&self, rate: f64, now: u64) -> State {
        let policy = match *self {
            Config::Bursty { burst } => Policy::Bursty(Bursty::new(burst)),
            Config::WarmingUp {
                warmup,
                cold_factor,
            } => Policy::WarmingUp(WarmingUp::new(warmup, cold_factor)),
        };
        State::full(policy, rate, now).expect("a valid rate")
    }
}

/// One independent core limiter per key (the core's `Limits` of one
/// limit), created full at first use, whose log makes its give-backs exact:
/// what the keyed limiter must behave as.
pub(crate) struct Model {
    pub(crate) config: Config,
    pub(crate) rate: f64,
    pub(crate) keys: HashMap<u32, Limits>,
}

impl Model {
    /// The limits of `key`.
    pub(crate) fn key(&mut self, key: u32, now: u64) -> &mut Limits {
        let (config, rate) = (self.config, self.rate);
        self.keys
            .entry(key)
            .or_insert_with(|| Limits::new(vec![config.full_state(rate, now)]).unwrap())
    }

    /// What a request of `key` made at `now` would wait (none for a key
    /// never seen).
    pub(crate) fn debt(&self, key: u32, now: u64) -> u64 {
        self.keys
            .get(&key)
            .map_or(0, |limits| limits.earliest(now).0 - now)
    }

    /// Changes every key's rate, as the limiter does: a rate change empties
    /// the logs.
    pub(crate) fn set_rate(&mut self, rate: f64, now: u64) {
        for limits in self.keys.values_mut() {
            limits.set_rate(None, rate, now).unwrap();
        }
        self.rate = rate;
    }
}
