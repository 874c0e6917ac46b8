//! A fleet's calls in flight: several limiter instances, each on a backend of its
//! own (as separate processes would have), sharing one Redis limiter name,
//! calling the real upstream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use paceline::outbound::OutboundLayer;
use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{Cost, Limit, RateLimiter};
use paceline_upstream::client::{Client, complete, tokens};
use paceline_upstream::{Config, Limits, Upstream};
use tower_layer::Layer;
use tower_service::Service;

use crate::support::redis_server::RedisServer;

type Shared = Arc<RateLimiter<Redis>>;

/// A backend that waits 2 s for an answer, not the default 200 ms: the
/// bounds with Redis up hold while Redis answers, and on a loaded machine a
/// slow answer reads as an outage (the fallback's slots beside the
/// leases). A killed Redis is seen at once, its connection closed.
async fn backend(url: &str) -> RedisBackend {
    RedisBackend::builder(redis::Client::open(url).unwrap())
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

/// An upstream that answers every call after `latency` and limits nothing:
/// it counts the calls in flight.
fn counting_upstream(latency: Duration) -> Upstream {
    Upstream::start(Config {
        latency,
        limits: Limits {
            requests_per_second: None,
            tokens_per_second: None,
            max_in_flight: None,
            window_secs: 1,
        },
        ..Config::default()
    })
    .unwrap()
}

/// `Limit::concurrent(4)` (with rates that never bind) through `backend`
/// as `name`, a third of the slots in each process while Redis is down.
fn four_at_once(backend: &RedisBackend, name: &str) -> Arc<RateLimiter<Redis>> {
    Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(1_000.0).named("requests"))
            .limit(Limit::per_second(1_000_000.0).named("tokens"))
            .limit(Limit::concurrent(4))
            .redis(backend, name)
            .fallback(Fallback::Local)
            .local_fraction(1.0 / 3.0)
            .build()
            .unwrap(),
    )
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    refused: AtomicU64,
}

/// A client of whichever upstream `addr` holds now.
#[derive(Clone)]
struct Switch(Arc<Mutex<SocketAddr>>);

impl Switch {
    fn new(addr: SocketAddr) -> Self {
        Switch(Arc::new(Mutex::new(addr)))
    }
}

impl Service<http::Request<String>> for Switch {
    type Response = http::Response<String>;
    type Error = std::io::Error;
    type Future = <Client as Service<http::Request<String>>>::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<String>) -> Self::Future {
        let addr = *self.0.lock().unwrap();
        Client::new(addr).call(request)
    }
}

/// `tasks` tasks calling through the outbound layer until `end`, each
/// estimated at `estimate` tokens; counts what was sent and refused (429).
fn run(
    limiter: &Shared,
    switch: &Switch,
    tasks: usize,
    end: Instant,
    counts: &Arc<Counts>,
    estimate: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    let layer = OutboundLayer::new(Arc::clone(limiter))
        .estimate(move |_: &http::Request<String>| Cost::each([1, estimate]))
        .actual(|response: &http::Response<String>| {
            Some(Cost::each([1, tokens(response).unwrap_or(0)]))
        });
    let client = layer.layer(switch.clone());
    (0..tasks)
        .map(|_| {
            let mut client = client.clone();
            let counts = Arc::clone(counts);
            tokio::spawn(async move {
                while Instant::now() < end {
                    match client.call(complete()).await {
                        Ok(response) => {
                            counts.sent.fetch_add(1, Ordering::Relaxed);
                            if response.status() == 429 {
                                counts.refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
        })
        .collect()
}

async fn join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        h.await.unwrap();
    }
}

/// `Limit::concurrent(4)` on three instances of eight tasks: the upstream
/// (no limits of its own) counts the calls in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_k_holds_across_instances() {
    let redis = RedisServer::start();
    let upstream = counting_upstream(Duration::from_millis(30));
    let switch = Switch::new(upstream.addr());
    let counts = Arc::new(Counts::default());
    let end = Instant::now() + Duration::from_secs(3);
    let mut handles = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..3 {
        let backend = backend(&redis.url()).await;
        let limiter = four_at_once(&backend, "hunt-k");
        handles.extend(run(&limiter, &switch, 8, end, &counts, 70));
        keep.push((backend, limiter));
    }
    join(handles).await;
    let stats = upstream.stats();
    eprintln!(
        "sent {} max in flight {} totals {:?}",
        counts.sent.load(Ordering::Relaxed),
        stats.totals.max_in_flight,
        stats.totals
    );
    assert!(stats.totals.max_in_flight <= 4, "{:?}", stats.totals);
    assert!(stats.totals.admitted > 0);
}

/// `Limit::concurrent(4)` on three instances; Redis killed at 1.5 s, back
/// (empty) at 3 s, run to 4.5 s. Calls 100 ms long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_k_without_redis_and_after_a_restart_stays_within_the_documented_bounds() {
    let mut redis = RedisServer::start();
    let upstream = counting_upstream(Duration::from_millis(100));
    let switch = Switch::new(upstream.addr());
    let counts = Arc::new(Counts::default());
    let t0 = Instant::now();
    let end = t0 + Duration::from_millis(4_500);
    let mut handles = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..3 {
        let backend = backend(&redis.url()).await;
        let limiter = four_at_once(&backend, "hunt-k");
        handles.extend(run(&limiter, &switch, 8, end, &counts, 70));
        keep.push((backend, limiter));
    }
    tokio::time::sleep_until((t0 + Duration::from_millis(1_500)).into()).await;
    let killing = upstream.stats().elapsed;
    redis.kill();
    let killed = upstream.stats().elapsed;
    tokio::time::sleep_until((t0 + Duration::from_millis(3_000)).into()).await;
    let back = upstream.stats().elapsed;
    redis.restart();
    join(handles).await;
    let stats = upstream.stats();
    let line: Vec<String> = stats
        .buckets
        .iter()
        .map(|b| format!("{}:{}", b.start.as_millis(), b.max_in_flight))
        .collect();
    eprintln!(
        "killed {killing:?} to {killed:?}, back {back:?}: {}",
        line.join(" ")
    );
    eprintln!("{:?}", stats.totals);
    // Before: k. Without Redis, once the calls holding leases end (100 ms
    // long, and up to 400 ms late on a loaded machine): one slot per
    // process. Always: at most 2k (the calls before the kill ended long
    // before Redis came back; with longer calls, 2k and the shares: the
    // test below).
    let most = |from: Duration, to: Duration| {
        stats
            .buckets
            .iter()
            .filter(|b| b.start >= from && b.start < to)
            .map(|b| b.max_in_flight)
            .max()
            .unwrap_or(0)
    };
    assert!(most(Duration::ZERO, killing - Duration::from_millis(100)) <= 4);
    assert!(
        most(
            killed + Duration::from_millis(500),
            back - Duration::from_millis(100)
        ) <= 3
    );
    assert!(stats.totals.max_in_flight <= 8, "{:?}", stats.totals);
}

/// `Limit::concurrent(4)` on three instances (a share of one slot each
/// while Redis is down) of five tasks, each making one call 2 s long: four
/// take leases, Redis is killed at 300 ms (the other calls wait in the
/// fallbacks, one of each goes) and restarted empty at 600 ms, while every
/// call before it is still in flight. Redis sees neither the leases it lost
/// nor the fallbacks' calls, and gives four new leases: the upstream counts
/// up to `2k` and the shares in flight (11 here), not `2k`, until the older
/// calls end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_k_after_a_restart_during_long_calls_stays_within_2k_and_the_shares() {
    let mut redis = RedisServer::start();
    let upstream = counting_upstream(Duration::from_millis(2_000));
    let mut handles = Vec::new();
    let mut keep = Vec::new();
    let t0 = Instant::now();
    for _ in 0..3 {
        // (The probe every 50 ms: Redis back is seen at once.)
        let backend = RedisBackend::builder(redis::Client::open(redis.url()).unwrap())
            .response_timeout(Duration::from_secs(2))
            .probe_interval(Duration::from_millis(50))
            .build()
            .await
            .unwrap();
        let limiter = four_at_once(&backend, "restart-k");
        let client = OutboundLayer::new(Arc::clone(&limiter)).layer(Client::new(upstream.addr()));
        for _ in 0..5 {
            let mut client = client.clone();
            handles.push(tokio::spawn(async move {
                assert_eq!(client.call(complete()).await.unwrap().status(), 200);
            }));
        }
        keep.push((backend, limiter));
    }
    tokio::time::sleep_until((t0 + Duration::from_millis(300)).into()).await;
    let killing = upstream.stats().elapsed;
    redis.kill();
    tokio::time::sleep_until((t0 + Duration::from_millis(600)).into()).await;
    redis.restart();
    join(handles).await;
    let stats = upstream.stats();
    let line: Vec<String> = stats
        .buckets
        .iter()
        .map(|b| format!("{}:{}", b.start.as_millis(), b.max_in_flight))
        .collect();
    eprintln!("killed at {killing:?}: {}", line.join(" "));
    let before = stats
        .buckets
        .iter()
        .filter(|b| b.start + stats.bucket <= killing)
        .map(|b| b.max_in_flight)
        .max()
        .unwrap_or(0);
    assert!(before <= 4, "{before} in flight before the kill");
    assert_eq!(stats.totals.admitted, 15, "{:?}", stats.totals);
    assert!(
        stats.totals.max_in_flight <= 2 * 4 + 3,
        "{:?}",
        stats.totals
    );
}
