//! The value `lua/reserve.lua` keeps under a limiter key, decoded: the 4
//! ASCII bytes `thr1`, then six little-endian IEEE doubles
//! (`struct.pack('<c4dddddd', 'thr1', ...)` in the script), 52 bytes in all.
//! Tests read it to compare the script's state with the core's, and write
//! crafted ones (also in the previous, 40-byte format) to check how the
//! script reads, upgrades or refuses them. Also decodes the token a granted
//! reservation replies with.

/// The length of a valid value, in bytes.
pub const STATE_LEN: usize = 52;

/// The marker a valid value starts with.
pub const MARKER: &[u8; 4] = b"thr1";

/// The length of a value in the previous format (five doubles, no marker).
pub const V0_STATE_LEN: usize = 40;

/// The length of a reservation token, in bytes.
pub const TOKEN_LEN: usize = 64;

/// A limiter key's state, field by field, in the script's order.
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
}

fn doubles<const N: usize>(bytes: &[u8]) -> [f64; N] {
    std::array::from_fn(|i| {
        f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    })
}

impl LimiterState {
    /// Decodes a v1 value; an error (with the length) if it is not 52 bytes
    /// starting with the marker.
    pub fn decode(bytes: &[u8]) -> Result<LimiterState, String> {
        if bytes.len() != STATE_LEN || &bytes[..4] != MARKER {
            return Err(format!(
                "a limiter state is {STATE_LEN} bytes starting with `thr1`, got {}: {bytes:?}",
                bytes.len()
            ));
        }
        let [
            stored_permits,
            next_free_micros,
            permits_per_second,
            max_permits,
            expires_micros,
            last_now_micros,
        ] = doubles::<6>(&bytes[4..]);
        Ok(LimiterState {
            stored_permits,
            next_free_micros,
            permits_per_second,
            max_permits,
            expires_micros,
            last_now_micros,
        })
    }

    /// The 52 bytes the script would write for this state.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = MARKER.to_vec();
        bytes.extend(
            [
                self.stored_permits,
                self.next_free_micros,
                self.permits_per_second,
                self.max_permits,
                self.expires_micros,
                self.last_now_micros,
            ]
            .iter()
            .flat_map(|x| x.to_le_bytes()),
        );
        bytes
    }

    /// The 40 bytes of the previous format: the first five fields, no
    /// marker (`last_now_micros` is not stored).
    pub fn encode_v0(&self) -> Vec<u8> {
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

/// A reservation token, decoded: eight little-endian doubles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    pub stored_before: f64,
    pub next_free_before: f64,
    pub stored_after: f64,
    pub next_free_after: f64,
    pub moment_micros: f64,
    /// 1 if the reservation spent stored permits, else 0.
    pub spent_stored: f64,
    pub permits_per_second: f64,
    pub max_permits: f64,
}

impl Token {
    /// Decodes a token; an error if it is not 64 bytes.
    pub fn decode(bytes: &[u8]) -> Result<Token, String> {
        if bytes.len() != TOKEN_LEN {
            return Err(format!(
                "a token is {TOKEN_LEN} bytes, got {}: {bytes:?}",
                bytes.len()
            ));
        }
        let [
            stored_before,
            next_free_before,
            stored_after,
            next_free_after,
            moment_micros,
            spent_stored,
            permits_per_second,
            max_permits,
        ] = doubles::<8>(bytes);
        Ok(Token {
            stored_before,
            next_free_before,
            stored_after,
            next_free_after,
            moment_micros,
            spent_stored,
            permits_per_second,
            max_permits,
        })
    }

    /// The 64 bytes of this token.
    pub fn encode(&self) -> Vec<u8> {
        [
            self.stored_before,
            self.next_free_before,
            self.stored_after,
            self.next_free_after,
            self.moment_micros,
            self.spent_stored,
            self.permits_per_second,
            self.max_permits,
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
    }
}
