//! Cancel safety of the in-process limiters, as a demanding user checks
//! it: every async method's future polled once (at each point where it
//! can stop) and then dropped, or kept and never polled again, against a
//! twin limiter that never saw the cancelled call. What the crate's
//! "Cancel safety" table promises: a dropped future gives back what it
//! took, exactly (the twin's state, to the bit); no caller's progress
//! depends on another caller's future being polled.
//!
//! Waits are slept on a `ManualClock` (its sleeps end only when the test
//! moves it), so a future can be caught mid-sleep; everything else is
//! exact and instant.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::StreamExt;
use paceline::clock::{Clock, FakeClock};
use paceline::stream::ThrottleExt;
use paceline::{KeyedRateLimiter, Limit, Local, RateLimiter, Snapshot};

use crate::support::manual::ManualClock;

const MS: Duration = Duration::from_millis(1);

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// The limits a case is built with: one bursty, one warming up, several
/// (two rates, each with a burst), and several where the second warms up.
fn configs() -> Vec<(&'static str, Vec<Limit>)> {
    vec![
        ("bursty", vec![Limit::per_second(10.0).burst(3)]),
        (
            "warming-up",
            vec![Limit::per_second(10.0).warmup(Duration::from_secs(2))],
        ),
        (
            "several",
            vec![
                Limit::per_second(10.0).burst(3),
                Limit::per(20.0, Duration::from_secs(10)).burst(4),
            ],
        ),
        (
            "several, warming up",
            vec![
                Limit::per_second(10.0).burst(2),
                Limit::per_second(4.0).warmup(Duration::from_secs(1)),
            ],
        ),
    ]
}

fn single(limits: &[Limit], clock: &ManualClock) -> RateLimiter<Local, ManualClock> {
    let mut builder = RateLimiter::builder();
    for limit in limits {
        builder = builder.limit(limit.clone());
    }
    builder.clock(clock.clone()).build().unwrap()
}

fn keyed(limits: &[Limit], clock: &ManualClock) -> KeyedRateLimiter<String, Local, ManualClock> {
    let mut builder = KeyedRateLimiter::<String>::builder();
    for limit in limits {
        builder = builder.limit(limit.clone());
    }
    builder.clock(clock.clone()).build().unwrap()
}

/// Debt for a limiter to wait behind: a few plain reservations, never
/// given back, with time passing between them.
fn prime(limiter: &RateLimiter<Local, ManualClock>, clock: &ManualClock) {
    for permits in [2, 3, 1] {
        limiter.reserve(permits).unwrap();
        clock.advance(7 * MS);
    }
    limiter.reserve(4).unwrap();
}

fn prime_keyed(limiter: &KeyedRateLimiter<String, Local, ManualClock>, clock: &ManualClock) {
    for permits in [2, 3, 1] {
        limiter.reserve("k", permits).unwrap();
        limiter.reserve("other", 1).unwrap();
        clock.advance(7 * MS);
    }
    limiter.reserve("k", 4).unwrap();
}

/// The two limiters agree now and from now on: the same snapshot, and
/// the same delays for the same reservations at the same moments.
fn agree(
    what: &str,
    cancelled: &RateLimiter<Local, ManualClock>,
    (twin, twin_clock): (&RateLimiter<Local, ManualClock>, &ManualClock),
    clock: &ManualClock,
) {
    assert_eq!(
        cancelled.snapshot().unwrap(),
        twin.snapshot().unwrap(),
        "{what}: the snapshot differs from the twin's"
    );
    for (step, permits) in [1, 2, 1, 5, 1].into_iter().enumerate() {
        let (a, b) = (
            cancelled.reserve(permits).unwrap(),
            twin.reserve(permits).unwrap(),
        );
        assert_eq!(
            a, b,
            "{what}: reservation {step} waits {a:?}, the twin's {b:?}"
        );
        clock.advance(13 * MS);
        twin_clock.advance(13 * MS);
    }
}

fn agree_keyed(
    what: &str,
    cancelled: &KeyedRateLimiter<String, Local, ManualClock>,
    (twin, twin_clock): (&KeyedRateLimiter<String, Local, ManualClock>, &ManualClock),
    clock: &ManualClock,
) {
    for key in ["k", "other"] {
        let (a, b): (Snapshot, Snapshot) = (
            cancelled.snapshot(key).unwrap(),
            twin.snapshot(key).unwrap(),
        );
        assert_eq!(a, b, "{what}: key {key}'s snapshot differs from the twin's");
    }
    for (step, permits) in [1, 2, 1, 5, 1].into_iter().enumerate() {
        let (a, b) = (
            cancelled.reserve("k", permits).unwrap(),
            twin.reserve("k", permits).unwrap(),
        );
        assert_eq!(
            a, b,
            "{what}: reservation {step} waits {a:?}, the twin's {b:?}"
        );
        clock.advance(13 * MS);
        twin_clock.advance(13 * MS);
    }
}

/// The async methods of a `RateLimiter`, each polled once (it reserves and
/// starts sleeping on the manual clock) and then dropped: the limiter is
/// its twin's, which never saw the call. Every config, both the plain
/// reservation and the concurrent-limit form of `call`.
#[test]
fn a_single_limiters_futures_polled_once_then_dropped_leave_the_twins_state() {
    for (name, limits) in configs() {
        for method in [
            "acquire",
            "try_acquire",
            "reservation.wait",
            "call",
            "try_call",
        ] {
            let what = format!("{name}, {method}");
            let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
            let (limiter, twin) = (single(&limits, &clock), single(&limits, &twin_clock));
            prime(&limiter, &clock);
            prime(&twin, &twin_clock);
            let big = Duration::from_secs(3600);
            {
                let mut future: Pin<Box<dyn Future<Output = ()> + '_>> = match method {
                    "acquire" => Box::pin(async { limiter.acquire(2).await.map(drop).unwrap() }),
                    "try_acquire" => Box::pin(async {
                        assert!(limiter.try_acquire(2, big).await.unwrap());
                    }),
                    "reservation.wait" => {
                        let reservation = limiter.reservation(2).unwrap();
                        assert!(!reservation.delay().is_zero(), "{what}");
                        Box::pin(async move {
                            reservation.wait().await;
                        })
                    }
                    "call" => Box::pin(async { drop(limiter.call(2).await.unwrap()) }),
                    "try_call" => {
                        Box::pin(async { drop(limiter.try_call(2, big).await.unwrap().unwrap()) })
                    }
                    _ => unreachable!(),
                };
                assert!(
                    poll_once(future.as_mut()).is_pending(),
                    "{what}: it did not wait"
                );
                // While it waits, something else happens at the same moment
                // on both.
                clock.advance(3 * MS);
                twin_clock.advance(3 * MS);
            }
            agree(&what, &limiter, (&twin, &twin_clock), &clock);
        }
    }
}

/// The same for a keyed limiter's key (another key's state untouched).
#[test]
fn a_keyed_limiters_futures_polled_once_then_dropped_leave_the_twins_state() {
    for (name, limits) in configs() {
        for method in [
            "acquire",
            "try_acquire",
            "reservation.wait",
            "call",
            "try_call",
        ] {
            let what = format!("{name}, keyed {method}");
            let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
            let (limiter, twin) = (keyed(&limits, &clock), keyed(&limits, &twin_clock));
            prime_keyed(&limiter, &clock);
            prime_keyed(&twin, &twin_clock);
            let big = Duration::from_secs(3600);
            {
                let mut future: Pin<Box<dyn Future<Output = ()> + '_>> = match method {
                    "acquire" => {
                        Box::pin(async { limiter.acquire("k", 2).await.map(drop).unwrap() })
                    }
                    "try_acquire" => Box::pin(async {
                        assert!(limiter.try_acquire("k", 2, big).await.unwrap());
                    }),
                    "reservation.wait" => {
                        let reservation = limiter.reservation("k", 2).unwrap();
                        Box::pin(async move {
                            reservation.wait().await;
                        })
                    }
                    "call" => Box::pin(async { drop(limiter.call("k", 2).await.unwrap()) }),
                    "try_call" => Box::pin(async {
                        drop(limiter.try_call("k", 2, big).await.unwrap().unwrap())
                    }),
                    _ => unreachable!(),
                };
                assert!(
                    poll_once(future.as_mut()).is_pending(),
                    "{what}: it did not wait"
                );
                clock.advance(3 * MS);
                twin_clock.advance(3 * MS);
            }
            agree_keyed(&what, &limiter, (&twin, &twin_clock), &clock);
        }
    }
}

/// Several waiters dropped out of order, some polled once and some never
/// polled, with a kept one between them: the limiter ends as the twin
/// that made only the kept one.
#[test]
fn waiters_dropped_in_any_order_give_back_exactly() {
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (single(&limits, &clock), single(&limits, &twin_clock));
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        {
            let mut a = Box::pin(limiter.acquire(1));
            let mut b = Box::pin(limiter.try_acquire(2, Duration::from_secs(60)));
            let never_polled = Box::pin(limiter.acquire(3));
            assert!(poll_once(a.as_mut()).is_pending());
            assert!(poll_once(b.as_mut()).is_pending());
            let kept = limiter.reservation(1).unwrap();
            twin.reservation(1).unwrap().keep();
            let mut c = Box::pin(limiter.call(2));
            assert!(poll_once(c.as_mut()).is_pending());
            kept.keep();
            drop(b);
            drop(never_polled);
            drop(c);
            drop(a);
        }
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// A waiter polled once and then forgotten (never dropped, never polled
/// again) keeps its reservation, as a caller still waiting does: the
/// others are scheduled after it and none of them waits for it to be
/// polled. Once its moment has passed, more than a log's worth of
/// requests later, a give-back of another caller is still exact (a
/// forgotten reservation does not hold the log open).
#[test]
fn a_forgotten_waiter_holds_no_one_up_and_does_not_pin_the_log() {
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (single(&limits, &clock), single(&limits, &twin_clock));
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        let mut forgotten = Box::pin(limiter.acquire(2));
        assert!(poll_once(forgotten.as_mut()).is_pending());
        std::mem::forget(forgotten);
        // The twin keeps the same reservation.
        twin.reservation(2).unwrap().keep();
        agree(name, &limiter, (&twin, &twin_clock), &clock);
        // Long past its moment, 1 500 requests later (more than the log's
        // 1 024), one more caller gives back.
        clock.advance(Duration::from_secs(3600));
        twin_clock.advance(Duration::from_secs(3600));
        for _ in 0..1_500 {
            limiter.reserve(1).unwrap();
            twin.reserve(1).unwrap();
            clock.advance(50 * MS);
            twin_clock.advance(50 * MS);
        }
        limiter.reserve(7).unwrap();
        twin.reserve(7).unwrap();
        {
            let mut dropped = Box::pin(limiter.acquire(3));
            assert!(poll_once(dropped.as_mut()).is_pending(), "{name}");
        }
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// A keyed limiter: a forgotten waiter of one key holds up neither its
/// key's later callers nor another key's.
#[tokio::test]
async fn a_forgotten_keyed_waiter_holds_no_one_up() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(1000.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let manual = ManualClock::default();
    let slow = keyed(&[Limit::per_second(1.0)], &manual);
    slow.reserve("k", 5).unwrap();
    let mut forgotten = Box::pin(slow.acquire("k", 1));
    assert!(poll_once(forgotten.as_mut()).is_pending());
    let mut kept = vec![forgotten];
    // The key's next caller goes once its own moment comes.
    manual.advance(Duration::from_secs(10));
    let next = tokio::time::timeout(Duration::from_secs(5), slow.acquire("k", 1)).await;
    assert!(
        next.is_ok(),
        "the key's next caller waited for the forgotten one"
    );
    kept.clear();
    for _ in 0..100 {
        tokio::time::timeout(Duration::from_secs(5), limiter.acquire("a", 1))
            .await
            .expect("a caller stalled")
            .unwrap();
    }
}

/// Slots of `Limit::concurrent`: a call waiting for a slot, polled once
/// and then kept but never polled again (a future parked in a `Vec` that
/// nobody drives), must not hold up the callers after it: the table says
/// a dropped waiter "takes none (its place in line goes to the next)", and
/// the project promises that no caller's progress depends on another
/// caller's future being polled.
///
/// The slot freed by the holder is kept for the parked waiter (it came
/// first), but only for a moment: handed to it for good, as a fair
/// semaphore queue does, it would never be taken, used and given back, and
/// every later caller of the key would wait forever (here: past a 5 s
/// bound on a limiter with no rate to speak of).
#[tokio::test]
async fn a_parked_slot_waiter_does_not_hold_up_the_next_caller() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(1_000_000.0))
        .limit(Limit::concurrent(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let holder = limiter.call(1).await.unwrap();
    let mut parked = Box::pin(limiter.call(1));
    assert!(poll_once(parked.as_mut()).is_pending());
    let parked = vec![parked];
    drop(holder);
    let next = tokio::time::timeout(Duration::from_secs(5), limiter.call(1)).await;
    assert!(
        next.is_ok(),
        "the slot went to a waiter nobody polls: the next caller is stalled \
         (in flight: {})",
        limiter.stats().in_flight
    );
    drop(parked);
}

/// The same with the waiter forgotten outright (`mem::forget`), on a
/// keyed limiter's key, for `try_call` with a long timeout (on a manual
/// clock, which only the test moves) and for `call`: the next caller of
/// the key stalls although nobody uses the slot (`stats().in_flight`
/// reads 0 meanwhile).
#[tokio::test]
async fn a_forgotten_slot_waiter_does_not_hold_up_the_next_caller() {
    for method in ["try_call", "call"] {
        let clock = ManualClock::default();
        let limiter = keyed(
            &[Limit::per_second(1_000_000.0), Limit::concurrent(1)],
            &clock,
        );
        let holder = limiter.call("k", 1).await.unwrap();
        let mut forgotten: Pin<Box<dyn Future<Output = ()> + '_>> = match method {
            "try_call" => Box::pin(async {
                drop(limiter.try_call("k", 1, Duration::from_secs(3600)).await);
            }),
            _ => Box::pin(async { drop(limiter.call("k", 1).await) }),
        };
        assert!(poll_once(forgotten.as_mut()).is_pending(), "{method}");
        std::mem::forget(forgotten);
        drop(holder);
        let next = tokio::time::timeout(Duration::from_secs(5), limiter.call("k", 1)).await;
        assert!(
            next.is_ok(),
            "{method}: the freed slot went to a forgotten waiter; the next caller \
             is stalled (in flight: {})",
            limiter.stats().in_flight
        );
    }
}

/// A slot waiter dropped (not parked) hands its place on, and a call
/// dropped while it sleeps for its reservation gives back the slot and the
/// estimate (the twin never made it).
#[tokio::test]
async fn a_dropped_call_gives_back_its_slot_and_its_estimate() {
    let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
    let limits = [Limit::per_second(10.0).burst(2), Limit::concurrent(2)];
    let (limiter, twin) = (single(&limits, &clock), single(&limits, &twin_clock));
    prime(&limiter, &clock);
    prime(&twin, &twin_clock);
    {
        // Takes a slot, then sleeps for its reservation.
        let mut sleeping = Box::pin(limiter.call(3));
        assert!(poll_once(sleeping.as_mut()).is_pending());
        assert_eq!(limiter.stats().in_flight, 1);
        let mut second = Box::pin(limiter.call(1));
        assert!(poll_once(second.as_mut()).is_pending());
        assert_eq!(limiter.stats().in_flight, 2);
        // Waits for a slot.
        let mut third = Box::pin(limiter.try_call(1, Duration::from_secs(60)));
        assert!(poll_once(third.as_mut()).is_pending());
        assert_eq!(limiter.stats().in_flight, 2);
        drop(third);
        drop(sleeping);
        drop(second);
    }
    assert_eq!(limiter.stats().in_flight, 0);
    agree("call", &limiter, (&twin, &twin_clock), &clock);
}

/// A throttled stream dropped while its item waits gives the item's
/// permits back: the limiter is its twin's.
#[test]
fn a_throttled_stream_dropped_mid_wait_gives_its_item_back() {
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (
            Arc::new(single(&limits, &clock)),
            single(&limits, &twin_clock),
        );
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        {
            let mut stream = futures::stream::iter([1, 2, 3]).throttle(Arc::clone(&limiter));
            let mut next = stream.next();
            assert!(poll_once(Pin::new(&mut next)).is_pending(), "{name}");
        }
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// A throttled writer: a write dropped mid wait leaves its reservation
/// with the writer (the next write uses it); dropping the writer gives it
/// back.
#[test]
fn a_throttled_writer_dropped_mid_wait_gives_its_reservation_back() {
    use tokio::io::AsyncWriteExt;
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (
            Arc::new(single(&limits, &clock)),
            single(&limits, &twin_clock),
        );
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        {
            let mut sink = Vec::new();
            let mut writer = paceline::io::ThrottledWriter::new(&mut sink, Arc::clone(&limiter));
            {
                let write = writer.write(&[1, 2, 3]);
                let mut write = pin!(write);
                assert!(poll_once(write.as_mut()).is_pending(), "{name}");
            }
            // Polled once more, then dropped again: nothing new reserved.
            {
                let write = writer.write(&[1, 2, 3]);
                let mut write = pin!(write);
                assert!(poll_once(write.as_mut()).is_pending(), "{name}");
            }
        }
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// The same for a reader.
#[test]
fn a_throttled_reader_dropped_mid_wait_gives_its_reservation_back() {
    use tokio::io::AsyncReadExt;
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (
            Arc::new(single(&limits, &clock)),
            single(&limits, &twin_clock),
        );
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        {
            let data = [7u8; 3];
            let mut reader = paceline::io::ThrottledReader::new(&data[..], Arc::clone(&limiter));
            let mut buf = [0u8; 3];
            {
                let read = reader.read(&mut buf);
                let mut read = pin!(read);
                assert!(poll_once(read.as_mut()).is_pending(), "{name}");
            }
        }
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// `now_or_never` on `acquire` with a debt: not ready, dropped; the
/// limiter is its twin's (the one-liner a user writes for "only if free").
#[test]
fn now_or_never_on_a_waiting_acquire_gives_back() {
    use futures::FutureExt;
    for (name, limits) in configs() {
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (limiter, twin) = (single(&limits, &clock), single(&limits, &twin_clock));
        prime(&limiter, &clock);
        prime(&twin, &twin_clock);
        for _ in 0..5 {
            assert!(limiter.acquire(1).now_or_never().is_none(), "{name}");
            assert!(
                limiter
                    .try_acquire(1, Duration::from_secs(9))
                    .now_or_never()
                    .is_none(),
                "{name}"
            );
            assert!(limiter.call(1).now_or_never().is_none(), "{name}");
        }
        let _ = clock.now();
        agree(name, &limiter, (&twin, &twin_clock), &clock);
    }
}

/// A keyed limiter's reservation forgotten (`mem::forget`) long before
/// its moment does not pin its key in memory once its moment has passed:
/// after an hour and sweeps driven by calls on other keys, the limiter
/// holds as many keys as a twin that never made it.
#[test]
fn a_forgotten_reservation_does_not_pin_its_key_forever() {
    let limits = [Limit::per_second(10.0).burst(2)];
    let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
    let (limiter, twin) = (keyed(&limits, &clock), keyed(&limits, &twin_clock));
    for permits in [5, 3] {
        limiter.reserve("k", permits).unwrap();
        twin.reserve("k", permits).unwrap();
    }
    std::mem::forget(limiter.reservation("k", 4).unwrap());
    twin.reservation("k", 4).unwrap().keep();
    for round in 0..5u64 {
        clock.advance(Duration::from_secs(900));
        twin_clock.advance(Duration::from_secs(900));
        for key in 0..200u64 {
            let key = format!("{round}-{key}");
            limiter.reserve(&key, 1).unwrap();
            twin.reserve(&key, 1).unwrap();
        }
    }
    assert_eq!(
        limiter.stats().keys,
        twin.stats().keys,
        "the forgotten reservation's key is still held"
    );
    assert_eq!(limiter.snapshot("k").unwrap(), twin.snapshot("k").unwrap());
}
