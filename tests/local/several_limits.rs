//! A local limiter with several limits, on a fake clock: a request waits
//! for the latest limit, every limit is charged, a refused try charges
//! none, a give-back returns it to all of them, and the limiter agrees with
//! the core's `Limits` step by step.

use std::time::Duration;

use crate::support::rng::Rng;
use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::core::{Bursty, Limits, Policy, State};
use paceline::{Error, Limit, RateLimiter};

const MS: Duration = Duration::from_millis(1);

fn two_limits(clock: &FakeClock) -> RateLimiter<Local, FakeClock> {
    // 10 per second with a burst of 3 (2 stored, there at once: a limit
    // starts full), and 3 per minute with a burst of 1 (exact spacing).
    RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(3))
        .limit(Limit::per(3.0, Duration::from_secs(60)).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn the_latest_limit_sets_the_wait_and_every_limit_is_charged() {
    let clock = FakeClock::new();
    let limiter = two_limits(&clock);
    // The first goes at once, the second waits for the per-minute limit
    // (20 s), not the per-second one (whose burst is there).
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_secs(20));
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(40));
    // A minute later the per-minute limit has caught up (its ticket was
    // at 40 s) and stored nothing (no burst): one goes at once, the next
    // waits 20 s.
    clock.advance(Duration::from_secs(60));
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_secs(20));
}

#[test]
fn a_refused_try_charges_no_limit() {
    let clock = FakeClock::new();
    let limiter = two_limits(&clock);
    assert!(limiter.try_reserve(1, Duration::ZERO).unwrap().is_some());
    let before = format!("{limiter:?}");
    assert_eq!(
        limiter.try_reserve(1, Duration::from_secs(19)).unwrap(),
        None
    );
    assert!(!limiter.try_acquire_blocking(1, 19_999 * MS).unwrap());
    assert_eq!(format!("{limiter:?}"), before);
    assert_eq!(
        limiter.try_reserve(1, Duration::from_secs(20)).unwrap(),
        Some(Duration::from_secs(20))
    );
}

#[test]
fn a_dropped_reservation_gives_back_to_every_limit() {
    let clock = FakeClock::new();
    let limiter = two_limits(&clock);
    limiter.reserve(1).unwrap();
    let held = limiter.reservation(1).unwrap();
    assert_eq!(held.delay(), Duration::from_secs(20));
    let after = limiter.reservation(1).unwrap();
    assert_eq!(after.delay(), Duration::from_secs(40));
    clock.advance(Duration::from_secs(5));
    drop(held);
    // The next caller is scheduled as if the dropped one had never been:
    // the one after it still holds 40 s, and the per-minute limit's ticket
    // is back to 40 s, not 60 s.
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(35));
    drop(after);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(15));
}

#[tokio::test(flavor = "current_thread")]
async fn a_timed_out_acquire_gives_back_to_every_limit() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per_second(1.0).burst(1))
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    for _ in 0..20 {
        let timed_out = tokio::time::timeout(MS, limiter.acquire(1)).await;
        assert!(timed_out.is_err());
    }
    // Twenty callers gave up: the debt is one interval of the slow limit
    // at most, not twenty.
    let wait = limiter.snapshot().unwrap().wait();
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
}

#[test]
fn set_rate_scales_every_limit_and_set_limit_rate_one() {
    let clock = FakeClock::new();
    let limiter = two_limits(&clock);
    assert_eq!((limiter.rate(), limiter.slowest_rate()), (10.0, 0.05));
    limiter.set_rate(20.0).unwrap();
    assert_eq!((limiter.rate(), limiter.slowest_rate()), (20.0, 0.1));
    // The per-minute limit doubled too: 6 per minute, 10 s apart.
    limiter.reserve(1).unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_secs(10));
    limiter.set_limit_rate(1, 60.0 / 60.0).unwrap();
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(20));
    assert_eq!((limiter.rate(), limiter.slowest_rate()), (20.0, 1.0));
    assert!(matches!(
        limiter.set_limit_rate(2, 1.0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(limiter.set_limit_rate(0, f64::NAN).is_err());
    assert!(limiter.set_rate(-1.0).is_err());
    assert_eq!(limiter.rate(), 20.0);
}

/// Back up from a tiny rate, the factor that scales the other limits
/// overflows to infinity: the limits then took the rate asked for, not an
/// infinite one (which let every request through).
#[test]
fn set_rate_from_a_tiny_rate_back_up_still_limits() {
    for tiny in [1e-300, f64::from_bits(1)] {
        let clock = FakeClock::new();
        let limiter = two_limits(&clock);
        limiter.set_rate(tiny).unwrap();
        limiter.set_rate(5.0).unwrap();
        assert_eq!(limiter.rate(), 5.0);
        clock.advance(Duration::from_secs(3600));
        let granted = (0..100)
            .filter(|_| limiter.try_reserve(1, Duration::ZERO).unwrap().is_some())
            .count();
        // A burst of 3 at most (the per-minute limit, if it kept its
        // proportion, allows fewer).
        assert!((1..=3).contains(&granted), "{tiny}: {granted} at once");
        let snapshot = limiter.snapshot().unwrap();
        assert!(snapshot.rate().is_finite(), "{tiny}: {snapshot:?}");
    }
}

#[test]
fn bad_limits_are_refused_when_built() {
    for limit in [
        Limit::per_second(0.0),
        Limit::per_second(f64::NAN),
        Limit::per_second(-3.0),
        Limit::per(5.0, Duration::ZERO),
        Limit::per_second(1.0).warmup(MS).cold_factor(0.5),
        // Options of both policies, in either order: refused, not one of
        // them dropped in silence.
        Limit::per_second(1.0).burst(3).warmup(MS),
        Limit::per_second(1.0).warmup(MS).burst(3),
    ] {
        let built = RateLimiter::builder()
            .limit(Limit::per_second(1.0))
            .limit(limit.clone())
            .build();
        assert!(matches!(built, Err(Error::InvalidArgument(_))), "{limit:?}");
    }
    // The message names the limit (counted from 0, the builder's own rate
    // first) and the value as given, not one worked out from it.
    let built = RateLimiter::builder()
        .permits_per_second(1.0)
        .limit(Limit::per(-5.0, Duration::from_secs(60)).named("tokens"))
        .build();
    let Err(Error::InvalidArgument(why)) = built else {
        panic!("{built:?}");
    };
    assert!(why.starts_with("limit 1 (\"tokens\"): "), "{why}");
    assert!(why.contains("(got -5)"), "{why}");
    let shaped_nothing = RateLimiter::builder()
        .max_burst(Duration::from_secs(1))
        .limit(Limit::per_second(1.0))
        .build();
    assert!(matches!(shaped_nothing, Err(Error::InvalidArgument(_))));
    // One limit alone is an ordinary limiter; the builder's own rate is
    // the first of several.
    let one = RateLimiter::builder()
        .limit(Limit::per(60.0, Duration::from_secs(60)))
        .build()
        .unwrap();
    assert_eq!(one.rate(), 1.0);
    let two = RateLimiter::builder()
        .permits_per_second(5.0)
        .limit(Limit::per(100.0, Duration::from_secs(3600)))
        .build()
        .unwrap();
    assert_eq!(two.rate(), 5.0);
}

/// The limiter against the core's `Limits`, call by call: random limits of
/// both kinds, reservations, tries, rate changes and idle gaps.
#[test]
fn the_limiter_agrees_with_the_core_step_by_step() {
    let mut rng = Rng::new(5);
    for _ in 0..100 {
        let clock = FakeClock::new();
        let count = 2 + rng.below(2) as usize;
        let mut builder = RateLimiter::builder().clock(clock.clone());
        let mut states = Vec::new();
        for _ in 0..count {
            let per_second = 1.0 + rng.below(50) as f64;
            let burst = rng.below(5);
            builder = builder.limit(Limit::per_second(per_second).burst(burst + 1));
            // A burst of `burst + 1` stores `burst`: the idle time rounded
            // up to the µs, and one more if that still stores less.
            let mut micros = (burst as f64 * 1e6 / per_second).ceil();
            if micros * per_second / 1e6 < burst as f64 {
                micros += 1.0;
            }
            let micros = micros as u64;
            let policy = Policy::Bursty(Bursty::new(Duration::from_micros(micros)));
            // A limit starts full.
            states.push(State::full(policy, per_second, 0).unwrap());
        }
        let limiter = builder.build().unwrap();
        let mut core = Limits::new(states).unwrap();
        // What the limiter's `set_rate` scales: the rates as built.
        let shape: Vec<f64> = core
            .states()
            .iter()
            .map(|s| s.permits_per_second())
            .collect();
        for _ in 0..200 {
            clock.advance(Duration::from_micros(rng.below(300_000)));
            let now = clock.now_micros();
            let permits = 1 + rng.below(3) as u32;
            match rng.below(5) {
                0 => {
                    let timeout = rng.below(500_000);
                    let got = limiter
                        .try_reserve(permits, Duration::from_micros(timeout))
                        .unwrap();
                    let expected = core.try_reserve(permits, now, timeout, false);
                    assert_eq!(got, expected.map(|g| Duration::from_micros(g.wait_micros)));
                }
                1 => {
                    let factor = [0.5, 2.0][rng.below(2) as usize];
                    let rate = limiter.rate() * factor;
                    limiter.set_rate(rate).unwrap();
                    core.set_first_rate(&shape, rate, now).unwrap();
                }
                _ => {
                    let got = limiter.reserve(permits).unwrap();
                    let expected = core.reserve(permits, now, false);
                    assert_eq!(got, Duration::from_micros(expected.wait_micros));
                }
            }
        }
    }
}

#[test]
fn a_reservation_names_the_limit_it_waits_for() {
    let clock = FakeClock::new();
    let limiter = two_limits(&clock);
    let first = limiter.reservation(1).unwrap();
    assert_eq!(first.limit(), None, "it does not wait");
    first.keep();
    assert_eq!(limiter.reservation(1).unwrap().limit(), Some(1));
    // While the per-minute limit has stored permits, the per-second one
    // binds.
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per(60.0, Duration::from_secs(60)).burst(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.advance(Duration::from_secs(3));
    limiter.reserve(1).unwrap();
    let second = limiter.reservation(1).unwrap();
    assert_eq!((second.delay(), second.limit()), (100 * MS, Some(0)));
    // A limiter with one limit names it for any wait.
    let one = RateLimiter::builder()
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .clock(FakeClock::new())
        .build()
        .unwrap();
    one.reserve(1).unwrap();
    assert_eq!(one.reservation(1).unwrap().limit(), Some(0));
}

/// Above 10^6 permits a second, a wait of whole microseconds lets every
/// request whose ticket lies in the current microsecond go (up to `rate ×
/// 1 µs` of them), burst or not; a burst of `n` adds `n − 1` stored
/// permits to those, no more. Rounding the stored idle time up to the
/// microsecond added a whole microsecond's worth: at 10^9 per second a
/// burst of 5 let 2 000 go at once.
#[test]
fn a_burst_at_a_rate_above_a_permit_a_microsecond_adds_no_more_than_its_own() {
    for rate in [1e6, 1.5e6, 2.5e6, 3e6, 1e7, 3.3e7, 1e8, 1e9] {
        for burst in [1, 2, 3, 5, 20, 1000] {
            let clock = FakeClock::new();
            let limiter = RateLimiter::builder()
                .limit(Limit::per_second(rate).burst(burst))
                .clock(clock.clone())
                .build()
                .unwrap();
            let mut at_once = 0;
            while limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
                at_once += 1;
            }
            let per_micro = (rate / 1e6).ceil() as u64;
            assert!(
                (burst..=burst + per_micro).contains(&at_once),
                "{rate}/s, burst {burst}: {at_once} at once"
            );
        }
    }
}

/// A burst of `n` is `n` requests at once, never `n + 1`: set with
/// `burst(n)`, or a period's whole permits by default; at 5 per second
/// with a burst of 10, 60 in the first 10 s of hammering, no more.
#[test]
fn a_burst_of_n_lets_exactly_n_go_at_once() {
    for (limit, burst) in [
        (Limit::per_second(5.0).burst(10), 10),
        (Limit::per_second(5.0).burst(1), 1),
        (Limit::per_second(5.0), 5),
        (Limit::per(1000.0, Duration::from_secs(3600)), 1000),
        (Limit::per_second(3.0).burst(7), 7),
        (Limit::per(2.5, Duration::from_secs(1)), 2),
    ] {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .limit(limit.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        assert_eq!(limiter.snapshot().unwrap().burst(), burst, "{limit:?}");
        let mut at_once = 0;
        while limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
            at_once += 1;
        }
        assert_eq!(at_once, burst, "{limit:?}");
    }
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(5.0).burst(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut granted = 0;
    while clock.now() < Duration::from_secs(10) {
        if limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
            granted += 1;
        }
        clock.advance(MS);
    }
    // 10 at once, then one every 200 ms from 200 ms to 9.8 s.
    assert_eq!(granted, 10 + 49);
    let zero = RateLimiter::builder()
        .limit(Limit::per_second(5.0).burst(0))
        .build();
    assert!(matches!(zero, Err(Error::InvalidArgument(_))));
}

/// A builder is a template: its clones build limiters of one configuration
/// and separate schedules.
#[test]
fn a_cloned_builder_builds_separate_limiters_alike() {
    let clock = FakeClock::new();
    let template = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(2))
        .limit(Limit::per(30.0, Duration::from_secs(60)))
        .clock(clock.clone());
    let first = template.clone().build().unwrap();
    let second = template.build().unwrap();
    for limiter in [&first, &second] {
        assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
        assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
        assert_eq!(limiter.reserve(1).unwrap(), Duration::from_millis(100));
    }
}

/// A burst is a count that means what it says: one more than the limiter
/// can store (2^53 µs of idle time: 104 250 at one a day) is refused when
/// built, naming the most it stores, where it was cut in silence (a burst
/// of 200 000 a day let 104 250 go at once, then one a day); the most it
/// stores is that many at once.
#[test]
fn a_burst_past_what_the_limiter_stores_is_refused_not_cut() {
    let day = Duration::from_secs(86_400);
    let built = |burst| {
        RateLimiter::builder()
            .limit(Limit::per(1.0, day).burst(burst))
            .clock(FakeClock::new())
            .build()
    };
    match built(200_000) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("at most 104250"), "{why}"),
        other => panic!("a burst of 200 000 a day: {other:?}"),
    }
    let most = built(104_250).unwrap();
    let at_once = (0..110_000)
        .take_while(|_| most.try_reserve(1, Duration::ZERO).unwrap().is_some())
        .count();
    assert_eq!(at_once, 104_250);
}
