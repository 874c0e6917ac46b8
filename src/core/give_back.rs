//! Giving back a reservation that was never used, on one limit's state
//! alone: the rule the log of [`Limits`](super::Limits) replaced.
//!
//! No limiter uses it (the Redis script, which did, now replays a log as
//! [`Limits`](super::Limits) does). It stays as the baseline
//! `tests/local/cancellation.rs` shows the log's exactness against; the
//! [`Ledger`](super::Ledger) built on it is used by nothing.
//!
//! A reservation is recorded as a [`Reserved`]: the state it found, the state
//! it left, and the moment it was granted for. [`State::give_back`] then
//! undoes it in one of two ways.
//!
//! * **It is the latest reservation** (the state is still exactly the one it
//!   left): the state it found is put back, bit for bit, stored permits
//!   included. The limiter is then exactly as if the reservation had never
//!   been made.
//! * **Others came after it**: they keep the slots they were given, and the
//!   ticket moves back by the reservation's *charge* (how far it had pushed
//!   `next_free_micros`), so the next caller is scheduled as if it had never
//!   been made. This is only done while the reservation's moment still lies
//!   in the future (a reservation whose moment has passed has been used, or
//!   its time has gone by anyway), and only for a reservation that spent no
//!   stored permits (only a cold warming-up limiter has a ticket in the
//!   future and permits stored; their price depends on how many are left, so
//!   taking one out of the middle of the ramp has no exact undo).
//!
//! # Why the second rule never schedules anyone too early
//!
//! Compare with a *model* limiter that never made the cancelled reservation
//! `B`. `B` had to wait (its moment `m` lies after `now`) and spent no
//! stored permits, so when it was made the limiter had none and its ticket
//! was `m`: `B`'s permits were all charged at the stable interval, pushing
//! the ticket to `m + c`. Every reservation made since then was made before
//! `now < m`, so it found the ticket in the future and nothing stored, and
//! pushed the ticket by its own charge at the stable interval. The model would have seen the same requests
//! with a ticket `c` earlier, still not before their arrival (they arrived
//! before `now < m`), so it charged them the same: its ticket is the real
//! ticket minus `c`, and neither holds stored permits. After the give-back
//! the two states are equal; callers already waiting hold slots at or after
//! their slots in the model. Several cancellations compose: each one removes
//! exactly its own charge.
//!
//! (A ticket moved back below `now` simply reads as idle time at the next
//! resync, exactly as it would in the model. Only reservations that are
//! given back while their moment is in the future are covered by this
//! argument; others give nothing back unless they are the latest.)
//!
//! # Where it is not exact: several give-backs
//!
//! The argument assumes the model stays in debt. It need not when several
//! reservations are given back: once an earlier one has been given back, a
//! later one keeps its slot while its place in the model moved earlier, and
//! a reservation `S` made while it is still pending finds the real limiter
//! in debt where the model sat idle for longer than the burst and dropped
//! the excess idle time. Giving the later one back then moves `S`'s charge
//! into that dropped idle time: callers after `S` are scheduled up to the
//! dropped time earlier than the model. That is not a rounding: with
//! callers that give up after a timeout, a limiter with no burst at 10
//! permits per second scheduled callers up to 2 s early, and one at 0.5 per
//! second up to 81 s (`tests/local/cancellation.rs`).
//!
//! Closing it means remembering, for the reservations still waiting, what
//! was requested after each: the [`Ledger`](super::Ledger) (which the
//! one-limit Redis script kept in the key's value), or all of it, the log
//! of [`Limits`](super::Limits) that the limiters (and now the Redis script)
//! replay. With
//! either, nobody is ever scheduled before the model, and the limiter ends
//! on it. [`State::give_back`] alone is what a ledger falls back to for the
//! latest reservation.

use super::State;

/// What one reservation took, as [`State::reserve_recorded`] returns it: enough
/// to give it back with [`State::give_back`].
///
/// ```
/// use paceline::core::{Bursty, GiveBack, Policy, State};
///
/// let mut state = State::new(Policy::Bursty(Bursty::default()), 5.0, 0).unwrap();
/// state.reserve(1, 0);
/// let before = state.clone();
/// let taken = state.reserve_recorded(1, 0);
/// assert_eq!(taken.moment_micros, 200_000);
/// // Nothing happened since: the state goes back exactly.
/// assert_eq!(state.give_back(&taken, 100_000), GiveBack::Restored);
/// assert_eq!(state, before);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reserved {
    #[doc(hidden)]
    /// When the reserved permits may be used.
    pub moment_micros: u64,
    #[doc(hidden)]
    /// `stored_permits` before the reservation (before its resync).
    pub stored_before: f64,
    #[doc(hidden)]
    /// `next_free_micros` before the reservation (before its resync).
    pub next_free_before: u64,
    #[doc(hidden)]
    /// `next_free_fraction` before the reservation (before its resync).
    pub fraction_before: u32,
    #[doc(hidden)]
    /// `stored_permits` after it.
    pub stored_after: f64,
    #[doc(hidden)]
    /// `next_free_micros` after it: `moment_micros` plus its charge.
    pub next_free_after: u64,
    #[doc(hidden)]
    /// `next_free_fraction` after it.
    pub fraction_after: u32,
    #[doc(hidden)]
    /// `stable_interval_micros` when it was made.
    pub stable_interval_micros: f64,
    #[doc(hidden)]
    /// `max_permits` when it was made.
    pub max_permits: f64,
    #[doc(hidden)]
    /// Whether it spent stored permits.
    pub spent_stored: bool,
    #[doc(hidden)]
    /// Its group in a [`Ledger`](super::Ledger), if it was made through one
    /// and had to wait; `None` from [`State::reserve_recorded`].
    pub waiting_id: Option<u64>,
}

impl Reserved {
    /// How far the reservation pushed the ticket, in whole microseconds,
    /// rounded down: from its moment (with the fraction the ticket had
    /// then: `fraction_before` if no resync moved the ticket, else none) to
    /// `next_free_after` and `fraction_after`. Rounded down, so that giving
    /// it back never moves the ticket further back than the reservation
    /// pushed it.
    pub fn charge_micros(&self) -> u64 {
        let moment_fraction = if self.moment_micros == self.next_free_before {
            self.fraction_before
        } else {
            0
        };
        let whole = self.next_free_after - self.moment_micros;
        if self.fraction_after < moment_fraction {
            whole.saturating_sub(1)
        } else {
            whole
        }
    }
}

/// What [`State::give_back`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// The reservation was the latest: the state it found was put back.
    Restored,
    /// Others came after it: the ticket moved back by this many µs (its
    /// charge, or less where that would have reached back past `now`).
    Returned(u64),
    /// Others came after it, and its moment had passed or it had spent
    /// stored permits: nothing is given back.
    Nothing,
}

// Used by no limiter: the baseline of `tests/local/cancellation.rs`.
impl State {
    /// [`reserve_earliest_available`](State::reserve_earliest_available),
    /// recording what was taken.
    pub fn reserve_recorded(&mut self, permits: u32, now_micros: u64) -> Reserved {
        let stored_before = self.stored_permits;
        let next_free_before = self.next_free_micros;
        let fraction_before = self.next_free_fraction;
        // The reservation's own resync, done first to see what it stores;
        // the second one inside is then a no-op.
        self.resync(now_micros);
        let stored_resynced = self.stored_permits;
        let moment_micros = self.reserve_earliest_available(permits, now_micros);
        Reserved {
            moment_micros,
            stored_before,
            next_free_before,
            fraction_before,
            stored_after: self.stored_permits,
            next_free_after: self.next_free_micros,
            fraction_after: self.next_free_fraction,
            stable_interval_micros: self.stable_interval_micros,
            max_permits: self.max_permits,
            spent_stored: self.stored_permits != stored_resynced,
            waiting_id: None,
        }
    }

    /// Gives back a reservation recorded by
    /// [`reserve_recorded`](State::reserve_recorded) on this state, at
    /// `now_micros`. See [`core`](crate::core) ("Giving a reservation back") for the two rules
    /// and why they are safe.
    ///
    /// Call it at most once per reservation. Rate changes in between are
    /// allowed: a reservation made before one is never restored over it.
    pub fn give_back(&mut self, taken: &Reserved, now_micros: u64) -> GiveBack {
        if self.is_latest(taken) {
            self.stored_permits = taken.stored_before;
            self.next_free_micros = taken.next_free_before;
            self.next_free_fraction = taken.fraction_before;
            return GiveBack::Restored;
        }
        self.return_charge(
            taken.moment_micros,
            taken.charge_micros(),
            taken.spent_stored,
            now_micros,
        )
    }

    /// The second rule of [`give_back`](State::give_back) alone, for a
    /// reservation that is known not to be the latest: moves the ticket back
    /// by `charge_micros` (whole microseconds; its fraction stays) if
    /// `moment_micros` is still ahead of `now_micros` and the reservation
    /// spent no stored permits.
    pub fn return_charge(
        &mut self,
        moment_micros: u64,
        charge_micros: u64,
        spent_stored: bool,
        now_micros: u64,
    ) -> GiveBack {
        if now_micros < moment_micros && !spent_stored {
            let ticket = self.next_free_micros;
            self.next_free_micros = ticket
                .saturating_sub(charge_micros)
                .max(now_micros.min(ticket));
            GiveBack::Returned(ticket - self.next_free_micros)
        } else {
            GiveBack::Nothing
        }
    }

    /// Whether `taken` is the latest change to this state: the state is
    /// still exactly the one it left, at the same rate and burst.
    pub(super) fn is_latest(&self, taken: &Reserved) -> bool {
        self.stored_permits.to_bits() == taken.stored_after.to_bits()
            && self.next_free_micros == taken.next_free_after
            && self.next_free_fraction == taken.fraction_after
            && !self.rate_changed_since(taken)
    }

    /// Whether the rate or the burst differs from when `taken` was made. A
    /// rate change in between can leave `stored_permits` and
    /// `next_free_micros` as they were (a ticket in the future, nothing
    /// stored), but the state found before it is not the one to go back to.
    fn rate_changed_since(&self, taken: &Reserved) -> bool {
        self.stable_interval_micros.to_bits() != taken.stable_interval_micros.to_bits()
            || self.max_permits.to_bits() != taken.max_permits.to_bits()
    }
}
