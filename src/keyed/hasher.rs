//! Which shard a key goes to.

use std::hash::{BuildHasher, Hasher};

/// Makes the hashers that pick a key's shard, each seeded with this
/// limiter's own secret: a client that knows the crate's hash still cannot
/// tell which keys share a shard, so it cannot crowd one shard and choose
/// whose debts its keys drop at the cap (a shard holding its share drops
/// its own keys to make room for a new one of its).
#[derive(Clone)]
pub(super) struct ShardHash(u64);

impl ShardHash {
    /// A seed no one outside this process knows (the standard library's
    /// random keys, through its own keyed hash).
    pub(super) fn new() -> ShardHash {
        ShardHash(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
    }
}

impl BuildHasher for ShardHash {
    type Hasher = ShardHasher;

    #[inline]
    fn build_hasher(&self) -> ShardHasher {
        ShardHasher(self.0)
    }
}

/// A fast hash to pick a key's shard (not the maps' hash, which resists
/// collisions chosen by clients): a multiply-rotate per word from a secret
/// seed, and at the end the state's bytes reversed and multiplied, so that
/// every bit of it reaches the top bits [`index`] reads. A multiply carries
/// bits only upwards: reversing first brings the top bits, where keys that
/// differ only in their high bits differ, within its reach (a fold of the
/// high half onto the low one, before, left a shard more than a fifth above
/// its share of such keys with about one seed in a hundred, and up to 36%
/// above). One multiply: the hot
/// key's call pays for it. Written here as the local limiter depends on no
/// hashing crate (those in the dependency tree come only with the Redis
/// client).
pub(super) struct ShardHasher(u64);

impl Hasher for ShardHasher {
    fn finish(&self) -> u64 {
        self.0.swap_bytes().wrapping_mul(0x9e37_79b9_7f4a_7c15)
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

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

/// The shard, of `shards`, for a key that hashes to `hash`: its top bits,
/// scaled (`hash × shards / 2^64`), where a product's bits are best mixed.
#[inline]
pub(super) fn index(hash: u64, shards: usize) -> usize {
    ((u128::from(hash) * shards as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Consecutive integer keys, strings and keys that differ in their high
    /// bits only spread evenly over the shards, whatever the seed (a few,
    /// fixed, so that the test is the same each run; the last one left keys
    /// that differ in their high bits 22% above their share in a shard
    /// before the finish reversed the state's bytes): no shard gets more
    /// than a fifth above its share (six standard deviations at 64 shards).
    #[test]
    fn keys_spread_evenly_over_the_shards() {
        for seed in [0, 1, 0x5eed, u64::MAX, 0x146d_462b_c462_ecbf] {
            spread_evenly(&ShardHash(seed));
        }
    }

    /// The same for keys that differ in their high bits, over 200 seeds
    /// drawn from a fixed sequence (before, one of them left 1 202 keys in a
    /// shard).
    #[test]
    fn high_bit_keys_spread_evenly_whatever_the_seed() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..200 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let hasher = ShardHash(seed);
            let mut counts = [0usize; 64];
            for key in 0..64_000u64 {
                counts[index(hasher.hash_one(key << 40), 64)] += 1;
            }
            let most = *counts.iter().max().unwrap();
            assert!(most <= 1200, "seed {seed:#x}: {counts:?}");
        }
    }

    fn spread_evenly(hasher: &ShardHash) {
        for shards in [1, 4, 8, 16, 64] {
            let keys = 64_000u64;
            let mut counts = vec![vec![0usize; shards]; 4];
            for key in 0..keys {
                counts[0][index(hasher.hash_one(key), shards)] += 1;
                counts[1][index(hasher.hash_one(key as u32), shards)] += 1;
                counts[2][index(hasher.hash_one(format!("user-{key}")), shards)] += 1;
                counts[3][index(hasher.hash_one(key << 40), shards)] += 1;
            }
            let share = keys as usize / shards;
            for (kind, counts) in counts.iter().enumerate() {
                let most = *counts.iter().max().unwrap();
                assert!(
                    most <= share + share / 5,
                    "{shards} shards, keys of kind {kind}: {counts:?}"
                );
            }
        }
    }

    /// Two limiters' seeds differ, and so does where they put the same
    /// keys: which keys share a shard is not the crate's to tell.
    #[test]
    fn each_limiter_puts_keys_in_shards_of_its_own() {
        assert_ne!(ShardHash::new().0, ShardHash::new().0);
        let (one, other) = (ShardHash(1), ShardHash(2));
        let moved = (0..1000u64)
            .filter(|key| index(one.hash_one(key), 8) != index(other.hash_one(key), 8))
            .count();
        // Independent placements agree on an eighth of the keys.
        assert!((800..950).contains(&moved), "{moved} of 1000 keys moved");
    }
}
