//! One key's entry in a shard, and the ledger beside it while one of its
//! reservations may still wait.

use super::*;

/// One key's state as the core's numbers: its stored permits and ticket.
/// (Its ticket also tells when it was last used: a reservation moves it to
/// at least its moment, so the entries whose tickets lie furthest back are
/// the least recently used.)
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) stored_permits: f64,
    pub(super) next_free_micros: u64,
    pub(super) next_free_fraction: u32,
}

impl Entry {
    /// The key's part of `state`.
    pub(super) fn of(state: &State) -> Entry {
        Entry {
            stored_permits: state.stored_permits,
            next_free_micros: state.next_free_micros,
            next_free_fraction: state.next_free_fraction,
        }
    }

    /// The state a word stands for at `now`.
    pub(super) fn decoded(word: u64, now: u64, config: &Config) -> Entry {
        let decoded = word::decode(word, now, config);
        Entry {
            stored_permits: decoded.stored,
            next_free_micros: decoded.next_free,
            next_free_fraction: decoded.fraction,
        }
    }

    /// Puts the key's part into `state` (the configuration's).
    pub(super) fn load_into(&self, state: &mut State) {
        state.stored_permits = self.stored_permits;
        state.next_free_micros = self.next_free_micros;
        state.next_free_fraction = self.next_free_fraction;
    }

    /// The key's state under `template`'s configuration.
    pub(super) fn state(&self, template: &State) -> State {
        let mut state = template.clone();
        self.load_into(&mut state);
        state
    }
}

/// A key's [`Ledger`], beside its entry, while a reservation noted in it may
/// still be waiting.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) ledger: Ledger,
    /// Tells this ledger from the key's earlier and later ones: a
    /// reservation gives back only through the ledger it was noted in.
    pub(super) serial: u64,
    /// The latest moment of the reservations noted in it with a wait: from
    /// then on none can wait any more, and the ledger is needed only to
    /// restore the latest of them (see [`Waiting::needed`]).
    pub(super) until: u64,
    /// The key's state right after the last reservation noted with a wait,
    /// while nothing else has been noted since and it has not been
    /// restored: as long as the key is still in that state, giving that
    /// reservation back restores it exactly, even once its moment has
    /// passed (as [`Ledger::give_back`] does).
    pub(super) last: Option<Entry>,
}

impl Waiting {
    /// Whether the ledger can still change what a give-back does, with the
    /// key in `state` at `now`: while one of its reservations may still
    /// wait, or its last one may still be restored. Once neither holds, its
    /// reservations give back nothing, as they would through it, and later
    /// ones run through a new ledger exactly as through this one (its next
    /// call would merge every group).
    pub(super) fn needed(&self, state: &Entry, now: u64) -> bool {
        now < self.until
            || self.last.is_some_and(|last| {
                !self.ledger.is_empty()
                    && last.stored_permits.to_bits() == state.stored_permits.to_bits()
                    && last.next_free_micros == state.next_free_micros
                    && last.next_free_fraction == state.next_free_fraction
            })
    }
}
