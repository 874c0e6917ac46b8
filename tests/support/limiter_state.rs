//! The limiter's script and the value it keeps under a key, for the tests
//! that call the script directly.
//!
//! The script is assembled as the crate assembles it: the parts of `lua/`
//! in the order `src/redis/script.rs` lists them; its constants are read
//! from its own source. A value (see `docs/redis-protocol.md`, Value) is
//! the marker `plv1`, then little-endian doubles: the hot part (the
//! shape: the limits plus 32 per logged request plus 4128 times the record's
//! bound plus one, plus 70176 if the limits learned anything;
//! last_now_micros; next_id; the record: the moment of the last request
//! granted; three per limit: stored_permits, next_free_micros,
//! next_free_fraction), then expires_micros and two per limit (the rate and
//! max_permits it was last charged at), then what the limits learned if
//! they did (factor, paused_until, increased_at, margin, a cap per limit),
//! and while the log holds any request: how many requests that left it are
//! still in the value, three per limit (the states before its first), and
//! 3 + limits per request (id, the first limit's count, now, moment, the
//! other limits' counts; an open call's first count is stored as
//! -1 - count), those that left it first. A granted reservation replies what it wrote,
//! from its hot part on (with the marker if it wrote the value whole).

use std::sync::OnceLock;

/// The marker a value starts with.
pub const MARKER: &[u8; 4] = b"plv1";

/// One microsecond in fraction units (2^20).
pub const FRACTION_ONE: u32 = 1 << 20;

/// A file of the repository (from the crate's tests, or from `benches/`,
/// a crate of its own one directory down).
fn read(path: &str) -> String {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if here.join("src/redis/script.rs").exists() {
        here
    } else {
        here.parent().expect("the repository")
    };
    let path = root.join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The script's text, as the crate assembles it.
pub fn script_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let rust = read("src/redis/script.rs");
        let parts: Vec<&str> = rust
            .split("include_str!(\"../../")
            .skip(1)
            .map(|rest| &rest[..rest.find('"').expect("a closing quote")])
            .collect();
        assert!(
            parts.len() >= 2,
            "src/redis/script.rs lists the parts: {parts:?}"
        );
        parts.iter().map(|part| read(part)).collect()
    })
}

/// The script, ready to run.
pub fn script() -> redis::Script {
    redis::Script::new(script_source())
}

/// The value of the script's `local NAME = value` line (a constant that one
/// branch alone uses is declared there, indented).
pub fn lua_constant(name: &str) -> &'static str {
    let prefix = format!("local {name} = ");
    let line = script_source()
        .lines()
        .map(str::trim_start)
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("the script declares no {name}"));
    let value = line[prefix.len()..].split("--").next().unwrap().trim();
    value.trim_matches('\'')
}

/// A numeric constant of the script.
pub fn lua_number(name: &str) -> usize {
    lua_constant(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a whole number"))
}

fn doubles(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|chunk| f64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect()
}

fn le(numbers: &[f64]) -> Vec<u8> {
    numbers.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One limit's state in a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitState {
    pub stored_permits: f64,
    pub next_free_micros: f64,
    /// The ticket's part below the microsecond, in units of 2^-20 µs.
    pub next_free_fraction: f64,
    pub permits_per_second: f64,
    pub max_permits: f64,
}

/// A value, field by field.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// When the key's TTL ends, as the script last set it (µs, on the clock
    /// as read).
    pub expires_micros: f64,
    /// The latest clock reading a call used on this key.
    pub last_now_micros: f64,
    /// The least id the next held reservation that waits gets.
    pub next_id: f64,
    pub limits: Vec<LimitState>,
    /// The record: the moment of the last request granted and the limit
    /// that bound it (-1: none).
    pub moment_micros: f64,
    pub bound: f64,
    /// What the limits learned, if they did: factor, paused_until,
    /// increased_at, margin, then a cap per limit.
    pub learned: Option<Vec<f64>>,
    /// The log: the states before its first request (stored, ticket,
    /// fraction per limit), then each request (id, the first limit's count
    /// or -1 - it for an open call, now, moment, the other limits'
    /// counts; the id -1 - limit for a resume, -101 - limit for a lesson's
    /// cap on what the limit stores, with limits from 1).
    pub base: Vec<[f64; 3]>,
    pub log: Vec<Vec<f64>>,
    /// Requests that left the log, still in the value (before the log's).
    pub dead: Vec<Vec<f64>>,
}

/// Where a logged request's fields are (see [`Value::log`]).
pub const ENTRY_ID: usize = 0;
/// Its count for the first limit (-1 - count for an open call).
pub const ENTRY_COUNT: usize = 1;
pub const ENTRY_NOW: usize = 2;
pub const ENTRY_MOMENT: usize = 3;

/// The shape's flag of a value that holds what its limits learned.
pub const LEARNED: f64 = 70176.0;

impl Value {
    /// Decodes a value, or a granted reservation's reply (its hot part
    /// only: the TTL's end and the rates read -1, the log empty); an error
    /// with the bytes if it is not one.
    pub fn decode(bytes: &[u8]) -> Result<Value, String> {
        let bad = || format!("not a value ({} bytes): {bytes:?}", bytes.len());
        let whole = bytes.starts_with(MARKER);
        let body = if whole { &bytes[4..] } else { bytes };
        if body.len() < 32 || !body.len().is_multiple_of(8) {
            return Err(bad());
        }
        let numbers = doubles(body);
        let shape = numbers[0];
        if !(shape >= 1.0 && shape.fract() == 0.0) {
            return Err(bad());
        }
        let limits = shape as usize % 32;
        let logged = shape as usize / 32 % 129;
        let learns = shape >= LEARNED;
        let hot = 4 + 3 * limits;
        let fixed = hot + 1 + 2 * limits;
        if numbers.len() < if whole { fixed } else { hot } {
            return Err(bad());
        }
        let state = |i: usize| {
            let f = &numbers[4 + 3 * i..7 + 3 * i];
            let (rate, max) = if whole {
                (numbers[hot + 1 + 2 * i], numbers[hot + 2 + 2 * i])
            } else {
                (-1.0, -1.0)
            };
            LimitState {
                stored_permits: f[0],
                next_free_micros: f[1],
                next_free_fraction: f[2],
                permits_per_second: rate,
                max_permits: max,
            }
        };
        let mut value = Value {
            expires_micros: if whole { numbers[hot] } else { -1.0 },
            last_now_micros: numbers[1],
            next_id: numbers[2],
            limits: (0..limits).map(state).collect(),
            moment_micros: numbers[3],
            bound: ((shape % LEARNED) / 4128.0).floor() - 1.0,
            learned: None,
            base: Vec::new(),
            log: Vec::new(),
            dead: Vec::new(),
        };
        if !whole {
            return Ok(value);
        }
        let mut fixed = fixed;
        if learns {
            let learned = numbers.get(fixed..fixed + 4 + limits).ok_or_else(bad)?;
            value.learned = Some(learned.to_vec());
            fixed += 4 + limits;
        }
        if numbers.len() == fixed && logged == 0 {
            return Ok(value);
        }
        let width = 3 + limits;
        let dead = *numbers.get(fixed).ok_or_else(bad)? as usize;
        if logged == 0 || numbers.len() != fixed + 1 + 3 * limits + width * (dead + logged) {
            return Err(bad());
        }
        let rest = &numbers[fixed + 1..];
        value.base = rest[..3 * limits]
            .chunks_exact(3)
            .map(|f| [f[0], f[1], f[2]])
            .collect();
        let requests: Vec<Vec<f64>> = rest[3 * limits..]
            .chunks_exact(width)
            .map(<[f64]>::to_vec)
            .collect();
        value.dead = requests[..dead].to_vec();
        value.log = requests[dead..].to_vec();
        Ok(value)
    }

    /// The bytes of this value.
    pub fn encode(&self) -> Vec<u8> {
        let learned = if self.learned.is_some() { LEARNED } else { 0.0 };
        let shape = self.limits.len() as f64
            + 32.0 * self.log.len() as f64
            + 4128.0 * (self.bound + 1.0)
            + learned;
        let mut numbers = vec![
            shape,
            self.last_now_micros,
            self.next_id,
            self.moment_micros,
        ];
        for limit in &self.limits {
            numbers.extend([
                limit.stored_permits,
                limit.next_free_micros,
                limit.next_free_fraction,
            ]);
        }
        numbers.push(self.expires_micros);
        for limit in &self.limits {
            numbers.extend([limit.permits_per_second, limit.max_permits]);
        }
        if let Some(learned) = &self.learned {
            numbers.extend(learned);
        }
        if !self.log.is_empty() {
            numbers.push(self.dead.len() as f64);
            numbers.extend(self.base.iter().flatten());
            numbers.extend(self.dead.iter().flatten());
            numbers.extend(self.log.iter().flatten());
        }
        [&MARKER[..], &le(&numbers)].concat()
    }

    /// GETs `key` and decodes it: `None` if the key is missing; panics if
    /// the value is not one.
    pub fn read(con: &mut redis::Connection, key: &str) -> Option<Value> {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query(con)
            .unwrap_or_else(|e| panic!("GET {key}: {e}"));
        value.map(|bytes| Value::decode(&bytes).unwrap_or_else(|e| panic!("{key}: {e}")))
    }

    /// How many requests the log holds, or `None` without a log.
    pub fn logged(&self) -> Option<usize> {
        (!self.log.is_empty()).then_some(self.log.len())
    }
}

/// A one-limit key's state, field by field: its limit and the head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterState {
    pub stored_permits: f64,
    pub next_free_micros: f64,
    pub permits_per_second: f64,
    pub max_permits: f64,
    /// When the key's TTL ends, as the script last set it (µs, on the clock
    /// as read, without the floor of `last_now_micros`).
    pub expires_micros: f64,
    /// The latest clock reading a call used on this key (µs).
    pub last_now_micros: f64,
    /// The ticket's part below the microsecond, in units of 2^-20 µs.
    pub next_free_fraction: u32,
}

impl LimiterState {
    /// The first limit's state and the head of a value (or of a granted
    /// reservation's reply: its rate, max_permits and TTL's end read -1);
    /// an error if it is not one, or its fraction is not an integer in
    /// 0..2^20.
    pub fn decode(bytes: &[u8]) -> Result<LimiterState, String> {
        let value = Value::decode(bytes)?;
        let limit = value.limits[0];
        let fraction = limit.next_free_fraction;
        if !(0.0..f64::from(FRACTION_ONE)).contains(&fraction) || fraction.fract() != 0.0 {
            return Err(format!("next_free_fraction {fraction:e} in {value:?}"));
        }
        Ok(LimiterState {
            stored_permits: limit.stored_permits,
            next_free_micros: limit.next_free_micros,
            permits_per_second: limit.permits_per_second,
            max_permits: limit.max_permits,
            expires_micros: value.expires_micros,
            last_now_micros: value.last_now_micros,
            next_free_fraction: fraction as u32,
        })
    }

    /// A one-limit value holding this state, with no log, ids from 0 and a
    /// record of nothing granted.
    pub fn encode(&self) -> Vec<u8> {
        self.with_next_id(0.0).encode()
    }

    /// The value of this state with `next_id`.
    pub fn with_next_id(&self, next_id: f64) -> Value {
        Value {
            expires_micros: self.expires_micros,
            last_now_micros: self.last_now_micros,
            next_id,
            limits: vec![LimitState {
                stored_permits: self.stored_permits,
                next_free_micros: self.next_free_micros,
                next_free_fraction: f64::from(self.next_free_fraction),
                permits_per_second: self.permits_per_second,
                max_permits: self.max_permits,
            }],
            moment_micros: self.last_now_micros,
            bound: -1.0,
            learned: None,
            base: Vec::new(),
            log: Vec::new(),
            dead: Vec::new(),
        }
    }

    /// `next_free_micros` as an integer; panics if it is not one.
    pub fn next(&self) -> u64 {
        let next = self.next_free_micros;
        assert!(
            next >= 0.0 && next.fract() == 0.0 && next <= (1u64 << 53) as f64,
            "next_free_micros {next} is not an integer in 0..=2^53"
        );
        next as u64
    }

    /// The ticket in units of 2^-20 µs: `next_free_micros * 2^20 +
    /// next_free_fraction`, exact.
    pub fn ticket_units(&self) -> u128 {
        (u128::from(self.next()) << 20) + u128::from(self.next_free_fraction)
    }

    /// GETs `key` and decodes it: `None` if the key is missing; panics if
    /// the value is not one.
    pub fn read(con: &mut redis::Connection, key: &str) -> Option<LimiterState> {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query(con)
            .unwrap_or_else(|e| panic!("GET {key}: {e}"));
        value.map(|bytes| {
            LimiterState::decode(&bytes).unwrap_or_else(|e| panic!("the value of {key}: {e}"))
        })
    }
}

/// A reservation's reply, decoded: granted (what it wrote of the value: its
/// wait, the key's debt after it, the limit that bound it and the id of a
/// held one that waits), or refused (the state it found, with the clock;
/// the rates read -1; one limit that stores nothing replies its wait
/// negated, read as that state on a clock at 0, with no fraction).
#[derive(Debug, Clone, PartialEq)]
pub enum Reserved {
    Granted {
        wait: u64,
        debt: u64,
        bound: i64,
        value: Value,
    },
    Refused {
        now: u64,
        limits: Vec<LimitState>,
    },
}

impl Reserved {
    /// Decodes the reply of a reservation on `limits` limits as Redis gave
    /// it: the bytes [`decode`](Self::decode) reads, or a refusal's integer.
    pub fn from_reply(reply: &redis::Value, limits: usize) -> Result<Reserved, String> {
        match reply {
            redis::Value::BulkString(bytes) => Reserved::decode(bytes, limits),
            redis::Value::Int(n) if *n < 0 && limits == 1 => Ok(Reserved::Refused {
                now: 0,
                limits: vec![LimitState {
                    stored_permits: 0.0,
                    next_free_micros: n.unsigned_abs() as f64,
                    next_free_fraction: 0.0,
                    permits_per_second: -1.0,
                    max_permits: -1.0,
                }],
            }),
            other => Err(format!("not a reservation's reply: {other:?}")),
        }
    }

    /// Decodes the reply of a reservation on `limits` limits.
    pub fn decode(bytes: &[u8], limits: usize) -> Result<Reserved, String> {
        if bytes.len() == 8 + 24 * limits {
            let numbers = doubles(bytes);
            let limits = numbers[1..]
                .chunks_exact(3)
                .map(|f| LimitState {
                    stored_permits: f[0],
                    next_free_micros: f[1],
                    next_free_fraction: f[2],
                    permits_per_second: -1.0,
                    max_permits: -1.0,
                })
                .collect();
            return Ok(Reserved::Refused {
                now: numbers[0] as u64,
                limits,
            });
        }
        let value = Value::decode(bytes)?;
        if value.limits.len() != limits {
            return Err(format!("a reply of another number of limits: {value:?}"));
        }
        let now = value.last_now_micros;
        let latest = value
            .limits
            .iter()
            .map(|l| l.next_free_micros)
            .fold(now, f64::max);
        Ok(Reserved::Granted {
            wait: (value.moment_micros - now) as u64,
            debt: (latest - now) as u64,
            bound: value.bound as i64,
            value,
        })
    }

    /// The wait it would have needed, for a refused one: the latest ticket
    /// less the clock.
    pub fn refused_wait(&self) -> Option<u64> {
        match self {
            Reserved::Refused { now, limits } => Some(
                limits
                    .iter()
                    .map(|l| l.next_free_micros as u64)
                    .max()
                    .unwrap_or(0)
                    .max(*now)
                    - now,
            ),
            Reserved::Granted { .. } => None,
        }
    }
}
