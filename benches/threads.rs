//! The in-process limiters on many threads at once, next to `governor` in
//! the same run: how the cost of a call grows when threads share one
//! limiter, one hot key, or a keyed limiter with keys of their own.
//!
//! ```text
//! cargo bench -p paceline-benches --bench threads
//! ```
//!
//! For each thread count (`PACELINE_BENCH_THREADS`, a comma-separated list;
//! by default 1, 2, 4, ... up to the machine's cores), every thread makes
//! `PACELINE_BENCH_CALLS` calls (default 2 000 000), all started together;
//! the figure is the wall time over all the threads' calls, in nanoseconds
//! per call (the inverse of the aggregate throughput). The two sides
//! alternate over `PACELINE_BENCH_ROUNDS` rounds (default 5); the table
//! gives each side's median and the median of the per-round ratios. Limiters
//! as in the `call_site` benchmark: 10^9 permits a second, so every call is
//! granted; thread `t` of the distinct-keys case goes round its own 1 000
//! keys.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::Quota;
use paceline::{KeyedRateLimiter, RateLimiter};

#[path = "plain.rs"]
mod plain;
use plain::env;

/// Keys per thread in the distinct-keys case.
const KEYS: u64 = 1_000;

/// `threads` threads, started together, each calling `call(thread, i)` for
/// `i` in `0..calls`; wall nanoseconds per call over all of them.
fn per_call(threads: u64, calls: u64, call: &(dyn Fn(u64, u64) -> bool + Sync)) -> f64 {
    let start = Barrier::new(threads as usize + 1);
    let began = std::thread::scope(|scope| {
        for t in 0..threads {
            let start = &start;
            scope.spawn(move || {
                start.wait();
                let mut granted = 0u64;
                for i in 0..calls {
                    if black_box(call(t, i)) {
                        granted += 1;
                    }
                }
                black_box(granted);
            });
        }
        start.wait();
        // The scope joins every thread before it returns.
        Instant::now()
    });
    began.elapsed().as_nanos() as f64 / (threads * calls) as f64
}

fn thread_counts() -> Vec<u64> {
    if let Ok(list) = std::env::var("PACELINE_BENCH_THREADS") {
        let counts: Vec<u64> = list
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .filter(|&n| n > 0)
            .collect();
        if !counts.is_empty() {
            return counts;
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mut counts = vec![1];
    while counts[counts.len() - 1] * 2 <= cores {
        counts.push(counts[counts.len() - 1] * 2);
    }
    counts
}

type Call<'a> = Box<dyn Fn(u64, u64) -> bool + Sync + 'a>;

fn main() {
    let calls = env("PACELINE_BENCH_CALLS", 2_000_000);
    let rounds = env("PACELINE_BENCH_ROUNDS", 5) as usize;
    let fast = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    println!(
        "{calls} calls a thread, {rounds} rounds, medians of the wall time per call \
         over all threads (ns):"
    );
    for threads in thread_counts() {
        // Fresh limiters for each thread count, shared by its rounds.
        let one = RateLimiter::bursty(1e9).unwrap();
        let keyed = KeyedRateLimiter::<u64>::bursty(1e9).unwrap();
        let theirs_one = governor::RateLimiter::direct(fast);
        let theirs_keyed = governor::RateLimiter::keyed(fast);
        let hot = 42u64;
        // (case, paceline's call, governor's call)
        let cases: Vec<(&str, Call, Call)> = vec![
            (
                "one limiter",
                Box::new(|_, _| {
                    matches!(one.try_reserve(black_box(1), Duration::ZERO), Ok(Some(_)))
                }),
                Box::new(|_, _| theirs_one.check().is_ok()),
            ),
            (
                "keyed, one hot key",
                Box::new(|_, _| {
                    matches!(
                        keyed.try_reserve(black_box(&hot), 1, Duration::ZERO),
                        Ok(Some(_))
                    )
                }),
                Box::new(|_, _| theirs_keyed.check_key(black_box(&hot)).is_ok()),
            ),
            (
                "keyed, keys of its own",
                Box::new(|t, i| {
                    let key = t * KEYS + i % KEYS;
                    matches!(keyed.try_reserve(&key, 1, Duration::ZERO), Ok(Some(_)))
                }),
                Box::new(|t, i| theirs_keyed.check_key(&(t * KEYS + i % KEYS)).is_ok()),
            ),
        ];
        println!();
        println!("{threads} thread(s):");
        println!();
        plain::compare(rounds, &cases, "ns", |call| per_call(threads, calls, call));
    }
}
