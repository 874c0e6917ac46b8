//! The Redis key of a limiter and of each of its keys (the key's `Display`
//! text), by the rule `crate::redis`'s "Key names" states.
//!
//! Why no two pairs share a Redis key: the first `:` ends the prefix (which
//! holds none) and the second the version; the next that no `\` escapes
//! ends the name, so a single limiter's key (which has none) and each keyed
//! limiter's keys are told apart, and both escapes can be undone. A later
//! layout (or value format) takes another version, so its keys never meet
//! this one's. A key's text holds no brace once escaped, so no client picks
//! its cluster slot; a name keeps its braces, so that `{tenant-7}` can put
//! a limiter and all its keys in one slot.

use std::fmt::{self, Display, Write};

/// What every Redis key starts with, before a `:`, unless the backend's
/// builder sets another prefix (see [Key
/// names](super#running-redis-for-this)).
pub const DEFAULT_KEY_PREFIX: &str = "paceline";

/// The version of the key layout and of the values under it, after the
/// prefix: `paceline:v1:name`.
const LAYOUT: &str = "v1";

/// Checks a key prefix: not empty, no `:` (which ends it), no braces
/// (which would put every key of the backend in one cluster slot).
pub(crate) fn check_prefix(prefix: &str) -> Result<(), crate::Error> {
    if prefix.is_empty() || prefix.contains([':', '{', '}']) {
        return crate::error::invalid(format!(
            "a key prefix must be non-empty text without ':', '{{' or '}}' (got {prefix:?})"
        ));
    }
    Ok(())
}

/// The Redis key of the single limiter `name`, under `prefix`.
pub(crate) fn single_key(prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + 2 + LAYOUT.len() + name.len());
    key.push_str(prefix);
    key.push(':');
    key.push_str(LAYOUT);
    key.push(':');
    write_name(&mut key, name);
    key
}

/// What every Redis key of the keyed limiter `name` starts with, under
/// `prefix`.
pub(crate) fn keyed_prefix(prefix: &str, name: &str) -> String {
    let mut keyed = single_key(prefix, name);
    keyed.push(':');
    keyed
}

/// The Redis key of `key` under a keyed limiter's `prefix`.
pub(crate) fn keyed_key<Q: Display + ?Sized>(prefix: &str, key: &Q) -> String {
    let mut out = String::with_capacity(prefix.len() + 16);
    out.push_str(prefix);
    // Writing to a String cannot fail; a Display impl that reports an
    // error leaves what it wrote.
    let _ = write!(EscapeKey(&mut out), "{key}");
    out
}

fn write_name(out: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            ':' => out.push_str("\\:"),
            c => out.push(c),
        }
    }
}

/// Escapes a key's text as it is written.
struct EscapeKey<'a>(&'a mut String);

impl Write for EscapeKey<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(['\\', '{', '}']) {
            self.0.push_str(&rest[..at]);
            self.0.push_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'{' => "\\(",
                _ => "\\)",
            });
            rest = &rest[at + 1..];
        }
        self.0.push_str(rest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn keyed<Q: Display + ?Sized>(name: &str, key: &Q) -> String {
        keyed_key(&keyed_prefix(DEFAULT_KEY_PREFIX, name), key)
    }

    #[test]
    fn plain_names_and_keys_are_the_prefix_the_version_and_them() {
        assert_eq!(
            single_key(DEFAULT_KEY_PREFIX, "orders-api"),
            "paceline:v1:orders-api"
        );
        assert_eq!(keyed("api", "alice"), "paceline:v1:api:alice");
        assert_eq!(keyed("api", &42u64), "paceline:v1:api:42");
        assert_eq!(single_key("tenant-7", "api"), "tenant-7:v1:api");
    }

    #[test]
    fn names_and_keys_with_colons_do_not_alias() {
        let keys = [
            keyed("api", "admin:x"),
            keyed("api:admin", "x"),
            single_key(DEFAULT_KEY_PREFIX, "api:admin:x"),
        ];
        assert_eq!(keys[0], "paceline:v1:api:admin:x");
        assert_eq!(keys[1], "paceline:v1:api\\:admin:x");
        assert_eq!(keys[2], "paceline:v1:api\\:admin\\:x");
    }

    #[test]
    fn a_key_cannot_choose_its_slot_but_a_name_can() {
        let key = keyed("api", "{victim}x");
        assert_eq!(key, "paceline:v1:api:\\(victim\\)x");
        assert!(!key.contains(['{', '}']));
        assert_eq!(keyed("{tenant}", "k"), "paceline:v1:{tenant}:k");
        assert_eq!(keyed("a", "\\"), "paceline:v1:a:\\\\");
    }

    /// A small deterministic generator (splitmix64).
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Short texts over an alphabet rich in the characters that matter.
    fn text(state: &mut u64, empty: bool) -> String {
        const ALPHABET: [char; 8] = ['a', 'b', ':', '\\', '{', '}', '(', ')'];
        let len = next(state) % 6 + u64::from(!empty);
        (0..len)
            .map(|_| ALPHABET[(next(state) % ALPHABET.len() as u64) as usize])
            .collect()
    }

    /// The rule before escaping, for comparison.
    fn old_key(name: &str, key: Option<&str>) -> String {
        match key {
            None => format!("paceline:{name}"),
            Some(key) => format!("paceline:{name}:{key}"),
        }
    }

    #[test]
    fn a_million_random_pairs_share_no_redis_key() {
        let pairs = if cfg!(debug_assertions) {
            200_000
        } else {
            1_000_000
        };
        let mut state = 18;
        let mut new: HashMap<String, (String, Option<String>)> = HashMap::new();
        let mut old: HashMap<String, (String, Option<String>)> = HashMap::new();
        let (mut collisions, mut old_collisions) = (0, 0);
        for _ in 0..pairs {
            let name = text(&mut state, false);
            let key = next(&mut state)
                .is_multiple_of(2)
                .then(|| text(&mut state, true));
            let redis_key = match &key {
                None => single_key(DEFAULT_KEY_PREFIX, &name),
                Some(key) => keyed(&name, key),
            };
            let pair = (name.clone(), key.clone());
            if new
                .insert(redis_key, pair.clone())
                .is_some_and(|p| p != pair)
            {
                collisions += 1;
            }
            let old_key = old_key(&name, key.as_deref());
            if old.insert(old_key, pair.clone()).is_some_and(|p| p != pair) {
                old_collisions += 1;
            }
        }
        eprintln!(
            "{pairs} random pairs: {collisions} Redis keys shared, {old_collisions} under the old rule"
        );
        assert_eq!(collisions, 0);
        assert!(
            old_collisions > 0,
            "the sample reaches the old rule's aliases"
        );
    }
}
