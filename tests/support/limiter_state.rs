//! The value the Lua script (`lua/`) keeps under a limiter key, decoded: the 4
//! ASCII bytes `thr2`, then nine little-endian IEEE doubles
//! (`struct.pack('<c4ddddddddd', 'thr2', ...)` in the script), 76 bytes in
//! all: the state (fields 1 to 6, and the ticket's fraction in field 7) and
//! the last write's reservation (the rest of field 7, fields 8 and 9).
//! Field 7 packs three integers into one double:
//! `next_free_fraction * 2^21 + fraction_before * 2 + spent_stored`.
//! Tests read it to compare the script's state with the core's, and write
//! crafted ones (also in the older formats: `thr1`, 76 bytes, and v0, 40
//! bytes) to check how the script reads, upgrades or refuses them. A
//! granted reservation replies with the value it wrote, which is its token.

use paceline::redis::format;

// The layout, from the crate's one definition of it (`redis::format`),
// under the names these tests use.

/// The length of a valid value, in bytes (also of a `thr1` value).
pub const STATE_LEN: usize = format::VALUE_LEN;
/// The marker a valid value starts with.
pub const MARKER: &[u8; 4] = format::MARKER;
/// The marker of the previous format.
pub const THR1_MARKER: &[u8; 4] = format::THR1_MARKER;
/// The marker of a value that carries a ledger after its 76 bytes.
pub const THR3_MARKER: &[u8; 4] = format::LEDGER_MARKER;
/// The length of a ledger's head.
pub const LEDGER_HEAD_LEN: usize = format::LEDGER_HEAD_LEN;
/// The length of a token that carries its group's id.
pub const TOKEN_WITH_ID_LEN: usize = format::TOKEN_WITH_ID_LEN;
/// The length of a value in the first format.
pub const V0_STATE_LEN: usize = format::V0_VALUE_LEN;
/// The length of a reservation token (a value), in bytes.
pub const TOKEN_LEN: usize = STATE_LEN;
/// The bytes of field 7 (the packed fractions) in a value.
pub const FRACTIONS_BYTES: std::ops::Range<usize> = format::FRACTIONS_BYTES;
/// Field 7's shift for the ticket's fraction.
pub const FRACTIONS_SHIFT: u64 = format::FRACTIONS_SHIFT;
/// One microsecond in fraction units.
pub const FRACTION_ONE: u32 = format::FRACTION_ONE as u32;

/// How many groups the ledger of a value holds (`None` for a value without
/// a ledger).
pub fn ledger_groups(value: &[u8]) -> Option<u64> {
    if value.len() < STATE_LEN + LEDGER_HEAD_LEN || &value[..4] != THR3_MARKER {
        return None;
    }
    let [groups] = doubles::<1>(&value[STATE_LEN + 32..STATE_LEN + 40]);
    Some(groups as u64)
}

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
    /// The ticket's part below the microsecond, in units of 2^-20 µs (the
    /// top of field 7).
    pub next_free_fraction: u32,
}

fn doubles<const N: usize>(bytes: &[u8]) -> [f64; N] {
    std::array::from_fn(|i| {
        f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    })
}

/// Field 7 of a value, as stored.
pub fn fractions_field(value: &[u8]) -> f64 {
    f64::from_le_bytes(value[FRACTIONS_BYTES].try_into().expect("8 bytes"))
}

/// Overwrites field 7 of a value with any double (to craft malformed ones).
pub fn set_fractions_field(value: &mut [u8], raw: f64) {
    value[FRACTIONS_BYTES].copy_from_slice(&raw.to_le_bytes());
}

/// Splits field 7 into (next_free_fraction, fraction_before, spent_stored);
/// an error unless it is an integer in 0..2^41.
fn split_fractions(raw: f64) -> Result<(u32, u32, bool), String> {
    if !(raw >= 0.0 && raw < (1u64 << 41) as f64 && raw.fract() == 0.0) {
        return Err(format!("field 7 is not an integer in 0..2^41: {raw:e}"));
    }
    let packed = raw as u64;
    let low = packed % FRACTIONS_SHIFT;
    Ok((
        (packed / FRACTIONS_SHIFT) as u32,
        (low / 2) as u32,
        low % 2 == 1,
    ))
}

/// Field 7 from its three integers.
fn pack_fractions(next_free_fraction: u32, fraction_before: u32, spent_stored: bool) -> f64 {
    (u64::from(next_free_fraction) * FRACTIONS_SHIFT
        + u64::from(fraction_before) * 2
        + u64::from(spent_stored)) as f64
}

impl LimiterState {
    /// Decodes the state (fields 1 to 6 and the ticket's fraction) of a
    /// thr2 value, or of the first 76 bytes of a thr3 value or token; an
    /// error (with the length) if it is neither, or its field 7 is not an
    /// integer in 0..2^41.
    pub fn decode(bytes: &[u8]) -> Result<LimiterState, String> {
        let thr2 = bytes.len() == STATE_LEN && &bytes[..4] == MARKER;
        let thr3 = bytes.len() >= STATE_LEN && &bytes[..4] == THR3_MARKER;
        if !thr2 && !thr3 {
            return Err(format!(
                "a limiter state is {STATE_LEN} bytes starting with `thr2` (or more, starting \
                 with `thr3`), got {}: {bytes:?}",
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
        let (next_free_fraction, _, _) = split_fractions(fractions_field(bytes))?;
        Ok(LimiterState {
            stored_permits,
            next_free_micros,
            permits_per_second,
            max_permits,
            expires_micros,
            last_now_micros,
            next_free_fraction,
        })
    }

    /// The 76 bytes the script would write for this state with a record of
    /// no reservation (stored, next free and fraction unchanged, nothing
    /// spent).
    pub fn encode(&self) -> Vec<u8> {
        Token {
            state: *self,
            stored_before: self.stored_permits,
            next_free_before: self.next_free_micros,
            fraction_before: self.next_free_fraction,
            spent_stored: false,
        }
        .encode()
    }

    /// Fields 1 to 6 with `marker`: the first 52 bytes of a value.
    fn encode_state(&self, marker: &[u8; 4]) -> Vec<u8> {
        let mut bytes = marker.to_vec();
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

    /// The 76 bytes of the previous format, `thr1`: fields 1 to 6, then a
    /// record of no reservation (stored_before, next_free_before,
    /// spent_stored = 0). It has no fraction: `next_free_fraction` is not
    /// stored.
    pub fn encode_thr1(&self) -> Vec<u8> {
        let mut bytes = self.encode_state(THR1_MARKER);
        bytes.extend(
            [self.stored_permits, self.next_free_micros, 0.0]
                .iter()
                .flat_map(|x| x.to_le_bytes()),
        );
        bytes
    }

    /// The 40 bytes of the first format: the first five fields, no marker
    /// (`last_now_micros` and the fraction are not stored).
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

    /// The ticket in units of 2^-20 µs: `next_free_micros * 2^20 +
    /// next_free_fraction`, exact.
    pub fn ticket_units(&self) -> u128 {
        (u128::from(self.next()) << 20) + u128::from(self.next_free_fraction)
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

/// A value with its record: what a granted reservation replies (its token),
/// and what a cancel sends back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    /// Fields 1 to 6 and the ticket's fraction: the state the reservation
    /// wrote ("after").
    pub state: LimiterState,
    /// Fields 8 and 9, and the record's fraction (in field 7): the state it
    /// found (after the missing-key reading and the rate change, before its
    /// resync).
    pub stored_before: f64,
    pub next_free_before: f64,
    pub fraction_before: u32,
    /// In field 7: whether the reservation spent stored permits.
    pub spent_stored: bool,
}

impl Token {
    /// Decodes a value with its record; an error if it is not 76 bytes
    /// starting with the marker, with an integer in 0..2^41 in field 7.
    pub fn decode(bytes: &[u8]) -> Result<Token, String> {
        let state = LimiterState::decode(bytes)?;
        let (_, fraction_before, spent_stored) = split_fractions(fractions_field(bytes))?;
        let [stored_before, next_free_before] = doubles::<2>(&bytes[60..STATE_LEN]);
        Ok(Token {
            state,
            stored_before,
            next_free_before,
            fraction_before,
            spent_stored,
        })
    }

    /// The 76 bytes of this value.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.state.encode_state(MARKER);
        bytes.extend(
            [
                pack_fractions(
                    self.state.next_free_fraction,
                    self.fraction_before,
                    self.spent_stored,
                ),
                self.stored_before,
                self.next_free_before,
            ]
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
