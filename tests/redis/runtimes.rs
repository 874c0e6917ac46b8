//! Probes of the Redis limiter's blocking forms across runtimes: a runtime
//! that built the backend and is no longer driven, or is gone; blocking
//! calls from the thread in a multi-thread runtime's `block_on`.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use crate::support::poll::backend_builder;
use crate::support::redis_server::RedisServer;
use paceline::RateLimiter;
use paceline::redis::Redis;

fn limiter_on(backend: &paceline::redis::RedisBackend, name: &str) -> RateLimiter<Redis> {
    RateLimiter::builder()
        .permits_per_second(1_000.0)
        .redis(backend, name)
        .build()
        .unwrap()
}

/// Runs `f` on a thread of its own; its result, or `None` if it did not
/// return within `within` (a hang: the thread is left behind).
fn bounded<T: Send + 'static>(
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    finished.recv_timeout(within).ok()
}

/// A backend built (`build`) inside a current-thread runtime whose
/// `block_on` has returned: the runtime is alive but nobody drives it. A
/// blocking call from another thread must not hang: it answers (from Redis
/// or the fallback) or errs within the response timeout plus slack.
#[test]
fn blocking_call_on_an_idle_current_thread_runtime_does_not_hang() {
    let server = RedisServer::start();
    let client = server.client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime.block_on(backend_builder(client).build()).unwrap();
    let limiter = Arc::new(limiter_on(&backend, "idle-ct"));
    // The async call from another runtime, for comparison.
    let other = Arc::clone(&limiter);
    let async_result = bounded(Duration::from_secs(5), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(other.acquire(1)).is_ok()
    });
    eprintln!("async from another runtime: {async_result:?}");
    let blocking = Arc::clone(&limiter);
    let result = bounded(Duration::from_secs(5), move || {
        blocking.acquire_blocking(1).map_err(|e| e.to_string())
    });
    assert!(
        result.is_some(),
        "acquire_blocking from another thread hung: the backend's current-thread runtime is not driven"
    );
    drop(runtime);
}

/// A limiter whose backend was built (`build`) inside a multi-thread
/// runtime that is then dropped, and the limiter.
fn on_a_dropped_runtime(server: &RedisServer, name: &str) -> Arc<RateLimiter<Redis>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime
        .block_on(backend_builder(server.client()).build())
        .unwrap();
    let limiter = Arc::new(limiter_on(&backend, name));
    drop(runtime);
    limiter
}

/// After the runtime that built the backend is dropped, the async calls are
/// served by the fallback (`Fallback::Local`, the default); the blocking
/// call must answer as they do. Its documented errors (single.rs: "a Redis
/// limiter's Error::Backend if Redis fails and its fallback is FailClosed,
/// or its key holds something it did not write") do not include this one.
#[test]
fn blocking_call_after_the_building_runtime_is_dropped_answers_as_async() {
    let server = RedisServer::start();
    let limiter = on_a_dropped_runtime(&server, "dropped-mt");
    let other = Arc::clone(&limiter);
    let async_result = bounded(Duration::from_secs(5), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(other.acquire(1)).map_err(|e| e.to_string())
    })
    .expect("acquire hung");
    assert!(async_result.is_ok(), "{async_result:?}");
    let blocking = Arc::clone(&limiter);
    let result = bounded(Duration::from_secs(5), move || {
        blocking.acquire_blocking(1).map_err(|e| e.to_string())
    })
    .expect("acquire_blocking hung");
    assert!(
        result.is_ok(),
        "async acquire was served ({async_result:?}), acquire_blocking failed: {result:?}"
    );
}

/// After the runtime that built the backend is dropped, every async call is
/// served by the fallback: `stats().degraded` ("whether calls are being
/// served by the fallback now") must say so.
#[test]
fn stats_say_degraded_while_the_fallback_serves_after_the_runtime_is_dropped() {
    let server = RedisServer::start();
    let limiter = on_a_dropped_runtime(&server, "dropped-stats");
    let other = Arc::clone(&limiter);
    bounded(Duration::from_secs(5), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..3 {
                other.acquire(1).await.unwrap();
            }
        })
    })
    .expect("acquire hung");
    let stats = limiter.stats();
    assert_eq!(stats.fallback_calls, 3, "{stats:?}");
    assert!(
        stats.degraded,
        "3 calls served by the fallback, yet {stats:?}"
    );
}

/// The thread in a multi-thread runtime's `block_on` (not a worker) may
/// block: a blocking call there, on a limiter built in that runtime,
/// completes.
#[test]
fn blocking_call_in_a_multi_thread_block_on() {
    let server = RedisServer::start();
    let client = server.client();
    let result = bounded(Duration::from_secs(10), move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let backend = backend_builder(client).build().await.unwrap();
            let limiter = limiter_on(&backend, "block-on-mt");
            let first = limiter.acquire_blocking(1).map_err(|e| e.to_string());
            let second = limiter
                .try_acquire_blocking(1, Duration::from_secs(1))
                .map_err(|e| e.to_string());
            let reservation = limiter.reservation(1).await.unwrap();
            let waited = reservation.wait_blocking();
            (first, second, waited < Duration::from_secs(1))
        })
    });
    let (first, second, waited) = result.expect("hung");
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(second, Ok(true));
    assert!(waited);
}

/// A backend of its own (`build_blocking`), used from a task of a
/// current-thread runtime and dropped there: no hang, no panic.
#[test]
fn build_blocking_used_and_dropped_inside_a_current_thread_task() {
    let server = RedisServer::start();
    let client = server.client();
    let result = bounded(Duration::from_secs(10), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            tokio::spawn(async move {
                let backend = backend_builder(client).build_blocking().unwrap();
                let limiter = limiter_on(&backend, "own-in-task");
                let blocking = limiter.acquire_blocking(1).is_ok();
                let awaited = limiter.acquire(1).await.is_ok();
                drop(limiter);
                drop(backend);
                (blocking, awaited)
            })
            .await
            .unwrap()
        })
    });
    assert_eq!(result, Some((true, true)));
}

/// A blocking call inside a task of a multi-thread runtime with one worker,
/// while another task of that runtime needs the worker (a timer): the call
/// hands its queue over (`block_in_place`), so the other task runs.
#[test]
fn blocking_call_in_a_worker_does_not_starve_other_tasks() {
    let server = RedisServer::start();
    let client = server.client();
    let result = bounded(Duration::from_secs(10), move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let backend = backend_builder(client).build().await.unwrap();
            let limiter = Arc::new(
                RateLimiter::builder()
                    .permits_per_second(5.0)
                    .max_burst(Duration::ZERO)
                    .redis(&backend, "starve")
                    .build()
                    .unwrap(),
            );
            let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let ticker = tokio::spawn({
                let ticks = Arc::clone(&ticks);
                async move {
                    for _ in 0..10 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
            let blocker = tokio::spawn({
                let limiter = Arc::clone(&limiter);
                async move {
                    limiter.acquire_blocking(1).unwrap();
                    // 200 ms of blocking sleep on the worker.
                    limiter.acquire_blocking(1).unwrap()
                }
            });
            let waited = blocker.await.unwrap();
            let seen = ticks.load(std::sync::atomic::Ordering::Relaxed);
            ticker.await.unwrap();
            (waited, seen)
        })
    });
    let (waited, seen) = result.expect("hung");
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(
        seen >= 5,
        "the ticker ran {seen} times during a 200 ms blocking wait"
    );
}

/// The thread that drove a current-thread runtime drives it only inside
/// its `block_on`: once that has returned (the runtime idle, then gone),
/// a blocking call there is served as on any other thread (the fallback,
/// the runtime being out of reach), not refused; inside `block_on` again,
/// it is refused.
#[test]
fn blocking_calls_on_the_thread_that_drove_a_current_thread_runtime_after_it_returned() {
    let server = RedisServer::start();
    let client = server.client();
    let result = bounded(Duration::from_secs(20), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let backend = runtime.block_on(backend_builder(client).build()).unwrap();
        let limiter = limiter_on(&backend, "driver-returned");
        let idle = limiter.acquire_blocking(1).map_err(|e| e.to_string());
        let inside = runtime.block_on(async { limiter.acquire_blocking(1) });
        drop(runtime);
        let gone = limiter
            .try_acquire_blocking(1, Duration::from_secs(1))
            .map_err(|e| e.to_string());
        (idle, inside, gone, limiter.stats().degraded)
    });
    let (idle, inside, gone, degraded) = result.expect("hung");
    assert!(idle.is_ok(), "runtime idle: {idle:?}");
    assert!(
        matches!(inside, Err(paceline::Error::InvalidArgument(_))),
        "inside block_on: {inside:?}"
    );
    assert_eq!(gone, Ok(true), "runtime gone");
    assert!(degraded);
}

/// A backend whose current-thread runtime is no longer driven: the first
/// blocking call waits for it (at most twice the response timeout and a
/// second, 1.2 s here) and finds Redis out of reach; the calls after it
/// are served by the fallback at once, as the async calls are, not each
/// after one more such wait (5 calls took 6 s).
#[test]
fn blocking_calls_wait_once_for_a_runtime_no_longer_driven() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime
        .block_on(backend_builder(server.client()).build())
        .unwrap();
    let limiter = Arc::new(limiter_on(&backend, "undriven-pace"));
    let blocking = Arc::clone(&limiter);
    let took = bounded(Duration::from_secs(20), move || {
        let start = std::time::Instant::now();
        for _ in 0..5 {
            blocking.acquire_blocking(1).unwrap();
        }
        start.elapsed()
    })
    .expect("hung");
    // One wait of 1.2 s, and room for a loaded machine; not five.
    assert!(took < Duration::from_millis(2_400), "5 calls took {took:?}");
    assert!(limiter.stats().degraded);
    drop(runtime);
}

/// A blocking call that gave up on its runtime (not driven) and was served
/// by the fallback is served once: when the runtime is driven again, the
/// call it had handed there does not run too, taking a permit nobody uses
/// and counting a second fallback call for one caller.
#[test]
fn a_blocking_call_served_by_the_fallback_is_not_run_again_once_its_runtime_is_driven() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = runtime
        .block_on(backend_builder(server.client()).build())
        .unwrap();
    // One permit a minute: a second grant within the test shows.
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1.0 / 60.0)
            .max_burst(Duration::ZERO)
            .redis(&backend, "undriven-once")
            .local_fraction(1.0)
            .build()
            .unwrap(),
    );
    let blocking = Arc::clone(&limiter);
    let waited = bounded(Duration::from_secs(20), move || {
        blocking.acquire_blocking(1).unwrap()
    })
    .expect("hung");
    assert_eq!(waited, Duration::ZERO);
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    // Driven again: the probe finds Redis, the fallback's key goes back.
    runtime.block_on(async {
        let start = tokio::time::Instant::now();
        while limiter.stats().degraded || limiter.stats().keys > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{:?}",
                limiter.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let stats = limiter.stats();
    assert_eq!(stats.fallback_calls, 1, "{stats:?}");
    // The one permit granted, carried back: the next waits about a minute,
    // not two.
    let wait = runtime.block_on(limiter.snapshot()).unwrap().wait();
    println!("{stats:?}, then a wait of {wait:?}");
    assert!(wait <= Duration::from_secs(61), "{wait:?}");
}
