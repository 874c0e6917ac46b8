//! The script (`lua/`) against a real Redis server, with one limit unless a
//! test says otherwise: the interface (modes, arguments, replies, errors),
//! what it writes and what it must not write, the value format and values
//! that are not this limiter's, the clock, number precision (the ticket's
//! fraction below the microsecond included), expiry, and the cold modes
//! (probe, resume, cancel). Expected waits are derived by hand from the
//! rules in `paceline::core`; the differential test holds the script to
//! the core on random sequences. `calls` holds the modes of calls to an
//! upstream: call, settle, keep and learn.

mod calls;
mod cold;
mod give_back;
mod reserve;
mod values;

use crate::support::limiter_state::{LimitState, LimiterState, Reserved, Value as Stored, script};
use crate::support::redis_server::RedisServer;
use redis::Value;

/// A realistic "now": microseconds since the epoch, late 2023.
const T0: u64 = 1_700_000_000_000_000;
/// 2^53, where time saturates.
const MAX_MICROS: u64 = 1 << 53;
/// The script's TTL cap, in milliseconds: floor(2^53 / 1000).
const TTL_CAP_MS: i64 = 9_007_199_254_740;
/// A one-limit value's length, without a log: the marker, the hot part,
/// the TTL's end, the rate and max_permits.
const VALUE_LEN: usize = 84;
/// A one-limit value's hot part: the head and the limit's state.
const HOT_LEN: usize = 56;

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

/// The script's ARGV for one limit, with defaults: reserve 1 permit, no
/// timeout, server clock.
#[derive(Debug, Clone)]
struct Args {
    /// ARGV[1]: permits, or the mode.
    permits: String,
    /// ARGV[2]: timeout, debt or id.
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

    /// A reservation its caller may give back (`n+`): if it waits, the key
    /// logs it with an id.
    fn held(mut self) -> Args {
        self.permits.push('+');
        self
    }

    /// A probe (ARGV[2] stays as it was: -1 unless set).
    fn probe(self) -> Args {
        self.permits("probe")
    }

    fn status(self) -> Args {
        self.permits("status")
    }

    /// A resume with this debt.
    fn resume(self, debt_micros: impl ToString) -> Args {
        let mut args = self.permits("resume");
        args.arg2 = debt_micros.to_string().into_bytes();
        args
    }

    /// A give-back of the held reservation with this id.
    fn cancel(self, id: impl ToString) -> Args {
        let mut args = self.permits("give_back");
        args.arg2 = id.to_string().into_bytes();
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

/// A reply, decoded: a granted reservation's value, a refused try's state,
/// or an integer (the debt; a cancel's outcome).
#[derive(Debug, Clone, PartialEq)]
struct Reply {
    /// The wait, -1 for a refused try, the debt for a probe or a resume; for a cancel 1 (given back) or 0 (nothing).
    first: i64,
    /// The key's debt after the call (a cancel: its outcome again).
    debt: i64,
    /// A granted reservation's reply: the value it wrote.
    value: Option<Vec<u8>>,
}

impl Reply {
    /// `reservation`: the call reserved (a negative integer is then a
    /// refused try's wait, negated).
    fn decode(value: Value, reservation: bool) -> Result<Reply, String> {
        let refused = |refused: Reserved| Reply {
            first: -1,
            debt: refused.refused_wait().unwrap() as i64,
            value: None,
        };
        match value {
            Value::BulkString(bytes) => match Reserved::decode(&bytes, 1)? {
                Reserved::Granted { wait, debt, .. } => Ok(Reply {
                    first: wait as i64,
                    debt: debt as i64,
                    value: Some(bytes),
                }),
                state => Ok(refused(state)),
            },
            Value::Int(n) if n < 0 && reservation => Ok(refused(Reserved::from_reply(&value, 1)?)),
            Value::Int(n) => Ok(Reply {
                first: n,
                debt: n,
                value: None,
            }),
            other => Err(format!("expected a value or an integer, got {other:?}")),
        }
    }

    /// The value a grant wrote; panics if it is not one.
    fn stored(&self) -> Stored {
        Stored::decode(self.value.as_deref().expect("a grant")).unwrap()
    }

    /// The id of a held reservation that waits: the one before the value's
    /// next id.
    fn id(&self) -> u64 {
        assert!(self.first > 0, "a reservation that waits: {self:?}");
        self.stored().next_id as u64 - 1
    }
}

impl Fixture {
    /// Runs the script on `keys` with raw arguments.
    fn eval_raw(&mut self, keys: &[&str], argv: &[Vec<u8>]) -> redis::RedisResult<Value> {
        eval_on(&self.script, &mut self.con, keys, argv)
    }

    fn eval(&mut self, key: &str, args: &Args) -> redis::RedisResult<Value> {
        self.eval_raw(&[key], &args.to_vec())
    }

    /// Runs the script, expects a reply and checks its shape against the
    /// mode: a granted reservation replies what it wrote (the whole value,
    /// or from its hot part on) and a debt at least its wait, a refused try a debt, a probe or a
    /// resume its debt.
    fn call(&mut self, key: &str, args: &Args) -> Reply {
        let value = self
            .eval(key, args)
            .unwrap_or_else(|e| panic!("script failed for {args:?}: {e}"));
        let reservation = args
            .permits
            .trim_end_matches('+')
            .parse::<u64>()
            .is_ok_and(|n| n >= 1);
        let reply = Reply::decode(value, reservation).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match args.permits.as_str() {
            _ if reservation && reply.first >= 0 => {
                let value = reply
                    .value
                    .as_deref()
                    .expect("a granted reservation's value");
                // What it wrote: the whole value, or the value from its
                // hot part on.
                let written = self.raw(key);
                let at = if value.starts_with(b"plv1") { 0 } else { 4 };
                assert_eq!(
                    written.get(at..at + value.len()),
                    Some(value),
                    "{args:?}: the reply is what the call wrote"
                );
                assert!(value.len() >= HOT_LEN, "{args:?}: {value:?}");
                assert!(reply.debt >= reply.first, "{args:?}: {reply:?}");
            }
            _ if reservation => {
                assert!(reply.debt > 0, "{args:?}: {reply:?}");
            }
            _ => assert!(
                reply.first == reply.debt && reply.value.is_none(),
                "{args:?}: {reply:?}"
            ),
        }
        reply
    }

    /// Runs the script and returns the first number of its reply: the wait
    /// (-1 for a refused try).
    fn run(&mut self, key: &str, args: &Args) -> i64 {
        self.call(key, args).first
    }

    /// The key's wait as a status reads it at `args` (at its rates, and
    /// its clock if it sets one): the latest ticket less the clock, or 0.
    /// Checks that it wrote nothing.
    fn wait(&mut self, key: &str, args: &Args) -> i64 {
        let before = self.dump(key);
        let reply = self
            .eval(key, &args.clone().status())
            .unwrap_or_else(|e| panic!("status failed for {args:?}: {e}"));
        assert_eq!(self.dump(key), before, "{args:?}: a status wrote");
        match Reserved::from_reply(&reply, 1) {
            Ok(state @ Reserved::Refused { .. }) => state.refused_wait().unwrap() as i64,
            other => panic!("{args:?}: not a status: {other:?}"),
        }
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

    /// The value under `key`, decoded.
    fn value(&mut self, key: &str) -> Stored {
        Stored::read(&mut self.con, key).unwrap_or_else(|| panic!("{key} is missing"))
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
