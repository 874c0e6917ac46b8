//! The keyed limiter gives memory back: after a flood of keys has gone
//! idle, the heap it holds falls back to what the active keys need (counted
//! by the support allocator: the bytes this thread holds).

use std::ops::Range;
use std::time::Duration;

use crate::support::alloc::bytes_in_use;
use paceline::Local;
use paceline::clock::FakeClock;
use paceline::{KeyedRateLimiter, Limit};

#[test]
fn a_flood_of_idle_keys_gives_its_memory_back() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let before = bytes_in_use();
    for key in 0..300_000u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    let flooded = bytes_in_use() - before;
    assert!(flooded > 300_000 * 16, "{flooded} bytes for 300 000 keys");
    // A refill period later, ordinary calls on a few keys sweep every
    // shard (each at its first call), and the tables shrink.
    clock.advance(Duration::from_secs(2));
    for round in 0..100u64 {
        for key in 0..64u64 {
            limiter.reserve(&(key * 1_000 + round % 2), 1).unwrap();
        }
        clock.advance(Duration::from_millis(1));
    }
    let after = (bytes_in_use() - before).max(0);
    assert!(limiter.stats().keys <= 128, "{}", limiter.stats().keys);
    assert!(
        after < 256 * 1024,
        "{after} bytes still held for {} keys (the flood took {flooded})",
        limiter.stats().keys
    );
}

/// Touches 200 000 keys once, lets `idle` pass, then calls each key of
/// `in_use` once a millisecond, `calls` times; the keys held then.
fn held_after_a_flood_went_idle(
    limiter: &KeyedRateLimiter<u64, Local, FakeClock>,
    clock: &FakeClock,
    idle: Duration,
    in_use: Range<u64>,
    calls: u32,
) -> usize {
    for key in 0..200_000u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    assert_eq!(limiter.stats().keys, 200_000);
    clock.advance(idle);
    for call in 0..calls {
        if call > 0 {
            clock.advance(Duration::from_millis(1));
        }
        for key in in_use.clone() {
            limiter.reserve(&key, 1).unwrap();
        }
    }
    limiter.stats().keys
}

/// 10 a second with a burst of 10: a key refills in a second, the sweep
/// period.
fn ten_a_second(clock: &FakeClock) -> KeyedRateLimiter<u64, Local, FakeClock> {
    KeyedRateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap()
}

// Calls on a few keys reach only some shards; they sweep the others in
// turn, one shard per call at most, so that every shard has been looked at
// once 64 calls (the most shards there are) have run. Then only the keys in
// use are held: none of the flood's keys was used for three sweep periods.

#[test]
fn idle_shards_sweep_while_other_keys_are_in_use() {
    let clock = FakeClock::new();
    let limiter = ten_a_second(&clock);
    // 100 keys, half their burst spent each.
    let held = held_after_a_flood_went_idle(
        &limiter,
        &clock,
        Duration::from_secs(3),
        1_000_000..1_000_100,
        5,
    );
    assert_eq!(held, 100);
    assert_eq!(limiter.stats().keys, 100);
    assert_eq!(limiter.stats().dropped_unfinished, 0);
}

#[test]
fn idle_shards_sweep_while_one_key_is_in_use() {
    let clock = FakeClock::new();
    let limiter = ten_a_second(&clock);
    // One key, in one shard, 100 calls: in debt, held.
    let held = held_after_a_flood_went_idle(
        &limiter,
        &clock,
        Duration::from_secs(3),
        1_000_000..1_000_001,
        100,
    );
    assert_eq!(held, 1);
    assert_eq!(limiter.stats().keys, 1);
}

#[test]
fn idle_shards_sweep_with_several_limits() {
    let clock = FakeClock::new();
    // The per-minute limit refills in a minute, the sweep period.
    let limiter = KeyedRateLimiter::<u64, _>::builder()
        .limit(Limit::per_second(10.0))
        .limit(Limit::per(300.0, Duration::from_secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let held = held_after_a_flood_went_idle(
        &limiter,
        &clock,
        Duration::from_secs(180),
        1_000_000..1_000_001,
        100,
    );
    assert_eq!(held, 1);
    assert_eq!(limiter.stats().keys, 1);
    assert_eq!(limiter.stats().dropped_unfinished, 0);
}

/// Keys of several limits are held as limits of their own, boxed: after a
/// flood of them has gone idle, the shards drop them and give the memory
/// back as they do for one limit's words.
#[test]
fn a_flood_of_idle_keys_of_several_limits_gives_its_memory_back() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64, _>::builder()
        .limit(Limit::per_second(1e9))
        .limit(Limit::per(6e10, Duration::from_secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let before = bytes_in_use();
    for key in 0..50_000u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    let flooded = bytes_in_use() - before;
    assert!(flooded > 50_000 * 64, "{flooded} bytes for 50 000 keys");
    // Two sweep periods (a minute each) later, calls on a few keys, a
    // second apart, sweep every shard.
    clock.advance(Duration::from_secs(120));
    for _ in 0..200 {
        for key in 1_000_000..1_000_064u64 {
            limiter.reserve(&key, 1).unwrap();
        }
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(limiter.stats().keys, 64);
    let after = (bytes_in_use() - before).max(0);
    assert!(
        after < 256 * 1024,
        "{after} bytes still held for {} keys (the flood took {flooded})",
        limiter.stats().keys
    );
}

/// A key held as limits (several limits) whose log once held many waiting
/// reservations gives that memory back once they have left the log: the
/// key costs what its limits need, not what its longest log took (a client
/// that queued a thousand requests on each of its keys, once, would
/// otherwise leave each key it keeps using holding tens of kilobytes).
#[test]
fn a_key_whose_long_log_emptied_gives_its_memory_back() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64, _>::builder()
        .limit(Limit::per_second(1000.0).burst(1))
        .limit(Limit::per(6000.0, Duration::from_secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let before = bytes_in_use();
    for key in 0..64u64 {
        let waiting: Vec<_> = (0..1000)
            .map(|_| limiter.reservation(&key, 1).unwrap())
            .collect();
        // Kept, each: it will never be given back, and leaves the log.
        for reservation in waiting {
            reservation.keep();
        }
    }
    clock.advance(Duration::from_secs(2));
    for key in 0..64u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    // Every key is in debt to its per-minute limit: held, each as limits.
    assert_eq!(limiter.stats().keys, 64);
    let after = (bytes_in_use() - before).max(0);
    assert!(
        after < 256 * 1024,
        "{after} bytes held for 64 keys whose logs are empty"
    );
}
