//! Rounds of visits over a keyed limiter's shards, so that a shard no call
//! reaches still sweeps.
//!
//! A shard sweeps by time at its own first call once its sweep period has
//! passed, so a shard that gets no calls would keep its idle keys for good.
//! Instead, with no background thread, calls on any shard take turns
//! visiting the others: every [`ROUND`] / *shards* µs, the first call to find
//! a visit due (one relaxed load and a compare) claims it and looks at the
//! next shard in turn, without waiting for its lock (a locked shard is in
//! use, and sweeps at its own calls); that shard sweeps if its period has
//! passed. A call makes one visit at most, and a round visits every shard
//! once, so each is looked at about once per round, at least as often as
//! its sweep period (never shorter) comes due. Missed visits are made up to
//! one round ([`Rounds::claim`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The time a round takes (µs): the least sweep period.
pub(super) const ROUND: u64 = 1_000_000;

/// When the next visit is due, and which shard it looks at.
pub(super) struct Rounds {
    /// When the next visit is due (µs); `u64::MAX` for a map whose shards
    /// do not sweep by time.
    due: AtomicU64,
    /// The shard the next visit looks at (modulo the shards' count).
    next: AtomicUsize,
    /// The time between two visits (µs).
    tick: u64,
    shards: usize,
}

impl Rounds {
    /// Visits over `shards` shards, the first due at `now`; none at all
    /// unless `sweeps` (the shards sweep by time).
    pub(super) fn new(shards: usize, now: u64, sweeps: bool) -> Self {
        Rounds {
            due: AtomicU64::new(if sweeps { now } else { u64::MAX }),
            next: AtomicUsize::new(0),
            tick: (ROUND / shards as u64).max(1),
            shards,
        }
    }

    /// Whether a visit is due at `now`: the check every call makes.
    #[inline]
    pub(super) fn due(&self, now: u64) -> bool {
        now >= self.due.load(Relaxed)
    }

    /// Claims the visit due at `now`: the shard to look at, or `None` if
    /// none is due or another call claimed it first.
    pub(super) fn claim(&self, now: u64) -> Option<usize> {
        let due = self.due.load(Relaxed);
        if now < due {
            return None;
        }
        // After a quiet time, at most `shards` visits are due at `now`, this
        // one included: each shard once, then one per tick again.
        let backlog = self.tick.saturating_mul(self.shards as u64 - 1);
        let next = due
            .max(now.saturating_sub(backlog))
            .saturating_add(self.tick);
        self.due
            .compare_exchange(due, next, Relaxed, Relaxed)
            .ok()?;
        Some(self.next.fetch_add(1, Relaxed) % self.shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_visits_every_shard_once_then_one_per_tick() {
        let rounds = Rounds::new(8, 0, true);
        let tick = ROUND / 8;
        assert!(rounds.due(0));
        assert_eq!(rounds.claim(0), Some(0));
        // Claimed: nothing more until the next tick.
        assert!(!rounds.due(tick - 1));
        assert_eq!(rounds.claim(tick - 1), None);
        assert_eq!(rounds.claim(tick), Some(1));
        // An hour later, every shard once, then one per tick again.
        let later = 3_600 * ROUND;
        let visited: Vec<_> = (0..10).map_while(|_| rounds.claim(later)).collect();
        assert_eq!(visited, [2, 3, 4, 5, 6, 7, 0, 1]);
        assert!(!rounds.due(later + tick - 1));
        assert_eq!(rounds.claim(later + tick), Some(2));
    }

    #[test]
    fn a_map_that_does_not_sweep_by_time_is_never_visited() {
        let rounds = Rounds::new(4, 0, false);
        assert!(!rounds.due(u64::MAX - 1));
        assert_eq!(rounds.claim(u64::MAX - 1), None);
    }
}
