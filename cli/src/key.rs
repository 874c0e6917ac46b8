//! Per-key pacing: how a record's key is found, and the key itself, its
//! bytes as they are.

use std::fmt::{self, Display};

/// A record's key: its bytes, compared as bytes, so that keys that differ
/// only in bytes that are not UTF-8 are paced apart.
///
/// Through Redis a key is its [`Display`] form, which tells every two keys
/// apart: UTF-8 as it is but for `\`, written `\\`; each byte that is not
/// part of valid UTF-8 as `\xNN` (two lowercase hex digits). So `a\xff` and
/// `a\xfe` are two Redis keys, and `\xff` (the four characters) is a third,
/// `\\xff`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Key(Box<[u8]>);

impl Key {
    pub(crate) fn new(bytes: &[u8]) -> Key {
        Key(bytes.into())
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

impl Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for (i, part) in chunk.valid().split('\\').enumerate() {
                if i > 0 {
                    f.write_str("\\\\")?;
                }
                f.write_str(part)?;
            }
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        Ok(())
    }
}

/// How a record's key is found.
pub(crate) enum KeyOf {
    /// Whitespace field N (from 1); none: the empty key.
    Field(usize),
    /// The first group of the regex that takes part in the match (its
    /// whole match if none does); no match: the empty key.
    Regex(regex::bytes::Regex),
}

impl KeyOf {
    /// The key of `record` (without its separator).
    pub(crate) fn key(&self, record: &[u8]) -> Key {
        let key: &[u8] = match self {
            KeyOf::Field(n) => record
                .split(|b| b.is_ascii_whitespace())
                .filter(|field| !field.is_empty())
                .nth(n - 1)
                .unwrap_or(b""),
            KeyOf::Regex(regex) => regex
                .captures(record)
                .and_then(|c| c.iter().skip(1).flatten().next().or_else(|| c.get(0)))
                .map_or(&b""[..], |m| m.as_bytes()),
        };
        Key::new(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(bytes: &[u8]) -> String {
        Key::new(bytes).to_string()
    }

    /// The key is the first group that takes part in the match, the
    /// whole match where none does.
    #[test]
    fn the_first_group_that_captures_is_the_key() {
        let of = |regex: &str, record: &[u8]| {
            KeyOf::Regex(regex::bytes::Regex::new(regex).unwrap()).key(record)
        };
        assert_eq!(of(r"a=(\w+)|b=(\w+)", b"a=x 1"), Key::new(b"x"));
        assert_eq!(of(r"a=(\w+)|b=(\w+)", b"b=y 2"), Key::new(b"y"));
        assert_eq!(of(r"a=\w+|b=(\w+)", b"a=z 3"), Key::new(b"a=z"));
        assert_eq!(of(r"k=(\w*)", b"k= 4"), Key::new(b""));
        assert_eq!(of(r"\d+", b"x 5"), Key::new(b"5"));
        assert_eq!(of(r"(\d+)", b"none"), Key::new(b""));
    }

    #[test]
    fn utf8_reads_as_itself_and_other_bytes_as_escapes() {
        assert_eq!(shown(b"alice"), "alice");
        assert_eq!(shown("café".as_bytes()), "café");
        assert_eq!(shown(b"caf\xe9"), "caf\\xe9");
        assert_eq!(shown(b"a\\b"), "a\\\\b");
        assert_eq!(shown(b"\xff\xfe"), "\\xff\\xfe");
        assert_eq!(shown(b""), "");
    }

    /// No two keys share a form: every byte string of up to four bytes
    /// over an alphabet with a backslash, `x`, hex digits, the two bytes
    /// of `é` and bytes that are never UTF-8 has a form of its own.
    #[test]
    fn the_form_tells_every_two_keys_apart() {
        let alphabet: &[u8] = b"\\xf0a\xc3\xa9\xff";
        let mut keys: Vec<Vec<u8>> = vec![Vec::new()];
        let mut last = keys.clone();
        for _ in 0..4 {
            last = last
                .iter()
                .flat_map(|key| {
                    alphabet.iter().map(move |byte| {
                        let mut key = key.clone();
                        key.push(*byte);
                        key
                    })
                })
                .collect();
            keys.extend(last.iter().cloned());
        }
        let forms: std::collections::HashSet<String> = keys.iter().map(|k| shown(k)).collect();
        assert_eq!(forms.len(), keys.len());
    }
}
