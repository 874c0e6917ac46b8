//! The [`Ledger`]: what an exact give-back of one limit has to remember
//! about the reservations still waiting (the reasoning is in its
//! documentation).
//!
//! Nothing uses it any more: the limiters give back through the log of
//! [`Limits`](super::Limits), and the Redis script, which kept one in a
//! key's value, now replays a log as `Limits` does. It can go.

use super::{FRACTION_ONE, GiveBack, MAX_MICROS, Policy, Reserved, State};

/// What an exact give-back has to remember about the reservations still
/// waiting, kept beside a [`State`].
///
/// # Why the state alone is not enough
///
/// Moving the ticket back by a cancelled reservation's charge
/// ([`State::return_charge`]) is exact while the limiter stays in debt. It
/// is not once several reservations are given back. A reservation `B` that
/// keeps its slot after an earlier one `A` was given back holds a slot later
/// than a limiter that never made `A` would have given it. A request `S`
/// made while `B` waits finds the real limiter in debt (behind `B`), where
/// the limiter without `A` and `B` might have sat idle for longer than its
/// burst and dropped the excess idle time. When `B` is then given back,
/// moving the ticket back by `B`'s whole charge hands that dropped idle time
/// to the callers after `S`: they are scheduled before the limiter that
/// never made `A` and `B` would schedule them. With large reservations this
/// is not a rounding: two reservations of an hour each, given back in that
/// order, let later callers in up to an hour early.
///
/// # What the ledger keeps
///
/// Think of a bursty limiter's state as one number, the *theoretical
/// arrival time* `tat = next_free − stored × interval`. A request at `t`
/// clamps it to at least `t − burst` and adds its charge. Unrolled, `tat` is
/// the largest of one *term* per request `i`:
///
/// ```text
/// term_i = t_i − burst + (charges of the requests made at or after i)
/// ```
///
/// (plus one for the initial state). Giving back a reservation `k` removes
/// its charge from the terms of the requests made up to `k`, and from none
/// made after it. The exact ticket after the give-back is therefore
///
/// ```text
/// max(tat − charge_k, the largest term of the requests made after k)
/// ```
///
/// and the second half is what the state cannot know. The ledger keeps it:
/// the terms, grouped between consecutive reservations that are still
/// waiting (only those can be given back), each group as its largest term,
/// held as an offset below `tat` (charges move every term and `tat` alike,
/// so a reservation changes no offset). A group that a later one reaches or
/// exceeds can never be the largest again (later groups lose at most what
/// earlier ones lose), so it is emptied, and its reservation keeps only its
/// place. What remains strictly increases from the oldest group to the
/// newest, so the first group holding anything after a waiting reservation
/// holds the largest term made after it. A waiting reservation whose moment
/// has passed can no longer be given back: its group merges with the next.
/// A request that finds the limiter idle beyond its burst starts a term
/// above all others, and the ledger empties. It holds one group per
/// reservation still waiting, and none once they have all gone.
///
/// A give-back may move the ticket behind `now`: the state then reads as
/// idle since then (stored permits, up to the burst), as the limiter that
/// never made the reservation would.
///
/// # Erring late, never early
///
/// Where the ledger does not know, it errs towards limiting: a reservation
/// it has no group for (more than [`Ledger::CAPACITY`] waiting at once, a
/// rate change since, or one made without the ledger) moves back only the
/// groups made before its own place, which may be nothing at all; offsets
/// are rounded down to whole microseconds. A warming-up limiter's terms
/// count no burst. So a caller is never scheduled before the limiter that
/// never made the cancelled reservations would schedule it, and with no
/// more than [`Ledger::CAPACITY`] reservations waiting, a bursty limiter
/// ends where that limiter would, to the microsecond.
///
/// # Use
///
/// Every change to the state goes through the ledger while it is in use:
/// [`reserve`](Ledger::reserve), [`reserve_recorded`](Ledger::reserve_recorded),
/// [`give_back`](Ledger::give_back); anything else that changes the state
/// (a rate change) calls [`clear`](Ledger::clear). A reservation whose
/// permits are kept without waiting for them through it (a committed
/// reservation) is [`keep`](Ledger::keep)-ed, so that the ledger holds only
/// what may still be given back.
///
/// ```
/// use paceline::core::{Bursty, Ledger, Policy, State};
///
/// // 1 permit per second, a one-second burst, created at t = 0.
/// let mut state = State::new(Policy::Bursty(Bursty::default()), 1.0, 0).unwrap();
/// let mut ledger = Ledger::new();
/// const S: u64 = 1_000_000;
/// ledger.reserve(&mut state, 1, 0); // goes at once
/// let a = ledger.reserve_recorded(&mut state, 3600, 0); // waits 1 s, holds an hour
/// let b = ledger.reserve_recorded(&mut state, 3600, 0); // waits until 3601 s
/// ledger.give_back(&mut state, &a, S / 2); // A gives up: B keeps its slot
/// // Half an hour later a limiter that never made A and B is idle: S would
/// // go at once on its stored permit. Here S and ten more wait behind B.
/// assert_eq!(ledger.reserve(&mut state, 1, 1800 * S), 3601 * S);
/// for _ in 0..10 {
///     ledger.reserve(&mut state, 1, 1800 * S);
/// }
/// ledger.give_back(&mut state, &b, 1801 * S); // B gives up too
/// // The next caller goes where that limiter would send it: after S
/// // (1800 s) and the ten (1800 s to 1809 s).
/// assert_eq!(ledger.reserve(&mut state, 1, 1801 * S), 1810 * S);
/// // Moving the ticket back by B's whole charge would have sent it at
/// // 1801 s, nine seconds early: the idle time that limiter dropped.
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// Closed groups, oldest first, each ending at a reservation still
    /// waiting. Offsets strictly increase.
    groups: Vec<Group>,
    /// The offset of the open group (the terms since the last closed
    /// group); [`EMPTY`] when it has none.
    open: u64,
    /// The id the next waiting reservation gets.
    next_id: u64,
    /// No group's moment lies before this (it may lie before the earliest
    /// one): until `now` reaches it, nothing expires.
    earliest: u64,
    /// Whether the groups' moments rise from the oldest to the newest (as
    /// they do until a give-back lets a new reservation in before one that
    /// waits): the passed ones are then the first.
    in_order: bool,
    /// The most groups kept (see [`Ledger::with_capacity`]).
    capacity: usize,
}

/// One group of terms, ending at a waiting reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    /// The waiting reservation that ends it.
    id: u64,
    /// Its moment: once `now` reaches it, it can no longer be given back.
    moment: u64,
    /// How far below `tat` the group's largest term lies, in whole µs
    /// (rounded down); [`EMPTY`] once a later group's terms reach it (it
    /// can never be the largest again).
    offset: u64,
}

/// The offset of a group with no terms.
const EMPTY: u64 = u64::MAX;

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new()
    }
}

impl Ledger {
    /// The most groups kept. Beyond that, the two newest merge: the
    /// reservation between them is then given back conservatively (see [`Ledger`]).
    pub const CAPACITY: usize = 1024;

    /// The most groups the one-limit Redis script kept in a key's value: a
    /// ledger of this capacity was its counterpart in Rust.
    pub const SHARED_CAPACITY: usize = 64;

    /// An empty ledger, for a state nothing has been reserved on yet (or
    /// whose waiting reservations will never be given back through it).
    pub fn new() -> Self {
        Ledger::with_capacity(Self::CAPACITY)
    }

    /// An empty ledger that keeps at most `capacity` groups (at least 1)
    /// instead of [`Ledger::CAPACITY`]: past it, the two newest merge. The
    /// limiter shared through Redis keeps its ledger in the key's value,
    /// where every group costs the server time, and so keeps fewer
    /// ([`Ledger::SHARED_CAPACITY`]).
    pub fn with_capacity(capacity: usize) -> Self {
        Ledger {
            groups: Vec::new(),
            open: 0,
            next_id: 0,
            earliest: u64::MAX,
            in_order: true,
            capacity: capacity.max(1),
        }
    }

    /// Whether no reservation is waiting in the ledger: then the state
    /// alone holds everything, and reservations made on it without the
    /// ledger lose nothing (until one has to wait and may be given back).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// How many groups (waiting reservations) the ledger holds.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Forgets every group, e.g. at a rate change: reservations made before
    /// it give back only when they are the latest. Never schedules anyone
    /// earlier.
    pub fn clear(&mut self) {
        self.groups.clear();
        self.open = 0;
        self.earliest = u64::MAX;
        self.in_order = true;
    }

    /// [`State::reserve_earliest_available`] on `state`, noted in the
    /// ledger: returns the moment.
    pub fn reserve(&mut self, state: &mut State, permits: u32, now_micros: u64) -> u64 {
        self.note(state, now_micros);
        state.reserve_earliest_available(permits, now_micros)
    }

    /// [`State::try_reserve`] on `state`, noted in the ledger: the wait, or
    /// `None` (and no change) if it does not fit in `timeout_micros`.
    pub fn try_reserve(
        &mut self,
        state: &mut State,
        permits: u32,
        now_micros: u64,
        timeout_micros: u64,
    ) -> Option<u64> {
        state.can_acquire(now_micros, timeout_micros).then(|| {
            self.reserve(state, permits, now_micros)
                .saturating_sub(now_micros)
        })
    }

    /// [`State::reserve_recorded`] on `state`, noted in the ledger. A
    /// reservation that has to wait gets a group of its own
    /// ([`Reserved::waiting_id`]), under which
    /// [`give_back`](Ledger::give_back) finds it.
    pub fn reserve_recorded(
        &mut self,
        state: &mut State,
        permits: u32,
        now_micros: u64,
    ) -> Reserved {
        self.note(state, now_micros);
        let mut reserved = state.reserve_recorded(permits, now_micros);
        if reserved.moment_micros > now_micros {
            let id = self.next_id;
            self.next_id += 1;
            self.in_order = match self.groups.last() {
                Some(last) => self.in_order && last.moment <= reserved.moment_micros,
                None => true,
            };
            self.groups.push(Group {
                id,
                moment: reserved.moment_micros,
                offset: self.open,
            });
            self.open = EMPTY;
            self.earliest = self.earliest.min(reserved.moment_micros);
            if self.groups.len() > self.capacity {
                // The two newest merge: the reservation between them loses
                // its group, and gives back only what is before it.
                let older = self.groups.remove(self.capacity - 1);
                let newer = &mut self.groups[self.capacity - 1];
                newer.offset = newer.offset.min(older.offset);
            }
            reserved.waiting_id = Some(id);
        }
        reserved
    }

    /// Gives back `taken`, recorded by
    /// [`reserve_recorded`](Ledger::reserve_recorded) on this ledger and
    /// state, at `now_micros`.
    ///
    /// * The latest reservation is undone exactly, as by
    ///   [`State::give_back`] (even once its moment has passed):
    ///   [`GiveBack::Restored`].
    /// * One whose moment has passed, or that spent stored permits, gives
    ///   nothing back: [`GiveBack::Nothing`].
    /// * Any other moves the ticket back by its charge, but not below the
    ///   largest term of the requests made after it: [`GiveBack::Returned`]
    ///   with how far it moved (possibly 0). Unlike
    ///   [`State::return_charge`], it may move the ticket behind `now`: the
    ///   state then reads as idle since then (stored permits, up to the
    ///   burst), exactly as the limiter that never made the reservation.
    ///
    /// Call it at most once per reservation.
    pub fn give_back(&mut self, state: &mut State, taken: &Reserved, now_micros: u64) -> GiveBack {
        // The latest: nothing since (the state alone can match by chance,
        // after other reservations and give-backs that cancel out). Undone
        // even once its moment has passed, as by the state alone.
        let latest = state.is_latest(taken)
            && match taken.waiting_id {
                Some(id) => self.open == EMPTY && self.groups.last().is_some_and(|g| g.id == id),
                None => self.groups.is_empty(),
            };
        if latest {
            state.give_back(taken, now_micros);
            if taken.waiting_id.is_some() {
                // Its group's terms lost the charge, as `tat` did: offsets
                // unchanged.
                let group = self.groups.pop().expect("just seen");
                self.open = group.offset;
                if self.groups.is_empty() {
                    self.clear();
                }
            }
            return GiveBack::Restored;
        }
        self.expire(now_micros);
        if now_micros >= taken.moment_micros || taken.spent_stored {
            return GiveBack::Nothing;
        }
        // The groups up to its own lose its charge; the others keep theirs.
        // Without a group of its own (merged at capacity), the group holding
        // it keeps everything: erring late.
        let (losing, own) = match taken.waiting_id {
            Some(id) => match self.groups.iter().position(|g| g.id == id) {
                Some(index) => (index + 1, true),
                None => (self.groups.partition_point(|g| g.id < id), false),
            },
            None => (0, false),
        };
        let charge = taken.charge_micros();
        // The new `tat`, as how far below the old one: the largest of what
        // every group holds after the give-back.
        let lost = self.groups[..losing]
            .iter()
            .map(|g| g.offset)
            .min()
            .filter(|offset| *offset != EMPTY)
            .map_or(EMPTY, |offset| offset + charge);
        let kept = self.groups[losing..]
            .iter()
            .map(|g| g.offset)
            .fold(self.open, u64::min);
        let moved = lost.min(kept).min(state.next_free_micros);
        // Possibly into the past: the state then reads as idle since then,
        // as the limiter that never made the reservation would.
        state.next_free_micros -= moved;
        for group in &mut self.groups[..losing] {
            if group.offset != EMPTY {
                // Capped at 2^53 (a term read higher: later, never earlier),
                // so that every offset is exact in an f64, as in the script.
                group.offset = (group.offset + charge - moved).min(MAX_MICROS);
            }
        }
        for group in &mut self.groups[losing..] {
            if group.offset != EMPTY {
                group.offset -= moved;
            }
        }
        if self.open != EMPTY {
            self.open -= moved;
        }
        if own {
            // Its group's terms join the next group. (Its own term, less
            // the charge, lies below the next request's: harmless.)
            let group = self.groups.remove(losing - 1);
            match self.groups.get_mut(losing - 1) {
                Some(next) => next.offset = next.offset.min(group.offset),
                None => self.open = self.open.min(group.offset),
            }
        }
        self.prune();
        if self.groups.is_empty() {
            self.clear();
        }
        GiveBack::Returned(moved)
    }

    /// Forgets the group of `taken`, a reservation recorded on this ledger
    /// that will never be given back (its permits were kept without
    /// waiting for them here). Its group's terms join the next group: no
    /// give-back moves the two apart any more, so nothing is lost, and the
    /// ledger stays as small as the reservations that may still be given
    /// back.
    ///
    /// ```
    /// use paceline::core::{Bursty, Ledger, Policy, State};
    ///
    /// let mut state = State::new(Policy::Bursty(Bursty::default()), 10.0, 0).unwrap();
    /// let mut ledger = Ledger::new();
    /// ledger.reserve(&mut state, 1, 0);
    /// let kept = ledger.reserve_recorded(&mut state, 1, 0); // waits 100 ms
    /// assert_eq!(ledger.len(), 1);
    /// ledger.keep(&kept);
    /// assert!(ledger.is_empty());
    /// ```
    pub fn keep(&mut self, taken: &Reserved) {
        let Some(id) = taken.waiting_id else {
            return;
        };
        let Ok(index) = self.groups.binary_search_by_key(&id, |g| g.id) else {
            return;
        };
        let group = self.groups.remove(index);
        match self.groups.get_mut(index) {
            Some(next) => next.offset = next.offset.min(group.offset),
            None => self.open = self.open.min(group.offset),
        }
        if self.groups.is_empty() {
            self.clear();
        }
    }

    /// Notes a request at `now_micros` on `state`, before it changes the
    /// state: its term joins the open group. [`reserve`](Ledger::reserve)
    /// and [`reserve_recorded`](Ledger::reserve_recorded) call it; call it
    /// yourself before a change that adds to the ticket (or drops stored
    /// permits) and will never be given back, such as a debt carried over
    /// from elsewhere: the reservations waiting keep their groups, and give
    /// back what they would have before it.
    pub fn note(&mut self, state: &State, now_micros: u64) {
        self.expire(now_micros);
        if self.groups.is_empty() {
            // Everything is one group, holding `tat` itself.
            self.open = 0;
            return;
        }
        let slack = slack_micros(state, now_micros);
        if slack < 0.0 {
            // Idle beyond the burst: this term is above every other.
            self.clear();
            return;
        }
        // Rounded down: a term never reads lower than it is.
        let term = if slack < MAX_MICROS as f64 {
            slack as u64
        } else {
            MAX_MICROS
        };
        self.open = self.open.min(term);
        // Only the newest groups can be reached: from the back, up to the
        // first that lies above the open group.
        for group in self.groups.iter_mut().rev() {
            if group.offset == EMPTY {
                continue;
            }
            if group.offset < self.open {
                break;
            }
            group.offset = EMPTY;
        }
    }

    /// Merges the groups of reservations whose moment has passed at
    /// `now_micros` (they can no longer be given back) into the group after
    /// them. Every other operation does it first; changes nothing a caller
    /// can see.
    pub fn expire(&mut self, now_micros: u64) {
        if now_micros < self.earliest {
            return;
        }
        // Each passed group's terms join the next group still waiting (or
        // the open one). That keeps the offsets increasing: no prune.
        let carried = if self.in_order {
            // Moments rise with the groups: the passed ones come first.
            let passed = self.groups.partition_point(|g| g.moment <= now_micros);
            let carried = self.groups[..passed]
                .iter()
                .map(|g| g.offset)
                .fold(EMPTY, u64::min);
            self.groups.drain(..passed);
            if let Some(next) = self.groups.first_mut() {
                next.offset = next.offset.min(carried);
                self.earliest = next.moment;
                return;
            }
            carried
        } else {
            let (mut kept, mut carried, mut earliest) = (0, EMPTY, u64::MAX);
            for index in 0..self.groups.len() {
                let group = self.groups[index];
                if group.moment <= now_micros {
                    carried = carried.min(group.offset);
                } else {
                    self.groups[kept] = Group {
                        offset: group.offset.min(carried),
                        ..group
                    };
                    kept += 1;
                    carried = EMPTY;
                    earliest = earliest.min(group.moment);
                }
            }
            self.groups.truncate(kept);
            self.earliest = earliest;
            carried
        };
        if self.groups.is_empty() {
            self.clear();
        } else {
            self.open = self.open.min(carried);
        }
    }

    /// Empties every group that a later group reaches or exceeds: it can
    /// never be the largest again (later groups lose at most what earlier
    /// ones lose). Its reservation keeps its place. What remains strictly
    /// increases, so the first group holding anything after a reservation
    /// holds the largest term made after it.
    fn prune(&mut self) {
        let mut later = self.open;
        for group in self.groups.iter_mut().rev() {
            if group.offset >= later {
                group.offset = EMPTY;
            } else {
                later = group.offset;
            }
        }
    }
}

/// How far `tat` lies above `now − burst`, in µs, before the request at
/// `now_micros` resyncs: negative when the request finds the limiter idle
/// beyond its burst. A warming-up limiter counts no burst (its stored
/// permits are not free), so its terms read higher, never lower.
fn slack_micros(state: &State, now_micros: u64) -> f64 {
    let ticket =
        state.next_free_micros as f64 + f64::from(state.next_free_fraction) / FRACTION_ONE as f64;
    let room = match state.policy {
        Policy::Bursty(_) => {
            (state.max_permits - state.stored_permits) * state.stable_interval_micros
        }
        Policy::WarmingUp(_) => 0.0,
    };
    ticket - now_micros as f64 + room
}
