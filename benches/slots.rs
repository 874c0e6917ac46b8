//! Slots for calls in flight through Redis (`Limit::concurrent`): how a
//! freed slot reaches the call waiting for it in another process, what a
//! waiting call costs Redis, and who is served when workers loop.
//!
//! ```text
//! cargo bench -p paceline-benches --features redis --bench slots
//! ```
//!
//! A `redis-server` this benchmark starts on a free loopback port; two
//! limiters on two backends of their own are two processes, as far as
//! Redis can tell. Each limiter runs at 10^6 permits per second (no rate
//! binds) with `Limit::concurrent(1)`; slots are held as a call holds
//! them, without a call's reservation (the crate's hidden `hold_slot`), so
//! that the script calls counted are the slots' own. No other crate has
//! slots shared through Redis, so there is no anchor in the run: each
//! figure is read against the same command on an earlier revision
//! (`BENCHMARKS.md`).
//!
//! - `hand-off`: one process holds the slot 50 ms and frees it while a call
//!   of the other waits; the time from the free to the other's grant, 40
//!   times.
//! - `lone waiter`: the script calls Redis runs (its own count, `INFO
//!   commandstats`) while one call waits 0.5 s, 2 s and 10 s for a slot
//!   another process holds.
//! - `looping worker`: one process loops take, hold 20 ms, give back; a call
//!   of the other asks once the worker has its third slot. How many slots
//!   the worker takes before that call is served (fair: 0 to 1; `200+`:
//!   not served within 4 s), in five rounds.
//! - `two fleets taking turns`: 20 workers in each process, each looping
//!   take, hold 5 ms, give back, for 4 s: the slots taken, how many went
//!   to the other process than the one before, and the script calls Redis
//!   ran meanwhile (takes, releases and the line's leaves).

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{Limit, RateLimiter};

#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

const MS: Duration = Duration::from_millis(1);

/// The most slots a looping worker takes in a round (4 s of 20 ms holds).
const LOOPS: usize = 200;

/// A limiter `name` with one slot, on a backend of its own.
async fn limiter(server: &RedisServer, name: &str) -> RateLimiter<Redis> {
    let backend = RedisBackend::builder(server.client())
        .build()
        .await
        .unwrap();
    RateLimiter::builder()
        .permits_per_second(1_000_000.0)
        .limit(Limit::concurrent(1))
        .redis(&backend, name)
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap()
}

/// A slot of `limiter`, waiting at most a minute.
async fn slot(limiter: &RateLimiter<Redis>) -> impl Send + Sync + '_ {
    let taken = limiter.hold_slot(Some(Duration::from_secs(60))).await;
    taken.unwrap().expect("a slot within a minute").1
}

async fn hand_off(server: &RedisServer) {
    let (a, b) = (
        limiter(server, "hand-off").await,
        limiter(server, "hand-off").await,
    );
    let mut lags = Vec::new();
    for _ in 0..40 {
        let held = slot(&a).await;
        let freed = Mutex::new(None);
        let free = async {
            tokio::time::sleep(50 * MS).await;
            *freed.lock().unwrap() = Some(Instant::now());
            drop(held);
        };
        let (taken, ()) = tokio::join!(slot(&b), free);
        lags.push(freed.lock().unwrap().unwrap().elapsed());
        drop(taken);
        tokio::time::sleep(20 * MS).await;
    }
    lags.sort();
    println!(
        "hand-off after a 50 ms hold, 40 times: median {:.1?}, p90 {:.1?}, max {:.1?}",
        lags[20], lags[36], lags[39]
    );
}

async fn lone_waiter(server: &RedisServer) {
    let (a, b) = (limiter(server, "lone").await, limiter(server, "lone").await);
    let mut counts = Vec::new();
    for wait in [500 * MS, 2_000 * MS, 10_000 * MS] {
        let held = slot(&a).await;
        let before = server.script_calls();
        let free = async {
            tokio::time::sleep(wait).await;
            drop(held);
        };
        let (taken, ()) = tokio::join!(slot(&b), free);
        counts.push(server.script_calls() - before);
        drop(taken);
        tokio::time::sleep(100 * MS).await;
    }
    println!(
        "lone waiter, script calls while it waits 0.5 s / 2 s / 10 s (the release included): {} / {} / {}",
        counts[0], counts[1], counts[2]
    );
}

async fn looping_worker(server: &RedisServer) {
    let mut rounds = Vec::new();
    for round in 0..5 {
        let name = format!("loop{round}");
        let (worker, other) = (limiter(server, &name).await, limiter(server, &name).await);
        let taken = AtomicUsize::new(0);
        let served = Mutex::new(None);
        let looping = async {
            while served.lock().unwrap().is_none() && taken.load(SeqCst) < LOOPS {
                let held = slot(&worker).await;
                taken.fetch_add(1, SeqCst);
                tokio::time::sleep(20 * MS).await;
                drop(held);
            }
        };
        let waiting = async {
            while taken.load(SeqCst) < 3 {
                tokio::time::sleep(MS).await;
            }
            let asked = taken.load(SeqCst);
            let held = slot(&other).await;
            *served.lock().unwrap() = Some(taken.load(SeqCst) - asked);
            drop(held);
        };
        tokio::join!(looping, waiting);
        let served = served
            .lock()
            .unwrap()
            .filter(|_| taken.load(SeqCst) < LOOPS);
        rounds.push(served.map_or(format!("{LOOPS}+"), |n| n.to_string()));
    }
    println!(
        "looping worker, 20 ms holds: its slots before the other process's call, 5 rounds: {}",
        rounds.join(", ")
    );
}

async fn two_fleets(server: &RedisServer) {
    let a = Arc::new(limiter(server, "fleets").await);
    let b = Arc::new(limiter(server, "fleets").await);
    let served = Arc::new(Mutex::new(Vec::new()));
    let before = server.script_calls();
    let stop = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for task in 0..40u32 {
        let limiter = if task % 2 == 0 { a.clone() } else { b.clone() };
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            // Into the line in turn, the two processes alternating.
            tokio::time::sleep(MS * task).await;
            loop {
                let held = slot(&limiter).await;
                if Instant::now() < stop {
                    served.lock().unwrap().push(task % 2);
                }
                tokio::time::sleep(5 * MS).await;
                drop(held);
            }
        }));
    }
    tokio::time::sleep_until(stop.into()).await;
    let calls = server.script_calls() - before;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let served = served.lock().unwrap();
    let across = served.windows(2).filter(|pair| pair[0] != pair[1]).count();
    println!(
        "two fleets taking turns, 5 ms holds, 4 s: {} slots, {across} to the other process; {calls} script calls",
        served.len()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter is not taken.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = RedisServer::start();
        println!("redis-server on 127.0.0.1 (slots through Redis, two processes)");
        hand_off(&server).await;
        lone_waiter(&server).await;
        looping_worker(&server).await;
        two_fleets(&server).await;
    });
}
