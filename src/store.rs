//! What every limiter is under its public type: a [`Store`] of limiter
//! state, for one key or many, and the user-facing methods written once over
//! it.
//!
//! A store reserves (with what it took, so that a dropped
//! [`Reservation`] gives it back), answers how long a request would wait,
//! and changes the rate. The in-process stores answer at once (their futures
//! are ready when made); the Redis store makes a round trip or serves from
//! its fallback. A limiter with no key is the case `Q = NoKey` of a keyed
//! one.
//!
//! The public limiters forward to the methods here, so each of them has one
//! body: [`reserve`](Store::reserve), [`try_reserve`](Store::try_reserve),
//! [`reservation`](Store::reservation),
//! [`try_reservation`](Store::try_reservation), [`acquire`](Store::acquire),
//! [`try_acquire`](Store::try_acquire),
//! [`acquire_blocking`](Store::acquire_blocking),
//! [`try_acquire_blocking`](Store::try_acquire_blocking),
//! [`available_in`](Store::available_in) and [`snapshot`](Store::snapshot). The in-process limiters offer the
//! ones that do not sleep as plain functions too, through [`Now`]. The
//! [`Limiter`](crate::Limiter) and [`KeyedLimiter`](crate::KeyedLimiter)
//! traits are implemented once, for every type that is [`Direct`] or
//! [`Keyed`].

use std::fmt::{self, Display};
use std::future::Future;

use std::time::Duration;

use crate::clock::Clock;
use crate::error::check_permits;
use crate::metrics::{self, Metrics};
use crate::reservation::wait_if_granted;
use crate::{Error, Reservation, Snapshot};

/// The key of a limiter with one state: a limiter with no key is a keyed
/// limiter over this one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NoKey;

impl Display for NoKey {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

/// What a store has whatever the key: its rate and its clock.
pub trait Rate: Send + Sync {
    /// Changes the rate of every key.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate, in permits per second.
    fn rate(&self) -> f64;

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// Sleeps the calling thread for `wait` (a blocking acquire).
    fn sleep_blocking(&self, wait: Duration) {
        self.clock().sleep_blocking(wait);
    }

    /// What the methods here record grants and refusals in.
    fn metrics(&self) -> &Metrics {
        &metrics::NONE
    }
}

/// Where a limiter's state lives, for keys borrowed as `Q`.
///
/// A store never sees zero permits: the methods check them first.
pub trait Store<Q: ?Sized + Sync>: Rate {
    /// Reserves `permits` of `key` if the wait fits in `timeout` (`None`:
    /// whatever it is); `None` if refused, with nothing reserved. A `held`
    /// reservation gives its permits back if dropped before its wait has
    /// passed; one that is not is the caller's at once.
    fn take(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
        held: bool,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send;

    /// [`take`](Self::take), not held: the wait, or `None` if refused.
    /// Its own method, so that the in-process stores' plain reservations
    /// (their fast path) never build a [`Reservation`].
    fn take_wait(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;

    /// [`take_wait`](Self::take_wait) from a thread that may block.
    fn take_blocking(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<Duration>, Error>;

    /// How long a request of `key` made now would wait.
    fn next_free(&self, key: &Q) -> impl Future<Output = Result<Duration, Error>> + Send;

    /// What `key` holds now, read without reserving.
    fn snapshot(&self, key: &Q) -> impl Future<Output = Result<Snapshot, Error>> + Send;

    /// [`snapshot`](Self::snapshot) without I/O; `None` if the store
    /// cannot tell without a round trip.
    fn snapshot_if_local(&self, key: &Q) -> Option<Snapshot> {
        let _ = key;
        None
    }

    /// Takes `permits` if they are free now, without I/O (see
    /// [`Limiter::take_if_free`](crate::Limiter::take_if_free)); `None` if
    /// the store cannot tell without a round trip.
    fn take_if_free(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        let _ = (key, permits);
        None
    }

    // The provided methods are `async` blocks rather than future
    // combinators: a block is created small and builds the store's future
    // in place when first polled, where a combinator moves the whole
    // (large, for Redis) future at each layer.

    /// Reserves `permits` of `key` now; the wait before they may be used.
    /// Nothing gives them back.
    fn reserve(
        &self,
        key: &Q,
        permits: u32,
    ) -> impl Future<Output = Result<Duration, Error>> + Send {
        async move {
            check_permits(permits)?;
            let wait = self
                .take_wait(key, permits, None)
                .await?
                .unwrap_or_default();
            self.metrics().granted(wait);
            Ok(wait)
        }
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise.
    fn try_reserve(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Duration>, Error>> + Send {
        async move {
            check_permits(permits)?;
            let wait = self.take_wait(key, permits, Some(timeout)).await?;
            self.metrics().tried(wait);
            Ok(wait)
        }
    }

    /// Reserves `permits` of `key` as a reservation that gives them back if
    /// dropped.
    fn reservation(
        &self,
        key: &Q,
        permits: u32,
    ) -> impl Future<Output = Result<Reservation<'_>, Error>> + Send {
        async move {
            check_permits(permits)?;
            let taken = self.take(key, permits, None, true).await?;
            let reservation =
                taken.unwrap_or_else(|| Reservation::new(Duration::ZERO, self.clock(), None));
            self.metrics().granted(reservation.delay());
            Ok(reservation)
        }
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`.
    fn try_reservation(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        async move {
            check_permits(permits)?;
            let taken = self.take(key, permits, Some(timeout), true).await?;
            self.metrics().tried(taken.as_ref().map(Reservation::delay));
            Ok(taken)
        }
    }

    /// Reserves `permits` of `key` and sleeps for the wait; the time slept.
    /// Dropped, it gives back what it took.
    fn acquire(
        &self,
        key: &Q,
        permits: u32,
    ) -> impl Future<Output = Result<Duration, Error>> + Send {
        async move {
            check_permits(permits)?;
            match self.take(key, permits, None, true).await? {
                Some(reservation) => {
                    self.metrics().granted(reservation.delay());
                    Ok(reservation.wait().await)
                }
                None => {
                    self.metrics().granted(Duration::ZERO);
                    Ok(Duration::ZERO)
                }
            }
        }
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false`
    /// at once, reserving nothing, otherwise.
    fn try_acquire(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        async move {
            check_permits(permits)?;
            let taken = self.take(key, permits, Some(timeout), true).await?;
            self.metrics().tried(taken.as_ref().map(Reservation::delay));
            Ok(wait_if_granted(taken).await)
        }
    }

    /// [`acquire`](Self::acquire) on the calling thread.
    fn acquire_blocking(&self, key: &Q, permits: u32) -> Result<Duration, Error> {
        check_permits(permits)?;
        let wait = self.take_blocking(key, permits, None)?.unwrap_or_default();
        self.metrics().granted(wait);
        if !wait.is_zero() {
            self.sleep_blocking(wait);
        }
        Ok(wait)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    fn try_acquire_blocking(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error> {
        check_permits(permits)?;
        let taken = self.take_blocking(key, permits, Some(timeout))?;
        self.metrics().tried(taken);
        match taken {
            Some(wait) => {
                if !wait.is_zero() {
                    self.sleep_blocking(wait);
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// How long a request of `key` made now would wait; reserves nothing.
    #[inline(always)]
    fn available_in(&self, key: &Q) -> impl Future<Output = Result<Duration, Error>> + Send {
        self.next_free(key)
    }
}

/// A limiter with no key, and its store: it is a [`Limiter`](crate::Limiter).
pub trait Direct: Send + Sync {
    /// The store.
    #[doc(hidden)]
    type Store: Store<NoKey> + 'static;
    /// The store.
    #[doc(hidden)]
    fn store(&self) -> &Self::Store;
}

/// A limiter with keys `K`, and its store: it is a
/// [`KeyedLimiter<K>`](crate::KeyedLimiter).
pub trait Keyed<K: Sync>: Send + Sync {
    /// The store.
    #[doc(hidden)]
    type Store: Store<K> + 'static;
    /// The store.
    #[doc(hidden)]
    fn store(&self) -> &Self::Store;
}

/// A store that answers at once, in this process: the methods that do not
/// sleep are plain functions on it, with the same bodies as
/// [`Store`]'s, minus the `await`.
pub trait Now<Q: ?Sized + Sync>: Rate {
    /// [`Store::take_wait`], at once.
    fn take_wait_now(&self, key: &Q, permits: u32, timeout: Option<Duration>) -> Option<Duration>;

    /// [`Store::take`], held, at once.
    fn take_now(&self, key: &Q, permits: u32, timeout: Option<Duration>)
    -> Option<Reservation<'_>>;

    /// [`Store::next_free`], at once.
    fn next_free_now(&self, key: &Q) -> Duration;

    /// [`Store::snapshot`], at once.
    fn snapshot_now(&self, key: &Q) -> Snapshot;

    /// [`Store::take_if_free`].
    fn take_if_free_now(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        let _ = (key, permits);
        None
    }

    /// [`Store::reserve`], at once.
    #[inline(always)]
    fn reserve_now(&self, key: &Q, permits: u32) -> Result<Duration, Error> {
        check_permits(permits)?;
        let wait = self.take_wait_now(key, permits, None).unwrap_or_default();
        self.metrics().granted(wait);
        Ok(wait)
    }

    /// [`Store::try_reserve`], at once.
    #[inline(always)]
    fn try_reserve_now(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        check_permits(permits)?;
        let wait = self.take_wait_now(key, permits, Some(timeout));
        self.metrics().tried(wait);
        Ok(wait)
    }

    /// [`Store::reservation`], at once.
    #[inline]
    fn reservation_now(&self, key: &Q, permits: u32) -> Result<Reservation<'_>, Error> {
        check_permits(permits)?;
        let taken = self.take_now(key, permits, None);
        let reservation =
            taken.unwrap_or_else(|| Reservation::new(Duration::ZERO, self.clock(), None));
        self.metrics().granted(reservation.delay());
        Ok(reservation)
    }

    /// [`Store::try_reservation`], at once.
    #[inline]
    fn try_reservation_now(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        check_permits(permits)?;
        let taken = self.take_now(key, permits, Some(timeout));
        self.metrics().tried(taken.as_ref().map(Reservation::delay));
        Ok(taken)
    }
}

/// Implements [`Store`] for an in-process store from its [`Now`]: its
/// futures are ready when made. (A macro rather than a blanket impl, which
/// would overlap the Redis store's.)
macro_rules! in_process_store {
    (impl<$($gen:ident),*> for $ty:ty, key $q:ty, where $($bounds:tt)*) => {
        impl<$($gen),*> $crate::store::Store<$q> for $ty
        where
            $($bounds)*
        {
    #[inline]
    fn take(
        &self,
        key: &$q,
        permits: u32,
        timeout: Option<::std::time::Duration>,
        held: bool,
    ) -> impl ::std::future::Future<Output = Result<Option<$crate::Reservation<'_>>, $crate::Error>> + Send {
        ::std::future::ready(Ok(if held {
            $crate::store::Now::take_now(self, key, permits, timeout)
        } else {
            $crate::store::Now::take_wait_now(self, key, permits, timeout)
                .map(|wait| Reservation::new(wait, $crate::store::Rate::clock(self), None))
        }))
    }

    #[inline]
    fn take_wait(
        &self,
        key: &$q,
        permits: u32,
        timeout: Option<::std::time::Duration>,
    ) -> impl ::std::future::Future<Output = Result<Option<::std::time::Duration>, $crate::Error>> + Send {
        ::std::future::ready(Ok($crate::store::Now::take_wait_now(self, key, permits, timeout)))
    }

    fn take_blocking(
        &self,
        key: &$q,
        permits: u32,
        timeout: Option<::std::time::Duration>,
    ) -> Result<Option<::std::time::Duration>, $crate::Error> {
        Ok($crate::store::Now::take_wait_now(self, key, permits, timeout))
    }

    fn next_free(&self, key: &$q) -> impl ::std::future::Future<Output = Result<::std::time::Duration, $crate::Error>> + Send {
        ::std::future::ready(Ok($crate::store::Now::next_free_now(self, key)))
    }

    fn take_if_free(&self, key: &$q, permits: u32) -> Option<Result<bool, $crate::Error>> {
        let taken = $crate::store::Now::take_if_free_now(self, key, permits);
        // Taken: a grant with no wait. Not free: the caller reserves next,
        // which counts.
        if let Some(Ok(true)) = taken {
            $crate::store::Rate::metrics(self).granted(::std::time::Duration::ZERO);
        }
        taken
    }

    fn snapshot(&self, key: &$q) -> impl ::std::future::Future<Output = Result<$crate::Snapshot, $crate::Error>> + Send {
        ::std::future::ready(Ok($crate::store::Now::snapshot_now(self, key)))
    }

    fn snapshot_if_local(&self, key: &$q) -> Option<$crate::Snapshot> {
        Some($crate::store::Now::snapshot_now(self, key))
    }
}
    };
}

pub(crate) use in_process_store;
