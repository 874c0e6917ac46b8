//! Limiters on a `FakeClock`, and helpers that read like a spec:
//! `waits(&limiter, &[1, 1, 1])` acquires each count in turn (sleeping on the
//! fake clock, which moves it) and returns the waits in microseconds.
#![allow(dead_code)]

use std::time::Duration;

use paceline::Local;
use paceline::clock::FakeClock;
use paceline::{Limit, RateLimiter};

/// A bursty limiter (1 s burst) on a fresh fake clock.
pub fn bursty(rate: f64) -> (RateLimiter<Local, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(rate)
        .clock(clock.clone())
        .build()
        .expect("valid bursty limiter");
    (limiter, clock)
}

/// A warming-up limiter on a fresh fake clock.
pub fn warming_up(
    rate: f64,
    warmup: Duration,
    cold_factor: f64,
) -> (RateLimiter<Local, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(
            Limit::per_second(rate)
                .warmup(warmup)
                .cold_factor(cold_factor),
        )
        .clock(clock.clone())
        .build()
        .expect("valid warming-up limiter");
    (limiter, clock)
}

/// Acquires each count in turn with `acquire_blocking`; returns the waits in µs.
pub fn waits(limiter: &RateLimiter<Local, FakeClock>, permits: &[u32]) -> Vec<u64> {
    permits
        .iter()
        .map(|&p| micros(limiter.acquire_blocking(p).expect("valid permits")))
        .collect()
}

/// `n` single-permit acquisitions; returns the waits in µs.
pub fn waits_n(limiter: &RateLimiter<Local, FakeClock>, n: usize) -> Vec<u64> {
    waits(limiter, &vec![1; n])
}

/// A user's pause: advances the fake clock.
pub fn pause_ms(clock: &FakeClock, ms: u64) {
    clock.advance(Duration::from_millis(ms));
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

/// Waits in seconds with two decimals, rounded half up: the format of the
/// published reference values (e.g. "1.38" for 1 375 000 µs).
pub fn rounded(waits: &[u64]) -> String {
    waits
        .iter()
        .map(|&w| format!("{:.2}", (w as f64 / 1e4).round() / 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}
