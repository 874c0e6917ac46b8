//! Bad input gets a clear `Error::InvalidArgument`; extreme but valid input
//! saturates. Nothing panics, overflows or silently grants too much.

use crate::support::fake;

use std::time::Duration;

use fake::{bursty, warming_up};
use paceline::{Error, Limit, RateLimiter};

fn invalid(result: Result<impl std::fmt::Debug, Error>, mentions: &str) {
    match result {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains(mentions),
                "{message:?} should mention {mentions:?}"
            )
        }
        other => panic!("expected InvalidArgument mentioning {mentions:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn zero_permits_is_an_error_everywhere() {
    let (limiter, _) = bursty(5.0);
    invalid(limiter.reserve(0), "permits");
    invalid(limiter.try_reserve(0, Duration::from_secs(1)), "permits");
    invalid(limiter.acquire(0).await, "permits");
    invalid(limiter.try_acquire(0, Duration::ZERO).await, "permits");
    invalid(limiter.acquire_blocking(0), "permits");
    invalid(limiter.try_acquire_blocking(0, Duration::ZERO), "permits");
    // And nothing was reserved by the failed calls.
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
}

#[test]
fn bad_rates_are_rejected_by_every_constructor() {
    for rate in [0.0, -0.0, -5.0, f64::NAN, f64::NEG_INFINITY, f64::MIN] {
        invalid(RateLimiter::bursty(rate), "permits_per_second");
        invalid(
            RateLimiter::builder()
                .permits_per_second(rate)
                .warmup(Duration::from_secs(1))
                .build(),
            "permits_per_second",
        );
        invalid(
            RateLimiter::builder().permits_per_second(rate).build(),
            "permits_per_second",
        );
    }
}

#[test]
fn a_missing_rate_is_reported() {
    invalid(RateLimiter::builder().build(), "permits_per_second");
}

#[test]
fn bad_cold_factors_are_rejected() {
    for cold_factor in [0.0, 0.5, -1.0, f64::NAN, f64::INFINITY] {
        invalid(
            RateLimiter::builder()
                .limit(
                    Limit::per_second(1.0)
                        .warmup(Duration::from_secs(1))
                        .cold_factor(cold_factor),
                )
                .build(),
            "cold_factor",
        );
    }
}

/// A cold factor means what it says up to its bound: the colder the
/// factor, the slower the cold start, and past 10^6 it is refused by name,
/// on every limiter and on a `Limit`. (A factor of 10^20 was taken, and its
/// warm-up lost in rounding: its ramp, `2 × warmup / (stable × (1 +
/// factor))` permits, vanished beside the flat part, so a cold limiter at
/// 1000/s with a 1 s warm-up let its second request go after 1 ms, the
/// stable interval, where a factor of 10^15 made it wait 0.996 s.)
#[test]
fn a_cold_factor_past_its_bound_is_refused_and_one_within_slows_the_cold_start() {
    let mut slowest = Duration::ZERO;
    for cold_factor in [1.0, 3.0, 1e3, 1e6] {
        let (limiter, _) = warming_up(1000.0, Duration::from_secs(1), cold_factor);
        assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
        let second = limiter.reserve(1).unwrap();
        assert!(
            second >= slowest,
            "a cold factor of {cold_factor} waits {second:?}, less than {slowest:?}"
        );
        slowest = second;
    }
    assert!(slowest > Duration::from_millis(900), "{slowest:?}");
    for cold_factor in [1.000_001e6, 1e20, f64::MAX] {
        let limit = Limit::per_second(1000.0)
            .warmup(Duration::from_secs(1))
            .cold_factor(cold_factor);
        invalid(
            RateLimiter::builder().limit(limit.clone()).build(),
            "cold_factor",
        );
        let keyed = paceline::KeyedRateLimiter::<u8>::builder()
            .limit(limit)
            .build();
        invalid(keyed, "cold_factor");
    }
}

#[test]
fn options_of_both_policies_are_rejected() {
    invalid(
        RateLimiter::builder()
            .permits_per_second(1.0)
            .warmup(Duration::from_secs(1))
            .max_burst(Duration::from_secs(1))
            .build(),
        "max_burst",
    );
    invalid(
        RateLimiter::builder()
            .limit(Limit::per_second(1.0).cold_factor(3.0))
            .build(),
        "cold_factor",
    );
}

#[test]
fn options_that_do_nothing_here_are_rejected() {
    // A cap on keys, on a limiter with none, is not ignored in silence.
    for max_keys in [0, 1, 10_000] {
        invalid(
            RateLimiter::builder()
                .permits_per_second(1.0)
                .max_keys(max_keys)
                .build(),
            "max_keys",
        );
    }
}

/// A learning value out of its range is refused when the limiter is built,
/// by name, not kept at its default in silence (`decrease(1.5)` built a
/// limiter that lowered its rate by 0.7 on a refusal).
#[test]
fn a_learning_value_out_of_range_is_refused() {
    use paceline::KeyedRateLimiter;
    use paceline::outbound::Learning;
    let cases = [
        (Learning::default().decrease(1.5), "decrease"),
        (Learning::default().decrease(0.0), "decrease"),
        (Learning::default().increase(-0.1), "increase"),
        (Learning::default().increase(f64::NAN), "increase"),
        (Learning::default().floor(0.0), "floor"),
        (Learning::default().margin(f64::INFINITY), "margin"),
    ];
    for (learning, name) in cases {
        let single = RateLimiter::builder().permits_per_second(1.0);
        invalid(single.learning(learning).build(), name);
        let keyed = KeyedRateLimiter::<u32>::builder().permits_per_second(1.0);
        invalid(keyed.learning(learning).build(), name);
    }
    // The ends of each range build.
    let edges = Learning::default()
        .decrease(1.0)
        .increase(0.0)
        .floor(1.0)
        .margin(1.0);
    let built = RateLimiter::builder()
        .permits_per_second(1.0)
        .learning(edges);
    assert!(built.build().is_ok());
}

#[test]
fn errors_display_what_was_wrong() {
    let err = RateLimiter::bursty(-2.5).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid argument: permits_per_second must be a positive number or +infinity (got -2.5)"
    );
    let source: &dyn std::error::Error = &err;
    assert!(source.source().is_none());
}

#[test]
fn max_permits_and_timeouts_saturate() {
    for (limiter, _) in [
        bursty(1e-300),
        bursty(1.0),
        bursty(1e300),
        warming_up(1e-300, Duration::MAX, 3.0),
        warming_up(1e300, Duration::MAX, 3.0),
    ] {
        assert_eq!(limiter.reserve(u32::MAX).unwrap(), Duration::ZERO);
        let wait = limiter.reserve(u32::MAX).unwrap();
        let again = limiter.reserve(u32::MAX).unwrap();
        assert!(
            again >= wait,
            "waits never go down: {wait:?} then {again:?}"
        );
        // A timeout of Duration::MAX always fits; zero never does once there is debt (unless the rate is huge).
        assert!(limiter.try_reserve(1, Duration::MAX).unwrap().is_some());
        let _ = limiter.snapshot();
    }
}

#[test]
fn tiny_rates_make_callers_wait_about_forever() {
    let (limiter, _) = bursty(1e-300);
    limiter.reserve(1).unwrap();
    let wait = limiter.reserve(1).unwrap();
    assert!(
        wait > Duration::from_secs(200 * 365 * 24 * 3600),
        "{wait:?}"
    );
    assert_eq!(
        limiter.try_reserve(1, Duration::from_secs(3600)).unwrap(),
        None
    );
}

#[test]
fn huge_rates_do_not_limit_noticeably() {
    let (limiter, _) = bursty(1e300);
    for _ in 0..1000 {
        assert_eq!(limiter.reserve(u32::MAX).unwrap(), Duration::ZERO);
    }
}

#[test]
fn huge_max_burst_and_warmup_are_accepted() {
    let limiter = RateLimiter::builder()
        .permits_per_second(1e300)
        .max_burst(Duration::MAX)
        .build()
        .unwrap();
    limiter.reserve(1).unwrap();
    limiter.set_rate(1e-300).unwrap();
    limiter.set_rate(f64::INFINITY).unwrap();
    limiter.set_rate(3.0).unwrap();
    limiter.reserve(1).unwrap();
}
