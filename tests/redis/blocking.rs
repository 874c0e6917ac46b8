//! Blocking calls from inside runtimes: they work where blocking is safe and
//! are refused where it would stop the runtime. Formerly in
//! `redis_reliability.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::poll::{backend_builder, builder};
use crate::support::redis_server::RedisServer;
use paceline::redis::{Redis, RedisBackendBuilder};
use paceline::{Error, RateLimiter};

/// A limiter at `rate` under `name` on a backend of its own built from
/// `backend` with `build_blocking` (a runtime of its own).
fn built_blocking(
    backend: RedisBackendBuilder,
    name: &str,
    rate: f64,
) -> Result<RateLimiter<Redis>, Error> {
    let backend = backend.build_blocking()?;
    RateLimiter::builder()
        .permits_per_second(rate)
        .redis(&backend, name)
        .build()
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
                .await
                .build()
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
            let own = built_blocking(backend_builder(client), "blocking-own", 1_000.0);
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
        let degraded = built_blocking(backend_builder(nowhere.clone()), "nowhere", 10.0);
        assert!(degraded.is_ok_and(|l| l.stats().degraded));
        let strict = built_blocking(
            backend_builder(nowhere.clone()).require_connection(true),
            "nowhere",
            10.0,
        );
        assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
        let bad = built_blocking(backend_builder(nowhere), "nowhere", f64::NAN);
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    });
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_on_the_limiters_own_current_thread_runtime_are_refused() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "ct", 10.0).await.build().unwrap();
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
            .await
            .build()
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
