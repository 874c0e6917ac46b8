//! How a shard holds a key: as a word or as limits of its own, and the
//! moves between the two.

use super::*;

/// The word of a key held as limits, while keys can be words: mutex mode,
/// which a step never takes (it goes to the write lock, and to the limits).
/// Keeping the key in the word table, marked so, keeps that table as it was
/// while the key goes to limits and back (as a waiting reservation's key
/// does), rather than leaving it to refill what it freed.
pub(super) const HELD_AS_LIMITS: u64 = word::mutex_mode(u64::MAX);

/// A key's limits, boxed in its shard's map while the key cannot be a word.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) limits: Limits,
    /// Tells this entry from the key's earlier and later ones: a
    /// reservation gives back only to the entry it was logged in.
    pub(super) serial: u64,
}

/// What gives back a reservation of a key: the entry it was logged in, and
/// its id in that entry's log.
#[derive(Debug, Clone, Copy)]
pub(in crate::keyed) struct LogId {
    pub(super) serial: u64,
    pub(super) id: u64,
}

/// Puts into `state` (its configuration) the numbers of a key not held, at
/// `at`: full (stored permits at their most, no debt), or for a fallback's
/// keys (see [`Mode`]) with no burst stored, which it cannot know the
/// other processes did not spend: nothing stored, or for a warming-up
/// limit, whose stored permits are no burst but its coldness, all of them
/// (it starts cold, as a key Redis never saw does, not warm).
pub(super) fn start(state: &mut State, mode: Mode, at: u64) {
    state.stored_permits = match (mode, &state.policy) {
        (Mode::Empty, crate::core::Policy::Bursty(_)) => 0.0,
        _ => state.max_permits,
    };
    state.next_free_micros = at;
    state.next_free_fraction = 0;
}

impl<K: Hash + Eq + Clone> Table<K> {
    /// Sets the word configuration for the template at `now` and holds every
    /// key under it ([`rehold`](Self::rehold) with every word's state).
    pub(super) fn configure(&mut self, now: u64) {
        let states = self.word_states(now);
        self.rehold(states, now);
    }

    /// The state of every key held as a word, at `now`.
    pub(super) fn word_states(&mut self, now: u64) -> Vec<(K, State)> {
        let Some(config) = self.config else {
            return Vec::new();
        };
        let mut state = self.template.states()[0].clone();
        let mut states = Vec::with_capacity(self.words.len());
        for (key, cell) in self.words.iter_mut() {
            let current = *cell.get_mut();
            if current != HELD_AS_LIMITS {
                word::decode_into(current, now, &config, &mut state);
                states.push((key.clone(), state.clone()));
            }
        }
        states
    }

    /// Sets the word configuration for the template at `now`, and holds
    /// under it the keys that were words, in `states` (as words where they
    /// fit, else as limits), and those held as limits (as words where they
    /// can be now).
    pub(super) fn rehold(&mut self, states: Vec<(K, State)>, now: u64) {
        let old = self.config;
        self.config = match (self.mode, self.template.states()) {
            (Mode::Full, [state]) => Config::new(state, now),
            _ => None,
        };
        for (key, state) in states {
            match self
                .config
                .map(|config| word::encode(0, &state, now, &config))
            {
                Some(Encoded::Word(word)) => self.hold_as_word(&key, word),
                _ => {
                    let limits = Limits::new(vec![state]).expect("one limit");
                    self.hold_as_limits(key, limits);
                }
            }
        }
        if self.config.is_none() {
            // Every key is held as limits now.
            self.words.clear();
            self.words.shrink_to_fit();
            return;
        }
        let keys: Vec<K> = self.limits.keys().cloned().collect();
        for key in keys {
            if old.is_none() {
                self.words
                    .insert(key.clone(), AtomicU64::new(HELD_AS_LIMITS));
            }
            // Those whose logs emptied (a rate change) may be words.
            self.settle(&key, now);
        }
    }

    /// `state` (of the one limit) as a word, if the configuration holds
    /// words and this state fits one (rebasing the shard first if that is
    /// what it takes).
    pub(super) fn encode(&mut self, state: &State, now: u64) -> Option<u64> {
        let config = self.config?;
        match word::encode(0, state, now, &config) {
            Encoded::Word(word) => Some(word),
            Encoded::Mutex => None,
            Encoded::Rebase if word::worth_rebasing(&config, now) => {
                self.configure(now);
                match word::encode(0, state, now, &self.config?) {
                    Encoded::Word(word) => Some(word),
                    _ => None,
                }
            }
            Encoded::Rebase => None,
        }
    }

    /// Holds `key` as `limits`, with a new serial (marked in the word table
    /// while keys can be words); returns the serial.
    pub(super) fn hold_as_limits(&mut self, key: K, limits: Limits) -> u64 {
        let serial = self.next_serial;
        self.next_serial += 1;
        if self.config.is_some() {
            self.set_word(&key, HELD_AS_LIMITS);
        }
        self.limits.insert(key, Box::new(Held { limits, serial }));
        serial
    }

    /// Holds `key` as `word`, as limits no longer.
    fn hold_as_word<Q>(&mut self, key: &Q, word: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.limits.remove(key).is_some() {
            self.release_limits();
        }
        self.set_word(key, word);
    }

    /// Sets `key`'s word (the key owned only if it is new).
    fn set_word<Q>(&mut self, key: &Q, word: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.words.get_mut(key) {
            Some(cell) => *cell.get_mut() = word,
            None => drop(self.words.insert(key.to_owned(), AtomicU64::new(word))),
        }
    }

    /// Forgets `key`, however it is held.
    pub(super) fn forget<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.limits.remove(key);
        self.release_limits();
        self.words.remove(key);
    }

    /// Gives back the memory of the map of keys held as limits once it is
    /// empty (a bursty key is held so only while its log is in use).
    pub(super) fn release_limits(&mut self) {
        if self.limits.is_empty() && self.limits.capacity() > 0 {
            self.limits.shrink_to_fit();
        }
    }

    /// Holds what a call left in the template's numbers as `key`'s: as a
    /// word if the limits are one with nothing logged and it fits, else as
    /// limits of its own. Returns the serial of the entry (0 for a word).
    pub(super) fn keep_scratch<Q>(&mut self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.template.is_plain() && self.config.is_some() {
            let state = self.template.states()[0].clone();
            if let Some(word) = self.encode(&state, now) {
                self.hold_as_word(key, word);
                return 0;
            }
        }
        // The scratch goes to the key, log and all; the template gets fresh
        // states, with a log that holds no memory, at the configured rates
        // (not at what the key learned, if it learned anything).
        let mut template = Limits::new(self.template.states().to_vec()).expect("a key has limits");
        if !self.template.is_plain() {
            let configured = self.template.ceilings();
            // The template's own rates, so valid.
            let _ = template.set_rates(&configured, now);
        }
        let limits = std::mem::replace(&mut self.template, template);
        self.hold_as_limits(key.to_owned(), limits)
    }

    /// Holds `key`, held as limits, as a word instead if it can be one now
    /// (nothing logged, a state that fits).
    pub(super) fn settle<Q>(&mut self, key: &Q, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.config.is_none() {
            return;
        }
        let Some(entry) = self.limits.get(key) else {
            return;
        };
        if !entry.limits.is_plain() {
            return;
        }
        let state = entry.limits.states()[0].clone();
        if let Some(word) = self.encode(&state, now) {
            self.hold_as_word(key, word);
        }
    }
}
