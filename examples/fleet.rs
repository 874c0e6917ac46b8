//! A fleet of worker processes calling an LLM-style API through one limit
//! shared in Redis, each call's tokens settled from its answer and the
//! API's limits learned from its headers.
//!
//! ```text
//! redis-server --port 6379 &     # or set REDIS_URL
//! cargo run --example fleet --features redis,http
//! ```
//!
//! It starts a local mock of the API (50 requests and 3 000 tokens a
//! second, 20 to 120 tokens a call known only from the answer, 429 with
//! `Retry-After` and `RateLimit` headers) and three worker processes of
//! eight tasks, whose limiter is configured at twice the API's limits, as
//! a user who does not know them would. Each second it prints what the API
//! admitted and refused: after the first answers the fleet runs just under
//! the API's limits, with no refusals.

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline::outbound::OutboundLayer;
use paceline::redis::{Client as RedisClient, RedisBackend};
use paceline::{Cost, Limit, RateLimiter};
use paceline_upstream::client::{Client, complete, tokens};
use paceline_upstream::{Config, Upstream};
use tower_layer::Layer;
use tower_service::Service;

const WORKERS: usize = 3;
const TASKS: usize = 8;
const SECONDS: u64 = 10;

fn main() -> ExitCode {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    if let Ok(upstream) = std::env::var("FLEET_UPSTREAM") {
        return worker(&redis, &upstream);
    }
    let upstream = match Upstream::start(Config::default()) {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("cannot start the mock API: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "mock API at {}: 50 requests/s, 3 000 tokens/s",
        upstream.url()
    );
    let exe = std::env::current_exe().expect("this program's path");
    let mut workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&exe)
                .env("FLEET_UPSTREAM", upstream.addr().to_string())
                .spawn()
                .expect("a worker process")
        })
        .collect();
    let mut last = upstream.totals();
    for second in 1..=SECONDS + 1 {
        std::thread::sleep(Duration::from_secs(1));
        let now = upstream.totals();
        println!(
            "{second:>3} s: {:>3} admitted, {:>5} tokens, {:>3} refused",
            now.admitted - last.admitted,
            now.tokens - last.tokens,
            now.refused - last.refused
        );
        last = now;
    }
    let failed = workers
        .iter_mut()
        .any(|w| !w.wait().is_ok_and(|s| s.success()));
    let totals = upstream.totals();
    println!(
        "in all: {} admitted, {} refused",
        totals.admitted, totals.refused
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One worker process: its tasks call the API until the run ends.
#[tokio::main]
async fn worker(redis: &str, upstream: &str) -> ExitCode {
    let backend = match RedisClient::open(redis) {
        Ok(client) => RedisBackend::builder(client)
            .build()
            .await
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    let backend = match backend {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!("no Redis at {redis}: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Twice the API's limits, named as its headers name them; a process
    // allows itself a third of them if Redis goes down.
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).named("requests"))
        .limit(Limit::per_second(6_000.0).named("tokens"))
        .redis(&backend, "fleet-example")
        .local_fraction(1.0 / WORKERS as f64)
        .build()
        .expect("a valid limiter");
    let client = OutboundLayer::new(Arc::new(limiter))
        .estimate(|_: &http::Request<String>| Cost::each([1, 70]))
        .actual(|answer: &http::Response<String>| {
            Some(Cost::each([1, tokens(answer).unwrap_or(0)]))
        })
        .layer(Client::new(upstream.parse().expect("an address")));
    let end = now() + Duration::from_secs(SECONDS);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                while now() < end {
                    // A refused call is simply made again: the limiter paces it.
                    if let Err(error) = client.call(complete()).await {
                        eprintln!("a call failed: {error}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    ExitCode::SUCCESS
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}
