//! What a reservation on the local limiter hands back: the wait alone, or
//! the wait and what it took.

use crate::core::{Ledger, Reserved, State};
use crate::reservation::Taken;

/// A granted reservation: the wait in µs and, if it has to wait, what it
/// took.
pub(super) struct Grant {
    pub(super) wait: u64,
    pub(super) taken: Option<Taken>,
    /// The limit that set the wait, on a limiter with several.
    pub(super) limit: usize,
}

/// What a reservation hands back: the wait alone (`u64`: a plain
/// reservation or try, which nothing gives back), or a [`Grant`] that
/// records what it took (for a [`Reservation`]). Generic, so that the wait
/// alone costs what it did before give-backs existed.
pub(super) trait Outcome: Sized {
    /// What the locked path keeps of a reservation.
    type Record;
    /// Whether a reservation with a wait can be given back: it is then
    /// made under the lock, through the ledger (see [`Ledger`]).
    const GIVES_BACK: bool;
    /// Reserves on the core, through the ledger; returns the moment and the
    /// record.
    fn reserve(
        state: &mut State,
        ledger: &mut Ledger,
        permits: u32,
        now: u64,
    ) -> (u64, Self::Record);
    /// A reservation with no wait, made on the word.
    fn from_word(wait: u64) -> Self;
    /// A reservation made on the core, under the lock.
    fn from_locked(wait: u64, record: Self::Record) -> Self;
    /// A reservation made on several limits, with its id in their log if
    /// it can be given back, and the limit that set its wait.
    fn from_limits(wait: u64, id: Option<u64>, bound_by: usize) -> Self;
}

impl Outcome for u64 {
    type Record = ();
    const GIVES_BACK: bool = false;

    #[inline(always)]
    fn reserve(state: &mut State, ledger: &mut Ledger, permits: u32, now: u64) -> (u64, ()) {
        (ledger.reserve(state, permits, now), ())
    }

    #[inline(always)]
    fn from_word(wait: u64) -> u64 {
        wait
    }

    #[inline(always)]
    fn from_locked(wait: u64, _: ()) -> u64 {
        wait
    }

    fn from_limits(wait: u64, _: Option<u64>, _: usize) -> u64 {
        wait
    }
}

impl Outcome for Grant {
    type Record = Reserved;
    const GIVES_BACK: bool = true;

    fn reserve(state: &mut State, ledger: &mut Ledger, permits: u32, now: u64) -> (u64, Reserved) {
        let reserved = ledger.reserve_recorded(state, permits, now);
        (reserved.moment_micros, reserved)
    }

    #[inline(always)]
    fn from_word(wait: u64) -> Grant {
        // Nothing to wait for, so nothing to give back.
        Grant {
            wait,
            taken: None,
            limit: 0,
        }
    }

    fn from_locked(wait: u64, reserved: Reserved) -> Grant {
        Grant {
            wait,
            taken: Some(Taken::Core(reserved)),
            limit: 0,
        }
    }

    fn from_limits(wait: u64, id: Option<u64>, bound_by: usize) -> Grant {
        Grant {
            wait,
            taken: id.map(Taken::Logged),
            limit: bound_by,
        }
    }
}
