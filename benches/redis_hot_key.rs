//! Part 4 of the Redis benchmark (see `redis.rs`): one hot key, 256 tasks
//! of one process, coalesced or not, and the server's time per reservation
//! in batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paceline::RateLimiter;
use paceline::redis::{Fallback, Redis, RedisBackend};
use tokio::runtime::Runtime;

use super::{Bench, COLD_KEYS, ratio, spread};

/// Runs part 4 on `bench`'s server: `rounds` rounds of `secs` each, the
/// batches with redis-benchmark (about `requests` reservations each) on the
/// script loaded as `reserve`.
pub(crate) fn run(
    bench: &mut Bench,
    runtime: &Runtime,
    rounds: usize,
    secs: f64,
    requests: u64,
    reserve: &str,
) {
    // Part 4: one hot key, 256 tasks, coalesced or not.
    const TASKS: usize = 256;
    bench.keyspace = COLD_KEYS.to_owned();
    let hot: Vec<Arc<RateLimiter<Redis>>> = [true, false]
        .iter()
        .map(|&coalesce| {
            runtime.block_on(async {
                let redis = RedisBackend::builder(bench.server.client())
                    .response_timeout(Duration::from_secs(5))
                    .coalesce(coalesce)
                    .build()
                    .await
                    .expect("backend");
                RateLimiter::builder()
                    .permits_per_second(1e9)
                    .max_burst(Duration::from_secs(1))
                    .redis(&redis, "hot")
                    .fallback(Fallback::FailClosed)
                    .build()
                    .map(Arc::new)
                    .expect("limiter")
            })
        })
        .collect();
    // [coalesced, one call each]: (ops/s, client CPU µs per reservation)
    let mut hot_ops: [Vec<f64>; 2] = Default::default();
    let mut hot_cpu: [Vec<f64>; 2] = Default::default();
    let mut lone: [Vec<f64>; 2] = Default::default();
    // EVALSHA calls per run (warm-up included), to tell the batch sizes.
    let mut hot_calls: [Vec<f64>; 2] = Default::default();
    let sizes = [1usize, 8, 64];
    let mut per_reservation: Vec<Vec<f64>> = vec![vec![]; sizes.len()];
    for _ in 0..rounds {
        for (i, limiter) in hot.iter().enumerate() {
            bench.reset();
            let (ops, cpu) = runtime.block_on(hot_key_ops(limiter, TASKS, secs));
            hot_ops[i].push(ops);
            hot_cpu[i].push(cpu);
            hot_calls[i].push(bench.evalsha_calls());
            // A lone caller: never queued, so never slower.
            bench.reset();
            lone[i].push(runtime.block_on(hot_key_ops(limiter, 1, secs)).0);
        }
        for (i, &size) in sizes.iter().enumerate() {
            // As the client sends them: a batch of the same request, or
            // one request as a call of its own.
            let batch = format!("1:-1*{size}");
            let (mode, second) = if size == 1 {
                ("1", "-1")
            } else {
                ("batch", batch.as_str())
            };
            let args = [mode, second, "1000000000.0", "bursty", "1000000", "0.0"];
            let calls = (requests / size as u64).max(1000);
            let run = bench.redis_benchmark(50, 16, calls, reserve, "paceline:v1:hot", &args);
            per_reservation[i].push(run.usec / size as f64);
        }
    }
    println!();
    println!(
        "A hot key: one RateLimiter<Redis> at 10^9 permits/s, {TASKS} tasks reserving 1 on a \
         current-thread runtime; ops/s and the client's CPU µs per reservation, median (and \
         range) of {rounds} rounds:"
    );
    println!();
    println!("| coalesce | reservations/s | client CPU µs/reservation | reservations per call |");
    println!("|---|---:|---:|---:|");
    for (i, name) in ["true", "false"].iter().enumerate() {
        // The run's reservations, warm-up included (0.3 s), per call.
        let per_call: Vec<f64> = hot_ops[i]
            .iter()
            .zip(&hot_calls[i])
            .map(|(ops, calls)| ops * (secs + 0.3) / calls)
            .collect();
        println!(
            "| {name} | {} | {} | {} |",
            spread(&hot_ops[i], 0),
            spread(&hot_cpu[i], 2),
            spread(&per_call, 1)
        );
    }
    println!();
    println!(
        "coalesce(true) / coalesce(false): {:.2}x (median of the per-round ratios)",
        ratio(&hot_ops[0], &hot_ops[1])
    );
    println!(
        "A lone caller (1 task): {} reservations/s coalesced, {} not: {:.2}x",
        spread(&lone[0], 0),
        spread(&lone[1], 0),
        ratio(&lone[0], &lone[1])
    );
    println!();
    println!(
        "Server time per reservation in a batch (redis-benchmark -c 50 -P 16, EVALSHA batch; \
         a batch of 1 is a call of its own):"
    );
    println!();
    println!("| batch | server µs/reservation | vs one call each |");
    println!("|---:|---:|---:|");
    for (i, size) in sizes.iter().enumerate() {
        println!(
            "| {size} | {} | {:.2}x |",
            spread(&per_reservation[i], 2),
            ratio(&per_reservation[i], &per_reservation[0])
        );
    }
}

/// This process's CPU time so far, in seconds (user and system, every
/// thread), from /proc; 0 where there is none.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command's name, which ends with the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here, in
    // clock ticks (100 per second on Linux).
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Reservations per second of `reserve(1)` from `tasks` tasks sharing
/// `limiter` (one key), and the client's CPU µs per reservation.
pub(crate) async fn hot_key_ops(
    limiter: &Arc<RateLimiter<Redis>>,
    tasks: usize,
    secs: f64,
) -> (f64, f64) {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (limiter, count, stop) = (Arc::clone(limiter), count.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    limiter.reserve(1).await.expect("reserve");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up
    let (start, started, cpu) = (count.load(Ordering::Relaxed), Instant::now(), cpu_secs());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let done = count.load(Ordering::Relaxed) - start;
    let (elapsed, cpu) = (started.elapsed().as_secs_f64(), cpu_secs() - cpu);
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("task");
    }
    (done as f64 / elapsed, cpu * 1e6 / done as f64)
}
