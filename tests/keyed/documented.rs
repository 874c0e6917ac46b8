//! Probes of the keyed limiter's documented promises, on a fake clock.

use std::time::Duration;

use paceline::clock::FakeClock;
use paceline::{KeyedRateLimiter, Limit};

/// A key's reservation dropped after `set_rate` keeps its permits ("what
/// was waiting gives nothing back"), though `can_give_back` said it may.
#[test]
fn a_keys_reservation_dropped_after_set_rate_keeps_its_permits() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(&1, 1).unwrap();
    let second = limiter.reservation(&1, 1).unwrap();
    assert_eq!(second.delay(), Duration::from_millis(100));
    assert!(second.can_give_back());
    limiter.set_rate(5.0).unwrap();
    drop(second);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::from_millis(200));
}

/// `Reservation::limit` on a keyed limiter: which limit it waits for.
#[test]
fn a_keys_reservation_names_its_limit() {
    let limiter = KeyedRateLimiter::<u32>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per(60.0, Duration::from_secs(60)).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    assert_eq!(limiter.reservation(&1, 1).unwrap().limit(), None);
    let next = limiter.reservation(&1, 1).unwrap();
    assert_eq!(
        (next.delay(), next.limit()),
        (Duration::from_secs(1), Some(1))
    );
    next.keep();
}

/// `KeyedLimiter::snapshot`: "a key not held reads as a new key would"; a new
/// key starts full: `Limit::per_second(5.0).burst(5)` lets 5 go at once.
#[test]
fn a_new_keys_snapshot_is_full() {
    let limiter = KeyedRateLimiter::<u32>::builder()
        .limit(Limit::per_second(5.0).burst(5))
        .limit(Limit::per(100.0, Duration::from_secs(60)))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let snapshot = limiter.snapshot(&9).unwrap();
    assert_eq!((snapshot.remaining(), snapshot.burst()), (5, 5));
    assert_eq!(snapshot.full_in(), Duration::ZERO);
    assert_eq!(limiter.stats().keys, 0, "a snapshot holds no key");
}
