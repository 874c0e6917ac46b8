//! The layout of the value a limiter keeps under its Redis key, defined
//! once: the script (`lua/`, [`SCRIPT`]) declares the same constants, and a
//! test holds them to these. Not part of the crate's stable API: it is
//! public for the crate's own tests and for tools that inspect keys.
//!
//! A value is the 4-byte marker [`MARKER`] followed by nine little-endian
//! IEEE doubles, [`VALUE_LEN`] bytes in all: the state (fields 1 to 6, and
//! the ticket's fraction in field 7) and the last write's reservation (the
//! rest of field 7, fields 8 and 9). Field 7 packs three integers,
//! `next_free_fraction * FRACTIONS_SHIFT + fraction_before * 2 +
//! spent_stored`, and stays below [`FRACTIONS_END`]. A value on which
//! reservations wait to be given back starts with [`LEDGER_MARKER`] and
//! carries a ledger after its first [`VALUE_LEN`] bytes: a head of
//! [`LEDGER_HEAD_LEN`] bytes, then at most [`LEDGER_CAPACITY`] groups. A
//! granted reservation's reply is the value it wrote (its token), with its
//! group's id as one more double when it has one ([`TOKEN_WITH_ID_LEN`]).
//! Earlier formats still read: [`THR1_MARKER`] (the same size, no
//! fraction) and a bare [`V0_VALUE_LEN`]-byte value (five doubles).

use std::ops::Range;

/// The limiter's script, assembled from the parts in `lua/` (its protocol:
/// `docs/redis-protocol.md`).
pub const SCRIPT: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/state.lua"),
    include_str!("../../lua/cold.lua"),
    include_str!("../../lua/reserve.lua"),
    include_str!("../../lua/write.lua"),
);

/// The script of a limiter with several limits (`lua/several.lua`, its
/// protocol: `docs/redis-protocol.md`): every limit of a key in one value.
pub const SEVERAL_SCRIPT: &str = include_str!("../../lua/several.lua");

/// The marker of a value with several limits.
pub const SEVERAL_MARKER: &[u8; 4] = b"thr4";

/// The most requests a several-limit value's log keeps.
pub const SEVERAL_LOG_CAPACITY: usize = 64;

/// The most requests one batch carries, in either script.
pub const BATCH_CAPACITY: usize = 1024;

/// The marker of a value without a ledger.
pub const MARKER: &[u8; 4] = b"thr2";

/// The marker of a value that carries a ledger (and of the tokens of
/// reservations made on it).
pub const LEDGER_MARKER: &[u8; 4] = b"thr3";

/// The marker of the previous format: the same size and fields 1 to 6,
/// then its record (stored_before, next_free_before, spent_stored), and no
/// fraction.
pub const THR1_MARKER: &[u8; 4] = b"thr1";

/// The length of a value (and of its first part, when it has a ledger).
pub const VALUE_LEN: usize = 76;

/// The length of a value in the first format (five doubles, no marker).
pub const V0_VALUE_LEN: usize = 40;

/// The length of a ledger's head: six doubles (open, next_id, earliest,
/// in_order, groups, horizon).
pub const LEDGER_HEAD_LEN: usize = 48;

/// The most groups a value's ledger keeps
/// ([`Ledger::SHARED_CAPACITY`](crate::core::Ledger::SHARED_CAPACITY)).
pub const LEDGER_CAPACITY: usize = crate::core::Ledger::SHARED_CAPACITY;

/// The length of a token that carries its group's id.
pub const TOKEN_WITH_ID_LEN: usize = VALUE_LEN + 8;

/// The bytes of field 7 (the packed fractions) in a value.
pub const FRACTIONS_BYTES: Range<usize> = 52..60;

/// Field 7 is `next_free_fraction * FRACTIONS_SHIFT + fraction_before * 2
/// + spent_stored`.
pub const FRACTIONS_SHIFT: u64 = 1 << 21;

/// Field 7 is below this.
pub const FRACTIONS_END: u64 = 1 << 41;

/// One microsecond in fraction units (2^[`FRACTION_BITS`](crate::core::FRACTION_BITS)).
pub const FRACTION_ONE: u64 = 1 << crate::core::FRACTION_BITS;

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the script's `local NAME = value` line.
    fn lua(name: &str) -> &'static str {
        lua_in(SCRIPT, name)
    }

    fn lua_in(script: &'static str, name: &str) -> &'static str {
        let prefix = format!("local {name} = ");
        let line = script
            .lines()
            .find(|line| line.starts_with(&prefix))
            .unwrap_or_else(|| panic!("the script declares no {name}"));
        let value = line[prefix.len()..].split("--").next().unwrap().trim();
        value.trim_matches('\'')
    }

    fn lua_number(name: &str) -> u64 {
        lua(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} = {} is not an integer", lua(name)))
    }

    fn text(marker: &[u8; 4]) -> &str {
        std::str::from_utf8(marker).unwrap()
    }

    #[test]
    fn the_several_script_declares_the_same_layout() {
        let number = |name| lua_in(SEVERAL_SCRIPT, name).parse::<usize>().unwrap();
        assert_eq!(lua_in(SEVERAL_SCRIPT, "SEVERAL"), text(SEVERAL_MARKER));
        assert_eq!(number("LOG_CAPACITY"), SEVERAL_LOG_CAPACITY);
        assert_eq!(number("BATCH_CAPACITY"), BATCH_CAPACITY);
    }

    #[test]
    fn the_script_declares_the_same_layout() {
        assert_eq!(lua("MARKER"), text(MARKER));
        assert_eq!(lua("THR3"), text(LEDGER_MARKER));
        assert_eq!(lua("THR1"), text(THR1_MARKER));
        assert_eq!(lua_number("VALUE_SIZE"), VALUE_LEN as u64);
        assert_eq!(lua_number("LEDGER_START"), VALUE_LEN as u64 + 1);
        assert_eq!(lua_number("LEDGER_CAPACITY"), LEDGER_CAPACITY as u64);
        assert_eq!(lua_number("TOKEN_ID_SIZE"), TOKEN_WITH_ID_LEN as u64);
        assert_eq!(lua_number("FRACTIONS_SHIFT"), FRACTIONS_SHIFT);
        assert_eq!(lua_number("FRACTIONS_END"), FRACTIONS_END);
        assert_eq!(lua_number("FRACTION_ONE"), FRACTION_ONE);
        assert_eq!(lua_number("MAX_MICROS"), crate::core::MAX_MICROS);
        assert_eq!(lua_number("BATCH_CAPACITY"), BATCH_CAPACITY as u64);
        assert_eq!(
            lua_number("FINE_CHARGE_LIMIT") as f64,
            crate::core::FINE_CHARGE_LIMIT_MICROS
        );
        // The packing formats: the marker and nine doubles; six for the
        // ledger's head.
        assert_eq!(lua("VALUE"), "<c4ddddddddd");
        assert_eq!(4 + 9 * 8, VALUE_LEN);
        assert_eq!(lua("LEDGER"), "<dddddd");
        assert_eq!(6 * 8, LEDGER_HEAD_LEN);
        assert_eq!(FRACTIONS_BYTES, 4 + 6 * 8..4 + 7 * 8);
    }
}
