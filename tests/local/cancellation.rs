//! Giving back reservations that were never used: a dropped `acquire`, a
//! `timeout(d, acquire(n))` that fired, a cancelled [`Reservation`].
//!
//! The reference is a *model*: the same requests at the same times, minus
//! the cancelled reservations. Nobody may be scheduled earlier than the model
//! allows, and once the last cancellation is done the limiter must be the
//! model (its next callers get the model's schedule).

use crate::support;

use std::time::{Duration, Instant};

use paceline::clock::FakeClock;
use paceline::core::{Bursty, GiveBack, Ledger, Policy, Reserved, State, WarmingUp};
use paceline::{Limiter, RateLimiter};
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

/// How a run gives reservations back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// [`State::give_back`] alone: the whole charge (what every limiter did
    /// before the ledger; kept to show what the ledger fixes).
    Charge,
    /// Through a [`Ledger`]: what every limiter does (the Redis script
    /// mirrors it).
    Ledger,
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
    let mut ledger = Ledger::new();
    let mut now = 0;
    let mut moments = vec![None; cancel.len()];
    let mut taken: Vec<Option<Reserved>> = vec![None; cancel.len()];
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
                let reserved = if rule == Some(Rule::Ledger) {
                    ledger.reserve_recorded(&mut state, permits, now)
                } else {
                    state.reserve_recorded(permits, now)
                };
                moments[id] = Some(reserved.moment_micros);
                taken[id] = Some(reserved);
            }
            Op::Cancel { id } => {
                let Some(rule) = rule else { continue };
                let reserved = taken[id].expect("cancelled after being made");
                if !cancel[id] || reserved.moment_micros <= now {
                    continue;
                }
                cancelled[id] = true;
                outcomes.push(match rule {
                    Rule::Charge => state.give_back(&reserved, now),
                    Rule::Ledger => ledger.give_back(&mut state, &reserved, now),
                });
            }
            Op::Idle { micros } => now += micros,
        }
    }
    let charges = taken
        .iter()
        .map(|t| t.map_or(0, |t| t.charge_micros()))
        .collect();
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
    outcomes: Vec<GiveBack>,
    /// Each reservation's charge, by id.
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

/// A random bursty sequence: its first state and its ops.
fn random_sequence(seed: u64) -> (State, Vec<Op>, Vec<bool>) {
    let mut rng = Rng::new(0xCA4C_E100 + seed);
    let rate = [0.5, 5.0, 10.0, 333.0, 10_000.0][rng.below(5) as usize];
    // Bursty: a warming-up model that sits idle also goes cold (its stored
    // permits get dearer), so no schedule bounds it; its give-backs are
    // checked against the core in the other tests.
    let max_burst = Duration::from_micros(rng.range(0, 3_000_000));
    let initial = State::new(Policy::Bursty(Bursty::new(max_burst)), rate, 0).unwrap();
    let interval = initial.stable_interval_micros() as u64 + 1;
    let (ops, cancel) = random_ops(&mut rng, interval);
    (initial, ops, cancel)
}

/// Where the next caller after a run would be scheduled.
fn next_moment(run: &Run) -> u64 {
    let mut state = run.state.clone();
    state.reserve_earliest_available(1, run.now).max(run.now)
}

#[test]
fn through_a_ledger_cancellations_never_schedule_anyone_before_the_model_and_end_on_it() {
    let (mut restored, mut returned) = (0, 0);
    for seed in 0..SEQUENCES {
        let (initial, ops, cancel) = random_sequence(seed);
        let real = run(initial.clone(), &ops, &cancel, Rule::Ledger);
        let model = model(initial.clone(), &ops, &real.cancelled);
        let context = format!("seed {seed}, {:?}, ops {ops:?}", initial.policy());
        for (id, (r, m)) in real.moments.iter().zip(&model.moments).enumerate() {
            if real.cancelled[id] {
                continue;
            }
            let (r, m) = (r.unwrap(), m.unwrap());
            assert!(
                r >= m,
                "reservation {id} at {r} µs, before the model's {m}: {context}"
            );
        }
        // Once the last cancellation is done, the limiter is the model: its
        // callers get the model's slots, and so does the next one. To the
        // microsecond the ledger rounds a term down by.
        let last_cancel = ops
            .iter()
            .rposition(|op| matches!(op, Op::Cancel { .. }))
            .unwrap_or(0);
        for op in &ops[last_cancel..] {
            if let Op::Reserve { id, .. } = op {
                let (r, m) = (real.moments[*id].unwrap(), model.moments[*id].unwrap());
                assert!(
                    r.abs_diff(m) <= 1,
                    "reservation {id} after the last cancellation at {r} µs, the model's {m}: {context}"
                );
            }
        }
        let (r, m) = (next_moment(&real), next_moment(&model));
        assert!(
            r.abs_diff(m) <= 1,
            "next caller at {r} µs, the model's {m}: {context}"
        );
        restored += real
            .outcomes
            .iter()
            .filter(|o| **o == GiveBack::Restored)
            .count();
        returned += real
            .outcomes
            .iter()
            .filter(|o| matches!(o, GiveBack::Returned(_)))
            .count();
    }
    assert!(
        restored > 1_000 && returned > 1_000,
        "{restored} {returned}"
    );
}

/// Twice as many reservations waiting as the ledger keeps groups for, half
/// of them given back in random order: the ones that lost their group give
/// back less, never too much.
#[test]
fn beyond_its_capacity_the_ledger_errs_late_never_early() {
    let mut rng = Rng::new(0xCA9A_C177);
    let initial = State::new(Policy::Bursty(Bursty::default()), 1_000.0, 0).unwrap();
    let n = Ledger::CAPACITY * 2;
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
    while !dropped.is_empty() {
        let id = dropped.swap_remove(rng.below(dropped.len() as u64) as usize);
        ops.push(Op::Cancel { id });
        ops.push(Op::Idle {
            micros: rng.below(200),
        });
    }
    for id in n..n + 10 {
        ops.push(Op::Reserve { id, permits: 1 });
        cancel.push(false);
    }
    let real = run(initial.clone(), &ops, &cancel, Rule::Ledger);
    let model = model(initial, &ops, &real.cancelled);
    for (id, (r, m)) in real.moments.iter().zip(&model.moments).enumerate() {
        if !real.cancelled[id] {
            assert!(r.unwrap() >= m.unwrap(), "reservation {id}");
        }
    }
    let returned = real
        .outcomes
        .iter()
        .filter(|o| matches!(o, GiveBack::Returned(micros) if *micros > 0))
        .count();
    assert!(
        returned > n / 4,
        "{returned} of {} gave back",
        real.outcomes.len()
    );
}

/// Without a ledger, moving the ticket back by the whole charge (as every
/// limiter once did) schedules some callers early, by at most the idle
/// time the model dropped; with the ledger, never (the test above). The
/// same sequences, both rules.
#[test]
fn without_a_ledger_early_callers_are_bounded_by_the_idle_time_the_model_dropped() {
    let (mut early_charge, mut early_ledger) = (0, 0);
    for seed in 0..SEQUENCES {
        let (initial, ops, cancel) = random_sequence(seed);
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
        let ledger = run(initial.clone(), &ops, &cancel, Rule::Ledger);
        let ledger_model = self::model(initial, &ops, &ledger.cancelled);
        early_ledger += usize::from(
            ledger
                .moments
                .iter()
                .zip(&ledger_model.moments)
                .enumerate()
                .any(|(id, (r, m))| !ledger.cancelled[id] && r < m),
        );
        // Every cancellation of a bursty reservation gave something back.
        assert!(
            real.outcomes.iter().all(|o| *o != GiveBack::Nothing),
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
                GiveBack::Returned(micros) => *micros == real.charges[id],
                GiveBack::Restored => true,
                GiveBack::Nothing => false,
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
        "sequences with an early caller: {early_charge} by the charge, {early_ledger} through the ledger"
    );
    assert!(early_charge > 0 && early_ledger == 0);
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
    let mut ledger = Ledger::new();
    // (when its timeout fires, reservation number, what it took)
    let mut waiting: Vec<(u64, usize, Reserved)> = Vec::new();
    let mut made = Vec::new(); // (when, permits, its moment)
    let mut cancelled = Vec::new();
    let (mut served, mut given_back) = (0, 0);
    let mut now = 0;
    while now < 200_000_000 {
        waiting.sort_by_key(|w| w.0);
        while waiting.first().is_some_and(|w| w.0 <= now) {
            let (at, id, taken) = waiting.remove(0);
            let outcome = match rule {
                Rule::Charge => state.give_back(&taken, at),
                Rule::Ledger => ledger.give_back(&mut state, &taken, at),
            };
            assert_ne!(outcome, GiveBack::Nothing, "{o:?}");
            given_back += 1;
            cancelled[id] = true;
        }
        let permits = rng.range(1, o.max_permits) as u32;
        let taken = match rule {
            Rule::Charge => state.reserve_recorded(permits, now),
            Rule::Ledger => ledger.reserve_recorded(&mut state, permits, now),
        };
        let timeout = rng.below(2 * o.timeout_micros);
        if taken.moment_micros > now + timeout {
            waiting.push((now + timeout, made.len(), taken));
        } else {
            served += 1;
        }
        made.push((now, permits, taken.moment_micros.max(now)));
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
/// times the rate. Through the ledger nobody is scheduled before the model;
/// by the charge alone, callers are, in overloads with no burst, by seconds.
#[test]
fn timeout_driven_cancellations_through_a_ledger_never_schedule_anyone_before_the_model() {
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
        let ledger = overload(o, Rule::Ledger);
        let charge = overload(o, Rule::Charge);
        println!("{o:?}: through the ledger {ledger:?}; by the charge {charge:?}");
        assert_eq!(ledger.early, 0, "{o:?}: {ledger:?}");
        assert!(ledger.given_back > 400, "{o:?}: {ledger:?}");
        if charge.early > 0 {
            early_by_charge += 1;
        }
    }
    assert!(early_by_charge > 0);
}

#[test]
fn the_latest_reservation_given_back_leaves_the_state_bit_for_bit_as_never_made() {
    for seed in 0..SEQUENCES {
        let mut rng = Rng::new(0x1A7E_5700 + seed);
        let rate = 0.1 + rng.f64() * 1_000.0;
        let mut state = State::new(random_policy(&mut rng), rate, 0).unwrap();
        let mut now = 0;
        for _ in 0..rng.below(20) {
            now += rng.range(0, 3_000_000);
            state.reserve(rng.range(1, 10) as u32, now);
        }
        let never = state.clone();
        let made_at = now + rng.range(0, 2_000_000);
        let reserved = state.reserve_recorded(rng.range(1, 10) as u32, made_at);
        // A refused try changes nothing, so it is still the latest.
        let later = made_at + rng.range(0, 1_000_000);
        if !state.can_acquire(later, 0) {
            assert_eq!(state.try_reserve(1, later, 0), None);
        }
        assert_eq!(state.give_back(&reserved, later), GiveBack::Restored);
        assert_eq!(state, never, "seed {seed}");
        // And from there the two are one limiter.
        let mut never = never;
        for _ in 0..10 {
            now = later + rng.range(0, 2_000_000);
            let p = rng.range(1, 5) as u32;
            assert_eq!(state.reserve(p, now), never.reserve(p, now), "seed {seed}");
        }
    }
}

#[test]
fn a_rate_change_in_between_is_never_undone() {
    let mut state = State::new(Policy::Bursty(Bursty::default()), 10.0, 0).unwrap();
    state.reserve(1, 0);
    let reserved = state.reserve_recorded(1, 0); // waits 100 ms
    state.set_rate(20.0, 0).unwrap(); // leaves the ticket and the store as they were
    assert_eq!(state.give_back(&reserved, 0), GiveBack::Returned(100_000));
    assert_eq!(state.permits_per_second(), 20.0);
    assert_eq!(state.next_free_micros(), 100_000);
}

/// The local limiter gives back exactly as the core through a ledger does:
/// the same reservations, cancellations and idle gaps on both give the same
/// waits, to the microsecond the word may round stored permits by (a
/// reservation that waits is made under the lock, through the ledger).
#[test]
fn the_local_limiter_gives_back_as_the_core() {
    for seed in 0..1_000 {
        let mut rng = Rng::new(0x10CA_1000 + seed);
        let rate = [5.0, 10.0, 1_000.0][rng.below(3) as usize];
        let warm = rng.chance(0.3);
        let clock = FakeClock::new();
        let builder = RateLimiter::builder().permits_per_second(rate);
        let (limiter, policy) = if warm {
            let warmup = Duration::from_secs(1);
            (
                builder.warmup(warmup).clock(clock.clone()).build().unwrap(),
                Policy::WarmingUp(WarmingUp::new(warmup, 3.0)),
            )
        } else {
            (
                builder.clock(clock.clone()).build().unwrap(),
                Policy::Bursty(Bursty::default()),
            )
        };
        let mut core = State::new(policy, rate, 0).unwrap();
        let mut ledger = Ledger::new();
        let mut now = 0;
        let mut held = Vec::new();
        for step in 0..60 {
            match rng.below(6) {
                0..3 => {
                    let p = rng.range(1, 3) as u32;
                    let r = limiter.reservation(p).unwrap();
                    let c = ledger.reserve_recorded(&mut core, p, now);
                    let expected = c.moment_micros.saturating_sub(now);
                    let got = r.delay().as_micros() as u64;
                    // The word holds stored permits as time to 2^-20 µs and
                    // rounds each resync's spend to whole µs where the core
                    // counts permits in f64: a few µs apart at most (3 over
                    // these 1 000 sequences).
                    assert!(
                        got.abs_diff(expected) <= 3,
                        "seed {seed} step {step}: {got} µs, core {expected}"
                    );
                    if r.is_cancellable() && rng.chance(0.5) {
                        held.push((r, c));
                    } else {
                        r.commit();
                    }
                }
                3 if !held.is_empty() => {
                    let (r, c) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    drop(r);
                    ledger.give_back(&mut core, &c, now);
                }
                _ => {
                    // Time passes only once nothing is held: a reservation is
                    // given back before its wait is over.
                    for (r, c) in held.drain(..) {
                        drop(r);
                        ledger.give_back(&mut core, &c, now);
                    }
                    let gap = rng.range(0, 300_000);
                    clock.advance(Duration::from_micros(gap));
                    now += gap;
                }
            }
        }
    }
}

/// Two reservations of an hour each wait; the first is dropped, half an
/// hour passes, eleven callers queue behind the second, and the second is
/// dropped too. A limiter that never made the two would have been idle for
/// that half hour (dropping all but one second of it): the next caller goes
/// where it would, not an hour's charge earlier.
#[test]
fn a_waiter_dropped_after_another_never_lets_the_next_caller_in_early() {
    const S: Duration = Duration::from_secs(1);
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(1.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap();
    let a = limiter.reservation(3600).unwrap();
    let b = limiter.reservation(3600).unwrap();
    assert_eq!((a.delay(), b.delay()), (S, 3601 * S));
    clock.advance(S / 2);
    drop(a); // B keeps its slot
    clock.advance(1800 * S - S / 2);
    // Without A and B these would go at 1800 s (on the one stored permit)
    // and then one a second.
    let queued: Vec<_> = (0..11).map(|_| limiter.reservation(1).unwrap()).collect();
    assert_eq!(queued[0].delay(), 1801 * S); // behind B
    clock.advance(S);
    drop(b);
    // After the eleven, as the limiter without A and B: 1810 s.
    assert_eq!(limiter.reservation(1).unwrap().delay(), 9 * S);
    for r in queued {
        r.commit();
    }
}

#[test]
fn a_dropped_reservation_puts_back_exactly_what_it_took() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    let before = format!("{limiter:?}");
    let b = limiter.reservation(5).unwrap();
    assert_eq!(b.delay(), Duration::from_millis(100));
    drop(b);
    assert_eq!(format!("{limiter:?}"), before);
    assert_eq!(limiter.available_in().unwrap(), Duration::from_millis(100));
}

#[test]
fn a_waiting_caller_keeps_its_slot_and_the_next_takes_the_dropped_one() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = limiter.reservation(1).unwrap();
    let b = limiter.reservation(1).unwrap();
    let c = limiter.reservation(1).unwrap();
    assert_eq!(
        [a.delay(), b.delay(), c.delay()],
        [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_millis(200)
        ]
    );
    drop(b);
    let d = limiter.reservation(1).unwrap();
    assert_eq!(d.delay(), Duration::from_millis(200), "D takes C's slot");
    assert_eq!(c.wait_blocking(), Duration::from_millis(200), "C keeps it");
    d.commit();
    a.commit();
}

/// The slot test above on the real clock (the local twin of
/// `a_dropped_waiter_gives_its_slot_to_the_next_caller_through_redis`): A
/// goes at once, B and C wait one and two intervals; B is dropped, and D,
/// reserved next, is scheduled at C's slot, not one interval after it. C
/// keeps its slot: C and D both go about two intervals after A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_gives_its_slot_to_the_next_caller_on_the_real_clock() {
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    let a = limiter.reservation(1).unwrap();
    let b = limiter.reservation(1).unwrap();
    let c = limiter.reservation(1).unwrap();
    assert!(a.delay().is_zero());
    let (b_delay, c_delay) = (b.delay(), c.delay());
    assert!(
        c_delay > b_delay + Duration::from_millis(80),
        "{b_delay:?} {c_delay:?}"
    );
    drop(b);
    let d = limiter.reservation(1).unwrap();
    let d_delay = d.delay();
    // D is scheduled at C's slot (less the real time between the two
    // reservations), not one interval later.
    let gap = c_delay.saturating_sub(d_delay);
    assert!(
        d_delay <= c_delay && gap <= Duration::from_millis(60),
        "C at {c_delay:?}, D at {d_delay:?}"
    );
    a.commit();
    let (c_done, d_done) = tokio::join!(
        async {
            c.wait().await;
            start.elapsed()
        },
        async {
            d.wait().await;
            start.elapsed()
        }
    );
    println!("C {c_delay:?} went at {c_done:?}; D {d_delay:?} went at {d_done:?}");
    // Sleeps never end early: C waited out its own slot, and so did D.
    assert!(
        c_done >= c_delay && d_done >= d_delay,
        "{c_done:?} {d_done:?}"
    );
    // One slot: on the same runtime, they end within a scheduling hiccup of
    // each other (one interval apart were D pushed back).
    assert!(
        c_done.abs_diff(d_done) <= Duration::from_millis(60),
        "C went at {c_done:?}, D at {d_done:?}"
    );
}

#[test]
fn warming_up_limiters_give_back_through_the_lock() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(2.0)
        .warmup(Duration::from_secs(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap(); // cold: the next waits 1.375 s
    let before = format!("{limiter:?}");
    let b = limiter.reservation(1).unwrap();
    assert_eq!(b.delay(), Duration::from_millis(1_375));
    drop(b);
    assert_eq!(format!("{limiter:?}"), before);
}

/// `timeout(1 ms, acquire(1))`, twenty times, on the real clock: each one
/// gives its reservation back, so at most one interval of debt is left.
#[tokio::test(flavor = "current_thread")]
async fn timed_out_acquires_leave_at_most_one_interval_of_debt() {
    let limiter = RateLimiter::bursty(10.0).unwrap();
    let mut timed_out = 0;
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(1), limiter.acquire(1))
            .await
            .is_err()
        {
            timed_out += 1;
        }
    }
    assert!(timed_out >= 18, "{timed_out} of 20 timed out");
    let debt = limiter.available_in().unwrap();
    assert!(debt <= Duration::from_millis(100), "debt left: {debt:?}");
    // The same through the trait object.
    let shared: std::sync::Arc<dyn Limiter> =
        std::sync::Arc::new(RateLimiter::bursty(10.0).unwrap());
    for _ in 0..20 {
        let _ = tokio::time::timeout(Duration::from_millis(1), shared.acquire(1)).await;
    }
    let debt = shared.available_in().await.unwrap();
    assert!(debt <= Duration::from_millis(100), "debt left: {debt:?}");
}
