//! What a reservation on the local limiter hands back: the wait alone, or
//! the wait and what gives it back.

use crate::core::Granted;
use crate::reservation::GiveBackId;

/// A granted reservation: the wait in µs and, if it was logged to be given
/// back, its id there.
pub(super) struct Grant {
    pub(super) wait: u64,
    pub(super) taken: Option<GiveBackId>,
    /// The limit that set the wait, on a limiter with several.
    pub(super) limit: usize,
}

/// What a reservation hands back: the wait alone (`u64`: a plain
/// reservation or try, which nothing gives back), or a [`Grant`] that can
/// be given back (for a [`Reservation`](crate::Reservation)). Generic, so
/// that the wait alone costs what it would if nothing were ever given back.
pub(super) trait Outcome: Sized {
    /// Whether a reservation with a wait can be given back: it is then
    /// made under the lock, and logged (see `core::Limits`).
    const GIVES_BACK: bool;
    /// A reservation made on the word: it does not wait, or nothing gives
    /// it back.
    fn from_word(wait: u64) -> Self;
    /// A reservation made on the limits, under the lock.
    fn from_granted(granted: Granted) -> Self;
}

impl Outcome for u64 {
    const GIVES_BACK: bool = false;

    #[inline(always)]
    fn from_word(wait: u64) -> u64 {
        wait
    }

    fn from_granted(granted: Granted) -> u64 {
        granted.wait_micros
    }
}

impl Outcome for Grant {
    const GIVES_BACK: bool = true;

    #[inline(always)]
    fn from_word(wait: u64) -> Grant {
        // Nothing to wait for, so nothing to give back.
        Grant {
            wait,
            taken: None,
            limit: 0,
        }
    }

    fn from_granted(granted: Granted) -> Grant {
        Grant {
            wait: granted.wait_micros,
            taken: granted.id.map(GiveBackId::Logged),
            limit: granted.bound_by.unwrap_or(0),
        }
    }
}
