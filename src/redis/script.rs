//! Calling the limiter's script (`lua/`, see `docs/redis-protocol.md`):
//! arguments in, wait out.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, Value};

use super::connection::Connection;
use super::format;
use crate::core::{Policy, micros};

/// The reservation script, hashed once. [`invoke`] sends EVALSHA and, on
/// NOSCRIPT, EVAL with the text.
static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The script's text.
const SOURCE: &str = format::SCRIPT;

/// The script of a limiter with several limits, hashed once.
static SEVERAL: LazyLock<Script> = LazyLock::new(|| Script::new(format::SEVERAL_SCRIPT));

/// The arguments that describe the limiter (ARGV[3..=6]), written out once
/// when the limiter is built, so that a call formats only what changes with
/// it: `permits` and `timeout_micros` (and the rate, after a `set_rate`).
#[derive(Debug)]
pub(crate) struct ScriptArgs {
    name: &'static str,
    param_micros: String,
    cold_factor: String,
    /// The rate the limiter was built with, as bits and as text.
    built_rate: (u64, String),
    /// Every limit, for a limiter built with several (the fields above are
    /// then the first one's).
    several: Option<Box<[LimitArgs]>>,
    /// Their rates in force, for a limiter built with several: the
    /// limiter's `set_rate` scales them, `set_limit_rate` sets one.
    rates: Mutex<Arc<[f64]>>,
}

/// One limit of several, as the several-limits script takes it.
#[derive(Debug, Clone)]
struct LimitArgs {
    name: &'static str,
    param_micros: String,
    cold_factor: String,
}

impl ScriptArgs {
    pub(crate) fn new(policy: &Policy, permits_per_second: f64) -> Self {
        let (name, param_micros, cold_factor) = match policy {
            Policy::Bursty(b) => ("bursty", b.max_burst_micros, 0.0),
            Policy::WarmingUp(w) => ("warming_up", w.warmup_micros, w.cold_factor),
        };
        ScriptArgs {
            name,
            param_micros: param_micros.to_string(),
            cold_factor: number_text(cold_factor),
            built_rate: (
                permits_per_second.to_bits(),
                number_text(permits_per_second),
            ),
            several: None,
            rates: Mutex::new(Arc::new([permits_per_second])),
        }
    }

    /// The arguments of a limiter with several limits (at least two), each
    /// a policy and a rate.
    pub(crate) fn several(limits: &[(Policy, f64)]) -> Self {
        let mut args = ScriptArgs::new(&limits[0].0, limits[0].1);
        let each = limits.iter().map(|(policy, rate)| {
            let one = ScriptArgs::new(policy, *rate);
            LimitArgs {
                name: one.name,
                param_micros: one.param_micros,
                cold_factor: one.cold_factor,
            }
        });
        args.several = Some(each.collect());
        args.rates = Mutex::new(limits.iter().map(|(_, rate)| *rate).collect());
        args
    }

    /// The rates in force, one per limit.
    pub(crate) fn rates(&self) -> Arc<[f64]> {
        Arc::clone(&self.rates.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sets the rates in force (already checked).
    pub(crate) fn set_rates(&self, rates: Arc<[f64]>) {
        *self.rates.lock().unwrap_or_else(PoisonError::into_inner) = rates;
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
    /// Read the current wait; write nothing.
    Query,
    /// Prove the script can read and write the key, changing nothing.
    Probe,
    /// Back from a fallback: drop the key's stored permits and carry the
    /// fallback's debt, in µs at the shared rate: one per limit, or one for
    /// every limit.
    Resume { debts_micros: Box<[u64]> },
    /// Give back a reservation.
    Cancel(Token),
    /// Reservations applied in order at one clock reading, as the same
    /// calls one by one would be (see [`invoke_batch`]).
    Batch(Box<[Request]>),
    /// Read the key's state as stored, with the server's clock (see
    /// [`invoke_status`]); write nothing.
    Status,
}

/// A reservation: `permits`; with a timeout, only if the wait fits in it.
/// `held`: its caller may give it back (a [`Reservation`] handed out, an
/// `acquire` that sleeps): if it waits, the script gives it a group in the
/// key's ledger (or its log), so that its give-back is exact.
///
/// [`Reservation`]: crate::Reservation
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) permits: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) held: bool,
}

/// The script's record of one reservation in Redis, as its reply carries
/// it (the value it wrote, without its ledger, and the id of the
/// reservation's group in the ledger if it waits): what the script's
/// `cancel` mode takes back to give it back.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Box<[u8]>);

/// A token is a value (see [`format`](super::format)), with its group's
/// id when it has one.
const TOKEN_LEN: usize = format::VALUE_LEN;
const TOKEN_WITH_ID_LEN: usize = format::TOKEN_WITH_ID_LEN;

/// The markers a value (and so a token) starts with.
const MARKERS: [&[u8; 4]; 2] = [format::MARKER, format::LEDGER_MARKER];

impl Token {
    fn from_bytes(bytes: &[u8]) -> Option<Token> {
        if bytes.len() != TOKEN_LEN && bytes.len() != TOKEN_WITH_ID_LEN {
            return None;
        }
        Some(Token(bytes.into()))
    }

    /// Field `n` (1-based, after the marker) of the value, as the script
    /// numbers them.
    fn field(&self, n: usize) -> f64 {
        let start = 4 + 8 * (n - 1);
        let bytes: [u8; 8] = self.0[start..start + 8].try_into().expect("8 bytes");
        f64::from_le_bytes(bytes)
    }

    /// The reservation's wait and the key's debt after it, in whole µs,
    /// from the value it wrote: with now = last_now_micros (field 6), the
    /// wait is `max(next_free_before - now, 0)` (field 9) and the debt
    /// `next_free_micros - now` (field 2). `None` unless the value has the
    /// marker and these fields are whole numbers in range (the script
    /// writes nothing else).
    fn wait_and_debt(&self) -> Option<(u64, u64)> {
        let whole =
            |x: f64| (0.0..=crate::core::MAX_MICROS as f64).contains(&x) && x.fract() == 0.0;
        let (next_free, now, next_free_before) = (self.field(2), self.field(6), self.field(9));
        if !MARKERS.iter().any(|marker| self.0[..4] == marker[..])
            || !whole(next_free)
            || !whole(now)
            || !whole(next_free_before)
        {
            return None;
        }
        let (next_free, now, next_free_before) =
            (next_free as u64, now as u64, next_free_before as u64);
        let moment = next_free_before.max(now);
        Some((moment - now, next_free.checked_sub(now)?))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The script's reply, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The wait for a granted reservation, the debt for a query, a probe or
    /// a resume, `None` for a refused try. For a cancel: 1 restored, 2
    /// returned, 0 nothing (as µs, unused).
    pub(crate) wait: Option<Duration>,
    /// How far the key's ticket lies ahead of the server's clock after the
    /// call, in µs.
    pub(crate) debt_micros: u64,
    /// A granted reservation's record.
    pub(crate) token: Option<Token>,
    /// The limit that set the wait, on a limiter with several (else 0).
    pub(crate) limit: usize,
}

/// Runs the script once (one round trip; two on NOSCRIPT, the second an
/// EVAL of the script's text, routed like the first by its key, which
/// also caches it on that server) and decodes its reply.
pub(crate) async fn invoke(
    connection: &mut Connection,
    key: &str,
    call: &Call,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> RedisResult<Reply> {
    let value = evaluate(connection, key, call, permits_per_second, args).await?;
    decode(value).ok_or_else(unexpected)
}

/// Runs a batch of reservations in one call of the script, as
/// [`invoke`] runs one: their replies, in order.
pub(crate) async fn invoke_batch(
    connection: &mut Connection,
    key: &str,
    call: &Call,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> RedisResult<Vec<Reply>> {
    let Call::Batch(requests) = call else {
        return Err(unexpected());
    };
    let value = evaluate(connection, key, call, permits_per_second, args).await?;
    decode_batch(value, requests.len(), args.several.is_some()).ok_or_else(unexpected)
}

/// A key's state as the scripts' `status` mode reads it: the server's
/// clock, and per limit the state as stored (a limit not stored as it
/// starts), at the rate and `max_permits` it was last charged at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    pub(crate) now_micros: u64,
    pub(crate) limits: Vec<StoredLimit>,
}

/// One limit of a [`Stored`] state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StoredLimit {
    pub(crate) stored_permits: f64,
    pub(crate) next_free_micros: u64,
    pub(crate) next_free_fraction: u32,
    pub(crate) rate: f64,
    pub(crate) max_permits: f64,
}

/// Runs the script's `status` mode (one round trip, as [`invoke`]) and
/// decodes its reply: doubles, the clock and then five per limit.
pub(crate) async fn invoke_status(
    connection: &mut Connection,
    key: &str,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> RedisResult<Stored> {
    let limits = args.several.as_ref().map_or(1, |several| several.len());
    match evaluate(connection, key, &Call::Status, permits_per_second, args).await? {
        Value::BulkString(bytes) => decode_status(&bytes, limits).ok_or_else(unexpected),
        _ => Err(unexpected()),
    }
}

/// A `status` reply of `limits` limits; `None` unless every number is one
/// the scripts keep (whole µs below 2^53, a fraction below 2^20, permits
/// within `0..=max_permits`, a positive rate).
fn decode_status(bytes: &[u8], limits: usize) -> Option<Stored> {
    if bytes.len() != 8 * (1 + 5 * limits) {
        return None;
    }
    let numbers: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|chunk| f64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect();
    let max = crate::core::MAX_MICROS as f64;
    let whole = |x: f64, end: f64| (0.0..=end).contains(&x) && x.fract() == 0.0;
    if !whole(numbers[0], max) {
        return None;
    }
    let limits = numbers[1..]
        .chunks_exact(5)
        .map(|fields| {
            let [stored, next_free, fraction, rate, max_permits] = fields.try_into().ok()?;
            let valid = whole(next_free, max)
                && whole(
                    fraction,
                    f64::from((1u32 << crate::core::FRACTION_BITS) - 1),
                )
                && rate > 0.0
                && (0.0..f64::INFINITY).contains(&max_permits)
                && (0.0..=max_permits).contains(&stored);
            valid.then_some(StoredLimit {
                stored_permits: stored,
                next_free_micros: next_free as u64,
                next_free_fraction: fraction as u32,
                rate,
                max_permits,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Stored {
        now_micros: numbers[0] as u64,
        limits,
    })
}

fn unexpected() -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::Parse,
        "paceline: unexpected reply from the limiter script",
    ))
}

/// The script's reply to `call`, as Redis gave it.
async fn evaluate(
    connection: &mut Connection,
    key: &str,
    call: &Call,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> RedisResult<Value> {
    let (script, source, build): (&Script, &str, Command) = match args.several {
        None => (&RESERVE, SOURCE, command),
        Some(_) => (&SEVERAL, format::SEVERAL_SCRIPT, several_command),
    };
    let mut cmd = build(
        "EVALSHA",
        script.get_hash(),
        key,
        call,
        permits_per_second,
        args,
    );
    match cmd.query_async::<Value>(connection).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            cmd = build("EVAL", source, key, call, permits_per_second, args);
            cmd.query_async::<Value>(connection).await
        }
        reply => reply,
    }
}

/// How a command for one of the scripts is built.
type Command = fn(&str, &str, &str, &Call, f64, &ScriptArgs) -> Cmd;

/// `EVALSHA <sha> 1 <key> <ARGV...>` (or `EVAL <source> ...`), written
/// straight into one command buffer.
fn command(
    verb: &str,
    script: &str,
    key: &str,
    call: &Call,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> Cmd {
    let mut cmd = Cmd::with_capacity(10, 128 + key.len() + script.len());
    cmd.arg(verb).arg(script).arg("1").arg(key);
    call_args(&mut cmd, call, 1);
    if permits_per_second.to_bits() == args.built_rate.0 {
        cmd.arg(args.built_rate.1.as_str());
    } else {
        cmd.arg(number_text(permits_per_second));
    }
    cmd.arg(args.name)
        .arg(args.param_micros.as_str())
        .arg(args.cold_factor.as_str());
    cmd
}

/// ARGV[1] and ARGV[2], the call, as both scripts read them; a resume
/// carries one debt per limit (`limits` of them, joined by commas), or one.
fn call_args(cmd: &mut Cmd, call: &Call, limits: usize) {
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
            };
        }
        Call::Query => {
            cmd.arg("0").arg("-1");
        }
        Call::Probe => {
            cmd.arg("probe").arg("-1");
        }
        Call::Status => {
            cmd.arg("status").arg("-1");
        }
        Call::Resume { debts_micros } if limits == 1 => {
            cmd.arg("resume")
                .arg(debts_micros.first().copied().unwrap_or(0));
        }
        Call::Resume { debts_micros } => {
            let debts: Vec<String> = (0..limits)
                .map(|i| {
                    let debt = debts_micros.get(i).or(debts_micros.first());
                    debt.copied().unwrap_or(0).to_string()
                })
                .collect();
            cmd.arg("resume").arg(debts.join(","));
        }
        Call::Cancel(token) => {
            cmd.arg("cancel").arg(&token.0[..]);
        }
        Call::Batch(requests) => {
            cmd.arg("batch").arg(batch_text(requests));
        }
    }
}

/// A batch's requests as the scripts read them: `permits[+]:timeout_micros`
/// each (`-1`: no timeout), joined by commas; a run of the same request is
/// written once, with `*count`.
fn batch_text(requests: &[Request]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(16);
    // Runs of the same request go as one, `*count` after it.
    for run in requests.chunk_by(|a, b| a == b) {
        if !text.is_empty() {
            text.push(',');
        }
        let request = run[0];
        let held = if request.held { "+" } else { "" };
        let _ = match request.timeout {
            None => write!(text, "{}{held}:-1", request.permits),
            Some(timeout) => write!(text, "{}{held}:{}", request.permits, micros(timeout)),
        };
        if run.len() > 1 {
            let _ = write!(text, "*{}", run.len());
        }
    }
    text
}

/// `EVALSHA <sha> 1 <key> <ARGV...>` for the several-limits script: the
/// call, then every limit at its rate in force.
fn several_command(
    verb: &str,
    script: &str,
    key: &str,
    call: &Call,
    // The first of the rates in force, which the arguments hold.
    _permits_per_second: f64,
    args: &ScriptArgs,
) -> Cmd {
    let limits = args.several.as_deref().unwrap_or_default();
    let mut cmd = Cmd::with_capacity(8 + 4 * limits.len(), 128 + key.len() + script.len());
    cmd.arg(verb).arg(script).arg("1").arg(key);
    call_args(&mut cmd, call, limits.len());
    cmd.arg(limits.len());
    let rates = args.rates();
    for (limit, rate) in limits.iter().zip(rates.iter()) {
        cmd.arg(number_text(*rate))
            .arg(limit.name)
            .arg(limit.param_micros.as_str())
            .arg(limit.cold_factor.as_str());
    }
    cmd
}

/// A granted reservation's value (its token), or an integer: the debt
/// negated for a refused try, else the debt (a cancel's outcome); from the
/// several-limits script, an array.
fn decode(value: Value) -> Option<Reply> {
    match value {
        Value::Array(items) => {
            let ints = integers(&items)?;
            let at = |i: usize| ints.get(i).copied();
            let micros = |i: usize| at(i).and_then(|n| u64::try_from(n).ok());
            match ints.len() {
                // A cancel: 1 given back, 0 not.
                1 => Some(Reply {
                    wait: Some(Duration::from_micros(micros(0)?)),
                    debt_micros: 0,
                    token: None,
                    limit: 0,
                }),
                5 => several_reply([at(0)?, at(1)?, at(2)?, at(3)?], micros(4)?),
                _ => None,
            }
        }
        Value::BulkString(bytes) => {
            let token = Token::from_bytes(&bytes)?;
            let (wait, debt_micros) = token.wait_and_debt()?;
            Some(Reply {
                wait: Some(Duration::from_micros(wait)),
                debt_micros,
                token: Some(token),
                limit: 0,
            })
        }
        Value::Int(n) if n < 0 => Some(Reply {
            wait: None,
            debt_micros: n.unsigned_abs(),
            token: None,
            limit: 0,
        }),
        Value::Int(n) => Some(Reply {
            wait: Some(Duration::from_micros(n as u64)),
            debt_micros: n as u64,
            token: None,
            limit: 0,
        }),
        _ => None,
    }
}

/// A batch's replies, `n` of them. From the one-limit script: the tokens
/// of the grants whose give-back can return anything (those that wait, and
/// the last grant), one after another in one string; per request an
/// integer, the debt negated if refused, else 0 (granted at once, no
/// token), 1 (a token) or its group's id + 2 (a token with that id); then
/// the key's debt after the batch. From the several-limits script: four
/// integers per request (granted, wait, bound, id) and the debt after the
/// last.
fn decode_batch(value: Value, n: usize, several: bool) -> Option<Vec<Reply>> {
    let Value::Array(items) = value else {
        return None;
    };
    if !several {
        let mut items = items.into_iter();
        let (Some(Value::BulkString(tokens)), Some(Value::Int(debt)), true) =
            (items.next(), items.next_back(), items.len() == n)
        else {
            return None;
        };
        let debt_micros = u64::try_from(debt).ok()?;
        let mut tokens = tokens.chunks_exact(TOKEN_LEN);
        let replies = items
            .map(|item| match item {
                Value::Int(debt @ ..=-1) => decode(Value::Int(debt)),
                Value::Int(0) => Some(Reply {
                    wait: Some(Duration::ZERO),
                    debt_micros,
                    token: None,
                    limit: 0,
                }),
                Value::Int(code) => {
                    let mut token = tokens.next()?.to_vec();
                    if code > 1 {
                        token.extend_from_slice(&((code - 2) as f64).to_le_bytes());
                    }
                    decode(Value::BulkString(token))
                }
                _ => None,
            })
            .collect::<Option<Vec<Reply>>>()?;
        return (tokens.next().is_none() && tokens.remainder().is_empty()).then_some(replies);
    }
    if items.len() != 4 * n + 1 {
        return None;
    }
    let ints = integers(&items)?;
    let debt_micros = u64::try_from(ints[4 * n]).ok()?;
    ints[..4 * n]
        .chunks_exact(4)
        .map(|reply| several_reply(reply.try_into().ok()?, debt_micros))
        .collect()
}

/// Every item of a reply array, as an integer; `None` if one is not.
fn integers(items: &[Value]) -> Option<Vec<i64>> {
    items
        .iter()
        .map(|item| match item {
            Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect()
}

/// One request's reply from the several-limits script: granted (1 or 0),
/// wait, the limit that bound it, and its id (-1: none), with the key's
/// debt.
fn several_reply([granted, wait, bound, id]: [i64; 4], debt_micros: u64) -> Option<Reply> {
    let wait = Duration::from_micros(u64::try_from(wait).ok()?);
    Some(Reply {
        wait: (granted == 1).then_some(wait),
        debt_micros,
        token: (id >= 0).then(|| Token(id.to_string().into_bytes().into())),
        limit: usize::try_from(bound).unwrap_or(0),
    })
}

/// Whether `error` says the key or the call is wrong (someone else's data
/// under our key, a rejected argument), as opposed to Redis being unavailable.
/// A fallback cannot fix those, so they are reported, not hidden.
pub(crate) fn is_data_error(error: &redis::RedisError) -> bool {
    matches!(error.code(), Some("WRONGTYPE")) || error.to_string().contains("paceline:")
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

    /// A value as the script packs it: the marker, then nine doubles.
    fn value(fields: [f64; 9]) -> Vec<u8> {
        let mut bytes = MARKERS[0].to_vec();
        bytes.extend(fields.iter().flat_map(|x| x.to_le_bytes()));
        bytes
    }

    #[test]
    fn replies_decode_to_wait_debt_and_token() {
        let now = 1_000_000.0;
        // Field 7: the ticket's fraction (here 2/3 µs, at 1.5e6/s) * 2^21 +
        // the record's * 2 + spent_stored. The reply's numbers are whole µs.
        let fractions = 699_051.0 * 2_097_152.0 + 349_525.0 * 2.0;
        // A granted reservation: the ticket it found 300 µs ahead, 500 µs
        // of debt after it.
        let granted = value([
            0.0,
            now + 500.0,
            1.5e6,
            0.0,
            0.0,
            now,
            fractions,
            0.0,
            now + 300.0,
        ]);
        let reply = decode(Value::BulkString(granted.clone())).unwrap();
        assert_eq!(reply.wait, Some(Duration::from_micros(300)));
        assert_eq!(reply.debt_micros, 500);
        assert_eq!(&reply.token.unwrap().0[..], &granted[..]);
        // One made on a value with a ledger, with its group's id: the same.
        let mut with_id = granted.clone();
        with_id[..4].copy_from_slice(format::LEDGER_MARKER);
        with_id.extend(7.0f64.to_le_bytes());
        let reply = decode(Value::BulkString(with_id.clone())).unwrap();
        assert_eq!(reply.wait, Some(Duration::from_micros(300)));
        assert_eq!(&reply.token.unwrap().0[..], &with_id[..]);
        // The ticket it found behind now: no wait.
        let idle = value([1.0, now, 5.0, 5.0, 0.0, now, 1.0, 2.0, now - 7.0]);
        let reply = decode(Value::BulkString(idle)).unwrap();
        assert_eq!((reply.wait, reply.debt_micros), (Some(Duration::ZERO), 0));
        // A refused try, and a query.
        let refused = decode(Value::Int(-400)).unwrap();
        assert_eq!((refused.wait, refused.debt_micros), (None, 400));
        let query = decode(Value::Int(400)).unwrap();
        assert_eq!(
            (query.wait, query.debt_micros),
            (Some(Duration::from_micros(400)), 400)
        );
        // Anything else is not the script's reply.
        // (A value of the previous format, `thr1`, is never a reply.)
        let mut wrong_marker = value([0.0, now, 5.0, 5.0, 0.0, now, 0.0, 0.0, now]);
        wrong_marker[3] = b'1';
        let behind = value([0.0, now - 1.0, 5.0, 5.0, 0.0, now, 0.0, 0.0, now]);
        let fraction = value([0.0, now + 0.5, 5.0, 5.0, 0.0, now, 0.0, 0.0, now]);
        let moment_fraction = value([0.0, now, 5.0, 5.0, 0.0, now, 0.0, 0.0, now + 0.5]);
        for bad in [
            Value::BulkString(wrong_marker),
            Value::BulkString(behind),
            Value::BulkString(fraction),
            Value::BulkString(moment_fraction),
            Value::BulkString(vec![0; 75]),
            Value::BulkString([&granted[..], &[0; 4]].concat()),
            Value::Array(vec![Value::Int(1), Value::Int(1)]),
            Value::Nil,
        ] {
            assert_eq!(decode(bad.clone()), None, "{bad:?}");
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
        let reserve = Call::Reserve(Request {
            permits: 1,
            timeout: None,
            held: false,
        });
        let try_7 = Call::Reserve(Request {
            permits: 7,
            timeout: Some(Duration::from_millis(20)),
            held: true,
        });
        for (policy, rate, call, expected) in [
            (
                &bursty,
                1000.0,
                reserve,
                ["1", "-1", "1000.0", "bursty", "1500000", "0.0"],
            ),
            (
                &bursty,
                0.25,
                try_7,
                ["7+", "20000", "0.25", "bursty", "1500000", "0.0"],
            ),
            (
                &warming,
                f64::INFINITY,
                Call::Query,
                ["0", "-1", "inf", "warming_up", "2000000", "3.5"],
            ),
        ] {
            // Built at this rate (preformatted), and at another one (the
            // rate after a change is formatted per call).
            for built in [rate, 42.0] {
                let cmd = command(
                    "EVALSHA",
                    "sha",
                    "k",
                    &call,
                    rate,
                    &ScriptArgs::new(policy, built),
                );
                assert_eq!(argv(&cmd), expected, "built at {built}");
            }
        }
    }
}
