//! Many threads and tasks on one limiter: no permit is granted twice and none
//! is lost.

use crate::support;
use crate::support::fake;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paceline::RateLimiter;
use paceline::clock::FakeClock;
use paceline::core::LOG_CAPACITY;
use support::rng::Rng;

/// With a frozen clock every reservation lands on one schedule: the waits
/// handed out must be exactly 0, 1, 2, ... intervals, each once.
#[test]
fn threads_on_a_frozen_clock_get_distinct_consecutive_slots() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1000.0)
            .clock(clock)
            .build()
            .unwrap(),
    );
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                (0..500)
                    .map(|_| limiter.reserve(1).unwrap().as_micros() as u64)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut waits: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    waits.sort_unstable();
    let expected: Vec<u64> = (0..4000).map(|i| i * 1000).collect();
    assert_eq!(waits, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_on_a_frozen_clock_get_distinct_consecutive_slots() {
    let (limiter, _) = fake::bursty(100.0);
    let limiter = Arc::new(limiter);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut waits = Vec::new();
                for permits in [1u32, 2, 3] {
                    waits.push((limiter.reserve(permits).unwrap(), permits));
                    tokio::task::yield_now().await;
                }
                waits
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    // Each reservation starts where the previous one (in schedule order) ended.
    all.sort();
    let mut expected_start = Duration::ZERO;
    for (wait, permits) in all {
        assert_eq!(wait, expected_start);
        expected_start += Duration::from_millis(10) * permits;
    }
    assert_eq!(expected_start, Duration::from_millis(10) * 64 * 6);
}

/// Real clock: the total time is at least (permits - burst) / rate.
#[test]
fn threads_on_the_real_clock_respect_the_rate() {
    let rate = 200.0;
    // (Before the limiter is made: it stores what it is left idle from
    // then, so a start taken after it, late on a loaded machine, would
    // count less than the 199 intervals.)
    let start = Instant::now();
    let limiter = Arc::new(RateLimiter::bursty(rate).unwrap());
    let granted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let granted = Arc::clone(&granted);
            std::thread::spawn(move || {
                for _ in 0..25 {
                    limiter.acquire_blocking(1).unwrap();
                    granted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed();
    assert_eq!(granted.load(Ordering::Relaxed), 200);
    // A new limiter stores nothing; the first permit is free: 199 intervals of 5 ms.
    assert!(elapsed >= Duration::from_millis(990), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_the_real_clock_respect_the_rate() {
    // (The start before the limiter, as above.)
    let start = Instant::now();
    let limiter = Arc::new(RateLimiter::bursty(400.0).unwrap());
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                for _ in 0..4 {
                    limiter.acquire(1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    // 400 permits at 400/s, the first free: at least 399 × 2.5 ms.
    assert!(elapsed >= Duration::from_millis(995), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

/// Threads racing with reservations that wait, half of them given back in
/// any order, tries that are refused, and plain reservations, on a frozen
/// clock: the limiter goes in and out of its locked mode (while something
/// waits in its log) under contention, and whatever the interleaving it
/// ends owing exactly what was kept, as a limiter that never made the ones
/// given back, while its log held every request since the oldest that
/// could be (fewer than `LOG_CAPACITY` requests in all); past that, at
/// least what was kept (a reservation the log let go gives nothing back).
#[test]
fn threads_giving_back_leave_the_limiter_owing_what_was_kept() {
    // Four threads of 250 calls make at most 1 000 requests.
    let (owed, kept) = give_back_from_threads(250, SEED, false);
    const { assert!(1_000 < LOG_CAPACITY) };
    assert_eq!(owed, Duration::from_millis(kept));
    let (owed, kept) = give_back_from_threads(3_000, SEED, false);
    assert!(owed >= Duration::from_millis(kept), "{owed:?} {kept}");
}

/// The race above while another thread publishes the same rate again and
/// again (each call a new generation of the word's configuration; the rate
/// does not change, so what waits can still be given back): the limiter
/// ends owing exactly what was kept.
#[test]
fn giving_back_stays_exact_while_the_same_rate_is_set_again_and_again() {
    const { assert!(1_000 < LOG_CAPACITY) };
    for round in 1..=10 {
        let (owed, kept) = give_back_from_threads(250, SEED + 16 * round, true);
        assert_eq!(owed, Duration::from_millis(kept), "round {round}");
    }
}

/// The seed of the threads' draws (thread `i` draws from `SEED + i`).
const SEED: u64 = 0xC0C0_0000;

/// Four threads of `calls` calls each (see above), drawing from `seed`
/// on, and with `republish` another setting the same rate all along: what
/// the limiter owes at the end, and the permits kept.
fn give_back_from_threads(calls: usize, seed: u64, republish: bool) -> (Duration, u64) {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1_000.0)
            .max_burst(Duration::ZERO)
            .clock(clock)
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let setter = republish.then(|| {
        let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                limiter.set_rate(1_000.0).unwrap();
            }
        })
    });
    let kept: u64 = (0..4u64)
        .map(|thread| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed + thread);
                let mut kept = 0;
                let mut held = Vec::new();
                for _ in 0..calls {
                    match rng.below(10) {
                        0 => {
                            let got = limiter.try_reserve(1, Duration::ZERO).unwrap();
                            kept += got.map_or(0, |_| 1);
                        }
                        1 => {
                            limiter.reserve(2).unwrap();
                            kept += 2;
                        }
                        2..5 if !held.is_empty() => {
                            drop(held.swap_remove(rng.below(held.len() as u64) as usize));
                        }
                        _ => {
                            let permits = rng.range(1, 3);
                            let reservation = limiter.reservation(permits as u32).unwrap();
                            if reservation.can_give_back() && rng.chance(0.5) {
                                held.push(reservation);
                            } else {
                                reservation.keep();
                                kept += permits;
                            }
                        }
                    }
                }
                drop(held);
                kept
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .sum();
    stop.store(true, Ordering::Relaxed);
    if let Some(setter) = setter {
        setter.join().unwrap();
    }
    // The first permit goes at once, and pays for the next: one interval
    // (1 ms) a permit kept.
    (limiter.snapshot().unwrap().wait(), kept)
}
