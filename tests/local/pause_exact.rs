//! Callers already waiting when a refusal's pause comes, exactly: on a
//! manual clock whose sleeps end only when the test moves it, polled by
//! hand, every interleaving is exact and nothing depends on load (the
//! real-clock cases are in `pause.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use paceline::outbound::Feedback;
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

use crate::support::manual::{Boxed, ManualClock, at_once, poll};

fn refused(ms: u64) -> Feedback {
    Feedback::new(429).with_retry_after(Duration::from_millis(ms))
}

/// `future`, boxed and polled once: it waits.
fn waiting<'a, T>(future: impl Future<Output = T> + 'a) -> Boxed<'a, T> {
    let mut future: Boxed<'a, T> = Box::pin(future);
    assert!(poll(&mut future).is_none(), "went at once");
    future
}

/// At 20 ms, the upstream refuses `first`, asking for `pause_ms`.
fn refused_at_20(clock: &ManualClock, first: paceline::outbound::Call<'_>, pause_ms: u64) {
    clock.set_ms(20);
    first.learn(&refused(pause_ms));
}

/// 10/s, no burst.
fn limiter(clock: &ManualClock) -> RateLimiter<paceline::Local, ManualClock> {
    RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Polls every future at each ms from the clock's time to `end_ms`;
/// the ms each finished at.
fn run_until<T>(
    clock: &ManualClock,
    futures: &mut [Option<Boxed<'_, T>>],
    end_ms: u64,
) -> Vec<Option<u64>> {
    let mut done = vec![None; futures.len()];
    let mut ms = clock.ms();
    loop {
        clock.set_ms(ms);
        for (i, slot) in futures.iter_mut().enumerate() {
            if let Some(future) = slot
                && poll(future).is_some()
            {
                done[i] = Some(ms);
                *slot = None;
            }
        }
        if ms >= end_ms {
            return done;
        }
        ms += 1;
    }
}

/// Sanity: the waiter goes behind the pause, and `acquire` returns all it
/// slept (both waits).
#[test]
fn sanity_acquire_goes_behind_the_pause_and_reports_all_it_slept() {
    let clock = ManualClock::default();
    let limiter = limiter(&clock);
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.acquire(1));
    refused_at_20(&clock, first, 1000);
    let (went, slept) = finish(&clock, &mut waiter, 5000).unwrap();
    let slept = slept.unwrap();
    assert_eq!(went, 1020, "went at {went} ms");
    assert_eq!(slept, Duration::from_millis(1020));
}

/// Polls `future` at each ms up to `end_ms`; the ms it finished at and its
/// output, or `None`.
fn finish<T>(clock: &ManualClock, future: &mut Boxed<'_, T>, end_ms: u64) -> Option<(u64, T)> {
    let mut ms = clock.ms();
    loop {
        clock.set_ms(ms);
        if let Some(out) = poll(future) {
            return Some((ms, out));
        }
        if ms >= end_ms {
            return None;
        }
        ms += 1;
    }
}

/// An acquire dropped during its second wait (behind the pause) gives
/// back what it reserved there: the next caller's wait is to the pause's
/// end, not an interval after it.
#[test]
fn acquire_dropped_behind_the_pause_gives_back_its_second_reservation() {
    let clock = ManualClock::default();
    let limiter = limiter(&clock);
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.acquire(1));
    refused_at_20(&clock, first, 1000);
    assert!(finish(&clock, &mut waiter, 500).is_none());
    drop(waiter);
    let wait = limiter.snapshot().unwrap().wait();
    assert_eq!(wait, Duration::from_millis(520));
}

/// Waiters queued when the refusal comes go behind the pause one interval
/// apart at the lowered rate (7/s), never as a burst.
#[test]
fn several_waiters_go_one_interval_apart_after_the_pause() {
    let clock = ManualClock::default();
    let limiter = limiter(&clock);
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiters: Vec<Option<Boxed<'_, _>>> = (0..5)
        .map(|_| {
            let mut w: Boxed<'_, _> = Box::pin(limiter.acquire(1));
            assert!(poll(&mut w).is_none());
            Some(w)
        })
        .collect();
    refused_at_20(&clock, first, 1000);
    let done = run_until(&clock, &mut waiters, 4000);
    let mut went: Vec<u64> = done.into_iter().map(Option::unwrap).collect();
    went.sort();
    assert!(went[0] >= 1020, "{went:?}");
    for pair in went.windows(2) {
        assert!(pair[1] - pair[0] >= 142, "{went:?}");
    }
}

/// A call re-reserving behind the pause holds its concurrency slot, one
/// only; dropped during its second wait, it frees it and gives back its
/// second reservation.
#[test]
fn call_keeps_one_slot_across_the_pause_and_frees_it_when_dropped() {
    let clock = ManualClock::default();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::concurrent(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.call(1));
    assert_eq!(limiter.stats().in_flight, 2);
    refused_at_20(&clock, first, 1000);
    assert_eq!(limiter.stats().in_flight, 1);
    assert!(finish(&clock, &mut waiter, 500).is_none());
    assert_eq!(limiter.stats().in_flight, 1);
    drop(waiter);
    assert_eq!(limiter.stats().in_flight, 0);
    let wait = limiter.snapshot().unwrap().wait();
    assert_eq!(wait, Duration::from_millis(520));
    // And one that goes: its call holds the slot, waited() is the whole.
    let mut again: Boxed<'_, _> = Box::pin(limiter.call(1));
    let (went, call) = finish(&clock, &mut again, 3000).unwrap();
    assert_eq!(went, 1020);
    let call = call.unwrap();
    assert_eq!(call.waited(), Duration::from_millis(520));
    assert_eq!(limiter.stats().in_flight, 1);
    drop(call);
    assert_eq!(limiter.stats().in_flight, 0);
}

/// try_call whose timeout the pause outlasts: None, its slot back, and
/// nothing reserved behind the pause.
#[test]
fn try_call_outlasted_by_the_pause_returns_none_and_frees_its_slot() {
    let clock = ManualClock::default();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::concurrent(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.try_call(1, Duration::from_millis(500)));
    refused_at_20(&clock, first, 1000);
    let (went, out) = finish(&clock, &mut waiter, 3000).unwrap();
    assert_eq!(went, 100);
    assert!(out.unwrap().is_none());
    assert_eq!(limiter.stats().in_flight, 0);
    let wait = limiter.snapshot().unwrap().wait();
    assert_eq!(wait, Duration::from_millis(920));
    // One whose timeout fits goes at the pause's end.
    let mut fits: Boxed<'_, _> = Box::pin(limiter.try_acquire(1, Duration::from_millis(950)));
    let (went, out) = finish(&clock, &mut fits, 3000).unwrap();
    assert!(out.unwrap());
    assert_eq!(went, 1020);
}

/// A second refusal during the second wait sends the waiter behind the
/// later pause too.
#[test]
fn a_second_refusal_during_the_second_wait_sends_it_behind_again() {
    let clock = ManualClock::default();
    let limiter = limiter(&clock);
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.acquire(1));
    clock.set_ms(20);
    first.learn(&refused(1000));
    assert!(finish(&clock, &mut waiter, 500).is_none());
    first.learn(&refused(1500)); // until 2000
    drop(first);
    let (went, slept) = finish(&clock, &mut waiter, 5000).unwrap();
    assert_eq!(went, 2000);
    assert_eq!(slept.unwrap(), Duration::from_millis(2000));
}

/// A refusal on one key of a keyed limiter: another key's waiter goes at
/// its moment and reserves once.
#[test]
fn keyed_pause_holds_only_its_key() {
    let clock = ManualClock::default();
    let limiter = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = at_once(limiter.call("a", 1)).unwrap();
    at_once(limiter.acquire("b", 1)).unwrap();
    let mut a: Boxed<'_, _> = Box::pin(limiter.acquire("a", 1));
    let mut b: Boxed<'_, _> = Box::pin(limiter.acquire("b", 1));
    assert!(poll(&mut a).is_none() && poll(&mut b).is_none());
    refused_at_20(&clock, first, 1000);
    let mut both = [Some(a), Some(b)];
    let done = run_until(&clock, &mut both, 3000);
    assert_eq!(done, vec![Some(1020), Some(100)]);
}

/// A caller that reserved after the refusal (behind the pause) wakes at
/// its end and goes: it reserves once. One whose moment is the pause's
/// end exactly goes then too.
#[test]
fn a_caller_reserved_behind_the_pause_or_at_its_end_reserves_once() {
    let clock = ManualClock::default();
    let limiter = limiter(&clock);
    let first = at_once(limiter.call(1)).unwrap();
    let mut at_end: Boxed<'_, _> = Box::pin(limiter.acquire(1)); // moment 100
    assert!(poll(&mut at_end).is_none());
    clock.set_ms(20);
    first.learn(&refused(80)); // until 100: the waiter's moment
    drop(first);
    let (went, _) = finish(&clock, &mut at_end, 3000).unwrap();
    assert_eq!(went, 100);
    // The rate is 7/s now: the next at 100 + 142.857 ms.
    let next = limiter.snapshot().unwrap().wait();
    assert!(next <= Duration::from_micros(142_858), "{next:?}");
    clock.set_ms(250);
    let second = at_once(limiter.call(1)).unwrap();
    clock.set_ms(300);
    second.learn(&refused(1000)); // until 1300
    drop(second);
    clock.set_ms(310);
    let mut behind: Boxed<'_, _> = Box::pin(limiter.acquire(1));
    let (went, _) = finish(&clock, &mut behind, 5000).unwrap();
    assert_eq!(went, 1300);
    // Reserved once: the next one interval (at 4.9/s) after 1300.
    let next = limiter.snapshot().unwrap().wait();
    assert!(next < Duration::from_millis(210), "{next:?}");
}

/// Through the trait objects: `Arc<dyn Limiter>` and `dyn KeyedLimiter`.
#[test]
fn trait_objects_go_behind_the_pause() {
    use paceline::{KeyedLimiter, Limiter};
    let clock = ManualClock::default();
    let single = Arc::new(limiter(&clock));
    let dynamic: Arc<dyn Limiter> = single.clone();
    let first = at_once(single.call(1)).unwrap();
    let mut waiter: Boxed<'_, _> = Box::pin(dynamic.try_acquire(1, Duration::from_millis(500)));
    let mut acquire: Boxed<'_, _> = Box::pin(async { dynamic.acquire(1).await.map(|_| true) });
    assert!(poll(&mut waiter).is_none() && poll(&mut acquire).is_none());
    refused_at_20(&clock, first, 1000);
    let mut both = [Some(waiter), Some(acquire)];
    let done = run_until(&clock, &mut both, 3000);
    assert_eq!(done, vec![Some(100), Some(1020)]);

    let clock = ManualClock::default();
    let keyed = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let dynamic: &dyn KeyedLimiter<String> = &keyed;
    let key = "k".to_string();
    let first = at_once(keyed.call("k", 1)).unwrap();
    let mut waiter = waiting(dynamic.acquire(&key, 1));
    refused_at_20(&clock, first, 1000);
    let (went, _) = finish(&clock, &mut waiter, 3000).unwrap();
    assert_eq!(went, 1020);
}
