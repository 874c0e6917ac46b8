//! Cancel safety of the Redis limiters, as a demanding user checks it:
//! each async method's future polled once (its round trip in flight) or
//! run until it sleeps, then dropped, coalescing on and off; and futures
//! polled once and then kept, never polled again (parked in a `Vec`), or
//! forgotten, which must hold up no other caller of the key (the crate's
//! "Cancel safety" table, and `RedisBackendBuilder::coalesce`: "a caller
//! waits at most the response timeout, whether or not the key's other
//! callers are polled").
//!
//! Real-clock bounds here are generous upper bounds, to catch a hang, or
//! lower bounds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::support::poll::{PROBE_INTERVAL, backend_builder};
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Redis, RedisBackend};
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

const MS: Duration = Duration::from_millis(1);
/// The bound that tells a hang from a slow machine.
const HANG: Duration = Duration::from_secs(5);

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A backend on `server` that waits 5 s for Redis (a loaded machine's slow
/// reply must not send a call to the fallback), coalescing or not.
async fn backend(server: &RedisServer, coalesce: bool) -> RedisBackend {
    backend_builder(server.client())
        .response_timeout(HANG)
        .coalesce(coalesce)
        .build()
        .await
        .unwrap()
}

/// 1 permit each 10 s (and 10 a minute), one at once: a give-back that
/// does not land leaves tens of seconds more debt.
fn slow(backend: &RedisBackend, name: &str, concurrent: bool) -> RateLimiter<Redis> {
    let mut builder = RateLimiter::builder()
        .limit(Limit::per_second(0.1).burst(1))
        .limit(Limit::per(10.0, Duration::from_secs(60)).burst(1));
    if concurrent {
        builder = builder.limit(Limit::concurrent(1));
    }
    builder.redis(backend, name).build().unwrap()
}

fn slow_keyed(backend: &RedisBackend, name: &str) -> KeyedRateLimiter<String, Redis> {
    KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(0.1).warmup(Duration::from_secs(20)))
        .redis(backend, name)
        .build()
        .unwrap()
}

/// Waits until the debt reads at most `at_most` (give-backs land in the
/// background), at most 5 s; the debt read last.
async fn debt_falls_to(read: impl AsyncFnMut() -> Duration, at_most: Duration) -> Duration {
    let mut read = read;
    let started = Instant::now();
    loop {
        let debt = read().await;
        if debt <= at_most || started.elapsed() > HANG {
            return debt;
        }
        tokio::time::sleep(10 * MS).await;
    }
}

/// How a future is cut short.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Polled once (its round trip in flight), then dropped.
    InFlight,
    /// Run until it sleeps for its reservation (300 ms), then dropped.
    Sleeping,
}

/// Each async method of a single Redis limiter (two limits; a third,
/// concurrent, for the calls), cut short in flight or while it sleeps,
/// coalescing on and off: what it reserved is given back (the debt falls
/// back to the one interval the priming reservation left), and a call's
/// slot goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_cut_short_gives_back_through_redis() {
    let server = RedisServer::start();
    for coalesce in [true, false] {
        let backend = backend(&server, coalesce).await;
        for cut in [Cut::InFlight, Cut::Sleeping] {
            for method in ["acquire", "try_acquire", "reservation", "call", "try_call"] {
                let name = format!("cut-{coalesce}-{cut:?}-{method}");
                let concurrent = method.contains("call");
                let limiter = slow(&backend, &name, concurrent);
                // Some debt: the stored permit and one interval.
                assert!(limiter.reserve(2).await.unwrap().is_zero(), "{name}");
                let before = limiter.snapshot().await.unwrap().wait();
                assert!(before > Duration::from_secs(5), "{name}: {before:?}");
                let primed = Instant::now();
                let long = Duration::from_secs(3600);
                let mut future: Pin<Box<dyn Future<Output = ()> + Send + '_>> = match method {
                    "acquire" => Box::pin(async {
                        limiter.acquire(3).await.unwrap();
                    }),
                    "try_acquire" => Box::pin(async {
                        limiter.try_acquire(3, long).await.unwrap();
                    }),
                    "reservation" => Box::pin(async {
                        limiter.reservation(3).await.unwrap().wait().await;
                    }),
                    "call" => Box::pin(async {
                        drop(limiter.call(3).await.unwrap());
                    }),
                    "try_call" => Box::pin(async {
                        drop(limiter.try_call(3, long).await.unwrap());
                    }),
                    _ => unreachable!(),
                };
                match cut {
                    Cut::InFlight => {
                        assert!(poll_once(future.as_mut()).is_pending(), "{name}");
                        drop(future);
                    }
                    Cut::Sleeping => {
                        let out = tokio::time::timeout(300 * MS, future).await;
                        assert!(out.is_err(), "{name}: it did not wait");
                    }
                }
                let debt =
                    debt_falls_to(async || limiter.snapshot().await.unwrap().wait(), before).await;
                assert!(
                    debt <= before,
                    "{name}: {debt:?} of debt left, {before:?} before the cut call, \
                     {:?} ago (kept, the cut call would add 30 s)",
                    primed.elapsed()
                );
                if concurrent {
                    // The slot went back: no lease is left in Redis (the
                    // release lands in the background).
                    let slots = format!("{{paceline:v1:{name}}}\\slots");
                    let leases = || -> u64 {
                        redis::cmd("ZCARD")
                            .arg(&slots)
                            .query(&mut server.connection())
                            .unwrap()
                    };
                    let released = within(HANG, || leases() == 0).await;
                    assert!(
                        released.is_some(),
                        "{name}: {} lease(s) left in {slots} ({} in flight here)",
                        leases(),
                        limiter.stats().in_flight
                    );
                }
                let stats = limiter.stats();
                assert_eq!(stats.fallbacks, 0, "{name}: {stats:?}");
            }
        }
    }
}

/// The same for a keyed limiter (warming up), on one key, another key
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_limiters_methods_cut_short_give_back_through_redis() {
    let server = RedisServer::start();
    for coalesce in [true, false] {
        let backend = backend(&server, coalesce).await;
        for cut in [Cut::InFlight, Cut::Sleeping] {
            for method in ["acquire", "try_acquire", "reservation", "call"] {
                let name = format!("keyed-cut-{coalesce}-{cut:?}-{method}");
                let limiter = slow_keyed(&backend, &name);
                // Cold: the first request's wait, then its debt.
                limiter.reserve("k", 1).await.unwrap();
                let before = limiter.snapshot("k").await.unwrap().wait();
                let long = Duration::from_secs(3600);
                let mut future: Pin<Box<dyn Future<Output = ()> + Send + '_>> = match method {
                    "acquire" => Box::pin(async {
                        limiter.acquire("k", 3).await.unwrap();
                    }),
                    "try_acquire" => Box::pin(async {
                        limiter.try_acquire("k", 3, long).await.unwrap();
                    }),
                    "reservation" => Box::pin(async {
                        limiter.reservation("k", 3).await.unwrap().wait().await;
                    }),
                    "call" => Box::pin(async {
                        drop(limiter.call("k", 3).await.unwrap());
                    }),
                    _ => unreachable!(),
                };
                match cut {
                    Cut::InFlight => {
                        assert!(poll_once(future.as_mut()).is_pending(), "{name}");
                        drop(future);
                    }
                    Cut::Sleeping => {
                        let out = tokio::time::timeout(300 * MS, future).await;
                        assert!(out.is_err(), "{name}: it did not wait");
                    }
                }
                let debt =
                    debt_falls_to(async || limiter.snapshot("k").await.unwrap().wait(), before)
                        .await;
                assert!(
                    debt <= before,
                    "{name}: {debt:?} of debt left, {before:?} before the cut call"
                );
                assert!(
                    limiter.snapshot("other").await.unwrap().wait().is_zero(),
                    "{name}"
                );
            }
        }
    }
}

/// Coalescing on, one hot key: 32 callers at once, one of them polled
/// once and then parked (kept, never polled again), one forgotten: the
/// others all finish, well within 5 s. Then again with the parked one the
/// key's lead (the first caller of an idle key, whose round trip the
/// others queue behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_or_forgotten_caller_holds_up_no_one_on_a_hot_key() {
    let server = RedisServer::start();
    for coalesce in [true, false] {
        let backend = backend(&server, coalesce).await;
        let limiter = Arc::new(
            RateLimiter::builder()
                .permits_per_second(1_000_000.0)
                .redis(&backend, &format!("hot-{coalesce}"))
                .build()
                .unwrap(),
        );
        let mut parked = Vec::new();
        for round in 0..4 {
            // The first caller of the round, parked: the key's lead when
            // the key was idle.
            let mut lead = Box::pin({
                let limiter = Arc::clone(&limiter);
                async move { limiter.acquire(1).await }
            });
            // (Its round trip may, rarely, be answered within this one
            // poll, when another worker reads the reply meanwhile: then
            // it is done, and the round goes on without a parked lead.)
            let _ = poll_once(lead.as_mut());
            parked.push(lead);
            let callers: Vec<_> = (0..32)
                .map(|i| {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move {
                        if i == 7 {
                            let mut forgotten = Box::pin(limiter.acquire(1));
                            let _ = poll_once(forgotten.as_mut());
                            std::mem::forget(forgotten);
                        }
                        limiter.acquire(1).await.unwrap();
                        limiter.reservation(1).await.unwrap().wait().await;
                        limiter
                            .try_acquire(1, Duration::from_secs(1))
                            .await
                            .unwrap()
                    })
                })
                .collect();
            let all = futures::future::join_all(callers);
            let done = tokio::time::timeout(HANG, all).await;
            assert!(
                done.is_ok(),
                "coalesce {coalesce}, round {round}: callers stalled behind a parked one"
            );
            for granted in done.unwrap() {
                assert!(granted.unwrap(), "coalesce {coalesce}, round {round}");
            }
            // Idle again before the next round.
            tokio::time::sleep(20 * MS).await;
        }
        let stats = limiter.stats();
        assert_eq!(stats.fallbacks, 0, "{stats:?}");
        drop(parked);
    }
}

/// A snapshot polled once and dropped or parked changes nothing, and
/// holds up no other snapshot or reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_cut_short_change_nothing() {
    let server = RedisServer::start();
    for coalesce in [true, false] {
        let backend = backend(&server, coalesce).await;
        let limiter = slow(&backend, &format!("snap-{coalesce}"), false);
        limiter.reserve(2).await.unwrap();
        let before = limiter.snapshot().await.unwrap().wait();
        let mut parked = Vec::new();
        for _ in 0..10 {
            // (Pending, or ready at once where the answer needs no wait.)
            let mut snapshot = Box::pin(limiter.snapshot());
            let _ = poll_once(snapshot.as_mut());
            parked.push(snapshot);
            let mut dropped = Box::pin(limiter.snapshot());
            let _ = poll_once(dropped.as_mut());
        }
        let debt = tokio::time::timeout(HANG, limiter.snapshot())
            .await
            .expect("a snapshot stalled")
            .unwrap()
            .wait();
        assert!(
            debt <= before && debt + HANG >= before,
            "{debt:?} {before:?}"
        );
        drop(parked);
    }
}

/// A keyed limiter at 1/s whose fallback holds two keys and paces at half
/// the rate (as the recovery tests build it).
fn at_half(backend: &RedisBackend, name: &str) -> Arc<KeyedRateLimiter<String, Redis>> {
    Arc::new(
        KeyedRateLimiter::<String>::builder()
            .redis(backend, name)
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .local_fraction(0.5)
            .max_keys(2)
            .build()
            .unwrap(),
    )
}

/// After an outage in which the fallback dropped a key with its debt (b),
/// a key's first call after recovery charges the dropped floor, and marks
/// the key as being charged while it does: its other callers wait for it
/// ("Callers of that key wait for it", `redis` docs). That charge runs in
/// the first caller's own future. If that future is polled once and then
/// parked (kept, never polled again), the mark is never lifted.
///
/// Promised: no caller's progress depends on another caller's future being
/// polled; the fallback is for when Redis is unreachable ("Back on Redis:
/// at once").
///
/// What happens: every later call of the key waits the whole response
/// timeout for a charge that never ends, and is then served by the
/// fallback, which opens the key; the background carry-back skips a key
/// marked as being carried, so the key stays on the fallback for good
/// (`stats().keys` never falls back to 0, `fallback_calls` keeps growing,
/// with Redis up all along).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_floor_charge_does_not_keep_its_key_off_redis() {
    floor_charge_cut_short(true).await;
}

/// The same with the charging future dropped instead of parked: its mark
/// goes with it, and the key's next callers go to Redis (the control for
/// the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_floor_charge_lets_its_key_back_to_redis() {
    floor_charge_cut_short(false).await;
}

async fn floor_charge_cut_short(park: bool) {
    let server = RedisServer::start();
    let backend = backend_builder(server.client())
        .response_timeout(Duration::from_secs(1))
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap();
    let name = format!("floor-parked-{park}");
    let limiter = at_half(&backend, &name);
    assert!(limiter.reserve("a", 1).await.unwrap().is_zero());
    server.stop();
    // Three keys in a fallback that holds two: b, with the least debt, is
    // dropped (its ticket 20 s on, at 0.5/s).
    for (key, permits) in [("b", 10), ("c", 20), ("d", 30)] {
        limiter.reserve(key, permits).await.unwrap();
    }
    let stats = limiter.stats();
    assert!(stats.degraded && stats.dropped_unfinished >= 1, "{stats:?}");
    server.cont();
    within(Duration::from_secs(10), || {
        let stats = limiter.stats();
        !stats.degraded && stats.keys == 0
    })
    .await
    .expect("back on Redis, the fallback's keys carried back");
    // x's first call charges b's floor: its round trip is in flight.
    let mut charging = Box::pin({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve("x", 1).await }
    });
    assert!(poll_once(charging.as_mut()).is_pending());
    let mut parked = Vec::new();
    if park {
        parked.push(charging);
    } else {
        drop(charging);
    }
    // Long enough for any round trip to end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fallback_calls = limiter.stats().fallback_calls;
    let started = Instant::now();
    for _ in 0..3 {
        tokio::time::timeout(HANG, limiter.reserve("x", 1))
            .await
            .expect("a call of x hung")
            .unwrap();
    }
    let took = started.elapsed();
    let back = within(HANG, || {
        let stats = limiter.stats();
        !stats.degraded && stats.keys == 0
    })
    .await;
    let stats = limiter.stats();
    assert!(
        back.is_some() && stats.fallback_calls == fallback_calls,
        "Redis up all along, yet x's calls went to the fallback \
         ({} fallback calls, three calls took {took:?}): {stats:?}",
        stats.fallback_calls - fallback_calls
    );
    drop(parked);
}

/// Slots through Redis (`Limit::concurrent(1)`), coalescing on and off:
/// callers waiting for the slot polled once and then parked or forgotten
/// hold none, so once the holder is done the next caller takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_slot_waiters_through_redis_hold_up_no_one() {
    let server = RedisServer::start();
    for coalesce in [true, false] {
        let backend = backend(&server, coalesce).await;
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(1_000_000.0))
            .limit(Limit::concurrent(1))
            .redis(&backend, &format!("slot-parked-{coalesce}"))
            .build()
            .unwrap();
        let holder = limiter.call(1).await.unwrap();
        let mut parked = Vec::new();
        for i in 0..4 {
            let mut waiter = Box::pin(limiter.try_call(1, Duration::from_secs(3600)));
            let _ = poll_once(waiter.as_mut());
            // Its take answered (full) before it is left alone.
            tokio::time::sleep(50 * MS).await;
            let _ = poll_once(waiter.as_mut());
            match i % 2 {
                0 => parked.push(waiter),
                _ => std::mem::forget(waiter),
            }
        }
        drop(holder);
        let next = tokio::time::timeout(HANG, limiter.call(1)).await;
        assert!(
            matches!(next, Ok(Ok(_))),
            "coalesce {coalesce}: the next caller did not get the slot"
        );
        drop(parked);
    }
}
