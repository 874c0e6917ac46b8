//! The keyed limiter: each key behaves as its own core limiter that starts
//! full, entries that read as full are forgotten with no visible change, and
//! memory stays bounded (by the active keys, or by `max_keys`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Config, Model};
use crate::support::rng::Rng;
use crate::support::window::{max_in_window, most_in_window};
use paceline::clock::Clock;
use paceline::clock::FakeClock;
use paceline::{Error, KeyedLimiter, KeyedRateLimiter};

const MS: Duration = Duration::from_millis(1);

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Bursty keys over hours of fake time, with debts longer than the keyed
/// limiter's one-word state can hold (about two hours) and awkward rates:
/// the shard re-encodes its keys as time moves on (every couple of hours),
/// and a key far in debt is held as the core's numbers until its debt
/// shrinks. Rates change on the way, to and from rates whose keys cannot be
/// words at all (an interval past the core's cap) or whose bursts hold
/// billions of permits, so that every key moves between the two maps.
/// Waits agree with independent core limiters to the microsecond:
/// a key whose stored permits were spent may differ by that rounding (as
/// the `RateLimiter` may), rarely, and a try may then be decided by it.
#[test]
fn bursty_keys_agree_with_the_core_over_hours_and_far_debts() {
    const RATES: [f64; 8] = [0.3, 3.0, 7.0, 33.3, 1_000.0, 123_456.7, 1e-10, 1e9];
    let (mut compared, mut differing, mut far_debts) = (0u64, 0u64, 0u64);
    for seed in 0..30 {
        let mut rng = Rng::new(0x0b0e_0000 + seed);
        let rate = *rng.pick(&RATES[..6]);
        let config = Config::Bursty {
            burst: Duration::from_micros(rng.below(4_000_000)),
        };
        let clock = FakeClock::new();
        clock.advance(Duration::from_micros(rng.below(1 << 36)));
        let limiter = config.limiter(rate, &clock);
        let mut model = Model {
            config,
            rate,
            keys: HashMap::new(),
        };
        for step in 0..2_000 {
            let key = rng.below(20) as u32;
            match rng.below(100) {
                0..2 => clock.advance(Duration::from_secs(rng.range(3_600, 6 * 3_600))),
                2..30 => clock.advance(Duration::from_micros(rng.below(2_000_000))),
                30..32 => {
                    let rate = *rng.pick(&RATES);
                    let now = clock.now_micros();
                    limiter.set_rate(rate).unwrap();
                    model.set_rate(rate, now);
                }
                32..35 => {
                    // A debt of hours: 3 to 10 hours' worth of permits.
                    let hours = rng.range(3 * 3_600, 10 * 3_600) as f64;
                    let permits = (model.rate * hours) as u32;
                    let now = clock.now_micros();
                    let expected = model.key(key, now).reserve(permits.max(1), now, false);
                    let expected = expected.wait_micros;
                    let got = micros(limiter.reserve(&key, permits.max(1)).unwrap());
                    assert!(
                        got.abs_diff(expected) <= 1,
                        "seed {seed} step {step}: {expected} vs {got}"
                    );
                    differing += u64::from(got != expected);
                    compared += 1;
                    far_debts += 1;
                }
                35..60 => {
                    let (permits, timeout) = (1 + rng.below(3) as u32, rng.below(2_000_000));
                    let now = clock.now_micros();
                    let debt = model.key(key, now).earliest(now).0 - now;
                    let before = model.key(key, now).clone();
                    let expected = model
                        .key(key, now)
                        .try_reserve(permits, now, timeout, false)
                        .map(|granted| granted.wait_micros);
                    let got = limiter
                        .try_reserve(&key, permits, Duration::from_micros(timeout))
                        .unwrap()
                        .map(micros);
                    compared += 1;
                    match (expected, got) {
                        (Some(e), Some(g)) if e == g => {}
                        (Some(e), Some(g)) => {
                            assert!(e.abs_diff(g) <= 1, "seed {seed} step {step}: {e} vs {g}");
                            differing += 1;
                        }
                        (None, None) => {}
                        _ => {
                            // Only a timeout a rounding away from the debt
                            // may split them; go on with the limiter's choice.
                            assert!(
                                timeout.abs_diff(debt) <= 1,
                                "seed {seed} step {step}: tries differ"
                            );
                            differing += 1;
                            *model.key(key, now) = before;
                            if got.is_some() {
                                model.key(key, now).reserve(permits, now, false);
                            }
                        }
                    }
                }
                _ => {
                    let permits = 1 + rng.below(4) as u32;
                    let now = clock.now_micros();
                    let expected = model.key(key, now).reserve(permits, now, false).wait_micros;
                    let got = micros(limiter.reserve(&key, permits).unwrap());
                    compared += 1;
                    if got != expected {
                        assert!(
                            got.abs_diff(expected) <= 1,
                            "seed {seed} step {step}: {expected} vs {got}"
                        );
                        differing += 1;
                    }
                }
            }
        }
    }
    eprintln!("{compared} compared, {differing} a microsecond apart, {far_debts} far debts");
    assert!(far_debts > 1_000, "{far_debts}");
    assert!(
        differing * 1_000 < compared,
        "{differing} of {compared} differ"
    );
}

/// A million distinct keys touched once, then a refill period of idleness:
/// as soon as calls resume, the entries of the idle keys are dropped and
/// `len()` falls back to the keys in use.
#[test]
fn memory_follows_the_active_keys() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    for key in 0..1_000_000u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    assert!(limiter.stats().keys > 900_000, "{}", limiter.stats().keys);
    // One permit of a full burst (10) was spent: refilled after 100 ms; a
    // refill period from empty is 1 s.
    clock.advance(Duration::from_secs(1) + MS);
    // Normal calls on 20 keys; each shard is swept at its first call.
    for round in 0..200u64 {
        for key in 0..20u64 {
            limiter
                .try_reserve(&(key * 7919 + round % 3), 1, Duration::ZERO)
                .unwrap();
        }
        clock.advance(MS);
    }
    let held = limiter.stats().keys;
    assert!(held <= 60, "{held} entries held for 60 active keys");
    assert_eq!(limiter.stats().dropped_unfinished, 0);
}

/// Under a flood of distinct keys, `max_keys` is never exceeded, and keys
/// dropped before they were full are counted.
#[test]
fn max_keys_bounds_a_flood_of_new_keys() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(1000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut most = 0;
    for key in 0..200_000u64 {
        limiter.reserve(&key, 1).unwrap();
        if key % 97 == 0 {
            most = most.max(limiter.stats().keys);
            assert!(most <= 1000, "{most} keys held after {key}");
        }
    }
    assert!(most > 500, "the cap is used: {most}");
    let stats = limiter.stats();
    assert!(stats.keys <= 1000);
    // Every key owes a second (no burst at 1/s), so every drop lost a debt.
    assert!(
        stats.dropped_unfinished >= 199_000,
        "{}",
        stats.dropped_unfinished
    );
    // A key that is still held keeps its debt; with the clock still, a
    // recent one is held.
    assert_eq!(
        limiter.try_reserve(&199_999, 1, Duration::ZERO).unwrap(),
        None
    );
}

/// A capped limiter drops keys that read as full before any that owe.
#[test]
fn at_the_cap_full_keys_go_first() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(64)
        .clock(clock.clone())
        .build()
        .unwrap();
    // Fill the cap with keys that owe 1 s (the shards, each with its share
    // of the cap, may already drop some), then let them be paid off (full:
    // no burst), and owe again on a few.
    for key in 0..64u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    let dropped = limiter.stats().dropped_unfinished;
    clock.advance(Duration::from_secs(2));
    for key in 0..4u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    // New keys take the place of full ones: nobody's debt is lost (12 keys
    // owe, and every shard holds at least 16).
    for key in 1000..1008u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    assert_eq!(limiter.stats().dropped_unfinished, dropped);
    for key in 0..4u64 {
        assert_eq!(
            limiter.try_reserve(&key, 1, Duration::ZERO).unwrap(),
            None,
            "key {key} lost its debt"
        );
    }
}

/// A key dropped in debt at the cap is counted, comes back fresh (its debt
/// lost, as `max_keys` says), and a reservation it made before, given back
/// afterwards, gives nothing to its new entry.
#[test]
fn a_key_dropped_at_the_cap_is_counted_and_its_old_reservation_gives_back_nothing() {
    let limiter = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .max_keys(16)
        .clock(FakeClock::new())
        .build()
        .unwrap();
    // Key 0 spends its burst of 10, then holds a reservation that waits.
    for _ in 0..11 {
        limiter.reserve(&0, 1).unwrap();
    }
    let waiting = limiter.reservation(&0, 5).unwrap();
    assert!(waiting.delay() > Duration::ZERO);
    // Fifteen more keys deeper in debt, each used after key 0; one more
    // key and the cap drops the one nearest to full: key 0.
    for key in 1..16u64 {
        limiter.reserve(&key, 100).unwrap();
    }
    assert_eq!(limiter.stats().dropped_unfinished, 0);
    limiter.reserve(&99, 100).unwrap();
    let stats = limiter.stats();
    assert!(stats.keys <= 16, "{stats:?}");
    assert!(stats.dropped_unfinished >= 1, "{stats:?}");
    // Key 0 is new again: a full burst.
    for _ in 0..10 {
        assert_eq!(
            limiter.try_reserve(&0, 1, Duration::ZERO).unwrap(),
            Some(Duration::ZERO)
        );
    }
    let owed = limiter.snapshot(&0).unwrap().wait();
    drop(waiting);
    assert_eq!(limiter.snapshot(&0).unwrap().wait(), owed);
}

#[test]
fn string_keys_are_looked_up_by_str_and_independent() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(5.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve("alice", 1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve("alice", 1).unwrap(), 200 * MS);
    assert_eq!(limiter.snapshot("alice").unwrap().wait(), 400 * MS);
    // One saturated key leaves another untouched.
    assert_eq!(limiter.snapshot("bob").unwrap().wait(), Duration::ZERO);
    assert_eq!(
        limiter.try_reserve("bob", 1, Duration::ZERO).unwrap(),
        Some(Duration::ZERO)
    );
    assert_eq!(limiter.stats().keys, 2);
    assert!(limiter.stats().keys > 0);
}

#[test]
fn bad_input_is_an_error() {
    let limiter = KeyedRateLimiter::<u32>::bursty(10.0).unwrap();
    assert!(matches!(
        limiter.reserve(&1, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        limiter.try_reserve(&1, 0, Duration::MAX),
        Err(Error::InvalidArgument(_))
    ));
    for rate in [0.0, -1.0, f64::NAN] {
        assert!(KeyedRateLimiter::<u32>::bursty(rate).is_err());
        assert!(limiter.set_rate(rate).is_err());
    }
    assert_eq!(limiter.rate(), 10.0);
    let zero_cap = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(1.0)
        .max_keys(0)
        .build();
    assert!(matches!(zero_cap, Err(Error::InvalidArgument(m)) if m.contains("max_keys")));
    // Extreme but valid values saturate.
    assert_eq!(
        limiter.try_reserve(&1, u32::MAX, Duration::MAX).unwrap(),
        Some(Duration::ZERO)
    );
    assert!(
        limiter
            .try_reserve(&1, 1, Duration::ZERO)
            .unwrap()
            .is_none()
    );
}

#[test]
fn set_rate_changes_every_key() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(&1, 1).unwrap();
    limiter.set_rate(2.0).unwrap();
    assert_eq!(limiter.rate(), 2.0);
    // Key 1 repays its last request at the old rate, then pays the new one.
    assert_eq!(limiter.reserve(&1, 1).unwrap(), 100 * MS);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), 600 * MS);
    // A new key runs at the new rate.
    assert_eq!(limiter.reserve(&2, 1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(&2, 1).unwrap(), 500 * MS);
}

#[tokio::test(flavor = "current_thread")]
async fn the_keyed_trait_is_object_safe() {
    let clock = FakeClock::new();
    let limiter: Arc<dyn KeyedLimiter<u32>> = Arc::new(
        KeyedRateLimiter::<u32>::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(limiter.acquire(&7, 1).await.unwrap(), Duration::ZERO);
    assert_eq!(limiter.acquire(&7, 1).await.unwrap(), 100 * MS);
    assert!(!limiter.try_acquire(&7, 1, Duration::ZERO).await.unwrap());
    assert_eq!(limiter.snapshot(&7).await.unwrap().wait(), 100 * MS);
    assert_eq!(limiter.rate(), 10.0);
}

#[test]
fn threads_on_distinct_keys_do_not_interfere() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder()
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                // Each key once: granted at once; a second time: one second.
                for key in (t * 10_000)..(t * 10_000 + 10_000) {
                    assert_eq!(limiter.reserve(&key, 1).unwrap(), Duration::ZERO);
                }
                for key in (t * 10_000)..(t * 10_000 + 10_000) {
                    assert_eq!(limiter.reserve(&key, 1).unwrap(), Duration::from_secs(1));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(limiter.stats().keys, 40_000);
}

/// Threads racing on the same keys, on a frozen clock: whatever the
/// interleaving (the common call updates a key's word with a
/// compare-and-swap under a shared lock), each key grants its stored burst
/// plus the one request that runs into debt, no more; and plain
/// reservations get distinct consecutive slots.
#[test]
fn threads_racing_on_the_same_keys_never_over_grant() {
    const THREADS: u64 = 4;
    const KEYS: u64 = 8;
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::from_secs(1)) // 10 stored permits per key
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let granted: Vec<Vec<u64>> = (0..THREADS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                let mut granted = vec![0u64; KEYS as usize];
                for round in 0..2_000 {
                    let key = round % KEYS;
                    let got = limiter.try_reserve(&key, 1, Duration::ZERO).unwrap();
                    granted[key as usize] += u64::from(got.is_some());
                }
                granted
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect();
    for key in 0..KEYS as usize {
        let total: u64 = granted.iter().map(|per_thread| per_thread[key]).sum();
        assert_eq!(total, 11, "key {key}: 10 stored and one into debt");
    }

    // Plain reservations on one fresh key: 10 free, then one slot each.
    let waits: Vec<Vec<Duration>> = (0..THREADS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                (0..50)
                    .map(|_| limiter.reserve(&1_000u64, 1).unwrap())
                    .collect()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect();
    let mut waits: Vec<Duration> = waits.into_iter().flatten().collect();
    waits.sort();
    let expected: Vec<Duration> = (0..THREADS * 50)
        .map(|call| Duration::from_millis(100 * call.saturating_sub(10)))
        .collect();
    assert_eq!(waits, expected);
}

/// Two hot keys in use while a flood of cold keys fills a small cap
/// (`max_keys` 64: four shards of 16) and the clock moves under the
/// threads, a few µs a call and now and then by a jump, so that sweeps by
/// time, by growth and to the cap run between the calls on the hot keys
/// (on the shared lock's path and under the write lock). A key in use is
/// not dropped in debt, so each hot key keeps its rate: at 100 000/s with a
/// 1 ms burst, no window of `T` µs holds more of its grants, at their
/// granted moments, than `100 000/s · (T + 1 ms) + 1`.
#[test]
fn hot_keys_keep_their_rate_while_a_flood_of_cold_keys_fills_the_cap() {
    const RATE: f64 = 100_000.0;
    const BURST: u64 = 1_000;
    const ROUNDS: u64 = 4;
    const CALLS: usize = 40_000;
    // A call's clock reading lies between the readings just before and just
    // after it: a grant whose two differ by more is left out (which can only
    // lower a count), and a window checked is that much shorter.
    const SLACK: u64 = 4;
    let hot = ["hot0".to_string(), "hot1".to_string()];
    for round in 0..ROUNDS {
        let clock = FakeClock::new();
        clock.advance(Duration::from_secs(5));
        let limiter = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .permits_per_second(RATE)
                .max_burst(Duration::from_micros(BURST))
                .max_keys(64)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let workers: Vec<_> = (0..4u64)
            .map(|thread| {
                let (limiter, clock, hot) = (Arc::clone(&limiter), clock.clone(), hot.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(0x407_0000 + round * 31 + thread);
                    let mut moments: [Vec<u64>; 2] = Default::default();
                    let mut held = Vec::new();
                    let cold: Vec<String> = (0..64).map(|i| format!("cold{i}")).collect();
                    for _ in 0..CALLS {
                        if rng.chance(0.5) {
                            clock.advance(Duration::from_micros(rng.below(4)));
                        }
                        if rng.chance(1.0 / 3_000.0) {
                            clock.advance(Duration::from_millis(rng.range(100, 600)));
                        }
                        let h = rng.below(2) as usize;
                        match rng.below(10) {
                            0..5 => {
                                let before = clock.now_micros();
                                let timeout = Duration::from_micros(rng.below(300));
                                if let Some(wait) =
                                    limiter.try_reserve(&hot[h], 1, timeout).unwrap()
                                    && clock.now_micros() - before <= SLACK
                                {
                                    moments[h].push(before + micros(wait));
                                }
                            }
                            5 => {
                                // Only when little is owed, so that the
                                // clock catches up.
                                let owed = limiter.snapshot(&hot[h]).unwrap().wait();
                                if owed < Duration::from_micros(200) {
                                    let before = clock.now_micros();
                                    let reservation = limiter.reservation(&hot[h], 1).unwrap();
                                    let delay = micros(reservation.delay());
                                    reservation.keep();
                                    if clock.now_micros() - before <= SLACK {
                                        moments[h].push(before + delay);
                                    }
                                }
                            }
                            6 => {
                                let key = format!("cold{}", rng.below(100_000));
                                limiter.try_reserve(&key, 1, Duration::ZERO).unwrap();
                            }
                            7 => {
                                let key = rng.pick(&cold);
                                limiter.reserve(key, rng.range(1, 30) as u32).unwrap();
                            }
                            8 => {
                                let reservation = limiter.reservation(rng.pick(&cold), 1).unwrap();
                                if reservation.can_give_back() {
                                    held.push(reservation);
                                } else {
                                    reservation.keep();
                                }
                            }
                            _ if !held.is_empty() => {
                                drop(held.swap_remove(rng.below(held.len() as u64) as usize));
                            }
                            _ => {}
                        }
                    }
                    drop(held);
                    moments
                })
            })
            .collect();
        let mut moments: [Vec<u64>; 2] = Default::default();
        for worker in workers {
            for (all, some) in moments.iter_mut().zip(worker.join().unwrap()) {
                all.extend(some);
            }
        }
        let stats = limiter.stats();
        assert!(stats.keys <= 64, "{stats:?}");
        for (h, moments) in moments.iter_mut().enumerate() {
            moments.sort_unstable();
            for span in [100, 1_000, 5_000, 20_000] {
                let (count, at) = max_in_window(moments, span - SLACK);
                let most = most_in_window(RATE, span, BURST);
                assert!(
                    count <= most,
                    "round {round}: hot{h}: {count} permits granted in the {span} µs from \
                     {at} µs, at most {most} allowed ({} grants; {stats:?})",
                    moments.len()
                );
            }
        }
    }
}

/// A key's snapshot says how many requests go at once, and when: drained
/// after each, exactly that many go (one more where a stored count sits a
/// rounding below a whole one), then the next waits what it said.
#[test]
fn snapshots_say_what_goes_at_once() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_millis(800))
        .clock(clock.clone())
        .build()
        .unwrap();
    // A key not held reads as full, and holds nothing after the read.
    let fresh = limiter.snapshot("new").unwrap();
    assert_eq!(
        (fresh.remaining(), fresh.burst(), fresh.wait()),
        (9, 9, Duration::ZERO)
    );
    assert_eq!(limiter.stats().keys, 0);
    let mut rng = Rng::new(7);
    for step in 0..200 {
        let key = format!("k{}", rng.below(3));
        let snapshot = limiter.snapshot(&key).unwrap();
        let mut granted = 0;
        while limiter
            .try_reserve(&key, 1, Duration::ZERO)
            .unwrap()
            .is_some()
        {
            granted += 1;
        }
        assert!(
            granted == snapshot.remaining() || granted == snapshot.remaining() + 1,
            "step {step}: {granted} went, {snapshot:?}"
        );
        let owed = limiter.snapshot(&key).unwrap();
        assert_eq!(owed.remaining(), 0);
        assert_eq!(Some(owed.wait()), owed.wait_for(1));
        assert_eq!(owed.wait(), limiter.snapshot(&key).unwrap().wait());
        clock.advance(Duration::from_micros(rng.below(400_000)));
    }
    // Several limits: the binding one.
    let several = KeyedRateLimiter::<String>::builder()
        .limit(paceline::Limit::per_second(10.0).burst(5))
        .limit(paceline::Limit::per(3.0, Duration::from_secs(60)).burst(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    let fresh = several.snapshot("a").unwrap();
    assert_eq!((fresh.remaining(), fresh.limit()), (4, 1));
    for _ in 0..4 {
        assert!(
            several
                .try_reserve("a", 1, Duration::ZERO)
                .unwrap()
                .is_some()
        );
    }
    let owed = several.snapshot("a").unwrap();
    assert_eq!((owed.remaining(), owed.limit()), (0, 1));
    assert_eq!(owed.wait(), Duration::from_secs(20));
}

/// Rate changes made at once from two threads leave every key at one rate,
/// the one `rate()` says: each change reaches every shard before the next
/// begins. (Each visited the shards in turn on its own, so one could pass
/// the other: some keys were left at one rate, the others at the other.)
#[test]
fn rate_changes_from_two_threads_leave_every_key_at_one_rate() {
    let limiter = Arc::new(
        KeyedRateLimiter::<u32>::builder()
            .permits_per_second(10.0)
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    );
    let barrier = Arc::new(std::sync::Barrier::new(3));
    let threads: Vec<_> = [10.0, 20.0]
        .into_iter()
        .map(|rate| {
            let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
            std::thread::spawn(move || {
                for round in 0..500u32 {
                    barrier.wait();
                    // A new rate each round, so that both change something.
                    limiter.set_rate(rate + f64::from(round)).unwrap();
                    barrier.wait();
                }
            })
        })
        .collect();
    for round in 0..500 {
        barrier.wait();
        barrier.wait();
        let rate = limiter.rate();
        for key in 0..256 {
            let snapshot = limiter.snapshot(&key).unwrap();
            assert_eq!(snapshot.rate(), rate, "round {round}, key {key}");
        }
    }
    for thread in threads {
        thread.join().unwrap();
    }
}
