//! [`KeyedRateLimiter`]'s methods, each written once for every store.

use std::borrow::Borrow;
use std::time::Duration;

use super::{Key, KeyedRateLimiter, Store};
use crate::builder::Builder;
use crate::clock::Clock;
use crate::outbound::{Call, TakeSlot};
use crate::store::{self, Engine};
use crate::{Cost, Error, Reservation, Snapshot};

/// # Constructors
impl<K: Key> KeyedRateLimiter<K> {
    /// A bursty limiter per key at `permits_per_second`, with the default
    /// burst (one second's worth), on the system clock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn bursty(permits_per_second: f64) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .build()
    }

    /// A builder for every other option: burst, warm-up, several limits,
    /// a cap on the keys held, the clock, and the store (`.redis(..)` to
    /// share it).
    pub fn builder() -> Builder<crate::PerKey<K>> {
        Builder::new()
    }
}

/// # Reserving and waiting
///
/// What each method does is said on [`KeyedLimiter`](crate::KeyedLimiter)
/// for one key; a key is looked up by any `&Q` it borrows as (through
/// Redis, its `Display` text names it there). Those that never sleep answer
/// in the store's way ([`Store::Answer`]): the value itself in this process,
/// a future through Redis. Give-backs are exact, key by key; cancel safety:
/// see the crate's [table](crate#cancel-safety).
///
/// # Errors
/// [`Error::InvalidArgument`] if `permits` is 0; a Redis limiter's
/// [`Error::Backend`] (see [`redis`](crate::redis)).
impl<K: Key, S: Store, C: Clock> KeyedRateLimiter<K, S, C> {
    /// Reserves `permits` of `key`; the wait before they may be used.
    /// Does not sleep; nothing gives the permits back.
    #[inline(always)]
    pub fn reserve<'a, Q>(
        &'a self,
        key: &'a Q,
        permits: u32,
    ) -> S::Answer<'a, Result<Duration, Error>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        S::answer(store::reserve(&self.engine, key, permits))
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise. Does not sleep.
    #[inline(always)]
    pub fn try_reserve<'a, Q>(
        &'a self,
        key: &'a Q,
        permits: u32,
        timeout: Duration,
    ) -> S::Answer<'a, Result<Option<Duration>, Error>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        S::answer(store::try_reserve(&self.engine, key, permits, timeout))
    }

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    pub fn reservation<'a, 'k, Q>(
        &'a self,
        key: &'k Q,
        permits: u32,
    ) -> S::Answer<'k, Result<Reservation<'a>, Error>>
    where
        'a: 'k,
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        S::answer(store::reservation(&self.engine, key, permits))
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    pub fn try_reservation<'a, 'k, Q>(
        &'a self,
        key: &'k Q,
        permits: u32,
        timeout: Duration,
    ) -> S::Answer<'k, Result<Option<Reservation<'a>>, Error>>
    where
        'a: 'k,
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        S::answer(store::try_reservation(
            &self.engine,
            key,
            permits,
            Some(timeout),
        ))
    }

    /// What `key` holds now, read without reserving (see [`Snapshot`]): a
    /// key not held reads as a new key starts, full.
    pub fn snapshot<'a, Q>(&'a self, key: &'a Q) -> S::Answer<'a, Result<Snapshot, Error>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        S::answer(self.engine.snapshot(key))
    }

    /// Reserves `permits` of `key` and sleeps until they may be used; the
    /// time slept; behind the pause of a refusal the key learned while it
    /// waited, as [`RateLimiter::acquire`](crate::RateLimiter::acquire).
    /// Cancel-safe: dropped, it gives the permits back.
    pub async fn acquire<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        store::acquire(&self.engine, key, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise; `false` later if a refusal
    /// learned while it waited pauses the limiter past `timeout` (see
    /// [`outbound`](crate::outbound)). Cancel-safe as `acquire`.
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        store::try_acquire(&self.engine, key, permits, timeout).await
    }

    /// Reserves `estimate` of `key` for a call to an upstream, sleeps until it
    /// may go, and returns the [`Call`], to settle and learn from once its
    /// answer is back: [`RateLimiter::call`](crate::RateLimiter::call) for one
    /// key (one key per upstream, say), what it learns learned by that key
    /// alone. Cancel-safe: dropped before it returns, it gives the estimate
    /// back.
    ///
    /// A key idle long enough to read as full is forgotten, and with it
    /// what it learned: it starts again at the configured rates.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `estimate` counts nothing, or counts
    /// for a limit the limiter lacks; a Redis limiter's [`Error::Backend`].
    pub async fn call<Q>(&self, key: &Q, estimate: impl Into<Cost>) -> Result<Call<'_>, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
        S::KeyedSlots<K, C>: TakeSlot<Q>,
    {
        let call = self.call_for(key, estimate.into(), None).await?;
        Ok(call.expect("a call without a timeout is never refused"))
    }

    /// [`call`](Self::call) if the wait fits in `timeout`; `None` at once,
    /// reserving nothing, otherwise; `None` later if a refusal learned
    /// while it waited pauses the limiter past `timeout` (see
    /// [`outbound`](crate::outbound)). Cancel-safe as `call`.
    pub async fn try_call<Q>(
        &self,
        key: &Q,
        estimate: impl Into<Cost>,
        timeout: Duration,
    ) -> Result<Option<Call<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
        S::KeyedSlots<K, C>: TakeSlot<Q>,
    {
        self.call_for(key, estimate.into(), Some(timeout)).await
    }

    /// [`acquire`](Self::acquire) on the calling thread, which it blocks.
    pub fn acquire_blocking<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        Ok(store::take_and_sleep(&self.engine, key, permits, None)?.unwrap_or_default())
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    pub fn try_acquire_blocking<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: ?Sized + Sync,
        S::Keyed<K, C>: Engine<Q>,
    {
        Ok(store::take_and_sleep(&self.engine, key, permits, Some(timeout))?.is_some())
    }
}
