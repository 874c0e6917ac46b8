//! The Lua script (`lua/`) against a real Redis server: the interface (modes,
//! arguments, replies, errors), what it writes and what it must not write,
//! the value format and its upgrade, the clock, number precision (the
//! ticket's fraction below the microsecond included), values it does not
//! recognise, expiry, and the cold modes (probe, resume, cancel).
//! Expected waits are derived by hand from the rules in `paceline::core`.

use std::net::TcpListener;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::support::limiter_state::{
    FRACTION_ONE, FRACTIONS_BYTES, LimiterState, MARKER, STATE_LEN, THR1_MARKER, THR3_MARKER,
    TOKEN_LEN, TOKEN_WITH_ID_LEN, Token, V0_STATE_LEN, fractions_field, ledger_groups,
    set_fractions_field,
};
use crate::support::redis_server::RedisServer;
use redis::Value;

/// A realistic "now": microseconds since the epoch, late 2023.
const T0: u64 = 1_700_000_000_000_000;
/// 2^53, where time saturates.
const MAX_MICROS: u64 = 1 << 53;
/// The script's TTL cap, in milliseconds: floor(2^53 / 1000).
const TTL_CAP_MS: i64 = 9_007_199_254_740;

fn script() -> redis::Script {
    redis::Script::new(paceline::redis::format::SCRIPT)
}

/// A server, a connection to it and the script.
struct Fixture {
    server: RedisServer,
    con: redis::Connection,
    script: redis::Script,
}

fn fixture() -> Fixture {
    let server = RedisServer::start();
    let con = server.connection();
    Fixture {
        server,
        con,
        script: script(),
    }
}

/// The script's ARGV, with defaults: reserve 1 permit, no timeout, server clock.
#[derive(Debug, Clone)]
struct Args {
    /// ARGV[1]: permits, or the mode.
    permits: String,
    /// ARGV[2]: timeout, debt or token.
    arg2: Vec<u8>,
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
            arg2: b"-1".to_vec(),
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

    /// A reservation its caller may give back (`n+`): if it waits, it gets
    /// a group in the key's ledger.
    fn held(mut self) -> Args {
        self.permits.push('+');
        self
    }

    /// A probe (ARGV[2] stays as it was: -1 unless set).
    fn probe(self) -> Args {
        self.permits("probe")
    }

    /// A resume with this debt.
    fn resume(self, debt_micros: impl ToString) -> Args {
        let mut args = self.permits("resume");
        args.arg2 = debt_micros.to_string().into_bytes();
        args
    }

    /// A cancel of the reservation with this token.
    fn cancel(self, token: &[u8]) -> Args {
        let mut args = self.permits("cancel");
        args.arg2 = token.to_vec();
        args
    }

    /// A try: refused if the current debt exceeds `timeout_micros`.
    fn timeout(mut self, timeout_micros: impl ToString) -> Args {
        self.arg2 = timeout_micros.to_string().into_bytes();
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

    fn to_vec(&self) -> Vec<Vec<u8>> {
        let mut argv = vec![
            self.permits.clone().into_bytes(),
            self.arg2.clone(),
            self.rate.clone().into_bytes(),
            self.policy.clone().into_bytes(),
            self.policy_micros.clone().into_bytes(),
            self.cold_factor.clone().into_bytes(),
        ];
        argv.extend(self.now.clone().map(String::into_bytes));
        argv
    }
}

/// ARGV as text, for messages.
fn show(argv: &[Vec<u8>]) -> String {
    let args: Vec<_> = argv.iter().map(|a| String::from_utf8_lossy(a)).collect();
    format!("{args:?}")
}

/// A reply, decoded: a granted reservation's value (its token), or an
/// integer (the debt, negated for a refused try; a cancel's outcome).
#[derive(Debug, Clone, PartialEq)]
struct Reply {
    /// The wait, -1 for a refused try, the debt for a query, a probe or a
    /// resume; for a cancel 1 (restored), 2 (returned) or 0 (nothing).
    first: i64,
    /// The key's debt after the call (a cancel: its outcome again).
    debt: i64,
    /// A granted reservation's token: the value it wrote.
    token: Option<Vec<u8>>,
}

impl Reply {
    fn decode(value: Value) -> Result<Reply, String> {
        match value {
            Value::BulkString(bytes) => {
                let token = Token::decode(&bytes)?;
                let whole = |x: f64| {
                    assert!(x >= 0.0 && x.fract() == 0.0, "{x} in {token:?}");
                    x as i64
                };
                Ok(Reply {
                    first: whole(token.wait_micros()),
                    debt: whole(token.debt_micros()),
                    token: Some(bytes),
                })
            }
            Value::Int(n) if n < 0 => Ok(Reply {
                first: -1,
                debt: -n,
                token: None,
            }),
            Value::Int(n) => Ok(Reply {
                first: n,
                debt: n,
                token: None,
            }),
            other => Err(format!("expected a value or an integer, got {other:?}")),
        }
    }

    /// The decoded token; panics if there is none.
    fn token(&self) -> Token {
        Token::decode(self.token.as_deref().expect("a token")).unwrap()
    }
}

impl Fixture {
    /// Runs the script on `key` with raw arguments.
    fn eval_raw(&mut self, keys: &[&str], argv: &[Vec<u8>]) -> redis::RedisResult<Value> {
        eval_on(&self.script, &mut self.con, keys, argv)
    }

    fn eval(&mut self, key: &str, args: &Args) -> redis::RedisResult<Value> {
        self.eval_raw(&[key], &args.to_vec())
    }

    /// Runs the script, expects a reply and checks its shape against the
    /// mode: a granted reservation has a token and a debt at least its
    /// wait, a refused try a debt, a query, a probe or a resume its debt.
    fn call(&mut self, key: &str, args: &Args) -> Reply {
        let value = self
            .eval(key, args)
            .unwrap_or_else(|e| panic!("script failed for {args:?}: {e}"));
        let reply = Reply::decode(value).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let held = args.permits.ends_with('+');
        let reservation = args
            .permits
            .trim_end_matches('+')
            .parse::<u64>()
            .is_ok_and(|n| n >= 1);
        match args.permits.as_str() {
            _ if reservation && reply.first >= 0 => {
                let token = reply
                    .token
                    .as_deref()
                    .expect("a granted reservation has a token");
                // One that may be given back and waits carries its group's
                // id in the ledger.
                let len = if held && reply.first > 0 {
                    TOKEN_WITH_ID_LEN
                } else {
                    TOKEN_LEN
                };
                assert_eq!(token.len(), len, "{args:?}: token {token:?}");
                assert!(reply.debt >= reply.first, "{args:?}: {reply:?}");
            }
            _ if reservation => {
                assert_eq!(reply.first, -1, "{args:?}: {reply:?}");
                assert!(
                    reply.debt > 0 && reply.token.is_none(),
                    "{args:?}: {reply:?}"
                );
            }
            "0" | "resume" | "probe" => {
                assert!(
                    reply.first == reply.debt && reply.token.is_none(),
                    "{args:?}: {reply:?}"
                )
            }
            _ => assert!(reply.token.is_none(), "{args:?}: {reply:?}"),
        }
        reply
    }

    /// Runs the script and returns the first number of its reply: the wait
    /// (-1 for a refused try).
    fn run(&mut self, key: &str, args: &Args) -> i64 {
        self.call(key, args).first
    }

    /// Runs the script and expects an error; returns it as the server
    /// sent it (`CODE detail`).
    fn run_err(&mut self, keys: &[&str], argv: &[Vec<u8>]) -> String {
        match self.eval_raw(keys, argv) {
            Ok(reply) => panic!("expected an error for {}, got reply {reply:?}", show(argv)),
            Err(e) => server_error(&e),
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

/// An error as the server sent it: `CODE detail` (e.g. `ERR paceline: ...`).
fn server_error(e: &redis::RedisError) -> String {
    match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or_default()),
        None => e.to_string(),
    }
}

fn eval_on(
    script: &redis::Script,
    con: &mut redis::Connection,
    keys: &[&str],
    argv: &[Vec<u8>],
) -> redis::RedisResult<Value> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in argv {
        invocation.arg(&arg[..]);
    }
    invocation.invoke(con)
}

/// Asserts that `error` is the script's refusal of a value it does not
/// recognise.
fn assert_unrecognised(error: &str, what: &str) {
    assert!(
        error.contains("ERR paceline:")
            && error.contains("does not recognise")
            && error.contains("left untouched"),
        "{what}: {error}"
    );
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
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    let pttl = fx.pttl("k");
    assert!((ttl - 100..=ttl).contains(&pttl), "PTTL {pttl}");
}

#[test]
fn reserve_replies_wait_debt_and_token() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    // From full (5 stored): 3 stored spent, 2 fresh charged forward.
    let first = fx.call("k", &args.clone().permits(3).at(T0));
    assert_eq!((first.first, first.debt), (0, 0));
    let reply = fx.call("k", &args.clone().permits(4).at(T0 + 100_000));
    // 100 ms idle stores 0.5: 2.5 stored spent, 1.5 fresh = 300 ms.
    assert_eq!((reply.first, reply.debt), (0, 300_000));
    // The reply is the value written, with the reservation's record.
    let token = reply.token();
    assert_eq!(reply.token.as_deref(), Some(&fx.raw("k")[..]));
    assert_eq!(
        token,
        Token {
            state: LimiterState {
                stored_permits: 0.0,
                next_free_micros: (T0 + 400_000) as f64,
                permits_per_second: 5.0,
                max_permits: 5.0,
                expires_micros: token.state.expires_micros,
                last_now_micros: (T0 + 100_000) as f64,
                next_free_fraction: 0,
            },
            stored_before: 2.0,
            next_free_before: T0 as f64,
            fraction_before: 0,
            spent_stored: true,
        }
    );
    assert_eq!(token.moment_micros(), (T0 + 100_000) as f64);
    // Owing 300 ms: a reservation that spends nothing stored.
    let reply = fx.call("k", &args.clone().at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (300_000, 500_000));
    let token = reply.token();
    assert!(!token.spent_stored);
    assert_eq!(token.moment_micros(), (T0 + 400_000) as f64);
    assert_eq!(token.stored_before, 0.0);
    assert_eq!(token.next_free_before, (T0 + 400_000) as f64);
    // A refused try: -1 and the debt, no token.
    let refused = fx.call("k", &args.clone().timeout(0).at(T0 + 200_000));
    assert_eq!(
        refused,
        Reply {
            first: -1,
            debt: 400_000,
            token: None
        }
    );
    // A query: the debt twice.
    let query = fx.call("k", &args.clone().query().at(T0 + 200_000));
    assert_eq!((query.first, query.debt), (400_000, 400_000));
}

#[test]
fn written_value_is_76_bytes_with_the_marker() {
    let mut fx = fixture();
    assert_eq!(fx.run("k", &Args::bursty("5", 1_000_000).at(T0)), 0);
    let raw = fx.raw("k");
    assert_eq!(raw.len(), STATE_LEN);
    assert_eq!(STATE_LEN, 76);
    assert_eq!(&raw[..4], b"thr2");
    assert_eq!(&raw[..4], MARKER);
    let value = Token::decode(&raw).unwrap();
    assert_eq!(value.state.last_now_micros, T0 as f64);
    // The record of the reservation that wrote it: from full (5 stored, the
    // ticket at now, no fraction), one stored permit spent.
    assert_eq!(
        (
            value.stored_before,
            value.next_free_before,
            value.fraction_before,
            value.spent_stored
        ),
        (5.0, T0 as f64, 0, true)
    );
    // Field 7 (bytes 52..60): next_free_fraction * 2^21 + fraction_before *
    // 2 + spent_stored, here 0, 0 and 1.
    assert_eq!(FRACTIONS_BYTES, 52..60);
    assert_eq!(fractions_field(&raw), 1.0);
    assert_eq!(value.encode(), raw);

    // At 3/s a permit costs 333 333.33 µs: the ticket keeps the third of a
    // µs, to the nearest 2^-20 µs (349 525 units), in field 7.
    assert_eq!(fx.run("f", &Args::bursty("3", 0).at(T0)), 0);
    let raw = fx.raw("f");
    let value = Token::decode(&raw).unwrap();
    assert_eq!(value.state.next(), T0 + 333_333);
    assert_eq!(value.state.next_free_fraction, 349_525);
    assert_eq!(fractions_field(&raw), 349_525.0 * 2_097_152.0);
    assert_eq!(value.encode(), raw);
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
    // A seventh permit, at the sixth one's moment: it waits for the sixth
    // one's charge and, like every permit so far (8 were stored), spends a
    // stored one at the stable price, below the threshold of 4.
    let reply = fx.call("w", &Args::warming_up("2", 4_000_000, "3").at(now));
    assert_eq!((reply.first, reply.debt), (500_000, 1_000_000));
    let token = reply.token();
    assert!(token.spent_stored);
    assert_eq!(token.moment_micros(), (now + 500_000) as f64);
    assert_eq!(token.stored_before, 2.0);
    assert_eq!(token.state.stored_permits, 1.0);
    assert_eq!(token.state.max_permits, 8.0);
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
// The ticket's fraction
// ---------------------------------------------------------------------------

#[test]
fn a_rate_above_one_permit_per_microsecond_limits() {
    let mut fx = fixture();
    // 1.5e6/s: a permit costs 2/3 µs, 699 051 units of 2^-20 µs. On a
    // frozen clock the waits are the ticket rounded down to the µs: 0, 2/3,
    // 4/3, 2, 8/3, 10/3, 4 (whole-µs costs would not limit at all).
    // 3 000 reservations in one transaction, each followed by a PERSIST:
    // the few milliseconds of TTL the script sets (on this frozen clock)
    // run on the real one.
    let args = Args::bursty("1.5e6", 0).at(T0);
    fx.script.load(&mut fx.con).expect("SCRIPT LOAD");
    let mut invocation = fx.script.prepare_invoke();
    invocation.key("k");
    for arg in args.to_vec() {
        invocation.arg(arg);
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 0..3_000 {
        pipe.invoke_script(&invocation);
        pipe.cmd("PERSIST").arg("k").ignore();
        if i == 6 {
            pipe.cmd("GET").arg("k");
        }
    }
    let mut replies: Vec<Value> = pipe.query(&mut fx.con).unwrap();
    let after_seven =
        LimiterState::decode(&redis::from_redis_value::<Vec<u8>>(replies.remove(7)).unwrap())
            .unwrap();
    let waits: Vec<i64> = replies
        .into_iter()
        .map(|reply| Reply::decode(reply).unwrap().first)
        .collect();
    assert_eq!(waits[..7], [0, 0, 1, 2, 2, 3, 4]);
    assert_eq!(after_seven.next(), T0 + 4);
    assert_eq!(after_seven.next_free_fraction, 7 * 699_051 - 4 * 1_048_576);
    // 3 000 permits in 2 000 µs (and 1 000 units: the rounding of each
    // cost to 2^-20 µs); the last one waited for 2 999 × 2/3 µs.
    assert_eq!(waits[2_999], 1_999);
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 2_000);
    assert_eq!(state.next_free_fraction, 1_000);
    assert_eq!(fx.run("k", &args.clone().query()), 2_000);
}

#[test]
fn a_cost_of_2_pow_32_micros_or_more_is_whole_and_keeps_the_fraction() {
    let mut fx = fixture();
    // One permit at 3/s leaves 349 525 units past T0 + 333 333 µs.
    assert_eq!(fx.run("k", &Args::bursty("3", 0).at(T0)), 0);
    assert_eq!(fx.state("k").next_free_fraction, 349_525);
    // Five permits at 1/1000 s: 5e9 µs, above 2^32 µs: charged in whole
    // µs (truncated), the ticket's fraction as it was. (The ticket is
    // ahead: the rate change moves nothing.)
    let reply = fx.call("k", &Args::bursty("0.001", 0).permits(5).at(T0));
    assert_eq!((reply.first, reply.debt), (333_333, 5_000_333_333));
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 5_000_333_333);
    assert_eq!(state.next_free_fraction, 349_525);
}

#[test]
fn idle_time_counts_from_the_exact_ticket() {
    let mut fx = fixture();
    let args = Args::bursty("3", 1_000_000);
    // From full (3 stored): 3 stored and 1 fresh, charged to T0 + 333 333
    // µs and 349 525 units.
    assert_eq!(fx.run("k", &args.clone().permits(4).at(T0)), 0);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 333_333, 349_525)
    );
    // Idle from that ticket to T0 + 1 s: 666 666.67 µs, 2 permits stored
    // (not 666 667 µs, which would store a little more); one is spent.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 1_000_000)), 0);
    let idle = (1_000_000.0 - 333_333.0) - 349_525.0 / 1_048_576.0;
    let expected = (0.0_f64 + idle / (1e6 / 3.0)).min(3.0) - 1.0;
    let state = fx.state("k");
    assert_eq!(state.stored_permits.to_bits(), expected.to_bits());
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 1_000_000, 0)
    );
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
    // A query at now = 0 reads the key's latest clock instead (time never
    // runs backwards) and replies with the ticket minus that: to the
    // microsecond.
    let last_now = fx.state("k").last_now_micros;
    assert!(
        (before as f64..=after as f64).contains(&last_now),
        "{last_now}"
    );
    assert_eq!(
        fx.run("k", &args.clone().query().at(0)),
        (next as f64 - last_now) as i64
    );

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

/// A well-formed token (bursty at 5/s, one permit reserved at T0 from an
/// empty, idle limiter), for calls that need one.
fn a_token() -> Token {
    Token {
        state: LimiterState {
            stored_permits: 0.0,
            next_free_micros: (T0 + 200_000) as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: (T0 + 1_000_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        },
        stored_before: 0.0,
        next_free_before: T0 as f64,
        fraction_before: 0,
        spent_stored: false,
    }
}

#[test]
fn bad_arguments_are_errors_and_write_nothing() {
    let mut fx = fixture();
    let good = Args::bursty("5", 1_000_000).at(T0);
    let warm = Args::warming_up("5", 1_000_000, "3").at(T0);
    let mut cases: Vec<Vec<Vec<u8>>> = vec![];
    for permits in [
        "-1", "1.5", "abc", "", "nan", "inf", "1e17", "PROBE", "probe ", "Cancel", "resumed",
    ] {
        cases.push(good.clone().permits(permits).to_vec());
    }
    for timeout in ["-2", "0.5", "x", "nan", "-inf", ""] {
        cases.push(good.clone().timeout(timeout).to_vec());
        cases.push(good.clone().query().timeout(timeout).to_vec());
        cases.push(good.clone().probe().timeout(timeout).to_vec());
    }
    for debt in ["-1", "1.5", "x", "nan", "inf", "-inf", ""] {
        cases.push(good.clone().resume(debt).to_vec());
    }
    // Tokens: wrong lengths, and values that are no reservation's.
    let token = Token {
        stored_before: 1.0,
        spent_stored: true,
        ..a_token()
    };
    let bad_tokens: &[fn(&mut Token)] = &[
        |t| t.stored_before = f64::NAN,
        |t| t.stored_before = -1.0,
        |t| t.stored_before = 6.0, // above max
        |t| t.state.stored_permits = f64::INFINITY,
        |t| t.next_free_before = 1.5,
        |t| t.next_free_before = (MAX_MICROS + 2) as f64,
        |t| t.state.next_free_micros = f64::NAN,
        |t| t.state.next_free_micros = (T0 - 1) as f64, // before the moment
        |t| t.state.last_now_micros = -1.0,
        |t| t.state.last_now_micros = 0.5,
        |t| t.state.last_now_micros = (T0 + 300_000) as f64, // moment after the ticket
        |t| t.state.next_free_fraction = FRACTION_ONE,       // field 7 = 2^41
        |t| t.state.permits_per_second = 0.0,
        |t| t.state.permits_per_second = f64::NAN,
        |t| t.state.max_permits = f64::INFINITY,
        |t| t.state.max_permits = -1.0,
    ];
    for corrupt in bad_tokens {
        let mut bad = token;
        corrupt(&mut bad);
        cases.push(good.clone().cancel(&bad.encode()).to_vec());
    }
    // Field 7 must be an integer in 0..2^41.
    for raw in BAD_FRACTIONS {
        let mut bad = token.encode();
        set_fractions_field(&mut bad, *raw);
        cases.push(good.clone().cancel(&bad).to_vec());
    }
    let encoded = token.encode();
    let bad_lengths: Vec<Vec<u8>> = vec![
        vec![],
        b"-1".to_vec(),
        encoded[..TOKEN_LEN - 1].to_vec(),
        [&encoded[..], &[0]].concat(),
        [&b"thr4"[..], &encoded[4..]].concat(), // not the marker
        [&THR1_MARKER[..], &encoded[4..]].concat(), // a value of the previous format
    ];
    for bad in &bad_lengths {
        cases.push(good.clone().cancel(bad).to_vec());
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
        let args = show(argv);
        let error = fx.run_err(&["k"], argv);
        assert!(error.contains("ERR paceline:"), "{args}: {error}");
        assert!(!fx.exists("k"), "{args} wrote the key");
        let error = fx.run_err(&["existing"], argv);
        assert!(error.contains("ERR paceline:"), "{args}: {error}");
        assert_eq!(fx.dump("existing"), dump, "{args} changed the key");
        assert_eq!(fx.pttl("existing"), -1, "{args} set a TTL");
    }

    // Wrong number of keys.
    for keys in [&[][..], &["k", "k2"][..]] {
        let error = fx.run_err(keys, &full);
        assert!(error.contains("paceline:"), "{keys:?}: {error}");
    }
    assert!(!fx.exists("k") && !fx.exists("k2"));

    // The same arguments, valid, do work (the cases above fail for their one
    // bad value, not for something else).
    assert_eq!(fx.run("k", &good), 0);
    assert_eq!(fx.run("w", &warm), 0);
    assert_eq!(fx.call("k", &good.clone().cancel(&encoded)).first, 0);
    assert_eq!(fx.run("k", &good.clone().resume(0)), 0);
    assert_eq!(fx.run("k", &good.clone().probe().timeout(0)), 0);
}

// ---------------------------------------------------------------------------
// Corrupted keys
// ---------------------------------------------------------------------------

/// One call in every mode, on the same configuration.
fn every_mode(args: &Args) -> Vec<Args> {
    let token = a_token();
    vec![
        args.clone(),
        args.clone().permits(7),
        args.clone().timeout(0),
        args.clone().timeout(MAX_MICROS),
        args.clone().query(),
        args.clone().probe(),
        args.clone().resume(0),
        args.clone().resume(1_000_000),
        args.clone().cancel(&token.encode()),
    ]
}

#[test]
fn a_corrupted_ledger_is_an_error_and_left_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).at(T0);
    // A real ledger: three reservations that wait and may be given back.
    assert_eq!(fx.run("src", &args), 0);
    let tokens: Vec<Vec<u8>> = (0..3)
        .map(|_| fx.call("src", &args.clone().held()).token.unwrap())
        .collect();
    let ledger = fx.raw("src");
    assert_eq!(ledger_groups(&ledger), Some(3));
    let head = |field: usize| STATE_LEN + 8 * field;
    let set = |value: &mut Vec<u8>, at: usize, x: f64| {
        value[at..at + 8].copy_from_slice(&x.to_le_bytes());
    };

    // Its head is read by every mode.
    let mut heads: Vec<(&str, Vec<u8>)> = vec![];
    for (name, field, x) in [
        ("open NaN", 0, f64::NAN),
        ("next_id -1", 1, -1.0),
        ("next_id 1.5", 1, 1.5),
        ("in_order 2", 3, 2.0),
        ("groups 65", 4, 65.0),
        ("groups 2 (the size says 3)", 4, 2.0),
        ("horizon NaN", 5, f64::NAN),
    ] {
        let mut value = ledger.clone();
        set(&mut value, head(field), x);
        heads.push((name, value));
    }
    heads.push(("one byte long", [&ledger[..], &[0]].concat()));
    heads.push(("no groups' bytes", ledger[..STATE_LEN + 48].to_vec()));
    // Its groups are read by a give-back.
    let places = STATE_LEN + 48;
    let mut groups: Vec<(&str, Vec<u8>)> = vec![];
    let mut swapped = ledger.clone();
    swapped.copy_within(places..places + 16, places + 32);
    groups.push(("ids not rising", swapped));
    let mut stray = ledger.clone();
    set(&mut stray, places + 48, 99.0); // the first entry's id
    groups.push(("an entry of no group", stray));
    let mut nan = ledger.clone();
    set(&mut nan, places + 56, f64::NAN); // the first entry's offset
    groups.push(("an offset NaN", nan));
    let mut moment = ledger.clone();
    set(&mut moment, places + 8, 0.5); // the first group's moment
    groups.push(("a moment 0.5", moment));

    let cancel = args.clone().cancel(&tokens[1]);
    for (i, (name, value)) in heads.iter().enumerate() {
        let key = format!("head{i}");
        fx.set_bytes(&key, value);
        for mode in every_mode(&args).into_iter().chain([cancel.clone()]) {
            let error = fx.run_err(&[&key], &mode.to_vec());
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            assert_eq!(fx.raw(&key), *value, "{name}, {mode:?}: the value changed");
        }
    }
    for (i, (name, value)) in groups.iter().enumerate() {
        let key = format!("groups{i}");
        fx.set_bytes(&key, value);
        let error = fx.run_err(&[&key], &cancel.to_vec());
        assert_unrecognised(&error, name);
        assert_eq!(fx.raw(&key), *value, "{name}: the value changed");
    }
    // The ledger itself, copied as it is, gives back.
    fx.set_bytes("copy", &ledger);
    assert_eq!(fx.run("copy", &cancel), 2);
}

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
        for args in every_mode(&Args::bursty("5", 1_000_000).at(T0)) {
            let error = fx.run_err(&[key], &args.to_vec());
            assert!(error.contains("WRONGTYPE"), "{args:?}: {error}");
        }
        assert_eq!(fx.dump(key), dump, "{key} was changed");
        assert_eq!(fx.pttl(key), -1);
    }
}

// ---------------------------------------------------------------------------
// The value: format, upgrade, values that are not this limiter's
// ---------------------------------------------------------------------------

/// A change that makes a valid state invalid.
type Corruption = fn(&mut LimiterState);

/// Field changes that make a valid state invalid, in either format.
const CORRUPTIONS: &[(&str, Corruption)] = &[
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

/// Values of field 7 that are not an integer in 0..2^41: a ticket's
/// fraction of 2^20 (one whole µs) or more, negative, not an integer, NaN,
/// infinite.
const BAD_FRACTIONS: &[f64] = &[
    2_199_023_255_552.0, // 2^41: next_free_fraction = 2^20
    4e15,
    1e300,
    -1.0,
    -2_097_152.0,
    0.5,
    2_097_152.5,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
];

/// A valid state with 10 s of debt at T0.
fn valid_state() -> LimiterState {
    LimiterState {
        stored_permits: 0.0,
        next_free_micros: (T0 + 10_000_000) as f64,
        permits_per_second: 5.0,
        max_permits: 5.0,
        expires_micros: (T0 + 60_000_000) as f64,
        last_now_micros: T0 as f64,
        next_free_fraction: 12_345,
    }
}

#[test]
fn unrecognised_values_are_an_error_in_every_mode_and_left_untouched() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    let valid = valid_state();
    // Sanity: the valid state is read as is (10 s of debt), in every format.
    for value in [valid.encode(), valid.encode_thr1(), valid.encode_v0()] {
        fx.set_bytes("valid", &value);
        assert_eq!(fx.run("valid", &args.clone().query()), 10_000_000);
    }

    let v1 = valid.encode();
    let mut no_marker = v1.clone();
    no_marker[..4].copy_from_slice(b"THR2");
    let mut other_marker = v1.clone();
    other_marker[..4].copy_from_slice(b"thr3");
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("someone else's string".into(), b"garbage".to_vec()),
        ("empty".into(), vec![]),
        ("one byte".into(), vec![0]),
        ("v1 one byte short".into(), v1[..STATE_LEN - 1].to_vec()),
        ("v1 one byte long".into(), [&v1[..], &[0]].concat()),
        (
            "v0 one byte short".into(),
            v1[4..4 + V0_STATE_LEN - 1].to_vec(),
        ),
        (
            "v0 one byte long".into(),
            v1[4..4 + V0_STATE_LEN + 1].to_vec(),
        ),
        ("52 bytes of text".into(), vec![b'7'; STATE_LEN]),
        ("40 bytes of text".into(), vec![b'7'; V0_STATE_LEN]),
        ("40 bytes of NaN".into(), [0xff; V0_STATE_LEN].to_vec()),
        ("76 bytes, marker THR2".into(), no_marker),
        ("76 bytes, marker thr3".into(), other_marker),
        (
            "v1 fields without the marker, padded".into(),
            [&v1[4..], &[0; 4]].concat(),
        ),
        ("64 bytes (a token)".into(), vec![0; TOKEN_LEN]),
    ];
    for (name, corrupt) in CORRUPTIONS {
        let mut state = valid;
        corrupt(&mut state);
        cases.push((format!("thr2 {name}"), state.encode()));
        cases.push((format!("thr1 {name}"), state.encode_thr1()));
        cases.push((format!("v0 {name}"), state.encode_v0()));
    }
    // A malformed field 7 (the ticket's fraction and the record's).
    for raw in BAD_FRACTIONS {
        let mut value = valid.encode();
        set_fractions_field(&mut value, *raw);
        cases.push((format!("thr2 field 7 = {raw:e}"), value));
    }
    let last_now: &[(&str, Corruption)] = &[
        ("last_now 1.5", |s| s.last_now_micros = 1.5),
        ("last_now -1", |s| s.last_now_micros = -1.0),
        ("last_now nan", |s| s.last_now_micros = f64::NAN),
        ("last_now inf", |s| s.last_now_micros = f64::INFINITY),
        ("last_now 2^53 + 2", |s| {
            s.last_now_micros = (MAX_MICROS + 2) as f64
        }),
    ];
    for (name, corrupt) in last_now {
        let mut state = valid;
        corrupt(&mut state);
        cases.push((format!("thr2 {name}"), state.encode()));
        cases.push((format!("thr1 {name}"), state.encode_thr1()));
    }
    for (i, (name, value)) in cases.iter().enumerate() {
        let key = format!("c{i}");
        fx.set_bytes(&key, value);
        fx.pexpire(&key, 100_000);
        let dump = fx.dump(&key);
        for mode in every_mode(&args) {
            let error = fx.run_err(&[&key], &mode.to_vec());
            assert_unrecognised(&error, &format!("{name}, {mode:?}"));
            assert!(
                error.contains(&format!("key {key} "))
                    && error.contains(&format!("({} bytes)", value.len())),
                "{name}: {error}"
            );
            assert_eq!(fx.raw(&key), *value, "{name}, {mode:?}: the value changed");
            assert_eq!(fx.dump(&key), dump, "{name}, {mode:?}: the key changed");
        }
        let pttl = fx.pttl(&key);
        assert!((90_000..=100_000).contains(&pttl), "{name}: PTTL {pttl}");
    }
}

#[test]
fn older_values_are_read_and_upgraded_in_place() {
    let mut fx = fixture();
    // 3/s: a permit costs 333 333.33 µs, so writes leave a fraction.
    let args = Args::bursty("3", 1_000_000);
    // The same state as thr2 (that has seen no clock, no fraction), as thr1
    // and in the first format (v0); with a TTL from outside that outlasts
    // what the keys need.
    let state = LimiterState {
        stored_permits: 2.5,
        next_free_micros: (T0 + 300_000) as f64,
        permits_per_second: 3.0,
        max_permits: 3.0,
        expires_micros: (T0 + 60_000_000) as f64,
        last_now_micros: 0.0,
        next_free_fraction: 0,
    };
    let keys = ["thr2", "thr1", "v0"];
    fx.set_bytes("thr2", &state.encode());
    fx.set_bytes("thr1", &state.encode_thr1());
    fx.set_bytes("v0", &state.encode_v0());
    assert_eq!(&fx.raw("thr1")[..4], THR1_MARKER);
    assert_eq!(fx.raw("thr1").len(), STATE_LEN);
    for key in keys {
        fx.pexpire(key, 50_000);
    }

    // A query and a refused try read them and write nothing.
    for key in keys {
        assert_eq!(fx.run(key, &args.clone().query().at(T0)), 300_000);
        assert_eq!(fx.run(key, &args.clone().timeout(0).at(T0)), -1);
    }
    assert_eq!(fx.raw("thr1"), state.encode_thr1());
    assert_eq!(fx.raw("v0"), state.encode_v0());

    // The same calls give the same replies, and from the first write on
    // every old value is a thr2 value with the same fields (the first
    // write's fraction from the ticket read with none).
    let calls = [
        args.clone().at(T0 + 100_000),
        args.clone().permits(3).at(T0 + 500_000),
        args.clone().rate("7").at(T0 + 500_000),
        args.clone().timeout(0).at(T0 + 600_000),
        args.clone().at(T0 + 5_000_000),
    ];
    for (i, call) in calls.iter().enumerate() {
        let replies: Vec<Reply> = keys.iter().map(|key| fx.call(key, call)).collect();
        assert_eq!(replies[1], replies[0], "call {i}: {call:?}");
        assert_eq!(replies[2], replies[0], "call {i}: {call:?}");
        let raw = fx.raw("thr2");
        // (thr3 while a reservation waits: the value then has a ledger.)
        assert!(
            &raw[..4] == MARKER || &raw[..4] == THR3_MARKER,
            "call {i}: {raw:?}"
        );
        assert_eq!(fx.raw("thr1"), raw, "call {i}");
        assert_eq!(fx.raw("v0"), raw, "call {i}");
        if i == 2 {
            // The ticket (T0 + 800 ms, read with no fraction) takes one
            // permit at 7/s: 142 857.14 µs, to the nearest 2^-20 µs.
            let state = fx.state("thr1");
            assert_eq!(state.next(), T0 + 942_857);
            assert_eq!(state.next_free_fraction, 149_797);
        }
    }
    // Written with the time it saw; the TTL was kept throughout.
    let upgraded = fx.state("thr1");
    assert_eq!(upgraded.last_now_micros, (T0 + 5_000_000) as f64);
    assert_eq!(upgraded.permits_per_second, 3.0); // 7/s, then back
    for key in keys {
        let pttl = fx.pttl(key);
        assert!((49_000..=50_000).contains(&pttl), "{key}: PTTL {pttl}");
    }
}

#[test]
fn a_thr1_value_reads_with_no_fraction_and_keeps_its_clock() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0);
    // A thr1 value that has seen T0 + 5 s, with a debt of 1 s from then,
    // and the same state in thr2 form (no fraction).
    let state = LimiterState {
        stored_permits: 0.0,
        next_free_micros: (T0 + 6_000_000) as f64,
        permits_per_second: 3.0,
        max_permits: 0.0,
        expires_micros: (T0 + 60_000_000) as f64,
        last_now_micros: (T0 + 5_000_000) as f64,
        next_free_fraction: 0,
    };
    fx.set_bytes("thr1", &state.encode_thr1());
    fx.set_bytes("thr2", &state.encode());
    // Its clock stands (a call at T0 reads T0 + 5 s): the same replies,
    // byte for byte (a granted reservation's is the value it wrote).
    for call in [
        args.clone().query().at(T0),
        args.clone().timeout(999_999).at(T0),
        args.clone().at(T0),
        args.clone().at(T0 + 5_500_000),
    ] {
        let on_thr1 = fx.call("thr1", &call);
        assert_eq!(on_thr1, fx.call("thr2", &call), "{call:?}");
    }
    assert_eq!(fx.raw("thr1"), fx.raw("thr2"));
    // Two permits charged from T0 + 6 s, each 333 333.33 µs to the nearest
    // 2^-20 µs (349 525 units past the µs): 699 050 units past T0 + 6.67 s.
    let state = fx.state("thr1");
    assert_eq!(state.next(), T0 + 6_666_666);
    assert_eq!(state.next_free_fraction, 699_050);
    assert_eq!(state.last_now_micros, (T0 + 5_500_000) as f64);
}

// ---------------------------------------------------------------------------
// The clock
// ---------------------------------------------------------------------------

#[test]
fn time_going_backwards_reads_as_the_latest_time() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0); // no burst: 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next: T0 + 400 ms
    let before = fx.raw("k");

    // 10 s back reads as T0: the debt is 400 ms, not 10.4 s.
    let back = T0 - 10_000_000;
    assert_eq!(fx.call("k", &args.clone().query().at(back)).debt, 400_000);
    assert_eq!(
        fx.call("k", &args.clone().timeout(399_999).at(back)).debt,
        400_000
    );
    assert_eq!(fx.raw("k"), before, "a query or a refused try wrote");
    assert_eq!(
        fx.run("k", &args.clone().timeout(400_000).at(back)),
        400_000
    );
    let state = fx.state("k");
    assert_eq!(state.next(), T0 + 600_000);
    assert_eq!(state.last_now_micros, T0 as f64);
    // The TTL is counted on the clock as read: until that clock reaches the
    // ticket (10.6 s, + 2 ms), plus 1 s of slack.
    assert_eq!(state.expires_micros, (back + 11_602_000) as f64);
    let pttl = fx.pttl("k");
    assert!((11_500..=11_602).contains(&pttl), "PTTL {pttl}");

    // Forward again, but not past T0 + 600 ms, then back a little: the
    // latest time stands.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 500_000);
    assert_eq!(fx.run("k", &args.clone().query().at(T0 + 50_000)), 700_000);
    assert_eq!(fx.run("k", &args.clone().query().at(0)), 700_000);
    assert_eq!(fx.state("k").last_now_micros, (T0 + 100_000) as f64);

    // A step forwards reads as idle time: at most one burst.
    let burst = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("f", &burst.clone().permits(5).at(T0)), 0);
    let later = T0 + 3_600_000_000;
    assert_eq!(
        fx.call("f", &burst.clone().permits(6).at(later)).debt,
        200_000
    );
    // And back to T0 + 1 s: still an hour later, 200 ms of debt.
    assert_eq!(fx.run("f", &burst.clone().at(T0 + 1_000_000)), 200_000);
}

// ---------------------------------------------------------------------------
// Probe
// ---------------------------------------------------------------------------

/// Writes to the dataset since the server started (`rdb_changes_since_last_save`).
fn changes(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("persistence").query(con).unwrap();
    info.lines()
        .find_map(|line| line.trim().strip_prefix("rdb_changes_since_last_save:"))
        .expect("rdb_changes_since_last_save in INFO")
        .parse()
        .unwrap()
}

#[test]
fn probe_writes_the_same_bytes_and_keeps_the_ttl() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000); // next: T0 + 400 ms
    fx.pexpire("k", 50_000);
    let before = fx.raw("k");
    // Later, earlier, at another rate, with a timeout: the value is written
    // back as it is, and the reply is the debt.
    for (now, rate, timeout, debt) in [
        (T0 + 100_000, "5", "-1", 300_000),
        (T0 - 1_000_000, "5", "-1", 400_000),
        (T0 + 100_000, "50", "0", 300_000),
        (T0 + 1_000_000, "5", "-1", 0),
    ] {
        let writes = changes(&mut fx.con);
        let reply = fx.call(
            "k",
            &args.clone().rate(rate).timeout(timeout).probe().at(now),
        );
        assert_eq!(
            reply,
            Reply {
                first: debt,
                debt,
                token: None
            },
            "at {now}"
        );
        assert_eq!(changes(&mut fx.con), writes + 1, "the probe did not write");
        assert_eq!(fx.raw("k"), before, "the probe changed the value");
    }
    let pttl = fx.pttl("k");
    assert!((49_000..=50_000).contains(&pttl), "PTTL {pttl}");
    // Without a TTL, none is set.
    fx.persist("k");
    assert_eq!(fx.run("k", &args.clone().probe().at(T0)), 400_000);
    assert_eq!(fx.pttl("k"), -1);
    assert_eq!(fx.raw("k"), before);
    // A query does not write.
    let writes = changes(&mut fx.con);
    assert_eq!(fx.run("k", &args.clone().query().at(T0)), 400_000);
    assert_eq!(changes(&mut fx.con), writes);

    // A value in an older format is written in its thr2 form: the same
    // fields (a v0 value has seen no clock yet), no fraction, a record of
    // nothing, the same TTL. Read as it was, it writes the same bytes as
    // the thr2 form does from then on.
    let old = LimiterState {
        stored_permits: 1.5,
        next_free_micros: (T0 + 300_000) as f64,
        permits_per_second: 5.0,
        max_permits: 5.0,
        expires_micros: (T0 + 60_000_000) as f64,
        last_now_micros: 0.0,
        next_free_fraction: 0,
    };
    let thr1 = LimiterState {
        last_now_micros: (T0 - 1_000) as f64,
        ..old
    };
    fx.set_bytes("v0", &old.encode_v0());
    fx.set_bytes("thr1", &thr1.encode_thr1());
    fx.set_bytes("thr2", &thr1.encode());
    for (key, thr2_form) in [("v0", old.encode()), ("thr1", thr1.encode())] {
        fx.pexpire(key, 50_000);
        let writes = changes(&mut fx.con);
        assert_eq!(fx.call(key, &args.clone().probe().at(T0)).debt, 300_000);
        assert_eq!(
            changes(&mut fx.con),
            writes + 1,
            "{key}: the probe did not write"
        );
        assert_eq!(fx.raw(key), thr2_form, "{key}");
        assert_eq!(&fx.raw(key)[..4], MARKER, "{key}");
        let pttl = fx.pttl(key);
        assert!((49_000..=50_000).contains(&pttl), "{key}: PTTL {pttl}");
    }
    let call = args.clone().rate("3").at(T0 + 100_000);
    assert_eq!(fx.call("thr1", &call), fx.call("thr2", &call));
    assert_eq!(fx.raw("thr1"), fx.raw("thr2"));
}

#[test]
fn probe_of_a_missing_key_writes_it_as_it_reads() {
    let mut fx = fixture();
    fx.script.load(&mut fx.con).expect("SCRIPT LOAD");
    let args = Args::bursty("5", 1_000_000).probe().at(T0);
    // One transaction, so that the 4 ms TTL cannot end between the calls.
    let mut invocation = fx.script.prepare_invoke();
    invocation.key("m");
    for arg in args.to_vec() {
        invocation.arg(arg);
    }
    let (reply, value, pttl): (Value, Vec<u8>, i64) = redis::pipe()
        .atomic()
        .invoke_script(&invocation)
        .cmd("GET")
        .arg("m")
        .cmd("PTTL")
        .arg("m")
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(
        Reply::decode(reply).unwrap(),
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    // Full, ticket now; it needs no time at all (+ 2 ms), and gets twice that.
    assert_eq!(
        LimiterState::decode(&value).unwrap(),
        LimiterState {
            stored_permits: 5.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            expires_micros: (T0 + 4_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    assert!((0..=4).contains(&pttl), "PTTL {pttl}");
    // Whether or not it is still there, it reads as a missing key.
    assert_eq!(fx.run("m", &Args::bursty("5", 1_000_000).at(T0)), 0);
    assert_eq!(fx.state("m").stored_permits, 4.0);
}

#[test]
fn probe_fails_with_oom_when_the_server_is_full() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    fx.persist("k");
    fx.set_bytes("filler", &[b'x'; 1_000]);
    let dump = fx.dump("k");
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut fx.con)
            .unwrap();
    }
    for key in ["k", "missing"] {
        for call in [args.clone().probe(), args.clone(), args.clone().resume(0)] {
            let error = fx.run_err(&[key], &call.to_vec());
            assert!(error.contains("OOM"), "{key}, {call:?}: {error}");
        }
    }
    // A query writes nothing, so it still answers.
    assert_eq!(fx.run("k", &args.clone().query()), 0);
    assert_eq!(fx.dump("k"), dump);
    assert!(!fx.exists("missing"));

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut fx.con)
        .unwrap();
    assert_eq!(fx.run("k", &args.clone().probe()), 0);
}

/// A port that was free a moment ago.
fn any_free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

#[test]
fn probe_fails_with_readonly_on_a_replica() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000).at(T0);
    assert_eq!(fx.run("k", &args), 0);
    fx.persist("k");
    let port = fx.server.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port], any_free_port);
    let mut con = replica.connection();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .unwrap();
        let up = info
            .lines()
            .any(|line| line.trim() == "master_link_status:up");
        let synced: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
        if up && synced == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not sync: {info}"
        );
        sleep(Duration::from_millis(20));
    }
    let value: Vec<u8> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, fx.raw("k"));

    for key in ["k", "missing"] {
        for call in [args.clone().probe(), args.clone(), args.clone().resume(0)] {
            let error = eval_on(&fx.script, &mut con, &[key], &call.to_vec())
                .map(|reply| panic!("{key}, {call:?}: expected READONLY, got {reply:?}"))
                .unwrap_err();
            let error = server_error(&error);
            assert!(error.contains("READONLY"), "{key}, {call:?}: {error}");
        }
    }
    // A query writes nothing, so a replica answers it.
    let reply = eval_on(&fx.script, &mut con, &["k"], &args.clone().query().to_vec()).unwrap();
    assert_eq!(
        Reply::decode(reply).unwrap(),
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
}

// ---------------------------------------------------------------------------
// Resume
// ---------------------------------------------------------------------------

#[test]
fn resume_drains_stored_permits_and_applies_the_debt() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    // A missing key: written without stored permits, so no burst after an
    // outage.
    let reply = fx.call("m", &args.clone().resume(0).at(T0));
    assert_eq!(
        reply,
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    assert_eq!(
        fx.state("m"),
        LimiterState {
            stored_permits: 0.0,
            next_free_micros: T0 as f64,
            permits_per_second: 5.0,
            max_permits: 5.0,
            // 5 permits to refill at 200 ms: 1 s + 2 ms, and 1 s of slack.
            expires_micros: (T0 + 2_002_000) as f64,
            last_now_micros: T0 as f64,
            next_free_fraction: 0,
        }
    );
    assert!(fx.pttl("m") > 1_900);
    assert_eq!(fx.run("m", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("m", &args.clone().at(T0)), 200_000);

    // Stored permits (4, and 0.5 more after 100 ms) are dropped; the debt
    // run up locally is added to the ticket, which the resync brought to now.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let reply = fx.call("k", &args.clone().resume(1_000_000).at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (1_000_000, 1_000_000));
    let state = fx.state("k");
    assert_eq!(state.stored_permits, 0.0);
    assert_eq!(state.next(), T0 + 1_100_000);
    assert_eq!(state.last_now_micros, (T0 + 100_000) as f64);
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 1_000_000);
    // A debt is added to the key's own (reservations made through Redis
    // meanwhile, by other processes or late ones a cancel may still take
    // out), not merged with it.
    let reply = fx.call("k", &args.clone().resume(500_000).at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (1_700_000, 1_700_000));
    assert_eq!(fx.state("k").next(), T0 + 1_800_000);

    // At a new rate: the rate change is applied first.
    let reply = fx.call("k", &args.clone().rate("10").resume(0).at(T0 + 10_000_000));
    assert_eq!((reply.first, reply.debt), (0, 0));
    let state = fx.state("k");
    assert_eq!((state.permits_per_second, state.max_permits), (10.0, 10.0));
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 10_000_000));

    // A debt beyond 2^53 saturates.
    let reply = fx.call(
        "k",
        &args
            .clone()
            .rate("10")
            .resume("100000000000000000000")
            .at(T0 + 10_000_000),
    );
    let expected = i64::try_from(MAX_MICROS - T0 - 10_000_000).unwrap();
    assert_eq!((reply.first, reply.debt), (expected, expected));
    assert_eq!(fx.state("k").next(), MAX_MICROS);
}

#[test]
fn resume_keeps_the_fraction_below_2_pow_53_and_drops_it_there() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0); // T0 + 333 333 µs, 349 525 units
    // A debt moves the ticket's whole µs; the fraction stays.
    assert_eq!(fx.run("k", &args.clone().resume(1_000).at(T0)), 334_333);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 334_333, 349_525)
    );
    // A ticket that reaches 2^53 is 2^53, with no fraction (as a charge's).
    let to_the_end = MAX_MICROS - (T0 + 334_333);
    let debt = i64::try_from(MAX_MICROS - T0).unwrap();
    assert_eq!(fx.run("k", &args.clone().resume(to_the_end).at(T0)), debt);
    let state = fx.state("k");
    assert_eq!((state.next(), state.next_free_fraction), (MAX_MICROS, 0));
    // A resync moves the ticket to now, with no fraction.
    assert_eq!(fx.run("r", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("r", &args.clone().resume(0).at(T0 + 400_000)), 0);
    let state = fx.state("r");
    assert_eq!((state.next(), state.next_free_fraction), (T0 + 400_000, 0));
}

// ---------------------------------------------------------------------------
// Cancel
// ---------------------------------------------------------------------------

#[test]
fn a_resume_and_the_cancels_of_late_reservations_commute() {
    // Reservations that reach Redis after the limiter switched to its
    // fallback are given back when their replies come; the probe's resume
    // may land before or after those give-backs. Either way the key ends
    // with the fallback's debt on top of what it held before them.
    let mut fx = fixture();
    let args = Args::bursty("10", 0).held();
    let late = |fx: &mut Fixture, key: &str| {
        assert_eq!(fx.run(key, &args.clone().at(T0)), 0); // ticket T0 + 100 ms
        let tokens: Vec<Vec<u8>> = (0..2)
            .map(|_| fx.call(key, &args.clone().at(T0)).token.unwrap())
            .collect();
        assert_eq!(fx.state(key).next(), T0 + 300_000);
        tokens
    };
    let resume = args.clone().resume(500_000).at(T0 + 10_000);

    // Resume first: the cancels return their charges from the raised ticket.
    let tokens = late(&mut fx, "a");
    fx.call("a", &resume);
    for token in tokens.iter().rev() {
        assert_eq!(fx.run("a", &args.clone().cancel(token).at(T0 + 20_000)), 2);
    }
    // Cancels first: the newest is the latest, so it restores; the other
    // then finds the given-back one's request in the ledger after it (a
    // request that was made), so it returns its charge, through the
    // ledger: the same state.
    let tokens = late(&mut fx, "b");
    let outcomes: Vec<i64> = tokens
        .iter()
        .rev()
        .map(|token| fx.run("b", &args.clone().cancel(token).at(T0 + 10_000)))
        .collect();
    assert_eq!(outcomes, [1, 2]);
    assert_eq!(fx.state("b").next(), T0 + 100_000);
    fx.call("b", &resume);

    assert_eq!(fx.state("a").next(), T0 + 600_000);
    assert_eq!(fx.state("b").next(), T0 + 600_000);
}

#[test]
fn cancel_of_the_latest_reservation_restores_the_state_it_found() {
    let mut fx = fixture();
    let args = Args::bursty("5", 1_000_000);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0); // 4 stored, ticket T0
    let found = fx.state("k");
    // 100 ms later: 4.5 stored spent, 1.5 fresh charged (300 ms).
    let reply = fx.call("k", &args.clone().permits(6).at(T0 + 100_000));
    assert_eq!((reply.first, reply.debt), (0, 300_000));
    let token = reply.token.clone().unwrap();
    assert_eq!(reply.token().stored_before, 4.0);
    assert_eq!(reply.token().next_free_before, T0 as f64);

    let cancel = fx.call("k", &args.clone().cancel(&token).at(T0 + 300_000));
    assert_eq!(
        cancel,
        Reply {
            first: 1,
            debt: 1,
            token: None
        }
    );
    let state = fx.state("k");
    assert_eq!(
        state,
        LimiterState {
            // The TTL the reservation set outlasts what the key needs (it
            // is full again by now): kept.
            expires_micros: (T0 + 2_402_000) as f64,
            last_now_micros: (T0 + 300_000) as f64,
            ..found
        }
    );
    // As if it had never been made: 300 ms after T0 the limiter is full.
    assert_eq!(fx.call("k", &args.clone().at(T0 + 300_000)).debt, 0);
    assert_eq!(fx.state("k").stored_permits, 4.0);

    // Cancelling it again gives nothing back (it is no longer the latest,
    // and its moment has passed), and writes nothing.
    let dump = fx.dump("k");
    let again = fx.call("k", &args.clone().cancel(&token).at(T0 + 300_000));
    assert_eq!(
        again,
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    assert_eq!(fx.dump("k"), dump);
}

#[test]
fn cancel_of_an_earlier_reservation_returns_its_charge() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).held(); // no burst: 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    assert_eq!(b.first, 200_000);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 400_000); // next: T0 + 600 ms

    let cancel = fx.call(
        "k",
        &args
            .clone()
            .cancel(b.token.as_ref().unwrap())
            .at(T0 + 100_000),
    );
    assert_eq!(
        cancel,
        Reply {
            first: 2,
            debt: 2,
            token: None
        }
    );
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 400_000));
    assert_eq!(state.last_now_micros, (T0 + 100_000) as f64);
    // The next caller is scheduled as if it had never been made.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 100_000)), 300_000);
}

#[test]
fn a_waiter_given_back_after_another_never_lets_the_next_caller_in_early() {
    // The scenario of `Ledger`'s documentation, in Redis: 1 permit/s, one
    // second of burst. A and B hold an hour each; A is given back, B keeps
    // its slot. Half an hour later a limiter that never made A and B is
    // idle, so S and ten more go at 1800 s to 1810 s there; here they wait
    // behind B. When B is given back too, the next caller goes at 1810 s.
    // Moving the ticket back by B's whole charge sent it at 1801 s.
    const S: u64 = 1_000_000;
    let mut fx = fixture();
    let args = Args::bursty("1", S);
    let held = args.clone().held();
    // The key reads as idle: its one stored permit, then one second.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let a = fx.call("k", &held.clone().permits("3600+").at(T0)); // waits 1 s
    let b = fx.call("k", &held.clone().permits("3600+").at(T0)); // until 3601 s
    assert_eq!((a.first, b.first), (S as i64, 3601 * S as i64));
    let give_a = args.clone().cancel(a.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &give_a.at(T0 + S / 2)), 2);
    // S (at 1800 s, behind B) and ten more.
    assert_eq!(
        fx.run("k", &args.clone().at(T0 + 1800 * S)),
        1801 * S as i64
    );
    for _ in 0..10 {
        fx.run("k", &args.clone().at(T0 + 1800 * S));
    }
    let give_b = args.clone().cancel(b.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &give_b.at(T0 + 1801 * S)), 2);
    assert_eq!(fx.run("k", &args.clone().at(T0 + 1801 * S)), 9 * S as i64);
    assert_eq!(fx.state("k").next(), T0 + 1811 * S);
}

#[test]
fn an_earlier_reservation_not_held_returns_only_what_the_ledger_knows() {
    // A reservation made without `+` (its caller was not going to give it
    // back: `reserve`, `try_reserve`) gets no group. Given back anyway (its
    // round trip was abandoned) once it is no longer the latest, it returns
    // what the ledger knows lies before it: here nothing. It errs towards
    // limiting, never towards granting twice.
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    assert_eq!(b.token.as_ref().unwrap().len(), TOKEN_LEN);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 400_000);
    assert_eq!(ledger_groups(&fx.raw("k")), None);
    let cancel = args.clone().cancel(b.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &cancel.at(T0 + 100_000)), 2);
    assert_eq!(fx.state("k").next(), T0 + 600_000);
    // The latest one, though, is undone exactly.
    let c = fx.call("k", &args.clone().at(T0 + 100_000));
    let cancel = args.clone().cancel(c.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &cancel.at(T0 + 100_000)), 1);
    assert_eq!(fx.state("k").next(), T0 + 600_000);
}

#[test]
fn cancel_of_the_latest_reservation_restores_the_fraction_too() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0).at(T0);
    assert_eq!(fx.run("k", &args), 0); // T0 + 333 333 µs, 349 525 units
    let found = fx.state("k");
    let b = fx.call("k", &args); // T0 + 666 666 µs, 699 050 units
    assert_eq!(b.token().fraction_before, 349_525);
    assert_eq!(b.token().state.next_free_fraction, 699_050);
    assert_eq!(
        fx.run("k", &args.clone().cancel(b.token.as_ref().unwrap())),
        1
    );
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (found.next(), found.next_free_fraction)
    );
}

#[test]
fn a_returned_charge_is_whole_micros_rounded_down() {
    let mut fx = fixture();
    let args = Args::bursty("3", 0).held().at(T0);
    // Five reservations: the ticket after the k-th is k × 349 525 333 333
    // units (333 333.33 µs each, to 2^-20 µs). The fourth goes from T0 +
    // 999 999 µs and 1 048 575 units to T0 + 1 333 333 µs and 349 524
    // units: 333 333.33 µs, i.e. 333 333 whole µs (not 333 334).
    let tokens: Vec<Vec<u8>> = (0..5).map(|_| fx.call("k", &args).token.unwrap()).collect();
    let fourth = Token::decode(&tokens[3]).unwrap();
    assert_eq!(
        (fourth.next_free_before, fourth.fraction_before),
        ((T0 + 999_999) as f64, 1_048_575)
    );
    assert_eq!(
        (fourth.state.next(), fourth.state.next_free_fraction),
        (T0 + 1_333_333, 349_524)
    );
    // Not the latest: its charge is returned, whole µs only; the ticket's
    // fraction stays.
    assert_eq!(fx.run("k", &args.clone().cancel(&tokens[3]).at(T0 + 1)), 2);
    let state = fx.state("k");
    assert_eq!(
        (state.next(), state.next_free_fraction),
        (T0 + 1_666_666 - 333_333, 699_049)
    );
}

#[test]
fn a_returned_charge_may_take_the_ticket_behind_now() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0).held(); // 200 ms per permit
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let a = fx.call("k", &args.clone().at(T0)); // waits until T0 + 200 ms
    let b = fx.call("k", &args.clone().at(T0)); // waits until T0 + 400 ms
    assert_eq!((a.first, b.first), (200_000, 400_000));
    // Both wait, so both have a group in the key's ledger.
    assert_eq!(ledger_groups(&fx.raw("k")), Some(2));
    // A goes first: the ticket moves back from T0 + 600 ms to 400 ms.
    let cancel_a = args.clone().cancel(a.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &cancel_a.at(T0 + 100_000)), 2);
    assert_eq!(fx.state("k").next(), T0 + 400_000);
    // Then B, at T0 + 300 ms, before its moment: its 200 ms take the ticket
    // to T0 + 200 ms, behind now, where a limiter that never made A and B
    // has it (`Ledger::give_back`): the key reads as idle since then.
    let cancel_b = args.clone().cancel(b.token.as_ref().unwrap());
    assert_eq!(fx.run("k", &cancel_b.at(T0 + 300_000)), 2);
    assert_eq!(fx.state("k").next(), T0 + 200_000);
    // Nothing waits any more, but the ledger stays until B's moment has
    // passed (its horizon), so that no token meets a later ledger's ids.
    assert_eq!(ledger_groups(&fx.raw("k")), Some(0));
    // The next caller goes at once, and the value loses its ledger once
    // the horizon has passed.
    assert_eq!(fx.run("k", &args.clone().at(T0 + 300_000)), 0);
    assert_eq!(fx.state("k").next(), T0 + 500_000);
    assert_eq!(fx.run("k", &args.clone().at(T0 + 500_000)), 0);
    assert_eq!(ledger_groups(&fx.raw("k")), None);
    assert_eq!(&fx.raw("k")[..4], MARKER);
}

#[test]
fn cancel_gives_nothing_back_when_it_cannot() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);

    // A missing key: nothing, and still missing.
    let a = fx.call("k", &args.clone().at(T0));
    let a_token = a.token.clone().unwrap();
    let missing = fx.call("missing", &args.clone().cancel(&a_token).at(T0));
    assert_eq!(
        missing,
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    assert!(!fx.exists("missing"));

    // Not the latest, and its moment has come: nothing.
    assert_eq!(fx.run("k", &args.clone().at(T0)), 200_000);
    fx.persist("k");
    let dump = fx.dump("k");
    let nothing = fx.call("k", &args.clone().cancel(&a_token).at(T0));
    assert_eq!(
        nothing,
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    assert_eq!(fx.dump("k"), dump);
    assert_eq!(fx.pttl("k"), -1);

    // Not the latest, and it spent stored permits (a cold warming-up
    // limiter has a ticket ahead and permits stored): nothing.
    let warm = Args::warming_up("2", 4_000_000, "3");
    assert_eq!(fx.run("w", &warm.clone().at(T0)), 0);
    let second = fx.call("w", &warm.clone().at(T0));
    assert_eq!(second.first, 1_375_000);
    assert!(second.token().spent_stored);
    assert_eq!(fx.run("w", &warm.clone().at(T0)), 2_500_000);
    fx.persist("w");
    let dump = fx.dump("w");
    let nothing = fx.call(
        "w",
        &warm.clone().cancel(second.token.as_ref().unwrap()).at(T0),
    );
    assert_eq!(
        nothing,
        Reply {
            first: 0,
            debt: 0,
            token: None
        }
    );
    assert_eq!(fx.dump("w"), dump);

    // A malformed token is an error, and writes nothing.
    let mut bad = second.token.clone().unwrap();
    set_fractions_field(&mut bad, 0.5); // field 7, which holds spent_stored
    let error = fx.run_err(&["w"], &warm.clone().cancel(&bad).at(T0).to_vec());
    assert!(
        error.contains("ERR paceline:") && error.contains("token"),
        "{error}"
    );
    assert_eq!(fx.dump("w"), dump);
}

#[test]
fn cancel_across_a_rate_change_neither_restores_nor_returns() {
    let mut fx = fixture();
    let args = Args::bursty("5", 0);
    assert_eq!(fx.run("k", &args.clone().at(T0)), 0);
    let b = fx.call("k", &args.clone().at(T0)); // the latest: next T0 + 400 ms
    // A resume at 10/s changes the rate and nothing else (no stored permits,
    // the ticket ahead).
    assert_eq!(
        fx.run("k", &args.clone().rate("10").resume(0).at(T0)),
        400_000
    );
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 400_000));
    assert_eq!(state.permits_per_second, 10.0);
    // So the state is the one the reservation left, but at another rate: it
    // is not put back. Nor is its charge returned: the rate change emptied
    // the ledger, which errs late, and so gives back what was reserved
    // before it since the change: nothing. A cancel applies no rate change
    // (ARGV[3] says 5 here).
    let cancel = fx.call("k", &args.clone().cancel(b.token.as_ref().unwrap()).at(T0));
    assert_eq!(
        cancel,
        Reply {
            first: 2,
            debt: 2,
            token: None
        }
    );
    let state = fx.state("k");
    assert_eq!((state.stored_permits, state.next()), (0.0, T0 + 400_000));
    assert_eq!((state.permits_per_second, state.max_permits), (10.0, 0.0));
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
