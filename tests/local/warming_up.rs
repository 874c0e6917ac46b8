//! The warming-up policy on a fake clock. Each scenario is checked two ways:
//! exact microseconds derived from the rules in `paceline::core`, and, where
//! the reference behaviour for the original algorithm was published as rounded
//! seconds (e.g. "R1.38"), the same rounding of our waits.

use crate::support::fake;

use std::time::Duration;

use fake::{pause_ms, rounded, waits, waits_n, warming_up};

#[test]
fn cold_start_ramps_down_to_the_stable_rate_and_cools_back() {
    // 2/s, 4 s warm-up, cold factor 3: threshold 4 permits, max 8, slope 250 ms/permit.
    let (limiter, clock) = warming_up(2.0, Duration::from_secs(4), 3.0);
    let cold = waits_n(&limiter, 8);
    assert_eq!(
        cold,
        [
            0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000, 500_000, 500_000
        ]
    );
    assert_eq!(
        rounded(&cold),
        "0.00, 1.38, 1.13, 0.88, 0.63, 0.50, 0.50, 0.50"
    );

    pause_ms(&clock, 500); // repays the last acquire
    pause_ms(&clock, 4000); // the warm-up period: cold again
    assert_eq!(waits_n(&limiter, 8), cold);

    pause_ms(&clock, 500);
    pause_ms(&clock, 2000); // half the cool-down: not cold yet
    // Published: R0.00, then R0.50 x7.
    assert_eq!(
        waits_n(&limiter, 8),
        [
            0, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000
        ]
    );
}

#[test]
fn cold_factor_10() {
    let (limiter, clock) = warming_up(5.0, Duration::from_secs(4), 10.0);
    let cold = waits_n(&limiter, 8);
    assert_eq!(
        rounded(&cold),
        "0.00, 1.75, 1.26, 0.76, 0.30, 0.20, 0.20, 0.20"
    );
    pause_ms(&clock, 200);
    pause_ms(&clock, 4000);
    assert_eq!(waits_n(&limiter, 8), cold);
    pause_ms(&clock, 200);
    pause_ms(&clock, 1000); // still warm
    assert_eq!(
        rounded(&waits_n(&limiter, 8)),
        "0.00, 0.20, 0.20, 0.20, 0.20, 0.20, 0.20, 0.20"
    );
}

#[test]
fn cold_factor_1_means_no_warm_up_and_no_burst() {
    let (limiter, clock) = warming_up(5.0, Duration::from_secs(4), 1.0);
    assert_eq!(
        waits_n(&limiter, 8),
        [
            0, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000
        ]
    );
    pause_ms(&clock, 340);
    assert_eq!(
        waits_n(&limiter, 8),
        [
            0, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000
        ]
    );
}

#[test]
fn warm_up_time_is_honoured_whatever_the_request_sizes() {
    // Draining the permits above the threshold from cold takes exactly the
    // warm-up period, however the permits are grouped into requests.
    for cold_factor in [2.0, 3.0, 10.0] {
        for rate in [4.0, 2.0, 1.0, 0.5, 0.1] {
            // Chosen so that max - threshold = 10 permits exactly.
            let warmup_ms = ((1.0 + cold_factor) * 10.0 / (2.0 * rate) * 1000.0) as u64;
            for grouping in [&[10u32][..], &[1; 10], &[5, 1, 4], &[2, 3, 1, 4], &[9, 1]] {
                let (limiter, clock) =
                    warming_up(rate, Duration::from_millis(warmup_ms), cold_factor);
                let start = fake::micros(paceline::clock::Clock::now(&clock));
                waits(&limiter, grouping);
                waits(&limiter, &[1]); // repay the last request's debt
                let took = fake::micros(paceline::clock::Clock::now(&clock)) - start;
                let expected = warmup_ms * 1000;
                assert!(
                    took.abs_diff(expected) <= 2,
                    "cold {cold_factor}, rate {rate}, {grouping:?}: took {took} µs, expected {expected}"
                );
            }
        }
    }
}

#[test]
fn partial_cool_down_stores_a_proportional_part() {
    // 1/s, 10 s warm-up, factor 3: threshold 5, max 10; cooling stores one permit per second.
    let (limiter, clock) = warming_up(1.0, Duration::from_secs(10), 3.0);
    let cold = waits_n(&limiter, 12);
    // Stable from the 11th request on.
    assert!(cold[6..].iter().all(|&w| w == 1_000_000), "{cold:?}");
    pause_ms(&clock, 1000); // repays the last
    pause_ms(&clock, 3000); // 3 permits stored, all below the threshold: stable price
    assert_eq!(
        waits_n(&limiter, 5),
        [0, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
    );
    pause_ms(&clock, 1000);
    // 7 stored, 2 above the threshold; the slope is (3 s - 1 s) / 5 permits = 400 ms/permit,
    // so those two cost (1.8 + 1.4) / 2 = 1.6 s and (1.4 + 1.0) / 2 = 1.2 s.
    pause_ms(&clock, 7000);
    assert_eq!(
        waits_n(&limiter, 5),
        [0, 1_600_000, 1_200_000, 1_000_000, 1_000_000]
    );
}

#[test]
fn zero_warm_up_limits_like_bursty_without_burst() {
    for warmup in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(999),
    ] {
        let (limiter, clock) = warming_up(4.0, warmup, 3.0);
        assert_eq!(waits_n(&limiter, 3), [0, 250_000, 250_000], "{warmup:?}");
        pause_ms(&clock, 60_000);
        // Nothing is stored: still one permit per 250 ms after a long pause.
        assert_eq!(waits_n(&limiter, 3), [0, 250_000, 250_000], "{warmup:?}");
    }
}

#[test]
fn one_microsecond_warm_up_is_finite() {
    let (limiter, clock) = warming_up(4.0, Duration::from_micros(1), 3.0);
    pause_ms(&clock, 60_000);
    let w = waits_n(&limiter, 4);
    assert_eq!(w[0], 0);
    assert!(
        w[1..].iter().all(|&w| (250_000..=250_002).contains(&w)),
        "{w:?}"
    );
}

#[test]
fn a_new_warming_up_limiter_starts_cold() {
    let (limiter, _) = warming_up(10.0, Duration::from_secs(1), 3.0);
    let w = waits_n(&limiter, 3);
    assert!(
        w[1] > 200_000,
        "the first paid wait is near the cold interval (300 ms): {w:?}"
    );
    assert!(w[2] < w[1], "{w:?}");
}
