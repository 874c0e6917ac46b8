//! The keyed limiter: each key behaves as its own core limiter that starts
//! full, entries that read as full are forgotten with no visible change, and
//! memory stays bounded (by the active keys, or by `max_keys`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::alloc::bytes_in_use;
use crate::support::rng::Rng;
use paceline::clock::Clock;
use paceline::clock::FakeClock;
use paceline::core::{Bursty, LOG_CAPACITY, Limits, Policy, State, WarmingUp};
use paceline::{Error, KeyedLimiter, KeyedRateLimiter};

const MS: Duration = Duration::from_millis(1);

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// A configuration for both sides of the differential test.
#[derive(Debug, Clone, Copy)]
enum Config {
    Bursty { burst: Duration },
    WarmingUp { warmup: Duration, cold_factor: f64 },
}

impl Config {
    fn random(rng: &mut Rng) -> Config {
        if rng.chance(0.5) {
            Config::Bursty {
                burst: Duration::from_millis(rng.below(3000)),
            }
        } else {
            Config::WarmingUp {
                warmup: Duration::from_millis(1 + rng.below(3000)),
                cold_factor: 1.0 + 4.0 * rng.f64(),
            }
        }
    }

    fn limiter(&self, rate: f64, clock: &FakeClock) -> KeyedRateLimiter<u32, FakeClock> {
        let builder = KeyedRateLimiter::<u32>::builder()
            .permits_per_second(rate)
            .clock(clock.clone());
        match *self {
            Config::Bursty { burst } => builder.max_burst(burst),
            Config::WarmingUp {
                warmup,
                cold_factor,
            } => builder.warmup(warmup).cold_factor(cold_factor),
        }
        .build()
        .expect("a valid configuration")
    }

    /// The core state of a key first seen at `now`: full.
    fn full_state(&self, rate: f64, now: u64) -> State {
        let policy = match *self {
            Config::Bursty { burst } => Policy::Bursty(Bursty::new(burst)),
            Config::WarmingUp {
                warmup,
                cold_factor,
            } => Policy::WarmingUp(WarmingUp::new(warmup, cold_factor)),
        };
        State::full(policy, rate, now).expect("a valid rate")
    }
}

/// One independent core limiter per key (the core's `Limits` of one
/// limit), created full at first use, whose log makes its give-backs exact:
/// what the keyed limiter must behave as.
struct Model {
    config: Config,
    rate: f64,
    keys: HashMap<u32, Limits>,
}

impl Model {
    /// The limits of `key`.
    fn key(&mut self, key: u32, now: u64) -> &mut Limits {
        let (config, rate) = (self.config, self.rate);
        self.keys
            .entry(key)
            .or_insert_with(|| Limits::new(vec![config.full_state(rate, now)]).unwrap())
    }

    /// What a request of `key` made at `now` would wait (none for a key
    /// never seen).
    fn debt(&self, key: u32, now: u64) -> u64 {
        self.keys
            .get(&key)
            .map_or(0, |limits| limits.earliest(now).0 - now)
    }

    /// Changes every key's rate, as the limiter does: a rate change empties
    /// the logs.
    fn set_rate(&mut self, rate: f64, now: u64) {
        for limits in self.keys.values_mut() {
            limits.set_rate(None, rate, now).unwrap();
        }
        self.rate = rate;
    }
}

/// Random reservations, tries, give-backs, rate changes and idle gaps (long
/// enough for entries to read as full and be swept) on 50 keys, against 50
/// independent core limiters that start full, each giving back through its
/// log: every wait and every refusal must be identical. (Reservations are
/// given back at any time, also once their moment has passed.)
#[test]
fn each_key_is_an_independent_limiter_that_starts_full() {
    let mut compared = 0u64;
    for seed in 0..40 {
        let mut rng = Rng::new(seed);
        let config = Config::random(&mut rng);
        let rate = *rng.pick(&[0.5, 2.0, 10.0, 100.0, 1000.0]);
        let clock = FakeClock::new();
        let limiter = config.limiter(rate, &clock);
        let mut model = Model {
            config,
            rate,
            keys: HashMap::new(),
        };
        // Reservations still held, to give back later.
        let mut held: Vec<(u32, Option<u64>, paceline::Reservation<'_>)> = Vec::new();
        for step in 0..3000 {
            let key = rng.below(50) as u32;
            match rng.below(100) {
                // Idle gaps: short, or long enough to refill every key.
                0..3 => clock.advance(Duration::from_secs(1 + rng.below(10))),
                3..30 => clock.advance(Duration::from_micros(rng.below(300_000))),
                30..32 => {
                    let new_rate = *rng.pick(&[0.5, 2.0, 10.0, 100.0, 1000.0]);
                    let now = clock.now_micros();
                    limiter.set_rate(new_rate).unwrap();
                    model.set_rate(new_rate, now);
                }
                32..40 if !held.is_empty() => {
                    let index = rng.below(held.len() as u64) as usize;
                    let (key, id, reservation) = held.swap_remove(index);
                    let now = clock.now_micros();
                    drop(reservation);
                    if let Some(id) = id {
                        model.key(key, now).give_back(id, now);
                    }
                }
                40..60 => {
                    let (permits, timeout) = (1 + rng.below(3) as u32, rng.below(2_000_000));
                    let now = clock.now_micros();
                    let got = limiter
                        .try_reserve(&key, permits, Duration::from_micros(timeout))
                        .unwrap();
                    let expected = model
                        .key(key, now)
                        .try_reserve(permits, now, timeout, false);
                    assert_eq!(
                        got.map(micros),
                        expected.map(|granted| granted.wait_micros),
                        "seed {seed} step {step}: tries differ for key {key}"
                    );
                    compared += 1;
                }
                _ => {
                    let permits = 1 + rng.below(4) as u32;
                    let now = clock.now_micros();
                    let reservation = limiter.reservation(&key, permits).unwrap();
                    let granted = model.key(key, now).reserve(permits, now, true);
                    assert_eq!(
                        micros(reservation.delay()),
                        granted.wait_micros,
                        "seed {seed} step {step}: waits differ for key {key}"
                    );
                    compared += 1;
                    // A reservation with no wait is used at once: nothing
                    // to give back (as for `RateLimiter`).
                    assert_eq!(reservation.is_cancellable(), !reservation.delay().is_zero());
                    if reservation.is_cancellable() && rng.chance(0.3) {
                        held.push((key, granted.id, reservation));
                    } else {
                        reservation.commit();
                        if let Some(id) = granted.id {
                            model.key(key, now).keep(id, now);
                        }
                    }
                }
            }
            // Queries agree too.
            let now = clock.now_micros();
            assert_eq!(
                micros(limiter.available_in(&key).unwrap()),
                model.debt(key, now),
                "seed {seed} step {step}"
            );
        }
        for (_, _, reservation) in held.drain(..) {
            reservation.commit();
        }
    }
    assert!(compared > 50_000, "{compared}");
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
    assert!(limiter.len() > 900_000, "{}", limiter.len());
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
    let held = limiter.len();
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
            most = most.max(limiter.len());
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
    assert_eq!(limiter.available_in("alice").unwrap(), 400 * MS);
    // One saturated key leaves another untouched.
    assert_eq!(limiter.available_in("bob").unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.try_reserve("bob", 1, Duration::ZERO).unwrap(),
        Some(Duration::ZERO)
    );
    assert_eq!(limiter.len(), 2);
    assert!(!limiter.is_empty());
}

#[test]
fn a_dropped_reservation_gives_the_key_its_permits_back() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reservation(&1, 1).unwrap().commit();
    let second = limiter.reservation(&1, 1).unwrap();
    assert_eq!(second.delay(), 100 * MS);
    assert!(second.is_cancellable());
    drop(second);
    // As if it had never been made.
    assert_eq!(limiter.available_in(&1).unwrap(), 100 * MS);
    assert_eq!(limiter.reservation(&1, 1).unwrap().delay(), 100 * MS);
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
    assert_eq!(limiter.available_in(&7).await.unwrap(), 100 * MS);
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
    assert_eq!(limiter.len(), 40_000);
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

/// The local limiter's scenario on one key: two reservations of an hour
/// each wait; the first is dropped, half an hour passes, eleven callers
/// queue behind the second, and the second is dropped too. A key that never
/// made the two would have been idle for that half hour (dropping all but
/// its one-second burst): the next caller goes where it would, not an
/// hour's charge earlier. Another key is not affected.
#[test]
fn a_waiter_dropped_after_another_never_lets_the_next_caller_of_its_key_in_early() {
    const S: Duration = Duration::from_secs(1);
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(1.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    // The key starts full (one stored permit): two permits leave it owing
    // a second, as one does a local limiter that starts empty.
    assert_eq!(limiter.reserve(&7, 2).unwrap(), Duration::ZERO);
    let a = limiter.reservation(&7, 3600).unwrap();
    let b = limiter.reservation(&7, 3600).unwrap();
    assert_eq!((a.delay(), b.delay()), (S, 3601 * S));
    clock.advance(S / 2);
    drop(a); // B keeps its slot
    clock.advance(1800 * S - S / 2);
    // Without A and B these would go at 1800 s (on the one stored permit)
    // and then one a second.
    let queued: Vec<_> = (0..11)
        .map(|_| limiter.reservation(&7, 1).unwrap())
        .collect();
    assert_eq!(queued[0].delay(), 1801 * S); // behind B
    // Another key, meanwhile, is full.
    assert_eq!(limiter.reserve(&8, 1).unwrap(), Duration::ZERO);
    clock.advance(S);
    drop(b);
    // After the eleven, as the key without A and B: 1810 s.
    assert_eq!(limiter.reservation(&7, 1).unwrap().delay(), 9 * S);
    for r in queued {
        r.commit();
    }
    assert_eq!(limiter.reserve(&8, 1).unwrap(), Duration::ZERO);
}

/// Each key of a keyed limiter gives back as the core's limits do, through
/// their log: random reservations on two or three keys, many waiting at
/// once, given back (by dropping their `Reservation`) in any order and at
/// any time, with plain reservations, tries and idle gaps (some long enough
/// for keys to be swept) in between, against one core `Limits` per key.
/// Every wait agrees to the few µs a key held as a word may round stored
/// permits by (to the bit for a warming-up key, which runs the limits
/// themselves), and every try agrees.
#[test]
fn each_key_gives_back_as_the_core_through_a_ledger() {
    let (mut compared, mut given_back, mut log_held_back) = (0u64, 0u64, 0u64);
    let mut worst = 0u64;
    for seed in 0..1_000 {
        let mut rng = Rng::new(0x6E7D_0000 + seed);
        let config = if rng.chance(0.7) {
            Config::Bursty {
                burst: Duration::from_micros(rng.range(0, 3_000_000)),
            }
        } else {
            Config::WarmingUp {
                warmup: Duration::from_micros(rng.range(1, 3_000_000)),
                cold_factor: 1.0 + 4.0 * rng.f64(),
            }
        };
        let allowed = match config {
            Config::Bursty { .. } => 3,
            Config::WarmingUp { .. } => 0,
        };
        let rate = *rng.pick(&[0.5, 5.0, 10.0, 1_000.0]);
        // A reservation takes up to this many seconds' worth of permits.
        let scale = *rng.pick(&[3.0, 60.0, 3600.0]);
        let keys = rng.range(2, 3);
        let clock = FakeClock::new();
        let limiter = config.limiter(rate, &clock);
        let mut model = Model {
            config,
            rate,
            keys: HashMap::new(),
        };
        // (key, its id in the key's log, its moment, what it charged in
        // whole µs, the reservation)
        let mut held: Vec<(u32, u64, u64, u64, paceline::Reservation<'_>)> = Vec::new();
        let close = |got: Duration, expected: u64, what: &str, step: usize| {
            let got = micros(got);
            assert!(
                got.abs_diff(expected) <= allowed,
                "seed {seed} step {step}: {what}: {got} µs, core {expected}"
            );
            got.abs_diff(expected)
        };
        for step in 0..150 {
            let key = rng.below(keys) as u32;
            let now = clock.now_micros();
            match rng.below(20) {
                0..8 => {
                    let permits = rng.range(1, (scale * rate).max(3.0) as u64) as u32;
                    let reservation = limiter.reservation(&key, permits).unwrap();
                    let limits = model.key(key, now);
                    let granted = limits.reserve(permits, now, true);
                    let charged = limits.states()[0].next_free_micros() - granted.moment_micros;
                    worst = worst.max(close(
                        reservation.delay(),
                        granted.wait_micros,
                        "reservation",
                        step,
                    ));
                    compared += 1;
                    match granted.id {
                        Some(id) if reservation.is_cancellable() && rng.chance(0.7) => {
                            held.push((key, id, granted.moment_micros, charged, reservation));
                        }
                        id => {
                            reservation.commit();
                            if let Some(id) = id {
                                model.key(key, now).keep(id, now);
                            }
                        }
                    }
                }
                8..10 => {
                    let permits = rng.range(1, (scale * rate / 10.0).max(3.0) as u64) as u32;
                    let got = limiter.reserve(&key, permits).unwrap();
                    let expected = model.key(key, now).reserve(permits, now, false);
                    worst = worst.max(close(got, expected.wait_micros, "reserve", step));
                    compared += 1;
                }
                10..12 => {
                    let permits = rng.range(1, 3) as u32;
                    let timeout = rng.below(3_000_000);
                    let got = limiter
                        .try_reserve(&key, permits, Duration::from_micros(timeout))
                        .unwrap();
                    let expected = model
                        .key(key, now)
                        .try_reserve(permits, now, timeout, false);
                    assert_eq!(
                        got.is_some(),
                        expected.is_some(),
                        "seed {seed} step {step}: tries differ"
                    );
                    if let (Some(got), Some(expected)) = (got, expected) {
                        worst = worst.max(close(got, expected.wait_micros, "try", step));
                    }
                    compared += 1;
                }
                12..16 if !held.is_empty() => {
                    // Often the oldest still held: an earlier waiter gives
                    // up while later ones keep their slots.
                    let index = if rng.chance(0.5) {
                        0
                    } else {
                        rng.below(held.len() as u64) as usize
                    };
                    let (key, id, moment, charged, reservation) = held.remove(index);
                    drop(reservation);
                    let limits = model.key(key, now);
                    let before = limits.states()[0].next_free_micros();
                    limits.give_back(id, now);
                    given_back += 1;
                    // Moving the ticket back by the charge alone (never
                    // past now) would have scheduled the next callers
                    // earlier than the replay does.
                    let alone = before.saturating_sub(charged).max(now);
                    if moment > now && alone < limits.states()[0].next_free_micros() {
                        log_held_back += 1;
                    }
                }
                _ => {
                    // Short, or long enough for a key to be swept, or most
                    // of what is left of a held reservation's wait (the
                    // key without the reservations given back so far may
                    // then sit idle beyond its burst, dropping idle time).
                    let gap = match rng.below(10) {
                        0 => rng.range(1_000_000, 5_000_000),
                        1..5 if !held.is_empty() => {
                            let (_, _, moment, _, _) = rng.pick(&held);
                            rng.below(moment.saturating_sub(now).max(1))
                        }
                        _ => rng.below(400_000),
                    };
                    clock.advance(Duration::from_micros(gap));
                }
            }
            let now = clock.now_micros();
            close(
                limiter.available_in(&key).unwrap(),
                model.debt(key, now),
                "available_in",
                step,
            );
        }
        // Everything still held is given back; then each key's next caller
        // goes where the core's would.
        while !held.is_empty() {
            let (key, id, _, _, reservation) =
                held.swap_remove(rng.below(held.len() as u64) as usize);
            drop(reservation);
            let now = clock.now_micros();
            model.key(key, now).give_back(id, now);
        }
        for key in 0..keys as u32 {
            let now = clock.now_micros();
            let got = limiter.reserve(&key, 1).unwrap();
            let expected = model.key(key, now).reserve(1, now, false);
            close(
                got,
                expected.wait_micros,
                "after the give-backs",
                usize::MAX,
            );
        }
    }
    eprintln!(
        "{compared} compared (at most {worst} µs apart), {given_back} given back, \
         {log_held_back} held back by the log"
    );
    assert!(compared > 80_000, "{compared}");
    assert!(log_held_back > 200, "{log_held_back}");
}

/// What makes give-backs exact lives only while it is needed: a key whose
/// reservations wait is held as limits with a log, more than its word,
/// until their waits are over; the next call on it then gives that memory
/// back (the key itself is still held, as a word again).
#[test]
fn a_keys_ledger_does_not_outlive_its_waits() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    // Keys held, each owing a second (ten stored permits spent, ten owed).
    for key in 0..100 {
        assert_eq!(limiter.reserve(&key, 20).unwrap(), Duration::ZERO);
    }
    let before = bytes_in_use();
    // Key 0: four waiters, the second given back, the others still held
    // (each may still be given back).
    let mut waiting: Vec<_> = (0..4)
        .map(|_| limiter.reservation(&0, 5).unwrap())
        .collect();
    assert_eq!(
        waiting.iter().map(|r| r.delay()).collect::<Vec<_>>(),
        [1000 * MS, 1500 * MS, 2000 * MS, 2500 * MS]
    );
    drop(waiting.remove(1));
    assert!(bytes_in_use() > before, "nothing noted for the waits");
    // The ticket moved back by the waiter given back (3 s to 2.5 s). Two
    // seconds on, the last waiter still waits: the key still needs it.
    clock.advance(2000 * MS);
    assert_eq!(limiter.reserve(&0, 1).unwrap(), 500 * MS);
    assert!(bytes_in_use() > before);
    // Every wait is over: dropping the waiters gives nothing back, and the
    // next call leaves the key as it was before.
    clock.advance(600 * MS);
    drop(waiting);
    assert_eq!(limiter.reserve(&0, 1).unwrap(), Duration::ZERO);
    assert_eq!(bytes_in_use(), before);

    // Every key owes a second again (some were full, and may have been
    // swept and made again), then has two waiters, the first given back.
    for key in 0..100 {
        limiter.reserve(&key, 20).unwrap();
    }
    assert_eq!(limiter.len(), 100);
    let before = bytes_in_use();
    let held: Vec<_> = (0..100u32)
        .map(|key| {
            let first = limiter.reservation(&key, 3).unwrap();
            let second = limiter.reservation(&key, 3).unwrap();
            assert!(first.is_cancellable() && second.is_cancellable());
            (first, second)
        })
        .collect();
    let held: Vec<_> = held
        .into_iter()
        .map(|(first, second)| {
            drop(first);
            second
        })
        .collect();
    assert!(bytes_in_use() > before);
    clock.advance(Duration::from_secs(3));
    drop(held); // past their moments: nothing given back
    for key in 0..100 {
        limiter.reserve(&key, 1).unwrap();
    }
    assert_eq!(limiter.len(), 100);
    assert_eq!(bytes_in_use(), before);

    // A waiter whose permits are kept without waiting (committed) will
    // never be given back: its key forgets it at once.
    limiter.reserve(&0, 30).unwrap();
    let before = bytes_in_use();
    let kept = limiter.reservation(&0, 5).unwrap();
    assert!(kept.is_cancellable());
    assert!(bytes_in_use() > before);
    kept.commit();
    assert_eq!(bytes_in_use(), before);
}

/// Threads racing on the same keys with reservations that wait, half of
/// them given back, on a frozen clock: whatever the interleaving, each key
/// ends owing exactly what was kept (at one interval a permit, with no
/// burst), as a key that never made the ones given back, while its log held
/// every request since the oldest that could be (fewer than `LOG_CAPACITY`
/// requests in all); past that, at least what was kept.
#[test]
fn threads_giving_back_on_the_same_keys_leave_each_key_owing_what_was_kept() {
    // Four threads of 250 calls make at most 1 000 requests.
    const { assert!(1_000 < LOG_CAPACITY) };
    for (owed, kept) in give_back_on_keys_from_threads(250) {
        assert_eq!(owed, Duration::from_millis(kept), "{kept} permits kept");
    }
    for (owed, kept) in give_back_on_keys_from_threads(2_000) {
        assert!(owed >= Duration::from_millis(kept), "{owed:?}: {kept} kept");
    }
}

/// Four threads of `calls` calls each on three keys (see above): what each
/// key owes at the end, and the permits kept of it.
fn give_back_on_keys_from_threads(calls: usize) -> Vec<(Duration, u64)> {
    const THREADS: u64 = 4;
    const KEYS: u64 = 3;
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder()
            .permits_per_second(1_000.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let kept: Vec<Vec<u64>> = (0..THREADS)
        .map(|thread| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x7EAD_0000 + thread);
                let mut kept = vec![0u64; KEYS as usize];
                let mut held = Vec::new();
                for _ in 0..calls {
                    let key = rng.below(KEYS);
                    match rng.below(10) {
                        0 => {
                            // Refused once the key owes: changes nothing.
                            let got = limiter.try_reserve(&key, 1, Duration::ZERO).unwrap();
                            kept[key as usize] += got.map_or(0, |_| 1);
                        }
                        1..4 if !held.is_empty() => {
                            let index = rng.below(held.len() as u64) as usize;
                            let (_, reservation): (u64, paceline::Reservation<'_>) =
                                held.swap_remove(index);
                            drop(reservation);
                        }
                        _ => {
                            let permits = rng.range(1, 3);
                            let reservation = limiter.reservation(&key, permits as u32).unwrap();
                            // One that goes at once has nothing to give back.
                            if reservation.is_cancellable() && rng.chance(0.5) {
                                held.push((key, reservation));
                            } else {
                                reservation.commit();
                                kept[key as usize] += permits;
                            }
                        }
                    }
                }
                for (_, reservation) in held {
                    drop(reservation);
                }
                kept
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect();
    // The first permit of a key goes at once, and pays for the next.
    (0..KEYS)
        .map(|key| {
            let kept: u64 = kept.iter().map(|per_thread| per_thread[key as usize]).sum();
            (limiter.available_in(&key).unwrap(), kept)
        })
        .collect()
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
    assert_eq!(limiter.len(), 0);
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
        assert_eq!(owed.wait(), limiter.available_in(&key).unwrap());
        clock.advance(Duration::from_micros(rng.below(400_000)));
    }
    // Several limits: the binding one.
    let several = KeyedRateLimiter::<String>::builder()
        .limit(paceline::Limit::per_second(10.0).burst(5))
        .limit(paceline::Limit::per_minute(3.0).burst(4))
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
