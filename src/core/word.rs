//! The lock-free fast path: [`Limits`] of one bursty limit with an empty log,
//! its whole state in one `u64`, and a reservation as one pure function from
//! the old word to the new one.
//!
//! Everything here is arithmetic over a word, `now`, the request and the
//! generation's [`Config`]: no clock, no atomics, no I/O. The local limiter
//! keeps the word in an atomic and writes a step's result with one
//! compare-and-swap; a keyed limiter keeps one per key. A configuration, a
//! state or a step the word cannot hold goes to the limits themselves, under a
//! lock: *mutex mode*.
//!
//! # Why one number is enough
//!
//! A [`State`] keeps two numbers, `stored_permits` and `next_free_micros`. For
//! the bursty policy they fold into one, the *theoretical arrival time*
//!
//! ```text
//! tat = next_free_micros − stored_permits × interval
//! ```
//!
//! the moment the limiter would be free had the stored permits never been
//! saved. Everything the core computes can be read back from it at `now`:
//!
//! * resync: `stored(now) = min((now − tat) / interval, max_permits)`, i.e.
//!   `tat ← max(tat, now − max_permits × interval)`: resyncing is clamping;
//! * a reservation of `p` permits pushes it by `p × interval`, stored (free)
//!   or fresh, and the caller waits `max(tat, now) − now` before the push
//!   ([pre-consumption](super#pre-consumption-the-next-caller-pays)).
//!
//! This holds whenever `next_free_micros <= now` or `stored_permits == 0`:
//! every state the bursty core reaches from a monotonic clock but one, leaving
//! an infinite rate while a debt is outstanding (the core then stores a full
//! burst *behind* the debt), which runs in mutex mode. With one limit,
//! [`Limits`] is its [`State`] (every request goes at the limit's own moment),
//! and with nothing logged there is nothing else to it: so the word is the
//! whole of the limits, until a reservation that may be given back has to wait
//! and is logged (mutex mode again, until the log is empty).
//!
//! # The word
//!
//! ```text
//!  63        55 54 53                                               0
//! +------------+--+--------------------------------------------------+
//! | generation |B | payload                                          |
//! +------------+--+--------------------------------------------------+
//! ```
//!
//! Both payloads are times in fixed point with [`FRAC_BITS`] fractional bits
//! (the core's 2^-20 µs), relative to the `base` of the generation's
//! configuration, so they cover a window of 2^34 µs (4.7 hours) around the
//! present. A step that would leave the window goes to the lock and *rebases*:
//! a new generation with a new base.
//!
//! * `B = 0`: nothing is stored; the payload is the core's ticket,
//!   `next_free_micros − base` in its integer bits and `next_free_fraction` in
//!   its fractional bits. The payload `2^54 − 1` marks mutex mode: the state
//!   is the [`Limits`] behind the limiter's lock. A debt reaching past the
//!   window (more than about two hours ahead) stays in mutex mode until it is
//!   back within it.
//! * `B = 1`: permits are stored; the payload is `tat`.
//!
//! The generation (9 bits) selects one of two configuration slots (interval,
//! burst, base). Changing the rate or rebasing writes the slot not in use,
//! then publishes the new generation in the word with a compare-and-swap, so a
//! reservation computed from an older configuration fails its own
//! compare-and-swap and retries; a refusal, which writes nothing, checks the
//! word's generation again after reading the slot. (That needs fewer than 2^9
//! configuration changes during one reservation's few instructions.)
//!
//! # Exactness
//!
//! From a `B = 0` word a step performs exactly the core's floating-point and
//! fixed-point operations, so it agrees with the core to the bit, the ticket's
//! fraction included. Stored permits are held as `tat` to 2^-20 µs rather than
//! the core's `f64` count, so once stored permits were spent a later wait may
//! differ from the core's by a rounding of at most one microsecond (a
//! differential test holds the word to [`Limits`] of one limit on random
//! sequences: to the bit until it first holds stored permits, to the
//! microsecond from then on).

use super::{
    FINE_CHARGE_LIMIT_MICROS, FRACTION_BITS, Limits, MAX_MICROS, Policy, State, to_micros,
};

/// Where the generation starts.
const GEN_SHIFT: u32 = 55;
/// Generations count modulo 2^9.
const GEN_MASK: u64 = (1 << 9) - 1;
/// Set when permits are stored (the payload is a fixed-point `tat`).
const STORED: u64 = 1 << 54;
/// The payload bits.
const PAYLOAD: u64 = STORED - 1;
/// The payload that marks mutex mode (with `STORED` clear).
const MUTEX: u64 = PAYLOAD;
/// Fractional bits of a fixed-point time: the core's.
const FRAC_BITS: u32 = FRACTION_BITS;
/// The fractional bits of a payload.
const FRAC_MASK: u64 = (1 << FRAC_BITS) - 1;
/// 2^FRAC_BITS, as a float.
const SCALE: f64 = (1u64 << FRAC_BITS) as f64;
/// The span of times a fixed-point payload covers, in µs: 2^34.
const WINDOW: u64 = 1 << (54 - FRAC_BITS);
/// A new base lies this far before `now`: half the window each way.
const HALF_WINDOW: u64 = WINDOW / 2;

/// What one step from a word decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The debt does not fit in the timeout: nothing to write.
    Refused,
    /// Write `word` (compare-and-swap); the caller waits `wait` µs.
    Granted { word: u64, wait: u64 },
    /// Needs the lock: mutex mode, a rebase, or a state written with a later
    /// clock reading than this caller's.
    Slow,
}

/// The numbers a step needs from a generation's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Config {
    /// `stable_interval_micros`.
    pub(crate) interval: f64,
    /// `max_permits`.
    pub(crate) max_permits: f64,
    /// `max_permits × interval`, in fixed point: the most time that can be
    /// stored.
    pub(crate) burst: u64,
    /// The origin of fixed-point payloads, in µs (may be negative).
    pub(crate) base: i64,
    /// What one permit costs, stored or fresh, in fixed point:
    /// `charge(interval)`.
    pub(crate) unit_charge: u64,
    /// The latest ticket a word with nothing stored may hold ([`ceiling`]); a
    /// step past it goes to the lock.
    pub(crate) ceiling: u64,
}

impl Config {
    /// The configuration for `state` with a base around `now`, or `None` if it
    /// must run in mutex mode: a warming-up policy, a burst longer than half
    /// the window, or a rate so extreme that the core caps its interval or its
    /// burst.
    ///
    /// The word holds stored permits as stored *time*. A rate change keeps the
    /// stored fraction of the burst, so stored time carries over unchanged as
    /// long as `max_permits × interval` is the configured burst, which capping
    /// would break (a burst of 10^-280 µs at one rate can be a day's worth at
    /// the next).
    pub(crate) fn new(state: &State, now: u64) -> Option<Config> {
        let Policy::Bursty(bursty) = &state.policy else {
            return None;
        };
        let interval = state.stable_interval_micros;
        if interval >= MAX_MICROS as f64 || state.max_permits >= f64::MAX {
            return None;
        }
        let burst_micros = state.max_permits * interval;
        // NaN and infinity fail the comparison too.
        let fits = burst_micros <= HALF_WINDOW as f64 && bursty.max_burst_micros <= HALF_WINDOW;
        if !fits {
            return None;
        }
        let base = now as i64 - HALF_WINDOW as i64;
        Some(Config {
            interval,
            max_permits: state.max_permits,
            burst: fixed(burst_micros),
            base,
            unit_charge: charge(interval),
            ceiling: ceiling(base),
        })
    }

    /// `(now − base)` in fixed point, if `now` lies in the window.
    #[inline(always)]
    fn fixed_now(&self, now: u64) -> Option<u64> {
        fixed_now(now, self.base)
    }
}

/// The latest payload a word with nothing stored may hold under `base`:
/// `MAX_MICROS` (where the core saturates) in fixed point, or the last payload
/// below `MUTEX`, whichever comes first.
fn ceiling(base: i64) -> u64 {
    let max = (i128::from(MAX_MICROS) - i128::from(base)) << FRAC_BITS;
    max.clamp(0, i128::from(MUTEX - 1)) as u64
}

/// `(now − base)` in fixed point, if `now` lies in the window.
#[inline(always)]
fn fixed_now(now: u64, base: i64) -> Option<u64> {
    // A `now` before the base wraps to a huge number and is rejected too.
    let relative = now.wrapping_sub(base as u64);
    (relative < WINDOW).then_some(relative << FRAC_BITS)
}

/// What a step reads of its generation's configuration: a [`Config`], or a
/// place another thread may rewrite (the local limiter's two slots, in
/// atomics). A step reads each number only where it needs it, so that little
/// lies between its load of the word and its compare-and-swap; the common
/// steps read three.
pub(crate) trait Settings {
    /// [`Config::base`].
    fn base(&self) -> i64;
    /// [`Config::burst`].
    fn burst(&self) -> u64;
    /// [`Config::ceiling`].
    fn ceiling(&self) -> u64;
    /// [`Config::unit_charge`].
    fn unit_charge(&self) -> u64;
    /// [`Config::interval`].
    fn interval(&self) -> f64;
    /// All of it, for the steps that need more.
    fn config(&self) -> Config;

    /// What `permits` permits cost (fixed point), stored or fresh; precomputed
    /// for one.
    #[inline(always)]
    fn charge_for(&self, permits: u32) -> u64 {
        if permits == 1 {
            self.unit_charge()
        } else {
            charge(f64::from(permits) * self.interval())
        }
    }
}

impl Settings for Config {
    #[inline(always)]
    fn base(&self) -> i64 {
        self.base
    }

    #[inline(always)]
    fn burst(&self) -> u64 {
        self.burst
    }

    #[inline(always)]
    fn ceiling(&self) -> u64 {
        self.ceiling
    }

    #[inline(always)]
    fn unit_charge(&self) -> u64 {
        self.unit_charge
    }

    #[inline(always)]
    fn interval(&self) -> f64 {
        self.interval
    }

    #[inline(always)]
    fn config(&self) -> Config {
        *self
    }

    /// As the default, but out of line for more than one permit: from plain
    /// fields (unlike atomics) the compiler would compute both costs and pick
    /// one, putting the arithmetic of many permits on the path of one.
    #[inline(always)]
    fn charge_for(&self, permits: u32) -> u64 {
        if permits == 1 {
            self.unit_charge
        } else {
            self.charge_many(permits)
        }
    }
}

impl Config {
    /// What `permits` permits cost, for [`Settings::charge_for`].
    #[cold]
    #[inline(never)]
    fn charge_many(&self, permits: u32) -> u64 {
        charge(f64::from(permits) * self.interval)
    }
}

/// A charge in fixed point, as `State::charge` adds it to the ticket: to the
/// nearest 2^-20 µs below `FINE_CHARGE_LIMIT_MICROS`, else to the whole µs
/// (truncated); capped at 2^62 so that adding it to a payload cannot overflow
/// (any charge that leaves the window has the same effect).
#[inline(always)]
fn charge(micros: f64) -> u64 {
    if micros < FINE_CHARGE_LIMIT_MICROS {
        fixed(micros)
    } else {
        to_micros(micros).min(1 << (62 - FRAC_BITS)) << FRAC_BITS
    }
}

/// Which of the two configurations (slots) a word's generation uses.
#[inline]
pub(crate) fn slot_index(word: u64) -> usize {
    ((word >> GEN_SHIFT) & 1) as usize
}

/// The generation after `word`'s, as the generation bits of a word.
const fn next_generation(word: u64) -> u64 {
    (((word >> GEN_SHIFT) + 1) & GEN_MASK) << GEN_SHIFT
}

/// Whether two words are of one generation, so of one configuration (while
/// fewer than 2^9 configuration changes lie between them).
#[inline(always)]
pub(crate) fn same_generation(a: u64, b: u64) -> bool {
    (a ^ b) >> GEN_SHIFT == 0
}

/// Whether the word holds stored permits.
#[inline(always)]
pub(crate) fn has_stored(word: u64) -> bool {
    word & STORED != 0
}

/// The latest clock reading (µs) at which `word` (under `config`) can have
/// been written: its ticket if nothing is stored, else its `tat` plus a full
/// burst (a step leaves `tat` at least a burst before its `now`). Orders a
/// keyed limiter's entries from least to most recently used.
pub(crate) fn last_use(word: u64, config: &Config) -> u64 {
    let payload = word & PAYLOAD;
    let latest = if word & STORED == 0 {
        payload
    } else {
        payload.saturating_add(config.burst)
    };
    let micros = i128::from(config.base) + i128::from(latest >> FRAC_BITS);
    micros.clamp(0, i128::from(MAX_MICROS)) as u64
}

/// When `word` (under `config`) reads as full if nothing more is reserved
/// (µs): `tat` plus a full burst, whether permits are stored or not (with
/// none, `tat` is the ticket), as [`State::full_at`](super::State::full_at)
/// reads the state it stands for.
pub(crate) fn full_at(word: u64, config: &Config) -> u64 {
    let full = (word & PAYLOAD).saturating_add(config.burst);
    let micros = i128::from(config.base) + i128::from(full >> FRAC_BITS);
    micros.clamp(0, i128::from(MAX_MICROS)) as u64
}

/// Whether a new base for `now` would differ enough from `config`'s to be
/// worth re-encoding a whole keyed shard: `now` has left the window, or moved
/// an eighth of it past the middle. (Closer to the base, a state that does not
/// fit is one far in debt, which no base would hold for long.)
pub(crate) fn worth_rebasing(config: &Config, now: u64) -> bool {
    let relative = i128::from(now) - i128::from(config.base);
    relative < 0 || relative >= i128::from(HALF_WINDOW + WINDOW / 8)
}

/// Whether the limiter is in mutex mode.
#[inline]
pub(crate) fn is_mutex(word: u64) -> bool {
    word & (STORED | PAYLOAD) == MUTEX
}

/// A non-negative duration in µs to fixed point, rounded to nearest,
/// saturating.
#[inline]
fn fixed(micros: f64) -> u64 {
    (micros * SCALE + 0.5) as u64
}

/// The common step, spending stored permits from a word of one generation at
/// one `now`, prepared before the word is (re)loaded so that little happens
/// between the load and the compare-and-swap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quick {
    /// The generation bits, with `STORED`: the words this applies to.
    tag: u64,
    /// `now` in fixed point; 0 if outside the window (nothing applies).
    fixed_now: u64,
    /// A full burst before `now`.
    full: u64,
    /// What the permits cost.
    charge: u64,
}

impl Quick {
    /// Prepares the step for words of `word`'s generation, configured by
    /// `settings`.
    #[inline(always)]
    pub(crate) fn new(word: u64, now: u64, permits: u32, settings: &impl Settings) -> Quick {
        let fixed_now = fixed_now(now, settings.base()).unwrap_or(0);
        Quick {
            tag: (word & !PAYLOAD) | STORED,
            fixed_now,
            full: fixed_now.saturating_sub(settings.burst()),
            charge: settings.charge_for(permits),
        }
    }

    /// The new word if `word` is of the prepared generation, has stored
    /// permits and keeps some after this step: what [`step`] would return as
    /// `Granted { word, wait: 0 }`.
    #[inline(always)]
    pub(crate) fn apply(&self, word: u64) -> Option<u64> {
        if word & !PAYLOAD != self.tag {
            return None;
        }
        let tat = (word & PAYLOAD).max(self.full) + self.charge;
        (tat < self.fixed_now).then_some(self.tag | tat)
    }
}

/// One reservation of `permits` at `now` that waits at most `timeout` µs
/// (`u64::MAX`: a plain reservation), from `word` and its generation's
/// `settings`. Pure: the caller writes the result with a compare-and-swap.
#[inline(always)]
pub(crate) fn step(
    word: u64,
    now: u64,
    permits: u32,
    timeout: u64,
    settings: &impl Settings,
) -> Step {
    let generation = word & !(STORED | PAYLOAD);
    let payload = word & PAYLOAD;
    let Some(fixed_now) = fixed_now(now, settings.base()) else {
        return Step::Slow; // rebase (or mutex mode)
    };
    if word & STORED == 0 {
        if payload == MUTEX {
            return Step::Slow;
        }
        // Whole µs from the base: the core's `next_free_micros` and `now`.
        let (next_free, now) = (payload >> FRAC_BITS, fixed_now >> FRAC_BITS);
        // `State::can_acquire`.
        if next_free.saturating_sub(timeout) > now {
            return Step::Refused;
        }
        if next_free >= now {
            // Nothing stored and no resync: every permit is fresh
            // (`State::charge`, fraction and all).
            let pushed = payload + settings.charge_for(permits);
            if pushed > settings.ceiling() {
                return Step::Slow; // the debt leaves the window, or saturates
            }
            return Step::Granted {
                word: generation | pushed,
                wait: next_free - now,
            };
        }
        // `State::resync` from zero stored permits.
        let config = settings.config();
        let idle = (now - next_free) as f64 - (payload & FRAC_MASK) as f64 / SCALE;
        let stored = (idle / config.interval).min(config.max_permits);
        return spend(generation, fixed_now, stored, permits, &config);
    }
    // Resync (at most a full burst is stored before now), then charge.
    let full = fixed_now.saturating_sub(settings.burst());
    let tat = payload.max(full) + settings.charge_for(permits);
    if tat < fixed_now {
        // The common case of an under-used limiter: stored permits remain.
        return Step::Granted {
            word: generation | STORED | tat,
            wait: 0,
        };
    }
    if payload >= fixed_now {
        return Step::Slow; // written by a caller with a later clock reading
    }
    let config = settings.config();
    spend(
        generation,
        fixed_now,
        permits_in(fixed_now - payload, &config),
        permits,
        &config,
    )
}

/// The rest of `State::reserve_earliest_available` after a resync to `now`
/// (`fixed_now`, in the window, whole µs) that left `stored` permits: spend
/// them first, charge the rest.
#[inline(never)]
fn spend(generation: u64, fixed_now: u64, stored: f64, permits: u32, config: &Config) -> Step {
    let requested = f64::from(permits);
    let spent = requested.min(stored);
    let left = stored - spent;
    if left > 0.0 {
        let left = fixed(left * config.interval);
        if left > 0 {
            // Some stored permits remain, so nothing was fresh.
            return if left <= fixed_now {
                Step::Granted {
                    word: generation | STORED | (fixed_now - left),
                    wait: 0,
                }
            } else {
                Step::Slow // rebase
            };
        }
    }
    // `State::charge` from the ticket at `now` with no fraction.
    let pushed = fixed_now + charge((requested - spent) * config.interval);
    if pushed > config.ceiling {
        return Step::Slow; // the debt leaves the window, or saturates
    }
    Step::Granted {
        word: generation | pushed,
        wait: 0,
    }
}

/// Stored time (fixed point, positive) as a count of permits, capped as
/// `State::resync` caps it.
#[inline]
fn permits_in(stored: u64, config: &Config) -> f64 {
    if stored >= config.burst {
        config.max_permits
    } else {
        (stored as f64 / SCALE / config.interval).min(config.max_permits)
    }
}

/// Mutex mode in the generation after `word`'s: the state is the locked
/// core's, whatever it is.
pub(crate) const fn mutex_mode(word: u64) -> u64 {
    next_generation(word) | MUTEX
}

mod codec;
pub(crate) use codec::{Encoded, decode, decode_into, encode, publish};

#[cfg(test)]
mod tests;
