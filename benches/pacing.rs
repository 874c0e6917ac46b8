//! Pacing accuracy on the real clock: the rate tasks actually get from a
//! limiter, against the rate it is configured for.
//!
//! ```text
//! cargo bench -p paceline-benches --features redis --bench pacing                              # 5 s per run, 18 runs
//! PACELINE_PACING_SECS=1 cargo bench -p paceline-benches --features redis --bench pacing       # shorter
//! PACELINE_PACING_BURST_MS=0 cargo bench -p paceline-benches --features redis --bench pacing   # strict spacing, no burst
//! ```
//!
//! For each rate (10, 1 000 and 50 000 permits/s) and each number of tasks
//! (1, 8, 64), every task loops on `acquire(1).await` for the run's length
//! (an acquisition started before the end counts when it returns), and
//! notes the instant each acquisition returns. The achieved rate is the
//! number of acquisitions after the first, divided by the time from the
//! first to the last (so neither the start-up nor the idle end of the run
//! counts), and the error is its deviation from the configured rate.
//! Limiters have the default burst of one second (`PACELINE_PACING_BURST_MS`
//! changes it): a task that wakes late finds the permits it missed stored and
//! takes them at once, which is what stored permits are for. No stored
//! permits inflate the start: a new local limiter has none, and the Redis key
//! (which starts full, as a missing key reads as idle) is drained by one
//! `reserve(max_permits)` before the run. With no burst at all, a permit
//! nobody claims on time is lost, so late timer wake-ups (Tokio timers have
//! a resolution of one millisecond) lower the rate at high rates. Two limiters: the local `RateLimiter`, and a
//! `RateLimiter<Redis>` on a private redis-server this benchmark starts on a
//! free loopback port (a fresh key per run). Both sleep on Tokio timers
//! (multi-thread runtime), whose resolution is one millisecond.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::redis::{Fallback, RedisBackend};
use paceline::{Limiter, RateLimiter};

#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

const RATES: [f64; 3] = [10.0, 1_000.0, 50_000.0];
const TASKS: [usize; 3] = [1, 8, 64];

/// What one run measured.
struct Pace {
    grants: usize,
    span: Duration,
}

impl Pace {
    /// Acquisitions per second between the first and the last.
    fn rate(&self) -> f64 {
        (self.grants - 1) as f64 / self.span.as_secs_f64()
    }
}

/// `tasks` tasks acquire one permit at a time from `limiter` for `length`;
/// returns how many acquisitions completed and the time from the first to
/// the last.
async fn run(limiter: Arc<dyn Limiter>, tasks: usize, length: Duration) -> Pace {
    let start = Instant::now();
    let deadline = start + length;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut first = None;
                let mut last = start;
                let mut grants = 0;
                while Instant::now() < deadline {
                    limiter.acquire(1).await.expect("acquire");
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = now;
                    grants += 1;
                }
                (first, last, grants)
            })
        })
        .collect();
    let (mut first, mut last, mut grants) = (None::<Instant>, start, 0);
    for handle in handles {
        let (task_first, task_last, task_grants) = handle.await.expect("task");
        if let Some(t) = task_first {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
        last = last.max(task_last);
        grants += task_grants;
    }
    Pace {
        grants,
        span: last - first.expect("at least one acquisition"),
    }
}

fn main() {
    let secs: f64 = std::env::var("PACELINE_PACING_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let length = Duration::from_secs_f64(secs);
    let burst_ms: u64 = std::env::var("PACELINE_PACING_BURST_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let burst = Duration::from_millis(burst_ms);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let mut runs = 0;

    println!(
        "{} s per run, max_burst {} ms; achieved = (acquisitions - 1) / (last - first acquisition)",
        secs, burst_ms
    );
    println!();
    println!(
        "| permits/s | tasks | local: achieved/s | error | Redis: achieved/s | error | Redis: acquisitions |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for rate in RATES {
        for tasks in TASKS {
            let local: Arc<dyn Limiter> = Arc::new(
                RateLimiter::builder()
                    .permits_per_second(rate)
                    .max_burst(burst)
                    .build()
                    .expect("local limiter"),
            );
            let local = runtime.block_on(run(local, tasks, length));
            runs += 1;
            let name = format!("pacing-{runs}");
            let redis: Arc<dyn Limiter> = runtime.block_on(async {
                let redis = RedisBackend::builder(server.client())
                    .response_timeout(Duration::from_secs(2))
                    .build()
                    .await
                    .expect("Redis backend");
                let limiter = RateLimiter::builder()
                    .permits_per_second(rate)
                    .max_burst(burst)
                    .redis(&redis, &name)
                    .fallback(Fallback::FailClosed)
                    .build()
                    .expect("Redis limiter");
                // Drain the full burst of the new key: it is spent at once, free.
                let max_permits = (rate * burst.as_secs_f64()).floor() as u32;
                if max_permits > 0 {
                    limiter.reserve(max_permits).await.expect("drain");
                }
                Arc::new(limiter)
            });
            let remote = runtime.block_on(run(redis, tasks, length));
            let error = |pace: &Pace| (pace.rate() / rate - 1.0) * 100.0;
            println!(
                "| {rate:.0} | {tasks} | {:.1} | {:+.2}% | {:.1} | {:+.2}% | {} |",
                local.rate(),
                error(&local),
                remote.rate(),
                error(&remote),
                remote.grants
            );
        }
    }
}
