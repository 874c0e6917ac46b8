//! A fleet: several processes sharing one limit through a real
//! redis-server, calling the real upstream. Each worker is this test binary
//! run again with `PACELINE_FLEET` set, running [`worker`] alone.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline::outbound::OutboundLayer;
use paceline::redis::{Fallback, RedisBackend};
use paceline::{Cost, Limit, RateLimiter};
use paceline_upstream::client::{Client, complete, tokens};
use paceline_upstream::{Config, Stats, Upstream};
use tower_layer::Layer;
use tower_service::Service;

use crate::support::redis_server::RedisServer;

/// Processes in the fleet, and tasks in each.
const WORKERS: usize = 3;
const TASKS: usize = 8;

/// What a worker is told: `redis_url upstream_addr start_ms end_ms`.
const ENV: &str = "PACELINE_FLEET";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The body of a worker process: a limiter on the shared key at twice the
/// upstream's limits, each process allowing itself a third while Redis is
/// down, and its tasks calling through the outbound layer until the end.
/// A no-op when run as a test of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker() {
    let Ok(told) = std::env::var(ENV) else {
        return;
    };
    let told: Vec<&str> = told.split(' ').collect();
    let [redis_url, upstream, start_ms, end_ms] = told[..] else {
        panic!("{ENV} must be: redis_url upstream_addr start_ms end_ms");
    };
    let (start_ms, end_ms): (u64, u64) = (start_ms.parse().unwrap(), end_ms.parse().unwrap());
    // (2 s, not 200 ms: on a loaded machine a slow answer would read as an
    // outage, and the run then tests the fallback. The kill is seen at once.)
    let backend = RedisBackend::builder(redis::Client::open(redis_url).unwrap())
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(100.0).named("requests"))
            .limit(Limit::per_second(6_000.0).named("tokens"))
            .redis(&backend, "fleet")
            .fallback(Fallback::Local)
            .local_fraction(1.0 / WORKERS as f64)
            .build()
            .unwrap(),
    );
    let layer = OutboundLayer::new(limiter)
        .estimate(|_: &http::Request<String>| Cost::each([1, 70]))
        .actual(|response: &http::Response<String>| {
            Some(Cost::each([1, tokens(response).unwrap_or(0)]))
        });
    let client = layer.layer(Client::new(upstream.parse().unwrap()));
    while now_ms() < start_ms {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                while now_ms() < end_ms {
                    // Refused calls come back through the limiter, paced.
                    if client.call(complete()).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Starts a worker process.
fn spawn(told: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "fleet::worker",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ENV, told)
        .stdout(Stdio::null())
        .spawn()
        .expect("a worker process")
}

/// Admissions, tokens and refusals in `[from, to)`.
fn between(stats: &Stats, from: Duration, to: Duration) -> (u64, u64, u64) {
    stats
        .buckets
        .iter()
        .filter(|b| b.start >= from && b.start < to)
        .fold((0, 0, 0), |(a, t, r), b| {
            (a + b.admitted, t + b.tokens, r + b.refused)
        })
}

/// Three processes of eight tasks share one limit through Redis,
/// configured at twice the upstream's limits: they learn the upstream's
/// rates from its headers, so that after the first seconds refusals are
/// rare (without learning, more than half the calls are refused: the
/// `outbound` benchmark) and the upstream is used; Redis killed mid-run,
/// each process goes on at its share of the learned rate, not of the
/// configured one, and refusals stay rare. The upstream's own limits hold
/// in every window. The bounds hold on a loaded machine, where calls reach
/// the upstream late and bunched (on a quiet one, the benchmark measures
/// no refusal after the first second, and 0.96 of the tokens used).
#[test]
fn a_fleet_learns_the_upstreams_limit_and_keeps_it_without_redis() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start(Config::default()).unwrap();
    // The upstream's records count from about now.
    let begin_ms = now_ms();
    let start_ms = begin_ms + 1_500;
    let end_ms = start_ms + 10_000;
    let told = format!("{} {} {start_ms} {end_ms}", redis.url(), upstream.addr());
    let mut workers: Vec<Child> = (0..WORKERS).map(|_| spawn(&told)).collect();
    // Redis goes down 6 s into the run.
    let kill_at = Duration::from_millis(start_ms + 6_000 - now_ms());
    std::thread::sleep(kill_at);
    redis.kill();
    for worker in &mut workers {
        assert!(worker.wait().unwrap().success(), "a worker failed");
    }
    let stats = upstream.stats();
    let run_start = Duration::from_millis(start_ms - begin_ms);
    let at = |secs: f64| run_start + Duration::from_secs_f64(secs);
    for (name, from, to) in [
        ("with Redis", at(2.0), at(6.0)),
        ("without", at(7.0), at(10.0)),
    ] {
        let (admitted, used, refused) = between(&stats, from, to);
        let span = (to - from).as_secs_f64();
        let (requests, tokens) = (
            admitted as f64 / (50.0 * span),
            used as f64 / (3_000.0 * span),
        );
        eprintln!(
            "{name}: {refused} of {} refused; requests {requests:.3}, tokens {tokens:.3} of the limits",
            admitted + refused
        );
        assert!(
            refused * 10 <= admitted + refused,
            "{name}: {refused} refused of {admitted}"
        );
        assert!(
            requests.max(tokens) >= 0.2,
            "{name}: requests {requests:.2}, tokens {tokens:.2}"
        );
    }
    let window = Duration::from_secs(1);
    let (most, allowed) = (stats.max_in_any_window(window), stats.allowance(window));
    assert!(most.requests <= allowed.requests.unwrap());
    assert!(most.tokens <= allowed.tokens.unwrap());
}
