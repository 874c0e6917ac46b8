//! Giving back reservations that were never used (a dropped `acquire`, a
//! `timeout(d, acquire(n))` that fired, a cancelled `Reservation`), on the
//! core, against a *model*: the same requests at the same times, minus the
//! cancelled reservations.
//!
//! Every in-process limiter gives back through the log of
//! [`Limits`](paceline::core::Limits): the limits are replayed without the
//! reservation, so once the last cancellation is done they *are* the model,
//! to the bit, with either policy, and a bursty limiter never schedules
//! anyone before the model. Moving the ticket back by the reservation's
//! charge alone (the rule the log replaced, which the library no longer
//! has: [`by_charge`] here) is kept to show what the log fixes: it lets
//! some callers in early.

use crate::support;

use std::time::Duration;

use paceline::core::{Bursty, LOG_CAPACITY, Limits, Policy, State, WarmingUp};
use support::rng::Rng;

const SEQUENCES: u64 = 3_000;
const STEPS: usize = 60;

fn random_policy(rng: &mut Rng) -> Policy {
    if rng.chance(0.5) {
        Policy::Bursty(Bursty::new(Duration::from_micros(rng.range(0, 3_000_000))))
    } else {
        Policy::WarmingUp(WarmingUp::new(
            Duration::from_micros(rng.range(0, 3_000_000)),
            1.0 + rng.f64() * 4.0,
        ))
    }
}

/// One step of a random sequence.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Reservation number `id` of `permits`, at the current time.
    Reserve { id: usize, permits: u32 },
    /// Gives reservation `id` back.
    Cancel { id: usize },
    /// Time passes.
    Idle { micros: u64 },
}

/// The baseline: giving back by the charge alone, on one bursty state,
/// as every limiter did before the log (the library no longer has it). A
/// reservation given back while its moment is still ahead moves the ticket
/// back by its charge (how far it had pushed the ticket), never past now;
/// the latest one, with nothing made after it, puts back the state it
/// found. Others came after it: they keep their slots.
mod by_charge {
    use paceline::core::{FRACTION_BITS, Policy, State};

    /// What one reservation took: enough to give it back by the charge.
    #[derive(Debug, Clone)]
    pub struct Reserved {
        /// When its permits may be used.
        pub moment_micros: u64,
        /// The state it found (before its resync), and the state it left.
        before: State,
        after: State,
    }

    impl Reserved {
        /// How far the reservation pushed the ticket, in whole
        /// microseconds, rounded down (so that giving it back never moves
        /// the ticket further back than it was pushed): from its moment
        /// (with the ticket's fraction then, if no resync moved the ticket)
        /// to the ticket it left.
        pub fn charge_micros(&self) -> u64 {
            let moment_fraction = if self.moment_micros == self.before.next_free_micros() {
                self.before.next_free_fraction()
            } else {
                0
            };
            let whole = self.after.next_free_micros() - self.moment_micros;
            if self.after.next_free_fraction() < moment_fraction {
                whole.saturating_sub(1)
            } else {
                whole
            }
        }
    }

    /// What a give-back did.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum GiveBack {
        /// The reservation was the latest: the state it found was put back.
        Restored,
        /// Others came after it: the ticket moved back by this many µs (its
        /// charge, or less where that would have reached back past now).
        Returned(u64),
        /// Others came after it, and its moment had passed: nothing.
        Nothing,
    }

    /// Reserves `permits` of `state` at `now_micros`, recording what was
    /// taken.
    pub fn reserve(state: &mut State, permits: u32, now_micros: u64) -> Reserved {
        let before = state.clone();
        let moment_micros = state.reserve_earliest_available(permits, now_micros);
        Reserved {
            moment_micros,
            before,
            after: state.clone(),
        }
    }

    /// Gives `taken` back from a bursty `state` at `now_micros`, by the
    /// charge alone.
    pub fn give_back(state: &mut State, taken: &Reserved, now_micros: u64) -> GiveBack {
        assert!(matches!(state.policy(), Policy::Bursty(_)));
        if *state == taken.after {
            *state = taken.before.clone();
            return GiveBack::Restored;
        }
        if now_micros >= taken.moment_micros {
            return GiveBack::Nothing;
        }
        let ticket = state.next_free_micros();
        let moved = ticket
            .saturating_sub(taken.charge_micros())
            .max(now_micros.min(ticket));
        if moved == ticket {
            // The ticket is not ahead (earlier give-backs moved it before
            // this reservation's moment): nothing to move.
            return GiveBack::Returned(0);
        }
        // The ticket is ahead of now: a bursty state in debt stores
        // nothing (it spent what it had before charging fresh permits), and
        // its ticket is all there is to move.
        assert_eq!(state.stored_permits(), 0.0);
        // The same state with the ticket at `moved`, its fraction kept: a
        // new bursty state stores nothing and starts at its ticket.
        let mut back = State::new(state.policy().clone(), state.permits_per_second(), moved)
            .expect("the rate it had");
        back.charge(f64::from(state.next_free_fraction()) / f64::from(1u32 << FRACTION_BITS));
        assert_eq!(
            (back.next_free_fraction(), back.max_permits().to_bits()),
            (state.next_free_fraction(), state.max_permits().to_bits())
        );
        *state = back;
        GiveBack::Returned(ticket - moved)
    }
}

use by_charge::{GiveBack, Reserved};

/// How a run gives reservations back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// [`by_charge`]: the whole charge, or the state it found for the
    /// latest (what every limiter did before the log; kept to show what
    /// the log fixes).
    Charge,
    /// Through the log of [`Limits`] (one limit): what every in-process
    /// limiter does.
    Log,
}

/// What a run holds of a reservation, to give it back with.
#[derive(Debug, Clone)]
enum Held {
    Charge(Reserved),
    /// Its id in the log, if it waits.
    Log(Option<u64>),
}

/// What a cancellation gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gave {
    Charge(GiveBack),
    /// Whether the log still held it.
    Log(bool),
}

/// Drives a state through `ops` by `rule`, cancelling the reservations
/// `cancel` marks whose moment is still ahead (a caller gives up before its
/// turn; one whose wait has passed has used its permits).
fn run(state: State, ops: &[Op], cancel: &[bool], rule: Rule) -> Run {
    drive(state, ops, cancel, Some(rule))
}

/// The model: `ops` without the reservations `cancelled` marks, never made.
fn model(state: State, ops: &[Op], cancelled: &[bool]) -> Run {
    drive(state, ops, cancelled, None)
}

fn drive(mut state: State, ops: &[Op], cancel: &[bool], rule: Option<Rule>) -> Run {
    let mut limits = Limits::new(vec![state.clone()]).unwrap();
    let mut now = 0;
    let mut moments = vec![None; cancel.len()];
    let mut held: Vec<Option<Held>> = vec![None; cancel.len()];
    let mut cancelled = vec![false; cancel.len()];
    let mut outcomes = Vec::new();
    let mut forfeited = 0;
    for op in ops {
        match *op {
            Op::Reserve { id, permits } => {
                if rule.is_none() && cancel[id] {
                    continue;
                }
                if rule.is_none() && now > state.next_free_micros() {
                    // Idle time the model's resync is about to drop at the cap.
                    if let Policy::Bursty(_) = state.policy() {
                        let credit = (now - state.next_free_micros()) as f64;
                        let room = (state.max_permits() - state.stored_permits())
                            * state.stable_interval_micros();
                        forfeited += (credit - room).max(0.0).ceil() as u64;
                    }
                }
                let (moment, taken) = if rule == Some(Rule::Log) {
                    let granted = limits.reserve(permits, now, true);
                    (granted.moment_micros, Held::Log(granted.id))
                } else {
                    let reserved = by_charge::reserve(&mut state, permits, now);
                    (reserved.moment_micros, Held::Charge(reserved))
                };
                moments[id] = Some(moment);
                held[id] = Some(taken);
            }
            Op::Cancel { id } => {
                let Some(_) = rule else { continue };
                let moment = moments[id].expect("cancelled after being made");
                if !cancel[id] || moment <= now {
                    continue;
                }
                cancelled[id] = true;
                outcomes.push(match held[id].as_ref().expect("made") {
                    Held::Charge(reserved) => {
                        Gave::Charge(by_charge::give_back(&mut state, reserved, now))
                    }
                    Held::Log(id) => Gave::Log(id.is_some_and(|id| limits.give_back(id, now))),
                });
            }
            Op::Idle { micros } => now += micros,
        }
    }
    let charges = held
        .iter()
        .map(|h| match h {
            Some(Held::Charge(reserved)) => reserved.charge_micros(),
            _ => 0,
        })
        .collect();
    if rule == Some(Rule::Log) {
        state = limits.states()[0].clone();
    }
    Run {
        moments,
        state,
        cancelled,
        outcomes,
        charges,
        forfeited,
        now,
    }
}

/// What [`drive`] saw.
struct Run {
    /// Each reservation's moment, by id (`None`: not made).
    moments: Vec<Option<u64>>,
    state: State,
    /// Which reservations were given back, by id.
    cancelled: Vec<bool>,
    /// What each cancellation gave back, in order.
    outcomes: Vec<Gave>,
    /// Each reservation's charge, by id (by the charge rule).
    charges: Vec<u64>,
    /// Idle time (µs) a bursty model's resyncs dropped at the burst cap.
    forfeited: u64,
    /// The time at the end.
    now: u64,
}

/// Random reservations (now and then a large one), idle gaps and
/// cancellations in any order.
fn random_ops(rng: &mut Rng, interval: u64) -> (Vec<Op>, Vec<bool>) {
    let mut ops = Vec::new();
    let mut cancelled = Vec::new();
    let mut pending: Vec<usize> = Vec::new();
    for _ in 0..STEPS {
        match rng.below(10) {
            0..5 => {
                let id = cancelled.len();
                cancelled.push(false);
                let permits = if rng.chance(0.1) {
                    rng.range(20, 100)
                } else {
                    rng.range(1, 4)
                };
                ops.push(Op::Reserve {
                    id,
                    permits: permits as u32,
                });
                pending.push(id);
            }
            5..7 if !pending.is_empty() => {
                let index = rng.below(pending.len() as u64) as usize;
                let id = pending.swap_remove(index);
                cancelled[id] = true;
                ops.push(Op::Cancel { id });
            }
            _ => {
                let micros = match rng.below(4) {
                    0 => 0,
                    1 => rng.range(1, interval),
                    2 => rng.range(interval, 4 * interval),
                    _ => rng.range(0, 5_000_000),
                };
                ops.push(Op::Idle { micros });
            }
        }
    }
    (ops, cancelled)
}

/// A random sequence: its first state (bursty, or warming-up if `warm`)
/// and its ops.
fn random_sequence(seed: u64, warm: bool) -> (State, Vec<Op>, Vec<bool>) {
    let mut rng = Rng::new(0xCA4C_E100 + seed);
    let rate = [0.5, 5.0, 10.0, 333.0, 10_000.0][rng.below(5) as usize];
    let period = Duration::from_micros(rng.range(0, 3_000_000));
    let policy = if warm {
        Policy::WarmingUp(WarmingUp::new(period, 1.0 + rng.f64() * 4.0))
    } else {
        Policy::Bursty(Bursty::new(period))
    };
    let initial = State::new(policy, rate, 0).unwrap();
    let interval = initial.stable_interval_micros() as u64 + 1;
    let (ops, cancel) = random_ops(&mut rng, interval);
    (initial, ops, cancel)
}

/// Where the next caller after a run would be scheduled.
fn next_moment(run: &Run) -> u64 {
    let mut state = run.state.clone();
    state.reserve_earliest_available(1, run.now).max(run.now)
}

/// Through the log, a bursty limiter never schedules anyone before the
/// model, and once the last cancellation is done it is the model, to the
/// bit, with either policy: the callers after it get the model's slots,
/// and the state is the model's. (A warming-up model that sits idle where
/// the limiter was in debt goes cold, and its stored permits get dearer,
/// so its callers can come later than the limiter's: no schedule bounds
/// those made while a cancelled reservation still stood.)
#[test]
fn through_the_log_cancellations_never_schedule_anyone_before_the_model_and_end_on_it() {
    let mut given_back = 0;
    for seed in 0..SEQUENCES {
        let warm = seed % 3 == 2;
        let (initial, ops, cancel) = random_sequence(seed, warm);
        let real = run(initial.clone(), &ops, &cancel, Rule::Log);
        let model = model(initial.clone(), &ops, &real.cancelled);
        let context = format!("seed {seed}, {:?}, ops {ops:?}", initial.policy());
        for (id, (r, m)) in real.moments.iter().zip(&model.moments).enumerate() {
            if real.cancelled[id] || warm {
                continue;
            }
            let (r, m) = (r.unwrap(), m.unwrap());
            assert!(
                r >= m,
                "reservation {id} at {r} µs, before the model's {m}: {context}"
            );
        }
        let last_cancel = ops
            .iter()
            .rposition(|op| matches!(op, Op::Cancel { .. }))
            .unwrap_or(0);
        for op in &ops[last_cancel..] {
            if let Op::Reserve { id, .. } = op {
                let (r, m) = (real.moments[*id].unwrap(), model.moments[*id].unwrap());
                assert_eq!(
                    r, m,
                    "reservation {id} after the last cancellation: {context}"
                );
            }
        }
        assert_eq!(next_moment(&real), next_moment(&model), "{context}");
        assert_eq!(real.state, model.state, "{context}");
        // Within the log's capacity, every cancellation gave back.
        assert!(
            real.outcomes.iter().all(|o| *o == Gave::Log(true)),
            "{context}"
        );
        given_back += real.outcomes.len();
    }
    assert!(given_back > 10_000, "{given_back}");
}

/// Twice as many reservations waiting as the log keeps requests, half of
/// them given back in random order: the newest `LOG_CAPACITY` give back,
/// exactly; the older ones, which left the log, give nothing back, never
/// too much.
#[test]
fn beyond_its_capacity_the_log_errs_late_never_early() {
    let mut rng = Rng::new(0xCA9A_C177);
    let initial = State::new(Policy::Bursty(Bursty::default()), 1_000.0, 0).unwrap();
    let n = LOG_CAPACITY * 2;
    let mut ops = Vec::new();
    let mut cancel = Vec::new();
    for id in 0..n {
        ops.push(Op::Reserve {
            id,
            permits: rng.range(1, 3) as u32,
        });
        cancel.push(rng.chance(0.5));
    }
    let mut dropped: Vec<usize> = (0..n).filter(|id| cancel[*id]).collect();
    let mut order = Vec::new();
    while !dropped.is_empty() {
        let id = dropped.swap_remove(rng.below(dropped.len() as u64) as usize);
        ops.push(Op::Cancel { id });
        order.push(id);
        ops.push(Op::Idle {
            micros: rng.below(200),
        });
    }
    for id in n..n + 10 {
        ops.push(Op::Reserve { id, permits: 1 });
        cancel.push(false);
    }
    let real = run(initial.clone(), &ops, &cancel, Rule::Log);
    let model = model(initial, &ops, &real.cancelled);
    for (id, (r, m)) in real.moments.iter().zip(&model.moments).enumerate() {
        if !real.cancelled[id] {
            assert!(r.unwrap() >= m.unwrap(), "reservation {id}");
        }
    }
    // The log holds the newest requests (the first one went at once, and
    // was never logged).
    let logged = n - LOG_CAPACITY..n;
    let cancelled: Vec<usize> = order.into_iter().filter(|id| real.cancelled[*id]).collect();
    for (id, outcome) in cancelled.iter().zip(&real.outcomes) {
        assert_eq!(*outcome, Gave::Log(logged.contains(id)), "reservation {id}");
    }
    assert!(cancelled.iter().filter(|id| logged.contains(id)).count() > LOG_CAPACITY / 4);
}

/// By the charge alone (as every limiter once gave back), some callers
/// are scheduled early, by at most the idle time the model dropped;
/// through the log, never (the test above). The same sequences, both
/// rules.
#[test]
fn without_the_log_early_callers_are_bounded_by_the_idle_time_the_model_dropped() {
    let (mut early_charge, mut early_log) = (0, 0);
    for seed in 0..SEQUENCES {
        let (initial, ops, cancel) = random_sequence(seed, false);
        let real = run(initial.clone(), &ops, &cancel, Rule::Charge);
        let model = model(initial.clone(), &ops, &real.cancelled);
        let context = format!("seed {seed}, {:?}, ops {ops:?}", initial.policy());
        let mut early = false;
        for (id, (r, m)) in real.moments.iter().zip(&model.moments).enumerate() {
            if real.cancelled[id] {
                continue;
            }
            let (r, m) = (r.unwrap(), m.unwrap());
            early |= r < m;
            assert!(
                r + model.forfeited >= m,
                "reservation {id} at {r} µs, before the model's {m} (forfeited {}): {context}",
                model.forfeited
            );
        }
        early_charge += usize::from(early);
        let log = run(initial.clone(), &ops, &cancel, Rule::Log);
        let log_model = self::model(initial, &ops, &log.cancelled);
        early_log += usize::from(
            log.moments
                .iter()
                .zip(&log_model.moments)
                .enumerate()
                .any(|(id, (r, m))| !log.cancelled[id] && r < m),
        );
        // Every cancellation of a bursty reservation gave something back.
        assert!(
            real.outcomes
                .iter()
                .all(|o| *o != Gave::Charge(GiveBack::Nothing)),
            "{context}"
        );
        // Where nothing was forfeited, the charge rule is exact too: it
        // ends on the model.
        let all_in_full = real
            .outcomes
            .iter()
            .zip(ops.iter().filter_map(|op| match op {
                Op::Cancel { id } if real.cancelled[*id] => Some(*id),
                _ => None,
            }))
            .all(|(outcome, id)| match outcome {
                Gave::Charge(GiveBack::Returned(micros)) => *micros == real.charges[id],
                Gave::Charge(GiveBack::Restored) => true,
                _ => false,
            });
        if all_in_full && model.forfeited == 0 {
            let (r, m) = (
                real.state.next_free_micros(),
                model.state.next_free_micros(),
            );
            assert!(
                r.abs_diff(m) <= 1,
                "final ticket {r} µs, the model's {m}: {context}"
            );
        }
    }
    println!(
        "sequences with an early caller: {early_charge} by the charge, {early_log} through the log"
    );
    assert!(early_charge > 0 && early_log == 0);
}

/// One overload: callers arrive at random (every `gap_micros` on average,
/// with an occasional idle pause of up to 5 s), each reserves up to
/// `max_permits` and waits at most a random timeout (up to twice
/// `timeout_micros`): one whose wait is longer gives its reservation back
/// when its timeout fires, as `timeout(d, acquire(n))` does.
#[derive(Debug, Clone, Copy)]
struct Overload {
    rate: f64,
    burst_secs: u64,
    gap_micros: u64,
    timeout_micros: u64,
    max_permits: u64,
}

/// How an overload went: callers served within their timeout, give-backs
/// made, and reservations kept (not given back) that were scheduled before
/// the model's slot, with the most permits any one of them was early by.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    served: usize,
    given_back: usize,
    early: usize,
    early_micros: u64,
}

/// Runs `overload` for 200 s, giving back by `rule`.
fn overload(o: Overload, rule: Rule) -> Outcome {
    let mut rng = Rng::new(o.gap_micros ^ o.timeout_micros ^ o.max_permits);
    let policy = Policy::Bursty(Bursty::new(Duration::from_secs(o.burst_secs)));
    let mut state = State::new(policy.clone(), o.rate, 0).unwrap();
    let mut limits = Limits::new(vec![state.clone()]).unwrap();
    // (when its timeout fires, reservation number, what it holds)
    let mut waiting: Vec<(u64, usize, Held)> = Vec::new();
    let mut made = Vec::new(); // (when, permits, its moment)
    let mut cancelled = Vec::new();
    let (mut served, mut given_back) = (0, 0);
    let mut now = 0;
    while now < 200_000_000 {
        waiting.sort_by_key(|w| w.0);
        while waiting.first().is_some_and(|w| w.0 <= now) {
            let (at, id, held) = waiting.remove(0);
            let gave = match held {
                Held::Charge(reserved) => {
                    by_charge::give_back(&mut state, &reserved, at) != GiveBack::Nothing
                }
                Held::Log(id) => id.is_some_and(|id| limits.give_back(id, at)),
            };
            assert!(gave, "{o:?}");
            given_back += 1;
            cancelled[id] = true;
        }
        let permits = rng.range(1, o.max_permits) as u32;
        let (moment, held) = match rule {
            Rule::Charge => {
                let reserved = by_charge::reserve(&mut state, permits, now);
                (reserved.moment_micros, Held::Charge(reserved))
            }
            Rule::Log => {
                let granted = limits.reserve(permits, now, true);
                (granted.moment_micros, Held::Log(granted.id))
            }
        };
        let timeout = rng.below(2 * o.timeout_micros);
        if moment > now + timeout {
            waiting.push((now + timeout, made.len(), held));
        } else {
            served += 1;
        }
        made.push((now, permits, moment.max(now)));
        cancelled.push(false);
        now += rng.below(2 * o.gap_micros);
        if rng.chance(0.02) {
            now += rng.below(5_000_000);
        }
    }
    let mut model = State::new(policy, o.rate, 0).unwrap();
    let (mut early, mut early_micros) = (0, 0);
    for ((at, permits, moment), cancelled) in made.iter().zip(&cancelled) {
        if *cancelled {
            continue;
        }
        let slot = model.reserve_earliest_available(*permits, *at).max(*at);
        if *moment < slot {
            early += 1;
            early_micros = early_micros.max(slot - moment);
        }
    }
    Outcome {
        served,
        given_back,
        early,
        early_micros,
    }
}

/// Overloads of `timeout(d, acquire(n))` callers, from about 10 to 250
/// times the rate. Through the log nobody is scheduled before the model;
/// by the charge alone, callers are, in overloads with no burst, by seconds.
#[test]
fn timeout_driven_cancellations_through_the_log_never_schedule_anyone_before_the_model() {
    let cases = [
        (10.0, 1, 10_000, 200_000, 4),
        (10.0, 0, 10_000, 200_000, 4),
        (10.0, 1, 10_000, 2_000_000, 50),
        (10.0, 0, 100_000, 5_000_000, 50),
        (100.0, 1, 1_000, 50_000, 4),
        (10.0, 0, 20_000, 1_000_000, 4),
        (0.5, 0, 300_000, 10_000_000, 4),
    ];
    let mut early_by_charge = 0;
    for (rate, burst_secs, gap_micros, timeout_micros, max_permits) in cases {
        let o = Overload {
            rate,
            burst_secs,
            gap_micros,
            timeout_micros,
            max_permits,
        };
        let log = overload(o, Rule::Log);
        let charge = overload(o, Rule::Charge);
        println!("{o:?}: through the log {log:?}; by the charge {charge:?}");
        assert_eq!(log.early, 0, "{o:?}: {log:?}");
        assert!(log.given_back > 400, "{o:?}: {log:?}");
        if charge.early > 0 {
            early_by_charge += 1;
        }
    }
    assert!(early_by_charge > 0);
}

/// Giving back the latest reservation, whichever the policy, leaves the
/// limits bit for bit as if it had never been made; and from there the
/// two are one limiter.
#[test]
fn the_latest_reservation_given_back_leaves_the_state_bit_for_bit_as_never_made() {
    for seed in 0..SEQUENCES {
        let mut rng = Rng::new(0x1A7E_5700 + seed);
        let rate = 0.1 + rng.f64() * 1_000.0;
        let state = State::new(random_policy(&mut rng), rate, 0).unwrap();
        let mut limits = Limits::new(vec![state]).unwrap();
        let mut now = 0;
        for _ in 0..rng.below(20) {
            now += rng.range(0, 3_000_000);
            limits.reserve(rng.range(1, 10) as u32, now, false);
        }
        let never = limits.clone();
        let made_at = now + rng.range(0, 2_000_000);
        let granted = limits.reserve(rng.range(1, 10) as u32, made_at, true);
        // A refused try changes nothing, so it is still the latest.
        let later = made_at + rng.range(0, 1_000_000);
        if limits.earliest(later).0 > later {
            assert_eq!(limits.try_reserve(1, later, 0, false), None);
        }
        if granted.moment_micros <= later {
            // Used already: nothing to give back.
            continue;
        }
        assert!(limits.give_back(granted.id.expect("it waits"), later));
        assert_eq!(limits.states(), never.states(), "seed {seed}");
        // And from there the two are one limiter.
        let mut never = never;
        for _ in 0..10 {
            now = later + rng.range(0, 2_000_000);
            let p = rng.range(1, 5) as u32;
            assert_eq!(
                limits.reserve(p, now, false),
                never.reserve(p, now, false),
                "seed {seed}"
            );
        }
    }
}

/// A rate change empties the log: what was waiting then gives nothing
/// back, and the change itself is never undone.
#[test]
fn a_rate_change_in_between_is_never_undone() {
    let state = State::new(Policy::Bursty(Bursty::default()), 10.0, 0).unwrap();
    let mut limits = Limits::new(vec![state]).unwrap();
    limits.reserve(1, 0, false);
    let held = limits.reserve(1, 0, true); // waits 100 ms
    limits.set_rate(None, 20.0, 0).unwrap();
    assert!(!limits.give_back(held.id.unwrap(), 0));
    assert_eq!(limits.states()[0].permits_per_second(), 20.0);
    assert_eq!(limits.states()[0].next_free_micros(), 200_000);
}
