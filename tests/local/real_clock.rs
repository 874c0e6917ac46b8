//! A few smoke tests on the real clock, with tolerant bounds: the exact
//! behaviour is tested on a fake clock elsewhere.

use std::time::{Duration, Instant};

use paceline::RateLimiter;

#[tokio::test]
async fn async_acquire_paces_at_the_rate() {
    // (The start before the limiter: it stores what it is left idle from
    // then.)
    let start = Instant::now();
    let limiter = RateLimiter::bursty(20.0).unwrap();
    for _ in 0..11 {
        limiter.acquire(1).await.unwrap();
    }
    let elapsed = start.elapsed();
    // 10 intervals of 50 ms after the free first permit.
    assert!(elapsed >= Duration::from_millis(490), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
}

#[test]
fn blocking_acquire_paces_at_the_rate() {
    // (The start before the limiter: it stores what it is left idle from
    // then.)
    let start = Instant::now();
    let limiter = RateLimiter::bursty(20.0).unwrap();
    for _ in 0..11 {
        limiter.acquire_blocking(1).unwrap();
    }
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(490), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
}

#[test]
fn blocking_try_acquire_gives_up_at_once() {
    let limiter = RateLimiter::bursty(1.0).unwrap();
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    let start = Instant::now();
    assert!(
        !limiter
            .try_acquire_blocking(1, Duration::from_millis(100))
            .unwrap()
    );
    // At once, not at its moment 1 s away. (The timeout, 100 ms, cannot be
    // told from a loaded machine's delay here: the fake clock's tests hold
    // that nothing is slept.)
    assert!(start.elapsed() < Duration::from_millis(900));
}

#[tokio::test]
async fn warming_up_starts_slower_than_stable() {
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .warmup(Duration::from_millis(200))
        .build()
        .unwrap();
    let start = Instant::now();
    for _ in 0..3 {
        limiter.acquire(1).await.unwrap();
    }
    // Cold: the first paid permits cost close to 3 × 10 ms, not 10 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(40),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_new_limiter_grants_its_first_request_at_once() {
    // The start of a new limiter and its later clock readings lie on one
    // timeline: the first request never owes even a microsecond.
    for _ in 0..20_000 {
        let limiter = RateLimiter::bursty(1.0).unwrap();
        assert_eq!(
            limiter.try_reserve(1, Duration::ZERO).unwrap(),
            Some(Duration::ZERO)
        );
    }
    for _ in 0..20_000 {
        let limiter = RateLimiter::builder()
            .permits_per_second(1.0)
            .warmup(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_eq!(
            limiter.try_reserve(1, Duration::ZERO).unwrap(),
            Some(Duration::ZERO)
        );
    }
}
