//! The value `lua/reserve.lua` keeps under a limiter key, decoded: the 4
//! ASCII bytes `thr1`, then nine little-endian IEEE doubles
//! (`struct.pack('<c4ddddddddd', 'thr1', ...)` in the script), 76 bytes in
//! all: the state (fields 1 to 6) and the last write's reservation (7 to
//! 9). Tests read it to compare the script's state with the core's, and
//! write crafted ones (also in the previous, 40-byte format) to check how
//! the script reads, upgrades or refuses them. A granted reservation
//! replies with the value it wrote, which is its token.

/// The length of a valid value, in bytes.
pub const STATE_LEN: usize = 76;

/// The marker a valid value starts with.
pub const MARKER: &[u8; 4] = b"thr1";

/// The length of a value in the previous format (five doubles, no marker).
pub const V0_STATE_LEN: usize = 40;

/// The length of a reservation token (a value), in bytes.
pub const TOKEN_LEN: usize = STATE_LEN;

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
    /// Decodes the state (fields 1 to 6) of a v1 value; an error (with the
    /// length) if it is not 76 bytes starting with the marker.
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
        ] = doubles::<6>(&bytes[4..52]);
        Ok(LimiterState {
            stored_permits,
            next_free_micros,
            permits_per_second,
            max_permits,
            expires_micros,
            last_now_micros,
        })
    }

    /// The 76 bytes the script would write for this state with a record of
    /// no reservation (stored and next free unchanged, nothing spent).
    pub fn encode(&self) -> Vec<u8> {
        Token {
            state: *self,
            stored_before: self.stored_permits,
            next_free_before: self.next_free_micros,
            spent_stored: 0.0,
        }
        .encode()
    }

    /// Fields 1 to 6 with the marker: the first 52 bytes of a value.
    fn encode_state(&self) -> Vec<u8> {
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

/// A value with its reservation record: what a granted reservation replies
/// (its token), and what a cancel sends back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    /// Fields 1 to 6: the state the reservation wrote ("after").
    pub state: LimiterState,
    /// Fields 7 and 8: the state it found (after the missing-key reading
    /// and the rate change, before its resync).
    pub stored_before: f64,
    pub next_free_before: f64,
    /// Field 9: 1 if the reservation spent stored permits, else 0.
    pub spent_stored: f64,
}

impl Token {
    /// Decodes a value with its record; an error if it is not 76 bytes
    /// starting with the marker.
    pub fn decode(bytes: &[u8]) -> Result<Token, String> {
        let state = LimiterState::decode(bytes)?;
        let [stored_before, next_free_before, spent_stored] = doubles::<3>(&bytes[52..]);
        Ok(Token {
            state,
            stored_before,
            next_free_before,
            spent_stored,
        })
    }

    /// The 76 bytes of this value.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.state.encode_state();
        bytes.extend(
            [self.stored_before, self.next_free_before, self.spent_stored]
                .iter()
                .flat_map(|x| x.to_le_bytes()),
        );
        bytes
    }

    /// When the reservation's permits may be used: its ticket after its
    /// resync, `max(next_free_before, last_now_micros)`.
    pub fn moment_micros(&self) -> f64 {
        self.next_free_before.max(self.state.last_now_micros)
    }

    /// The wait the reply carries: `moment - now`.
    pub fn wait_micros(&self) -> f64 {
        self.moment_micros() - self.state.last_now_micros
    }

    /// The debt the reply carries: `next_free_micros - now`.
    pub fn debt_micros(&self) -> f64 {
        self.state.next_free_micros - self.state.last_now_micros
    }
}
