//! Changing the rate of a live limiter, on a fake clock.

use crate::support::fake;

use std::time::Duration;

use fake::{bursty, pause_ms, rounded, waits, waits_n, warming_up};
use paceline::{Error, Limit};

#[test]
fn the_old_debt_is_repaid_at_the_old_rate() {
    // Published: R0.00, R1.00, (rate 2) R1.00, R0.50, R1.00, R2.00.
    let (limiter, _) = bursty(1.0);
    assert_eq!(waits(&limiter, &[1, 1]), [0, 1_000_000]);
    limiter.set_rate(2.0).unwrap();
    assert_eq!(limiter.rate(), 2.0);
    assert_eq!(
        waits(&limiter, &[1, 2, 4, 1]),
        [1_000_000, 500_000, 1_000_000, 2_000_000]
    );
}

#[test]
fn warming_up_keeps_the_same_areas_at_a_new_rate() {
    // Published: R0.00, R1.38, R1.13, R0.88, R0.63, R0.50, R0.50, R0.50 / U4.50 /
    // R0.00, R1.38, R1.13 / (rate 4) R0.88 / R0.34, R0.28, R0.25, R0.25 / U4.25 /
    // R0.00, R0.72, R0.66, R0.59, R0.53, R0.47, R0.41, R0.34, R0.28, R0.25, R0.25.
    let (limiter, clock) = warming_up(2.0, Duration::from_secs(4), 3.0);
    waits_n(&limiter, 8);
    pause_ms(&clock, 4500);
    assert_eq!(waits_n(&limiter, 3), [0, 1_375_000, 1_125_000]);
    limiter.set_rate(4.0).unwrap();
    assert_eq!(waits_n(&limiter, 1), [875_000], "the debt of the old rate");
    let after = waits_n(&limiter, 4);
    assert_eq!(rounded(&after), "0.34, 0.28, 0.25, 0.25");
    pause_ms(&clock, 4250);
    let cold = waits_n(&limiter, 11);
    assert_eq!(
        rounded(&cold),
        "0.00, 0.72, 0.66, 0.59, 0.53, 0.47, 0.41, 0.34, 0.28, 0.25, 0.25"
    );
    assert_eq!(
        &cold[7..],
        &after[..],
        "the tail of a cold start matches #5"
    );
}

#[test]
fn stored_permits_are_rescaled_to_the_new_burst() {
    let (limiter, clock) = bursty(10.0);
    pause_ms(&clock, 500); // 5 of 10 stored: half full
    limiter.set_rate(2.0).unwrap(); // half of the new max (2) = 1 stored
    assert_eq!(waits_n(&limiter, 3), [0, 0, 500_000]);
}

#[test]
fn a_faster_rate_rescales_stored_permits_up() {
    let (limiter, clock) = bursty(2.0);
    pause_ms(&clock, 10_000); // full: 2 of 2
    limiter.set_rate(10.0).unwrap(); // full: 10 of 10
    // 10 stored permits, then one fresh one whose cost the 12th request pays.
    let w = waits_n(&limiter, 12);
    assert!(w[..11].iter().all(|&w| w == 0), "{w:?}");
    assert_eq!(w[11], 100_000);
}

#[test]
fn idle_time_before_the_change_is_credited_at_the_old_rate() {
    let (limiter, clock) = bursty(1.0);
    pause_ms(&clock, 500); // 0.5 of 1 stored
    limiter.set_rate(100.0).unwrap(); // 50 of 100
    let w = waits_n(&limiter, 52);
    assert!(w[..51].iter().all(|&w| w == 0), "{w:?}");
    assert_eq!(w[51], 10_000);
}

#[test]
fn a_rejected_rate_leaves_the_limiter_unchanged() {
    let (limiter, _) = bursty(5.0);
    waits_n(&limiter, 2);
    let before = limiter.snapshot().unwrap().wait();
    for bad in [0.0, -0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
        let err = limiter.set_rate(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad}: {err}");
        assert!(err.to_string().contains("permits_per_second"), "{err}");
    }
    assert_eq!(limiter.rate(), 5.0);
    assert_eq!(limiter.snapshot().unwrap().wait(), before);
    // The two acquisitions slept 200 ms; the ticket is at 400 ms.
    assert_eq!(waits_n(&limiter, 1), [200_000]);
}

#[test]
fn infinite_rate_bursty() {
    // Published: R0.00 x3 at +inf; rate 2: R0.00, R0.00, R0.00, R0.50, R0.50;
    // back to +inf: R0.50, R0.00, R0.00.
    let (limiter, _) = bursty(f64::INFINITY);
    assert_eq!(
        waits(&limiter, &[u32::MAX / 4, u32::MAX / 2, u32::MAX]),
        [0, 0, 0]
    );
    limiter.set_rate(2.0).unwrap();
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 500_000, 500_000]);
    limiter.set_rate(f64::INFINITY).unwrap();
    assert_eq!(waits_n(&limiter, 3), [500_000, 0, 0]);
}

#[test]
fn infinite_rate_bursty_after_time_elapsed() {
    let (limiter, clock) = bursty(f64::INFINITY);
    pause_ms(&clock, 1000);
    limiter.set_rate(2.0).unwrap();
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 500_000, 500_000]);
}

#[test]
fn infinite_rate_warming_up_leaves_the_limiter_warm() {
    // Published: R0.00 x3; rate 1: R0.00, R1.00, R1.00; back to +inf: R1.00, R0.00, R0.00.
    let (limiter, clock) = warming_up(f64::INFINITY, Duration::from_secs(10), 3.0);
    assert_eq!(
        waits(&limiter, &[u32::MAX / 4, u32::MAX / 2, u32::MAX]),
        [0, 0, 0]
    );
    limiter.set_rate(1.0).unwrap();
    assert_eq!(waits_n(&limiter, 3), [0, 1_000_000, 1_000_000]);
    limiter.set_rate(f64::INFINITY).unwrap();
    assert_eq!(waits_n(&limiter, 3), [1_000_000, 0, 0]);
    pause_ms(&clock, 1000);
    limiter.set_rate(1.0).unwrap();
    assert_eq!(
        waits_n(&limiter, 5),
        [0, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
    );
}

#[test]
fn bursts_never_exceed_one_second_of_work_across_rate_changes() {
    // Whatever the rate history, a burst is at most `rate` permits (1 s of work).
    let (limiter, clock) = bursty(1.0);
    for rate in [1000.0, 1.0, 10.0, 1_000_000.0, 10.0, 1.0] {
        pause_ms(&clock, (rate * 1000.0) as u64);
        limiter.set_rate(rate).unwrap();
        let n = rate as usize;
        let burst: u64 = waits_n(&limiter, n).iter().sum();
        assert!(burst <= 1_000_000, "rate {rate}: burst took {burst} µs");
        let after: u64 = waits_n(&limiter, n + 1).iter().sum();
        assert!(
            after >= 1_000_000,
            "rate {rate}: after the burst took {after} µs"
        );
    }
}

#[test]
fn a_limits_burst_spans_the_same_time_at_a_new_rate() {
    // A burst is counted at the rate a limit is built with; a new rate
    // keeps the time its stored permits span (19 at 10/s: 1.9 s), so the
    // count follows the rate: 39 at once at 20/s, 10 at 5/s.
    use paceline::RateLimiter;
    use paceline::clock::FakeClock;
    let at_once = |limiter: &RateLimiter<paceline::Local, FakeClock>| {
        (0..100)
            .take_while(|_| limiter.try_reserve(1, Duration::ZERO).unwrap().is_some())
            .count()
    };
    for (rate, expected) in [(10.0, 20), (20.0, 39), (5.0, 10)] {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(20))
            .clock(clock.clone())
            .build()
            .unwrap();
        limiter.set_rate(rate).unwrap();
        clock.advance(Duration::from_secs(60));
        assert_eq!(at_once(&limiter), expected, "at {rate}/s");
    }
}

/// `set_rate(r)` on a limiter of several limits runs the first at `r`
/// exactly, and says so, locally and on every key (the others are scaled
/// by as much). The first was scaled too, `46.69… × (938.548… / 46.69…)`,
/// which is a rounding off `r` for about one pair of rates in ten:
/// `rate()` read 938.5484478194002 (the keyed limiter's said `r` while its
/// keys ran at that).
#[test]
fn set_rate_runs_the_first_of_several_limits_at_that_rate_exactly() {
    let (from, to) = (46.69690848711884, 938.5484478194);
    let (local, keyed) = both([Limit::per_second(from), Limit::per_second(from * 4.0)]);
    local.set_rate(to).unwrap();
    assert_eq!(local.rate(), to);
    assert_eq!(local.slowest_rate(), to);
    keyed.set_rate(to).unwrap();
    assert_eq!(keyed.rate(), to);
    // A key drained of the first limit's burst reads as it.
    while keyed.try_reserve(&7, 1, Duration::ZERO).unwrap().is_some() {}
    let snapshot = keyed.snapshot(&7).unwrap();
    assert_eq!((snapshot.limit(), snapshot.rate()), (0, to));
}

/// Several limits keep their proportions through `set_rate` to an infinite
/// rate, or to one whose scaling underflows, and back: 10/s with 1 000 an
/// hour, lifted to `f64::INFINITY` and set back to 10/s, came back as 10/s
/// twice (every limit took the rate), the hourly quota gone. A rate set
/// with `set_limit_rate` meanwhile is kept.
#[test]
fn several_limits_keep_their_proportions_through_an_infinite_rate_and_back() {
    let hourly = 1000.0 / 3600.0;
    let (local, keyed) = both([
        Limit::per_second(10.0),
        Limit::per(1000.0, Duration::from_secs(3600)),
    ]);
    for away in [f64::INFINITY, f64::from_bits(1), f64::MAX] {
        local.set_rate(away).unwrap();
        keyed.set_rate(away).unwrap();
        local.set_rate(10.0).unwrap();
        keyed.set_rate(10.0).unwrap();
        for (what, rate, slowest) in [
            ("one", local.rate(), local.slowest_rate()),
            ("keyed", keyed.rate(), keyed.slowest_rate()),
        ] {
            assert_eq!(rate, 10.0, "{what}, back from {away:e}");
            assert!(
                (slowest - hourly).abs() < 1e-12,
                "{what}, back from {away:e}: the slowest limit runs at {slowest}, not {hourly}"
            );
        }
    }
    // A limit's own rate, set meanwhile, is what the next change scales.
    local.set_limit_rate(1, 0.5).unwrap();
    local.set_rate(f64::INFINITY).unwrap();
    local.set_rate(20.0).unwrap();
    assert_eq!(local.slowest_rate(), 1.0);
    local.set_limit_rate(0, 5.0).unwrap();
    local.set_rate(f64::INFINITY).unwrap();
    local.set_rate(10.0).unwrap();
    assert_eq!((local.rate(), local.slowest_rate()), (10.0, 2.0));
}

/// A limiter and a keyed limiter of `limits`, on fake clocks.
fn both(
    limits: [paceline::Limit; 2],
) -> (
    paceline::RateLimiter<paceline::Local, paceline::clock::FakeClock>,
    paceline::KeyedRateLimiter<u8, paceline::Local, paceline::clock::FakeClock>,
) {
    use paceline::clock::FakeClock;
    use paceline::{KeyedRateLimiter, RateLimiter};
    let [first, second] = limits;
    let local = RateLimiter::builder()
        .limit(first.clone())
        .limit(second.clone());
    let keyed = KeyedRateLimiter::<u8>::builder().limit(first).limit(second);
    (
        local.clock(FakeClock::new()).build().unwrap(),
        keyed.clock(FakeClock::new()).build().unwrap(),
    )
}
