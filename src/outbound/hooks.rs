//! What the crate's own tests reach of the slots (feature `internals`, hidden:
//! not part of the API): a slot held without a call (through Redis, before
//! calls are), and the keys holding slot state.

use std::borrow::Borrow;
use std::time::Duration;

use super::TakeSlot;
use crate::clock::Clock;
use crate::limiter::{Key, Store};
use crate::store::{OnlyKey, Rate};
use crate::{Error, KeyedRateLimiter, Local, RateLimiter};

impl<S: Store, C: Clock> RateLimiter<S, C> {
    /// A slot of the limiter's concurrent limit, as a call takes it, waiting
    /// at most `timeout`: held until dropped (`Some(false)` inside without a
    /// concurrent limit, or from a fallback that takes none).
    #[doc(hidden)]
    pub async fn hold_slot(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Option<(bool, impl Send + Sync + '_)>, Error> {
        let taken = self.slots.take_slot(&OnlyKey, timeout, self.engine.clock());
        Ok(taken.await?.map(|taken| (taken.slot.is_held(), taken.slot)))
    }
}

impl<K: Key, S: Store, C: Clock> KeyedRateLimiter<K, S, C> {
    /// [`RateLimiter::hold_slot`] for `key`.
    #[doc(hidden)]
    pub async fn hold_slot<Q>(
        &self,
        key: &Q,
        timeout: Option<Duration>,
    ) -> Result<Option<(bool, impl Send + Sync + '_)>, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Rate,
        S::KeyedSlots<K, C>: TakeSlot<Q>,
    {
        let taken = self.slots.take_slot(key, timeout, self.engine.clock());
        Ok(taken.await?.map(|taken| (taken.slot.is_held(), taken.slot)))
    }
}

impl<K: Key, C: Clock> KeyedRateLimiter<K, Local, C> {
    /// How many keys hold slot state (a call holds a slot or waits for one).
    #[doc(hidden)]
    pub fn slot_keys(&self) -> usize {
        self.slots.keys_held()
    }
}
