//! Giving reservations back to a keyed limiter's keys: each key gives back
//! as its own core `Limits` does, through its log, whatever the order,
//! the threads and the sweeps, and the log lives only while it is needed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Config, Model};
use crate::support::alloc::bytes_in_use;
use crate::support::rng::Rng;
use paceline::KeyedRateLimiter;
use paceline::clock::{Clock, FakeClock};
use paceline::core::LOG_CAPACITY;

const MS: Duration = Duration::from_millis(1);

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
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
                    assert_eq!(reservation.can_give_back(), !reservation.delay().is_zero());
                    if reservation.can_give_back() && rng.chance(0.3) {
                        held.push((key, granted.id, reservation));
                    } else {
                        reservation.keep();
                        if let Some(id) = granted.id {
                            model.key(key, now).keep(id, now);
                        }
                    }
                }
            }
            // Queries agree too.
            let now = clock.now_micros();
            assert_eq!(
                micros(limiter.snapshot(&key).unwrap().wait()),
                model.debt(key, now),
                "seed {seed} step {step}"
            );
        }
        for (_, _, reservation) in held.drain(..) {
            reservation.keep();
        }
    }
    assert!(compared > 50_000, "{compared}");
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
    limiter.reservation(&1, 1).unwrap().keep();
    let second = limiter.reservation(&1, 1).unwrap();
    assert_eq!(second.delay(), 100 * MS);
    assert!(second.can_give_back());
    drop(second);
    // As if it had never been made.
    assert_eq!(limiter.snapshot(&1).unwrap().wait(), 100 * MS);
    assert_eq!(limiter.reservation(&1, 1).unwrap().delay(), 100 * MS);
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
        r.keep();
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
fn each_key_gives_back_as_the_core_through_its_log() {
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
                        Some(id) if reservation.can_give_back() && rng.chance(0.7) => {
                            held.push((key, id, granted.moment_micros, charged, reservation));
                        }
                        id => {
                            reservation.keep();
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
                limiter.snapshot(&key).unwrap().wait(),
                model.debt(key, now),
                "snapshot wait",
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
fn a_keys_log_does_not_outlive_its_waits() {
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
    assert_eq!(limiter.stats().keys, 100);
    let before = bytes_in_use();
    let held: Vec<_> = (0..100u32)
        .map(|key| {
            let first = limiter.reservation(&key, 3).unwrap();
            let second = limiter.reservation(&key, 3).unwrap();
            assert!(first.can_give_back() && second.can_give_back());
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
    assert_eq!(limiter.stats().keys, 100);
    assert_eq!(bytes_in_use(), before);

    // A waiter whose permits are kept without waiting (committed) will
    // never be given back: its key forgets it at once.
    limiter.reserve(&0, 30).unwrap();
    let before = bytes_in_use();
    let kept = limiter.reservation(&0, 5).unwrap();
    assert!(kept.can_give_back());
    assert!(bytes_in_use() > before);
    kept.keep();
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
    for (owed, kept) in give_back_on_keys_from_threads(250, 0x7EAD_0000, false).0 {
        assert_eq!(owed, Duration::from_millis(kept), "{kept} permits kept");
    }
    for (owed, kept) in give_back_on_keys_from_threads(2_000, 0x7EAD_0000, false).0 {
        assert!(owed >= Duration::from_millis(kept), "{owed:?}: {kept} kept");
    }
}

/// The race above while a flood of new keys fills a small cap (`max_keys`
/// 64: four shards of 16), so that each new key in a full shard drops the
/// one of its shard nearest to full, in debt: the keys in use are those
/// whose tickets lie furthest ahead, never dropped, and each ends owing
/// exactly what was kept of it.
#[test]
fn giving_back_on_keys_in_use_stays_exact_while_new_keys_fill_the_cap() {
    const { assert!(1_000 < LOG_CAPACITY) };
    for round in 1..=6 {
        let (keys, dropped) = give_back_on_keys_from_threads(250, 0x7EAD_0000 + 16 * round, true);
        for (key, (owed, kept)) in keys.into_iter().enumerate() {
            assert_eq!(
                owed,
                Duration::from_millis(kept),
                "round {round}: key {key}: {kept} permits kept ({dropped} keys dropped in debt)"
            );
        }
        assert!(dropped > 0, "round {round}: the cap dropped nothing");
    }
}

/// Four threads of `calls` calls each on three keys (see above), thread `i`
/// drawing from `seed + i`: what each key owes at the end, the permits kept
/// of it, and the keys dropped in debt. With `flood`, under a cap of 64
/// keys, a quarter of the calls reserve 2 permits on each of 4 keys drawn
/// from a million others, and each of the three keys first reserves 10
/// (kept), so that its ticket lies ahead of every other key's (a new one's
/// at 2 ms, at the same moment on a frozen clock): they are dropped
/// instead.
fn give_back_on_keys_from_threads(
    calls: usize,
    seed: u64,
    flood: bool,
) -> (Vec<(Duration, u64)>, u64) {
    const THREADS: u64 = 4;
    const KEYS: u64 = 3;
    const AHEAD: u64 = 10;
    let clock = FakeClock::new();
    let mut builder = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(1_000.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone());
    if flood {
        builder = builder.max_keys(64);
    }
    let limiter = Arc::new(builder.build().unwrap());
    if flood {
        for key in 0..KEYS {
            limiter.reserve(&key, AHEAD as u32).unwrap();
        }
    }
    let kept: Vec<Vec<u64>> = (0..THREADS)
        .map(|thread| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed + thread);
                let mut kept = vec![0u64; KEYS as usize];
                let mut held = Vec::new();
                for _ in 0..calls {
                    if flood && rng.chance(0.25) {
                        for _ in 0..4 {
                            let other = KEYS + rng.below(1_000_000);
                            limiter.reserve(&other, 2).unwrap();
                        }
                        continue;
                    }
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
                            if reservation.can_give_back() && rng.chance(0.5) {
                                held.push((key, reservation));
                            } else {
                                reservation.keep();
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
    let keys = (0..KEYS)
        .map(|key| {
            let mut kept: u64 = kept.iter().map(|per_thread| per_thread[key as usize]).sum();
            if flood {
                kept += AHEAD;
            }
            (limiter.snapshot(&key).unwrap().wait(), kept)
        })
        .collect();
    (keys, limiter.stats().dropped_unfinished)
}
