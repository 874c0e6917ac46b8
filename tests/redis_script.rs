#![cfg(feature = "redis")]
//! `lua/reserve.lua` against a real Redis server: the interface (arguments,
//! replies, errors), what it writes and what it must not write, the clock,
//! number precision, corrupted keys and expiry. Expected waits are derived by
//! hand from the rules in `throttler::core`.

mod support;

use support::limiter_state::{LimiterState, STATE_LEN};
use support::redis_server::RedisServer;

/// A realistic "now": microseconds since the epoch, late 2023.
const T0: u64 = 1_700_000_000_000_000;
/// 2^53, where time saturates.
const MAX_MICROS: u64 = 1 << 53;
/// The script's TTL cap, in milliseconds: floor(2^53 / 1000).
const TTL_CAP_MS: i64 = 9_007_199_254_740;

fn script() -> redis::Script {
    redis::Script::new(include_str!("../lua/reserve.lua"))
}

/// A server, a connection to it and the script.
struct Fixture {
    _server: RedisServer,
    con: redis::Connection,
    script: redis::Script,
}

fn fixture() -> Fixture {
    let server = RedisServer::start();
    let con = server.connection();
    Fixture {
        _server: server,
        con,
        script: script(),
    }
}

/// The script's ARGV, with defaults: reserve 1 permit, no timeout, server clock.
#[derive(Debug, Clone)]
struct Args {
    permits: String,
    timeout: String,
    rate: String,
    policy: String,
    policy_micros: String,
    cold_factor: String,
    now: Option<String>,
}

impl Args {
    fn bursty(rate: &str, max_burst_micros: u64) -> Args {
        Args {
            permits: "1".into(),
            timeout: "-1".into(),
            rate: rate.into(),
            policy: "bursty".into(),
            policy_micros: max_burst_micros.to_string(),
            cold_factor: "0".into(),
            now: None,
        }
    }

    fn warming_up(rate: &str, warmup_micros: u64, cold_factor: &str) -> Args {
        Args {
            policy: "warming_up".into(),
            policy_micros: warmup_micros.to_string(),
            cold_factor: cold_factor.into(),
            ..Args::bursty(rate, 0)
        }
    }

    fn permits(mut self, permits: impl ToString) -> Args {
        self.permits = permits.to_string();
        self
    }

    fn query(self) -> Args {
        self.permits(0)
    }

    /// A try: refused if the current debt exceeds `timeout_micros`.
    fn timeout(mut self, timeout_micros: impl ToString) -> Args {
        self.timeout = timeout_micros.to_string();
        self
    }

    fn rate(mut self, rate: &str) -> Args {
        self.rate = rate.into();
        self
    }

    fn at(mut self, now_micros: u64) -> Args {
        self.now = Some(now_micros.to_string());
        self
    }

    fn to_vec(&self) -> Vec<String> {
        let mut argv = vec![
            self.permits.clone(),
            self.timeout.clone(),
            self.rate.clone(),
            self.policy.clone(),
            self.policy_micros.clone(),
            self.cold_factor.clone(),
        ];
        argv.extend(self.now.clone());
        argv
    }
}

impl Fixture {
    /// Runs the script on `key` with raw arguments.
    fn eval_raw(&mut self, keys: &[&str], argv: &[String]) -> redis::RedisResult<i64> {
        let mut invocation = self.script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in argv {
            invocation.arg(arg.as_str());
        }
        invocation.invoke(&mut self.con)
    }

    fn eval(&mut self, key: &str, args: &Args) -> redis::RedisResult<i64> {
        self.eval_raw(&[key], &args.to_vec())
    }

    /// Runs the script and expects a reply.
    fn run(&mut self, key: &str, args: &Args) -> i64 {
        self.eval(key, args)
            .unwrap_or_else(|e| panic!("script failed for {args:?}: {e}"))
    }

    /// Runs the script and expects an error; returns its text.
    fn run_err(&mut self, keys: &[&str], argv: &[String]) -> String {
        match self.eval_raw(keys, argv) {
            Ok(reply) => panic!("expected an error for {argv:?}, got reply {reply}"),
            Err(e) => e.to_string(),
        }
    }

    /// The decoded state under `key`; panics if it is missing or not a state.
    fn state(&mut self, key: &str) -> LimiterState {
        LimiterState::read(&mut self.con, key).unwrap_or_else(|| panic!("{key} is missing"))
    }

    /// The value under `key`, as bytes.
    fn raw(&mut self, key: &str) -> Vec<u8> {
        redis::cmd("GET").arg(key).query(&mut self.con).unwrap()
    }

    fn set_bytes(&mut self, key: &str, value: &[u8]) {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query(&mut self.con)
            .unwrap();
    }

    fn pexpire(&mut self, key: &str, ms: i64) {
        let set: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(ms)
            .query(&mut self.con)
            .unwrap();
        assert_eq!(set, 1, "{key} is missing");
    }

    fn dump(&mut self, key: &str) -> Vec<u8> {
        redis::cmd("DUMP").arg(key).query(&mut self.con).unwrap()
    }

    fn pttl(&mut self, key: &str) -> i64 {
        redis::cmd("PTTL").arg(key).query(&mut self.con).unwrap()
    }

    fn exists(&mut self, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.con)
            .unwrap()
            == 1
    }

    fn persist(&mut self, key: &str) {
        let removed: i64 = redis::cmd("PERSIST").arg(key).query(&mut self.con).unwrap();
        assert_eq!(removed, 1, "{key} had no TTL to remove");
    }

    /// The server's clock, in microseconds.
    fn server_time(&mut self) -> u64 {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.con).unwrap();
        seconds * 1_000_000 + micros
    }
}

// ---------------------------------------------------------------------------
// Reservations
// ---------------------------------------------------------------------------

#[test]
fn first_reserve_on_missing_key_is_free_and_writes_the_state() {
    let mut fx = fixture();
    // A missing key is a limiter idle for a long time: 5 stored permits.
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.raw("k").len(), STATE_LEN);
    // Full again after one stable interval (200 ms): the key needs 200 + 2
    // ms, and a TTL the script sets is twice the need (at most 1 s more).
    let ttl = 2 * (200 + 2);
    assert_eq!(
        fx.state("k"),
        LimiterState {
            stored_permits: 4.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: (T0 + ttl as u64 * 1_000) as f64,
        }
    );
    let pttl = fx.pttl("k");
    assert!((ttl - 100..=ttl).contains(&pttl), "PTTL {pttl}");
}

#[test]
fn bursty_sequence_with_explicit_now() {
    let mut fx = fixture();
    let at = |now| Args::bursty("5", 1_000_000).at(now);
    // Five stored permits are free; then each permit pays 200 ms forward.
    let waits: Vec<i64> = (0..8).map(|_| fx.run("k", &at(T0))).collect();
    assert_eq!(waits, [0, 0, 0, 0, 0, 0, 200_000, 400_000]);
    assert_eq!(fx.state("k").next(), T0 + 600_000);

    // 400 ms after the ticket: 2 stored permits, ticket moves to now.
    let now = T0 + 1_000_000;
    assert_eq!(fx.run("k", &at(now).permits(3)), 0); // 2 stored + 1 fresh
    assert_eq!(fx.run("k", &at(now)), 200_000);
    // Debt is now 400 ms.
    assert_eq!(fx.run("k", &at(now).timeout(100_000)), -1);
    assert_eq!(fx.run("k", &at(now).timeout(399_999)), -1);
    assert_eq!(fx.run("k", &at(now).timeout(400_000)), 400_000);
    // Debt 600 ms: a try is judged on the debt only, not on its own size.
    assert_eq!(fx.run("k", &at(now).timeout(599_999).permits(1000)), -1);
    assert_eq!(
        fx.run("k", &at(now).timeout(600_000).permits(1000)),
        600_000
    );
    // 1000 fresh permits at 200 ms each were charged forward.
    assert_eq!(fx.state("k").next(), now + 600_000 + 200_000_000);
    assert_eq!(fx.run("k", &at(now)), 200_600_000);
}

#[test]
fn warming_up_sequence_with_explicit_now() {
    let mut fx = fixture();
    // 2 permits/s, 4 s warm-up, cold factor 3: a missing key is cold (8
    // stored permits), so the limiter starts at 1.375 s and speeds up.
    let mut now = T0;
    let mut waits = vec![];
    for _ in 0..6 {
        let wait = fx.run("w", &Args::warming_up("2", 4_000_000, "3").at(now));
        now += u64::try_from(wait).unwrap();
        waits.push(wait);
    }
    assert_eq!(waits, [0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000]);
    assert_eq!(fx.state("w").max_permits, 8.0);
}

#[test]
fn rate_change_credits_idle_time_at_the_old_rate_and_rescales() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("k", &args.clone().at(T0).permits(5)), 0); // stored 0
    // 100 ms idle at 5/s = 0.5 stored of max 5, i.e. 1.0 of max 10 at 10/s;
    // then 1 stored (free) + 1 fresh (100 ms).
    let now = T0 + 100_000;
    assert_eq!(fx.run("k", &args.clone().rate("10").at(now).permits(2)), 0);
    let state = fx.state("k");
    assert_eq!(state.stored_permits, 0.0);
    assert_eq!(state.next(), now + 100_000);
    assert_eq!(state.permits_per_second, 10.0);
    assert_eq!(state.max_permits, 10.0);
    assert_eq!(fx.run("k", &args.clone().rate("10").at(now)), 100_000);

    // Leaving an infinite rate, a bursty limiter is full (ready to burst).
    assert_eq!(fx.run("inf", &args.clone().rate("inf").at(T0)), 0);
    assert_eq!(fx.state("inf").permits_per_second, f64::INFINITY);
    assert_eq!(fx.state("inf").max_permits, 0.0);
    assert_eq!(fx.run("inf", &args.clone().at(T0)), 0);
    assert_eq!(fx.state("inf").stored_permits, 4.0);
}

#[test]
fn reconfiguration_at_the_same_rate_rescales_stored_permits() {
    let mut fx = fixture();
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.state("k").stored_permits, 4.0);
    // Twice the burst: 4 of 5 becomes 8 of 10, then one is spent.
    assert_eq!(fx.run("k", &Args::bursty("5", 2_000_000).at(T0)), 0);
    assert_eq!(fx.state("k").max_permits, 10.0);
    assert_eq!(fx.state("k").stored_permits, 4.0 / 5.0 * 10.0 - 1.0);
}

#[test]
fn huge_debt_saturates_at_max_micros() {
    let mut fx = fixture();
    let args = Args::bursty("1e-300", 1_000_000).permits(u32::MAX);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
    let expected = i64::try_from(MAX_MICROS - T0).unwrap();
    assert_eq!(fx.run("k", &args.at(T0)), expected);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
}

// ---------------------------------------------------------------------------
// What must not be written
// ---------------------------------------------------------------------------

#[test]
fn refused_try_leaves_the_key_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0); // no burst: debt from the first call
    assert_eq!(fx.run("k", &args), 0);
    assert_eq!(fx.run("k", &args), 200_000);

    let dump = fx.dump("k");
    let pttl = fx.pttl("k");
    assert!(pttl > 0);
    assert_eq!(fx.run("k", &args.clone().timeout(0)), -1);
    assert_eq!(fx.run("k", &args.clone().timeout(399_999)), -1);
    assert_eq!(fx.dump("k"), dump, "a refused try changed the key");
    let after = fx.pttl("k");
    assert!(
        after <= pttl && after > pttl - 1_000,
        "PTTL {pttl} -> {after}"
    );

    // Without a TTL, a refused try (even one with a new rate, later) must not
    // write one, nor the new rate.
    fx.persist("k");
    let dump = fx.dump("k");
    let refused = args.clone().rate("50").timeout(0).at(T0 + 1_000);
    assert_eq!(fx.run("k", &refused), -1);
    assert_eq!(fx.pttl("k"), -1, "a refused try wrote a TTL");
    assert_eq!(fx.dump("k"), dump, "a refused try changed the key");
    assert_eq!(fx.state("k").permits_per_second, 5.0);

    // A try that fits is granted and writes (with a TTL, as its debt
    // outlasts the one the first call set).
    assert_eq!(fx.run("k", &args.clone().timeout(400_000)), 400_000);
    assert_ne!(fx.dump("k"), dump, "a granted try wrote nothing");
    assert_eq!(fx.state("k").next(), T0 + 600_000);
    assert!(fx.pttl("k") > 0);
}

#[test]
fn query_returns_the_wait_and_writes_nothing() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    // Missing key: no wait, and still missing.
    assert_eq!(fx.run("k", &args.clone().query().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().query()), 0);
    assert!(!fx.exists("k"));

    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next = T0 + 400 ms
    fx.persist("k");
    let dump = fx.dump("k");
    assert_eq!(fx.run("k", &args.clone().query().at(T0)), 400_000);
    assert_eq!(fx.run("k", &args.clone().query().at(T0 + 150_000)), 250_000);
    assert_eq!(
        fx.run("k", &args.clone().query().timeout(0).at(T0 + 150_000)),
        250_000
    );
    assert_eq!(fx.run("k", &args.clone().query().at(T0 + 400_000)), 0);
    // Long idle and a new rate: no resync, no rate change written.
    let idle = args.clone().rate("1000").query().at(T0 + 3_600_000_000);
    assert_eq!(fx.run("k", &idle), 0);
    assert_eq!(fx.dump("k"), dump, "a query changed the key");
    assert_eq!(fx.pttl("k"), -1, "a query wrote a TTL");
}

// ---------------------------------------------------------------------------
// Clock, script cache, precision
// ---------------------------------------------------------------------------

#[test]
fn server_clock_is_used_without_explicit_now() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0); // 1 permit/s, no burst
    assert_eq!(fx.run("k", &args), 0);
    let wait = fx.run("k", &args);
    assert!((900_000..=1_000_000).contains(&wait), "wait {wait}");
    // The ticket is a real server time: within a few seconds of TIME.
    let next = fx.state("k").next();
    let now = fx.server_time();
    assert!(
        next > now && next <= now + 2_000_000,
        "next {next}, now {now}"
    );
}

#[test]
fn script_flush_is_survived() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut fx.con)
        .unwrap();
    let cached: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fx.script.get_hash())
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(cached, [0], "SCRIPT FLUSH did not flush");
    // NOSCRIPT: the invocation loads the script again and retries.
    assert_eq!(fx.run("k", &args), 200_000);
    let cached: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(fx.script.get_hash())
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(cached, [1]);
}

#[test]
fn state_is_stored_exactly() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0);
    let before = fx.server_time();
    assert_eq!(fx.run("k", &args), 0);
    let after = fx.server_time();

    // The ticket is a 16-digit integer, stored without rounding.
    let next = fx.state("k").next();
    assert!(
        (before + 1_000_000..=after + 1_000_000).contains(&next),
        "next {next} not within [{before}, {after}] + 1 s"
    );
    // A query at now = 0 replies with the ticket itself: to the microsecond.
    assert_eq!(fx.run("k", &args.clone().query().at(0)), next as i64);

    // The next reservation's wait is exactly the ticket minus the server time.
    let before = fx.server_time();
    let wait = u64::try_from(fx.run("k", &args)).unwrap();
    let after = fx.server_time();
    assert!(
        (next - after..=next - before).contains(&wait),
        "wait {wait}, next {next}, time in [{before}, {after}]"
    );
    assert_eq!(fx.state("k").next(), next + 1_000_000);

    // Stored permits keep all their bits.
    assert_eq!(
        fx.run("s", &Args::bursty("3", 1_000_000).at(T0).permits(1)),
        0
    );
    assert_eq!(
        fx.run("s", &Args::bursty("3", 1_000_000).at(T0 + 100_000)),
        0
    );
    // 3 - 1 = 2, + 0.1 s × 3/s = 0.3 (as f64), capped at 3, - 1.
    let expected = (2.0_f64 + 100_000.0 / (1e6 / 3.0)).min(3.0) - 1.0;
    assert_eq!(fx.state("s").stored_permits.to_bits(), expected.to_bits());
}

// ---------------------------------------------------------------------------
// Bad arguments
// ---------------------------------------------------------------------------

#[test]
fn bad_arguments_are_errors_and_write_nothing() {
    let mut fx = fixture();
    let good = Args::bursty("5", 1_000_000).at(T0);
    let warm = Args::warming_up("5", 1_000_000, "3").at(T0);
    let mut cases: Vec<Vec<String>> = vec![];
    for permits in ["-1", "1.5", "abc", "", "nan", "inf", "1e17"] {
        cases.push(good.clone().permits(permits).to_vec());
    }
    for timeout in ["-2", "0.5", "x", "nan", "-inf"] {
        cases.push(good.clone().timeout(timeout).to_vec());
    }
    for rate in ["0", "-0", "-1", "nan", "-inf", "abc", ""] {
        cases.push(good.clone().rate(rate).to_vec());
        cases.push(warm.clone().rate(rate).to_vec());
    }
    for policy in ["unknown", "BURSTY", ""] {
        cases.push(
            Args {
                policy: policy.into(),
                ..good.clone()
            }
            .to_vec(),
        );
    }
    for micros in ["-1", "1.5", "inf", "nan", "x"] {
        cases.push(
            Args {
                policy_micros: micros.into(),
                ..good.clone()
            }
            .to_vec(),
        );
        cases.push(
            Args {
                policy_micros: micros.into(),
                ..warm.clone()
            }
            .to_vec(),
        );
    }
    for cold_factor in ["0.5", "0", "-3", "nan", "inf", "abc", ""] {
        cases.push(
            Args {
                cold_factor: cold_factor.into(),
                ..warm.clone()
            }
            .to_vec(),
        );
    }
    for now in ["abc", "-1", "1.5", "1e17", "inf"] {
        cases.push(
            Args {
                now: Some(now.into()),
                ..good.clone()
            }
            .to_vec(),
        );
    }
    // Missing or extra arguments.
    let full = good.to_vec();
    cases.push(vec![]);
    cases.push(full[..5].to_vec());
    cases.push(full[..1].to_vec());
    let mut extra = full.clone();
    extra.push("8".into());
    cases.push(extra);

    // An existing key must not change either.
    assert_eq!(fx.run("existing", &good), 0);
    fx.persist("existing");
    let dump = fx.dump("existing");

    for argv in &cases {
        let error = fx.run_err(&["k"], argv);
        assert!(error.contains("throttler:"), "{argv:?}: {error}");
        assert!(!fx.exists("k"), "{argv:?} wrote the key");
        let error = fx.run_err(&["existing"], argv);
        assert!(error.contains("throttler:"), "{argv:?}: {error}");
        assert_eq!(fx.dump("existing"), dump, "{argv:?} changed the key");
        assert_eq!(fx.pttl("existing"), -1, "{argv:?} set a TTL");
    }

    // Wrong number of keys.
    for keys in [&[][..], &["k", "k2"][..]] {
        let error = fx.run_err(keys, &full);
        assert!(error.contains("throttler:"), "{keys:?}: {error}");
    }
    assert!(!fx.exists("k") && !fx.exists("k2"));

    // The same arguments, valid, do work (the cases above fail for their one
    // bad value, not for something else).
    assert_eq!(fx.run("k", &good), 0);
    assert_eq!(fx.run("w", &warm), 0);
}

// ---------------------------------------------------------------------------
// Corrupted keys
// ---------------------------------------------------------------------------

#[test]
fn key_of_another_type_is_an_error_and_kept() {
    let mut fx = fixture();
    let _: i64 = redis::cmd("HSET")
        .arg("h")
        .arg("owner")
        .arg("someone")
        .query(&mut fx.con)
        .unwrap();
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("item")
        .query(&mut fx.con)
        .unwrap();
    for key in ["h", "l"] {
        let dump = fx.dump(key);
        for args in [
            Args::bursty("5", 1_000_000).at(T0),
            Args::bursty("5", 1_000_000).query(),
            Args::bursty("5", 1_000_000).timeout(0),
        ] {
            let error = fx.run_err(&[key], &args.to_vec());
            assert!(error.contains("WRONGTYPE"), "{error}");
        }
        assert_eq!(fx.dump(key), dump, "{key} was changed");
        assert_eq!(fx.pttl(key), -1);
    }
}

/// A change that makes a valid state invalid.
type Corruption = fn(&mut LimiterState);

#[test]
fn corrupted_value_reads_as_missing_and_is_rewritten() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    let valid = LimiterState {
        stored_permits: 0.0,
        next_free_micros: (T0 + 10_000_000) as f64,
        permits_per_second: 5.0,
        max_permits: 5.0,
        expires_micros: (T0 + 60_000_000) as f64,
    };
    // Sanity: the valid state is read as is (10 s of debt), and as its
    // recorded TTL end covers what the key then needs, no TTL is set.
    fx.set_bytes("valid", &valid.encode());
    assert_eq!(fx.run("valid", &args), 10_000_000);
    assert_eq!(fx.state("valid").next(), T0 + 10_200_000);
    assert_eq!(fx.pttl("valid"), -1);

    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("someone else's string".into(), b"garbage".to_vec()),
        ("empty".into(), vec![]),
        (
            "one byte short".into(),
            valid.encode()[..STATE_LEN - 1].to_vec(),
        ),
        ("one byte long".into(), [valid.encode(), vec![0]].concat()),
        ("text".into(), vec![b'7'; STATE_LEN]),
    ];
    let corruptions: &[(&str, Corruption)] = &[
        ("next 1.5", |s| s.next_free_micros = 1.5),
        ("next -1", |s| s.next_free_micros = -1.0),
        ("next 2^53 + 2", |s| {
            s.next_free_micros = (MAX_MICROS + 2) as f64
        }),
        ("next inf", |s| s.next_free_micros = f64::INFINITY),
        ("next nan", |s| s.next_free_micros = f64::NAN),
        ("stored -5", |s| s.stored_permits = -5.0),
        ("stored nan", |s| s.stored_permits = f64::NAN),
        ("stored inf", |s| s.stored_permits = f64::INFINITY),
        ("stored above max", |s| s.stored_permits = 6.0),
        ("rate 0", |s| s.permits_per_second = 0.0),
        ("rate -0", |s| s.permits_per_second = -0.0),
        ("rate -1", |s| s.permits_per_second = -1.0),
        ("rate nan", |s| s.permits_per_second = f64::NAN),
        ("rate -inf", |s| s.permits_per_second = f64::NEG_INFINITY),
        ("max inf", |s| s.max_permits = f64::INFINITY),
        ("max -1", |s| s.max_permits = -1.0),
        ("max nan", |s| s.max_permits = f64::NAN),
        ("stored above a lower max", |s| {
            s.max_permits = 4.0;
            s.stored_permits = 4.5;
        }),
        ("expires -1", |s| s.expires_micros = -1.0),
        ("expires inf", |s| s.expires_micros = f64::INFINITY),
        ("expires nan", |s| s.expires_micros = f64::NAN),
    ];
    for (name, corrupt) in corruptions {
        let mut state = valid;
        corrupt(&mut state);
        cases.push((name.to_string(), state.encode()));
    }
    for (i, (name, value)) in cases.iter().enumerate() {
        let key = format!("c{i}");
        fx.set_bytes(&key, value);
        let dump = fx.dump(&key);
        // A query sees a missing key and writes nothing.
        assert_eq!(fx.run(&key, &args.clone().query()), 0, "{name}");
        assert_eq!(fx.dump(&key), dump, "{name}: the query wrote");
        // A reservation resets it: full (5), one spent, ticket now, and a
        // new TTL: twice the 200 ms to refill the permit plus 2 ms.
        assert_eq!(fx.run(&key, &args), 0, "{name}");
        assert_eq!(
            fx.state(&key),
            LimiterState {
                stored_permits: 4.0,
                next_free_micros: T0 as f64,
                permits_per_second: 5.0,
                max_permits: 5.0,
                expires_micros: (T0 + 404_000) as f64,
            },
            "{name}"
        );
        let pttl = fx.pttl(&key);
        assert!((300..=404).contains(&pttl), "{name}: PTTL {pttl}");
    }
}

// ---------------------------------------------------------------------------
// Expiry
// ---------------------------------------------------------------------------

#[test]
fn ttl_lasts_until_the_key_would_read_as_missing() {
    let mut fx = fixture();
    // Bursty 5/s, 1 s burst: 10 permits from full = 5 stored + 5 fresh, so
    // the ticket is 1 s ahead and refilling 5 permits takes 1 s more; then
    // 2 ms of margin, and the slack of a TTL the script sets: twice the
    // need, at most 1 s more.
    assert_eq!(
        fx.run("b", &Args::bursty("5", 1_000_000).permits(10).at(T0)),
        0
    );
    let pttl = fx.pttl("b");
    assert!((2_900..=3_002).contains(&pttl), "PTTL {pttl}");
    assert_eq!(fx.state("b").expires_micros, (T0 + 3_002_000) as f64);

    // Warming-up 2/s, 4 s, cold 3 (max 8): the first permit from cold costs
    // 1.375 s forward; one stored permit refills in 4 s / 8 = 0.5 s.
    let args = Args::warming_up("2", 4_000_000, "3").at(T0);
    assert_eq!(fx.run("w", &args), 0);
    let pttl = fx.pttl("w");
    assert!((2_777..=2_877).contains(&pttl), "PTTL {pttl}");

    // A full limiter (infinite rate: nothing to store, no debt) needs only
    // the 2 ms margin, and gets as much again.
    assert_eq!(fx.run("i", &Args::bursty("inf", 1_000_000).at(T0)), 0);
    let pttl = fx.pttl("i");
    assert!((0..=4).contains(&pttl) || pttl == -2, "PTTL {pttl}");
}

#[test]
fn ttl_is_kept_while_it_lasts_long_enough_then_renewed() {
    let mut fx = fixture();
    let args = Args::bursty("1", 0).at(T0); // no burst: 1 s per permit
    assert_eq!(fx.run("k", &args), 0);
    // The ticket is T0 + 1 s: the key needs 1.002 s, and gets 1 s more.
    assert_eq!(fx.state("k").expires_micros, (T0 + 2_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((1_900..=2_002).contains(&pttl), "PTTL {pttl}");

    // A write whose need the recorded end covers, here exactly (ticket at
    // T0 + 2 s, so T0 + 2.002 s), keeps the TTL it finds (here one set from
    // outside, so that keeping it shows).
    fx.pexpire("k", 50_000);
    assert_eq!(fx.run("k", &args), 1_000_000);
    assert_eq!(fx.state("k").next(), T0 + 2_000_000);
    assert_eq!(fx.state("k").expires_micros, (T0 + 2_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((49_000..=50_000).contains(&pttl), "PTTL {pttl}");

    // One more permit needs T0 + 3.002 s: a new TTL, 1 s past that.
    assert_eq!(fx.run("k", &args), 2_000_000);
    assert_eq!(fx.state("k").expires_micros, (T0 + 4_002_000) as f64);
    let pttl = fx.pttl("k");
    assert!((3_900..=4_002).contains(&pttl), "PTTL {pttl}");
}

#[test]
fn ttl_is_capped() {
    let mut fx = fixture();
    // Ticket saturated at 2^53 and a refill of 2^53 µs: far beyond the cap.
    let args = Args::bursty("0.001", MAX_MICROS).permits(u32::MAX).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    assert_eq!(fx.state("k").next(), MAX_MICROS);
    let pttl = fx.pttl("k");
    assert!(
        pttl <= TTL_CAP_MS && pttl > TTL_CAP_MS - 10_000,
        "PTTL {pttl}"
    );
}
