//! The slots script (`lua/slots.lua`): its key beside the limiter's, and
//! its two modes, each one round trip.

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
    /// The lease is live (taken, or renewed).
    Granted,
    /// Every slot is taken: the earliest live lease expires in this long.
    Full { until_free: Duration },
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
/// `\slots` appended: another slot, which is still safe (the script
/// touches one key).
pub(crate) fn slots_key(key: &str) -> String {
    if hash_tag(key.as_bytes()).is_some() || key.contains('}') {
        format!("{key}\\slots")
    } else {
        format!("{{{key}}}\\slots")
    }
}

/// Takes (or renews) lease `id` of `key` if it is live or fewer than
/// `calls` are, for `ttl` on Redis's clock.
pub(super) async fn take(
    connection: &mut Connection,
    key: &str,
    id: &str,
    calls: u32,
    ttl: Duration,
) -> RedisResult<Answer> {
    let ttl = ttl.as_micros().to_string();
    let calls = calls.to_string();
    let value = evaluate(connection, key, &["take", id, &calls, &ttl]).await?;
    match numbers(&value) {
        Some([1, _, _]) => Ok(Answer::Granted),
        Some([0, _, micros]) => Ok(Answer::Full {
            until_free: Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
        }),
        _ => Err(unexpected()),
    }
}

/// Removes lease `id` of `key`.
pub(super) async fn release(connection: &mut Connection, key: &str, id: &str) -> RedisResult<()> {
    let value = evaluate(connection, key, &["release", id]).await?;
    match numbers(&value) {
        Some([1, _, _]) => Ok(()),
        _ => Err(unexpected()),
    }
}

/// The script's reply: three integers.
fn numbers(value: &Value) -> Option<[i64; 3]> {
    match value {
        Value::Array(items) => match items[..] {
            [Value::Int(a), Value::Int(b), Value::Int(c)] => Some([a, b, c]),
            _ => None,
        },
        _ => None,
    }
}

/// The script's reply to `args` on `key`.
async fn evaluate(connection: &mut Connection, key: &str, args: &[&str]) -> RedisResult<Value> {
    let command = |verb: &str, script: &str| {
        let mut cmd = Cmd::new();
        cmd.arg(verb).arg(script).arg(1).arg(key).arg(args);
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
    fn no_two_limiter_keys_share_a_slots_key_and_none_is_a_limiters() {
        let mut seen = std::collections::HashSet::new();
        let mut keys = Vec::new();
        for name in ["api", "api\\slots", "{t}", "{t}\\slots", "a}b", "a"] {
            keys.push(single_key(DEFAULT_KEY_PREFIX, name));
            for key in ["x", "slots", "\\slots", "{x}"] {
                keys.push(keyed_key(&keyed_prefix(DEFAULT_KEY_PREFIX, name), key));
            }
        }
        for key in &keys {
            assert!(seen.insert(slots_key(key)), "{key}");
        }
        for key in &keys {
            assert!(!seen.contains(key), "{key} is a slots key too");
        }
    }
}
