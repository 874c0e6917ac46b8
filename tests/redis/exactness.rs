//! The achieved rate of a saturated limiter through the Lua script (`lua/`) is
//! exact at every rate, and every reply is the core's, bit for bit.
//!
//! Each run is [`N`] reservations on one key, each made at the moment the
//! previous one's wait ends (ARGV[7], the clock, is the moment the previous
//! reply gave), from the missing-key reading at [`T0`]. The core
//! (`paceline::core::State`, from that reading) predicts every call, so
//! the calls are written in pipelined batches and each reply is compared
//! with the core's state after the same reservation: its wait and every
//! field of the value it wrote, the ticket's fraction included.
//!
//! The key starts as a value holding exactly what a missing key reads as
//! (full, ticket at `T0`, no fraction), but with its recorded TTL end
//! (`expires_micros`) far ahead and no TTL: so no write sets one. (A TTL
//! the script sets is a few milliseconds of the explicit clock, which
//! hardly moves, but runs on the real clock; `tests/redis/differential.rs`
//! checks that bookkeeping.)
//!
//! Then the schedule: the key's final ticket (`next_free_micros` plus its
//! fraction, exact in units of 2^-20 µs) minus the first reservation's
//! moment must be, within 0.01%, the time the permits reserved cost at the
//! stable rate, less what the stored permits of the start covered:
//!
//! * bursty, no burst: nothing stored, `N × permits / rate`;
//! * bursty, the default 1 s burst: a missing key reads as full, so the
//!   first `max_permits = rate × 1 s` permits are free, all at the first
//!   moment (the ticket never falls behind the clock, so no idle time is
//!   ever stored again): `max(N × permits − max_permits, 0) / rate`. Where
//!   that is 0 (the whole run fits in the burst), the ticket must not have
//!   moved at all;
//! * warming-up, from cold (a missing key is full, i.e. cold): spending all
//!   `max_permits` stored permits costs the warm-up period above the
//!   threshold and half of it below, so `(N × permits − max_permits) / rate
//!   + 1.5 × warmup`.
//!
//! A last test changes the rate midway (another ARGV[3]): from the first
//! reservation at the new rate on, the schedule is the new rate's.
//!
//! The local limiters' counterpart is `tests/local/exactness.rs`.
//! `PACELINE_EXACT_N=<n>` changes the number of reservations per run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::limiter_state::{LimiterState, Value as Stored, script};
use crate::support::redis_server::RedisServer;
use paceline::core::{Bursty, Policy, State, WarmingUp};

/// Reservations per run, unless `PACELINE_EXACT_N` says otherwise.
const N: usize = 100_000;
/// Calls per pipelined batch.
const BATCH: usize = 2_000;
/// The largest relative error allowed: 0.01%.
const TOLERANCE: f64 = 1e-4;
/// A realistic start: microseconds since the epoch, late 2023.
const T0: u64 = 1_700_000_000_000_000;
/// The warming-up policy's cold factor.
const COLD_FACTOR: f64 = 3.0;
/// The TTL end recorded in the starting value: far beyond any need, so
/// that every write keeps the TTL it finds (none).
const FAR_EXPIRY: f64 = 4e15;

/// Rates for one permit per reservation.
const SINGLE_PERMIT_RATES: [f64; 5] = [3e4, 1.5e5, 3e5, 1.5e6, 1e7];
/// Rates for chunks of 64 and 1 500 permits.
const CHUNK_RATES: [f64; 5] = [1e4, 1e6, 1e7, 1e8, 1e9];

fn n() -> usize {
    std::env::var("PACELINE_EXACT_N")
        .map(|n| n.parse().expect("PACELINE_EXACT_N: a number"))
        .unwrap_or(N)
}

/// The rows: (rate, permits per reservation).
fn rows() -> Vec<(f64, u32)> {
    let single = SINGLE_PERMIT_RATES.iter().map(|&rate| (rate, 1));
    let chunks = CHUNK_RATES
        .iter()
        .flat_map(|&rate| [(rate, 64), (rate, 1_500)]);
    single.chain(chunks).collect()
}

/// A limiter's configuration, as the script takes it (ARGV[4..=6]).
#[derive(Debug, Clone, Copy)]
enum Config {
    /// Bursty, with this much burst.
    Bursty { max_burst_micros: u64 },
    /// Warming-up, with this warm-up period, cold factor [`COLD_FACTOR`].
    WarmingUp { warmup_micros: u64 },
}

impl Config {
    const NO_BURST: Config = Config::Bursty {
        max_burst_micros: 0,
    };
    /// The default burst: one second.
    const DEFAULT_BURST: Config = Config::Bursty {
        max_burst_micros: 1_000_000,
    };

    /// Warming-up over 1 000 reservations' worth, so that the ramp from
    /// cold is a small part of the run.
    fn warming_up(rate: f64, permits: u32) -> Config {
        Config::WarmingUp {
            warmup_micros: (1_000.0 * f64::from(permits) / rate * 1e6).round() as u64,
        }
    }

    fn policy(&self) -> Policy {
        match *self {
            Config::Bursty { max_burst_micros } => {
                Policy::Bursty(Bursty::new(Duration::from_micros(max_burst_micros)))
            }
            Config::WarmingUp { warmup_micros } => Policy::WarmingUp(WarmingUp::new(
                Duration::from_micros(warmup_micros),
                COLD_FACTOR,
            )),
        }
    }

    /// ARGV[4..=6].
    fn argv(&self) -> [String; 3] {
        match *self {
            Config::Bursty { max_burst_micros } => {
                ["bursty".into(), max_burst_micros.to_string(), "0".into()]
            }
            Config::WarmingUp { warmup_micros } => [
                "warming_up".into(),
                warmup_micros.to_string(),
                format!("{COLD_FACTOR:?}"),
            ],
        }
    }

    /// What the stored permits of the start cost, in µs, when a saturated
    /// run spends all of them: nothing (bursty), or from cold down to none
    /// (warming-up): the warm-up period above the threshold, and half of it
    /// below.
    fn cold_start_micros(&self) -> f64 {
        match *self {
            Config::Bursty { .. } => 0.0,
            Config::WarmingUp { warmup_micros } => 1.5 * warmup_micros as f64,
        }
    }
}

/// One call of a run, as the core predicts it.
struct Call {
    /// The clock (ARGV[7]): the previous call's moment.
    now: u64,
    rate: f64,
    /// When the reservation's permits may be used.
    moment: u64,
    /// The core's state after it.
    after: State,
}

/// The missing-key reading: idle for a long time, i.e. full (or cold).
fn missing_key(config: Config, rate: f64) -> State {
    State::full(config.policy(), rate, T0).expect("valid rate")
}

/// The core's side of a run: `n` reservations of `permits`, the first
/// `switch_at` of them at `rate` and the rest at `new_rate`, each at the
/// moment of the one before, from the missing-key reading at [`T0`].
/// Returns the calls and the core's final state.
fn predict(
    config: Config,
    permits: u32,
    (rate, new_rate, switch_at): (f64, f64, usize),
    n: usize,
) -> (Vec<Call>, State) {
    let mut core = missing_key(config, rate);
    let mut now = T0;
    let mut calls = Vec::with_capacity(n);
    for i in 0..n {
        let rate = if i < switch_at { rate } else { new_rate };
        if core.permits_per_second() != rate {
            // The script's rate change, at the call that brings it.
            core.set_rate(rate, now).expect("valid rate");
        }
        let moment = core.reserve_earliest_available(permits, now);
        calls.push(Call {
            now,
            rate,
            moment,
            after: core.clone(),
        });
        now = moment;
    }
    (calls, core)
}

/// Compares one field bit for bit.
fn same(name: &str, script: f64, core: f64) -> Result<(), String> {
    if script.to_bits() == core.to_bits() {
        Ok(())
    } else {
        Err(format!("{name}: script {script:e}, core {core:e}"))
    }
}

/// The reply to `call` (the value the script wrote) against the core's
/// state after it: the wait, and every field.
fn check_reply(call: &Call, value: &[u8]) -> Result<(), String> {
    let stored = Stored::decode(value)?;
    let state = LimiterState::decode(value)?;
    let core = &call.after;
    same(
        "wait",
        stored.moment_micros - stored.last_now_micros,
        (call.moment - call.now) as f64,
    )?;
    same(
        "stored_permits",
        state.stored_permits,
        core.stored_permits(),
    )?;
    same(
        "next_free_micros",
        state.next_free_micros,
        core.next_free_micros() as f64,
    )?;
    if state.next_free_fraction != core.next_free_fraction() {
        return Err(format!(
            "next_free_fraction: script {}, core {}",
            state.next_free_fraction,
            core.next_free_fraction()
        ));
    }
    same("last_now_micros", state.last_now_micros, call.now as f64)?;
    // Written whole (at a rate change): the rest of the value too.
    if value.starts_with(b"plv1") {
        same("permits_per_second", state.permits_per_second, call.rate)?;
        same("max_permits", state.max_permits, core.max_permits())?;
        same("expires_micros", state.expires_micros, FAR_EXPIRY)?;
    }
    Ok(())
}

/// A RESP bulk string.
fn bulk(out: &mut Vec<u8>, arg: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// A plain connection speaking RESP itself: a run's calls differ only in
/// ARGV[7] (and ARGV[3] after a rate change), so they are written from a
/// template, and the replies (what each call wrote) read into one buffer,
/// without the allocations of a general client.
struct Pipe {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Pipe {
    fn connect(port: u16) -> Pipe {
        let writer = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        writer.set_nodelay(true).expect("TCP_NODELAY");
        let reader = BufReader::with_capacity(1 << 20, writer.try_clone().expect("clone"));
        Pipe { writer, reader }
    }

    /// Runs `calls` through the script (by its hash) on `key`, a batch at
    /// a time, and checks every reply against the core. Each batch is sent
    /// before the replies to the one before are checked, so the server
    /// never waits for the checks.
    fn run(&mut self, hash: &str, key: &str, config: Config, permits: u32, calls: &[Call]) {
        let mut head = b"*11\r\n".to_vec();
        for arg in ["EVALSHA", hash, "1", key, &permits.to_string(), "-1"] {
            bulk(&mut head, arg.as_bytes());
        }
        let mut tail = vec![];
        for arg in config.argv() {
            bulk(&mut tail, arg.as_bytes());
        }
        let mut rate = (f64::NAN, vec![]);
        let mut out = Vec::with_capacity(BATCH * 200);
        let mut send = |batch: &[Call], writer: &mut TcpStream| {
            out.clear();
            for call in batch {
                if call.rate.to_bits() != rate.0.to_bits() {
                    // Rust's shortest round-trip form, which Lua reads exactly.
                    rate.1.clear();
                    bulk(&mut rate.1, format!("{:?}", call.rate).as_bytes());
                    rate.0 = call.rate;
                }
                out.extend_from_slice(&head);
                out.extend_from_slice(&rate.1);
                out.extend_from_slice(&tail);
                bulk(&mut out, call.now.to_string().as_bytes());
            }
            writer.write_all(&out).expect("write");
        };
        let batches: Vec<&[Call]> = calls.chunks(BATCH).collect();
        send(batches[0], &mut self.writer);
        let mut value = [0u8; 128];
        let mut line = Vec::with_capacity(16);
        for (b, batch) in batches.iter().enumerate() {
            if let Some(next) = batches.get(b + 1) {
                send(next, &mut self.writer);
            }
            for (i, call) in batch.iter().enumerate() {
                let index = b * BATCH + i;
                // "$<length>\r\n", what the call wrote, "\r\n".
                line.clear();
                self.reader.read_until(b'\n', &mut line).expect("read");
                let len = std::str::from_utf8(&line)
                    .ok()
                    .and_then(|line| line.strip_prefix('$')?.trim_end().parse::<usize>().ok())
                    .filter(|len| *len + 2 <= value.len())
                    .unwrap_or_else(|| {
                        let line = String::from_utf8_lossy(&line);
                        panic!("{key}: reservation {index}: unexpected reply {line:?}")
                    });
                self.reader.read_exact(&mut value[..len + 2]).expect("read");
                if let Err(what) = check_reply(call, &value[..len]) {
                    panic!(
                        "{key}: reservation {index} (now {}, rate {}): the script and the \
                         core disagree: {what}",
                        call.now, call.rate
                    );
                }
            }
        }
    }
}

/// One server with the script loaded, and a plain connection to it.
struct Fixture {
    /// Kept running for the test.
    _server: RedisServer,
    con: redis::Connection,
    pipe: Pipe,
    hash: String,
}

fn fixture() -> Fixture {
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = script();
    script.load(&mut con).expect("SCRIPT LOAD");
    let pipe = Pipe::connect(server.port());
    Fixture {
        hash: script.get_hash().to_owned(),
        _server: server,
        con,
        pipe,
    }
}

impl Fixture {
    /// Runs one saturated sequence on a fresh key and checks every reply
    /// and the final state against the core; returns the key's final state
    /// and the calls.
    fn run(
        &mut self,
        config: Config,
        permits: u32,
        rates: (f64, f64, usize),
        n: usize,
    ) -> (LimiterState, Vec<Call>) {
        let key = format!("exact:{:e}:{}:{permits}:{config:?}", rates.0, rates.1);
        // The missing-key reading, with a TTL end far ahead and no TTL.
        let start = missing_key(config, rates.0);
        let value = LimiterState {
            stored_permits: start.stored_permits(),
            next_free_micros: T0 as f64,
            permits_per_second: rates.0,
            max_permits: start.max_permits(),
            expires_micros: FAR_EXPIRY,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        };
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value.encode())
            .query(&mut self.con)
            .expect("SET");

        let (calls, core) = predict(config, permits, rates, n);
        self.pipe.run(&self.hash, &key, config, permits, &calls);

        let state = LimiterState::read(&mut self.con, &key).expect("the key");
        let last = calls.last().expect("calls");
        let fields = [
            (
                "stored_permits",
                state.stored_permits,
                core.stored_permits(),
            ),
            (
                "next_free_micros",
                state.next_free_micros,
                core.next_free_micros() as f64,
            ),
            (
                "permits_per_second",
                state.permits_per_second,
                core.permits_per_second(),
            ),
            ("max_permits", state.max_permits, core.max_permits()),
            ("last_now_micros", state.last_now_micros, last.now as f64),
        ];
        for (name, script, core) in fields {
            if let Err(what) = same(name, script, core) {
                panic!("{key}: final state: {what}");
            }
        }
        assert_eq!(
            state.next_free_fraction,
            core.next_free_fraction(),
            "{key}: final next_free_fraction"
        );
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut self.con).unwrap();
        assert_eq!(ttl, -1, "{key}: a write set a TTL");
        (state, calls)
    }
}

/// µs from `moment` (whole µs) to the exact ticket of `state`.
fn ticket_since(state: &LimiterState, moment: u64) -> f64 {
    let units = state.ticket_units() - (u128::from(moment) << 20);
    units as f64 / f64::from(1u32 << 20)
}

/// Checks that `elapsed` µs is `expected` µs within [`TOLERANCE`] (exactly,
/// if `expected` is 0); returns the relative error.
fn check_schedule(what: &str, elapsed: f64, expected: f64) -> f64 {
    if expected == 0.0 {
        assert_eq!(elapsed, 0.0, "{what}: the ticket moved");
        return 0.0;
    }
    let error = (elapsed - expected) / expected;
    assert!(
        error.abs() <= TOLERANCE,
        "{what}: the ticket moved {elapsed:.3} µs from the first moment, expected \
         {expected:.3} µs ({:+.5}%)",
        error * 100.0
    );
    error
}

/// Every row under the configuration `config_of` gives it.
fn every_row(name: &str, config_of: impl Fn(f64, u32) -> Config) {
    let started = Instant::now();
    let n = n();
    let mut fx = fixture();
    let mut worst: f64 = 0.0;
    for (rate, permits) in rows() {
        let config = config_of(rate, permits);
        let (state, calls) = fx.run(config, permits, (rate, rate, n), n);
        let first = &calls[0];
        let reserved = n as f64 * f64::from(permits);
        let expected = (reserved - first.after.max_permits()).max(0.0) / rate * 1e6
            + config.cold_start_micros();
        let what = format!("{name}, {permits} permits at {rate}/s");
        let error = check_schedule(&what, ticket_since(&state, first.moment), expected);
        worst = worst.max(error.abs());
    }
    println!(
        "{name} through the script: {} runs of {n} reservations, every reply the core's bit \
         for bit, schedules within {:.5}% of the rate; {:.1?}",
        rows().len(),
        worst * 100.0,
        started.elapsed()
    );
}

#[test]
fn a_saturated_bursty_limiter_with_no_burst_achieves_its_rate_through_the_script() {
    every_row("bursty, no burst", |_, _| Config::NO_BURST);
}

#[test]
fn a_saturated_bursty_limiter_after_its_burst_achieves_its_rate_through_the_script() {
    every_row("bursty, 1 s of burst", |_, _| Config::DEFAULT_BURST);
}

#[test]
fn a_saturated_warming_up_limiter_achieves_its_rate_through_the_script() {
    every_row("warming-up", Config::warming_up);
}

#[test]
fn the_rate_through_the_script_is_exact_after_a_rate_change() {
    let n = n();
    let mut fx = fixture();
    // Half the run at the rate, half at two thirds of it: the first
    // reservation at the new rate still waits for the last one's charge at
    // the old rate, and from its moment on the new rate holds. (By then
    // all stored permits are spent: the rest is fresh.)
    for (rate, permits, config) in [
        (1.5e6, 1, Config::NO_BURST),
        (1e8, 64, Config::warming_up(1e8, 64)),
    ] {
        let new_rate = rate * 2.0 / 3.0;
        let (state, calls) = fx.run(config, permits, (rate, new_rate, n / 2), n);
        assert_eq!(state.permits_per_second, new_rate);
        let first = calls[n / 2].moment;
        let expected = (n - n / 2) as f64 * f64::from(permits) / new_rate * 1e6;
        let what = format!("{config:?}, {permits} permits at {rate}/s, then {new_rate}/s");
        check_schedule(&what, ticket_since(&state, first), expected);
    }
}
