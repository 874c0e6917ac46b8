//! How a shard stays small: the sweeps that drop entries reading as full,
//! the cap's batch of least recently used entries, and the ledgers no
//! longer needed.

use super::*;

/// The least time between two sweeps by time (µs); see [`Sweep`].
pub(super) const SWEEP_MIN_PERIOD: u64 = 1_000_000;

/// See [`SWEEP_MIN_PERIOD`].
pub(super) const SWEEP_MIN_LEN: usize = 64;

/// A pass that drops entries reading as full, as part of an ordinary call.
/// Which entries reading as full it drops depends on why it runs, so that a
/// key in use is not dropped and made again at every pass (at a high rate,
/// a key reads as full a moment after each call).
#[derive(Debug, Clone, Copy)]
pub(super) enum Sweep {
    /// At the first call a sweep period (the refill period, and at least
    /// [`SWEEP_MIN_PERIOD`]) after the last sweep by time, or at a visit
    /// from a call on another shard: the entries idle for half a period at
    /// least, so that a shard flooded once shrinks as soon as the limiter
    /// is used again. One pass per period.
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

/// The least time between two sweeps by time, for keys of `template`.
pub(super) fn sweep_period(template: &State) -> u64 {
    template.refill_micros().max(SWEEP_MIN_PERIOD)
}
/// Whether `entry` reads as full at `now`, i.e. as a missing key does: its
/// ticket has passed and idle time has refilled every stored permit (the
/// core's own resync decides, to the bit). Dropping it then changes nothing
/// a caller can see.
pub(super) fn reads_as_full(template: &State, entry: &Entry, now: u64) -> bool {
    // A ticket at `now` with a fraction still lies ahead.
    if entry.next_free_micros > now
        || (entry.next_free_micros == now && entry.next_free_fraction > 0)
    {
        return false;
    }
    let mut state = entry.state(template);
    state.resync(now);
    state.stored_permits.to_bits() == state.max_permits.to_bits()
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
    /// Drops the entries that read as full at `now` and were last used
    /// before `before` (see [`Sweep`]), except those with a reservation that
    /// may still wait, then the ledgers no longer needed (see
    /// [`Waiting::needed`]), and gives memory back once the maps are mostly
    /// empty.
    pub(super) fn sweep(&mut self, now: u64, kind: Sweep) {
        let before = match kind {
            Sweep::Time => {
                self.last_sweep = now;
                now.saturating_sub(self.sweep_period / 2)
            }
            Sweep::Growth => self.last_sweep,
            Sweep::Cap => u64::MAX,
        };
        let template = &self.template;
        let ledgers = &self.ledgers;
        // Even reading as full, a key whose give-backs may still move its
        // state is kept with its ledger. (One whose reservations have all
        // passed their moment goes: restoring the last one would leave it
        // full too.)
        let waits =
            |key: &K| !ledgers.is_empty() && ledgers.get(key).is_some_and(|w| now < w.until);
        if let Some(config) = &self.config {
            self.words.retain(|key, cell| {
                let word = *cell.get_mut();
                !(word::last_use(word, config) < before
                    && reads_as_full(template, &Entry::decoded(word, now, config), now)
                    && !waits(key))
            });
        }
        self.states.retain(|key, entry| {
            !(entry.next_free_micros < before && reads_as_full(template, entry, now) && !waits(key))
        });
        self.forget_ledgers(now);
        self.sweep_len = (2 * self.len()).max(SWEEP_MIN_LEN);
        // After a flood of keys a map keeps its size: give the memory back
        // once it is mostly empty.
        for (len, capacity) in [
            (self.words.len(), self.words.capacity()),
            (self.states.len(), self.states.capacity()),
        ] {
            if capacity > 4 * len.max(SWEEP_MIN_LEN) {
                self.words.shrink_to(2 * self.words.len());
                self.states.shrink_to(2 * self.states.len());
                break;
            }
        }
    }

    /// Makes room for one more entry: a sweep by growth when the shard has
    /// doubled since the last sweep; under the cap, the entries that read as
    /// full and, if that is not enough, the least recently used sixteenth
    /// of the shard (so that a flood of new keys costs a constant amount of
    /// work per key, amortized).
    pub(super) fn make_room(&mut self, now: u64) -> Dropped {
        if self.mode == Mode::Full && self.len() >= self.sweep_len {
            self.sweep(now, Sweep::Growth);
        }
        let Some(cap) = self.cap else {
            return Dropped::default();
        };
        if self.len() < cap {
            return Dropped::default();
        }
        if self.mode == Mode::Full {
            self.sweep(now, Sweep::Cap);
            if self.len() < cap {
                return Dropped::default();
            }
        }
        let batch = (cap / 16).max(1).min(self.len());
        let mut stamps: Vec<u64> = match &self.config {
            Some(config) => self
                .words
                .values_mut()
                .map(|cell| word::last_use(*cell.get_mut(), config))
                .collect(),
            None => Vec::new(),
        };
        stamps.extend(self.states.values().map(|entry| entry.next_free_micros));
        let (_, cutoff, _) = stamps.select_nth_unstable(batch - 1);
        let cutoff = *cutoff;
        let mut left = batch;
        if let Some(config) = &self.config {
            self.words.retain(|_, cell| {
                if left > 0 && word::last_use(*cell.get_mut(), config) <= cutoff {
                    left -= 1;
                    false
                } else {
                    true
                }
            });
        }
        self.states.retain(|_, entry| {
            if left > 0 && entry.next_free_micros <= cutoff {
                left -= 1;
                false
            } else {
                true
            }
        });
        // The dropped keys' ledgers go with them.
        self.forget_ledgers(now);
        Dropped {
            unfinished: (batch - left) as u64,
            latest: if left < batch { cutoff } else { 0 },
        }
    }

    /// Drops the ledgers of the keys no longer held and those no longer
    /// needed (see [`Waiting::needed`]), and gives the memory back once
    /// the map is mostly empty.
    pub(super) fn forget_ledgers(&mut self, now: u64) {
        if self.ledgers.is_empty() {
            return;
        }
        let (words, states, config) = (&self.words, &self.states, self.config.as_ref());
        self.ledgers.retain(|key, waiting| {
            held_entry(words, states, config, key, now)
                .is_some_and(|entry| waiting.needed(&entry, now))
        });
        self.release_ledgers();
    }

    /// Drops the ledger of `key`.
    pub(super) fn forget_ledger<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ledgers.remove(key);
        self.release_ledgers();
    }

    /// Gives the ledger map's memory back: all of it once no key has a
    /// ledger, most of it once it is mostly empty.
    pub(super) fn release_ledgers(&mut self) {
        let (len, capacity) = (self.ledgers.len(), self.ledgers.capacity());
        if len == 0 {
            if capacity > 0 {
                self.ledgers.shrink_to_fit();
            }
        } else if capacity > 4 * len.max(SWEEP_MIN_LEN) {
            self.ledgers.shrink_to(2 * len);
        }
    }
}
