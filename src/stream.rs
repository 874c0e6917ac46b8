//! Throttling streams: see [`ThrottleExt`].
//!
//! Any [`Stream`] can be paced by a limiter: each item is released only once
//! its permits are due, in the order the stream produced them.
//!
//! ```
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use paceline::RateLimiter;
//! use paceline::stream::ThrottleExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! let limiter = Arc::new(RateLimiter::bursty(1000.0)?); // 1000 items per second
//! let mut requests = futures::stream::iter(["a", "b", "c"]).throttle(limiter);
//! while let Some(request) = requests.next().await {
//!     let request = request?; // the item, released at its turn
//!     // send it
//! #   let _ = request;
//! }
//! # Ok(()) }
//! ```
//!
//! # How an item is released
//!
//! When the inner stream yields an item, the throttled stream works out its
//! permits (one, or what the closure of
//! [`throttle_by`](ThrottleExt::throttle_by) says; an item of 0 is yielded
//! at once, without asking the limiter), acquires them as
//! [`acquire`](crate::Limiter::acquire) does (sleeping on the limiter's
//! [clock](crate::Limiter::clock) until they are due, and behind a pause
//! learned from an upstream meanwhile too); then it yields the item.
//! Only then does it ask the inner stream for the next one, so items keep
//! their order and at most one reservation is in flight per stream.
//!
//! Dropping the stream while an item waits **gives that item's permits
//! back**: later callers are scheduled as if it had never been reserved (an
//! item already yielded has been paid for). A limiter error loses no item:
//! the stream yields a [`ThrottleError`] holding it, hence items of type
//! `Result<Item, ThrottleError<Item>>`.
//!
//! The limiter is anything that dereferences to a [`Limiter`] (or, for
//! [`throttle_keyed`](ThrottleExt::throttle_keyed), a [`KeyedLimiter`]):
//! `Arc<RateLimiter>`, `Arc<dyn Limiter>`, `&RateLimiter`,
//! `Box<dyn Limiter>`, a Redis limiter in an `Arc`. It is moved into the
//! stream; pass a clone of an `Arc` to keep using it elsewhere (its other
//! callers share the rate with the stream).
//!
//! When nothing is owed and the limiter can tell without I/O (the limiters
//! in this process, through `Limiter::take_now` and `KeyedLimiter::take_now`), an
//! item's permits are taken with no future and no timer; otherwise an item
//! costs one boxed future for its wait (the `async` [`Limiter`] methods box
//! theirs too).

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use futures::stream::FusedStream;

use crate::io::Gate;
use crate::{Error, KeyedLimiter, Limiter};

/// Adapters that pace a [`Stream`] with a limiter, implemented for every
/// stream; the [module documentation](self) says how items are released.
pub trait ThrottleExt: Stream {
    /// Paces the stream at one permit per item.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::TryStreamExt;
    /// use paceline::RateLimiter;
    /// use paceline::clock::{Clock, FakeClock};
    /// use paceline::stream::ThrottleExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline::Error> {
    /// let clock = FakeClock::new();
    /// let limiter = RateLimiter::builder()
    ///     .permits_per_second(50.0)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let items: Vec<u32> = futures::stream::iter(0..20)
    ///     .throttle(&limiter)
    ///     .try_collect()
    ///     .await?;
    /// assert_eq!(items, (0..20).collect::<Vec<_>>());
    /// // The first went at once, the other 19 at 20 ms intervals.
    /// assert_eq!(clock.now(), Duration::from_millis(380));
    /// # Ok(()) }
    /// ```
    fn throttle<'a, L>(self, limiter: L) -> Throttle<'a, Self, L, OnePermit<Self::Item>>
    where
        Self: Sized,
        L: Deref<Target: Limiter + 'a> + Send + 'a,
    {
        fn one<T>(_: &T) -> u32 {
            1
        }
        Throttle::new(self, limiter, one::<Self::Item>)
    }

    /// Paces the stream at `permits(&item)` permits per item; an item of 0
    /// permits is free, and yielded at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::TryStreamExt;
    /// use paceline::RateLimiter;
    /// use paceline::clock::{Clock, FakeClock};
    /// use paceline::stream::ThrottleExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline::Error> {
    /// let clock = FakeClock::new();
    /// let limiter = RateLimiter::builder()
    ///     .permits_per_second(100.0) // bytes per second
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let messages: Vec<&str> = futures::stream::iter(["hello", "", "world"])
    ///     .throttle_by(&limiter, |message: &&str| message.len() as u32)
    ///     .try_collect()
    ///     .await?;
    /// assert_eq!(messages, ["hello", "", "world"]);
    /// // "world" waited for the 5 bytes of "hello"; "" was free.
    /// assert_eq!(clock.now(), Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    fn throttle_by<'a, L, F>(self, limiter: L, permits: F) -> Throttle<'a, Self, L, F>
    where
        Self: Sized,
        L: Deref<Target: Limiter + 'a> + Send + 'a,
        F: FnMut(&Self::Item) -> u32,
    {
        Throttle::new(self, limiter, permits)
    }

    /// Paces the stream with a [`KeyedLimiter`]: `key_and_permits(&item)`
    /// gives the key an item is charged to and its permits (0 is free).
    ///
    /// Items keep their order across keys: an item waiting for its key holds
    /// back the items behind it, whatever their keys. To let keys proceed
    /// independently, throttle one stream per key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::TryStreamExt;
    /// use paceline::KeyedRateLimiter;
    /// use paceline::clock::{Clock, FakeClock};
    /// use paceline::stream::ThrottleExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline::Error> {
    /// let clock = FakeClock::new();
    /// let per_user = KeyedRateLimiter::<&str>::builder()
    ///     .permits_per_second(10.0)
    ///     .max_burst(Duration::ZERO) // a new key starts with nothing stored
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let requests = [("alice", 1), ("bob", 1), ("alice", 2)];
    /// let done: Vec<(&str, i32)> = futures::stream::iter(requests)
    ///     .throttle_keyed(&per_user, |&(user, _): &(&str, i32)| (user, 1))
    ///     .try_collect()
    ///     .await?;
    /// assert_eq!(done, requests);
    /// // bob did not wait for alice; alice's second request waited 100 ms.
    /// assert_eq!(clock.now(), Duration::from_millis(100));
    /// # Ok(()) }
    /// ```
    fn throttle_keyed<'a, L, K, F>(
        self,
        limiter: L,
        key_and_permits: F,
    ) -> ThrottleKeyed<'a, Self, L, F, K>
    where
        Self: Sized,
        L: Deref<Target: KeyedLimiter<K> + 'a> + Send + 'a,
        K: Send + Sync + 'a,
        F: FnMut(&Self::Item) -> (K, u32),
    {
        Throttle::new(self, limiter, KeyedCharge(key_and_permits, PhantomData))
    }
}

impl<S: Stream + ?Sized> ThrottleExt for S {}

/// The permits function of [`ThrottleExt::throttle`]: one per item.
pub type OnePermit<T> = fn(&T) -> u32;

/// A limiter error for one item of a throttled stream (a backend that
/// cannot be reached, say), with that item, neither charged nor released.
///
/// The stream goes on with the next item, so the caller decides: stop (`?`
/// converts this to the crate's [`Error`], dropping the item; or
/// [`try_next`](futures::TryStreamExt::try_next)), skip the item, or let it
/// through unpaced ([`into_parts`](Self::into_parts)). The local limiters
/// ([`RateLimiter`](crate::RateLimiter),
/// [`KeyedRateLimiter`](crate::KeyedRateLimiter)) never fail here: their
/// only error is for 0 permits, which the stream never asks for.
pub struct ThrottleError<T> {
    item: T,
    error: Error,
}

impl<T> ThrottleError<T> {
    /// The item and the error.
    pub fn into_parts(self) -> (T, Error) {
        (self.item, self.error)
    }
}

impl<T> fmt::Debug for ThrottleError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for ThrottleError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not reserve an item's permits: {}", self.error)
    }
}

impl<T> std::error::Error for ThrottleError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<ThrottleError<T>> for Error {
    fn from(error: ThrottleError<T>) -> Self {
        error.error
    }
}

/// One item's wait: acquires its permits (as the limiter's `acquire`: behind
/// a pause learned from an upstream meanwhile too), and hands the limiter
/// back with the outcome (dropped mid-wait, it gives the permits back).
type Wait<'a, L> = crate::io::Wait<'a, L, ()>;

/// What an item of a throttled stream costs: the function given to
/// [`ThrottleExt`], for a [`Limiter`] (`FnMut(&item) -> permits`) or, as
/// [`KeyedCharge`], for a [`KeyedLimiter`]. Sealed: implemented here only.
pub trait Charge<'a, T, L>: sealed::Sealed {
    /// The wait to start for `item`, or `None` to release it at once (it
    /// is free, or its permits were taken at once).
    #[doc(hidden)]
    fn charge(
        &mut self,
        item: &T,
        limiter: &L,
    ) -> Option<impl FnOnce(L) -> Wait<'a, L> + use<'a, Self, T, L>>;
}

mod sealed {
    pub trait Sealed {}
}

impl<F> sealed::Sealed for F {}

impl<'a, T, L, F> Charge<'a, T, L> for F
where
    L: Deref<Target: Limiter + 'a> + Send + 'a,
    F: FnMut(&T) -> u32,
{
    fn charge(
        &mut self,
        item: &T,
        limiter: &L,
    ) -> Option<impl FnOnce(L) -> Wait<'a, L> + use<'a, T, L, F>> {
        let permits = self(item);
        if permits == 0 || matches!(limiter.take_now(permits), Some(Ok(true))) {
            return None;
        }
        Some(move |limiter: L| -> Wait<'a, L> {
            Box::pin(async move {
                let result = limiter.acquire(permits).await.map(drop);
                (limiter, result)
            })
        })
    }
}

/// The charge of [`ThrottleExt::throttle_keyed`]: `key_and_permits(&item)`
/// for a [`KeyedLimiter`].
pub struct KeyedCharge<F, K>(F, PhantomData<fn() -> K>);

impl<F, K> fmt::Debug for KeyedCharge<F, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCharge").finish_non_exhaustive()
    }
}

impl<'a, T, L, F, K> Charge<'a, T, L> for KeyedCharge<F, K>
where
    L: Deref<Target: KeyedLimiter<K> + 'a> + Send + 'a,
    K: Send + Sync + 'a,
    F: FnMut(&T) -> (K, u32),
{
    fn charge(
        &mut self,
        item: &T,
        limiter: &L,
    ) -> Option<impl FnOnce(L) -> Wait<'a, L> + use<'a, T, L, F, K>> {
        let (key, permits) = (self.0)(item);
        if permits == 0 || matches!(limiter.take_now(&key, permits), Some(Ok(true))) {
            return None;
        }
        Some(move |limiter: L| -> Wait<'a, L> {
            Box::pin(async move {
                let result = limiter.acquire(&key, permits).await.map(drop);
                drop(key);
                (limiter, result)
            })
        })
    }
}

/// A stream paced by a limiter, made by [`ThrottleExt`]'s methods: yields
/// the inner stream's items in order, each once its permits are due (see
/// the [module documentation](self)).
#[must_use = "streams do nothing unless polled"]
pub struct Throttle<'a, S: Stream, L, F> {
    /// Boxed once, so that any stream (pinned or not) can be polled.
    stream: Pin<Box<S>>,
    /// The limiter, or the wait of `item`.
    gate: Gate<'a, L, ()>,
    /// The item waiting for its permits.
    item: Option<S::Item>,
    /// The inner stream has ended.
    done: bool,
    charge: F,
}

/// A stream paced by a [`KeyedLimiter`], each item charged to its own key:
/// made by [`ThrottleExt::throttle_keyed`].
pub type ThrottleKeyed<'a, S, L, F, K> = Throttle<'a, S, L, KeyedCharge<F, K>>;

impl<S: Stream, L, F> Throttle<'_, S, L, F> {
    fn new(stream: S, limiter: L, charge: F) -> Self {
        Throttle {
            stream: Box::pin(stream),
            gate: Gate::Idle(limiter),
            item: None,
            done: false,
            charge,
        }
    }
}

// Nothing is pinned in place: the inner stream is boxed, the rest is moved
// freely.
impl<S: Stream, L, F> Unpin for Throttle<'_, S, L, F> {}

impl<'a, S, L, F> Stream for Throttle<'a, S, L, F>
where
    S: Stream,
    F: Charge<'a, S::Item, L>,
{
    type Item = Result<S::Item, ThrottleError<S::Item>>;

    /// Releases the waiting item when its wait is over, then takes the
    /// next item and asks `charge` for its wait, if any.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(outcome) = ready!(this.gate.poll(cx)) {
                let item = this.item.take().expect("a waiting item");
                return Poll::Ready(Some(match outcome {
                    Ok(()) => Ok(item),
                    Err(error) => Err(ThrottleError { item, error }),
                }));
            }
            if this.done {
                return Poll::Ready(None);
            }
            // (Checked before an item is taken, which would be lost.)
            let Some(limiter) = this.gate.idle() else {
                panic!("a Throttle polled again after its limiter panicked");
            };
            let Some(item) = ready!(this.stream.as_mut().poll_next(cx)) else {
                this.done = true;
                return Poll::Ready(None);
            };
            match this.charge.charge(&item, limiter) {
                None => return Poll::Ready(Some(Ok(item))),
                Some(wait) => {
                    this.gate.start(wait);
                    this.item = Some(item);
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let waiting = usize::from(self.item.is_some());
        if self.done {
            return (waiting, Some(waiting));
        }
        let (low, high) = self.stream.size_hint();
        (
            low.saturating_add(waiting),
            high.and_then(|high| high.checked_add(waiting)),
        )
    }
}

impl<'a, S, L, F> FusedStream for Throttle<'a, S, L, F>
where
    S: Stream,
    F: Charge<'a, S::Item, L>,
{
    fn is_terminated(&self) -> bool {
        self.done && self.item.is_none()
    }
}

impl<S: Stream, L, F> fmt::Debug for Throttle<'_, S, L, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("waiting", &self.item.is_some())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
