//! A Redis that dies, hangs or comes back: calls never hang beyond the
//! response timeout, the fallback decides what they return, and the limiter
//! goes back to Redis once the probe sees it answer.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK};
use support::redis_server::RedisServer;
use throttler::Error;
use throttler::redis::{Fallback, RedisRateLimiter};

async fn limiter(server: &RedisServer, fallback: Fallback) -> RedisRateLimiter {
    RedisRateLimiter::builder(server.client(), "faults")
        .permits_per_second(10_000.0)
        .fallback(fallback)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .expect("limiter")
}

/// Runs `calls` try_acquires with no timeout budget to speak of and returns
/// the slowest call's duration and the results.
async fn timed_calls(
    limiter: &RedisRateLimiter,
    calls: usize,
) -> (Duration, Vec<Result<bool, Error>>) {
    let mut slowest = Duration::ZERO;
    let mut results = Vec::new();
    for _ in 0..calls {
        let start = Instant::now();
        results.push(limiter.try_acquire(1, Duration::from_millis(1)).await);
        slowest = slowest.max(start.elapsed());
    }
    (slowest, results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_local_fallback_never_fails_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::Local).await;
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!limiter.is_degraded());

    server.kill();
    let (slowest, results) = timed_calls(&limiter, 50).await;
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    assert!(limiter.is_degraded());
    let stats = limiter.stats();
    assert_eq!(stats.fallbacks, 1, "{stats:?}");
    assert!(stats.fallback_calls >= 50, "{stats:?}");

    server.restart();
    let restarted = Instant::now();
    while limiter.is_degraded() {
        assert!(
            restarted.elapsed() <= 2 * PROBE_INTERVAL + SLACK + RESPONSE_TIMEOUT,
            "still degraded {:?} after the restart",
            restarted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("back on Redis {:?} after the restart", restarted.elapsed());
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let mut conn = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.key())
        .query(&mut conn)
        .unwrap();
    assert!(exists, "calls reach Redis again");
    assert_eq!(limiter.stats().recoveries, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_closed_returns_backend_errors() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::FailClosed).await;
    limiter.acquire(1).await.unwrap();
    server.kill();
    let (slowest, results) = timed_calls(&limiter, 20).await;
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    for result in results {
        match result {
            Err(Error::Backend(e)) => assert!(e.to_string().contains("Redis"), "{e}"),
            other => panic!("expected Error::Backend, got {other:?}"),
        }
    }
    assert!(limiter.is_degraded());
    assert!(matches!(
        limiter.available_in().await,
        Err(Error::Backend(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_open_grants() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::FailOpen).await;
    server.kill();
    let (slowest, results) = timed_calls(&limiter, 20).await;
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    assert!(
        results.into_iter().all(|r| r.unwrap()),
        "every call is granted"
    );
    assert_eq!(limiter.acquire(1_000_000).await.unwrap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_does_not_hang_callers() {
    let server = RedisServer::start();
    for fallback in [Fallback::Local, Fallback::FailClosed] {
        let limiter = limiter(&server, fallback).await;
        limiter.acquire(1).await.unwrap();
        server.stop();
        let (slowest, results) = timed_calls(&limiter, 10).await;
        server.cont();
        assert!(
            slowest <= RESPONSE_TIMEOUT + SLACK,
            "{fallback:?}: a call took {slowest:?}"
        );
        match fallback {
            Fallback::Local => assert!(results.iter().all(|r| r.is_ok()), "{results:?}"),
            _ => assert!(
                results
                    .iter()
                    .all(|r| matches!(r, Err(Error::Backend(e)) if e.is_timeout() || e.to_string().contains("unavailable"))),
                "{results:?}"
            ),
        }
        // Once the server runs again the probe brings the limiter back.
        let resumed = Instant::now();
        while limiter.is_degraded() {
            assert!(
                resumed.elapsed() < Duration::from_secs(3),
                "never recovered"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            limiter
                .try_acquire(1, Duration::from_secs(1))
                .await
                .unwrap()
        );
    }
}

#[test]
fn blocking_calls_survive_a_killed_redis_too() {
    let mut server = RedisServer::start();
    let limiter = RedisRateLimiter::builder(server.client(), "faults-blocking")
        .permits_per_second(1000.0)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build_blocking()
        .unwrap();
    limiter.acquire_blocking(1).unwrap();
    server.kill();
    let start = Instant::now();
    for _ in 0..10 {
        limiter.acquire_blocking(1).unwrap();
    }
    assert!(start.elapsed() <= RESPONSE_TIMEOUT + SLACK + Duration::from_millis(20));
    assert!(limiter.is_degraded());
}
