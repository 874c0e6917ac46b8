//! The keyed limiter gives memory back: after a flood of keys has gone
//! idle, the heap it holds falls back to what the active keys need (counted
//! by the support allocator: the bytes this thread holds).

use std::time::Duration;

use crate::support::alloc::bytes_in_use;
use paceline::KeyedRateLimiter;
use paceline::clock::FakeClock;

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
    assert!(limiter.len() <= 128, "{}", limiter.len());
    assert!(
        after < 256 * 1024,
        "{after} bytes still held for {} keys (the flood took {flooded})",
        limiter.len()
    );
}
