//! Hostile keys in the in-process keyed limiter: kept apart, and unable to
//! push another key's debt out below `max_keys`.

use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::time::Duration;

use paceline::KeyedRateLimiter;
use paceline::clock::FakeClock;

/// The crate's shard hash as it was (`src/keyed/hasher.rs`): a
/// multiply-rotate per 8-byte word, fixed, with no per-limiter seed, so
/// that a client could tell offline which keys share a shard.
#[derive(Default)]
struct Mirror(u64);

impl Hasher for Mirror {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// The shard count the crate picks for `max_keys` (`src/keyed/mod.rs`).
fn shards(max_keys: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    let wanted = (cpus * 4).next_power_of_two().clamp(4, 64);
    let per = max_keys / 16;
    let prev = if per == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - per.leading_zeros())
    };
    wanted.min(prev)
}

fn shard_of(key: &str, shards: usize) -> usize {
    let hash = BuildHasherDefault::<Mirror>::default().hash_one(key);
    ((u128::from(hash) * shards as u128) >> 64) as usize
}

/// Keys a client picks offline to land in one shard: while the shard hash
/// was fixed, `max_keys / shards` of them pushed out a victim's key (and
/// its debt) with the limiter holding far fewer than `max_keys` keys (136
/// debts dropped with 121 of 1024 keys held). The docs (`Builder::max_keys`)
/// drop keys with debt only "at the cap"; each limiter now seeds its own.
#[test]
fn a_key_keeps_its_debt_while_far_fewer_than_max_keys_are_held() {
    let max_keys = 1024;
    let shards = shards(max_keys);
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .unwrap();
    let victim = "victim".to_owned();
    assert_eq!(limiter.reserve(&victim, 1).unwrap(), Duration::ZERO);
    let target = shard_of(&victim, shards);
    // Twice a shard's share, all in the victim's shard: a quarter of the
    // cap or less on a machine with 2 CPUs or more (8 shards or more).
    let wanted = 2 * max_keys / shards;
    let chosen: Vec<String> = (0u64..)
        .map(|i| format!("k{i}"))
        .filter(|key| shard_of(key, shards) == target)
        .take(wanted)
        .collect();
    for key in &chosen {
        limiter.reserve(key, 1).unwrap();
    }
    let held = limiter.stats().keys;
    assert!(held <= wanted + 1, "{held} keys held");
    if held + 1 < max_keys {
        assert_eq!(
            limiter.stats().dropped_unfinished,
            0,
            "{held} of {max_keys} keys held ({shards} shards): keys with debt were dropped"
        );
        // The victim still owes its second.
        assert!(
            limiter
                .try_reserve(&victim, 1, Duration::ZERO)
                .unwrap()
                .is_none(),
            "the victim's debt is gone with {held} of {max_keys} keys held"
        );
    }
}

/// Keys of hostile text are each their own in this process.
#[test]
fn hostile_keys_are_apart_in_process() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    let keys = [
        "", "\0", "a\0", "a", "a:b", "a\\:b", "{a}", "\\(a\\)", "\n", "\u{fffd}", "é", "e\u{301}",
    ];
    for key in keys {
        assert_eq!(limiter.reserve(key, 1).unwrap(), Duration::ZERO, "{key:?}");
    }
    for key in keys {
        assert!(
            limiter
                .try_reserve(key, 1, Duration::ZERO)
                .unwrap()
                .is_none(),
            "{key:?}"
        );
    }
}
