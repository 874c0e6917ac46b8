//! The Redis limiter's cost, side by side in one run, against a private
//! `redis-server` this benchmark starts on a free loopback port (and stops).
//!
//! ```text
//! scripts/bench-redis.sh          # or: cargo bench -p paceline-benches --features redis --bench redis
//! ```
//!
//! Part 1, the script: `redis-benchmark` sends EVALSHA over 50 connections,
//! 16 commands pipelined on each (`-c 50 -P 16`), for each script below in
//! turn; Redis's own accounting (`INFO commandstats`, `usec_per_call` of
//! EVALSHA, after `CONFIG RESETSTAT`) gives the server time per call, and
//! `redis-benchmark` the calls per second.
//!
//! * the crate's script (`lua/`), bursty, 1000 permits/s, 1 s of
//!   burst, on one hot key (always in debt, as under overload);
//! * `benches/baseline.lua`, a straightforward script for the same bursty
//!   reservation (TIME, HMGET, compute, HSET, PEXPIRE), same key shape;
//! * `return 1`, the cost of EVALSHA itself;
//! * a lower bound for any script on this layout: TIME, GET and a SET that
//!   keeps the TTL, with no logic in between;
//! * both real scripts again on random keys out of 10^7 (`__rand_int__`),
//!   nearly all missing: the path that resets a key and sets its TTL;
//! * the crate's script on one hot key with reservations its caller may
//!   give back (`1+`, as `acquire` sends): each waits, so each is logged
//!   with an id in the key's log, which stays full (128 requests, a value of
//!   up to about 4 700 bytes, written in place): the most a give-back-able
//!   reservation costs.
//!
//! Part 2, the client: one `RateLimiter<Redis>` (one multiplexed connection)
//! calls `reserve(1)` in a loop from 1 task, then from 64 tasks sharing it;
//! next to each, `redis-benchmark` on the same script, key and arguments
//! with one connection and no pipelining (`-c 1 -P 1`), and with 64
//! connections pipelining 16 each (`-c 64 -P 16`): the ceilings the client
//! is compared with. (64 tasks have at most 64 requests in flight, where
//! `-c 64 -P 16` keeps 1024; a last row compares them with `-c 1 -P 64`,
//! redis-benchmark with the same 64 in flight on one connection.) The client runs on a current-thread Tokio runtime (one
//! thread, as redis-benchmark drives all its connections from one thread)
//! and on a multi-thread one (a worker per CPU); on a small machine the
//! latter competes with redis-server for the CPUs.
//!
//! Part 3, keyed: one `RedisBackend` (one connection) and a
//! `KeyedRateLimiter<u64, Redis>` on it, 64 tasks reserving on random keys out of
//! 10 000 (each its own Redis key, `paceline:v1:keyed:{key}`), on a
//! current-thread runtime; next to it `redis-benchmark -c 64 -P 16` running
//! the script on random keys of the same shape (`-r 10000`). Then `MEMORY
//! USAGE` of the keys, averaged over a sample.
//!
//! Part 4, a hot key under contention: 256 tasks reserving one permit on
//! one key of a limiter that never makes anyone wait (10^9 permits/s), on
//! a current-thread runtime, with `.coalesce(true)` (reservations that meet
//! a round trip in flight go together in one call) and `.coalesce(false)`
//! (one call each), alternated in every round; the client's CPU time per
//! reservation (the process's, from /proc: redis-server runs apart); and
//! the server time per reservation of the script's batches of 8 and 64
//! next to a call each (`redis-benchmark -c 50 -P 16`, EVALSHA `batch`).
//!
//! Every measurement is repeated (`PACELINE_BENCH_ROUNDS`, default 3) and
//! the median reported; rounds interleave the cases so that load from other
//! work on the machine spreads over all of them. `PACELINE_BENCH_SECS`
//! (default 2) sets the length of each client run; redis-benchmark runs are
//! sized to take about as long.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{KeyedRateLimiter, RateLimiter};

#[allow(dead_code)]
#[path = "../tests/support/limiter_state.rs"]
mod limiter_state;
#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

/// Part 4: one hot key.
#[path = "redis_hot_key.rs"]
mod hot_key;

use redis_server::RedisServer;

/// The crate's script, as the crate assembles it.
fn reserve_script() -> &'static str {
    limiter_state::script_source()
}
const BASELINE: &str = include_str!("baseline.lua");
const RETURN_1: &str = "return 1";
/// What every script on this layout must do at least.
const LOWER_BOUND: &str = "local t = redis.call('TIME')\n\
    local v = redis.call('GET', KEYS[1])\n\
    redis.call('SET', KEYS[1], struct.pack('<ddddd', 0, t[1] * 1000000 + t[2], 0, 0, 0), 'KEEPTTL')\n\
    return 0";

/// The limiter: the crate's key for the name `bench`, and the arguments the
/// crate sends for `reserve(1)` at 1000 permits/s with 1 s of burst.
const NAME: &str = "bench";
const KEY: &str = "paceline:v1:bench";
const RATE: f64 = 1000.0;
const RESERVE_ARGS: &[&str] = &["1", "-1", "1000.0", "bursty", "1000000", "0.0"];
const BASELINE_ARGS: &[&str] = &["1", "-1", "1000.0", "1000000"];
/// The same reservation as one its caller may give back (`acquire`, a
/// `Reservation`): on a key always in debt, each is logged with an id in
/// the key's log, which stays full.
const HELD_KEY: &str = "paceline:v1:held";
const HELD_ARGS: &[&str] = &["1+", "-1", "1000.0", "bursty", "1000000", "0.0"];
/// Random keys for the cold-key rows: `__rand_int__` is replaced per call.
const COLD_KEY: &str = "paceline:v1:cold:__rand_int__";
const COLD_KEYS: &str = "10000000";
/// The keyed case: 10 000 user keys under the keyed limiter's prefix.
const USER_KEY: &str = "paceline:v1:keyed:__rand_int__";
const USER_KEYS: u64 = 10_000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The median of `values`, with their range.
fn spread(values: &[f64], decimals: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.decimals$} ({min:.decimals$}–{max:.decimals$})",
        median(values)
    )
}

/// The median of the per-round ratios `a[r] / b[r]` (the two measured close
/// together, under the same load).
fn ratio(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&ratios)
}

/// One redis-benchmark run: calls per second, and the server's µs per call.
struct Run {
    ops: f64,
    usec: f64,
}

struct Bench {
    server: RedisServer,
    con: redis::Connection,
    /// What `__rand_int__` ranges over (`-r`).
    keyspace: String,
}

impl Bench {
    fn load(&mut self, script: &str) -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(&mut self.con)
            .expect("SCRIPT LOAD")
    }

    fn reset(&mut self) {
        let _: () = redis::cmd("FLUSHALL").query(&mut self.con).unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.con)
            .unwrap();
    }

    /// EVALSHA calls since the last reset.
    fn evalsha_calls(&mut self) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con)
            .unwrap();
        info.lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|line| field(line, "calls"))
            .unwrap_or(0.0)
    }

    /// `usec_per_call` of EVALSHA since the last reset.
    fn evalsha_usec(&mut self) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con)
            .unwrap();
        let line = info
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .unwrap_or_else(|| panic!("no EVALSHA in INFO commandstats:\n{info}"));
        let failed = field(line, "failed_calls").unwrap_or(0.0);
        assert_eq!(failed, 0.0, "some calls failed: {line}");
        field(line, "usec_per_call").expect("usec_per_call")
    }

    /// redis-benchmark EVALSHA `sha` 1 `key` `args` with `clients` x
    /// `pipeline`, `requests` calls in all.
    fn redis_benchmark(
        &mut self,
        clients: usize,
        pipeline: usize,
        requests: u64,
        sha: &str,
        key: &str,
        args: &[&str],
    ) -> Run {
        self.reset();
        let port = self.server.port().to_string();
        let (clients, pipeline, requests) = (
            clients.to_string(),
            pipeline.to_string(),
            requests.to_string(),
        );
        let mut command = Command::new("redis-benchmark");
        command.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-c",
            &clients,
            "-P",
            &pipeline,
        ]);
        command.args(["-n", &requests, "-r", &self.keyspace, "--csv"]);
        command.args(["EVALSHA", sha, "1", key]).args(args);
        let output = command.output().unwrap_or_else(|e| {
            panic!("cannot run redis-benchmark ({e}); it comes with redis-server (redis-tools)")
        });
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "redis-benchmark failed: {stdout}");
        // "test","rps",...  then  "EVALSHA ...","123456.78",...
        let ops = stdout
            .lines()
            .filter_map(|line| line.split("\",\"").nth(1))
            .find_map(|rps| rps.trim_matches('"').parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no rate in redis-benchmark's output: {stdout}"));
        Run {
            ops,
            usec: self.evalsha_usec(),
        }
    }
}

/// `name=value` in an INFO line.
fn field(line: &str, name: &str) -> Option<f64> {
    let start = line.find(&format!("{name}="))? + name.len() + 1;
    line[start..].split(',').next()?.parse().ok()
}

/// Calls per second of `reserve(1)` from `tasks` tasks sharing `limiter`.
async fn client_ops(limiter: &Arc<RateLimiter<Redis>>, tasks: usize, secs: f64) -> f64 {
    hot_key::hot_key_ops(limiter, tasks, secs).await.0
}

fn main() {
    let rounds: usize = env_or("PACELINE_BENCH_ROUNDS", 3).max(1);
    let secs: f64 = env_or("PACELINE_BENCH_SECS", 2.0);

    let server = RedisServer::start();
    let con = server.connection();
    let mut bench = Bench {
        server,
        con,
        keyspace: COLD_KEYS.to_owned(),
    };
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut bench.con)
        .unwrap();
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "redis-server {version} on 127.0.0.1:{}; {rounds} rounds",
        bench.server.port()
    );

    let reserve = bench.load(reserve_script());
    let baseline = bench.load(BASELINE);
    let return_1 = bench.load(RETURN_1);
    let lower_bound = bench.load(LOWER_BOUND);

    let requests = (secs * 250_000.0) as u64;
    // Both kinds of Tokio runtime (a limiter's I/O runs on the runtime it
    // was built in).
    let runtimes = [
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime"),
    ];
    let runtime = &runtimes[0];
    // `PACELINE_BENCH_PART=4` runs part 4 alone.
    if std::env::var("PACELINE_BENCH_PART").as_deref() != Ok("4") {
        // Part 1: the scripts, -c 50 -P 16.
        let baseline_key = "paceline:v1:baseline";
        let cases: [(&str, &str, &str, &[&str]); 7] = [
            (
                "the crate's script, one hot key",
                &reserve,
                KEY,
                RESERVE_ARGS,
            ),
            (
                "benches/baseline.lua, one hot key",
                &baseline,
                baseline_key,
                BASELINE_ARGS,
            ),
            ("return 1", &return_1, KEY, RESERVE_ARGS),
            (
                "lower bound: TIME, GET, SET KEEPTTL",
                &lower_bound,
                KEY,
                RESERVE_ARGS,
            ),
            (
                "the crate's script, 10^7 cold keys",
                &reserve,
                COLD_KEY,
                RESERVE_ARGS,
            ),
            (
                "benches/baseline.lua, 10^7 cold keys",
                &baseline,
                COLD_KEY,
                BASELINE_ARGS,
            ),
            (
                "the crate's script, one hot key, held (`1+`): a full log",
                &reserve,
                HELD_KEY,
                HELD_ARGS,
            ),
        ];
        let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(vec![], vec![]); cases.len()];
        for _ in 0..rounds {
            for (i, (_, sha, key, args)) in cases.iter().enumerate() {
                let run = bench.redis_benchmark(50, 16, requests, sha, key, args);
                results[i].0.push(run.ops);
                results[i].1.push(run.usec);
            }
        }
        println!();
        println!(
            "Server time per call, redis-benchmark EVALSHA -c 50 -P 16 \
         (median, and range, of {rounds} rounds):"
        );
        println!();
        println!("| script | ops/s | server µs/call | vs baseline |");
        println!("|---|---:|---:|---:|");
        for (i, ((name, ..), (ops, usec))) in cases.iter().zip(&results).enumerate() {
            // The cold-key rows compare with the baseline on cold keys.
            let baseline = if (4..=5).contains(&i) {
                &results[5].1
            } else {
                &results[1].1
            };
            println!(
                "| {name} | {:.0} | {} | {:.2}x |",
                median(ops),
                spread(usec, 2),
                ratio(usec, baseline)
            );
        }

        // Part 2: the crate's client, next to redis-benchmark's ceilings, on
        // both kinds of Tokio runtime (one limiter each: a limiter's I/O runs on
        // the runtime it was built in).
        let limiters: Vec<Arc<RateLimiter<Redis>>> = runtimes
            .iter()
            .map(|runtime| {
                runtime.block_on(async {
                    let redis = RedisBackend::builder(bench.server.client())
                        .response_timeout(Duration::from_secs(5))
                        .build()
                        .await
                        .expect("backend");
                    RateLimiter::builder()
                        .permits_per_second(RATE)
                        .max_burst(Duration::from_secs(1))
                        .redis(&redis, NAME)
                        .fallback(Fallback::FailClosed)
                        .build()
                        .map(Arc::new)
                        .expect("limiter")
                })
            })
            .collect();
        // [tasks][ceiling, current-thread, multi-thread]
        let mut client: [[Vec<f64>; 3]; 2] = Default::default();
        // redis-benchmark with as many requests in flight as 64 tasks can have.
        let mut same_depth = vec![];
        for _ in 0..rounds {
            for (row, (tasks, clients, pipeline, requests)) in
                [(1, 1, 1, (secs * 30_000.0) as u64), (64, 64, 16, requests)]
                    .into_iter()
                    .enumerate()
            {
                let run =
                    bench.redis_benchmark(clients, pipeline, requests, &reserve, KEY, RESERVE_ARGS);
                client[row][0].push(run.ops);
                if tasks == 64 {
                    bench.reset();
                    let run = bench.redis_benchmark(1, 64, requests, &reserve, KEY, RESERVE_ARGS);
                    same_depth.push(run.ops);
                }
                for (i, (runtime, limiter)) in runtimes.iter().zip(&limiters).enumerate() {
                    bench.reset();
                    client[row][1 + i].push(runtime.block_on(client_ops(limiter, tasks, secs)));
                }
            }
        }
        println!();
        println!(
            "The crate's client (one RateLimiter<Redis>, reserve(1) in a loop) vs redis-benchmark, \
         same script, key and arguments; ops/s, median (and range) of {rounds} rounds, \
         ratios: median of the per-round ratios:"
        );
        println!();
        println!(
            "| case | redis-benchmark ops/s | crate, current-thread runtime | ratio \
         | crate, multi-thread runtime ({} workers) | ratio |",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for (row, name) in ["1 task vs -c 1 -P 1", "64 tasks vs -c 64 -P 16"]
            .iter()
            .enumerate()
        {
            let [ceiling, current, multi] = &client[row];
            println!(
                "| {name} | {} | {} | {:.2} | {} | {:.2} |",
                spread(ceiling, 0),
                spread(current, 0),
                ratio(current, ceiling),
                spread(multi, 0),
                ratio(multi, ceiling)
            );
        }
        let [_, current, multi] = &client[1];
        println!(
            "| 64 tasks vs -c 1 -P 64 (64 in flight, as for the tasks) | {} | {} | {:.2} | {} | {:.2} |",
            spread(&same_depth, 0),
            spread(current, 0),
            ratio(current, &same_depth),
            spread(multi, 0),
            ratio(multi, &same_depth)
        );
        drop(limiters);

        // Part 3: keyed, 64 tasks over 10 000 keys through one backend.
        let keyed: Arc<KeyedRateLimiter<u64, Redis>> = runtime.block_on(async {
            let backend = RedisBackend::builder(bench.server.client())
                .response_timeout(Duration::from_secs(5))
                .build()
                .await
                .expect("backend");
            Arc::new(
                KeyedRateLimiter::<u64>::builder()
                    .permits_per_second(RATE)
                    .max_burst(Duration::from_secs(1))
                    .redis(&backend, "keyed")
                    .fallback(Fallback::FailClosed)
                    .build()
                    .expect("keyed limiter"),
            )
        });
        bench.keyspace = USER_KEYS.to_string();
        let (mut ceiling, mut crate_ops) = (vec![], vec![]);
        for _ in 0..rounds {
            bench.reset();
            let run = bench.redis_benchmark(64, 16, requests, &reserve, USER_KEY, RESERVE_ARGS);
            ceiling.push(run.ops);
            bench.reset();
            crate_ops.push(runtime.block_on(keyed_ops(&keyed, 64, secs)));
        }
        // Memory per key, on keys the limiter has just written.
        let sample: Vec<u64> = (0..200)
            .map(|key| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(format!("paceline:v1:keyed:{key}"))
                    .query::<Option<u64>>(&mut bench.con)
                    .unwrap()
                    .unwrap_or(0)
            })
            .filter(|&bytes| bytes > 0)
            .collect();
        println!();
        println!(
            "Keyed: one KeyedRateLimiter<u64, Redis> (one connection), 64 tasks reserving on random keys \
         out of {USER_KEYS}, current-thread runtime, vs redis-benchmark -c 64 -P 16 -r {USER_KEYS}; \
         ops/s, median (and range) of {rounds} rounds:"
        );
        println!();
        println!("| redis-benchmark ops/s | crate ops/s | ratio |");
        println!("|---:|---:|---:|");
        println!(
            "| {} | {} | {:.2} |",
            spread(&ceiling, 0),
            spread(&crate_ops, 0),
            ratio(&crate_ops, &ceiling)
        );
        println!();
        println!(
            "MEMORY USAGE per key: {:.1} bytes (mean of {} keys)",
            sample.iter().sum::<u64>() as f64 / sample.len().max(1) as f64,
            sample.len()
        );
        drop(keyed);
    }

    hot_key::run(&mut bench, runtime, rounds, secs, requests, &reserve);
}

/// Calls per second of `reserve(key, 1)` on random keys out of `USER_KEYS`
/// from `tasks` tasks sharing `limiter`.
async fn keyed_ops(limiter: &Arc<KeyedRateLimiter<u64, Redis>>, tasks: u64, secs: f64) -> f64 {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (limiter, count, stop) = (Arc::clone(limiter), count.clone(), stop.clone());
            tokio::spawn(async move {
                // A small xorshift per task: random keys, as -r draws them.
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (task + 1);
                while !stop.load(Ordering::Relaxed) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    limiter
                        .reserve(&(state % USER_KEYS), 1)
                        .await
                        .expect("reserve");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await; // warm-up
    let (start, started) = (count.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let done = count.load(Ordering::Relaxed) - start;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("task");
    }
    done as f64 / elapsed
}
