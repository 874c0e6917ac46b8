//! The slots script (`lua/slots.lua`): its keys beside the limiter's, and
//! its three modes, each one round trip.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, RedisResult, Script, Value};

use super::super::connection::Connection;
use super::super::health::hash_tag;
use super::super::script::{self, unexpected};

/// The script's text.
const SOURCE: &str = include_str!("../../../lua/slots.lua");

/// The script, hashed once: EVALSHA, and EVAL with the text on NOSCRIPT.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// What a take answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// The lease is live (taken, or renewed) until `expires` (µs on
    /// Redis's clock).
    Granted { expires: u64 },
    /// Not this call's turn: every slot is taken (the earliest live lease
    /// expires in `until_free`; zero if a slot is free for a call ahead),
    /// and `ahead` calls wait before it in the line.
    Full { until_free: Duration, ahead: u64 },
}

/// The keys of a limiter key's slots: its leases, and its line (when each
/// waiting call came, and when it last asked).
#[derive(Debug)]
pub(super) struct Keys {
    pub(super) slots: String,
    line: String,
    asked: String,
}

impl Keys {
    /// The slots keys of the limiter's Redis key `key`: the line's are the
    /// slots key with `\line` and `\asked` appended, so in its cluster slot
    /// where it has a hash tag (on a cluster, the builder refuses a name
    /// that would give it none), and no limiter's or slots key (a slots key
    /// ends in `\slots`).
    pub(super) fn of(key: &str) -> Keys {
        let slots = slots_key(key);
        Keys {
            line: format!("{slots}\\line"),
            asked: format!("{slots}\\asked"),
            slots,
        }
    }
}

/// The slots key beside a limiter's Redis key `key` (one of its keys', for
/// a keyed limiter): in the same cluster slot, and no limiter's key.
///
/// A key with a hash tag (from braces in the limiter's name) keeps it, and
/// has `\slots` appended; a key without one becomes its own hash tag,
/// `{key}\slots` (hashed as the key is). No limiter's key starts with `{`
/// (a prefix holds no brace) or holds `\s` (not one of the escapes
/// `naming` writes), so no slots key is a limiter's key, and the key is
/// read back by dropping the suffix (and the braces): no two share one. A
/// key that holds a `}` but no hash tag (a name such as `a}b`) gets
/// `\slots` appended: another slot than its key's, and its line's keys
/// ([`Keys::of`]) each in yet another. The script touches all three, so on
/// a cluster the builder refuses such a name; on one server it is no
/// matter.
pub(crate) fn slots_key(key: &str) -> String {
    if hash_tag(key.as_bytes()).is_some() || key.contains('}') {
        format!("{key}\\slots")
    } else {
        format!("{{{key}}}\\slots")
    }
}

/// Takes (or renews) lease `id` of `keys` if it is live, or if fewer than
/// `calls` are and the turn of `waiter` (the call the lease is for, which
/// waits in line until then) has come, for `ttl` on Redis's clock. A
/// renewal says when the lease `expires` as last heard: gone before then,
/// it was released (the renewal ran after the release), and is not taken
/// again.
pub(super) async fn take(
    connection: &mut Connection,
    keys: &Keys,
    id: &str,
    calls: u32,
    ttl: Duration,
    waiter: Option<&str>,
    expires: Option<u64>,
) -> RedisResult<Answer> {
    let ttl = ttl.as_micros().to_string();
    let calls = calls.to_string();
    let expires = expires.map(|expires| expires.to_string());
    let mut args = vec!["take", id, &calls, &ttl];
    match &expires {
        Some(expires) => args.extend([waiter.unwrap_or(""), expires]),
        None => args.extend(waiter),
    }
    let value = evaluate(connection, keys, &args).await?;
    match numbers(&value) {
        Some([1, _, expires, _]) => Ok(Answer::Granted {
            expires: u64::try_from(expires).unwrap_or(0),
        }),
        Some([0, _, micros, ahead]) => Ok(Answer::Full {
            until_free: Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
            ahead: u64::try_from(ahead).unwrap_or(0),
        }),
        _ => Err(unexpected()),
    }
}

/// What a removal takes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// A lease.
    Release,
    /// A waiting call, from the line.
    Leave,
}

/// Removes lease `id` of `keys`, or the waiting call `id` from their line.
pub(super) async fn remove(
    connection: &mut Connection,
    keys: &Keys,
    removal: Removal,
    id: &str,
) -> RedisResult<()> {
    let mode = match removal {
        Removal::Release => "release",
        Removal::Leave => "leave",
    };
    let value = evaluate(connection, keys, &[mode, id]).await?;
    match numbers(&value) {
        Some([1, ..]) => Ok(()),
        _ => Err(unexpected()),
    }
}

/// The script's reply: four integers.
fn numbers(value: &Value) -> Option<[i64; 4]> {
    match value {
        Value::Array(items) => match items[..] {
            [Value::Int(a), Value::Int(b), Value::Int(c), Value::Int(d)] => Some([a, b, c, d]),
            _ => None,
        },
        _ => None,
    }
}

/// The script's reply to `args` on `keys`.
async fn evaluate(connection: &mut Connection, keys: &Keys, args: &[&str]) -> RedisResult<Value> {
    let command = |verb: &str, script: &str| {
        let mut cmd = Cmd::new();
        cmd.arg(verb).arg(script).arg(3);
        cmd.arg(&keys.slots)
            .arg(&keys.line)
            .arg(&keys.asked)
            .arg(args);
        cmd
    };
    script::evaluate(connection, &SCRIPT, SOURCE, command).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::health::key_slot;
    use crate::redis::naming::{DEFAULT_KEY_PREFIX, keyed_key, keyed_prefix, single_key};

    #[test]
    fn a_slots_key_is_in_its_limiters_cluster_slot() {
        for name in ["api", "{tenant-7}", "a{b", "x{}y", "we:ird\\name", "{}"] {
            let single = single_key(DEFAULT_KEY_PREFIX, name);
            let keyed = keyed_key(&keyed_prefix(DEFAULT_KEY_PREFIX, name), "alice{1}");
            for key in [single, keyed] {
                let slots = slots_key(&key);
                assert!(slots.ends_with("\\slots"), "{slots}");
                if !key.contains('}') || name.starts_with("{tenant") {
                    assert_eq!(
                        key_slot(slots.as_bytes()),
                        key_slot(key.as_bytes()),
                        "{key}"
                    );
                }
            }
        }
        assert_eq!(slots_key("paceline:v1:api"), "{paceline:v1:api}\\slots");
        assert_eq!(slots_key("paceline:v1:{t}:k"), "paceline:v1:{t}:k\\slots");
    }

    #[test]
    fn no_two_limiter_keys_share_a_slots_key_or_line_and_none_is_a_limiters() {
        let mut seen = std::collections::HashSet::new();
        let mut keys = Vec::new();
        for name in ["api", "api\\slots", "{t}", "{t}\\slots", "a}b", "a"] {
            keys.push(single_key(DEFAULT_KEY_PREFIX, name));
            for key in ["x", "slots", "\\slots", "{x}"] {
                keys.push(keyed_key(&keyed_prefix(DEFAULT_KEY_PREFIX, name), key));
            }
        }
        for key in &keys {
            let Keys { slots, line, asked } = Keys::of(key);
            assert_eq!(slots, slots_key(key));
            for other in [slots, line, asked] {
                assert!(seen.insert(other), "{key}");
            }
        }
        for key in &keys {
            assert!(!seen.contains(key), "{key} is a slots key too");
        }
    }
}
