//! The value `lua/reserve.lua` keeps under a limiter key, decoded: five
//! little-endian IEEE doubles (`struct.pack('<ddddd', ...)` in the script),
//! 40 bytes in all. Tests read it to compare the script's state with the
//! core's, and write crafted ones to check how corrupted values are handled.

/// The length of a valid value, in bytes.
pub const STATE_LEN: usize = 40;

/// A limiter key's state, field by field, in the script's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterState {
    pub stored_permits: f64,
    pub next_free_micros: f64,
    pub permits_per_second: f64,
    pub max_permits: f64,
    /// When the key's TTL ends, as the script last set it (µs, same clock
    /// as `next_free_micros`).
    pub expires_micros: f64,
}

impl LimiterState {
    /// Decodes a value; an error (with the length) if it is not 40 bytes.
    pub fn decode(bytes: &[u8]) -> Result<LimiterState, String> {
        if bytes.len() != STATE_LEN {
            return Err(format!(
                "a limiter state is {STATE_LEN} bytes, got {}: {bytes:?}",
                bytes.len()
            ));
        }
        let field =
            |i: usize| f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(LimiterState {
            stored_permits: field(0),
            next_free_micros: field(1),
            permits_per_second: field(2),
            max_permits: field(3),
            expires_micros: field(4),
        })
    }

    /// The 40 bytes the script would write for this state.
    pub fn encode(&self) -> Vec<u8> {
        [
            self.stored_permits,
            self.next_free_micros,
            self.permits_per_second,
            self.max_permits,
            self.expires_micros,
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
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

    /// GETs `key` and decodes it: `None` if the key is missing; panics if
    /// the value is not a state.
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
