//! `Limits` against single cores: one limit is the core itself, a request
//! waits for the latest limit and is charged to each, no window is over
//! granted; the log's bound and a rate change.

use std::time::Duration;

use crate::support::rng::Rng;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};

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

#[test]
fn one_limit_is_the_core_itself() {
    let mut rng = Rng::new(7);
    for _ in 0..200 {
        let state = random_limit(&mut rng);
        let mut single = state.clone();
        let mut limits = Limits::new(vec![state]).unwrap();
        let mut now = 0;
        for _ in 0..100 {
            now += rng.below(300_000);
            let permits = 1 + rng.below(5) as u32;
            let timeout = rng.below(1_000_000);
            let expected = single.try_reserve(permits, now, timeout);
            let got = limits.try_reserve(permits, now, timeout, false);
            assert_eq!(got.map(|g| g.wait_micros), expected);
            assert_eq!(limits.states()[0], single);
        }
    }
}

/// The wait is the latest any limit requires, and each limit is
/// charged as of that moment: the same as single limits fed the request
/// at the composite's moment. A refused try changes nothing.
#[test]
fn a_request_waits_for_the_latest_limit_and_charges_each_at_that_moment() {
    let mut rng = Rng::new(11);
    for _ in 0..200 {
        let count = 1 + rng.below(3) as usize;
        let mut singles: Vec<State> = (0..count).map(|_| random_limit(&mut rng)).collect();
        let mut limits = Limits::new(singles.clone()).unwrap();
        let mut now = 0;
        for _ in 0..100 {
            now += rng.below(500_000);
            let permits = 1 + rng.below(4) as u32;
            let timeout = rng.below(3_000_000);
            let waits: Vec<u64> = singles
                .iter()
                .map(|s| s.next_free_micros().saturating_sub(now))
                .collect();
            let longest = *waits.iter().max().unwrap();
            let before = limits.clone();
            match limits.try_reserve(permits, now, timeout, false) {
                None => {
                    assert!(longest > timeout);
                    assert_eq!(limits, before, "a refused try charged something");
                }
                Some(granted) => {
                    assert_eq!(granted.wait_micros, longest);
                    let bound = granted.bound_by.map(|i| waits[i]);
                    assert_eq!(bound.unwrap_or(0), longest);
                    for single in &mut singles {
                        single.reserve_earliest_available(permits, now + longest);
                    }
                    assert_eq!(limits.states(), &singles[..]);
                }
            }
        }
    }
}

/// The grants, replayed in any window, never exceed what each limit
/// allows alone over it: its burst, its rate over the window, and the
/// last request's own permits (charged to the next one).
#[test]
fn no_window_of_any_limit_is_over_granted() {
    let mut rng = Rng::new(23);
    for _ in 0..100 {
        let rates = [rng.below(20) + 1, rng.below(5) + 1];
        let bursts = [rng.below(1000), rng.below(3000)];
        let states = (0..2)
            .map(|i| bursty(rates[i] as f64, Duration::from_millis(bursts[i])))
            .collect();
        let mut limits = Limits::new(states).unwrap();
        let mut grants = Vec::new();
        let mut now = 0;
        for _ in 0..200 {
            now += rng.below(400_000);
            let permits = 1 + rng.below(3) as u32;
            if let Some(g) = limits.try_reserve(permits, now, rng.below(2_000_000), false) {
                grants.push((g.moment_micros, u64::from(permits)));
            }
        }
        for i in 0..2 {
            let burst = rates[i] as f64 * bursts[i] as f64 / 1000.0;
            for a in 0..grants.len() {
                let mut sum = 0;
                for (b, &(moment, permits)) in grants.iter().enumerate().skip(a) {
                    sum += permits;
                    let window = (moment - grants[a].0) as f64 / 1e6;
                    // Moments are whole microseconds, tickets finer: a
                    // window can read up to 1 µs short at each end.
                    let window_ends = 2e-6 * rates[i] as f64;
                    let allowed = burst + rates[i] as f64 * window + permits as f64 + window_ends;
                    assert!(
                        (sum as f64) <= allowed,
                        "limit {i}: {sum} permits in grants {a}..={b} over {window} s"
                    );
                }
            }
        }
    }
}

#[test]
fn a_full_log_drops_its_oldest_which_then_gives_nothing_back() {
    let mut limits = Limits::with_capacity(vec![bursty(1.0, Duration::ZERO)], 2).unwrap();
    limits.reserve(1, 0, false);
    let first = limits.reserve(1, 0, true).id.unwrap();
    let second = limits.reserve(1, 0, true).id.unwrap();
    let third = limits.reserve(1, 0, true).id.unwrap();
    let before = limits.clone();
    assert!(!limits.give_back(first, 0));
    assert_eq!(limits, before);
    assert!(limits.give_back(second, 0));
    assert!(limits.give_back(third, 0));
    assert_eq!(limits.states()[0].next_free_micros(), 2_000_000);
}

#[test]
fn a_rate_change_applies_to_one_limit_or_all_and_empties_the_log() {
    let per_second = bursty(10.0, Duration::ZERO);
    let per_minute = bursty(1.0, Duration::ZERO);
    let mut limits = Limits::new(vec![per_second, per_minute]).unwrap();
    limits.reserve(1, 0, false);
    let held = limits.reserve(1, 0, true).id.unwrap();
    limits.set_rate(Some(1), 2.0, 0).unwrap();
    assert_eq!(limits.states()[0].permits_per_second(), 10.0);
    assert_eq!(limits.states()[1].permits_per_second(), 2.0);
    assert!(
        !limits.give_back(held, 0),
        "given back across a rate change"
    );
    limits.set_rate(None, 4.0, 0).unwrap();
    assert!(
        limits
            .states()
            .iter()
            .all(|s| s.permits_per_second() == 4.0)
    );
    assert!(limits.set_rate(None, f64::NAN, 0).is_err());
    let rates = |limits: &Limits| -> Vec<f64> {
        limits
            .states()
            .iter()
            .map(|s| s.permits_per_second())
            .collect()
    };
    // The first at the rate given, the others scaled by as much.
    limits.set_rate(Some(1), 8.0, 0).unwrap();
    limits.set_first_rate(&rates(&limits), 2.0, 0).unwrap();
    assert_eq!(rates(&limits), [2.0, 4.0]);
    // Where a rate scaled is not one (a finite rate to infinity: the factor
    // overflowed; or to zero), every limit takes the rate given: an
    // infinite rate only if that is one.
    limits
        .set_first_rate(&rates(&limits), f64::INFINITY, 0)
        .unwrap();
    assert_eq!(rates(&limits), [f64::INFINITY; 2]);
    limits.set_first_rate(&rates(&limits), 3.0, 0).unwrap();
    assert_eq!(rates(&limits), [3.0; 2]);
    limits.set_rate(Some(1), 6.0, 0).unwrap();
    limits.set_first_rate(&rates(&limits), 1e-308, 0).unwrap();
    limits.set_first_rate(&rates(&limits), 1e308, 0).unwrap();
    assert_eq!(rates(&limits), [1e308; 2]);
    assert!(limits.set_first_rate(&rates(&limits), f64::NAN, 0).is_err());
    assert_eq!(rates(&limits), [1e308; 2]);
    assert!(Limits::new(Vec::new()).is_none());
}
