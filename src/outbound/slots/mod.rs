//! Slots for calls in flight ([`Limit::concurrent`](crate::Limit::concurrent)):
//! a call takes one before its place in the schedule, and gives it back
//! when it ends.
//!
//! In this process ([`LocalSlots`]) a key's slots are a count of those
//! free and a line of the calls waiting, held in a map only while a call
//! holds one of its slots or waits for one. A slot given back while calls
//! wait is kept for the first in line, which alone is woken, for
//! [`KEPT_FOR`]: a call that gives its slot back and calls again goes behind
//! the waiters, not ahead of them. A waiter that does not take its slot in
//! that time (parked after a poll, forgotten, or not run) loses its turn:
//! the slot is free to the first call that looks, every call in line woken
//! to look (by [`watch`] if no call comes), and the waiter, polled again,
//! takes it if it is still free or joins the line at its end. A waiter
//! woken to look that has not looked a moment later is passed over when a
//! slot is next given back. So calls parked in line, however many, hold up
//! the others about two moments in all, and a slot is never kept for a
//! call that did not look when it was last woken. Through Redis the slots
//! are leases (`redis::leases`), polled for, not kept in line.

mod watch;

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{Either, select};
use tokio::sync::Notify;

use crate::Error;
use crate::clock::Clock;

/// A slot a call holds: given back when dropped. Empty where no slot is
/// needed (no [`Limit::concurrent`](crate::Limit::concurrent), or a
/// fallback that grants everything).
#[derive(Default)]
pub struct Slot<'a> {
    /// Held for its drop.
    _guard: Option<Box<dyn Send + Sync + 'a>>,
}

impl<'a> Slot<'a> {
    /// A slot that `guard`, dropped, gives back.
    pub(crate) fn held(guard: impl Send + Sync + 'a) -> Self {
        Slot {
            _guard: Some(Box::new(guard)),
        }
    }

    /// Whether it holds a slot.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn is_held(&self) -> bool {
        self._guard.is_some()
    }
}

/// A slot taken, and how long its call waited for it.
pub struct Taken<'a> {
    pub(crate) slot: Slot<'a>,
    pub(crate) waited: Duration,
}

impl Taken<'_> {
    /// No slot needed, no wait.
    pub(crate) fn free() -> Self {
        Taken {
            slot: Slot::default(),
            waited: Duration::ZERO,
        }
    }
}

/// How many calls hold a slot in this process.
pub trait InFlight: Send + Sync {
    /// Calls holding a slot now (0 without a concurrent limit).
    fn in_flight(&self) -> usize;
}

/// Where a limiter's slots are, for keys borrowed as `Q`.
pub trait TakeSlot<Q: ?Sized>: InFlight {
    /// Takes a slot of `key`, waiting for one at most `timeout` (`None`:
    /// as long as it takes) on `clock`; `None`, with nothing taken, if
    /// none was free in time. Dropped while it waits, it takes nothing.
    fn take_slot<'s>(
        &'s self,
        key: &Q,
        timeout: Option<Duration>,
        clock: &dyn Clock,
    ) -> impl Future<Output = Result<Option<Taken<'s>>, Error>> + Send;
}

/// The slots of a limiter in this process: per key, `calls` at once. Empty
/// (one word) without a concurrent limit.
pub struct LocalSlots<K>(Option<Arc<Shared<K>>>);

/// What the slots of a limiter with a concurrent limit share.
pub(crate) struct Shared<K> {
    calls: u32,
    /// The keys a call holds a slot of or waits for, no others.
    keys: Mutex<HashMap<K, Entry>>,
    in_flight: AtomicUsize,
    /// The last number given to an entry (see [`Entry::number`]).
    entries: AtomicU64,
}

/// How long a slot given back while calls wait is kept for the one that
/// has waited longest: one that does not take it in that time (parked,
/// forgotten, or not run) loses its turn, and the slot is free to the first
/// call that looks, every call in line woken to look.
const KEPT_FOR: Duration = Duration::from_millis(50);

/// One key's slots: those free to any call, those kept for a waiter, the
/// line of calls waiting, and how many calls hold a slot or wait for one
/// (the entry goes when there are none). While calls wait, a slot given
/// back is kept, not free: one is free then only once it was kept too long.
struct Entry {
    free: u32,
    kept: Vec<Kept>,
    /// The calls waiting, in the order they came; one that gave up stays
    /// until it reaches the front or the line is compacted (see
    /// [`Waiter::waits`]).
    line: VecDeque<Waiter>,
    /// How many in `line` wait.
    lined: usize,
    users: usize,
    /// The last id given to a call or a place in line.
    last_id: u64,
    /// Whether the watch will look at the slots kept here.
    watched: bool,
    /// This entry among those the key has had: the watch's job for an
    /// entry since removed ends, not taking over the key's next one.
    number: u64,
}

/// A place in line: the call's id, and its wake-up.
struct Waiter {
    id: u64,
    place: u64,
    wake: Arc<Wake>,
}

impl Waiter {
    /// Whether its call still waits at this place.
    fn waits(&self) -> bool {
        self.wake.place.load(Ordering::Relaxed) == self.place
    }
}

/// What wakes a waiting call, its place in line (0: none), and when it was
/// woken to look and has not looked since (µs after [`origin`], 0: it has),
/// changed under the key's lock only.
#[derive(Default)]
struct Wake {
    notify: Notify,
    place: AtomicU64,
    woken: AtomicU64,
}

impl Wake {
    /// Wakes the call to look, noting when if it has looked since it was
    /// last woken.
    fn wake(&self, now: Instant) {
        let micros = u64::try_from(now.saturating_duration_since(origin()).as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = self
            .woken
            .compare_exchange(0, micros, Ordering::Relaxed, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Whether the call was woken to look at least [`KEPT_FOR`] before
    /// `now` and has not looked since: parked, forgotten or not run, it is
    /// passed over.
    fn unheeded(&self, now: Instant) -> bool {
        let woken = self.woken.load(Ordering::Relaxed);
        woken != 0 && origin() + Duration::from_micros(woken) + KEPT_FOR <= now
    }
}

/// The instant the calls' wake-ups are counted from.
fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// A slot kept for call `id` until `until`.
struct Kept {
    id: u64,
    until: Instant,
}

impl<K> LocalSlots<K> {
    /// `calls` at once per key; none (no slots at all) for `None`.
    pub(crate) fn new(calls: Option<u32>) -> Self {
        LocalSlots(calls.map(|calls| {
            Arc::new(Shared {
                calls,
                keys: Mutex::new(HashMap::new()),
                in_flight: AtomicUsize::new(0),
                entries: AtomicU64::new(0),
            })
        }))
    }

    /// How many keys hold slot state now (those with a call that holds a
    /// slot or waits for one).
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn keys_held(&self) -> usize {
        self.0.as_ref().map_or(0, |shared| shared.keys().len())
    }
}

impl<K> Shared<K> {
    fn keys(&self) -> MutexGuard<'_, HashMap<K, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Shared<K> {
    /// Counts a call on `key` in (creating its entry if need be), until
    /// the [`User`] is dropped, and takes one of the key's slots if one is
    /// free (none is while calls wait: it then waits behind them).
    fn enter<'s, Q>(self: &'s Arc<Self>, key: &Q) -> User<'s, K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = self.keys();
        let entry = match keys.get_mut(key) {
            Some(entry) => entry,
            None => keys.entry(key.to_owned()).or_insert(Entry {
                free: self.calls,
                kept: Vec::new(),
                line: VecDeque::new(),
                lined: 0,
                users: 0,
                last_id: 0,
                watched: false,
                number: self.entries.fetch_add(1, Ordering::Relaxed) + 1,
            }),
        };
        entry.users += 1;
        entry.last_id += 1;
        let id = entry.last_id;
        entry.expire();
        let holds = entry.take();
        User {
            shared: self,
            key: key.to_owned(),
            id,
            wake: None,
            holds,
        }
    }

    /// Has the watch look at `key`'s kept slots when the first is due, and
    /// again while any is kept.
    fn watch(self: &Arc<Self>, entry: &mut Entry, key: &K) {
        let Some(due) = entry.kept.iter().map(|kept| kept.until).min() else {
            return;
        };
        if entry.watched {
            return;
        }
        let (shared, key, number) = (Arc::downgrade(self), key.clone(), entry.number);
        entry.watched = watch::at(
            due,
            Box::new(move || {
                let shared = shared.upgrade()?;
                let mut keys = shared.keys();
                let entry = keys.get_mut(&key).filter(|entry| entry.number == number)?;
                entry.expire();
                let next = entry.kept.iter().map(|kept| kept.until).min();
                entry.watched = next.is_some();
                next
            }),
        );
    }
}

impl Entry {
    /// Takes a free slot, if one is.
    fn take(&mut self) -> bool {
        let free = self.free > 0;
        self.free -= u32::from(free);
        free
    }

    /// A slot given back (or given up): kept for the call that has waited
    /// longest, which is woken; free if none waits.
    fn give_back(&mut self) {
        while let Some(waiter) = self.line.pop_front() {
            if !waiter.waits() {
                continue;
            }
            let now = Instant::now();
            // Out of line either way: kept for, or passed over for not
            // looking when it was last woken (it joins again when it does).
            waiter.wake.place.store(0, Ordering::Relaxed);
            self.lined -= 1;
            if waiter.wake.unheeded(now) {
                continue;
            }
            self.kept.push(Kept {
                id: waiter.id,
                until: now + KEPT_FOR,
            });
            waiter.wake.wake(now);
            return;
        }
        self.free += 1;
    }

    /// The slots kept too long become free to any call, and every call in
    /// line is woken to look.
    fn expire(&mut self) {
        if self.kept.is_empty() {
            return;
        }
        let now = Instant::now();
        let before = self.kept.len();
        self.kept.retain(|kept| kept.until > now);
        let expired = before - self.kept.len();
        if expired > 0 {
            self.free += expired as u32;
            for waiter in self.line.iter().filter(|waiter| waiter.waits()) {
                waiter.wake.wake(now);
            }
        }
    }

    /// Takes the slot kept for call `id`, if one is (late or not).
    fn claim(&mut self, id: u64) -> bool {
        let found = self.kept.iter().position(|kept| kept.id == id);
        if let Some(at) = found {
            self.kept.swap_remove(at);
        }
        found.is_some()
    }

    /// Call `id` goes to the end of the line, unless it is in it.
    fn join(&mut self, id: u64, wake: &Arc<Wake>) {
        if wake.place.load(Ordering::Relaxed) != 0 {
            return;
        }
        self.last_id += 1;
        let place = self.last_id;
        wake.place.store(place, Ordering::Relaxed);
        self.line.push_back(Waiter {
            id,
            place,
            wake: Arc::clone(wake),
        });
        self.lined += 1;
    }

    /// Call `id` leaves the line, if it is in it (its place stays until it
    /// reaches the front, or the line is compacted: each call leaving costs
    /// the same, however long the line).
    fn leave(&mut self, wake: Option<&Arc<Wake>>) {
        if let Some(wake) = wake
            && wake.place.swap(0, Ordering::Relaxed) != 0
        {
            self.lined -= 1;
            if self.line.len() > 2 * self.lined + 16 {
                self.line.retain(Waiter::waits);
            }
        }
    }
}

/// A call counted on its key's entry (the entry lives while one is), and
/// whether it holds one of the key's slots: given back when it is dropped.
struct User<'s, K: Hash + Eq + Clone + Send + Sync + 'static> {
    shared: &'s Arc<Shared<K>>,
    key: K,
    id: u64,
    /// What wakes it while it waits in line.
    wake: Option<Arc<Wake>>,
    holds: bool,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> User<'_, K> {
    /// Waits at most `timeout` on `clock` for a slot, in line behind the
    /// calls that waited before it, and takes it; `false` if none came in
    /// time.
    async fn wait(&mut self, timeout: Option<Duration>, clock: &dyn Clock) -> bool {
        let mut sleep = match timeout {
            Some(timeout) if timeout.is_zero() => return false,
            // Made only now: a fake clock moves when a sleep is made.
            Some(timeout) => Either::Left(clock.sleep(timeout)),
            None => Either::Right(std::future::pending()),
        };
        let wake = Arc::clone(self.wake.get_or_insert_with(Arc::default));
        loop {
            if self.look() {
                return true;
            }
            match select(pin!(wake.notify.notified()), sleep).await {
                Either::Left(((), rest)) => sleep = rest,
                Either::Right(((), _)) => return self.look(),
            }
        }
    }

    /// Takes the slot kept for this call, even late, or a free one (and
    /// leaves the line); otherwise joins the line if it is not in it (the
    /// first time, or after losing its turn).
    fn look(&mut self) -> bool {
        let mut keys = self.shared.keys();
        let Some(entry) = keys.get_mut(&self.key) else {
            return false;
        };
        if let Some(wake) = &self.wake {
            wake.woken.store(0, Ordering::Relaxed);
        }
        if !entry.claim(self.id) {
            entry.expire();
            if !entry.take() {
                if let Some(wake) = &self.wake {
                    entry.join(self.id, wake);
                }
                return false;
            }
        }
        entry.leave(self.wake.as_ref());
        self.holds = true;
        true
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Drop for User<'_, K> {
    fn drop(&mut self) {
        if self.holds {
            // Before the slot can be taken again, so that the count never
            // reads more than the slots held.
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let mut keys = self.shared.keys();
        let Some(entry) = keys.get_mut(&self.key) else {
            return;
        };
        entry.leave(self.wake.as_ref());
        // Its slot, or one kept for it that it never took, goes on.
        if self.holds || entry.claim(self.id) {
            entry.give_back();
            self.shared.watch(entry, &self.key);
        }
        entry.users = entry.users.saturating_sub(1);
        if entry.users == 0 {
            // Nobody holds a slot or waits for one: every slot is free.
            keys.remove(&self.key);
            if keys.is_empty() {
                *keys = HashMap::new();
            } else if keys.capacity() > 64 && keys.len() * 4 < keys.capacity() {
                let len = keys.len();
                keys.shrink_to(len * 2);
            }
        }
    }
}

impl<K: Send + Sync> InFlight for LocalSlots<K> {
    fn in_flight(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |shared| shared.in_flight.load(Ordering::Relaxed))
    }
}

impl<K, Q> TakeSlot<Q> for LocalSlots<K>
where
    K: Hash + Eq + Clone + Borrow<Q> + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    async fn take_slot<'s>(
        &'s self,
        key: &Q,
        timeout: Option<Duration>,
        clock: &dyn Clock,
    ) -> Result<Option<Taken<'s>>, Error> {
        let Some(shared) = self.0.as_ref() else {
            return Ok(Some(Taken::free()));
        };
        let mut user = shared.enter(key);
        let mut waited = Duration::ZERO;
        if !user.holds {
            let started = clock.now();
            if !user.wait(timeout, clock).await {
                return Ok(None);
            }
            waited = clock.now().saturating_sub(started);
        }
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Taken {
            slot: Slot::held(user),
            waited,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::store::now;

    #[test]
    fn a_key_holds_state_only_while_a_call_holds_or_waits_for_a_slot() {
        let slots = LocalSlots::<u64>::new(Some(2));
        let clock = FakeClock::new();
        let mut held = Vec::new();
        for key in 0..1_000u64 {
            let taken = now(slots.take_slot(&key, Some(Duration::ZERO), &clock));
            held.push(taken.unwrap().unwrap());
        }
        assert_eq!(slots.keys_held(), 1_000);
        assert_eq!(slots.in_flight(), 1_000);
        let capacity = slots.0.as_ref().unwrap().keys().capacity();
        assert!(capacity >= 1_000);
        held.truncate(10);
        assert_eq!(slots.keys_held(), 10);
        assert!(slots.0.as_ref().unwrap().keys().capacity() < capacity / 4);
        held.clear();
        assert_eq!(slots.keys_held(), 0);
        assert_eq!(slots.0.as_ref().unwrap().keys().capacity(), 0);
        assert_eq!(slots.in_flight(), 0);
    }

    #[test]
    fn a_refused_try_takes_nothing_and_moves_the_clock_by_its_timeout() {
        let slots = LocalSlots::<u64>::new(Some(1));
        let clock = FakeClock::new();
        let first = now(slots.take_slot(&7, None, &clock)).unwrap().unwrap();
        assert!(first.slot.is_held());
        let refused = now(slots.take_slot(&7, Some(Duration::from_millis(5)), &clock));
        assert!(refused.unwrap().is_none());
        assert_eq!(clock.now(), Duration::from_millis(5));
        assert_eq!((slots.in_flight(), slots.keys_held()), (1, 1));
        drop(first);
        assert_eq!((slots.in_flight(), slots.keys_held()), (0, 0));
        let no_limit = LocalSlots::<u64>::new(None);
        let free = now(no_limit.take_slot(&7, None, &clock)).unwrap().unwrap();
        assert!(!free.slot.is_held());
    }
}
