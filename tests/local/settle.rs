//! Settling open calls in the core's [`Limits`]: against a twin that
//! reserved the real cost in the first place, on random mixes of limits,
//! estimates, real costs and other callers.

use crate::support;

use std::time::Duration;

use paceline::Cost;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};
use support::rng::Rng;

fn random_limit(rng: &mut Rng) -> State {
    let rate = *rng.pick(&[2.0, 10.0, 100.0, 1_000.0]);
    if rng.chance(0.25) {
        let warmup = Duration::from_millis(rng.range(1, 3_000));
        State::new(Policy::WarmingUp(WarmingUp::new(warmup, 3.0)), rate, 0).unwrap()
    } else {
        let burst = Duration::from_millis(rng.below(3_000));
        State::new(Policy::Bursty(Bursty::new(burst)), rate, 0).unwrap()
    }
}

fn random_cost(rng: &mut Rng, limits: usize) -> Cost {
    if rng.chance(0.3) {
        Cost::from(rng.range(1, 5) as u32)
    } else {
        Cost::each((0..limits).map(|_| rng.below(40) as u32))
    }
}

/// Open calls settled at their real cost leave the limits exactly as a
/// twin that reserved the real cost at the same moments: the same states,
/// to the bit, once every call is settled, and the same waits for every
/// request after. Other callers' plain and held reservations come in
/// between, some of them given back.
#[test]
fn settling_every_call_equals_a_twin_that_reserved_the_real_costs() {
    for seed in 0..500 {
        let mut rng = Rng::new(0x5E77_1E00 + seed);
        let count = rng.range(1, 4) as usize;
        let states: Vec<State> = (0..count).map(|_| random_limit(&mut rng)).collect();
        let mut limits = Limits::new(states.clone()).unwrap();
        let mut twin = Limits::new(states).unwrap();
        // Open calls not yet settled: (id, estimate, actual).
        let mut open: Vec<(u64, Cost, Cost)> = Vec::new();
        // Held reservations in both: (id in limits, id in twin).
        let mut held: Vec<(u64, u64)> = Vec::new();
        let mut now = 0;
        for step in 0..60 {
            now += rng.below(300_000);
            match rng.below(5) {
                0 | 1 => {
                    let estimate = random_cost(&mut rng, count);
                    let actual = random_cost(&mut rng, count);
                    let granted = limits.open(&estimate, now, u64::MAX).unwrap();
                    let id = granted.id.expect("an open call has an id");
                    twin.open(&actual, now, u64::MAX).unwrap();
                    open.push((id, estimate, actual));
                }
                2 if !open.is_empty() => {
                    let (id, estimate, actual) = open.remove(rng.below(open.len() as u64) as usize);
                    assert!(
                        limits.settle(id, &estimate, &actual, now),
                        "seed {seed} step {step}: the log let an open call go"
                    );
                    limits.keep(id, now);
                }
                3 => {
                    let permits = rng.range(1, 4) as u32;
                    let a = limits.reserve(permits, now, true);
                    let b = twin.reserve(permits, now, true);
                    if let (Some(a), Some(b)) = (a.id, b.id) {
                        held.push((a, b));
                    }
                }
                _ if !held.is_empty() => {
                    // Given back where both still can (their moments
                    // differ while a call's cost does).
                    let (a, b) = held.remove(rng.below(held.len() as u64) as usize);
                    let (mut ours, mut theirs) = (limits.clone(), twin.clone());
                    if ours.give_back(a, now) && theirs.give_back(b, now) {
                        (limits, twin) = (ours, theirs);
                    }
                }
                _ => {
                    let permits = rng.range(1, 4) as u32;
                    limits.reserve(permits, now, false);
                    twin.reserve(permits, now, false);
                }
            }
            if open.is_empty() {
                assert_eq!(limits.states(), twin.states(), "seed {seed} step {step}");
            }
        }
        for (id, estimate, actual) in open.drain(..) {
            assert!(limits.settle(id, &estimate, &actual, now));
        }
        assert_eq!(limits.states(), twin.states(), "seed {seed}");
        for _ in 0..10 {
            now += rng.below(200_000);
            let cost = random_cost(&mut rng, count);
            let a = limits.open(&cost, now, u64::MAX).unwrap();
            let b = twin.open(&cost, now, u64::MAX).unwrap();
            assert_eq!(a.wait_micros, b.wait_micros, "seed {seed}");
        }
    }
}

/// A call settled twice ends as if it had reserved the last cost.
#[test]
fn a_second_settle_replaces_the_first() {
    let state = State::new(Policy::Bursty(Bursty::new(Duration::ZERO)), 10.0, 0).unwrap();
    let mut limits = Limits::new(vec![state.clone()]).unwrap();
    let mut twin = Limits::new(vec![state]).unwrap();
    let id = limits
        .open(&Cost::from(5), 0, u64::MAX)
        .unwrap()
        .id
        .unwrap();
    twin.open(&Cost::from(2), 0, u64::MAX).unwrap();
    assert!(limits.settle(id, &Cost::from(5), &Cost::from(9), 100));
    assert!(limits.settle(id, &Cost::from(9), &Cost::from(2), 200));
    assert_eq!(limits.states(), twin.states());
    // 2 permits at 10/s: the next goes at 200 ms.
    assert_eq!(limits.reserve(1, 300, false).wait_micros, 200_000 - 300);
}

/// Once the log has let a call go (here: it holds one request), a larger
/// real cost is charged at once to the schedule (a bursty limit in debt
/// ends where the twin does), and a smaller one gives nothing back: the
/// next caller waits as long as the twin's or longer.
#[test]
fn a_call_the_log_let_go_settles_against_the_schedule() {
    let state = State::new(Policy::Bursty(Bursty::new(Duration::ZERO)), 10.0, 0).unwrap();
    for (estimate, actual) in [(3, 8), (8, 3), (5, 5), (4, 0)] {
        let mut limits = Limits::with_capacity(vec![state.clone()], 1).unwrap();
        let mut twin = Limits::new(vec![state.clone()]).unwrap();
        let id = limits
            .open(&Cost::from(estimate), 0, u64::MAX)
            .unwrap()
            .id
            .unwrap();
        twin.reserve(actual, 0, false);
        // Another caller pushes the call out of the log.
        limits.reserve(1, 1_000, false);
        twin.reserve(1, 1_000, false);
        assert!(!limits.settle(id, &Cost::from(estimate), &Cost::from(actual), 2_000));
        let ours = limits.reserve(1, 3_000, false).wait_micros;
        let exact = twin.reserve(1, 3_000, false).wait_micros;
        if actual >= estimate {
            assert_eq!(ours, exact, "{estimate} then {actual}");
        } else {
            assert_eq!(ours, (estimate + 1) as u64 * 100_000 - 3_000);
            assert!(ours > exact, "{estimate} then {actual}");
        }
    }
}

/// A limit that counts nothing of a call is not charged for it, and
/// settling a cost per limit replaces each limit's count.
#[test]
fn costs_per_limit_charge_each_limit_its_own_count() {
    let requests = State::new(Policy::Bursty(Bursty::new(Duration::ZERO)), 10.0, 0).unwrap();
    let tokens = State::new(Policy::Bursty(Bursty::new(Duration::ZERO)), 1_000.0, 0).unwrap();
    let mut limits = Limits::new(vec![requests, tokens]).unwrap();
    let id = limits
        .open(&Cost::each([1, 800]), 0, u64::MAX)
        .unwrap()
        .id
        .unwrap();
    let tickets = |limits: &Limits| {
        let states = limits.states();
        (states[0].next_free_micros(), states[1].next_free_micros())
    };
    // One request at 10/s and 800 tokens at 1 000/s.
    assert_eq!(tickets(&limits), (100_000, 800_000));
    // It cost 300 tokens.
    assert!(limits.settle(id, &Cost::each([1, 800]), &Cost::each([1, 300]), 10));
    limits.keep(id, 10);
    assert_eq!(tickets(&limits), (100_000, 300_000));
    let next = limits.reserve(1, 20, false);
    assert_eq!((next.wait_micros, next.bound_by), (300_000 - 20, Some(1)));
}
