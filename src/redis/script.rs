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

/// The policy as the script takes it (ARGV[4..6]), fixed when the limiter is built.
#[derive(Debug, Clone)]
pub(crate) struct ScriptPolicy {
    name: &'static str,
    param_micros: u64,
    cold_factor: f64,
}

impl ScriptPolicy {
    pub(crate) fn new(policy: &Policy) -> Self {
        match policy {
            Policy::Bursty(b) => ScriptPolicy {
                name: "bursty",
                param_micros: b.max_burst_micros,
                cold_factor: 0.0,
            },
            Policy::WarmingUp(w) => ScriptPolicy {
                name: "warming_up",
                param_micros: w.warmup_micros,
                cold_factor: w.cold_factor,
            },
        }
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
    policy: &ScriptPolicy,
) -> RedisResult<i64> {
    let cmd = evalsha(key, call, permits_per_second, policy);
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
fn evalsha(key: &str, call: Call, permits_per_second: f64, policy: &ScriptPolicy) -> Cmd {
    let (permits, timeout_micros) = match call {
        Call::Reserve { permits, timeout } => (permits, timeout.map_or(-1, |t| micros(t) as i64)),
        Call::Query => (0, -1),
    };
    let mut cmd = Cmd::with_capacity(10, 128 + key.len());
    cmd.arg("EVALSHA")
        .arg(RESERVE.get_hash())
        .arg(1)
        .arg(key)
        .arg(permits)
        .arg(timeout_micros);
    if permits_per_second.is_infinite() {
        cmd.arg("inf");
    } else {
        cmd.arg(permits_per_second);
    }
    cmd.arg(policy.name)
        .arg(policy.param_micros)
        .arg(policy.cold_factor);
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
