//! The arithmetic held to its model, derived here from first principles and
//! not from `paceline::core`: the warming-up curve as a closed form (the
//! area under the price of a stored permit), the bursty bound on any window,
//! requests larger than the burst, rates at the extremes, and a snapshot's
//! numbers against what the limiter then does.
//!
//! Waits are whole microseconds, the ticket finer (`design#exact-at-every-
//! rate`): a moment is the floor of its exact value, so where the exact value
//! is not a whole microsecond the floor of its floating-point sum may be one
//! off. The tolerance is that microsecond, and no more.

use std::time::Duration;

use paceline::clock::{Clock, FakeClock};
use paceline::{Limit, Local, RateLimiter};

use crate::support::fake::{micros, warming_up};
use crate::support::rng::Rng;

/// The warming-up curve in the classic terms: stable and cold intervals
/// (µs), the threshold and the most permits stored.
struct Curve {
    stable: f64,
    cold: f64,
    threshold: f64,
    max: f64,
}

impl Curve {
    fn new(rate: f64, warmup: Duration, cold_factor: f64) -> Curve {
        let stable = 1e6 / rate;
        let warmup = warmup.as_secs_f64() * 1e6;
        let cold = stable * cold_factor;
        let threshold = 0.5 * warmup / stable;
        Curve {
            stable,
            cold,
            threshold,
            max: threshold + 2.0 * warmup / (stable + cold),
        }
    }

    /// The time it takes to spend `stored` permits down to none: the area
    /// under the price line from 0 to `stored` (flat at the stable interval
    /// up to the threshold, rising linearly to the cold interval at `max`).
    fn area(&self, stored: f64) -> f64 {
        let above = (stored - self.threshold).max(0.0);
        let slope = (self.cold - self.stable) / (self.max - self.threshold);
        stored * self.stable + slope * above * above / 2.0
    }

    /// What `permits` cost with `stored` stored: the stored ones at their
    /// price, the rest at the stable interval.
    fn cost(&self, stored: f64, permits: f64) -> f64 {
        let spent = permits.min(stored);
        self.area(stored) - self.area(stored - spent) + (permits - spent) * self.stable
    }
}

fn now(clock: &FakeClock) -> u64 {
    clock.now_micros()
}

/// Acquires `permits` (sleeping on the fake clock) and returns the moment it
/// went.
fn moment(limiter: &RateLimiter<Local, FakeClock>, clock: &FakeClock, permits: u32) -> u64 {
    limiter.acquire_blocking(permits).unwrap();
    now(clock)
}

fn assert_close(got: u64, exact: f64, context: &str) {
    assert!(
        got.abs_diff(exact.floor() as u64) <= 1,
        "{context}: {got} µs, the model says {exact:.3} µs"
    );
}

const CURVES: [(f64, u64, f64); 6] = [
    // (rate, warm-up in ms, cold factor): round ones, and ones whose
    // threshold, max and prices are no whole numbers.
    (2.0, 4_000, 3.0),
    (1.0, 10_000, 3.0),
    (3.0, 7_000, 4.5),
    (0.7, 10_000, 2.0),
    (13.0, 2_345, 7.25),
    (1_000.0, 2_000, 3.0),
];

/// From cold, spending every stored permit takes the warm-up period (the
/// ramp above the threshold) and `threshold × stable` more (the flat part,
/// half the warm-up): 1.5 × the warm-up, whatever the rate and the cold
/// factor. The first request at the stable price goes after exactly the
/// warm-up, once the permits above the threshold are a whole number.
#[test]
fn a_cold_limiter_drains_in_the_warm_up_and_the_flat_part() {
    for (rate, warmup_ms, cold_factor) in CURVES {
        let warmup = Duration::from_millis(warmup_ms);
        let curve = Curve::new(rate, warmup, cold_factor);
        let context = format!("{rate}/s, {warmup_ms} ms, cold factor {cold_factor}");
        let warmup_us = warmup_ms as f64 * 1e3;
        assert!((curve.area(curve.max) - 1.5 * warmup_us).abs() < 1e-6 * warmup_us);
        assert!(
            (curve.area(curve.max) - curve.area(curve.threshold) - warmup_us).abs()
                < 1e-6 * warmup_us
        );
        let (limiter, clock) = warming_up(rate, warmup, cold_factor);
        // Cold: `threshold + 2 × warmup / (stable + cold)` stored.
        let cold = limiter.snapshot().unwrap().stored();
        assert!(
            (cold - curve.max).abs() < 1e-9 * curve.max,
            "{context}: {cold}"
        );
        // Every stored permit and a whole one past them, one request each;
        // the next request goes when the last has been paid for.
        let requests = curve.max.ceil() as u64 + 1;
        for _ in 0..requests {
            moment(&limiter, &clock, 1);
        }
        let drained = moment(&limiter, &clock, 1);
        let exact = curve.area(curve.max) + (requests as f64 - curve.max) * curve.stable;
        assert_close(drained, exact, &context);
        // Warm now: one permit per stable interval.
        let next = moment(&limiter, &clock, 1);
        assert_close(next - drained, curve.stable, &context);
        // And cold again a warm-up after the debt is paid: idle time stores
        // `max / warmup` permits a microsecond.
        let warm = limiter.snapshot().unwrap();
        assert_eq!(warm.stored(), 0.0, "{context}");
        let cool_down = micros(warm.full_in() - warm.wait());
        assert!(
            cool_down.abs_diff(warmup_ms * 1_000) <= 1,
            "{context}: {cool_down}"
        );
    }
    // Where the ramp holds a whole number of permits, the stable rate starts
    // after exactly the warm-up: 2/s, 4 s, factor 3 (ramp of 4 permits).
    let (limiter, clock) = warming_up(2.0, Duration::from_secs(4), 3.0);
    let moments: Vec<u64> = (0..6).map(|_| moment(&limiter, &clock, 1)).collect();
    assert_eq!(moments[4], 4_000_000);
    assert_eq!(moments[5] - moments[4], 500_000);
}

/// The `n`th request of a cold start goes when the `n − 1` before it have
/// paid their stored permits: `area(max) − area(max − (n − 1))`, for every
/// `n` up to the warm rate and past it.
#[test]
fn the_nth_wait_of_a_cold_start_is_the_area_it_has_spent() {
    for (rate, warmup_ms, cold_factor) in CURVES {
        let curve = Curve::new(rate, Duration::from_millis(warmup_ms), cold_factor);
        let (limiter, clock) = warming_up(rate, Duration::from_millis(warmup_ms), cold_factor);
        let start = now(&clock);
        for n in 1..=(curve.max.ceil() as u64 + 5) {
            let got = moment(&limiter, &clock, 1) - start;
            let exact = curve.cost(curve.max, (n - 1) as f64);
            let context = format!("{rate}/s, {warmup_ms} ms, {cold_factor}: request {n}");
            assert_close(got, exact, &context);
        }
    }
    // In larger requests: each pays for what the one before it took.
    let curve = Curve::new(3.0, Duration::from_millis(7_000), 4.5);
    let (limiter, clock) = warming_up(3.0, Duration::from_millis(7_000), 4.5);
    let mut taken = 0.0;
    for permits in [5, 1, 7, 2, 9, 3] {
        let got = moment(&limiter, &clock, permits);
        assert_close(got, curve.cost(curve.max, taken), &format!("after {taken}"));
        taken += f64::from(permits);
    }
}

/// A warm limiter idle for part of the warm-up stores that part of its most
/// permits (cooling down from none to `max` takes the warm-up), and spends
/// them at the curve's price: below the threshold at the stable price, above
/// it dearer. From a limiter half warmed up, the idle time adds to what it
/// still stores.
#[test]
fn a_warming_up_limiter_idle_for_part_of_the_cool_down() {
    // 1/s, 10 s warm-up, factor 3: threshold 5, max 10, one permit stored
    // per second idle; exact in binary, so no tolerance is needed.
    let curve = Curve::new(1.0, Duration::from_secs(10), 3.0);
    assert_eq!((curve.threshold, curve.max), (5.0, 10.0));
    for idle_ms in [1_000, 2_500, 5_000, 6_000, 7_300, 9_999, 10_000, 25_000] {
        let (limiter, clock) = warming_up(1.0, Duration::from_secs(10), 3.0);
        // Warm: every stored permit spent, and the debt of the last repaid.
        for _ in 0..12 {
            moment(&limiter, &clock, 1);
        }
        clock.advance(limiter.snapshot().unwrap().wait());
        assert_eq!(limiter.snapshot().unwrap().stored(), 0.0);
        clock.advance(Duration::from_millis(idle_ms));
        let stored = (idle_ms as f64 / 1_000.0).min(curve.max);
        assert_eq!(limiter.snapshot().unwrap().stored(), stored, "{idle_ms} ms");
        let start = now(&clock);
        for n in 1..=12u32 {
            let got = moment(&limiter, &clock, 1) - start;
            let exact = curve.cost(stored, f64::from(n - 1));
            assert_eq!(got as f64, exact.floor(), "{idle_ms} ms idle, request {n}");
        }
    }
    // Half warmed up: 3 of the 10 stored permits spent, then 1.5 s idle
    // (1.5 permits back): 8.5 stored, each then at its place on the ramp.
    let (limiter, clock) = warming_up(1.0, Duration::from_secs(10), 3.0);
    for _ in 0..3 {
        moment(&limiter, &clock, 1);
    }
    clock.advance(limiter.snapshot().unwrap().wait());
    clock.advance(Duration::from_millis(1_500));
    assert_eq!(limiter.snapshot().unwrap().stored(), 8.5);
    let start = now(&clock);
    for n in 1..=10u32 {
        let got = moment(&limiter, &clock, 1) - start;
        assert_eq!(
            got as f64,
            curve.cost(8.5, f64::from(n - 1)).floor(),
            "request {n}"
        );
    }
}

/// A bursty limiter grants, over any window between two grants, at most
/// `rate × window + max_permits` permits before the last one (the last one
/// goes at the window's end whatever its size: the next caller pays). With
/// one permit a request that is `rate × window + burst`. Random sizes,
/// gaps, tries and rates; one limit and two.
#[test]
fn a_bursty_limiter_never_grants_more_than_the_rate_and_the_burst_in_any_window() {
    let mut rng = Rng::new(0x0b0b_5e77);
    for case in 0..400 {
        let rates = [0.5, 3.0, 7.0, 10.0, 333.0, 1e4, 4e5];
        let limits: Vec<(f64, u64)> = (0..1 + rng.below(2))
            .map(|_| (*rng.pick(&rates), 1 + rng.below(40)))
            .collect();
        let clock = FakeClock::new();
        let mut builder = RateLimiter::builder().clock(clock.clone());
        for &(rate, burst) in &limits {
            builder = builder.limit(Limit::per_second(rate).burst(burst));
        }
        let limiter = builder.build().unwrap();
        let mut grants: Vec<(u64, u32)> = Vec::new();
        for _ in 0..120 {
            clock.advance(Duration::from_micros(match rng.below(4) {
                0 => 0,
                1 => rng.below(10),
                2 => rng.below(400_000),
                _ => rng.below(5_000_000),
            }));
            let permits = *rng.pick(&[1, 1, 1, 2, 7, 40]);
            let at = now(&clock);
            if rng.chance(0.3) {
                let timeout = Duration::from_micros(*rng.pick(&[0, 1, 1_000, 100_000]));
                if let Some(wait) = limiter.try_reserve(permits, timeout).unwrap() {
                    grants.push((at + micros(wait), permits));
                }
            } else {
                let wait = limiter.reserve(permits).unwrap();
                grants.push((at + micros(wait), permits));
            }
        }
        grants.sort_by_key(|g| g.0);
        for &(rate, burst) in &limits {
            for a in 0..grants.len() {
                let mut before_last = 0.0;
                for b in a + 1..grants.len() {
                    before_last += f64::from(grants[b - 1].1);
                    let window = (grants[b].0 - grants[a].0) as f64;
                    // Moments are whole µs, floors of the ticket: one µs of
                    // slack at each end.
                    let most = rate * (window + 2.0) / 1e6 + (burst - 1) as f64 + 1e-9;
                    assert!(
                        before_last <= most,
                        "case {case}, {rate}/s burst {burst}: {before_last} permits \
                         before the last in [{}, {}] µs, at most {most}",
                        grants[a].0,
                        grants[b].0
                    );
                }
            }
        }
    }
}

/// A request larger than the burst goes at once on an idle limiter and the
/// next caller pays what it took past the stored permits; over the window
/// that ends when it is paid, the grants are the rate's and the burst's.
#[test]
fn a_request_larger_than_the_burst_goes_at_once_and_the_next_caller_pays() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(11))
        .clock(clock.clone())
        .build()
        .unwrap();
    // Full: 10 stored. 25 go at once; 15 are fresh, 1.5 s for the next.
    assert_eq!(limiter.reserve(25).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.acquire_blocking(1).unwrap(),
        Duration::from_millis(1_500)
    );
    assert_eq!(
        limiter.acquire_blocking(1).unwrap(),
        Duration::from_millis(100)
    );
    // 26 in [0, 1.5 s]: 10 stored + 15 of the rate + the one at the end.

    // Cold, warming up: 20 permits at once, past the 10 stored (1/s, 10 s,
    // factor 3): the ramp (10 s), the flat part (5 s), 10 fresh (10 s).
    let (limiter, clock) = warming_up(1.0, Duration::from_secs(10), 3.0);
    assert_eq!(limiter.reserve(20).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.acquire_blocking(1).unwrap(),
        Duration::from_secs(25)
    );
    assert_eq!(now(&clock), 25_000_000);
    assert_eq!(limiter.acquire_blocking(1).unwrap(), Duration::from_secs(1));
    // Bigger than u32 permits cannot be: u32::MAX at 1/s is 136 years owed,
    // exactly.
    let (limiter, _) = warming_up(1.0, Duration::from_secs(10), 3.0);
    limiter.reserve(u32::MAX).unwrap();
    let owed = 15_000_000 + (u64::from(u32::MAX) - 10) * 1_000_000;
    assert_eq!(micros(limiter.snapshot().unwrap().wait()), owed);
}

/// Rates at the extremes, and a change between them: 10^-6 a second (a
/// permit in 11.6 days) and 10^9 a second (a permit in a picosecond).
#[test]
fn rates_at_the_extremes_and_a_change_between_them() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(1e-6)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_secs(1_000_000));
    assert_eq!(limiter.reserve(3).unwrap(), Duration::from_secs(2_000_000));
    assert_eq!(
        micros(limiter.snapshot().unwrap().wait()),
        5_000_000_000_000
    );

    // 10^9 a second, 10^6 permits a request: 10^9 in 999 999 to 1 000 001 µs.
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(1e9)
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..1_000 {
        limiter.acquire_blocking(1_000_000).unwrap();
    }
    let took = micros(limiter.snapshot().unwrap().wait()) + now(&clock);
    assert!(took.abs_diff(1_000_000) <= 1, "{took} µs");

    // Idle a second at 10^9 a second: a burst of 10^9 stored. Down to 10^-6,
    // the same fraction of the new most (10^-6 permits); the one request
    // that goes pays the rest of its permit at the new rate.
    clock.advance(Duration::from_secs(3));
    let stored = limiter.snapshot().unwrap();
    assert_eq!(stored.stored(), 1e9);
    limiter.set_rate(1e-6).unwrap();
    assert_eq!(limiter.snapshot().unwrap().stored(), 1e-6);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    let owed = micros(limiter.snapshot().unwrap().wait());
    assert!(owed.abs_diff(999_999_000_000) <= 1, "{owed}");
    // Back up to 10^9: the debt, charged at 10^-6, stays (the next caller
    // repays the last request at its rate); then 10^9 a second again.
    limiter.set_rate(1e9).unwrap();
    assert_eq!(micros(limiter.snapshot().unwrap().wait()), owed);
    clock.advance(Duration::from_micros(owed));
    let start = now(&clock);
    for _ in 0..1_000 {
        limiter.acquire_blocking(1_000_000).unwrap();
    }
    let took = micros(limiter.snapshot().unwrap().wait()) + now(&clock) - start;
    assert!(took.abs_diff(1_000_000) <= 1, "{took} µs");
}

/// What a snapshot says against what the limiter does next, on random
/// states of both policies: `wait` is the next request's wait, `remaining`
/// how many go at once, `wait_for(n)` the moment `n` go at once (never
/// before, and at most 2 µs after the first such: it rounds the idle time
/// up, and does not count the request that owes under a microsecond, which
/// `remaining` does), and
/// `full_in` the moment the limiter is full again (to the microsecond).
#[test]
fn a_snapshot_says_what_the_limiter_does_next() {
    let mut rng = Rng::new(0x5a9_5407);
    for case in 0..600 {
        let rate = *rng.pick(&[0.3, 1.0, 3.0, 7.0, 10.0, 333.0, 1e3, 3e4]);
        let mut one_limit = |rate: f64| {
            if rng.chance(0.5) {
                Limit::per_second(rate).burst(1 + rng.below(30))
            } else {
                Limit::per_second(rate)
                    .warmup(Duration::from_micros(
                        *rng.pick(&[1, 777, 100_000, 3_333_333]),
                    ))
                    .cold_factor(*rng.pick(&[1.0, 3.0, 7.5]))
            }
        };
        let mut limits = vec![one_limit(rate)];
        if case % 3 == 0 {
            limits.push(one_limit(rate / 7.0));
        }
        let limit = &limits;
        let build = || {
            let clock = FakeClock::new();
            let mut builder = RateLimiter::builder().clock(clock.clone());
            for limit in limit {
                builder = builder.limit(limit.clone());
            }
            (builder.build().unwrap(), clock)
        };
        // The history, replayed on a fresh limiter for each question.
        let history: Vec<(u64, u32)> = (0..rng.below(20))
            .map(|_| (rng.below(2_000_000), *rng.pick(&[1, 1, 2, 5])))
            .collect();
        let idle = rng.below(3_000_000);
        let at = |extra: u64| {
            let (limiter, clock) = build();
            for &(gap, permits) in &history {
                clock.advance(Duration::from_micros(gap));
                limiter.reserve(permits).unwrap();
            }
            clock.advance(Duration::from_micros(idle + extra));
            (limiter, clock)
        };
        let (limiter, _) = at(0);
        let snapshot = limiter.snapshot().unwrap();
        let context = format!("case {case}: {limit:?}, {history:?}, idle {idle}: {snapshot:?}");
        let at_once = |limiter: &RateLimiter<Local, FakeClock>| {
            let mut n = 0;
            while n <= 100 && limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
                n += 1;
            }
            n
        };
        assert_eq!(limiter.reserve(1).unwrap(), snapshot.wait(), "{context}");
        assert_eq!(at_once(&at(0).0), snapshot.remaining(), "{context}");
        // Up to the smallest burst of the limits (where `wait_for` ends).
        for n in 1..=snapshot.burst().min(30) {
            let Some(wait) = snapshot.wait_for(n).map(micros) else {
                assert!(limit.len() > 1, "{context}: wait_for({n}) within the burst");
                break;
            };
            assert!(
                at_once(&at(wait).0) >= n,
                "{context}: wait_for({n}) = {wait}"
            );
            if wait > 2 {
                assert!(
                    at_once(&at(wait - 3).0) < n,
                    "{context}: wait_for({n}) = {wait}"
                );
            }
        }
        assert_eq!(snapshot.wait_for(snapshot.burst() + 1), None, "{context}");
        let full_in = micros(snapshot.full_in());
        let (limiter, _) = at(full_in + 1);
        let full = limiter.snapshot().unwrap();
        assert_eq!(
            (full.wait(), full.remaining()),
            (Duration::ZERO, full.burst()),
            "{context}"
        );
        assert!(
            full.full_in() <= Duration::from_micros(1),
            "{context}: {full:?}"
        );
        if full_in > 1 {
            let (limiter, _) = at(full_in - 2);
            assert!(
                limiter.snapshot().unwrap().full_in() > Duration::ZERO,
                "{context}"
            );
        }
    }
}

/// The warming-up curve at the extreme rates: at 10^9 a second (10^9
/// permits stored cold, spent a million a request) each moment is the
/// curve's, to the microsecond; a warm limiter changed to 10^-6 a second
/// cools down in the warm-up as any other (a second idle stores its most,
/// 10^-6 permits), and its first request pays the ramp, the flat part and
/// the rest of its permit fresh: 1.5 s + 999 999 s.
#[test]
fn the_warm_up_curve_at_the_extreme_rates() {
    let curve = Curve::new(1e9, Duration::from_secs(1), 3.0);
    let (limiter, clock) = warming_up(1e9, Duration::from_secs(1), 3.0);
    for n in 0..1_100u32 {
        let got = moment(&limiter, &clock, 1_000_000);
        assert_close(
            got,
            curve.cost(curve.max, f64::from(n) * 1e6),
            &format!("chunk {n}"),
        );
    }
    clock.advance(limiter.snapshot().unwrap().wait());
    limiter.set_rate(1e-6).unwrap();
    clock.advance(Duration::from_secs(1));
    let cold = limiter.snapshot().unwrap();
    assert_eq!((cold.stored(), cold.wait()), (1e-6, Duration::ZERO));
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_micros(1_000_000_500_000)
    );

    // Cold at 10^-6 a second with an hour's warm-up: 0.0036 permits stored,
    // the first request's permit costs 1.5 h and 0.9964 of 10^6 s.
    let (limiter, _) = warming_up(1e-6, Duration::from_secs(3600), 3.0);
    assert_eq!(limiter.acquire_blocking(1).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.acquire_blocking(1).unwrap(),
        Duration::from_secs(1_001_800)
    );
    assert_eq!(
        limiter.acquire_blocking(1).unwrap(),
        Duration::from_secs(1_000_000)
    );
}
