//! How a shard stays small: the sweeps that drop entries reading as full,
//! the cap's batch of the entries nearest to full, and the memory given
//! back after a flood.

use super::*;

/// The least time between two sweeps by time (µs); see [`Sweep`].
const SWEEP_MIN_PERIOD: u64 = 1_000_000;

/// The least shard length a sweep by growth waits for (see [`Sweep::Growth`]);
/// a sweep keeps a table's capacity up to four times it.
pub(super) const SWEEP_MIN_LEN: usize = 64;

/// A pass that drops entries reading as full, as part of an ordinary call.
/// Which entries reading as full it drops depends on why it runs, so that a
/// key in use is not dropped and made again at every pass (at a high rate,
/// a key reads as full a moment after each call).
#[derive(Debug, Clone, Copy)]
pub(super) enum Sweep {
    /// At the first call a [`sweep_period`] after the last sweep by time,
    /// or at a visit from a call on another shard: the entries idle for
    /// half a period at least, so that a shard flooded once shrinks as soon
    /// as the limiter is used again. One pass per period.
    Time,
    /// When a new key finds the shard twice as large as after the last
    /// sweep (and [`SWEEP_MIN_LEN`] at least): the entries idle since the
    /// last sweep by time. A pass over `n` entries follows at least `n / 2`
    /// new keys: constant work per call, amortized.
    Growth,
    /// When a new key finds the shard at its cap: every entry that reads as
    /// full, before any that does not is dropped.
    Cap,
}

/// The least time between two sweeps by time, for keys of `template`: the
/// longest refill period of its limits, and at least a second.
pub(super) fn sweep_period(template: &Limits) -> u64 {
    template
        .states()
        .iter()
        .map(State::refill_micros)
        .max()
        .unwrap_or(0)
        .max(SWEEP_MIN_PERIOD)
}

impl<K: Hash + Eq + Clone> Shard<K> {
    /// Sweeps by time if a sweep is due at `read` (as the shard's own next
    /// call would), unless the shard is locked: a visit from a call on
    /// another shard, which never waits for this one.
    pub(in crate::keyed) fn visit(&self, read: u64) {
        let due = match self.table.try_read() {
            Ok(table) => read >= table.next_sweep(),
            Err(TryLockError::Poisoned(table)) => read >= table.into_inner().next_sweep(),
            Err(TryLockError::WouldBlock) => false,
        };
        if due && let Some(mut table) = self.try_write() {
            table.clamp(read);
        }
    }
}

impl<K: Hash + Eq + Clone> Table<K> {
    /// Drops the entries that read as full at `now` (nothing logged, no
    /// debt, every permit stored: as a key not held reads) and were last
    /// used before `before` (see [`Sweep`]); holds as words again the
    /// entries held as limits that can be words now; and gives memory back
    /// once the maps are mostly empty.
    pub(super) fn sweep(&mut self, now: u64, kind: Sweep) {
        let before = match kind {
            Sweep::Time => {
                self.last_sweep = now;
                now.saturating_sub(self.sweep_period / 2)
            }
            Sweep::Growth => self.last_sweep,
            Sweep::Cap => u64::MAX,
        };
        let (mut settled, mut dropped) = (Vec::new(), Vec::new());
        self.limits.retain(|key, entry| {
            // What has passed leaves the log first (it can no longer be
            // given back), so that a key whose waits are over can go.
            entry.limits.expire(now);
            if entry.limits.last_used() < before && entry.limits.reads_as_full(now) {
                dropped.push(key.clone());
                return false;
            }
            if entry.limits.is_plain() {
                settled.push(key.clone());
            }
            true
        });
        if let Some(config) = &self.config {
            let mut state = self.template.states()[0].clone();
            self.words.retain(|_, cell| {
                let word = *cell.get_mut();
                if word == HELD_AS_LIMITS || word::last_use(word, config) >= before {
                    return true;
                }
                word::decode_into(word, now, config, &mut state);
                !state.reads_as_full(now)
            });
            for key in dropped {
                self.words.remove(&key);
            }
        }
        for key in settled {
            self.settle(&key, now);
        }
        self.sweep_len = (2 * self.len()).max(SWEEP_MIN_LEN);
        // After a flood of keys a map keeps its size: give the memory back
        // once it is mostly empty.
        if self.words.capacity() > 4 * self.words.len().max(SWEEP_MIN_LEN) {
            self.words.shrink_to(2 * self.words.len());
        }
        if self.limits.capacity() > 4 * self.limits.len().max(SWEEP_MIN_LEN) {
            self.limits.shrink_to(2 * self.limits.len());
        }
        self.release_limits();
    }

    /// Makes room for one more entry: a sweep by growth when the shard has
    /// doubled since the last sweep; with the limiter's shards at the cap
    /// together, this shard's entries that read as full and, if that is not
    /// enough, the sixteenth of its share of the cap nearest to reading as
    /// full (the keys that lose the least: a key in debt further ahead, a
    /// paused one, stays), so that a flood of new keys costs a constant
    /// amount of work per key, amortized. A shard that holds less than its
    /// share lets the key in and leaves the rest to the shard holding the
    /// most ([`Dropped::elsewhere`], [`make_room_for_others`]), where the
    /// choice is wider: the few keys of a sparse shard are no more than
    /// its keys in use. Below the cap nothing is dropped, however the keys
    /// fall across shards. (New keys on other shards at the same moment
    /// each see the others' counts as they were, and may pass the cap by
    /// one each, which the next drop brings back.)
    ///
    /// [`make_room_for_others`]: Self::make_room_for_others
    pub(super) fn make_room(&mut self, now: u64) -> Dropped {
        if self.mode == Mode::Full && self.len() >= self.sweep_len {
            self.sweep(now, Sweep::Growth);
        }
        self.back_to_cap(now, 1)
    }

    /// Drops what the keys of every shard hold beyond the cap, after a
    /// shard holding less than its share let a new key in: this shard's
    /// entries that read as full, then those nearest to full, as
    /// [`make_room`](Self::make_room) does.
    pub(in crate::keyed) fn make_room_for_others(&mut self, now: u64) -> Dropped {
        self.back_to_cap(now, 0)
    }

    /// Brings the keys of every shard, with `incoming` more, back to the
    /// cap, from this shard (see [`make_room`](Self::make_room)).
    fn back_to_cap(&mut self, now: u64, incoming: usize) -> Dropped {
        let Some(cap) = self
            .cap
            .filter(|cap| self.held_by_all() + incoming > cap.keys)
        else {
            return Dropped::default();
        };
        if self.mode == Mode::Full {
            self.sweep(now, Sweep::Cap);
            if self.held_by_all() + incoming <= cap.keys {
                return Dropped::default();
            }
        }
        if incoming > 0 && self.len() < cap.share {
            return Dropped {
                elsewhere: true,
                ..Dropped::default()
            };
        }
        // (More if new keys raced past the cap on other shards meanwhile,
        // each seeing the others' counts as they were: back to it.)
        let over = (self.held_by_all() + incoming).saturating_sub(cap.keys);
        let batch = (cap.share / 16).max(over).min(self.len());
        if batch == 0 {
            return Dropped::default();
        }
        let mut stamps: Vec<u64> = match &self.config {
            Some(config) => self
                .words
                .values_mut()
                .map(|cell| *cell.get_mut())
                .filter(|word| *word != HELD_AS_LIMITS)
                .map(|word| word::full_at(word, config))
                .collect(),
            None => Vec::new(),
        };
        stamps.extend(self.limits.values().map(|entry| entry.limits.full_at()));
        let (_, cutoff, _) = stamps.select_nth_unstable(batch - 1);
        let cutoff = *cutoff;
        let mut left = batch;
        let mut dropped = Vec::new();
        // The latest ticket among the dropped (not when they would be full:
        // the fallback opens new keys after it).
        let mut latest = 0;
        self.limits.retain(|key, entry| {
            if left > 0 && entry.limits.full_at() <= cutoff {
                left -= 1;
                latest = latest.max(entry.limits.last_used());
                dropped.push(key.clone());
                false
            } else {
                true
            }
        });
        if let Some(config) = &self.config {
            self.words.retain(|_, cell| {
                let word = *cell.get_mut();
                if left > 0 && word != HELD_AS_LIMITS && word::full_at(word, config) <= cutoff {
                    left -= 1;
                    latest = latest.max(word::last_use(word, config));
                    false
                } else {
                    true
                }
            });
            for key in dropped {
                self.words.remove(&key);
            }
        }
        self.release_limits();
        Dropped {
            unfinished: (batch - left) as u64,
            latest,
            elsewhere: false,
        }
    }
}
