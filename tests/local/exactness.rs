//! The achieved rate of a saturated limiter is exact at every rate: each
//! reservation's cost is carried to 2^-20 µs, so waits rounded to whole
//! microseconds never let the schedule drift.
//!
//! A saturated limiter on a `FakeClock`: every reservation is made at the
//! moment the previous one's wait ends (the clock is advanced by each wait),
//! 100 000 times. After a warm-up stretch (the first tenth, which covers a
//! cold warming-up limiter's ramp), the time from one reservation to the
//! last must be the permits reserved in between at the stable rate, within
//! 0.01%. (With whole-microsecond costs, 1.5·10^6 permits/s did not limit at
//! all and 10^9 permits/s in chunks of 1 500 ran 50% fast.)
//!
//! Such schedules through the Redis script, which mirrors the core bit for
//! bit, are checked in `tests/redis/exactness.rs` (its own rows, with the
//! missing-key reading as the start).

use crate::support::fake;

use std::time::Duration;

use fake::micros;
use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::{KeyedRateLimiter, RateLimiter};

/// Reservations per run.
const N: u64 = 100_000;
/// Reservations before the measured stretch.
const WARM: u64 = N / 10;
/// The largest relative error allowed: 0.01%.
const TOLERANCE: f64 = 1e-4;

/// Rates for one permit per reservation.
const SINGLE_PERMIT_RATES: [f64; 5] = [3e4, 1.5e5, 3e5, 1.5e6, 1e7];
/// Rates for chunks of 64 and 1 500 permits: every decade up to 10^9/s,
/// and rates whose intervals are no whole number of microseconds.
const CHUNK_RATES: [f64; 12] = [
    3.0, 7e2, 3e4, 1.5e5, 3e5, 1e6, 1.5e6, 1e7, 6.4e7, 1e8, 3.3e8, 1e9,
];

/// The rows of the table: (rate, permits per reservation).
fn rows() -> Vec<(f64, u32)> {
    let single = SINGLE_PERMIT_RATES.iter().map(|&rate| (rate, 1));
    let chunks = CHUNK_RATES
        .iter()
        .flat_map(|&rate| [(rate, 64), (rate, 1_500)]);
    single.chain(chunks).collect()
}

/// Runs `n` saturated reservations of `permits` through `reserve` (which
/// reserves and returns the wait), advancing `clock` by each wait; returns
/// the clock's reading (µs) at each of the two marks: after `warm`
/// reservations and after all `n`.
fn saturate(
    clock: &FakeClock,
    warm: u64,
    n: u64,
    mut reserve: impl FnMut() -> Duration,
) -> (u64, u64) {
    let mut mark = 0;
    for i in 0..n {
        clock.advance(reserve());
        if i + 1 == warm {
            mark = micros(clock.now());
        }
    }
    (mark, micros(clock.now()))
}

/// Checks that `elapsed` µs is what `reservations` of `permits` take at
/// `rate`, within [`TOLERANCE`].
fn check(what: &str, rate: f64, permits: u32, reservations: u64, elapsed: u64) {
    let expected = reservations as f64 * f64::from(permits) / rate * 1e6;
    let error = (elapsed as f64 - expected) / expected;
    assert!(
        error.abs() <= TOLERANCE,
        "{what}: {reservations} × {permits} permits at {rate}/s took {elapsed} µs, \
         expected {expected:.1} µs ({:+.4}%)",
        error * 100.0
    );
}

/// A limiter of the given kind on a fresh fake clock.
fn local(rate: f64, warmup: Option<Duration>) -> (RateLimiter<Local, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let builder = RateLimiter::builder()
        .permits_per_second(rate)
        .clock(clock.clone());
    let limiter = match warmup {
        None => builder.max_burst(Duration::ZERO).build(),
        Some(warmup) => builder.warmup(warmup).build(),
    };
    (limiter.unwrap(), clock)
}

#[test]
fn a_saturated_bursty_limiter_achieves_its_rate_at_every_rate() {
    for (rate, permits) in rows() {
        let (limiter, clock) = local(rate, None);
        let (mark, end) = saturate(&clock, WARM, N, || limiter.reserve(permits).unwrap());
        check("bursty", rate, permits, N - WARM, end - mark);
    }
}

#[test]
fn a_saturated_warming_up_limiter_achieves_its_rate_at_every_rate() {
    for (rate, permits) in rows() {
        // A warm-up of 1 000 reservations' worth, so that the ramp from
        // cold ends well within the first tenth.
        let warmup = Duration::from_secs_f64(1_000.0 * f64::from(permits) / rate);
        let (limiter, clock) = local(rate, Some(warmup));
        let (mark, end) = saturate(&clock, WARM, N, || limiter.reserve(permits).unwrap());
        check("warming-up", rate, permits, N - WARM, end - mark);
    }
}

#[test]
fn the_rate_is_exact_after_a_rate_change() {
    for (rate, permits) in rows() {
        for warmup in [None, Some(Duration::from_millis(1))] {
            let (limiter, clock) = local(rate, warmup);
            saturate(&clock, 1, N / 2, || limiter.reserve(permits).unwrap());
            // Two thirds of the rate from here: the next caller still repays
            // the last reservation at the old rate, then the new one holds.
            let new_rate = rate * 2.0 / 3.0;
            limiter.set_rate(new_rate).unwrap();
            let (mark, end) = saturate(&clock, 10, N / 2, || limiter.reserve(permits).unwrap());
            check("after set_rate", new_rate, permits, N / 2 - 10, end - mark);
        }
    }
}

#[test]
fn a_saturated_key_achieves_its_rate_at_every_rate() {
    for (rate, permits) in rows() {
        let clock = FakeClock::new();
        let limiter = KeyedRateLimiter::<u32, _>::builder()
            .permits_per_second(rate)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap();
        let (mark, end) = saturate(&clock, WARM, N, || limiter.reserve(&7, permits).unwrap());
        check("keyed", rate, permits, N - WARM, end - mark);
        // Another key, untouched meanwhile, starts afresh.
        assert_eq!(limiter.reserve(&8, permits).unwrap(), Duration::ZERO);
    }
}

/// The one rounding left: each cost to the nearest 2^-20 µs. A nanosecond
/// is 1 048.576 units, charged as 1 049: single permits at 10^9/s run
/// 0.04% slow, and never fast.
#[test]
fn single_permits_at_a_billion_per_second_are_rounded_to_the_unit() {
    let (limiter, clock) = local(1e9, None);
    let (mark, end) = saturate(&clock, WARM, N, || limiter.reserve(1).unwrap());
    let expected = (N - WARM) as f64 / 1e9 * 1e6;
    let error = (end - mark) as f64 / expected - 1.0;
    assert!((0.0..0.0005).contains(&error), "{:+.4}%", error * 100.0);
}

/// What the exactness is for: a rate that whole microseconds could not
/// limit at all (a permit every 0.67 µs) is held, and the ticket's fraction
/// is what carries it.
#[test]
fn a_rate_above_one_permit_per_microsecond_limits() {
    let (limiter, clock) = local(1.5e6, None);
    let waits: Vec<u64> = (0..7)
        .map(|_| micros(limiter.reserve(1).unwrap()))
        .collect();
    // 0, 2/3, 4/3, 2, 8/3, 10/3, 4 µs, each rounded down to what the clock
    // can sleep.
    assert_eq!(waits, [0, 0, 1, 2, 2, 3, 4]);
    assert_eq!(micros(clock.now()), 0);
}
