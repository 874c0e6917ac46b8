//! Several limiter instances (separate connections, as separate processes
//! would have) hammering one key: never more permits than the rate allows,
//! and not much fewer; pacing across instances holds the rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use paceline::RateLimiter;
use paceline::redis::{Redis, RedisBackend};

async fn instances(
    server: &RedisServer,
    name: &str,
    rate: f64,
    burst: Duration,
    n: usize,
) -> Vec<Arc<RateLimiter<Redis>>> {
    let mut limiters = Vec::new();
    for _ in 0..n {
        // A backend each: a connection each, as separate processes have.
        let backend = RedisBackend::builder(server.client())
            .response_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("backend");
        let limiter = RateLimiter::builder()
            .permits_per_second(rate)
            .max_burst(burst)
            .redis(&backend, name)
            .build()
            .expect("limiter");
        limiters.push(Arc::new(limiter));
    }
    limiters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_over_grant_under_contention() {
    const RATE: f64 = 10.0;
    const RUN: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let limiters = instances(&server, "contended", RATE, Duration::from_secs(1), 3).await;
    let granted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..64 {
            let (limiter, granted, calls) = (
                Arc::clone(limiter),
                Arc::clone(&granted),
                Arc::clone(&calls),
            );
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < RUN {
                    calls.fetch_add(1, Ordering::Relaxed);
                    if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let granted = granted.load(Ordering::Relaxed) as f64;
    // A missing key starts full: 10 stored, plus the one fresh permit
    // pre-consumed on credit, plus what the rate earns while the test runs.
    let max = RATE * 1.0 + 1.0 + RATE * elapsed;
    println!(
        "granted {granted} of a theoretical maximum of {max:.1} ({:.1}%) in {elapsed:.2} s, {} calls",
        100.0 * granted / max,
        calls.load(Ordering::Relaxed)
    );
    assert!(granted <= max, "over-grant: {granted} > {max:.1}");
    assert!(
        granted >= 0.95 * max,
        "under-grant: {granted} < 95% of {max:.1}"
    );
    assert!(limiters.iter().all(|l| !l.stats().degraded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_across_instances_holds_the_rate() {
    const RATE: f64 = 200.0;
    const RUN: Duration = Duration::from_secs(5);
    let server = RedisServer::start();
    let limiters = instances(&server, "paced", RATE, Duration::ZERO, 3).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..4 {
            let limiter = Arc::clone(limiter);
            tasks.push(tokio::spawn(async move {
                let mut done = Vec::new();
                while start.elapsed() < RUN {
                    limiter.acquire(1).await.unwrap();
                    done.push(start.elapsed());
                }
                done
            }));
        }
    }
    let mut done = Vec::new();
    for task in tasks {
        done.extend(task.await.unwrap());
    }
    done.sort();
    let span = (*done.last().unwrap() - done[0]).as_secs_f64();
    let achieved = (done.len() - 1) as f64 / span;
    println!(
        "{} acquisitions over {span:.3} s: {achieved:.2}/s (configured {RATE}/s)",
        done.len()
    );
    // Never over the rate (2% for the span's ends); under it only by what
    // a loaded machine's late wake-ups leave unused (a slot no task was
    // awake to take is lost, with nothing stored): exact pacing under
    // quiet timing is the benchmark's to measure.
    assert!(achieved <= 1.02 * RATE, "achieved {achieved:.2}/s");
    assert!(achieved >= 0.5 * RATE, "achieved {achieved:.2}/s");
}
