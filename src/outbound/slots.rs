//! Slots for calls in flight ([`Limit::concurrent`](crate::Limit::concurrent)):
//! a call takes one before its place in the schedule, and gives it back
//! when it ends.
//!
//! In this process ([`LocalSlots`]) a key's slots are a count of those
//! free, held in a map only while a call holds one of its slots or waits
//! for one. A slot given back goes back to the count and wakes every call
//! waiting for one of the key's, and the first of them polled takes it:
//! no slot is ever handed to a waiter, so a waiter that is never polled
//! again (parked, or forgotten) holds nothing up. Through Redis they are
//! leases (`redis::leases`), waited for alike.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

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
pub struct LocalSlots<K>(Option<Box<Shared<K>>>);

/// What the slots of a limiter with a concurrent limit share.
pub(crate) struct Shared<K> {
    calls: u32,
    /// The keys a call holds a slot of or waits for, no others.
    keys: Mutex<HashMap<K, Entry>>,
    in_flight: AtomicUsize,
}

/// One key's slots: how many are free, the calls that hold one or wait
/// for one (the entry goes when there are none), and what wakes those
/// waiting when one is given back.
struct Entry {
    free: u32,
    users: usize,
    released: Arc<Notify>,
}

impl<K> LocalSlots<K> {
    /// `calls` at once per key; none (no slots at all) for `None`.
    pub(crate) fn new(calls: Option<u32>) -> Self {
        LocalSlots(calls.map(|calls| {
            Box::new(Shared {
                calls,
                keys: Mutex::new(HashMap::new()),
                in_flight: AtomicUsize::new(0),
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

impl<K: Hash + Eq> Shared<K> {
    /// Counts a call on `key` in (creating its entry if need be), until
    /// the [`User`] is dropped, and takes one of the key's slots if one is
    /// free.
    fn enter<Q>(&self, key: &Q) -> User<'_, K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = self.keys();
        let (released, holds) = match keys.get_mut(key) {
            Some(entry) => {
                entry.users += 1;
                (Arc::clone(&entry.released), entry.take())
            }
            None => {
                let released = Arc::new(Notify::new());
                let mut entry = Entry {
                    free: self.calls,
                    users: 1,
                    released: Arc::clone(&released),
                };
                let holds = entry.take();
                keys.insert(key.to_owned(), entry);
                (released, holds)
            }
        };
        User {
            shared: self,
            key: key.to_owned(),
            released,
            holds,
        }
    }
}

impl Entry {
    /// Takes a slot if one is free.
    fn take(&mut self) -> bool {
        let free = self.free > 0;
        self.free -= u32::from(free);
        free
    }
}

/// A call counted on its key's entry (the entry lives while one is), and
/// whether it holds one of the key's slots: given back when it is dropped.
struct User<'s, K: Hash + Eq> {
    shared: &'s Shared<K>,
    key: K,
    released: Arc<Notify>,
    holds: bool,
}

impl<K: Hash + Eq> User<'_, K> {
    /// Waits at most `timeout` on `clock` for a slot given back, and takes
    /// it; `false` if none was free in time.
    async fn wait(&mut self, timeout: Option<Duration>, clock: &dyn Clock) -> bool {
        let mut sleep = match timeout {
            Some(timeout) if timeout.is_zero() => return false,
            // Made only now: a fake clock moves when a sleep is made.
            Some(timeout) => Either::Left(clock.sleep(timeout)),
            None => Either::Right(std::future::pending()),
        };
        loop {
            let released = self.released.clone();
            let mut released = pin!(released.notified());
            // Woken by any slot given back from here on, then looks.
            released.as_mut().enable();
            if self.try_take() {
                return true;
            }
            match select(released, sleep).await {
                Either::Left(((), rest)) => sleep = rest,
                Either::Right(((), _)) => return self.try_take(),
            }
        }
    }

    /// Takes one of the key's slots if one is free.
    fn try_take(&mut self) -> bool {
        let mut keys = self.shared.keys();
        self.holds = keys.get_mut(&self.key).is_some_and(Entry::take);
        self.holds
    }
}

impl<K: Hash + Eq> Drop for User<'_, K> {
    fn drop(&mut self) {
        let mut keys = self.shared.keys();
        let Some(entry) = keys.get_mut(&self.key) else {
            return;
        };
        entry.free += u32::from(self.holds);
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
        drop(keys);
        if self.holds {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.released.notify_waiters();
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
    K: Hash + Eq + Borrow<Q> + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    async fn take_slot<'s>(
        &'s self,
        key: &Q,
        timeout: Option<Duration>,
        clock: &dyn Clock,
    ) -> Result<Option<Taken<'s>>, Error> {
        let Some(shared) = self.0.as_deref() else {
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
