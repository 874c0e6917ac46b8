//! The word against the core, step by step.

use super::*;
use crate::core::{Bursty, Limits};

fn bursty(rate: f64) -> (State, Config) {
    let state = State::new(Policy::Bursty(Bursty::default()), rate, 0).unwrap();
    let config = Config::new(&state, 0).unwrap();
    (state, config)
}

#[test]
fn the_word_layout_has_room_for_every_ticket() {
    const { assert!(MAX_MICROS < MUTEX) };
    const { assert!(WINDOW << FRAC_BITS == STORED) };
    const { assert!(STORED << 1 == 1 << GEN_SHIFT) };
    assert!(is_mutex(next_generation(0) | MUTEX));
    assert!(!is_mutex(MAX_MICROS));
    assert_eq!(next_generation(GEN_MASK << GEN_SHIFT), 0);
}

/// The word for `state` at `now` under `config`.
fn word_of(state: &State, now: u64, config: &Config) -> u64 {
    match encode(0, state, now, config) {
        Encoded::Word(word) => word,
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_limiter_charges_like_the_core() {
    let (mut state, config) = bursty(5.0);
    state.stored_permits = 0.0;
    let empty = word_of(&state, 0, &config);
    let Step::Granted { word, wait: 0 } = step(empty, 0, 1, u64::MAX, &config) else {
        panic!()
    };
    state.reserve(1, 0);
    assert_eq!(word, word_of(&state, 0, &config));
    let Step::Granted { word, wait } = step(word, 0, 1, u64::MAX, &config) else {
        panic!()
    };
    assert_eq!(wait, 200_000);
    assert_eq!(step(word, 0, 1, 399_999, &config), Step::Refused);
    assert_eq!(decode(word, 0, &config).next_free, 400_000);
}

#[test]
fn the_ticket_keeps_its_fraction_like_the_core() {
    // 3 permits per µs: a third of a µs each, which whole µs would lose.
    let (mut state, config) = bursty(3e6);
    state.stored_permits = 0.0;
    let mut word = word_of(&state, 0, &config);
    for _ in 0..1_000 {
        let Step::Granted { word: next, wait } = step(word, 0, 1, u64::MAX, &config) else {
            panic!()
        };
        assert_eq!(wait, state.reserve(1, 0));
        word = next;
    }
    let decoded = decode(word, 0, &config);
    assert_eq!(
        (decoded.next_free, decoded.fraction),
        (state.next_free_micros, state.next_free_fraction)
    );
    assert_eq!(decoded.next_free, 333); // 1000 / 3 µs, and a third
    assert_eq!(word, word_of(&state, 0, &config));
}

#[test]
fn stored_permits_round_trip() {
    let (mut state, config) = bursty(5.0);
    state.stored_permits = 0.0;
    let empty = word_of(&state, 0, &config);
    // Idle for a second: five stored; spend two.
    let Step::Granted { word, wait: 0 } = step(empty, 1_000_000, 2, 0, &config) else {
        panic!()
    };
    assert_eq!(word & STORED, STORED);
    let decoded = decode(word, 1_000_000, &config);
    assert_eq!((decoded.stored, decoded.next_free), (3.0, 1_000_000));
    state.reserve(2, 1_000_000);
    assert_eq!(encode(0, &state, 1_000_000, &config), Encoded::Word(word));
}

#[test]
fn stored_permits_behind_a_debt_need_mutex_mode() {
    let (mut state, config) = bursty(5.0);
    state.stored_permits = 1.0;
    state.next_free_micros = 10;
    assert_eq!(encode(0, &state, 5, &config), Encoded::Mutex);
    state.stored_permits = 0.0;
    assert!(matches!(encode(0, &state, 5, &config), Encoded::Word(_)));
}

#[test]
fn far_times_need_a_rebase() {
    let (mut state, config) = bursty(5.0);
    let later = WINDOW;
    state.next_free_micros = later;
    assert_eq!(encode(0, &state, later, &config), Encoded::Rebase);
    assert_eq!(step(0, later, 1, 0, &config), Step::Slow);
}

#[test]
fn a_debt_past_the_window_needs_mutex_mode() {
    let (mut state, _) = bursty(5.0);
    state.next_free_micros = WINDOW;
    let limits = Limits::new(vec![state]).unwrap();
    assert_eq!(publish(0, &limits, 0), (mutex_mode(0), None));
}

#[test]
fn warming_up_and_huge_bursts_run_in_mutex_mode() {
    let warm = State::new(
        Policy::WarmingUp(crate::core::WarmingUp::new(
            std::time::Duration::from_secs(1),
            3.0,
        )),
        5.0,
        0,
    )
    .unwrap();
    assert_eq!(Config::new(&warm, 0), None);
    let huge = State::new(
        Policy::Bursty(Bursty::new(std::time::Duration::from_secs(86_400))),
        5.0,
        0,
    )
    .unwrap();
    assert_eq!(Config::new(&huge, 0), None);
    let limits = Limits::new(vec![huge]).unwrap();
    assert_eq!(publish(0, &limits, 0), (mutex_mode(0), None));
}

/// The same requests on the word and on [`Limits`] of one bursty limit give
/// the same waits, refusals and tickets, to the bit and then to the
/// microsecond (see the word's "Exactness"; a limit with no burst never leaves
/// the bit), where a timeout between two debts a rounding apart may split a
/// refusal. A step the word cannot take (a rebase, a debt past the window)
/// runs on the limits, and the word is published again from them, as the local
/// limiter does.
#[test]
fn a_word_is_one_bursty_limit_with_an_empty_log() {
    use crate::core::test_rng::Rng;
    use std::time::Duration;

    let mut rng = Rng(0x0057_0a7e);
    let (mut compared, mut rounded, mut split) = (0, 0, 0);
    for sequence in 0..2_000 {
        let rate = rng.pick(&[0.5, 3.0, 10.0, 1e3, 333_333.0, 3e6]);
        let burst = rng.pick(&[0, 0, 250_000, 1_000_000, 7_000_000]);
        // Until the word first holds stored permits.
        let mut exact = true;
        let mut now = rng.below(1 << 40);
        let policy = Policy::Bursty(Bursty::new(Duration::from_micros(burst)));
        let mut limits = Limits::new(vec![State::new(policy, rate, now).unwrap()]).unwrap();
        let (mut word, config) = publish(u64::MAX, &limits, now);
        let mut config = config.unwrap();
        for step_number in 0..100 {
            now += match rng.below(6) {
                0 | 1 => 0,
                2 => rng.below(1_000),
                3 => rng.below(1_000_000),
                4 => rng.below(10_000_000),
                _ => rng.below(1 << 35), // past the window, sometimes
            };
            let permits = rng.pick(&[1, 1, 1, 2, 7, 1_000]);
            let debt = limits.earliest(now).0 - now;
            let timeout = rng.pick(&[0, debt, debt.saturating_sub(1), debt + 1, u64::MAX]);
            let context =
                format!("sequence {sequence} step {step_number}: rate {rate}, burst {burst} µs");
            exact &= !has_stored(word);
            let granted = limits.try_reserve(permits, now, timeout, false);
            assert!(limits.log_is_empty(), "{context}");
            match (step(word, now, permits, timeout, &config), granted) {
                (Step::Granted { word: new, wait }, Some(granted)) => {
                    compared += 1;
                    let diff = wait.abs_diff(granted.wait_micros);
                    assert!(
                        diff <= u64::from(!exact),
                        "{context}: word {wait}, limits {granted:?}"
                    );
                    rounded += u64::from(diff > 0);
                    word = new;
                }
                (Step::Refused, None) => continue,
                (Step::Slow, _) => {
                    (word, config) = republish(word, &limits, now, config);
                    continue;
                }
                (outcome, granted) => {
                    // Refused by one and granted by the other: only at a
                    // timeout between two debts a rounding apart.
                    let decoded = decode(word, now, &config).next_free.saturating_sub(now);
                    let (low, high) = (debt.min(decoded), debt.max(decoded));
                    assert!(
                        !exact && high - low <= 1 && low <= timeout && timeout < high,
                        "{context}: word {outcome:?}, limits {granted:?}"
                    );
                    split += 1;
                    (word, config) = republish(word, &limits, now, config);
                    continue;
                }
            }
            if exact && !has_stored(word) {
                // Nothing stored yet: the word holds the ticket itself.
                let state = &limits.states()[0];
                let decoded = decode(word, now, &config);
                assert_eq!(
                    (decoded.next_free, decoded.fraction),
                    (state.next_free_micros(), state.next_free_fraction()),
                    "{context}"
                );
            }
        }
    }
    assert!(
        compared > 100_000 && rounded > 0 && split > 0,
        "{compared} {rounded} {split}"
    );
}

/// The word for `limits` after a step the word could not take: in the same
/// generation if it fits, else published in the next one; `config` is the
/// configuration in force. In mutex mode (a debt past the window) the next
/// step finds it and comes back here.
fn republish(word: u64, limits: &Limits, now: u64, config: Config) -> (u64, Config) {
    let state = &limits.states()[0];
    if let Encoded::Word(new) = encode(word, state, now, &config) {
        return (new, config);
    }
    match publish(word, limits, now) {
        (new, Some(config)) => (new, config),
        (mutex, None) => (mutex, config),
    }
}
