//! `Limits` against twins that never saw what was given back, and the log that
//! makes that exact (the rest of its tests are in
//! `tests/local/core_limits.rs`).

use super::*;
use crate::core::test_rng::Rng;
use crate::core::{Bursty, Policy, WarmingUp};
use std::time::Duration;

fn bursty(rate: f64, burst: Duration) -> State {
    State::new(Policy::Bursty(Bursty::new(burst)), rate, 0).unwrap()
}

fn random_limit(rng: &mut Rng) -> State {
    let rate = [0.5, 3.0, 10.0, 100.0, 1000.0, f64::INFINITY][rng.below(6) as usize];
    if rng.below(4) == 0 {
        let warmup = Duration::from_millis(1 + rng.below(3000));
        State::new(Policy::WarmingUp(WarmingUp::new(warmup, 3.0)), rate, 0).unwrap()
    } else {
        bursty(rate, Duration::from_millis(rng.below(3000)))
    }
}

/// A give-back leaves the limits exactly as a twin that never saw the
/// reservation: random mixes of held and plain reservations, tries, idle gaps
/// and give-backs, both policies, 1 to 3 limits.
#[test]
fn a_give_back_leaves_exactly_what_a_limiter_without_it_holds() {
    let mut rng = Rng(31);
    for _ in 0..300 {
        let count = 1 + rng.below(3) as usize;
        let states: Vec<State> = (0..count).map(|_| random_limit(&mut rng)).collect();
        let mut limits = Limits::new(states).unwrap();
        // Every request made, with the held ones' ids; replayed without the
        // ones given back, it must give the same states.
        let mut history: Vec<(u32, u64, Option<u64>)> = Vec::new();
        let mut given_back = Vec::new();
        let fresh = limits.clone();
        let mut now = 0;
        for _ in 0..60 {
            now += rng.below(200_000);
            match rng.below(4) {
                0 | 1 => {
                    let permits = 1 + rng.below(3) as u32;
                    let g = limits.reserve(permits, now, rng.below(2) == 0);
                    history.push((permits, now, g.id));
                }
                2 => {
                    let ids: Vec<u64> = history.iter().filter_map(|h| h.2).collect();
                    if let Some(&id) = ids.get(rng.below(ids.len() as u64 + 1) as usize)
                        && !given_back.contains(&id)
                    {
                        let moment = limits_moment(&limits, id);
                        let took = limits.give_back(id, now);
                        assert_eq!(took, moment.is_some_and(|m| m > now), "id {id}");
                        if took {
                            given_back.push(id);
                            let mut twin = fresh.clone();
                            for &(p, at, hid) in &history {
                                if hid.is_none_or(|h| !given_back.contains(&h)) {
                                    twin.reserve(p, at, false);
                                }
                            }
                            assert_eq!(limits.states(), twin.states());
                        }
                    }
                }
                _ => {
                    let before = limits.clone();
                    if limits.try_reserve(1, now, 0, false).is_none() {
                        assert_eq!(limits, before);
                    } else {
                        history.push((1, now, None));
                    }
                }
            }
        }
    }
}

fn limits_moment(limits: &Limits, id: u64) -> Option<u64> {
    limits
        .log
        .requests
        .iter()
        .find(|r| r.id == Some(id))
        .map(|r| r.moment_micros)
}

/// The log starts at the oldest reservation that may still be given back: the
/// plain requests before it, and one kept or given back at its head, leave it
/// (changing no state), and it empties once none is left.
#[test]
fn the_log_starts_at_the_oldest_reservation_that_may_be_given_back() {
    let mut limits = Limits::new(vec![bursty(1.0, Duration::ZERO)]).unwrap();
    limits.reserve(1, 0, false); // goes at once: not logged
    let a = limits.reserve(1, 0, true).id.unwrap(); // waits 1 s: logged
    limits.reserve(1, 0, false); // logged behind it
    let b = limits.reserve(1, 0, true).id.unwrap();
    assert_eq!(limits.log.requests.len(), 3);
    let before = limits.states().to_vec();
    assert!(limits.keep(a, 0));
    assert_eq!(limits.states(), &before[..]);
    assert_eq!(limits.log.requests.len(), 1, "b alone");
    assert!(!limits.give_back(a, 0) && !limits.keep(a, 0));
    assert!(limits.give_back(b, 0));
    assert!(limits.log_is_empty());
    assert_eq!(limits.states()[0].next_free_micros, 3_000_000);
    // A plain request finds the log empty, and is not logged.
    limits.reserve(1, 0, false);
    assert!(limits.log_is_empty());
}
