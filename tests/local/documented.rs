//! Probes of the documentation's promises, on a fake clock.

use std::time::Duration;

use paceline::clock::{Clock, FakeClock};
use paceline::outbound::Feedback;
use paceline::{Cost, Limit, RateLimiter};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at_once(limiter: &RateLimiter<paceline::Local, FakeClock>) -> u64 {
    let mut n = 0;
    while limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
        n += 1;
        assert!(n < 10_000);
    }
    n
}

/// `Reservation::can_give_back` is a may: `true` for a reservation that
/// waits, and then, after `set_rate` ("what waits to be given back then
/// gives back nothing"), dropping it keeps its permits: the next caller
/// owes both (200 ms at the new 5/s, not the first's 100 ms).
#[test]
fn a_reservation_dropped_after_a_rate_change_keeps_its_permits() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = limiter.reservation(1).unwrap();
    assert!(
        !first.can_give_back(),
        "it waits for nothing: nothing to give back"
    );
    drop(first);
    let second = limiter.reservation(1).unwrap();
    assert_eq!(second.delay(), ms(100));
    assert!(second.can_give_back());
    limiter.set_rate(5.0).unwrap();
    drop(second);
    assert_eq!(limiter.reserve(1).unwrap(), ms(200));
}

/// The same once the reservation's moment has passed: dropped at 150 ms,
/// its permits stay spent ("drop it before its wait has passed"): the next
/// waits until 200 ms.
#[test]
fn a_reservation_dropped_after_its_moment_keeps_its_permits() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap();
    let second = limiter.reservation(1).unwrap();
    assert_eq!(second.delay(), ms(100));
    clock.advance(ms(150));
    assert!(second.can_give_back());
    drop(second);
    assert_eq!(limiter.reserve(1).unwrap(), ms(50));
}

/// `Limit::burst`: "`burst(20)` at 10/s stores 1.9 s of permits, 39 at once at
/// 20/s, 10 at 5/s."
#[test]
fn a_burst_follows_the_rate_as_limit_burst_says() {
    for (rate, expected) in [(20.0, 39), (5.0, 10), (10.0, 20)] {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(20))
            .clock(clock.clone())
            .build()
            .unwrap();
        limiter.set_rate(rate).unwrap();
        clock.advance(Duration::from_secs(10));
        assert_eq!(at_once(&limiter), expected, "at {rate}/s");
        assert_eq!(limiter.snapshot().unwrap().burst(), expected, "at {rate}/s");
    }
}

/// `Call::settle`: "Err if `actual` counts for a limit the limiter lacks; the
/// call then ends at its estimate."
#[tokio::test(flavor = "current_thread")]
async fn a_bad_settle_ends_the_call_at_its_estimate() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per_second(1_000.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(Cost::each([1, 800])).await.unwrap();
    assert!(call.settle(Cost::each([1, 200, 5])).is_err());
    // The estimate stays: 800 tokens at 1 000/s.
    let next = limiter.call(Cost::each([1, 1])).await.unwrap();
    assert_eq!(next.waited(), ms(800));
}

/// `Call::settle`: "0 is a cost: a call that failed at once": settled at 0,
/// the next caller waits for nothing of it.
#[tokio::test(flavor = "current_thread")]
async fn a_call_settled_at_zero_costs_nothing() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(5).await.unwrap();
    call.settle(0).unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
}

/// The crate docs' example: a 429 with `Retry-After: 2` makes every caller
/// wait; a `Learning` pause without `Retry-After` is 1 s (default).
#[tokio::test(flavor = "current_thread")]
async fn a_refusal_without_retry_after_pauses_one_second() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(1).await.unwrap();
    call.learn(&Feedback::new(429));
    drop(call);
    let snapshot = limiter.snapshot().unwrap();
    assert_eq!(snapshot.wait(), Duration::from_secs(1));
    assert_eq!(snapshot.remaining(), 0);
    // "multiplies the rates by 0.7"
    assert!((limiter.rate() - 70.0).abs() < 1e-9, "{}", limiter.rate());
    // "after the pause the callers go one interval apart, never as a burst"
    clock.advance(Duration::from_secs(1));
    assert_eq!(at_once(&limiter), 1);
}

/// `Snapshot::full_in`: "How long until the limiter is full again (nothing
/// owed, every permit it can store stored)". With several limits the snapshot
/// is the one with the fewest remaining, and its `full_in` counts every
/// limit (it was that limit's alone: 100 ms where the limiter needs 1 s).
#[test]
fn several_limits_full_in_is_when_the_limiter_is_full() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(2))
        .limit(Limit::per(5.0, Duration::from_secs(5)).burst(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap(); // per-second: 1 left; per-5s: 4 left
    let snapshot = limiter.snapshot().unwrap();
    assert_eq!(snapshot.remaining(), 1);
    // Full again: the per-5s limit needs a second.
    assert_eq!(snapshot.full_in(), Duration::from_secs(1));
}

/// `Snapshot::wait_for`: "How long until `requests` requests of one permit
/// would all go at once ... if nothing else is reserved meanwhile". With
/// several limits, checked against the limiter itself (it said 200 ms where
/// the second limit holds them 10 s).
#[tokio::test(flavor = "current_thread")]
async fn several_limits_wait_for_is_when_that_many_go_at_once() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(10))
        .limit(Limit::per(5.0, Duration::from_secs(50)).burst(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    // 8 of the first, 2 of the second: 2 and 3 left.
    let call = limiter.call(Cost::each([8, 2])).await.unwrap();
    assert_eq!(call.waited(), Duration::ZERO);
    drop(call);
    let snapshot = limiter.snapshot().unwrap();
    assert_eq!(snapshot.remaining(), 2);
    let said = snapshot.wait_for(4).unwrap();
    // What the limiter does: 4 at once only once the second limit stored one
    // more (10 s at 0.1/s).
    clock.advance(said);
    let went = at_once(&limiter);
    assert!(
        went >= 4,
        "wait_for(4) said {said:?}; then {went} went at once"
    );
}

/// `RateLimiter::slowest_rate`: "The slowest of its limits' stable rates".
#[test]
fn slowest_rate_is_the_slowest_limit() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0))
        .limit(Limit::per(60.0, Duration::from_secs(60)))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    assert_eq!(limiter.rate(), 10.0);
    assert_eq!(limiter.slowest_rate(), 1.0);
    // set_rate scales the others by the same factor.
    limiter.set_rate(20.0).unwrap();
    assert_eq!(limiter.slowest_rate(), 2.0);
}

/// The quick start's promise: `RateLimiter::bursty` "starts with nothing
/// stored: the first request goes at once, the next waits its interval".
#[test]
fn bursty_starts_empty() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(5.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let snapshot = limiter.snapshot().unwrap();
    assert_eq!((snapshot.remaining(), snapshot.stored()), (1, 0.0));
    assert_eq!(snapshot.burst(), 6);
    assert_eq!(snapshot.full_in(), Duration::from_secs(1));
    let _ = clock.now();
}
