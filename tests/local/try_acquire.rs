//! `try_reserve` / `try_acquire`: reserve only if the wait fits in the timeout,
//! otherwise refuse at once and reserve nothing.

use crate::support::fake;

use std::time::Duration;

use fake::{bursty, pause_ms, waits_n};
use paceline::clock::Clock;

const MS: Duration = Duration::from_millis(1);

#[test]
fn zero_timeout() {
    // Published: true, false, false, (U0.10) false.
    let (limiter, clock) = bursty(5.0);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    pause_ms(&clock, 100);
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    pause_ms(&clock, 100);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
}

#[test]
fn some_wait_allowed() {
    // Published: true (0 s), true (200 ms), false (100 ms), (U0.10) true (100 ms).
    let (limiter, clock) = bursty(5.0);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    assert!(limiter.try_acquire_blocking(1, 200 * MS).unwrap());
    assert_eq!(clock.now(), 200 * MS, "a granted try sleeps for its wait");
    assert!(!limiter.try_acquire_blocking(1, 100 * MS).unwrap());
    pause_ms(&clock, 100);
    assert!(limiter.try_acquire_blocking(1, 100 * MS).unwrap());
}

#[test]
fn a_refused_try_reserves_nothing() {
    let (limiter, clock) = bursty(5.0);
    limiter.reserve(2).unwrap(); // debt: 400 ms
    let before = limiter.snapshot().unwrap().wait();
    for _ in 0..100 {
        assert_eq!(limiter.try_reserve(1000, 399 * MS).unwrap(), None);
    }
    assert_eq!(limiter.snapshot().unwrap().wait(), before);
    assert_eq!(clock.now(), Duration::ZERO, "a refused try does not sleep");
    assert_eq!(limiter.try_reserve(1, 400 * MS).unwrap(), Some(400 * MS));
}

#[test]
fn only_the_existing_debt_counts_not_the_request_size() {
    let (limiter, _) = bursty(5.0);
    // An idle limiter grants a huge request at once; the next caller pays for it.
    assert_eq!(
        limiter.try_reserve(5000, Duration::ZERO).unwrap(),
        Some(Duration::ZERO)
    );
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_secs(1000)
    );
    assert_eq!(
        limiter.try_reserve(1, Duration::from_secs(999)).unwrap(),
        None
    );
}

#[test]
fn try_with_an_absurd_timeout_is_a_plain_reserve() {
    // Published (overflow): true, (U0.10) true with the largest timeout.
    let (limiter, clock) = bursty(5.0);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    pause_ms(&clock, 100);
    assert_eq!(
        limiter.try_reserve(1, Duration::MAX).unwrap(),
        Some(100 * MS)
    );
    assert_eq!(
        limiter.try_reserve(1, Duration::MAX).unwrap(),
        Some(300 * MS)
    );
}

#[test]
fn try_five_then_one() {
    // Published (negative timeouts, here zero): 5 permits granted at once,
    // then after 900 ms the single permit is still 100 ms away.
    let (limiter, clock) = bursty(5.0);
    assert!(limiter.try_acquire_blocking(5, Duration::ZERO).unwrap());
    pause_ms(&clock, 900);
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    pause_ms(&clock, 100);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
}

#[tokio::test]
async fn async_try_acquire_sleeps_only_when_granted() {
    let (limiter, clock) = bursty(10.0);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!limiter.try_acquire(1, 50 * MS).await.unwrap());
    assert_eq!(clock.now(), Duration::ZERO);
    assert!(limiter.try_acquire(1, 100 * MS).await.unwrap());
    assert_eq!(clock.now(), 100 * MS);
    assert_eq!(waits_n(&limiter, 1), [100_000]);
}

#[test]
fn tiny_rate_grants_exactly_once() {
    // Published: the smallest positive rate grants one permit, then none, even after a long pause.
    let (limiter, clock) = bursty(f64::from_bits(1));
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    clock.advance(Duration::from_millis(i32::MAX as u64));
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
}
