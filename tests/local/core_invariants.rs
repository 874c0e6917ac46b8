//! The pure core under random, often absurd, input: it never produces NaN,
//! never lets stored permits leave `0..=max_permits`, never moves the ticket
//! backwards, and a refused try changes nothing.

use crate::support;

use paceline::core::{Bursty, MAX_MICROS, Policy, State, WarmingUp};
use support::rng::Rng;

const RATES: [f64; 9] = [1e-300, 1e-3, 0.5, 1.0, 7.0, 1e3, 1e6, 1e300, f64::INFINITY];

fn random_policy(rng: &mut Rng) -> Policy {
    let duration = *rng.pick(&[
        std::time::Duration::ZERO,
        std::time::Duration::from_nanos(500),
        std::time::Duration::from_micros(1),
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
        std::time::Duration::MAX,
    ]);
    if rng.chance(0.5) {
        Policy::Bursty(Bursty::new(duration))
    } else {
        Policy::WarmingUp(WarmingUp::new(duration, *rng.pick(&[1.0, 3.0, 10.0, 1e12])))
    }
}

fn check(state: &State, context: &str) {
    assert!(!state.stored_permits().is_nan(), "{context}: {state:?}");
    assert!(state.stored_permits() >= 0.0, "{context}: {state:?}");
    assert!(
        state.stored_permits() <= state.max_permits(),
        "{context}: {state:?}"
    );
    assert!(state.max_permits().is_finite(), "{context}: {state:?}");
    assert!(
        state.next_free_micros() <= MAX_MICROS,
        "{context}: {state:?}"
    );
    // The warming-up policy's own numbers (threshold, slope) stay finite
    // too: a unit test in `core::warming_up` holds them to it.
}

#[test]
fn random_sequences_keep_every_invariant() {
    let mut rng = Rng::new(0x7417_7e1e);
    for sequence in 0..3000 {
        let mut now = rng.below(1 << 50);
        let mut state = State::new(random_policy(&mut rng), *rng.pick(&RATES), now).unwrap();
        for step in 0..60 {
            let context = format!("sequence {sequence}, step {step}");
            now = (now
                + match rng.below(4) {
                    0 => 0,
                    1 => rng.below(1_000),
                    2 => rng.below(10_000_000),
                    _ => rng.below(1 << 45),
                })
            .min(MAX_MICROS);
            let permits = *rng.pick(&[1, 2, 10, 1000, u32::MAX]);
            let before = state.clone();
            match rng.below(4) {
                0 => {
                    state.set_rate(*rng.pick(&RATES), now).unwrap();
                }
                1 => {
                    let timeout = *rng.pick(&[0, 1, 1_000_000, u64::MAX]);
                    match state.try_reserve(permits, now, timeout) {
                        None => {
                            assert_eq!(state, before, "{context}: a refused try changed the state")
                        }
                        Some(wait) => assert!(wait <= timeout, "{context}"),
                    }
                }
                _ => {
                    let wait = state.reserve(permits, now);
                    assert_eq!(
                        wait,
                        before.next_free_micros().saturating_sub(now),
                        "{context}"
                    );
                }
            }
            assert!(
                state.next_free_micros() >= before.next_free_micros().min(now),
                "{context}"
            );
            check(&state, &context);
        }
    }
}
