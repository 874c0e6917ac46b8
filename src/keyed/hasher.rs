//! Which shard a key goes to.

use std::hash::Hasher;

/// A fast hash to pick a key's shard (not the maps' hash, which resists
/// collisions chosen by clients): a multiply-rotate per word, as FxHash
/// does, written here as the local limiter depends on no hashing crate
/// (those in the dependency tree come only with the Redis client). Its low
/// bits mix poorly (a key `k` of one word hashes to `k × C`), so [`index`]
/// reads the top ones.
#[derive(Default)]
pub(super) struct ShardHasher(u64);

impl Hasher for ShardHasher {
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
    use std::hash::{BuildHasher, BuildHasherDefault};

    /// Consecutive integer keys, strings and keys that differ in their high
    /// bits only spread evenly over the shards: no shard gets more than a
    /// tenth above its share.
    #[test]
    fn keys_spread_evenly_over_the_shards() {
        let hasher = BuildHasherDefault::<ShardHasher>::default();
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
                    most <= share + share / 10,
                    "{shards} shards, keys of kind {kind}: {counts:?}"
                );
            }
        }
    }
}
