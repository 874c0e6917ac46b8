//! Probes of the HTTP layer's documented headers, on the fake clock.

use std::sync::Arc;
use std::time::Duration;

use ::http::{Request, StatusCode};
use paceline::clock::FakeClock;
use paceline::http::{Global, Headers, RateLimitLayer};
use paceline::{KeyedRateLimiter, Limit};
use tower_layer::Layer;

use super::{Ok200, header, retry_after, send};

/// `RateLimit-Policy: q=Q;w=W`: "`W` the shortest whole number of seconds (at
/// least 1) in which a drained key gets its whole burst back, and `Q` the
/// requests the rate allows in `W`". A quota of 11 a minute (its whole minute
/// as burst, `Limit::per`'s default) is `q=11;w=60` (it read `w=61`: 11 /
/// (11 / 60) is 60.000000000000014 in floating point).
#[tokio::test(flavor = "current_thread")]
async fn a_per_minute_quota_reads_as_its_own_window() {
    for (quota, window, expected) in [
        (11.0, 60, "\"default\";q=11;w=60"),
        (65.0, 3600, "\"default\";q=65;w=3600"),
        (17.0, 7, "\"default\";q=17;w=7"),
    ] {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            KeyedRateLimiter::<()>::builder()
                .limit(Limit::per(quota, Duration::from_secs(window)))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let mut service = RateLimitLayer::new(limiter.clone(), Global)
            .headers(Headers::Ietf)
            .layer(Ok200::default());
        // Drain the key: `quota` at once, then a refusal.
        let mut through = 0;
        let mut policy = None;
        loop {
            let response = send(&mut service, Request::new(())).await;
            if response.status() != StatusCode::OK {
                break;
            }
            through += 1;
            policy = header(&response, "ratelimit-policy").map(str::to_owned);
        }
        assert_eq!(through, quota as u64);
        // The window: a drained key has its whole burst back after it.
        clock.advance(Duration::from_secs(window));
        let mut again = 0;
        while limiter
            .try_reserve(&(), 1, Duration::ZERO)
            .unwrap()
            .is_some()
        {
            again += 1;
        }
        assert_eq!(again, quota as u64, "{quota} per {window} s");
        assert_eq!(policy.as_deref(), Some(expected));
    }
}

/// "With several limits the snapshot, and so each header, is the limit that
/// binds after the request (the fewest requests that would go now): `R` is
/// exact ... (`q=10;w=1` while the per-second limit binds, `q=5;w=60` once
/// the per-minute one does)"; `Retry-After` the wait, rounded up.
#[tokio::test(flavor = "current_thread")]
async fn several_limits_say_the_binding_one() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .limit(Limit::per_second(10.0).burst(10))
            .limit(Limit::per(5.0, Duration::from_secs(60)))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(limiter, Global)
        .headers(Headers::IetfAndLegacy)
        .layer(Ok200::default());
    for remaining in (0..5).rev() {
        let response = send(&mut service, Request::new(())).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"default\";q=5;w=60")
        );
        let r = format!("\"default\";r={remaining};t={}", (5 - remaining) * 12);
        assert_eq!(header(&response, "ratelimit"), Some(r.as_str()));
    }
    let refused = send(&mut service, Request::new(())).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some("12"));
    assert_eq!(header(&refused, "ratelimit"), Some("\"default\";r=0;t=60"));
    // After 12 s one comes back.
    clock.advance(Duration::from_secs(12));
    let response = send(&mut service, Request::new(())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("0"));
}

/// `RateLimit: r=R;t=T`: "`T` seconds (rounded up) until the key is full
/// again". With two limits where the one with fewer left fills sooner, the
/// key is full only once both are (`t=6`; it said `t=1`).
#[tokio::test(flavor = "current_thread")]
async fn t_is_when_the_key_is_full_again() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .limit(Limit::per_second(10.0).burst(2))
            .limit(Limit::per(10.0, Duration::from_secs(60)))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(limiter, Global)
        .headers(Headers::Ietf)
        .layer(Ok200::default());
    let response = send(&mut service, Request::new(())).await;
    // Per second: 1 left, full in 100 ms; per minute: 9 left, full in 6 s.
    assert_eq!(header(&response, "ratelimit"), Some("\"default\";r=1;t=6"));
}

/// A warming-up key: "For a warming-up limiter, `Q` is the stable rate's".
#[tokio::test(flavor = "current_thread")]
async fn a_warming_up_key_reads_at_its_stable_rate() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .permits_per_second(10.0)
            .warmup(Duration::from_secs(2))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(limiter, Global)
        .headers(Headers::Ietf)
        .layer(Ok200::default());
    let response = send(&mut service, Request::new(())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"default\";q=10;w=1")
    );
    let refused = send(&mut service, Request::new(())).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Cold: the next waits 3 × 100 ms; Retry-After rounds it up to 1.
    assert_eq!(retry_after(&refused), Some("1"));
}
