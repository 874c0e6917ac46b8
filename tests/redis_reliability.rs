//! The Redis limiter under the faults production sees, each one real: a
//! connection that dies silently (a proxy that blackholes it), a server that
//! refuses writes (`maxmemory` with `noeviction`), a server that is down at
//! start, callers that give up (`timeout(d, acquire(n))`), and blocking
//! calls from inside a runtime. Every call returns within the response
//! timeout plus slack.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK, within};
use support::proxy::Proxy;
use support::redis_server::RedisServer;
use throttler::Error;
use throttler::redis::{Fallback, RedisRateLimiter};

fn builder(client: redis::Client, name: &str, rate: f64) -> throttler::redis::RedisBuilder {
    RedisRateLimiter::builder(client, name)
        .permits_per_second(rate)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
}

/// `timeout(1 ms, acquire(1))`, twenty times, at 10/s: each caller's
/// reservation is given back, so at most one interval of debt is left
/// instead of about two seconds. On loopback the round trip usually ends
/// within the millisecond and the caller is dropped while it sleeps (its
/// reservation's give-back); one dropped while its EVALSHA is still out is
/// given back from the late reply (see
/// `a_caller_dropped_mid_round_trip_gives_its_reservation_back`, which
/// forces that case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_acquires_through_redis_leave_at_most_one_interval_of_debt() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "dropped", 10.0)
        .max_burst(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let mut timed_out = 0;
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(1), limiter.acquire(1))
            .await
            .is_err()
        {
            timed_out += 1;
        }
    }
    assert!(timed_out >= 15, "{timed_out} of 20 timed out");
    // Give-backs are sent in the background: let them land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let debt = limiter.available_in().await.unwrap();
    println!("debt after 20 dropped acquires: {debt:?} ({timed_out} timed out)");
    assert!(debt <= Duration::from_millis(100), "debt left: {debt:?}");
    assert!(!limiter.is_degraded());
}

/// Callers that give up while their EVALSHA is still on the wire (a proxy
/// holds each request for 150 ms; they wait 20 ms) have still reserved in
/// Redis: each late reply is awaited in the background and its reservation
/// given back. The debt left is under one interval, where keeping them all
/// would leave about one interval per caller. The response timeout (2 s)
/// never abandons these round trips: this is the caller's drop alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_mid_round_trip_gives_its_reservation_back() {
    const CALLERS: u32 = 6;
    const LATENCY: Duration = Duration::from_millis(150);
    const INTERVAL: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = builder(proxy.client(), "dropped-in-flight", 10.0)
        .max_burst(Duration::ZERO)
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    // The connection is open and the key holds one interval of debt.
    assert!(limiter.acquire(1).await.unwrap().is_zero());
    proxy.set_latency(LATENCY);
    let start = Instant::now();
    for i in 0..CALLERS {
        let dropped = tokio::time::timeout(Duration::from_millis(20), limiter.acquire(1)).await;
        assert!(dropped.is_err(), "caller {i} was not dropped: {dropped:?}");
    }
    let sent = start.elapsed();
    // Every request is still on its way to Redis (each takes 150 ms); the
    // replies and the give-backs travel without delay.
    assert!(sent < LATENCY, "the callers took {sent:?}");
    proxy.set_latency(Duration::ZERO);
    // The last request reaches Redis 150 ms after it was sent, its reply
    // comes back and its give-back goes out at once: wait for that, with
    // room for scheduling.
    tokio::time::sleep(LATENCY + Duration::from_millis(150)).await;
    let debt = limiter.available_in().await.unwrap();
    // Kept, the reservations would end about CALLERS intervals after the
    // first request reached Redis (at `start` plus the latency, or later).
    let kept = (LATENCY + INTERVAL * CALLERS).saturating_sub(start.elapsed());
    println!(
        "debt after {CALLERS} callers dropped mid-round-trip: {debt:?} \
         (about {kept:?} had they kept their reservations)"
    );
    assert!(
        kept > INTERVAL * 2,
        "too slow to tell a give-back from none: {kept:?} left of the kept reservations"
    );
    // A reservation is given back only while its moment lies ahead (one
    // whose moment passed before its give-back arrived was "used"): every
    // one kept has its moment in the past, so the ticket is less than one
    // interval ahead.
    assert!(debt <= INTERVAL, "debt left: {debt:?}");
    let stats = limiter.stats();
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
    assert!(!limiter.is_degraded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_gives_its_slot_to_the_next_caller_through_redis() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "slots", 10.0)
        .max_burst(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let a = limiter.reservation(1).await.unwrap();
    let b = limiter.reservation(1).await.unwrap();
    let c = limiter.reservation(1).await.unwrap();
    assert!(a.delay().is_zero());
    let (b_delay, c_delay) = (b.delay(), c.delay());
    assert!(
        c_delay > b_delay + Duration::from_millis(80),
        "{b_delay:?} {c_delay:?}"
    );
    drop(b);
    tokio::time::sleep(Duration::from_millis(20)).await; // the give-back lands
    let d = limiter.reservation(1).await.unwrap();
    // D is scheduled at C's slot (a few ms of real time passed), not one
    // interval later.
    let gap = c_delay.saturating_sub(d.delay());
    assert!(
        gap <= Duration::from_millis(60),
        "C at {c_delay:?}, D at {:?}",
        d.delay()
    );
    a.commit();
    c.commit();
    d.commit();
}

/// The peer vanishes without FIN or RST: calls time out, the fallback
/// serves, and the probe's fresh connection brings the limiter back while
/// the old connection is still dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_replaced() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = builder(proxy.client(), "silent", 1_000.0)
        .fallback(Fallback::FailClosed)
        .build()
        .await
        .unwrap();
    limiter.acquire(1).await.unwrap();
    proxy.blackhole_existing();
    let start = Instant::now();
    let first = limiter.try_acquire(1, Duration::ZERO).await;
    let took = start.elapsed();
    assert!(matches!(first, Err(Error::Backend(_))), "{first:?}");
    assert!(took <= RESPONSE_TIMEOUT + SLACK, "the call took {took:?}");
    assert!(limiter.is_degraded());
    let recovered = within(Duration::from_secs(5), || !limiter.is_degraded())
        .await
        .expect("the limiter went back to Redis");
    println!(
        "recovery after a silent connection death: {:?} after the failed call",
        recovered
    );
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
}

/// Redis answers PING but refuses the script's writes: the limiter
/// degrades once and stays degraded (no flapping) until writes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_writes_degrades_once_without_flapping() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "oom", 1_000.0)
        .build()
        .await
        .unwrap();
    limiter.acquire(1).await.unwrap();
    server.config_set("maxmemory-policy", "noeviction");
    server.config_set("maxmemory", "1");
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let call = Instant::now();
        let granted = limiter.try_acquire(1, Duration::from_millis(50)).await;
        assert!(granted.is_ok(), "{granted:?}");
        assert!(call.elapsed() <= RESPONSE_TIMEOUT + SLACK);
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = limiter.stats();
    println!("2 s of refused writes: {calls} calls, {stats:?}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert!(limiter.is_degraded());
    server.config_set("maxmemory", "0");
    within(Duration::from_secs(5), || !limiter.is_degraded())
        .await
        .expect("back on Redis once writes work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_starts_while_redis_is_down_and_switches_when_it_is_up() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    proxy.refuse_new(true);
    let start = Instant::now();
    let limiter = builder(proxy.client(), "down-at-start", 10.0)
        .build()
        .await
        .expect("builds while Redis is down");
    assert!(start.elapsed() <= RESPONSE_TIMEOUT * 2 + SLACK);
    assert!(limiter.is_degraded());
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    // Failing fast is a choice.
    let strict = builder(proxy.client(), "strict", 10.0)
        .require_connection(true)
        .build()
        .await;
    assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
    // Bad options still fail at once.
    let bad = builder(proxy.client(), "bad", -1.0).build().await;
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");

    proxy.refuse_new(false);
    within(Duration::from_secs(5), || !limiter.is_degraded())
        .await
        .expect("switches to Redis once it answers");
    assert_eq!(limiter.stats().recoveries, 1);
}

/// Callers that reach the fallback at the same instant are paced by it as
/// one limiter: the first of them opens it, and none is served before that
/// opening (which would erase its reservation and serve the next caller at
/// once too). The backend is down from the start, so every call goes
/// straight to the fallback; 4 threads released together, 200 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_open_the_fallback_together_are_paced_as_one() {
    const THREADS: usize = 4;
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    proxy.refuse_new(true);
    let backend = support::poll::backend(proxy.client()).await;
    assert!(backend.is_degraded());
    for round in 0..200 {
        let limiter = Arc::new(
            backend
                .limiter(&format!("together-{round}"))
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        );
        let start = Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limiter, start) = (Arc::clone(&limiter), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    futures::executor::block_on(limiter.reserve(1)).unwrap()
                })
            })
            .collect();
        let mut waits: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        waits.sort();
        // One second apart (less the few microseconds between the calls).
        for (i, wait) in waits.iter().enumerate() {
            let expected = Duration::from_secs(i as u64);
            assert!(
                wait.abs_diff(expected) <= Duration::from_millis(50),
                "round {round}: waits {waits:?}"
            );
        }
    }
}

/// Blocking calls from inside a task of a multi-thread runtime complete,
/// with one worker (so the worker's own queue is the only one) and with
/// four; `build_blocking` never panics, whatever fails.
#[test]
fn blocking_calls_work_inside_a_multi_thread_runtime() {
    for workers in [1, 4] {
        blocking_calls_work_inside_a_runtime_of(workers);
    }
}

fn blocking_calls_work_inside_a_runtime_of(workers: usize) {
    let server = RedisServer::start();
    let client = server.client();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(async move {
            let limiter = builder(client.clone(), "blocking", 1_000.0)
                .build()
                .await
                .unwrap();
            let limiter = Arc::new(limiter);
            let task = tokio::spawn({
                let limiter = Arc::clone(&limiter);
                async move {
                    limiter.acquire_blocking(1).unwrap();
                    limiter
                        .try_acquire_blocking(1, Duration::from_secs(1))
                        .unwrap()
                }
            });
            let own = builder(client, "blocking-own", 1_000.0).build_blocking();
            let own_ok = own.and_then(|l| l.acquire_blocking(1)).is_ok();
            (task.await.unwrap(), own_ok)
        });
        let _ = done.send(result);
    });
    let result = finished
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("blocking calls inside a runtime of {workers} workers hung"));
    assert_eq!(result, (true, true));

    // build_blocking inside a runtime, with Redis unreachable and with bad
    // options: an error or a degraded limiter, never a panic.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let nowhere = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let degraded = builder(nowhere.clone(), "nowhere", 10.0).build_blocking();
        assert!(degraded.is_ok_and(|l| l.is_degraded()));
        let strict = builder(nowhere.clone(), "nowhere", 10.0)
            .require_connection(true)
            .build_blocking();
        assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
        let bad = builder(nowhere, "nowhere", f64::NAN).build_blocking();
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    });
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_on_the_limiters_own_current_thread_runtime_are_refused() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "ct", 10.0).build().await.unwrap();
    assert!(matches!(
        limiter.acquire_blocking(1),
        Err(Error::InvalidArgument(_))
    ));
}

/// The runtime's blocking pool may block: only the thread that drives the
/// runtime is refused.
#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_from_spawn_blocking_of_a_current_thread_runtime_work() {
    let server = RedisServer::start();
    let limiter = Arc::new(
        builder(server.client(), "ct-pool", 10.0)
            .build()
            .await
            .unwrap(),
    );
    let pool = Arc::clone(&limiter);
    let waited = tokio::task::spawn_blocking(move || {
        let first = pool.acquire_blocking(1)?;
        let second = pool.try_acquire_blocking(1, Duration::from_secs(1))?;
        Ok::<_, Error>((first, second))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(waited.0, Duration::ZERO);
    assert!(waited.1);
    // Still refused on the runtime's own thread, after a task ran on it.
    tokio::task::yield_now().await;
    assert!(matches!(
        limiter.acquire_blocking(1),
        Err(Error::InvalidArgument(_))
    ));
}

/// A limiter saturated in Redis stays saturated when Redis dies: the local
/// fallback opens with the debt Redis last reported, not with a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_opens_with_the_debt_not_a_burst() {
    let mut server = RedisServer::start();
    let limiter = builder(server.client(), "honest", 10.0)
        .build()
        .await
        .unwrap();
    // A burst of 10 and 5 more: about half a second of debt.
    for _ in 0..15 {
        limiter.reserve(1).await.unwrap();
    }
    server.kill();
    let mut granted = 0;
    for _ in 0..15 {
        if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
            granted += 1;
        }
    }
    assert!(limiter.is_degraded());
    assert!(
        granted <= 1,
        "{granted} of 15 granted at once by the fallback"
    );
}
