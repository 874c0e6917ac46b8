//! Real faults, grouped by what fails: a server killed or never reachable
//! (`down`), frozen with `SIGSTOP` (`frozen`), answering with an error
//! (`refusing`: a read-only replica, `BUSY`, `LOADING`, `MASTERDOWN`, out of
//! memory), a connection that dies silently (`connection`, and a try that
//! waits for its key's carry-back behind it: `patience`), and a cluster
//! that loses one primary (`cluster`). Each test asserts what a user sees:
//! every call returns within the response timeout plus slack, the
//! configured fallback serves while Redis is unavailable, the limiter
//! switches once and back once, and nothing is charged twice.
//!
//! Formerly `redis_outages.rs`, `redis_faults.rs` and part of
//! `redis_reliability.rs`; each test kept its name.

mod calls;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod connection;
mod counting;
mod down;
mod frozen;
mod patience;
mod refusing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::poll::{
    PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK, backend_builder, builder, patient_backend,
};
use crate::support::proxy::Proxy;
use crate::support::redis_server::{RedisServer, free_port};
use crate::support::within::within;
use paceline::redis::{Fallback, Redis};
use paceline::{Error, RateLimiter, Stats};

/// The longest any call may take: the response timeout plus slack.
const CALL_BOUND: Duration = RESPONSE_TIMEOUT.saturating_add(SLACK);

/// How long a limiter may take to go back to Redis once Redis works again:
/// a few probe intervals (each probe is a connection and one script call,
/// both bounded by the response timeout), plus slack.
const RECOVERY_BOUND: Duration = PROBE_INTERVAL
    .saturating_add(RESPONSE_TIMEOUT)
    .saturating_mul(3)
    .saturating_add(SLACK);

/// One interval at 10 permits per second.
const INTERVAL: Duration = Duration::from_millis(100);

/// One interval at 1 permit per second.
const SECOND: Duration = Duration::from_secs(1);

/// Waits, for up to 5 s, until `degraded` says no more, and asserts that
/// this came within `bound` of `since`; returns how long after `since`.
async fn back_on_redis(
    what: &str,
    since: Instant,
    bound: Duration,
    degraded: impl Fn() -> bool,
    stats: impl Fn() -> Stats,
) -> Duration {
    within(Duration::from_secs(5), || !degraded())
        .await
        .unwrap_or_else(|| panic!("{what}: still degraded 5 s later: {:?}", stats()));
    let took = since.elapsed();
    assert!(took <= bound, "{what}: back on Redis only after {took:?}");
    took
}

/// Waits until `limiter` is back on Redis, within [`RECOVERY_BOUND`] of now;
/// returns how long that took.
async fn recovered(limiter: &RateLimiter<Redis>, what: &str) -> Duration {
    back_on_redis(
        what,
        Instant::now(),
        RECOVERY_BOUND,
        || limiter.stats().degraded,
        || limiter.stats(),
    )
    .await
}

/// [`recovered`], for a limiter that went to its fallback once: prints how
/// long it took and checks that this was its one recovery.
async fn recovered_once(limiter: &RateLimiter<Redis>, what: &str) {
    let took = recovered(limiter, what).await;
    println!("{what}: back on Redis after {took:?}");
    assert_eq!(limiter.stats().recoveries, 1);
}

/// Calls `try_acquire(1, 10 ms)` every 10 ms for as long as `go_on` says,
/// asserting that each call returns `Ok` within [`CALL_BOUND`]; returns how
/// many calls were made.
async fn calls_while(limiter: &RateLimiter<Redis>, mut go_on: impl FnMut() -> bool) -> u64 {
    let mut calls = 0;
    while go_on() {
        let call = Instant::now();
        let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
        assert!(result.is_ok(), "{result:?}");
        assert!(
            call.elapsed() <= CALL_BOUND,
            "a call took {:?}",
            call.elapsed()
        );
        calls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    calls
}

async fn limiter(server: &RedisServer, fallback: Fallback) -> RateLimiter<Redis> {
    builder(server.client(), "faults", 10_000.0)
        .await
        .fallback(fallback)
        .build()
        .expect("limiter")
}

/// Runs `calls` try_acquires with no timeout budget to speak of and returns
/// the slowest call's duration and the results.
async fn timed_calls(
    limiter: &RateLimiter<Redis>,
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
