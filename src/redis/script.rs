//! Calling the limiter's script (`lua/`, its protocol in
//! `docs/redis-protocol.md`): one call type for one limit or several, the
//! arguments written out once per limiter, one round trip per call.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, Value};

use super::connection::Connection;
use crate::core::{Cost, Learning, Lesson, Policy, State, micros};

/// The script's text: the parts of `lua/`, in this order (the protocol
/// names them).
pub(crate) const SOURCE: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/limits.lua"),
    include_str!("../../lua/log.lua"),
    include_str!("../../lua/reserve.lua"),
    include_str!("../../lua/write.lua"),
);

/// The script, hashed once. [`evaluate`] sends EVALSHA and, on NOSCRIPT,
/// EVAL with the text.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// What a limiter's calls tell the script about its limits, written out
/// once when it is built, so that a call formats only what changes with it
/// (ARGV[1] and ARGV[2], and a rate after a change).
#[derive(Debug)]
pub(crate) struct ScriptArgs {
    limits: Box<[LimitArgs]>,
    /// The rates in force, one per limit: a limiter's `set_rate` scales
    /// them, `set_limit_rate` sets one.
    rates: Mutex<Arc<[f64]>>,
}

/// One limit's arguments.
#[derive(Debug)]
struct LimitArgs {
    policy: Policy,
    name: &'static str,
    param_micros: String,
    cold_factor: String,
    /// The rate it was built with, as bits and as text.
    built_rate: (u64, String),
}

impl ScriptArgs {
    /// The arguments of a limiter with these limits (at least one), each a
    /// policy and a rate.
    pub(crate) fn new(limits: &[(Policy, f64)]) -> Self {
        let args = limits.iter().map(|(policy, rate)| {
            let (name, param_micros, cold_factor) = match policy {
                Policy::Bursty(b) => ("bursty", b.max_burst_micros, 0.0),
                Policy::WarmingUp(w) => ("warming_up", w.warmup_micros, w.cold_factor),
            };
            LimitArgs {
                policy: policy.clone(),
                name,
                param_micros: param_micros.to_string(),
                cold_factor: number_text(cold_factor),
                built_rate: (rate.to_bits(), number_text(*rate)),
            }
        });
        ScriptArgs {
            limits: args.collect(),
            rates: Mutex::new(limits.iter().map(|(_, rate)| *rate).collect()),
        }
    }

    /// How many limits.
    pub(crate) fn len(&self) -> usize {
        self.limits.len()
    }

    /// The rates in force, one per limit.
    pub(crate) fn rates(&self) -> Arc<[f64]> {
        Arc::clone(&self.rates.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sets the rates in force (already checked).
    pub(crate) fn set_rates(&self, rates: Arc<[f64]>) {
        *self.rates.lock().unwrap_or_else(PoisonError::into_inner) = rates;
    }

    /// Each limit as a state at `rates` with nothing stored: what a state
    /// read from Redis is taken to (see [`Stored::snapshot`]).
    pub(crate) fn templates(&self, rates: &[f64]) -> Vec<State> {
        self.limits
            .iter()
            .zip(rates)
            .filter_map(|(limit, rate)| State::new(limit.policy.clone(), *rate, 0).ok())
            .collect()
    }
}

/// A number as the script reads it: Rust's shortest round-trip form
/// (`1000.0`, `0.5`, `1e-300`), which Lua's `tonumber` reads back exactly, or
/// `inf`.
fn number_text(value: f64) -> String {
    if value.is_infinite() {
        "inf".to_owned()
    } else {
        format!("{value:?}")
    }
}

/// What a call asks of the script (its modes; see
/// `docs/redis-protocol.md`).
#[derive(Debug, Clone)]
pub(crate) enum Call {
    /// A reservation.
    Reserve(Request),
    /// Prove the script can read and write the key, changing nothing.
    Probe,
    /// Back from a fallback: drop the key's stored permits and carry each
    /// limit's debt, in µs at the shared rates (`Limits::resume`; a missing
    /// one is 0).
    Resume { debts_micros: Box<[u64]> },
    /// Give back the held reservation a reply gave this token.
    GiveBack(LogId),
    /// Reservations applied in order at one clock reading, as the same
    /// calls one by one would be.
    Batch(Box<[Request]>),
    /// Read the key's state as stored, with the server's clock; write
    /// nothing.
    Status,
    /// Reserve `cost` for an open call (`Limits::open`): logged with an id
    /// whatever its wait, and kept open past its moment until settled for
    /// good ([`Call::Keep`]).
    Open {
        cost: Cost,
        timeout: Option<Duration>,
    },
    /// The open call a reply gave this token was charged `charged` and
    /// cost `actual` (`Limits::settle`).
    Settle {
        token: LogId,
        charged: Cost,
        actual: Cost,
    },
    /// The held reservation or open call a reply gave this token will not
    /// be given back nor settled again (`Limits::keep`).
    Keep(LogId),
    /// What the upstream answered to a call (`Limits::learn`), under these
    /// constants.
    Learn {
        lesson: Box<Lesson>,
        learning: Learning,
    },
}

/// A reservation: `permits`; with a timeout, only if the wait fits in it.
/// `held`: its caller may give it back (a [`Reservation`] handed out, an
/// `acquire` that sleeps): if it waits, the script logs it with an id, so
/// that its give-back is exact.
///
/// [`Reservation`]: crate::Reservation
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) permits: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) held: bool,
}

#[cfg(test)]
impl Request {
    /// A request as the tests write one.
    pub(crate) fn of(permits: u32, timeout: Option<Duration>, held: bool) -> Request {
        Request {
            permits,
            timeout,
            held,
        }
    }
}

/// What gives a reservation made in Redis back: the id the script gave it
/// in its key's log.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogId(pub(crate) u64);

impl std::fmt::Debug for LogId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogId(..)")
    }
}

/// What a call of the script answers, decoded: a
/// [`Reply`](super::reply::Reply), a batch's replies, or a status's
/// [`Stored`](super::reply::Stored).
pub(crate) trait Answer: Send + Sized + 'static {
    /// The answer to `call` on a limiter with `limits` limits, or `None` if
    /// the script's reply is not one.
    fn decode(value: Value, call: &Call, limits: usize) -> Option<Self>;

    /// What an answer abandoned by its caller holds that a give-back takes
    /// back, and what Redis reported of the grants it holds that cannot be
    /// (see [`Late`](super::backend::Late)).
    fn tokens(self) -> (Vec<LogId>, Option<Kept>);
}

/// The grants an abandoned answer holds that cannot be given back (no
/// id: not held, or not waiting), as Redis reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kept {
    /// The key's debt after them (µs): where its latest ticket ends,
    /// whoever charged it.
    pub(crate) debt_micros: u64,
    /// What they charged themselves (µs, the latest limit's): each one's
    /// span from its moment to the next grant's of the answer, or to the
    /// debt's end. (The rest of the debt is others': another process's
    /// reservations, this one's reported before.)
    pub(crate) charge_micros: u64,
}

/// Runs the script once (one round trip; two on NOSCRIPT, the second an
/// EVAL of the script's text, routed like the first by its key, which
/// also caches it on that server) and decodes its answer.
pub(crate) async fn invoke<T: Answer>(
    connection: &mut Connection,
    key: &str,
    call: &Call,
    args: &ScriptArgs,
) -> RedisResult<T> {
    let command = |verb: &str, script: &str| command(verb, script, key, call, args);
    let value = evaluate(connection, &SCRIPT, SOURCE, command).await?;
    T::decode(value, call, args.len()).ok_or_else(unexpected)
}

pub(crate) fn unexpected() -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::Parse,
        "paceline: unexpected reply from the limiter script",
    ))
}

/// A script's reply, as Redis gave it: `command` writes the call as
/// EVALSHA with `script`'s hash and, on NOSCRIPT, as EVAL with its text,
/// `source`.
pub(crate) async fn evaluate(
    connection: &mut Connection,
    script: &Script,
    source: &str,
    command: impl Fn(&str, &str) -> Cmd,
) -> RedisResult<Value> {
    match command("EVALSHA", script.get_hash())
        .query_async(connection)
        .await
    {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            command("EVAL", source).query_async(connection).await
        }
        reply => reply,
    }
}

/// `EVALSHA <sha> 1 <key> <ARGV...>` (or `EVAL <source> ...`), written
/// straight into one command buffer: the call, then every limit at its
/// rate in force.
fn command(verb: &str, script: &str, key: &str, call: &Call, args: &ScriptArgs) -> Cmd {
    let limits = &args.limits;
    let mut cmd = Cmd::with_capacity(6 + 4 * limits.len(), 128 + key.len() + script.len());
    cmd.arg(verb).arg(script).arg("1").arg(key);
    call_args(&mut cmd, call, limits.len());
    let rates = args.rates();
    for (limit, rate) in limits.iter().zip(rates.iter()) {
        if rate.to_bits() == limit.built_rate.0 {
            cmd.arg(limit.built_rate.1.as_str());
        } else {
            cmd.arg(number_text(*rate));
        }
        cmd.arg(limit.name)
            .arg(limit.param_micros.as_str())
            .arg(limit.cold_factor.as_str());
    }
    cmd
}

/// ARGV[1] and ARGV[2], the call; a resume carries one debt per limit
/// (`limits` of them, joined by commas).
fn call_args(cmd: &mut Cmd, call: &Call, limits: usize) {
    let costs = |cost: &Cost| joined(limits, |i| cost.get(i).into());
    match call {
        Call::Reserve(Request {
            permits,
            timeout,
            held,
        }) => {
            match (permits, held) {
                (1, false) => cmd.arg("1"),
                (1, true) => cmd.arg("1+"),
                (_, false) => cmd.arg(*permits),
                (_, true) => cmd.arg(format!("{permits}+")),
            };
            match timeout {
                None => cmd.arg("-1"),
                Some(t) => cmd.arg(micros(*t)),
            }
        }
        Call::Probe => cmd.arg("probe").arg("-1"),
        Call::Status => cmd.arg("status").arg("-1"),
        Call::Resume { debts_micros } => {
            let debt = |i| debts_micros.get(i).copied().unwrap_or(0);
            cmd.arg("resume").arg(joined(limits, debt))
        }
        Call::GiveBack(token) => cmd.arg("give_back").arg(token.0),
        Call::Batch(requests) => cmd.arg("batch").arg(batch_text(requests)),
        Call::Open { cost, timeout } => {
            let timeout = timeout.map_or(-1, |t| micros(t) as i64);
            cmd.arg("call").arg(format!("{}:{timeout}", costs(cost)))
        }
        Call::Settle {
            token,
            charged,
            actual,
        } => {
            let (charged, actual) = (costs(charged), costs(actual));
            cmd.arg("settle")
                .arg(format!("{}:{charged}:{actual}", token.0))
        }
        Call::Keep(token) => cmd.arg("keep").arg(token.0),
        Call::Learn { lesson, learning } => {
            cmd.arg("learn").arg(lesson_text(lesson, learning, limits))
        }
    };
}

/// A number for each of `limits` limits (a cost's counts, a resume's
/// debts), as the script reads them: joined by commas.
fn joined(limits: usize, each: impl Fn(usize) -> u64) -> String {
    let numbers: Vec<String> = (0..limits).map(|i| each(i).to_string()).collect();
    numbers.join(",")
}

/// A lesson and the constants it is learned under, as the script reads
/// them (see `docs/redis-protocol.md`, Learn): the flags, `Retry-After`
/// and the constants, then what the upstream reported of each limit, up to
/// `limits` of them (a rate that is not one the limits take, > 0 and
/// finite, is not sent: `Limits::learn` ignores it).
fn lesson_text(lesson: &Lesson, learning: &Learning, limits: usize) -> String {
    use std::fmt::Write;
    let optional = |value: Option<u64>| value.map(|v| v.to_string()).unwrap_or_default();
    let mut text = format!(
        "{},{},{},{},{},{},{},{},{},{}",
        u8::from(lesson.throttled),
        u8::from(lesson.success),
        optional(lesson.retry_after_micros.map(|t| t.min(MAX_ARG_MICROS))),
        number_text(learning.decrease),
        number_text(learning.increase),
        learning.interval_micros,
        number_text(learning.floor),
        learning.pause_micros,
        number_text(learning.margin),
        optional(lesson.sent_ago_micros.map(|t| t.min(MAX_ARG_MICROS))),
    );
    for reported in lesson.limits.iter().take(limits) {
        let rate = reported.rate.filter(|r| *r > 0.0 && r.is_finite());
        let _ = write!(
            text,
            ";{},{},{}",
            rate.map(number_text).unwrap_or_default(),
            optional(reported.remaining),
            optional(reported.reset_micros.map(|t| t.min(MAX_ARG_MICROS))),
        );
    }
    text
}

/// Durations past 2^53 µs saturate there in the script as in the core.
const MAX_ARG_MICROS: u64 = crate::core::MAX_MICROS;

/// A batch's requests as the script reads them: `permits[+]:timeout_micros`
/// each (`-1`: no timeout), joined by commas; a run of the same request is
/// written once, with `*count`.
fn batch_text(requests: &[Request]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(16);
    for run in requests.chunk_by(|a, b| a == b) {
        if !text.is_empty() {
            text.push(',');
        }
        let request = run[0];
        let held = if request.held { "+" } else { "" };
        let timeout = request.timeout.map_or(-1, |t| micros(t) as i64);
        let _ = write!(text, "{}{held}:{timeout}", request.permits);
        if run.len() > 1 {
            let _ = write!(text, "*{}", run.len());
        }
    }
    text
}

/// Whether `error` says the key or the call is wrong (someone else's data
/// under our key, a rejected argument, a command of the script that Redis
/// refused as wrong: `ERR` from inside the script), as opposed to Redis
/// being unavailable. A fallback cannot fix those, and Redis is not down
/// for the other keys, so they are reported, not hidden. Only the server's
/// own reply is read: a client's error (a connection's, which may name a
/// host such as `redis.paceline:6379`) is an outage.
pub(crate) fn is_data_error(error: &redis::RedisError) -> bool {
    match error.code() {
        Some("WRONGTYPE") => true,
        Some("ERR") => {
            error
                .detail()
                .is_some_and(|detail| detail.starts_with("paceline:"))
                || error.to_string().contains("@user_script")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Bursty, WarmingUp};

    fn argv(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .skip(4) // EVALSHA, sha, numkeys, key
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                other => panic!("unexpected argument {other:?}"),
            })
            .collect()
    }

    /// Arguments written as one line, separated by spaces.
    fn words(line: &str) -> Vec<&str> {
        line.split(' ').collect()
    }

    /// Redis's own words for a command of the script it refused (a slots
    /// TTL it could not read, before TTLs were bounded) are the call's
    /// fault, not an outage; an outage's are not.
    #[test]
    fn an_error_from_inside_the_script_is_the_calls_not_an_outage() {
        let error = |reply: &[u8]| {
            redis::parse_redis_value(reply)
                .unwrap()
                .extract_error()
                .unwrap_err()
        };
        assert!(is_data_error(&error(
            b"-ERR value is not an integer or out of range script: 88a329ecad0514c71a6f818f8766847673407688, on @user_script:56.\r\n"
        )));
        assert!(is_data_error(&error(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        )));
        for outage in [
            &b"-READONLY You can't write against a read only replica. script: 88a3, on @user_script:56.\r\n"[..],
            b"-OOM command not allowed when used memory > 'maxmemory'.\r\n",
            b"-LOADING Redis is loading the dataset in memory\r\n",
            b"-ERR max number of clients reached\r\n",
        ] {
            assert!(!is_data_error(&error(outage)), "{}", String::from_utf8_lossy(outage));
        }
        // The script's own refusals are the call's; a client's error that
        // names a host ending in `paceline` is an outage.
        assert!(is_data_error(&error(
            b"-ERR paceline: the key holds a value this limiter does not recognise (3 bytes)\r\n"
        )));
        for kind in [
            redis::ErrorKind::Io,
            redis::ErrorKind::ClusterConnectionNotFound,
        ] {
            let refused = redis::RedisError::from((
                kind,
                "Failed to connect",
                "redis.paceline:6379: Connection refused".to_string(),
            ));
            assert!(!is_data_error(&refused), "{refused}");
        }
    }

    #[test]
    fn rates_are_written_exactly() {
        for rate in [
            1000.0,
            0.5,
            1.0 / 3.0,
            1e-300,
            f64::from_bits(1),
            1e300,
            f64::MAX,
            123_456.789,
        ] {
            let text = number_text(rate);
            assert_eq!(
                text.parse::<f64>().unwrap().to_bits(),
                rate.to_bits(),
                "{text}"
            );
        }
        assert_eq!(number_text(f64::INFINITY), "inf");
    }

    #[test]
    fn arguments_are_the_same_whether_preformatted_or_not() {
        let bursty = Policy::Bursty(Bursty::new(Duration::from_millis(1500)));
        let warming = Policy::WarmingUp(WarmingUp::new(Duration::from_secs(2), 3.5));
        let reserve = Call::Reserve(Request::of(1, None, false));
        let try_7 = Call::Reserve(Request::of(7, Some(Duration::from_millis(20)), true));
        for (policy, rate, call, expected) in [
            (&bursty, 1000.0, reserve, "1 -1 1000.0 bursty 1500000 0.0"),
            (&bursty, 0.25, try_7, "7+ 20000 0.25 bursty 1500000 0.0"),
            (
                &warming,
                f64::INFINITY,
                Call::Probe,
                "probe -1 inf warming_up 2000000 3.5",
            ),
        ] {
            // Built at this rate (preformatted), and at another one (the
            // rate after a change is formatted per call).
            for built in [rate, 42.0] {
                let args = ScriptArgs::new(&[(policy.clone(), built)]);
                args.set_rates(Arc::new([rate]));
                let cmd = command("EVALSHA", "sha", "k", &call, &args);
                assert_eq!(argv(&cmd), words(expected), "built at {built}");
            }
        }
    }

    #[test]
    fn several_limits_follow_the_call_and_a_resume_carries_a_debt_each() {
        let bursty = Policy::Bursty(Bursty::new(Duration::from_secs(1)));
        let warming = Policy::WarmingUp(WarmingUp::new(Duration::from_secs(2), 3.0));
        let args = ScriptArgs::new(&[(bursty, 10.0), (warming, 0.5)]);
        let resume = Call::Resume {
            debts_micros: Box::new([7]),
        };
        let cmd = command("EVALSHA", "sha", "k", &resume, &args);
        let expected = "resume 7,0 10.0 bursty 1000000 0.0 0.5 warming_up 2000000 3.0";
        assert_eq!(argv(&cmd), words(expected));
        let batch = Call::Batch(Box::new([
            Request::of(1, None, true),
            Request::of(1, None, true),
            Request::of(2, Some(Duration::from_micros(5)), false),
        ]));
        let cmd = command("EVALSHA", "sha", "k", &batch, &args);
        assert_eq!(argv(&cmd)[..2], ["batch", "1+:-1*2,2:5"]);
        let give_back = command("EVALSHA", "sha", "k", &Call::GiveBack(LogId(42)), &args);
        assert_eq!(argv(&give_back)[..2], ["give_back", "42"]);
    }
}
