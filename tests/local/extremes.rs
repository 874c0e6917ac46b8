//! Extreme input to the builder and the limiter: limits whose numbers
//! underflow or cannot be stored, indices out of range, and a snapshot's
//! numbers on a cold and a warming limiter.

use std::time::Duration;

use paceline::clock::FakeClock;
use paceline::{Error, KeyedRateLimiter, Limit, Local, RateLimiter};

fn build(limit: Limit) -> (Result<RateLimiter<Local, FakeClock>, Error>, FakeClock) {
    let clock = FakeClock::new();
    let built = RateLimiter::builder()
        .limit(limit)
        .clock(clock.clone())
        .build();
    (built, clock)
}

const YEAR: u64 = 365 * 24 * 3600;

/// `Limit::per` with positive permits and a positive period whose quotient
/// underflows to 0 is refused in the limit's own words (it once blamed a
/// `permits_per_second` of 0 the caller never gave).
#[test]
fn a_limit_whose_rate_underflows_is_refused_with_its_own_words() {
    let (built, _) = build(Limit::per(f64::MIN_POSITIVE, Duration::MAX));
    match built {
        Err(Error::InvalidArgument(message)) => assert!(
            !message.contains("permits_per_second") && !message.contains("(got 0)"),
            "the message should speak of the limit's permits and period: {message:?}"
        ),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// `Limit::per(n, period)` promises a burst of the period's whole permits,
/// and an explicit `.burst(n)` that cannot be stored is refused ("a count
/// means what it says"); so is the period's own (it was cut in silence:
/// 10 per 400 years let 8 go at once, 10 per `Duration::MAX` only 1).
#[test]
fn a_limit_over_a_very_long_period_keeps_its_burst_or_is_refused() {
    let period = Duration::from_secs(400 * YEAR);
    // The explicit count is refused ...
    let (explicit, _) = build(Limit::per(10.0, period).burst(10));
    assert!(matches!(explicit, Err(Error::InvalidArgument(_))));
    // ... and so is the same count by default, not cut.
    for period in [period, Duration::MAX] {
        let (built, _) = build(Limit::per(10.0, period));
        match built {
            Err(Error::InvalidArgument(message)) => {
                assert!(
                    message.contains("burst of 10 (its period's permits)"),
                    "{message}"
                );
            }
            other => panic!(
                "10 per {period:?}: {:?}",
                other.map(|l| l.snapshot().unwrap())
            ),
        }
    }
    // A long period whose burst fits is kept whole.
    let (built, _) = build(Limit::per(10.0, Duration::from_secs(200 * YEAR)));
    assert_eq!(built.unwrap().snapshot().unwrap().burst(), 10);
}

/// Pinned: out-of-range and absurd arguments of `set_limit_rate` are clear
/// errors, and extreme `Limit::per` quotients are valid.
#[test]
fn set_limit_rate_out_of_range_and_extreme_quotients() {
    let (limiter, _) = build(Limit::per_second(10.0).burst(1));
    let limiter = limiter.unwrap();
    assert!(matches!(
        limiter.set_limit_rate(usize::MAX, 1.0),
        Err(Error::InvalidArgument(message)) if message.contains("no limit")
    ));
    // A quotient that overflows is an infinite rate: no limit.
    let (huge, _) = build(Limit::per(1e300, Duration::from_nanos(1)));
    assert_eq!(huge.unwrap().rate(), f64::INFINITY);
    // Half a permit a second still lets one go at once.
    let (half, _) = build(Limit::per(0.5, Duration::from_secs(1)));
    assert_eq!(half.unwrap().snapshot().unwrap().burst(), 1);
}

/// Pinned: a cold warming-up limiter reads as full (one request at once,
/// never two), and its numbers after a burst of 5 at 2/s, 4 s warm-up.
#[test]
fn snapshot_of_a_cold_then_warming_limiter() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(2.0)
        .warmup(Duration::from_secs(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    let cold = limiter.snapshot().unwrap();
    assert_eq!((cold.remaining(), cold.burst()), (1, 1));
    assert_eq!(cold.wait_for(1), Some(Duration::ZERO));
    assert_eq!(cold.wait_for(2), None);
    assert_eq!(cold.full_in(), Duration::ZERO);
    limiter.reserve(5).unwrap();
    let warming = limiter.snapshot().unwrap();
    // The 4 permits above the threshold cost the 4 s ramp, one below 0.5 s.
    assert_eq!(warming.wait(), Duration::from_millis(4500));
    assert_eq!(warming.remaining(), 0);
    // Then 5 stored permits to refill at 0.5 s each.
    assert_eq!(warming.full_in(), Duration::from_secs(7));
}

/// A limit at a rate past 10^302 a second builds, as one at 10^302 does:
/// every request goes at once. It was refused for its period's permits,
/// "more than the limiter stores ... at most inf" (the idle time that
/// stores them, `permits × 1e6 / rate`, overflowed on its way).
#[test]
fn a_limit_past_ten_to_the_302_a_second_builds_as_a_slower_one_does() {
    for rate in [1e302, 2e302, 1e305, f64::MAX] {
        for period in [Duration::from_secs(1), Duration::from_secs(3600)] {
            let (built, _) = build(Limit::per(rate, period));
            let limiter = built.unwrap_or_else(|error| panic!("{rate:e} per {period:?}: {error}"));
            let snapshot = limiter.snapshot().unwrap();
            assert_eq!(snapshot.burst(), u64::MAX, "{rate:e} per {period:?}");
            for _ in 0..1000 {
                assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
            }
        }
    }
}

/// A burst of `n` is `n` at once at every rate up to 10^6 a second, a
/// count given or a period's, in one limiter and per key. Between 5 × 10^5
/// and 10^6 a second the idle time that stores `n − 1` permits, rounded up
/// to the microsecond, could leave the `n`th request owing under a
/// microsecond, and one more went at once (999 999/s with a burst of 2
/// stored 1.999998 permits and let 3 go), and a snapshot says so.
#[test]
fn a_burst_of_n_is_n_at_once_up_to_a_million_a_second() {
    let at_once = |most: u32, try_one: &mut dyn FnMut() -> bool| {
        let mut granted = 0;
        while granted <= most && try_one() {
            granted += 1;
        }
        granted
    };
    let mut rates = vec![999_999.0, 700_000.0, 605_172.28, 562_500.0, 500_001.0, 1e6];
    rates.extend((0..240).map(|i| 300_000.0 + f64::from(i) * 2_916.63));
    // Long bursts, whose charges' roundings add up, at a few rates (at
    // 777 777/s a burst of a million let a million and one go).
    rates.push(777_777.0);
    let bursts = |i: usize| match i {
        246 => vec![1_000_000],
        _ if i.is_multiple_of(40) => vec![1, 2, 3, 31, 1000, 20_000],
        _ => (1..=12).collect(),
    };
    for (i, rate) in rates.into_iter().enumerate() {
        for n in bursts(i) {
            for limit in [
                Limit::per_second(rate).burst(u64::from(n)),
                Limit::per(f64::from(n), Duration::from_secs_f64(f64::from(n) / rate)),
            ] {
                let (built, _) = build(limit.clone());
                let one = built.unwrap();
                let full = one.snapshot().unwrap();
                assert_eq!(
                    (full.remaining(), full.burst()),
                    (u64::from(n), u64::from(n)),
                    "{rate}/s, a burst of {n}: the snapshot"
                );
                let granted = at_once(n, &mut || {
                    one.try_reserve(1, Duration::ZERO).unwrap().is_some()
                });
                assert_eq!(granted, n, "{rate}/s, a burst of {n}: one limiter");
                let keyed = KeyedRateLimiter::<u8>::builder()
                    .limit(limit)
                    .clock(FakeClock::new())
                    .build()
                    .unwrap();
                let granted = at_once(n, &mut || {
                    keyed.try_reserve(&7, 1, Duration::ZERO).unwrap().is_some()
                });
                assert_eq!(granted, n, "{rate}/s, a burst of {n}: a key");
            }
        }
    }
}
