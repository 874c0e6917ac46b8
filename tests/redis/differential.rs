//! Differential test: the Lua script (`lua/`) in Redis and `paceline::core::State`
//! in Rust, driven by the same random sequences of reservations, tries,
//! queries, probes, resumes, cancellations of earlier reservations, rate
//! changes and clock jumps (forwards and backwards), must give the same
//! replies (waits, refusals, debts, tokens) and the same state.
//!
//! The script runs with an explicit `now`, so both sides see the same clock;
//! the core side raises it to the latest reading the key has seen, as the
//! script does. A cancel sends the token the core's record of the
//! reservation encodes, which the script's own token for it was checked to
//! equal byte for byte; the core side gives back that record
//! (`State::give_back`). A resume is modelled inline: the rate change, a
//! resync, no stored permits, and the debt added to the ticket (a ticket
//! that reaches 2^53 is 2^53 with no fraction, as in `State::charge`).
//! The TTL it sets is computed for that simulated clock, so real time must not
//! expire the key: each sequence is one MULTI/EXEC block (no expiry between
//! its commands) and every write that sets a TTL is followed by a check of
//! that TTL and a PERSIST (a script reads keys on the real clock). A write
//! that must keep the TTL it finds, and a step that must not write, are then
//! checked to have left no TTL behind. The state is compared bit for bit:
//! the test decodes the key's value and checks every field against the core,
//! the ticket's fraction included (and the TTL bookkeeping against a model
//! of the script's rule). The rates include many whose interval is not a
//! whole microsecond, or is below one, so that fractions are exercised.
//!
//! Besides the mixed sequences, a give-back profile builds a queue of
//! waiting reservations and gives them back in random order while the
//! clock creeps through the queue: the cases where a charge is returned
//! only up to `now` (earlier give-backs moved the ticket back) need that.
//!
//! Replay one sequence with
//! `PACELINE_DIFF_SEED=<seed> cargo test --all-features --test redis differential -- --nocapture`;
//! `PACELINE_DIFF_SEQUENCES=<n>` changes how many sequences run.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::support::limiter_state::{LimiterState, Token};
use crate::support::limiter_state::{THR3_MARKER, ledger_groups};
use crate::support::redis_server::RedisServer;
use crate::support::rng::Rng;
use paceline::core::{Bursty, GiveBack, Ledger, MAX_MICROS, Policy, Reserved, State, WarmingUp};
use redis::Value;

const SEQUENCES: u64 = 2_000;
const STEPS: usize = 40;
const BASE_SEED: u64 = 0x5EED_0000;
/// Seeds from here on generate the give-back profile (see `generate`): one
/// such sequence for every 4 of the mixed profile.
const GIVE_BACK_SEED: u64 = 0x6B0B_0000;
/// Seeds from here on generate the deep give-back profile: a queue longer
/// than the script's ledger holds ([`Ledger::SHARED_CAPACITY`]), then
/// give-backs; one such sequence for every 20 of the mixed profile.
const DEEP_SEED: u64 = 0x7DEE_0000;
/// The steps of a deep sequence.
const DEEP_STEPS: usize = 200;
/// Field comparisons every this many steps (and after the last step).
const FIELDS_EVERY: usize = 4;
/// The script's TTL cap, in milliseconds: floor(2^53 / 1000).
const TTL_CAP_MS: f64 = 9_007_199_254_740.0;
/// The most the script adds to a TTL it sets, in milliseconds.
const TTL_MAX_SLACK_MS: f64 = 1_000.0;
/// A realistic clock: microseconds since the epoch, late 2023.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// The limiter's configuration, fixed for a sequence.
#[derive(Debug, Clone)]
enum Config {
    Bursty {
        max_burst_micros: u64,
    },
    WarmingUp {
        warmup_micros: u64,
        cold_factor: f64,
    },
}

impl Config {
    fn random(rng: &mut Rng) -> Config {
        if rng.chance(0.5) {
            let max_burst_micros = match rng.below(100) {
                0..20 => 0,
                20..60 => 1_000_000,
                60..90 => rng.below(100_000_000),
                90..95 => MAX_MICROS,
                _ => u64::MAX, // capped by both sides
            };
            Config::Bursty { max_burst_micros }
        } else {
            let warmup_micros = match rng.below(100) {
                0..20 => 0,
                20..40 => rng.below(1_000), // sub-millisecond
                40..90 => rng.below(60_000_000),
                90..95 => MAX_MICROS,
                _ => u64::MAX,
            };
            let cold_factor = match rng.below(100) {
                0..25 => 1.0,
                25..60 => 3.0,
                _ => 1.0 + 9.0 * rng.f64(),
            };
            Config::WarmingUp {
                warmup_micros,
                cold_factor,
            }
        }
    }

    fn policy(&self) -> Policy {
        match *self {
            Config::Bursty { max_burst_micros } => {
                Policy::Bursty(Bursty::new(Duration::from_micros(max_burst_micros)))
            }
            Config::WarmingUp {
                warmup_micros,
                cold_factor,
            } => Policy::WarmingUp(WarmingUp::new(
                Duration::from_micros(warmup_micros),
                cold_factor,
            )),
        }
    }

    /// ARGV[4..=6]: policy, max_burst_micros | warmup_micros, cold_factor.
    fn argv(&self) -> (&'static str, u64, f64) {
        match *self {
            Config::Bursty { max_burst_micros } => ("bursty", max_burst_micros, 0.0),
            Config::WarmingUp {
                warmup_micros,
                cold_factor,
            } => ("warming_up", warmup_micros, cold_factor),
        }
    }
}

/// How numbers are written into ARGV: the redis crate's own encoding of an
/// `f64` (shortest round trip, exponent form, e.g. `1e-300`, `5.0`) or Rust's
/// `Display` (plain decimal, e.g. `0.000…001`, `5`); `inf` either way.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    RedisArg,
    Display,
}

fn push_f64(invocation: &mut redis::ScriptInvocation<'_>, value: f64, encoding: Encoding) {
    match encoding {
        _ if value.is_infinite() => invocation.arg("inf"),
        Encoding::RedisArg => invocation.arg(value),
        Encoding::Display => invocation.arg(value.to_string()),
    };
}

/// A missing key: a limiter idle for a long time, i.e. full (or cold).
fn missing_key_state(config: &Config, rate: f64, now: u64) -> State {
    State::full(config.policy(), rate, now).expect("valid rate")
}

/// The TTL (ms) the key needs after a write when the clock reads `time`
/// (TIME, not raised to `last_now_micros`: the clock Redis's TTLs run on),
/// from the core's state: until it would read as missing anyway, plus 2 ms;
/// 2 ms if it already does. The same f64 operations as the script.
fn needed_ttl_ms(state: &State, time: u64, horizon: Option<u64>) -> f64 {
    let cool_down = match &state.policy() {
        Policy::WarmingUp(w) if state.max_permits() > 0.0 => {
            w.warmup_micros as f64 / state.max_permits()
        }
        _ => state.stable_interval_micros(),
    };
    let refill_micros = (state.max_permits() - state.stored_permits()) * cool_down;
    let mut ttl = (state.next_free_micros() as f64 - time as f64) / 1000.0 + refill_micros / 1000.0;
    // With a ledger, at least until its horizon.
    if let Some(horizon) = horizon {
        ttl = ttl.max((horizon as f64 - time as f64) / 1000.0);
    }
    if ttl < TTL_CAP_MS - 2.0 {
        if ttl > 0.0 { ttl.ceil() + 2.0 } else { 2.0 }
    } else {
        TTL_CAP_MS
    }
}

fn random_rate(rng: &mut Rng) -> f64 {
    match rng.below(100) {
        0..5 => f64::INFINITY,
        5..8 => 1e-300,
        8..10 => f64::from_bits(1), // the smallest positive double
        10..12 => f64::MAX,
        12..30 => *rng.pick(&[1.0, 2.0, 5.0, 10.0, 100.0, 1000.0, 0.5, 0.1, 3.0, 7.0]),
        // Intervals that are not whole microseconds, or below one.
        30..42 => *rng.pick(&[3e4, 1.5e5, 3e5, 7e5, 1.5e6, 3e6, 1e7, 1e9, 1e12, 12_345.678]),
        42..50 => 10f64.powf(4.0 + 6.0 * rng.f64()), // 1e4 ..= 1e10
        _ => 10f64.powf(-3.0 + 9.0 * rng.f64()),     // 1e-3 ..= 1e6
    }
}

/// A token as the script encodes it (the value the reservation wrote), from
/// the core's record of the same reservation, the rate it was made at and
/// the script's TTL record and clock at that write.
fn token_bytes(
    reserved: &Reserved,
    permits_per_second: f64,
    expires_micros: f64,
    now: u64,
) -> Vec<u8> {
    let token = Token {
        state: LimiterState {
            stored_permits: reserved.stored_after,
            next_free_micros: reserved.next_free_after as f64,
            permits_per_second,
            max_permits: reserved.max_permits,
            expires_micros,
            last_now_micros: now as f64,
            next_free_fraction: reserved.fraction_after,
        },
        stored_before: reserved.stored_before,
        next_free_before: reserved.next_free_before as f64,
        fraction_before: reserved.fraction_before,
        spent_stored: reserved.spent_stored,
    };
    assert_eq!(
        token.moment_micros(),
        reserved.moment_micros as f64,
        "the moment follows from the record"
    );
    token.encode()
}

/// A token's bytes, shown briefly.
#[derive(Clone)]
struct TokenBytes(Vec<u8>);

impl std::fmt::Debug for TokenBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match Token::decode(&self.0) {
            Ok(token) => write!(f, "{token:?}"),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Reserve,
    Try {
        timeout_micros: u64,
    },
    Query,
    /// Rewrites the key as it is (or writes a missing key as it reads).
    Probe,
    /// Back from a local fallback that ran up this debt.
    Resume {
        debt_micros: u64,
    },
    /// Gives back the reservation granted at step `of_step`.
    Cancel {
        of_step: usize,
    },
}

/// One call, as sent to both sides.
#[derive(Debug, Clone)]
struct Step {
    /// The clock as read (ARGV[7]); the key's clock is never below the
    /// latest reading it has seen.
    now: u64,
    rate: f64,
    permits: u32,
    /// A reservation its caller may give back (`n+`): one that waits gets
    /// a group in the ledger.
    held: bool,
    kind: Kind,
    /// For a cancel: the token sent.
    token: Option<TokenBytes>,
}

/// What the core says the script must answer for one step.
#[derive(Debug, Clone)]
struct Expected {
    /// The reply's two integers.
    reply: (i64, i64),
    /// A granted reservation's token, as the script must encode it.
    token: Option<Vec<u8>>,
    /// Whether this step wrote the key.
    wrote: bool,
    /// The TTL (ms) this step's write set, or `None` if it kept the TTL it
    /// found (or wrote nothing).
    ttl_ms: Option<f64>,
    /// When the key's TTL ends, as the script records it (µs, on the
    /// simulated clock as read).
    expires_micros: f64,
    /// The key's `last_now_micros`.
    last_now: u64,
    /// Whether any step so far wrote the key (else it is still missing).
    exists: bool,
    /// The core's state after the step.
    state: State,
    /// How many groups the value's ledger holds (`None`: no ledger).
    ledger_groups: Option<u64>,
    /// Whether the key's state is compared after this step.
    check_fields: bool,
}

/// The script's TTL rule after a write when the clock reads `time`: keep
/// the TTL if the recorded end `expires_micros` covers what the key needs,
/// else set twice the need, at most 1 s more (capped), and record its end.
/// Returns the TTL set, if any, and the recorded end; the same f64
/// operations as the script.
fn ttl_after_write(
    state: &State,
    time: u64,
    expires_micros: f64,
    horizon: Option<u64>,
) -> (Option<f64>, f64) {
    let needed = needed_ttl_ms(state, time, horizon);
    let time = time as f64;
    if time + needed * 1000.0 <= expires_micros {
        (None, expires_micros)
    } else {
        let ttl = (needed + needed.min(TTL_MAX_SLACK_MS)).min(TTL_CAP_MS);
        (Some(ttl), time + ttl * 1000.0)
    }
}

/// A random sequence and the core's answers to it.
struct Sequence {
    seed: u64,
    /// The give-back profile (see `generate`).
    give_backs: bool,
    config: Config,
    encoding: Encoding,
    t0: u64,
    first_rate: f64,
    steps: Vec<Step>,
    expected: Vec<Expected>,
    rate_changes: usize,
    backward_steps: usize,
    /// Returned charges that stopped at `now` (the ticket would have gone
    /// back past it).
    returns_held_back: usize,
}

/// A granted reservation that may be cancelled later.
struct Outstanding {
    step: usize,
    reserved: Reserved,
    token: Vec<u8>,
}

fn generate(seed: u64) -> Sequence {
    // The give-back profile: mostly reservations for the first half (a
    // queue of waiting ones, each kept to be given back), then give-backs
    // in random order, the clock creeping through the queue.
    let give_backs = seed >= GIVE_BACK_SEED;
    let deep = seed >= DEEP_SEED;
    let steps_in_sequence = if deep { DEEP_STEPS } else { STEPS };
    let mut rng = Rng::new(seed);
    let config = Config::random(&mut rng);
    let encoding = if rng.chance(0.5) {
        Encoding::RedisArg
    } else {
        Encoding::Display
    };
    let first_rate = random_rate(&mut rng);
    let t0 = EPOCH_2023 + rng.below(1_000_000_000_000);
    let mut rate = first_rate;
    // The clock as read, and the key's latest reading (0 while missing).
    let mut time = t0;
    let mut last_now = 0;
    let mut core = missing_key_state(&config, rate, time);
    // The core's ledger, with the script's capacity, and what the script
    // keeps beside it: whether the value has a ledger, the id its next
    // group gets and its horizon (the latest moment it gave an id).
    let mut ledger = Ledger::with_capacity(Ledger::SHARED_CAPACITY);
    let mut tail = false;
    let mut next_id = 0u64;
    let mut horizon = 0u64;
    let mut written = false;
    let mut expires_micros = 0.0;
    let mut steps = Vec::with_capacity(steps_in_sequence);
    let mut expected = Vec::with_capacity(steps_in_sequence);
    let mut rate_changes = 0;
    let mut backward_steps = 0;
    let mut returns_held_back = 0;
    let mut outstanding: Vec<Outstanding> = vec![];

    for i in 0..steps_in_sequence {
        // The clock: mostly small steps, sometimes none, sometimes long idle
        // gaps, sometimes exactly to the ticket (and one µs either side),
        // sometimes backwards (a server's clock stepped back).
        let debt = core.next_free_micros().saturating_sub(time.max(last_now));
        let dt = match rng.below(100) {
            _ if deep => match rng.below(100) {
                0..80 => 0,
                _ => rng.below(debt / 64 + 1),
            },
            _ if give_backs => match rng.below(100) {
                0..35 => 0,
                35..85 => rng.below(debt / 16 + 1),
                // To where the limiter is within a µs of idle beyond its
                // burst: the next request's term is then the largest (as
                // the terms the ledger holds after give-backs moved the
                // ticket behind waiting reservations: their groups go).
                85..92 => {
                    let room = match &core.policy() {
                        Policy::Bursty(_) => {
                            (core.max_permits() - core.stored_permits())
                                * core.stable_interval_micros()
                        }
                        Policy::WarmingUp(_) => 0.0,
                    };
                    let edge = core.next_free_micros() as f64
                        + f64::from(core.next_free_fraction()) / f64::from(1u32 << 20)
                        + room;
                    (edge.floor() as u64).saturating_sub(time.max(last_now))
                }
                _ => rng.below(debt / 4 + 1),
            },
            0..20 => 0,
            20..45 => rng.below(1_000),
            45..65 => rng.below(1_000_000),
            65..75 if debt < 86_400_000_000 => (debt + rng.below(3)).saturating_sub(1),
            65..85 => rng.below(60_000_000),
            85..95 => rng.below(3_600_000_000),
            _ => rng.below(3 * 86_400_000_000),
        };
        if rng.chance(0.06) {
            let back = match rng.below(3) {
                0 => rng.below(1_000),
                1 => rng.below(1_000_000),
                _ => rng.below(3_600_000_000),
            };
            time = time.saturating_sub(back);
            backward_steps += 1;
        } else {
            time = (time + dt).min(MAX_MICROS);
        }
        // The clock the script computes with.
        let now = time.max(last_now);

        if rng.chance(if deep { 0.005 } else { 0.1 }) {
            rate = random_rate(&mut rng);
            rate_changes += 1;
        }

        let permits = match rng.below(100) {
            _ if give_backs => 1 + rng.below(3) as u32,
            0..70 => 1 + rng.below(10) as u32,
            70..80 => 11 + rng.below(990) as u32,
            80..85 => u32::MAX,
            85..90 => 1_000_000,
            _ => (rng.next_u64() as u32).max(1),
        };
        let debt = core.next_free_micros().saturating_sub(now);
        let mut kind = match rng.below(100) {
            _ if give_backs => {
                let (queue_until, queueing) = if deep {
                    (steps_in_sequence * 6 / 10, 0.95)
                } else {
                    (steps_in_sequence / 2, 0.7)
                };
                if outstanding.is_empty() || (i < queue_until && rng.chance(queueing)) {
                    Kind::Reserve
                } else {
                    Kind::Cancel { of_step: 0 }
                }
            }
            0..8 => Kind::Query,
            8..34 => Kind::Try {
                timeout_micros: match rng.below(100) {
                    0..30 => 0,
                    30..50 => rng.below(1_000_000),
                    50..75 => (debt + rng.below(3)).saturating_sub(1),
                    75..85 => rng.below(1_000_000_000_000),
                    85..93 => MAX_MICROS,
                    _ => u64::MAX,
                },
            },
            34..46 if !outstanding.is_empty() => Kind::Cancel { of_step: 0 },
            46..50 => Kind::Resume {
                debt_micros: match rng.below(100) {
                    0..30 => 0,
                    30..70 => rng.below(1_000_000),
                    70..85 => rng.below(1_000_000_000_000),
                    // Exactly to 2^53 from the ticket after the resync
                    // (with its fraction, if it is ahead).
                    85..90 => MAX_MICROS - core.next_free_micros().max(now),
                    90..95 => MAX_MICROS,
                    _ => u64::MAX, // capped by both sides
                },
            },
            50..54 => Kind::Probe,
            _ => Kind::Reserve,
        };
        let mut token = None;
        let mut cancelled = None;
        if let Kind::Cancel { of_step } = &mut kind {
            // Mostly the latest reservation (restored if nothing wrote
            // since), else any (always any in the give-back profile); each
            // is given back at most once.
            let index = if !give_backs && rng.chance(0.5) {
                outstanding.len() - 1
            } else {
                rng.below(outstanding.len() as u64) as usize
            };
            let taken = outstanding.remove(index);
            *of_step = taken.step;
            token = Some(TokenBytes(taken.token));
            cancelled = Some(taken.reserved);
        }
        let held = rng.chance(if give_backs { 0.9 } else { 0.5 });
        let step = Step {
            now: time,
            rate,
            held,
            permits: match kind {
                Kind::Reserve | Kind::Try { .. } => permits,
                _ => 0,
            },
            kind: kind.clone(),
            token,
        };

        // The core, in lock-step with what the script does. A step that
        // writes nothing leaves the ledger as it was, too (the script's
        // clock can then be behind what the core's ledger has seen).
        let ledger_before = ledger.clone();
        let mut granted = None;
        let mut keeps_ttl = false;
        let (reply, wrote) = match kind {
            // A query reads the ticket and changes nothing.
            Kind::Query => {
                let debt = if written {
                    core.query_earliest_available().saturating_sub(now) as i64
                } else {
                    0
                };
                ((debt, debt), false)
            }
            // A probe writes the key back as it is, keeping its TTL.
            Kind::Probe if written => {
                keeps_ttl = true;
                let debt = core.next_free_micros().saturating_sub(now) as i64;
                ((debt, debt), true)
            }
            // A missing key is written as it reads.
            Kind::Probe => {
                core = missing_key_state(&config, rate, now);
                ledger.clear();
                expires_micros = 0.0;
                ((0, 0), true)
            }
            // State::give_back, on the key as it is: no rate change.
            Kind::Cancel { .. } => {
                let taken = cancelled.expect("a reservation to cancel");
                assert!(written, "a reservation was granted, so the key exists");
                match ledger.give_back(&mut core, &taken, now) {
                    GiveBack::Restored => ((1, 1), true),
                    GiveBack::Returned(returned) => {
                        if returned < taken.charge_micros() {
                            returns_held_back += 1;
                        }
                        ((2, 2), true)
                    }
                    GiveBack::Nothing => ((0, 0), false),
                }
            }
            Kind::Reserve | Kind::Try { .. } | Kind::Resume { .. } => {
                if !written {
                    // The key is still missing: the script starts from
                    // "idle for a long time" at the rate it is given, with
                    // no TTL to keep.
                    core = missing_key_state(&config, rate, now);
                    ledger.clear();
                    expires_micros = 0.0;
                }
                let before = core.clone();
                // The script applies a rate change at the start of a call
                // that writes, at that call's `now`; so does the core. The
                // ledger's offsets were at the old rate: it forgets them.
                if core.permits_per_second() != rate {
                    core.set_rate(rate, now).expect("valid rate");
                    ledger.clear();
                }
                match kind {
                    Kind::Resume { debt_micros } => {
                        // Resync, no stored permits, and the debt added
                        // to the ticket: one that reaches 2^53 is 2^53,
                        // with no fraction (the rule of State::charge).
                        // A request whose charge is never given back.
                        ledger.note(&core, now);
                        core.resume(debt_micros, now);
                        let debt = (core.next_free_micros() - now) as i64;
                        ((debt, debt), true)
                    }
                    Kind::Try { timeout_micros } if !core.can_acquire(now, timeout_micros) => {
                        // A refused try writes nothing, not even the
                        // rate change: the next write applies it.
                        core = before;
                        ((-1, (core.next_free_micros() - now) as i64), false)
                    }
                    _ => {
                        let reserved = if held {
                            ledger.reserve_recorded(&mut core, step.permits, now)
                        } else {
                            // Noted, with no group.
                            ledger.note(&core, now);
                            core.reserve_recorded(step.permits, now)
                        };
                        granted = Some(reserved);
                        (
                            (
                                reserved.moment_micros.saturating_sub(now) as i64,
                                (core.next_free_micros() - now) as i64,
                            ),
                            true,
                        )
                    }
                }
            }
        };
        written |= wrote;
        if !wrote {
            ledger = ledger_before;
        }
        // The script's id for a reservation that got a group.
        let mut script_id = None;
        if let Some(reserved) = &granted
            && reserved.waiting_id.is_some()
        {
            let id = if tail { next_id } else { 0 };
            script_id = Some(id);
            next_id = id + 1;
            horizon = horizon.max(reserved.moment_micros);
        }
        let mut ttl_ms = None;
        if wrote && !keeps_ttl {
            // The value keeps a ledger while it holds a group, and until its
            // horizon has passed.
            tail = !ledger.is_empty() || now < horizon;
            if !tail {
                next_id = 0;
                horizon = 0;
            }
            (ttl_ms, expires_micros) =
                ttl_after_write(&core, time, expires_micros, tail.then_some(horizon));
            last_now = now;
        }
        // A granted reservation replies the value it wrote, without its
        // ledger, and its group's id if it got one.
        let reply_token = granted.map(|reserved| {
            let mut bytes = token_bytes(&reserved, core.permits_per_second(), expires_micros, now);
            if tail {
                bytes[..4].copy_from_slice(THR3_MARKER);
            }
            if let Some(id) = script_id {
                bytes.extend((id as f64).to_le_bytes());
            }
            if give_backs || rng.chance(0.6) {
                outstanding.push(Outstanding {
                    step: i,
                    reserved,
                    token: bytes.clone(),
                });
            }
            bytes
        });
        steps.push(step);
        expected.push(Expected {
            reply,
            token: reply_token,
            wrote,
            ttl_ms,
            expires_micros,
            last_now,
            exists: written,
            state: core.clone(),
            ledger_groups: tail.then_some(ledger.len() as u64),
            check_fields: i % FIELDS_EVERY == FIELDS_EVERY - 1 || i == steps_in_sequence - 1,
        });
    }
    Sequence {
        seed,
        give_backs,
        config,
        encoding,
        t0,
        first_rate,
        steps,
        expected,
        rate_changes,
        backward_steps,
        returns_held_back,
    }
}

/// Running totals for the summary line.
#[derive(Default)]
struct Totals {
    sequences: u64,
    steps: u64,
    reserves: u64,
    tries_granted: u64,
    tries_refused: u64,
    queries: u64,
    probes: u64,
    resumes: u64,
    restored: u64,
    returned: u64,
    given_nothing: u64,
    rate_changes: u64,
    backward_steps: u64,
    tokens_checked: u64,
    field_checks: u64,
    /// Field checks where the ticket had a fraction.
    fractional_states: u64,
    /// Tokens whose reservation carried a fraction (before or after).
    fractional_tokens: u64,
    returns_held_back: u64,
    ttls_set: u64,
    ttls_kept: u64,
    /// Field checks where the value's ledger held groups.
    ledgers_checked: u64,
    /// Field checks where it held as many as it can.
    full_ledgers: u64,
}

fn int_of(value: &Value) -> Result<i64, String> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(format!("expected an integer reply, got {other:?}")),
    }
}

/// A reply's `(first, second)` numbers and its token, if any: a granted
/// reservation's value gives `(wait, debt)` and is the token; an integer n
/// gives `(-1, -n)` if negative (a refused try), else `(n, n)`.
type Decoded<'a> = ((i64, i64), Option<&'a [u8]>);

fn reply_of(value: &Value) -> Result<Decoded<'_>, String> {
    match value {
        Value::BulkString(bytes) => {
            let token = Token::decode(bytes)?;
            let (wait, debt) = (token.wait_micros(), token.debt_micros());
            Ok(((wait as i64, debt as i64), Some(bytes)))
        }
        Value::Int(n) if *n < 0 => Ok(((-1, -n), None)),
        Value::Int(n) => Ok(((*n, *n), None)),
        other => Err(format!("expected a value or an integer, got {other:?}")),
    }
}

/// Compares one field bit for bit.
fn same_bits(name: &str, script: f64, core: f64) -> Result<(), String> {
    if script.to_bits() == core.to_bits() {
        Ok(())
    } else {
        Err(format!("{name}: script {script:e}, core {core:e}"))
    }
}

/// Runs one sequence through the script and compares; returns a description
/// of the first disagreement.
fn check(
    seq: &Sequence,
    con: &mut redis::Connection,
    script: &redis::Script,
    totals: &mut Totals,
) -> Result<(), String> {
    let key = format!("diff:{}", seq.seed);
    let (policy, policy_micros, cold_factor) = seq.config.argv();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (step, expected) in seq.steps.iter().zip(&seq.expected) {
        let mut invocation = script.prepare_invoke();
        invocation.key(&key);
        match &step.kind {
            Kind::Reserve | Kind::Try { .. } if step.held => {
                invocation.arg(format!("{}+", step.permits))
            }
            Kind::Reserve | Kind::Try { .. } => invocation.arg(step.permits),
            _ => &mut invocation,
        };
        match &step.kind {
            Kind::Reserve => invocation.arg("-1"),
            Kind::Try { timeout_micros } => invocation.arg(*timeout_micros),
            Kind::Query => invocation.arg(0).arg("-1"),
            Kind::Probe => invocation.arg("probe").arg("-1"),
            Kind::Resume { debt_micros } => invocation.arg("resume").arg(*debt_micros),
            Kind::Cancel { .. } => {
                let token = step.token.as_ref().expect("a cancel has a token");
                invocation.arg("cancel").arg(&token.0[..])
            }
        };
        push_f64(&mut invocation, step.rate, seq.encoding);
        invocation.arg(policy).arg(policy_micros);
        push_f64(&mut invocation, cold_factor, seq.encoding);
        invocation.arg(step.now);
        pipe.invoke_script(&invocation);
        pipe.cmd("PTTL").arg(&key);
        if expected.ttl_ms.is_some() {
            pipe.cmd("PERSIST").arg(&key);
        }
        if expected.check_fields {
            pipe.cmd("GET").arg(&key);
        }
    }
    let replies: Vec<Value> = pipe
        .query(con)
        .map_err(|e| format!("the transaction failed: {e}"))?;
    let mut replies = replies.iter();
    let mut next_reply = || replies.next().ok_or("too few replies".to_string());

    for (i, (step, expected)) in seq.steps.iter().zip(&seq.expected).enumerate() {
        let fail = |what: String| format!("step {i} ({step:?}): {what}");
        let (reply, token) = reply_of(next_reply()?).map_err(fail)?;
        if (reply.0 == -1) != (expected.reply.0 == -1) {
            return Err(fail(format!(
                "script replied {reply:?}, core {:?} (refusal decisions differ)",
                expected.reply
            )));
        }
        if reply != expected.reply {
            return Err(fail(format!(
                "reply: script {reply:?}, core {:?}",
                expected.reply
            )));
        }
        match (token, &expected.token) {
            (None, None) => {}
            (Some(script), Some(core)) if script == &core[..] => {
                totals.tokens_checked += 1;
                let token = Token::decode(script).map_err(fail)?;
                if token.fraction_before != 0 || token.state.next_free_fraction != 0 {
                    totals.fractional_tokens += 1;
                }
            }
            (script, core) => {
                let show = |t: Option<&[u8]>| t.map(|t| TokenBytes(t.to_vec()));
                return Err(fail(format!(
                    "token: script {:?}, core {:?}",
                    show(script),
                    show(core.as_deref())
                )));
            }
        }
        totals.steps += 1;
        match step.kind {
            Kind::Reserve => totals.reserves += 1,
            Kind::Query => totals.queries += 1,
            Kind::Probe => totals.probes += 1,
            Kind::Resume { .. } => totals.resumes += 1,
            Kind::Try { .. } if reply.0 == -1 => totals.tries_refused += 1,
            Kind::Try { .. } => totals.tries_granted += 1,
            Kind::Cancel { .. } => match reply.0 {
                1 => totals.restored += 1,
                2 => totals.returned += 1,
                _ => totals.given_nothing += 1,
            },
        }

        let pttl = int_of(next_reply()?).map_err(fail)?;
        if let Some(ttl) = expected.ttl_ms {
            // Set just now (PTTL reads the real clock, which may have moved).
            if !(pttl as f64 <= ttl && pttl as f64 >= (ttl - 1_000.0).max(0.0)) {
                return Err(fail(format!("PTTL {pttl} ms, expected {ttl} ms")));
            }
            if int_of(next_reply()?).map_err(fail)? != 1 {
                return Err(fail("PERSIST found no TTL".into()));
            }
            totals.ttls_set += 1;
        } else {
            // A write that keeps the TTL it finds, or no write at all: still
            // no TTL (-1, every TTL set was removed), or still no key (-2).
            let untouched = if expected.exists { -1 } else { -2 };
            if pttl != untouched {
                return Err(fail(format!(
                    "a step that sets no TTL left PTTL {pttl}, expected {untouched} \
                     (wrote: {})",
                    expected.wrote
                )));
            }
            if expected.wrote {
                totals.ttls_kept += 1;
            }
        }

        if expected.check_fields {
            let value = match next_reply()? {
                Value::Nil => None,
                Value::BulkString(bytes) => Some(bytes),
                other => return Err(fail(format!("GET replied {other:?}"))),
            };
            totals.field_checks += 1;
            let Some(value) = value else {
                if expected.exists {
                    return Err(fail("the key is missing".into()));
                }
                continue;
            };
            if !expected.exists {
                return Err(fail(format!("the key should be missing: {value:?}")));
            }
            let state = LimiterState::decode(value).map_err(fail)?;
            if ledger_groups(value) != expected.ledger_groups {
                return Err(fail(format!(
                    "ledger groups: script {:?}, core {:?}",
                    ledger_groups(value),
                    expected.ledger_groups
                )));
            }
            if expected.ledger_groups.is_some_and(|groups| groups > 0) {
                totals.ledgers_checked += 1;
            }
            if expected.ledger_groups == Some(Ledger::SHARED_CAPACITY as u64) {
                totals.full_ledgers += 1;
            }
            let core = &expected.state;
            same_bits(
                "next_free_micros",
                state.next_free_micros,
                core.next_free_micros() as f64,
            )
            .map_err(fail)?;
            if state.next_free_fraction != core.next_free_fraction() {
                return Err(fail(format!(
                    "next_free_fraction: script {}, core {}",
                    state.next_free_fraction,
                    core.next_free_fraction()
                )));
            }
            if core.next_free_fraction() != 0 {
                totals.fractional_states += 1;
            }
            same_bits(
                "stored_permits",
                state.stored_permits,
                core.stored_permits(),
            )
            .map_err(fail)?;
            same_bits(
                "permits_per_second",
                state.permits_per_second,
                core.permits_per_second(),
            )
            .map_err(fail)?;
            same_bits("max_permits", state.max_permits, core.max_permits()).map_err(fail)?;
            same_bits(
                "expires_micros",
                state.expires_micros,
                expected.expires_micros,
            )
            .map_err(fail)?;
            same_bits(
                "last_now_micros",
                state.last_now_micros,
                expected.last_now as f64,
            )
            .map_err(fail)?;
        }
    }
    if replies.next().is_some() {
        return Err("too many replies".into());
    }
    totals.sequences += 1;
    totals.rate_changes += seq.rate_changes as u64;
    totals.backward_steps += seq.backward_steps as u64;
    totals.returns_held_back += seq.returns_held_back as u64;
    Ok(())
}

fn describe(seq: &Sequence) -> String {
    let mut text = format!(
        "seed {} ({:#x}{}), config {:?}, numbers as {:?}, first rate {}, t0 {}\nsteps:\n",
        seq.seed,
        seq.seed,
        if seq.give_backs {
            ", give-back profile"
        } else {
            ""
        },
        seq.config,
        seq.encoding,
        seq.first_rate,
        seq.t0
    );
    for (i, (step, expected)) in seq.steps.iter().zip(&seq.expected).enumerate() {
        let _ = writeln!(
            text,
            "  {i:>2}: {step:?} -> core {:?} (wrote: {})",
            expected.reply, expected.wrote
        );
    }
    text
}

#[test]
fn lua_script_and_core_agree() {
    let seeds: Vec<u64> = match std::env::var("PACELINE_DIFF_SEED") {
        Ok(seed) => vec![seed.parse().expect("PACELINE_DIFF_SEED: a decimal seed")],
        Err(_) => {
            let n = std::env::var("PACELINE_DIFF_SEQUENCES")
                .map(|n| n.parse().expect("PACELINE_DIFF_SEQUENCES: a number"))
                .unwrap_or(SEQUENCES);
            (BASE_SEED..BASE_SEED + n)
                .chain(GIVE_BACK_SEED..GIVE_BACK_SEED + n / 4)
                .chain(DEEP_SEED..DEEP_SEED + n / 20)
                .collect()
        }
    };
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = redis::Script::new(paceline::redis::format::SCRIPT);
    script.load(&mut con).expect("SCRIPT LOAD");

    let started = Instant::now();
    let mut totals = Totals::default();
    for &seed in &seeds {
        let seq = generate(seed);
        if let Err(what) = check(&seq, &mut con, &script, &mut totals) {
            panic!(
                "the script and the core disagree: {what}\n{}\nreplay: \
                 PACELINE_DIFF_SEED={seed} cargo test --all-features --test redis differential -- --nocapture",
                describe(&seq)
            );
        }
    }
    println!(
        "differential: {} sequences, {} steps ({} reserves, {} tries granted, {} refused, \
         {} queries, {} probes, {} resumes, cancels: {} restored, {} returned ({} held back \
         by the ledger), {} nothing; {} rate changes, {} clock steps back), {} tokens ({} with a \
         fraction) and {} states ({} with a fraction, {} with a ledger, {} full) checked bit for bit, {} \
         TTLs set, {} kept; {:.1?}",
        totals.sequences,
        totals.steps,
        totals.reserves,
        totals.tries_granted,
        totals.tries_refused,
        totals.queries,
        totals.probes,
        totals.resumes,
        totals.restored,
        totals.returned,
        totals.returns_held_back,
        totals.given_nothing,
        totals.rate_changes,
        totals.backward_steps,
        totals.tokens_checked,
        totals.fractional_tokens,
        totals.field_checks,
        totals.fractional_states,
        totals.ledgers_checked,
        totals.full_ledgers,
        totals.ttls_set,
        totals.ttls_kept,
        started.elapsed()
    );
    assert_eq!(totals.sequences, seeds.len() as u64);
    // The sequences must actually exercise both outcomes of a try, every
    // outcome of a cancel, and both outcomes of the TTL rule.
    if seeds.len() > 100 {
        assert!(totals.tries_refused > 100 && totals.tries_granted > 100);
        assert!(totals.restored > 100 && totals.returned > 100 && totals.given_nothing > 100);
        assert!(totals.resumes > 100 && totals.probes > 100 && totals.backward_steps > 100);
        assert!(totals.ttls_set > 100 && totals.ttls_kept > 100);
        // The ticket's fraction, in states and in tokens (restored and
        // returned alike), charges the ledger held back, and ledgers.
        assert!(totals.fractional_states > 100 && totals.fractional_tokens > 100);
        assert!(totals.returns_held_back > 10 && totals.ledgers_checked > 100);
        assert!(totals.full_ledgers > 10);
    }
}
