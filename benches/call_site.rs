//! The in-process limiters at an ordinary call site: a plain loop in a
//! function of its own, next to `governor` in the same run, outside the
//! measuring harness of the `local` and `keyed` benchmarks (whose loop is
//! one place the compiler may treat differently from a caller's code).
//!
//! ```text
//! cargo bench -p paceline-benches --bench call_site
//! ```
//!
//! Each case makes `PACELINE_BENCH_CALLS` calls (default 20 000 000) and
//! reports nanoseconds per call; the cases alternate over
//! `PACELINE_BENCH_ROUNDS` rounds (default 5), and the table gives each
//! case's median and the median of the per-round ratios to `governor`.
//! Limiters as in the `local` and `keyed` benchmarks: 10^9 permits a second
//! (every call granted) or one an hour (every call after the first refused),
//! one hot key for the keyed ones.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::Quota;
use paceline::{KeyedRateLimiter, RateLimiter};

#[path = "plain.rs"]
mod plain;
use plain::env;

/// Calls `call` `calls` times; nanoseconds per call.
#[inline(never)]
fn per_call(calls: u64, call: impl Fn() -> bool) -> f64 {
    let start = Instant::now();
    let mut granted = 0u64;
    for _ in 0..calls {
        if black_box(call()) {
            granted += 1;
        }
    }
    black_box(granted);
    start.elapsed().as_nanos() as f64 / calls as f64
}

fn main() {
    let calls = env("PACELINE_BENCH_CALLS", 20_000_000);
    let rounds = env("PACELINE_BENCH_ROUNDS", 5) as usize;
    let fast = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let hourly = Quota::with_period(Duration::from_secs(3600)).unwrap();
    let granted = RateLimiter::bursty(1e9).unwrap();
    let refused = RateLimiter::bursty(1.0 / 3600.0).unwrap();
    let keyed = KeyedRateLimiter::<u64>::bursty(1e9).unwrap();
    let governor_granted = governor::RateLimiter::direct(fast);
    let governor_refused = governor::RateLimiter::direct(hourly);
    let governor_keyed = governor::RateLimiter::keyed(fast);
    let key = 42u64;

    // (case, paceline's call, governor's call)
    type Call<'a> = Box<dyn Fn() -> bool + 'a>;
    let cases: Vec<(&str, Call, Call)> = vec![
        (
            "try_reserve granted",
            Box::new(|| {
                matches!(
                    granted.try_reserve(black_box(1), Duration::ZERO),
                    Ok(Some(_))
                )
            }),
            Box::new(|| governor_granted.check().is_ok()),
        ),
        (
            "try_reserve refused",
            Box::new(|| {
                matches!(
                    refused.try_reserve(black_box(1), Duration::ZERO),
                    Ok(Some(_))
                )
            }),
            Box::new(|| governor_refused.check().is_ok()),
        ),
        (
            "keyed, one hot key",
            Box::new(|| {
                matches!(
                    keyed.try_reserve(black_box(&key), black_box(1), Duration::ZERO),
                    Ok(Some(_))
                )
            }),
            Box::new(|| governor_keyed.check_key(black_box(&key)).is_ok()),
        ),
    ];
    println!("{calls} calls a case, {rounds} rounds, medians:");
    println!();
    plain::compare(rounds, &cases, "ns/call", |call| per_call(calls, call));
}
