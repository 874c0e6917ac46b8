//! A caller that waited and wakes inside a pause an upstream's refusal
//! started reserves again behind it: still one request, counted once with
//! the whole of its wait, as acquired if it went and refused if it did not.
//! A call's wait for its slot is part of its wait too. On a manual clock
//! polled by hand, so every step is exact.

use std::future::Future;
use std::time::Duration;

use paceline::metrics::{GIVEN_BACK, REQUESTS, TIME_IN_QUEUE};
use paceline::outbound::Feedback;
use paceline::{Limit, RateLimiter};

use super::recorder;
use crate::support::manual::{Boxed, ManualClock, at_once, poll};

/// `future`, boxed and polled once: it waits.
fn waiting<'a, T>(future: impl Future<Output = T> + 'a) -> Boxed<'a, T> {
    let mut future: Boxed<'a, T> = Box::pin(future);
    assert!(poll(&mut future).is_none(), "went at once");
    future
}

/// Polls `future` at each ms up to `end_ms`: the ms it finished at and
/// its output.
fn finish<T>(clock: &ManualClock, future: &mut Boxed<'_, T>, end_ms: u64) -> (u64, T) {
    let mut ms = clock.ms();
    loop {
        clock.set_ms(ms);
        if let Some(out) = poll(future) {
            return (ms, out);
        }
        assert!(ms < end_ms, "still waiting at {ms} ms");
        ms += 1;
    }
}

/// 10/s, no burst, two calls at once at most, named `name`.
fn limiter(clock: &ManualClock, name: &str) -> RateLimiter<paceline::Local, ManualClock> {
    RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::concurrent(2))
        .name(name)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// At 20 ms the upstream refuses `first` for a second: paused until
/// 1 020 ms. A caller that reserved at 0 for 100 ms wakes inside it.
fn refused_at_20(clock: &ManualClock, first: paceline::outbound::Call<'_>) {
    clock.set_ms(20);
    first.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(1)));
}

fn counts(seen: &super::Seen, name: &str) -> (u64, u64, Vec<f64>) {
    let acquired = seen.counter(REQUESTS, &[("limiter", name), ("result", "acquired")]);
    let refused = seen.counter(REQUESTS, &[("limiter", name), ("result", "refused")]);
    (
        acquired,
        refused,
        seen.histogram(TIME_IN_QUEUE, &[("limiter", name)]),
    )
}

#[test]
fn an_acquire_behind_a_pause_is_one_grant_with_its_whole_wait() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = limiter(&clock, "pause-acquire");
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.acquire(1));
    refused_at_20(&clock, first);
    let (went, slept) = finish(&clock, &mut waiter, 5_000);
    assert_eq!(
        (went, slept.unwrap()),
        (1_020, Duration::from_millis(1_020))
    );
    // The call, and the acquire once: 1.02 s in the queue.
    assert_eq!(counts(&seen, "pause-acquire"), (2, 0, vec![0.0, 1.02]));
}

#[test]
fn a_try_acquire_the_pause_outlasts_is_one_refusal() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = limiter(&clock, "pause-try");
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.try_acquire(1, Duration::from_millis(500)));
    refused_at_20(&clock, first);
    let (went, granted) = finish(&clock, &mut waiter, 5_000);
    assert_eq!((went, granted.unwrap()), (100, false));
    // The call acquired; the try refused, and nothing else.
    assert_eq!(counts(&seen, "pause-try"), (1, 1, vec![0.0]));
}

#[test]
fn a_call_behind_a_pause_is_one_grant_with_its_whole_wait() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = limiter(&clock, "pause-call");
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.call(1));
    refused_at_20(&clock, first);
    let (went, call) = finish(&clock, &mut waiter, 5_000);
    let call = call.unwrap();
    assert_eq!((went, call.waited()), (1_020, Duration::from_millis(1_020)));
    drop(call);
    assert_eq!(counts(&seen, "pause-call"), (2, 0, vec![0.0, 1.02]));
    // Later, a try_call the pause outlasts: one refusal.
    clock.set_ms(20_000);
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.try_call(1, Duration::from_millis(500)));
    clock.set_ms(clock.ms() + 20);
    first.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(1)));
    let (_, call) = finish(&clock, &mut waiter, 30_000);
    assert!(call.unwrap().is_none());
    let (acquired, refused, waits) = counts(&seen, "pause-call");
    assert_eq!((acquired, refused, waits.len()), (3, 1, 1));
}

/// Dropped behind the pause, an acquire is still one grant (it was one, and
/// what it reserved first stays spent) and one give-back (its second
/// reservation).
#[test]
fn an_acquire_dropped_behind_a_pause_is_one_grant() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = limiter(&clock, "pause-dropped");
    let first = at_once(limiter.call(1)).unwrap();
    let mut waiter = waiting(limiter.acquire(1));
    refused_at_20(&clock, first);
    for ms in 21..=500 {
        clock.set_ms(ms);
        assert!(poll(&mut waiter).is_none());
    }
    drop(waiter);
    // Its wait as it stood: 100 ms, then 920 behind the pause.
    assert_eq!(counts(&seen, "pause-dropped"), (2, 0, vec![0.0, 1.02]));
    assert_eq!(seen.counter(GIVEN_BACK, &[("limiter", "pause-dropped")]), 1);
}

/// The blocking form, on a thread of its own while this one moves the
/// clock.
#[test]
fn a_blocking_acquire_behind_a_pause_is_one_grant_with_its_whole_wait() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = limiter(&clock, "pause-blocking");
    let first = at_once(limiter.call(1)).unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| limiter.acquire_blocking(1));
        // Reserved: the next caller would wait two intervals.
        while limiter.snapshot().unwrap().wait() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(1));
        }
        refused_at_20(&clock, first);
        while !waiter.is_finished() {
            clock.advance(Duration::from_millis(1));
            std::thread::sleep(Duration::from_micros(200));
        }
        let slept = waiter.join().unwrap().unwrap();
        assert!(slept >= Duration::from_millis(1_000), "{slept:?}");
    });
    let (acquired, refused, waits) = counts(&seen, "pause-blocking");
    assert_eq!((acquired, refused, waits.len()), (2, 0, 2));
    assert!(waits[1] >= 1.0, "{waits:?}");
}

/// A call's time in the queue is all it waited: for its slot, then for
/// its permits.
#[test]
fn a_calls_time_in_queue_counts_its_wait_for_a_slot() {
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::concurrent(1))
        .name("slot-wait")
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = at_once(limiter.call(1)).unwrap();
    let mut second = waiting(limiter.call(1));
    clock.set_ms(30);
    assert!(poll(&mut second).is_none());
    drop(first);
    // The slot at 30 ms, the permit at 100.
    let (went, call) = finish(&clock, &mut second, 1_000);
    assert_eq!(
        (went, call.unwrap().waited()),
        (100, Duration::from_millis(100))
    );
    assert_eq!(counts(&seen, "slot-wait"), (2, 0, vec![0.0, 0.1]));
}
