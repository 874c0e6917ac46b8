//! Calling `lua/reserve.lua`: arguments in, wait out.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind};

use super::connection::Connection;
use crate::Error;
use crate::core::{Policy, micros};
use crate::error::BackendError;

/// The reservation script, hashed once. [`invoke`] sends EVALSHA and, on
/// NOSCRIPT, loads the script and retries.
static RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/reserve.lua")));

/// The arguments that describe the limiter (ARGV[3..=6]), written out once
/// when the limiter is built, so that a call formats only what changes with
/// it: `permits` and `timeout_micros` (and the rate, after a `set_rate`).
#[derive(Debug, Clone)]
pub(crate) struct ScriptArgs {
    name: &'static str,
    param_micros: String,
    cold_factor: String,
    /// The rate the limiter was built with, as bits and as text.
    built_rate: (u64, String),
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
        }
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

/// What a call asks of the script.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    /// Reserve `permits`; with a timeout, only if the wait fits in it.
    Reserve {
        permits: u32,
        timeout: Option<Duration>,
    },
    /// Read the current wait; write nothing.
    Query,
}

/// Runs the script once (one round trip; three on NOSCRIPT: SCRIPT LOAD and
/// the retry) and returns its raw reply: the wait in microseconds, or -1 for
/// a refused try.
pub(crate) async fn invoke(
    connection: &mut Connection,
    key: &str,
    call: Call,
    permits_per_second: f64,
    args: &ScriptArgs,
) -> RedisResult<i64> {
    let cmd = evalsha(key, call, permits_per_second, args);
    match cmd.query_async(connection).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            RESERVE.load_async(connection).await?;
            cmd.query_async(connection).await
        }
        reply => reply,
    }
}

/// `EVALSHA <sha> 1 <key> <ARGV...>`, written straight into one command
/// buffer (the arguments are short: this is one allocation for the bytes
/// and one for their offsets).
fn evalsha(key: &str, call: Call, permits_per_second: f64, args: &ScriptArgs) -> Cmd {
    let (permits, timeout_micros) = match call {
        Call::Reserve { permits, timeout } => (permits, timeout.map_or(-1, |t| micros(t) as i64)),
        Call::Query => (0, -1),
    };
    let mut cmd = Cmd::with_capacity(10, 128 + key.len());
    cmd.arg("EVALSHA").arg(RESERVE.get_hash()).arg("1").arg(key);
    match permits {
        1 => cmd.arg("1"),
        _ => cmd.arg(permits),
    };
    match timeout_micros {
        -1 => cmd.arg("-1"),
        _ => cmd.arg(timeout_micros),
    };
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

/// The script's reply as a wait: `Some(wait)`, or `None` for a refused try.
pub(crate) fn decode(reply: i64, key: &str) -> Result<Option<Duration>, Error> {
    match reply {
        -1 => Ok(None),
        wait if wait >= 0 => Ok(Some(Duration::from_micros(wait as u64))),
        other => Err(Error::Backend(BackendError::new(
            format!("unexpected reply {other} from the limiter script on key {key}"),
            None,
        ))),
    }
}

/// Whether `error` says the key or the call is wrong (someone else's data
/// under our key, a rejected argument), as opposed to Redis being unavailable.
/// A fallback cannot fix those, so they are reported, not hidden.
pub(crate) fn is_data_error(error: &redis::RedisError) -> bool {
    matches!(error.code(), Some("WRONGTYPE")) || error.to_string().contains("throttler:")
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
        let reserve = Call::Reserve {
            permits: 1,
            timeout: None,
        };
        let try_7 = Call::Reserve {
            permits: 7,
            timeout: Some(Duration::from_millis(20)),
        };
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
                ["7", "20000", "0.25", "bursty", "1500000", "0.0"],
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
                let cmd = evalsha("k", call, rate, &ScriptArgs::new(policy, built));
                assert_eq!(argv(&cmd), expected, "built at {built}");
            }
        }
    }
}
