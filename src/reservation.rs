//! [`Reservation`]: permits reserved and not yet used, given back if dropped.

use std::fmt;
use std::time::Duration;

use crate::clock::Clock;
use crate::core::{Cost, Learning, Lesson};
use crate::meter::Metered;

/// Permits reserved from a limiter, to be used once their wait has passed.
///
/// Returned by [`RateLimiter::reservation`](crate::RateLimiter::reservation)
/// and [`Limiter::reservation`](crate::Limiter::reservation) (and their `try_`
/// forms): `acquire` in two steps, reserve then wait, so that in between the
/// caller can look at the wait ([`delay`](Reservation::delay)) and decide.
///
/// Then [`wait`](Reservation::wait) (or
/// [`wait_blocking`](Reservation::wait_blocking)) until the permits may be
/// used; [`keep`](Reservation::keep) them without waiting, for a caller that
/// schedules its work itself; or drop it before its wait has passed to **give
/// the permits back**: later callers are scheduled as if they had never been
/// reserved, and callers already waiting keep their slots (how exactly, per
/// limiter: the crate's [table](crate#cancel-safety)).
///
/// A reservation with nothing to wait for has nothing to give back.
///
/// ```
/// use std::time::Duration;
/// use paceline::RateLimiter;
/// use paceline::clock::FakeClock;
///
/// let clock = FakeClock::new();
/// let limiter = RateLimiter::builder()
///     .permits_per_second(10.0)
///     .clock(clock.clone())
///     .build()?;
/// limiter.reservation(1)?.wait_blocking(); // the first goes at once
/// let second = limiter.reservation(1)?;
/// assert_eq!(second.delay(), Duration::from_millis(100));
/// drop(second); // not worth 100 ms after all: given back
/// assert_eq!(limiter.reservation(1)?.delay(), Duration::from_millis(100));
/// # Ok::<(), paceline::Error>(())
/// ```
#[must_use = "a reservation is given back as soon as it is dropped: call .wait(), .wait_blocking() or .keep()"]
pub struct Reservation<'a> {
    delay: Duration,
    /// The limit that set the delay: [`limit`](Reservation::limit).
    limit: u32,
    clock: &'a dyn Clock,
    /// What to give back on drop; `None` once used, or if nothing can be.
    pending: Option<GiveBack<'a>>,
    /// What a Redis limiter's reply said the script left, and the limits it is
    /// read under ([`snapshot`](Reservation::snapshot)).
    #[cfg(feature = "redis")]
    after: Option<(
        std::sync::Arc<crate::redis::Stored>,
        &'a crate::redis::ScriptArgs,
    )>,
}

/// Who takes a reservation back, and what it needs to do so.
pub(crate) struct GiveBack<'a> {
    pub(crate) owner: &'a dyn GivesBack,
    pub(crate) taken: GiveBackId,
}

/// What a reservation took, in the form its limiter needs to give it back.
#[derive(Debug)]
pub(crate) enum GiveBackId {
    /// A local limiter's reservation: its id in the limits' log.
    Logged(u64),
    /// A reservation in a form only its limiter knows: a keyed limiter's key
    /// and the core's record, a Redis limiter's key and the script's record.
    Boxed(Box<dyn std::any::Any + Send + Sync>),
}

/// A limiter that can take a reservation back. No method blocks for long: a
/// remote limiter sends in the background.
pub(crate) trait GivesBack: Metered + Send + Sync {
    /// Gives back what `taken` took; whether it gave anything back (its
    /// moment had not passed, nothing had made it give nothing; through
    /// Redis, whether it was sent).
    fn give_back(&self, taken: GiveBackId) -> bool;

    /// `taken` will never be given back: its permits are kept, and what the
    /// limiter kept to give it back with is forgotten.
    fn keep(&self, taken: GiveBackId) {
        let _ = taken;
    }

    /// The open call `taken`, charged `charged` so far, cost `actual`
    /// ([`Limits::settle`](crate::core::Limits::settle)).
    fn settle(&self, taken: &GiveBackId, charged: &Cost, actual: &Cost) {
        let _ = (taken, charged, actual);
    }

    /// What the upstream answered to the open call `taken`
    /// ([`Limits::learn`](crate::core::Limits::learn)).
    fn learn(&self, taken: &GiveBackId, lesson: &Lesson, learning: &Learning) {
        let _ = (taken, lesson, learning);
    }
}

impl<'a> Reservation<'a> {
    /// A reservation given back through `pending`'s owner; `None`: nothing to
    /// give back.
    #[inline]
    pub(crate) fn new(
        delay: Duration,
        clock: &'a dyn Clock,
        pending: Option<GiveBack<'a>>,
    ) -> Self {
        Reservation {
            delay,
            limit: 0,
            clock,
            pending,
            #[cfg(feature = "redis")]
            after: None,
        }
    }

    /// This reservation, with the state its Redis limiter's reply said the
    /// script left, read under `args`.
    #[cfg(feature = "redis")]
    pub(crate) fn with_after(
        mut self,
        after: Option<std::sync::Arc<crate::redis::Stored>>,
        args: &'a crate::redis::ScriptArgs,
    ) -> Self {
        self.after = after.map(|after| (after, args));
        self
    }

    /// This reservation, given back (and settled, learned from, kept)
    /// through `owner`, which passes it on to the limiter that made it.
    #[cfg(feature = "redis")]
    pub(crate) fn owned_by(mut self, owner: &'a dyn GivesBack) -> Self {
        if let Some(pending) = &mut self.pending {
            pending.owner = owner;
        }
        self
    }

    /// This reservation, waiting for limit `limit` of its limiter's.
    pub(crate) fn for_limit(mut self, limit: usize) -> Self {
        self.limit = u32::try_from(limit).unwrap_or(u32::MAX);
        self
    }

    /// A reservation that cannot be given back: what a
    /// [`Limiter`](crate::Limiter) implemented outside this crate returns by
    /// default, from its [`reserve`](crate::Limiter::reserve).
    pub fn without_give_back(delay: Duration, clock: &'a dyn Clock) -> Self {
        Reservation::new(delay, clock, None)
    }

    /// How long after the reservation was made the permits may be used.
    #[inline]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Which of its limiter's limits this reservation waits for, from 0 in the
    /// order the builder was given them
    /// ([`Builder::limit`](crate::Builder::limit)); `None` if it does not wait
    /// (one limit: `Some(0)` for any wait). For a `RateLimit` header that
    /// names the policy a client ran into.
    ///
    /// ```
    /// use std::time::Duration;
    /// use paceline::{Limit, RateLimiter};
    /// use paceline::clock::FakeClock;
    ///
    /// let limiter = RateLimiter::builder()
    ///     .limit(Limit::per_second(10.0).burst(1))
    ///     .limit(Limit::per(60.0, Duration::from_secs(60)).burst(1))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// assert_eq!(limiter.reservation(1)?.limit(), None); // it does not wait
    /// // 100 ms per second, but a whole second per minute: the second binds.
    /// let next = limiter.reservation(1)?;
    /// assert_eq!((next.delay(), next.limit()), (Duration::from_secs(1), Some(1)));
    /// # Ok::<(), paceline::Error>(())
    /// ```
    pub fn limit(&self) -> Option<usize> {
        (!self.delay.is_zero()).then_some(self.limit as usize)
    }

    /// What a limiter shared through Redis held right after this reservation,
    /// as the script's reply said (for a coalesced batch, the state after the
    /// whole batch, which errs towards fewer remaining): for the rate-limit
    /// headers of this very request, where a second read could count other
    /// callers' requests. `None` for the limiters in this process (whose
    /// `snapshot` is read without I/O) and for a reservation a fallback
    /// served.
    pub fn snapshot(&self) -> Option<crate::Snapshot> {
        #[cfg(feature = "redis")]
        if let Some((after, args)) = &self.after {
            return Some(after.snapshot(args));
        }
        None
    }

    /// Sleeps for the delay (on the limiter's clock), then keeps the permits;
    /// returns the delay. With no delay, returns at once without touching a
    /// timer. Cancel-safe: dropped before the sleep ends, it gives the permits
    /// back, as dropping the reservation does.
    pub async fn wait(self) -> Duration {
        // What `wait_open` hands over is dropped without giving back.
        self.wait_open().await.0
    }

    /// Sleeps for the delay, then hands over what settles the open call it
    /// reserved. Cancel-safe as [`wait`](Self::wait).
    pub(crate) async fn wait_open(mut self) -> (Duration, Option<GiveBack<'a>>) {
        if !self.delay.is_zero() {
            self.clock.sleep(self.delay).await;
        }
        (self.delay, self.pending.take())
    }

    /// [`wait`](Self::wait) on the calling thread: blocks it for the delay.
    pub fn wait_blocking(mut self) -> Duration {
        if !self.delay.is_zero() {
            self.clock.sleep_blocking(self.delay);
        }
        self.pending = None;
        self.delay
    }

    /// Keeps the permits without waiting here, and returns the delay: the
    /// caller promises to wait for it itself.
    #[inline]
    pub fn keep(mut self) -> Duration {
        if let Some(pending) = self.pending.take() {
            pending.owner.keep(pending.taken);
        }
        self.delay
    }

    /// Whether dropping this reservation may give something back: `false`
    /// if it certainly gives nothing (it waits for nothing, or its limiter
    /// cannot give back). A `true` is a may: dropped once its moment has
    /// passed, or after a rate change (which makes what waits to be given
    /// back give nothing), it keeps its permits, erring towards limiting.
    pub fn can_give_back(&self) -> bool {
        self.pending.is_some()
    }
}

/// What every `try_acquire` does with its `try_reservation`: waits for a
/// granted reservation and keeps it (`true`), or reports the refusal
/// (`false`). Cancel-safe as [`Reservation::wait`].
pub(crate) async fn wait_if_granted(reservation: Option<Reservation<'_>>) -> bool {
    let Some(reservation) = reservation else {
        return false;
    };
    reservation.wait().await;
    true
}

impl Drop for Reservation<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take()
            && pending.owner.give_back(pending.taken)
        {
            pending.owner.metrics().given_back();
        }
    }
}

impl fmt::Debug for Reservation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("delay", &self.delay)
            .field("gives_back", &self.pending.is_some())
            .finish()
    }
}
