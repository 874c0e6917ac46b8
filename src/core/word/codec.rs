//! A word and the state it stands for: decoding one, encoding the other,
//! and publishing limits as a word.

use super::*;

/// The core's state that `word` stands for at `now`, resynced if permits are
/// stored. Not for mutex mode. Never panics, whatever the configuration holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decoded {
    /// `stored_permits`.
    pub(crate) stored: f64,
    /// `next_free_micros`.
    pub(crate) next_free: u64,
    /// `next_free_fraction`.
    pub(crate) fraction: u32,
}

/// See [`Decoded`].
pub(crate) fn decode(word: u64, now: u64, config: &Config) -> Decoded {
    let payload = word & PAYLOAD;
    if word & STORED != 0 {
        // tat = base + payload / SCALE; stored time at now = now − tat.
        let fixed_now = (i128::from(now) - i128::from(config.base)) << FRAC_BITS;
        let stored = fixed_now - i128::from(payload);
        if stored > 0 {
            let stored = u64::try_from(stored).unwrap_or(u64::MAX);
            return Decoded {
                stored: permits_in(stored, config),
                next_free: now,
                fraction: 0,
            };
        }
        // Written with a later clock reading than `now`: nothing stored yet;
        // the ticket is `tat`.
    }
    // The payload as a time: base + its whole µs, and its fraction.
    let whole = i128::from(config.base) + i128::from(payload >> FRAC_BITS);
    let (next_free, fraction) = if whole < 0 {
        (0, 0) // never written: tickets are encoded from 0 up
    } else if whole < i128::from(MAX_MICROS) {
        (whole as u64, (payload & FRAC_MASK) as u32)
    } else {
        (MAX_MICROS, 0)
    };
    Decoded {
        stored: 0.0,
        next_free,
        fraction,
    }
}

/// [`decode`] into `state`, whose configuration `config` is.
pub(crate) fn decode_into(word: u64, now: u64, config: &Config, state: &mut State) {
    let decoded = decode(word, now, config);
    state.stored_permits = decoded.stored;
    state.next_free_micros = decoded.next_free;
    state.next_free_fraction = decoded.fraction;
}

/// What [`encode`] made of a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoded {
    /// The state, as a word of the same generation.
    Word(u64),
    /// Needs a configuration with a base nearer `now`.
    Rebase,
    /// Permits stored behind a debt: only mutex mode can hold it.
    Mutex,
}

/// The word of generation `generation` (the bits of a word) for the core's
/// state at `now`, under `config`.
pub(crate) fn encode(generation: u64, state: &State, now: u64, config: &Config) -> Encoded {
    let generation = generation & !(STORED | PAYLOAD);
    let stored = state.stored_permits;
    let Some(fixed_now) = config.fixed_now(now) else {
        return Encoded::Rebase;
    };
    // The ticket in fixed point from the base.
    let ticket = ((i128::from(state.next_free_micros) - i128::from(config.base)) << FRAC_BITS)
        + i128::from(state.next_free_fraction);
    // NaN never occurs; it would read as nothing stored.
    let stored_time = if stored.is_nan() || stored <= 0.0 {
        0
    } else {
        fixed(stored * config.interval)
    };
    if stored_time == 0 {
        if ticket > i128::from(config.ceiling) {
            return Encoded::Rebase; // or mutex mode, if it is far ahead
        }
        // A ticket before the base has been idle for more than a full burst:
        // it reads as full from there as from anywhere earlier.
        return Encoded::Word(generation | ticket.max(0) as u64);
    }
    if state.next_free_micros > now {
        return Encoded::Mutex;
    }
    // tat = ticket − stored time, clamped to at most a full burst before now,
    // as the next resync would.
    let tat =
        (ticket - i128::from(stored_time)).max(i128::from(fixed_now) - i128::from(config.burst));
    if tat < 0 {
        return Encoded::Rebase;
    }
    Encoded::Word(generation | STORED | tat as u64)
}

/// The word that publishes `limits` at `now` in the generation after `word`'s,
/// with the configuration to write into that generation's slot before the
/// word: a fresh configuration and the state encoded under it, when the limits
/// are what a word holds (one bursty limit with an empty log, a configuration
/// that fits and a state it can encode); else mutex mode, and none.
pub(crate) fn publish(word: u64, limits: &Limits, now: u64) -> (u64, Option<Config>) {
    let generation = next_generation(word);
    if let ([state], true) = (limits.states(), limits.is_plain())
        && let Some(config) = Config::new(state, now)
    {
        // A fresh base puts `now` mid-window and the burst fits in the half
        // before it, so what fails is a debt reaching past the window, or
        // permits stored behind a debt: mutex mode.
        if let Encoded::Word(new) = encode(generation, state, now, &config) {
            return (new, Some(config));
        }
    }
    (generation | MUTEX, None)
}
