//! Calls in flight (`Limit::concurrent`) on the limiter with no key: at
//! most `k` calls hold a slot, whatever many tasks do; a call takes its
//! slot and then its place in the schedule, both or neither; cancelled at
//! any point, it gives back what it took; the builder's rules.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use crate::support::within::within;
use paceline::clock::{FakeClock, SystemClock};
use paceline::{Cost, Error, Limit, Local, RateLimiter};

const MS: Duration = Duration::from_millis(1);

fn limiter(rate: f64, burst: u64, calls: u32) -> RateLimiter<Local, FakeClock> {
    RateLimiter::builder()
        .limit(Limit::per_second(rate).burst(burst))
        .limit(Limit::concurrent(calls))
        .clock(FakeClock::new())
        .build()
        .unwrap()
}

/// A runtime on the calling thread, with timers.
fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime on two worker threads, with timers.
fn two_threads() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `future` once: whether it is still pending.
fn pending<F: Future>(future: std::pin::Pin<&mut F>) -> bool {
    future
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_k_calls_are_in_flight_under_many_tasks() {
    let limiter = Arc::new(limiter(1e6, 1_000, 4));
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..64 {
        let (limiter, now, most) = (limiter.clone(), now.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..20 {
                let call = if (task + round) % 3 == 0 {
                    limiter.try_call(1, Duration::from_secs(60)).await.unwrap()
                } else {
                    Some(limiter.call(1).await.unwrap())
                };
                let Some(call) = call else { continue };
                let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(in_flight, Ordering::SeqCst);
                assert!(in_flight <= 4, "{in_flight} calls in flight");
                assert!(limiter.stats().in_flight <= 4);
                for _ in 0..(task % 4) {
                    tokio::task::yield_now().await;
                }
                if task % 8 == 0 {
                    tokio::time::sleep(MS / 10).await;
                }
                now.fetch_sub(1, Ordering::SeqCst);
                drop(call);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 4);
    assert_eq!(limiter.stats().in_flight, 0);
}

#[tokio::test]
async fn a_call_dropped_while_it_waits_for_a_slot_takes_none_and_strands_none() {
    let limiter = limiter(1_000.0, 1_000, 1);
    let held = limiter.call(1).await.unwrap();
    assert_eq!(limiter.stats().in_flight, 1);
    // Two callers wait in line; the first of them gives up.
    let mut first = pin!(limiter.call(1));
    assert!(pending(first.as_mut()));
    let mut second = pin!(limiter.call(1));
    assert!(pending(second.as_mut()));
    assert_eq!(limiter.stats().in_flight, 1);
    // Dropped in place (a select! arm that lost).
    first.set(limiter.call(1));
    drop(held);
    // The freed slot goes to the one still waiting.
    let second = second.await.unwrap();
    assert_eq!(limiter.stats().in_flight, 1);
    assert!(limiter.try_call(1, Duration::ZERO).await.unwrap().is_none());
    drop(second);
    // The replacement made above never ran: nothing is taken, and the
    // slot is free for anyone.
    assert_eq!(limiter.stats().in_flight, 0);
    let again = limiter.try_call(1, Duration::ZERO).await.unwrap();
    assert!(again.is_some());
}

#[tokio::test]
async fn a_call_dropped_while_it_waits_for_its_place_gives_back_slot_and_place() {
    // The real clock: the call sleeps for its place holding its slot.
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::concurrent(2))
        .build()
        .unwrap();
    let first = limiter.call(1).await.unwrap();
    {
        let mut waiting = pin!(limiter.call(1));
        assert!(pending(waiting.as_mut()));
        assert_eq!(limiter.stats().in_flight, 2);
        // Its place is taken: a try that cannot wait is refused.
        assert_eq!(limiter.try_reserve(1, 150 * MS).unwrap(), None);
    }
    assert_eq!(limiter.stats().in_flight, 1);
    // Given back: the next request waits for the first call only.
    let wait = limiter.reserve(1).unwrap();
    assert!(wait <= 100 * MS && wait > 50 * MS, "{wait:?}");
    drop(first);
    assert_eq!(limiter.stats().in_flight, 0);
}

#[tokio::test]
async fn a_try_call_that_finds_no_slot_takes_no_place() {
    let limiter = limiter(1.0, 1, 1);
    let clock = limiter.clock();
    let held = limiter.call(1).await.unwrap();
    // No slot within 50 ms: refused (the fake clock moves by the wait).
    assert!(limiter.try_call(1, 50 * MS).await.unwrap().is_none());
    assert_eq!(clock.now(), 50 * MS);
    assert_eq!(limiter.stats().in_flight, 1);
    // No place was taken: the next is the held call's successor.
    assert_eq!(limiter.snapshot().unwrap().wait(), 950 * MS);
    drop(held);
    assert_eq!(limiter.stats().in_flight, 0);
}

#[tokio::test]
async fn a_slot_taken_then_refused_by_the_schedule_goes_back_at_once() {
    let limiter = limiter(1.0, 1, 1);
    drop(limiter.call(1).await.unwrap());
    // The slot is free, the schedule's next place a second away.
    assert!(limiter.try_call(1, 10 * MS).await.unwrap().is_none());
    assert_eq!(limiter.stats().in_flight, 0);
    assert_eq!(limiter.clock().now(), Duration::ZERO);
    let call = limiter.try_call(1, Duration::from_secs(1)).await.unwrap();
    let call = call.expect("the slot went back");
    assert_eq!(call.waited(), Duration::from_secs(1));
    assert_eq!(limiter.stats().in_flight, 1);
}

#[tokio::test]
async fn a_try_calls_timeout_covers_its_slot_and_its_place_together() {
    // The real clock. The held call ends 300 ms in; the schedule's next
    // place is 1 s in. With 800 ms for both, the slot comes at 300 ms and
    // the place would take 700 ms more: refused, and the slot goes back.
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(1.0).burst(1))
        .limit(Limit::concurrent(1))
        .clock(SystemClock::new())
        .build()
        .unwrap();
    let held = limiter.call(1).await.unwrap();
    let started = Instant::now();
    let ends = async {
        tokio::time::sleep(300 * MS).await;
        drop(held);
    };
    let (refused, ()) = tokio::join!(limiter.try_call(1, 800 * MS), ends);
    assert!(refused.unwrap().is_none());
    let elapsed = started.elapsed();
    assert!(elapsed >= 250 * MS && elapsed < 750 * MS, "{elapsed:?}");
    assert_eq!(limiter.stats().in_flight, 0);
    // Its place was not taken either: the schedule still opens at 1 s.
    let wait = limiter.snapshot().unwrap().wait();
    assert!(wait <= 700 * MS && wait >= 200 * MS, "{wait:?}");
}

/// Calls cancelled wherever they are (waiting for a slot, or holding one
/// while they wait for their place: `timeout` around `call`, and
/// `try_call`'s own bound) by many tasks at once: never more than `k` in
/// flight, and once every task is done all `k` slots are free again and no
/// more than `k`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_cancelled_at_random_points_strand_no_slot_and_never_exceed_k() {
    // The real clock: a call sleeps for its place holding its slot.
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(3_000.0).burst(1))
            .limit(Limit::concurrent(3))
            .build()
            .unwrap(),
    );
    let now = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..48u64 {
        let (limiter, now) = (limiter.clone(), now.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..30u64 {
                let bound = Duration::from_micros(100 + (task * 53 + round * 97) % 2_500);
                let call = if round % 2 == 0 {
                    match tokio::time::timeout(bound, limiter.call(1)).await {
                        Ok(call) => Some(call.unwrap()),
                        Err(_) => None,
                    }
                } else {
                    limiter.try_call(1, bound).await.unwrap()
                };
                let Some(call) = call else { continue };
                let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(in_flight <= 3, "{in_flight} calls in flight");
                assert!(limiter.stats().in_flight <= 3);
                tokio::time::sleep(Duration::from_micros((task * 7 + round) % 500)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                drop(call);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(limiter.stats().in_flight, 0);
    let held = futures::future::join_all((0..3).map(|_| limiter.call(1))).await;
    assert!(held.iter().all(Result::is_ok));
    assert!(limiter.try_call(1, 20 * MS).await.unwrap().is_none());
}

/// A task that panics while it holds a call frees the call's slot as it
/// unwinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_holding_a_call_frees_its_slot() {
    let limiter = Arc::new(limiter(1_000.0, 1_000, 1));
    let panicking = limiter.clone();
    let joined = tokio::spawn(async move {
        let _call = panicking.call(1).await.unwrap();
        panic!("the upstream's client panicked");
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(limiter.stats().in_flight, 0);
    assert!(limiter.try_call(1, Duration::ZERO).await.unwrap().is_some());
}

/// Tasks aborted while their calls wait for a slot, wait for their place
/// holding one, or hold their call: every slot comes back, and so does the
/// place that was waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_tasks_strand_no_slot() {
    // The real clock. The first call goes at once; the second holds its
    // slot and sleeps for its place, a second away; four wait for a slot.
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(1.0).burst(1))
            .limit(Limit::concurrent(2))
            .build()
            .unwrap(),
    );
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let _call = limiter.call(1).await.unwrap();
                std::future::pending::<()>().await;
            })
        })
        .collect();
    let full = within(Duration::from_secs(5), || limiter.stats().in_flight == 2).await;
    assert!(full.is_some(), "{:?}", limiter.stats());
    tokio::time::sleep(20 * MS).await;
    assert_eq!(limiter.stats().in_flight, 2);
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert_eq!(limiter.stats().in_flight, 0);
    // The second call's place went back: the next is a second after the
    // first call's, not two.
    let wait = limiter.snapshot().unwrap().wait();
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
    let call = limiter.try_call(1, Duration::from_secs(5)).await.unwrap();
    assert!(call.is_some());
    assert_eq!(limiter.stats().in_flight, 1);
}

#[tokio::test]
async fn slots_are_held_by_calls_only() {
    let limiter = limiter(f64::INFINITY, 1, 1);
    let call = limiter.call(1).await.unwrap();
    assert!(limiter.try_call(1, Duration::ZERO).await.unwrap().is_none());
    // Plain reservations and acquires take no slot.
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    limiter.acquire(3).await.unwrap();
    drop(limiter.reservation(2).unwrap());
    assert_eq!(limiter.stats().in_flight, 1);
    drop(call);
    assert_eq!(limiter.stats().in_flight, 0);
}

#[tokio::test]
async fn a_concurrent_limit_takes_no_place_in_a_cost() {
    // Requests and tokens, with the concurrent limit given between them:
    // a cost counts the two rate limits, in order.
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(10))
        .limit(Limit::concurrent(2))
        .limit(Limit::per_second(1_000.0).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let first = limiter.call(Cost::each([1, 600])).await.unwrap();
    assert_eq!(first.waited(), Duration::ZERO);
    drop(first);
    // 600 tokens at 1 000 a second.
    let second = limiter.call(Cost::each([1, 1])).await.unwrap();
    assert_eq!(second.waited(), 600 * MS);
    // A third count is for a limit the limiter lacks.
    assert!(matches!(
        limiter
            .try_call(Cost::each([1, 1, 1]), Duration::ZERO)
            .await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(limiter.stats().in_flight, 1);
}

#[test]
fn the_builder_checks_the_concurrent_limit() {
    let invalid = |builder: paceline::Builder<paceline::NoKey, Local, FakeClock>| {
        matches!(builder.build(), Err(Error::InvalidArgument(_)))
    };
    let base = || RateLimiter::builder().clock(FakeClock::new());
    assert!(invalid(
        base().permits_per_second(1.0).limit(Limit::concurrent(0))
    ));
    assert!(invalid(base().limit(Limit::concurrent(3))));
    assert!(invalid(
        base()
            .permits_per_second(1.0)
            .limit(Limit::concurrent(2))
            .limit(Limit::concurrent(3))
    ));
    for shaped in [
        Limit::concurrent(2).burst(5),
        Limit::concurrent(2).warmup(Duration::from_secs(1)),
        Limit::concurrent(2).cold_factor(2.0),
        Limit::concurrent(2).named("requests"),
    ] {
        assert!(invalid(base().permits_per_second(1.0).limit(shaped)));
    }
    // A rate and a cap, or no rate to speak of and a cap.
    assert!(
        base()
            .permits_per_second(1.0)
            .limit(Limit::concurrent(1))
            .build()
            .is_ok()
    );
    let unbounded = base()
        .limit(Limit::per_second(f64::INFINITY))
        .limit(Limit::concurrent(1))
        .build()
        .unwrap();
    assert_eq!(unbounded.reserve(1_000).unwrap(), Duration::ZERO);
}

/// A caller that gives its slot back and calls again at once (a worker's
/// loop: call, await the answer, finish, call) goes behind the call that
/// was waiting, not ahead of it. On one thread, with time standing still
/// (a slot kept for a waiter is kept 50 ms), the waiter is served as soon
/// as the loop's call in flight when it came ends; on two threads at
/// full speed, long before the loop's end, where before the loop kept the
/// slot for all its 10 000 calls. (On a quiet machine within a few calls;
/// on a loaded one, each time the waiter's thread is not run for 50 ms
/// while its slot is kept, it loses its turn and the loop runs on
/// meanwhile: 1 506 calls once, at a load of 8 on two cores.)
#[test]
fn a_caller_that_calls_again_at_once_goes_behind_the_waiter() {
    let runtimes = [
        (
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap(),
            1,
        ),
        (
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
            5_000,
        ),
    ];
    for (runtime, bound) in runtimes {
        let (asked, served) = runtime.block_on(async {
            let limiter = Arc::new(limiter(1e9, 1_000_000, 1));
            let looped = Arc::new(AtomicUsize::new(0));
            let worker = tokio::spawn({
                let (limiter, looped) = (Arc::clone(&limiter), Arc::clone(&looped));
                async move {
                    while looped.load(Ordering::SeqCst) < 10_000 {
                        let call = limiter.call(1).await.unwrap();
                        tokio::task::yield_now().await; // the upstream's answer
                        drop(call);
                        looped.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            while looped.load(Ordering::SeqCst) < 3 {
                tokio::task::yield_now().await;
            }
            // In line once polled, unless the slot was free then.
            let mut waiting = Box::pin(limiter.call(1));
            let asked = looped.load(Ordering::SeqCst);
            let served = match pending(waiting.as_mut()) {
                true => {
                    let call = waiting.await.unwrap();
                    let served = looped.load(Ordering::SeqCst);
                    drop(call);
                    served
                }
                false => asked,
            };
            worker.await.unwrap();
            (asked, served)
        });
        assert!(
            served <= asked + bound,
            "the waiter asked after {asked} of the loop's calls and was served after {served}"
        );
    }
}

/// Waiting calls are served in the order they came, one slot at a time.
#[tokio::test]
async fn waiting_calls_are_served_in_the_order_they_came() {
    let limiter = limiter(1e9, 1_000_000, 1);
    let holder = limiter.call(1).await.unwrap();
    let mut waiting: Vec<_> = (0..5).map(|_| Box::pin(limiter.call(1))).collect();
    for call in &mut waiting {
        assert!(pending(call.as_mut()));
    }
    drop(holder);
    // Each slot given back goes to the longest waiting: polled in reverse
    // order, only the first is served.
    for served in 0..5 {
        for later in (served + 1..5).rev() {
            assert!(
                pending(waiting[later].as_mut()),
                "call {later} went before call {served}"
            );
        }
        let call = waiting[served].as_mut().await.unwrap();
        assert_eq!(limiter.stats().in_flight, 1);
        drop(call);
    }
}

/// A waiter parked after its first poll (or forgotten) holds a slot kept
/// for it only a moment: the next call is served, and the parked one,
/// polled again later, waits behind the calls then in line and is served
/// in its turn.
#[tokio::test]
async fn a_parked_waiter_loses_its_turn_and_gets_another() {
    let limiter = limiter(1e9, 1_000_000, 1);
    let holder = limiter.call(1).await.unwrap();
    let mut parked = Box::pin(limiter.call(1));
    assert!(pending(parked.as_mut()));
    drop(holder);
    let started = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(10), limiter.call(1))
        .await
        .expect("the next call is stalled behind the parked one")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the next call waited {took:?}"
    );
    // Polled again while the next call holds the slot: in line, then served.
    assert!(pending(parked.as_mut()));
    drop(next);
    let parked = tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .expect("the parked call, polled again, is never served")
        .unwrap();
    assert_eq!(limiter.stats().in_flight, 1);
    drop(parked);
    assert_eq!(limiter.stats().in_flight, 0);
}

/// A call already waiting behind a parked one gets the slot once it has
/// been kept a moment for the parked one, though no other call comes to
/// look: every call in line is woken when the moment is over.
#[test]
fn a_waiter_behind_a_parked_one_is_served_without_another_call() {
    let runtime = two_threads();
    runtime.block_on(async {
        let limiter = Arc::new(limiter(1e9, 1_000_000, 1));
        let holder = limiter.call(1).await.unwrap();
        let mut parked = Box::pin(limiter.call(1));
        assert!(pending(parked.as_mut()));
        let behind = tokio::spawn({
            let limiter = Arc::clone(&limiter);
            async move { drop(limiter.call(1).await.unwrap()) }
        });
        // In line behind the parked call.
        tokio::time::sleep(20 * MS).await;
        assert!(!behind.is_finished());
        drop(holder);
        tokio::time::timeout(Duration::from_secs(10), behind)
            .await
            .expect("the call behind the parked one is never served")
            .unwrap();
        drop(parked);
    });
}

/// A waiter that comes late for the slot kept for it (after the moment it
/// is kept) still takes it if no other call has: the slot is free to the
/// first call that looks, not handed on down the line while nobody uses it.
#[test]
fn a_late_waiter_takes_the_slot_nobody_else_took() {
    let runtime = one_thread();
    runtime.block_on(async {
        let limiter = limiter(1e9, 1_000_000, 1);
        let holder = limiter.call(1).await.unwrap();
        let mut late = Box::pin(limiter.call(1));
        assert!(pending(late.as_mut()));
        let mut behind = Box::pin(limiter.call(1));
        assert!(pending(behind.as_mut()));
        drop(holder);
        // Past the moment the slot is kept for it.
        std::thread::sleep(Duration::from_millis(200));
        let call = late.as_mut().await.unwrap();
        assert_eq!(limiter.stats().in_flight, 1);
        assert!(pending(behind.as_mut()));
        drop(call);
        drop(behind.as_mut().await.unwrap());
        assert_eq!(limiter.stats().in_flight, 0);
    });
}

/// Slots need no timer of the runtime: on one built without timers, on a
/// fake clock, a call that finds a slot kept for another waits (no panic)
/// and is served after it.
#[test]
fn slots_work_on_a_runtime_without_timers() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = limiter(1e9, 1_000_000, 1);
        let holder = limiter.call(1).await.unwrap();
        let mut first = Box::pin(limiter.call(1));
        assert!(pending(first.as_mut()));
        drop(holder);
        let mut second = Box::pin(limiter.call(1));
        assert!(pending(second.as_mut()));
        let call = first.as_mut().await.unwrap();
        assert!(pending(second.as_mut()));
        drop(call);
        drop(second.as_mut().await.unwrap());
    });
}

/// Many calls parked in line (each polled once, then kept and never polled
/// again) hold up the calls behind them a moment in all, not a moment
/// each: a call woken to look that has not looked when a slot is next
/// given back is passed over. With 60 parked ahead of 60 live calls, a
/// moment for a parked call before each live one would be 3 s.
#[test]
fn many_parked_waiters_hold_up_the_others_a_moment_in_all() {
    let runtime = two_threads();
    runtime.block_on(async {
        let limiter = Arc::new(limiter(1e9, 1_000_000, 1));
        let holder = limiter.call(1).await.unwrap();
        let mut parked: Vec<_> = (0..60).map(|_| Box::pin(limiter.call(1))).collect();
        for call in &mut parked {
            assert!(pending(call.as_mut()));
        }
        let behind: Vec<_> = (0..60)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move { drop(limiter.call(1).await.unwrap()) })
            })
            .collect();
        tokio::time::sleep(20 * MS).await;
        let started = Instant::now();
        drop(holder);
        for call in behind {
            call.await.unwrap();
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1_500),
            "the calls behind took {took:?}"
        );
        drop(parked);
    });
}
