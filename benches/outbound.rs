//! Outbound pacing, side by side in one run: a fleet of processes calling
//! someone else's rate-limited API, paced the ways users pace it without
//! this crate's learning and by the learned limiter, against an upstream
//! that counts what it admitted.
//!
//! ```text
//! cargo bench -p paceline-benches --features outbound --bench outbound
//! PACELINE_BENCH_SECS=12 PACELINE_BENCH_PROCS=2 PACELINE_BENCH_TASKS=8 \
//!     cargo bench -p paceline-benches --features outbound --bench outbound    # shorter
//! ```
//!
//! The upstream is `examples/upstream` in this process: 50 requests/s and
//! 3 000 tokens/s (each a bucket holding one second's worth), a call
//! costing 20 to 120 tokens that the client learns only from the answer's
//! `X-Usage-Tokens` (about 70 on average, so the tokens limit binds first,
//! near 43 calls/s), answered after 50 ms; past a limit, `429` with
//! `Retry-After` in whole seconds and the RateLimit headers. Redis is a
//! private `redis-server` this benchmark starts on a free loopback port.
//!
//! For each strategy in turn, with a fresh upstream (its buckets full, its
//! records empty) and a fresh Redis key: P worker processes (this binary
//! again, with `PACELINE_OUTBOUND_WORKER=<strategy>` and the rest of its
//! settings in `PACELINE_OUTBOUND_*`), each with T tasks, start together at
//! an instant the parent chooses and run for D seconds. Each task makes one
//! logical call after another (`POST /v1/complete`, retried on a 429 as the
//! strategy says, every attempt within 10 s) until the deadline; each
//! worker reports every logical call (start, end, attempts, outcome,
//! tokens) in microseconds since the common start.
//!
//! * `none`: no limiter; on a 429, sleep `Retry-After` and try again.
//! * `fixed-local`: a `RateLimiter` in each process at 100 requests/s
//!   (`Limit::per_second(100.0)`: twice the true requests limit, a second's
//!   burst), as a user who does not know the limit guesses it: P × 100/s
//!   for the fleet. On a 429, sleep `Retry-After` and try again.
//! * `fixed-redis`: one `RateLimiter` for the fleet through Redis
//!   (`.redis(&backend, key)`) at the same 100 requests/s; same retries.
//! * `learned`: one `RateLimiter` for the fleet through Redis at twice
//!   both limits, each call reserved at 70 tokens (`RateLimiter::call`),
//!   its answer fed back (the 429s and the headers teach the rate) and its
//!   tokens settled from `X-Usage-Tokens` (`learned_worker` in
//!   `outbound/worker.rs`).
//!
//! A strategy is an `async fn` in `outbound/worker.rs` and its line in
//! `STRATEGIES` there.
//!
//! The table, one row per strategy, after a warm-up of 5 s (the first 5 s
//! are left out; none if D is 5 s or less):
//!
//! * `req used`, `tok used`: requests the upstream admitted, tokens it
//!   charged, over its rate × the span (its own records; 1.00 is the whole
//!   limit, and a full bucket at the start lets the first second go above);
//! * `429s`: refusals over all attempts the upstream saw (its records);
//! * `ok/s`: logical calls that succeeded per second (the workers');
//! * `p50`, `p99`: a successful logical call's latency, from the moment its
//!   task began it (before any limiter's wait) to its 200, waits and
//!   retries included, for calls begun after the warm-up;
//! * `limits held`: whether the requests admitted and tokens charged in
//!   every window of 0.1, 1 and 10 s stayed within what the upstream's
//!   buckets allow (`max_in_any_window` against `allowance`, whole run);
//!   `token debt`: how far below zero the tokens bucket went (tokens are
//!   charged after the call, so a herd admitted together overdraws it).
//!
//! Knobs: `PACELINE_BENCH_PROCS` (default 4), `PACELINE_BENCH_TASKS`
//! (16), `PACELINE_BENCH_SECS` (30), `PACELINE_BENCH_STRATEGIES` (a
//! comma-separated subset, in the order given), `PACELINE_BENCH_SVG` (where
//! the picture goes; default `outbound.svg` in the target directory). A run
//! takes about strategies × (D + 3) seconds, whatever P.
//!
//! The picture (from the upstream's 100 ms buckets): a panel per
//! strategy, time across (the warm-up shaded), the requests admitted
//! (blue, left axis), the tokens charged (orange, right axis, scaled so
//! that both limits fall on one dashed line) and the 429s (red area),
//! each per second over the last second; under it a strip of every
//! 100 ms bucket's calls, admitted (blue) and refused (red), on a log
//! scale. A herd shows in the strip as bursts a `Retry-After` apart with
//! nothing between, and in the plot as a red area that never leaves; a
//! limiter that learns, as an even comb of blue in the strip and blue and
//! orange lines that climb to the dashed one and stay near it with little
//! red.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use paceline_upstream::{Config, Limits, Stats, Upstream};

#[path = "outbound/record.rs"]
mod record;
#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "outbound/svg.rs"]
mod svg;
#[path = "outbound/worker.rs"]
mod worker;

use record::{Outcome, Record};
use redis_server::RedisServer;
use worker::{STRATEGIES, Settings, epoch_us};

/// The upstream's limits.
const RPS: f64 = 50.0;
const TPS: f64 = 3000.0;
/// Left out of the table at the start of each run.
const WARMUP_SECS: f64 = 5.0;
/// From spawning the workers to the common start: time for them to start
/// and reach Redis.
const STARTUP: Duration = Duration::from_secs(2);
/// How long after the deadline the workers may take to finish and report
/// before they are killed.
const DRAIN: Duration = Duration::from_secs(20);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the run is asked to do.
struct Knobs {
    procs: usize,
    tasks: usize,
    secs: f64,
    warmup: f64,
}

fn main() -> ExitCode {
    if let Ok(strategy) = std::env::var(worker::WORKER_ENV) {
        return worker::main(strategy);
    }
    let secs = env_or("PACELINE_BENCH_SECS", 30.0_f64);
    let knobs = Knobs {
        procs: env_or("PACELINE_BENCH_PROCS", 4_usize).max(1),
        tasks: env_or("PACELINE_BENCH_TASKS", 16_usize).max(1),
        secs: if secs.is_finite() && secs > 0.0 {
            secs
        } else {
            30.0
        },
        warmup: if secs > WARMUP_SECS { WARMUP_SECS } else { 0.0 },
    };
    let strategies: Vec<(&str, &str)> = match std::env::var("PACELINE_BENCH_STRATEGIES") {
        Err(_) => STRATEGIES.iter().map(|s| (s.name, s.what)).collect(),
        Ok(list) => {
            let mut chosen = Vec::new();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match STRATEGIES.iter().find(|known| known.name == name) {
                    Some(strategy) => chosen.push((strategy.name, strategy.what)),
                    None => {
                        let known: Vec<&str> = STRATEGIES.iter().map(|s| s.name).collect();
                        eprintln!("no strategy {name:?}; the strategies: {}", known.join(", "));
                        return ExitCode::FAILURE;
                    }
                }
            }
            chosen
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("cannot find this benchmark's binary to run the workers: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "outbound: an upstream at {RPS} requests/s and {TPS} tokens/s; {} processes x {} tasks, \
         {} s per strategy, the first {} s left out",
        knobs.procs, knobs.tasks, knobs.secs, knobs.warmup
    );
    let redis = RedisServer::start();
    let mut measured = Vec::new();
    for (name, what) in strategies {
        println!("  {name}: {what} ...");
        match measure(name, &knobs, &redis.url(), &exe) {
            Ok(run) => measured.push((name, what, run)),
            Err(why) => eprintln!("  {name}: {why}"),
        }
    }
    drop(redis);
    println!();
    table(&measured, &knobs);
    let chart = svg::Chart {
        title: format!(
            "paceline outbound: {} processes x {} tasks, one upstream",
            knobs.procs, knobs.tasks
        ),
        secs: knobs.secs,
        warmup: knobs.warmup,
        bucket: measured
            .first()
            .map_or(0.1, |(_, _, run)| run.stats.bucket.as_secs_f64()),
        requests_limit: RPS,
        tokens_limit: TPS,
        panels: measured
            .iter()
            .map(|(name, what, run)| panel(name, what, run, &knobs))
            .collect(),
    };
    let path = svg_path();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&path, chart.render()) {
        Ok(()) => println!("\nthe picture: {}", path.display()),
        Err(error) => {
            eprintln!("cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if measured.is_empty() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `PACELINE_BENCH_SVG`, else `outbound.svg` in the target directory
/// (`CARGO_TARGET_DIR`, else the one this binary was built in).
fn svg_path() -> PathBuf {
    if let Some(path) = std::env::var_os("PACELINE_BENCH_SVG") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            // target/release/deps/outbound-HASH
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("outbound.svg")
}

/// What one strategy's run left: the upstream's records, the workers'.
struct Run {
    /// The common start on the upstream's clock, in seconds.
    offset: f64,
    stats: Stats,
    records: Vec<Record>,
    failed_workers: usize,
}

/// The workers of one run, killed if still running when dropped.
#[derive(Default)]
struct Fleet {
    workers: Vec<(Child, Option<JoinHandle<String>>)>,
}

impl Fleet {
    /// Waits for every worker until `until`, kills those still running;
    /// returns each one's exit status (`None` if killed) and stdout.
    fn wait(&mut self, until: Instant) -> Vec<(Option<ExitStatus>, String)> {
        let mut done = Vec::new();
        for (child, reader) in &mut self.workers {
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                }
            };
            let out = reader
                .take()
                .and_then(|r| r.join().ok())
                .unwrap_or_default();
            done.push((status, out));
        }
        done
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (child, _) in &mut self.workers {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs one strategy: a fresh upstream, P workers for D seconds.
fn measure(strategy: &str, knobs: &Knobs, redis: &str, exe: &PathBuf) -> Result<Run, String> {
    let config = Config {
        limits: Limits {
            requests_per_second: Some(RPS),
            tokens_per_second: Some(TPS),
            ..Limits::default()
        },
        ..Config::default()
    };
    // The upstream's clock starts within Upstream::start.
    let zero_us = epoch_us();
    let upstream =
        Upstream::start(config).map_err(|e| format!("cannot start the upstream: {e}"))?;
    let start_us = epoch_us() + STARTUP.as_micros() as u64;
    let mut fleet = Fleet::default();
    for index in 0..knobs.procs {
        let settings = Settings {
            strategy: strategy.to_owned(),
            upstream: upstream.url(),
            redis: redis.to_owned(),
            key: format!("outbound-{strategy}-{}-{start_us}", std::process::id()),
            start_us,
            secs: knobs.secs,
            tasks: knobs.tasks,
            index,
            procs: knobs.procs,
        };
        let mut command = Command::new(exe);
        settings.apply(&mut command);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start worker #{index}: {e}"))?;
        let mut stdout = child.stdout.take().expect("a piped stdout");
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            out
        });
        fleet.workers.push((child, Some(reader)));
    }
    let run = STARTUP + Duration::from_secs_f64(knobs.secs);
    let done = fleet.wait(Instant::now() + run + DRAIN);
    let stats = upstream.stats();
    drop(upstream);
    let mut records = Vec::new();
    let mut failed_workers = 0;
    for (index, (status, out)) in done.into_iter().enumerate() {
        match status {
            Some(status) if status.success() => {}
            Some(status) => {
                eprintln!("    worker #{index} of {strategy} failed ({status}); see above");
                failed_workers += 1;
            }
            None => {
                eprintln!("    worker #{index} of {strategy} ran past its deadline and was killed");
                failed_workers += 1;
            }
        }
        let mut unreadable = 0;
        for line in out.lines() {
            match Record::parse(line) {
                Some(record) => records.push(record),
                None => unreadable += 1,
            }
        }
        if unreadable > 0 {
            eprintln!("    worker #{index} of {strategy}: {unreadable} unreadable lines");
        }
    }
    Ok(Run {
        offset: start_us.saturating_sub(zero_us) as f64 / 1e6,
        stats,
        records,
        failed_workers,
    })
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// One row's figures.
struct Figures {
    requests_used: f64,
    tokens_used: f64,
    refused_share: f64,
    ok_per_sec: f64,
    p50: Option<f64>,
    p99: Option<f64>,
    /// The first window whose counts went past the allowance, if any.
    over: Option<String>,
    token_debt: u64,
    /// Attempts the workers made and the upstream saw (admitted and
    /// refused), over the whole run.
    attempts: (u64, u64),
}

fn figures(run: &Run, knobs: &Knobs) -> Figures {
    let from = Duration::from_secs_f64(run.offset + knobs.warmup);
    let to = Duration::from_secs_f64(run.offset + knobs.secs);
    let used = run.stats.fraction_used(from, to);
    let (mut admitted, mut refused) = (0, 0);
    for bucket in &run.stats.buckets {
        if (from..to).contains(&bucket.start) {
            admitted += bucket.admitted;
            refused += bucket.refused;
        }
    }
    let warmup_us = (knobs.warmup * 1e6) as i64;
    let end_us = (knobs.secs * 1e6) as i64;
    let ok = |r: &&Record| r.outcome == Outcome::Ok;
    let mut latencies: Vec<f64> = run
        .records
        .iter()
        .filter(ok)
        .filter(|r| r.start_us >= warmup_us)
        .map(|r| (r.end_us - r.start_us) as f64 / 1e6)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let ok_calls = run
        .records
        .iter()
        .filter(ok)
        .filter(|r| (warmup_us..end_us).contains(&r.end_us))
        .count();
    let mut over = None;
    for window in [0.1, 1.0, 10.0] {
        let span = Duration::from_secs_f64(window);
        let (most, allowed) = (run.stats.max_in_any_window(span), run.stats.allowance(span));
        for (what, most, allowed) in [
            ("requests", most.requests, allowed.requests),
            ("tokens", most.tokens, allowed.tokens),
        ] {
            if over.is_none() && allowed.is_some_and(|allowed| most > allowed) {
                over = Some(format!(
                    "{what} {most} > {} in {window} s",
                    allowed.unwrap_or(0)
                ));
            }
        }
    }
    let totals = run.stats.totals;
    Figures {
        requests_used: used.requests.unwrap_or(0.0),
        tokens_used: used.tokens.unwrap_or(0.0),
        refused_share: refused as f64 / ((admitted + refused) as f64).max(1.0),
        ok_per_sec: ok_calls as f64 / (knobs.secs - knobs.warmup).max(1e-9),
        p50: quantile(&latencies, 0.50),
        p99: quantile(&latencies, 0.99),
        over,
        token_debt: totals.max_token_debt,
        attempts: (
            run.records.iter().map(|r| u64::from(r.attempts)).sum(),
            totals.admitted + totals.refused,
        ),
    }
}

/// A latency as the table and the picture print it.
fn latency(value: Option<f64>) -> String {
    match value {
        Some(secs) if secs < 1.0 => format!("{:.0} ms", secs * 1e3),
        Some(secs) => format!("{secs:.2} s"),
        None => "-".to_owned(),
    }
}

fn table(measured: &[(&str, &str, Run)], knobs: &Knobs) {
    println!(
        "after the first {} s of {} s; used: of the upstream's limit ({RPS} req/s, {TPS} tok/s)",
        knobs.warmup, knobs.secs
    );
    println!(
        "{:<12} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9}  {:<12} {:>10}",
        "strategy",
        "req used",
        "tok used",
        "429s",
        "ok/s",
        "p50",
        "p99",
        "limits held",
        "token debt"
    );
    let mut checks = Vec::new();
    for (name, _, run) in measured {
        let f = figures(run, knobs);
        println!(
            "{:<12} {:>8.2} {:>8.2} {:>6.1}% {:>7.1} {:>9} {:>9}  {:<12} {:>10}",
            name,
            f.requests_used,
            f.tokens_used,
            f.refused_share * 100.0,
            f.ok_per_sec,
            latency(f.p50),
            latency(f.p99),
            if f.over.is_some() { "NO" } else { "yes" },
            f.token_debt
        );
        if let Some(over) = &f.over {
            checks.push(format!("{name}: past the upstream's limits: {over}"));
        }
        let (sent, seen) = f.attempts;
        if sent.abs_diff(seen) > 2 + seen / 100 {
            checks.push(format!(
                "{name}: the workers made {sent} attempts, the upstream saw {seen}"
            ));
        }
        if run.failed_workers > 0 {
            checks.push(format!("{name}: {} worker(s) failed", run.failed_workers));
        }
    }
    for check in checks {
        println!("  ! {check}");
    }
}

/// A strategy's panel: the upstream's buckets on the common clock, each
/// with the second before it.
fn panel(name: &str, what: &str, run: &Run, knobs: &Knobs) -> svg::Panel {
    let buckets = &run.stats.buckets;
    let bucket = run.stats.bucket.as_secs_f64();
    let per_second = (1.0 / bucket).round().max(1.0) as usize;
    let mut points = Vec::new();
    for (i, b) in buckets.iter().enumerate() {
        let end = b.start.as_secs_f64() + bucket - run.offset;
        // Every bucket with a part after the start (the first holds the
        // start's burst) and before the deadline.
        if end <= 0.0 || end > knobs.secs + bucket + 1e-9 {
            continue;
        }
        let second = &buckets[(i + 1).saturating_sub(per_second)..=i];
        let sum = |f: fn(&paceline_upstream::Bucket) -> u64| {
            second.iter().map(f).sum::<u64>() as f64 / (per_second as f64 * bucket)
        };
        points.push(svg::Point {
            end,
            admitted_here: b.admitted,
            refused_here: b.refused,
            requests: sum(|b| b.admitted),
            tokens: sum(|b| b.tokens),
            refused: sum(|b| b.refused),
        });
    }
    let f = figures(run, knobs);
    svg::Panel {
        name: name.to_owned(),
        what: what.to_owned(),
        summary: format!(
            "after {} s: requests {:.2} and tokens {:.2} of the limit, {:.1}% 429s, p50 {}, \
             p99 {}{}",
            knobs.warmup,
            f.requests_used,
            f.tokens_used,
            f.refused_share * 100.0,
            latency(f.p50),
            latency(f.p99),
            if f.over.is_some() {
                ", LIMITS BROKEN"
            } else {
                ""
            }
        ),
        points,
    }
}
