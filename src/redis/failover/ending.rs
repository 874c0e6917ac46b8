//! The books' maps of what ends at a moment (debts, pauses, late grants),
//! each held to a cap: a full map drops what has ended before it takes
//! another entry, at a constant cost per call, amortized, whatever the
//! entries' ends.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::{Deref, DerefMut};

/// A map whose entries each end at a moment (µs, local clock), held to a
/// cap by [`room`](Self::room); read and written as the map it is.
pub(super) struct Ending<K, V> {
    map: HashMap<K, V>,
    /// After a pass over the map that found little ended: how many more
    /// calls that find it full are told so without another, and when every
    /// entry it kept has ended (a pass then finds room again).
    waived: usize,
    kept_until: u64,
}

impl<K, V> Default for Ending<K, V> {
    fn default() -> Self {
        Ending {
            map: HashMap::new(),
            waived: 0,
            kept_until: 0,
        }
    }
}

impl<K, V> Deref for Ending<K, V> {
    type Target = HashMap<K, V>;

    fn deref(&self) -> &HashMap<K, V> {
        &self.map
    }
}

impl<K, V> DerefMut for Ending<K, V> {
    fn deref_mut(&mut self) -> &mut HashMap<K, V> {
        &mut self.map
    }
}

impl<K: Hash + Eq, V> Ending<K, V> {
    /// Whether one more entry fits under `cap` at `now`. A full map first
    /// drops the entries that ended by `now` (`end` reads an entry's end),
    /// in one pass over it. A pass that dropped less than an eighth of the
    /// entries is not made again for the next eighth of as many calls that
    /// find the map full (they find no room), unless every entry it kept
    /// has ended: so a pass over `n` entries follows `n / 8` calls at
    /// least, or as many updates of the entries it kept, and a map full of
    /// debts that end one at a time is not passed over whole at every call
    /// under the books' lock.
    pub(super) fn room(&mut self, cap: usize, now: u64, end: impl Fn(&V) -> u64) -> bool {
        if self.map.len() < cap {
            return true;
        }
        if self.waived > 0 && now < self.kept_until {
            self.waived -= 1;
            return false;
        }
        let before = self.map.len();
        let mut kept_until = 0;
        self.map.retain(|_, value| {
            let end = end(value);
            kept_until = kept_until.max(end);
            end > now
        });
        let dropped = before - self.map.len();
        (self.waived, self.kept_until) = if dropped < before / 8 {
            (before / 8, kept_until)
        } else {
            (0, 0)
        };
        self.map.len() < cap
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A map of `n` entries ending at 1..=n, full at `n`.
    fn full(n: u64) -> Ending<u64, u64> {
        let mut map = Ending::default();
        map.extend((1..=n).map(|key| (key, key)));
        map
    }

    /// Entries that end one at a time, a new one each time one has ended
    /// (a flood of keys in debt, each debt as long as the others): the
    /// ended one goes at once, and the passes over the map cost a few
    /// looks per call, not the map's length.
    #[test]
    fn a_full_map_is_not_passed_over_whole_at_every_call() {
        let n = 10_000;
        let mut map = full(n);
        let looks = Cell::new(0u64);
        let end = |end: &u64| {
            looks.set(looks.get() + 1);
            *end
        };
        let calls = 100_000;
        let mut fitted = 0;
        for now in 1..=calls {
            if map.room(n as usize, now, end) {
                map.insert(n + now, n + now);
                fitted += 1;
            }
            assert!(map.len() <= n as usize);
        }
        // (Before: a pass at every call, 10 000 looks each.)
        assert!(
            looks.get() <= 16 * calls,
            "{} looks for {calls} calls on a map of {n}",
            looks.get()
        );
        // Most calls still find room: those waived are an eighth at most.
        assert!(fitted >= calls * 7 / 8, "{fitted} of {calls} fitted");
    }

    /// A map that stays full of entries that have not ended finds no room,
    /// and is passed over once per eighth of its length in calls; once
    /// every entry it kept has ended, the next call finds room.
    #[test]
    fn a_map_full_of_live_entries_waits_for_them_to_end() {
        let n = 800;
        let mut map = full(n);
        for key in map.values_mut() {
            *key += 1_000;
        }
        let looks = Cell::new(0u64);
        let end = |end: &u64| {
            looks.set(looks.get() + 1);
            *end
        };
        for _ in 0..1_000 {
            assert!(!map.room(n as usize, 0, end));
        }
        assert!(looks.get() <= 10 * n, "{} looks", looks.get());
        assert!(map.room(n as usize, 1_000 + n, end));
        assert!(map.is_empty());
    }

    /// A small map is passed over at every call that finds it full, as it
    /// costs nothing: an entry that ended makes room at once.
    #[test]
    fn a_small_map_makes_room_as_soon_as_an_entry_ends() {
        let mut map = full(4);
        assert!(!map.room(4, 0, |end| *end));
        assert!(map.room(4, 1, |end| *end));
        assert_eq!(map.len(), 3);
    }
}
