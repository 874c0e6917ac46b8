//! Many threads and tasks on one limiter: no permit is granted twice and none
//! is lost.

#[path = "support/fake.rs"]
mod fake;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use throttler::RateLimiter;
use throttler::clock::FakeClock;

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
    let limiter = Arc::new(RateLimiter::bursty(rate).unwrap());
    let granted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
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
    let limiter = Arc::new(RateLimiter::bursty(400.0).unwrap());
    let start = Instant::now();
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
