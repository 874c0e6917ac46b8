//! A keyed limiter with several limits: every key has all of them, starts
//! full, and agrees with the core's `Limits` call by call; idle keys are
//! forgotten, a cap holds, give-backs and refusals behave as for one key.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::rng::Rng;
use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::core::{Bursty, Limits, Policy, State};
use paceline::{Error, KeyedRateLimiter, Limit};

const MS: Duration = Duration::from_millis(1);

fn per_second_and_minute(clock: &FakeClock) -> KeyedRateLimiter<u64, Local, FakeClock> {
    // 10 per second with a burst of 3 and 3 per minute with a burst of 4:
    // 2 and 3 stored.
    KeyedRateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(3))
        .limit(Limit::per(3.0, Duration::from_secs(60)).burst(4))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn each_key_starts_full_on_every_limit_and_waits_for_the_latest() {
    let clock = FakeClock::new();
    let limiter = per_second_and_minute(&clock);
    // A new key: 2 stored per second, 3 per minute. Three go at once (the
    // third spends no stored permit per second, so the next one pays), the
    // fourth waits 100 ms (per second), the fifth 20 s (per minute).
    for _ in 0..3 {
        assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::ZERO);
    }
    assert_eq!(limiter.reserve(&1, 1).unwrap(), 100 * MS);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::from_secs(20));
    // Another key is untouched.
    assert_eq!(limiter.reserve(&2, 1).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.snapshot(&1).unwrap().wait(),
        Duration::from_secs(40)
    );
    assert_eq!(limiter.snapshot(&3).unwrap().wait(), Duration::ZERO);
    assert_eq!(limiter.stats().keys, 2);
}

#[test]
fn a_refused_try_charges_nothing_and_a_drop_gives_back() {
    let clock = FakeClock::new();
    let limiter = per_second_and_minute(&clock);
    for _ in 0..4 {
        limiter.reserve(&7, 1).unwrap();
    }
    let before = limiter.snapshot(&7).unwrap().wait();
    assert_eq!(before, Duration::from_secs(20));
    assert_eq!(
        limiter.try_reserve(&7, 1, Duration::from_secs(1)).unwrap(),
        None
    );
    assert_eq!(limiter.snapshot(&7).unwrap().wait(), before);
    let held = limiter.reservation(&7, 1).unwrap();
    assert_eq!(
        (held.delay(), held.limit()),
        (Duration::from_secs(20), Some(1))
    );
    assert_eq!(
        limiter.snapshot(&7).unwrap().wait(),
        Duration::from_secs(40)
    );
    drop(held);
    assert_eq!(limiter.snapshot(&7).unwrap().wait(), before);
}

#[test]
fn idle_keys_are_forgotten_and_a_cap_holds() {
    let clock = FakeClock::new();
    let limiter = per_second_and_minute(&clock);
    for key in 0..1_000 {
        limiter.reserve(&key, 1).unwrap();
    }
    assert_eq!(limiter.stats().keys, 1_000);
    // A minute and a half later every key reads as full again: a call
    // sweeps them all.
    clock.advance(Duration::from_secs(90));
    for key in 0..64 {
        limiter.reserve(&(10_000 + key), 1).unwrap();
    }
    assert!(limiter.stats().keys <= 128, "{}", limiter.stats().keys);

    let capped = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(1.0).burst(2))
        .limit(Limit::per(10.0, Duration::from_secs(3600)).burst(11))
        .max_keys(256)
        .clock(clock.clone())
        .build()
        .unwrap();
    for key in 0..10_000 {
        capped.reserve(&key, 2).unwrap();
        assert!(capped.stats().keys <= 256);
    }
    assert!(capped.stats().dropped_unfinished > 0);
}

#[test]
fn rates_change_for_every_key_together_or_one_limit() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per(3.0, Duration::from_secs(60)).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.slowest_rate(), 0.05);
    limiter.set_rate(20.0).unwrap();
    assert_eq!((limiter.rate(), limiter.slowest_rate()), (20.0, 0.1));
    // Per minute doubled too: 6 a minute, 10 s apart.
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::from_secs(10));
    limiter.set_limit_rate(1, 1.0).unwrap();
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::from_secs(20));
    assert_eq!(limiter.slowest_rate(), 1.0);
    assert!(matches!(
        limiter.set_limit_rate(2, 1.0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(limiter.set_rate(0.0).is_err());
}

/// Back up from a tiny rate the factor that scales the other limits
/// overflows: every key's limits take the rate asked for, not an infinite
/// one.
#[test]
fn set_rate_from_a_tiny_rate_back_up_still_limits_every_key() {
    let clock = FakeClock::new();
    let limiter = per_second_and_minute(&clock);
    limiter.set_rate(f64::from_bits(1)).unwrap(); // 5e-324
    limiter.set_rate(5.0).unwrap();
    clock.advance(Duration::from_secs(3600));
    for key in 0..3 {
        let granted = (0..100)
            .filter(|_| {
                limiter
                    .try_reserve(&key, 1, Duration::ZERO)
                    .unwrap()
                    .is_some()
            })
            .count();
        assert!((1..=4).contains(&granted), "key {key}: {granted} at once");
        let rate = limiter.snapshot(&key).unwrap().rate();
        assert!(rate.is_finite(), "key {key}: {rate}");
    }
}

/// Each key against its own `Limits`, started full: random keys, limits,
/// reservations, tries and idle gaps.
#[test]
fn every_key_agrees_with_the_core() {
    let mut rng = Rng::new(9);
    for _ in 0..50 {
        let clock = FakeClock::new();
        let count = 2 + rng.below(2) as usize;
        let mut builder = KeyedRateLimiter::<u64>::builder().clock(clock.clone());
        let mut template = Vec::new();
        for _ in 0..count {
            let per_second = 1.0 + rng.below(50) as f64;
            let burst = rng.below(5);
            builder = builder.limit(Limit::per_second(per_second).burst(burst + 1));
            // A burst of `burst + 1` stores `burst`: the idle time rounded
            // up to the µs, and one more if that still stores less.
            let mut micros = (burst as f64 * 1e6 / per_second).ceil();
            if micros * per_second / 1e6 < burst as f64 {
                micros += 1.0;
            }
            let micros = micros as u64;
            let policy = Policy::Bursty(Bursty::new(Duration::from_micros(micros)));
            template.push(State::new(policy, per_second, 0).unwrap());
        }
        let limiter = builder.build().unwrap();
        let mut cores: HashMap<u64, Limits> = HashMap::new();
        for _ in 0..300 {
            clock.advance(Duration::from_micros(rng.below(100_000)));
            let now = clock.now_micros();
            let key = rng.below(4);
            let core = cores.entry(key).or_insert_with(|| {
                let states = template
                    .iter()
                    .map(|t| State::full(t.policy().clone(), t.permits_per_second(), now).unwrap())
                    .collect();
                Limits::new(states).unwrap()
            });
            let permits = 1 + rng.below(3) as u32;
            let timeout = rng.below(400_000);
            let got = limiter
                .try_reserve(&key, permits, Duration::from_micros(timeout))
                .unwrap();
            let expected = core.try_reserve(permits, now, timeout, false);
            assert_eq!(got, expected.map(|g| Duration::from_micros(g.wait_micros)));
            // A key the limiter forgot read as full: so does its core.
            if core.reads_as_full(now) {
                cores.remove(&key);
            }
        }
    }
}

/// A burst of `n` is `n` requests of a new key at once, never `n + 1`.
#[test]
fn a_burst_of_n_lets_exactly_n_of_a_key_go_at_once() {
    for (limits, burst) in [
        (vec![Limit::per_second(5.0).burst(10)], 10),
        (vec![Limit::per_second(5.0)], 5),
        (
            vec![
                Limit::per_second(5.0).burst(10),
                Limit::per(1000.0, Duration::from_secs(3600)),
            ],
            10,
        ),
        (
            vec![
                Limit::per_second(50.0),
                Limit::per(20.0, Duration::from_secs(60)),
            ],
            20,
        ),
    ] {
        let mut builder = KeyedRateLimiter::<u64, _>::builder().clock(FakeClock::new());
        for limit in &limits {
            builder = builder.limit(limit.clone());
        }
        let limiter = builder.build().unwrap();
        assert_eq!(limiter.snapshot(&1).unwrap().burst(), burst, "{limits:?}");
        let mut at_once = 0;
        while limiter
            .try_reserve(&1, 1, Duration::ZERO)
            .unwrap()
            .is_some()
        {
            at_once += 1;
        }
        assert_eq!(at_once, burst, "{limits:?}");
    }
}
