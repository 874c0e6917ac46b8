//! Probes of the keyed limiter's documented promises, on a fake clock.

use std::time::Duration;

use paceline::clock::{Clock, FakeClock};
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

/// `paceline::stream`: "when nothing is owed and the limiter can tell
/// without I/O (through `Limiter::take_now` and `KeyedLimiter::take_now`),
/// an item's permits are taken with no future and no timer". So for
/// `throttle_keyed` too: its items, once their keys are held, allocate
/// nothing (each cost a boxed wait).
#[test]
fn a_keyed_stream_owing_nothing_takes_its_items_without_a_future() {
    use futures::StreamExt;
    use paceline::stream::ThrottleExt;
    use std::task::{Context, Poll};

    use crate::support::alloc::allocations;

    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .limit(Limit::per_second(1000.0).burst(1000))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut items = futures::stream::iter(0..1000u32).throttle_keyed(&limiter, |&i| (i % 4, 1));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut next = || match items.poll_next_unpin(&mut cx) {
        Poll::Ready(Some(Ok(item))) => item,
        other => panic!("not released at once: {other:?}"),
    };
    // The first of each key: its entry is made.
    for i in 0..4 {
        assert_eq!(next(), i);
    }
    let before = allocations();
    for i in 4..1000 {
        assert_eq!(next(), i);
    }
    assert_eq!(
        allocations() - before,
        0,
        "a keyed item owing nothing allocated"
    );
    assert_eq!(clock.now(), Duration::ZERO);
}
