//! What every limiter is under its public type: an [`Engine`] that holds
//! the state, for one key or many, in this process or in Redis, and the
//! user-facing methods written once over it.
//!
//! An engine reserves (with what it took, so that a dropped
//! [`Reservation`] gives it back), answers how long a request would wait
//! and what a key holds, and changes the rate. The in-process engines
//! answer at once: their futures are ready when made, and their limiters'
//! methods that do not sleep poll them once ([`now`]). The Redis engine
//! makes a round trip or serves from its fallback. The bodies here are the
//! only ones: [`RateLimiter`](crate::RateLimiter) and
//! [`KeyedRateLimiter`](crate::KeyedRateLimiter) call them for every store,
//! and so do the [`Limiter`](crate::Limiter) traits.

use std::future::{Future, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::clock::Clock;
use crate::core::Cost;
use crate::error::{check_cost, check_permits};
use crate::meter::Metered;
use crate::outbound::{Call, TakeSlot, Upstream};
use crate::reservation::GiveBack;
use crate::{Error, Reservation, Snapshot, Stats};

/// The key of a limiter with one state: a limiter with no key is an
/// engine over this one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OnlyKey;

impl std::fmt::Display for OnlyKey {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// What an engine has whatever the key: its rates, its clock, its counts,
/// and (as [`Metered`]) what the methods here record grants and refusals
/// in.
pub trait Rate: Metered + Send + Sync {
    /// Changes the rate of every key; with several limits, the first one's,
    /// the others scaled alike.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// Changes the rate of limit `index` alone.
    fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate, in permits per second (of the first limit).
    fn rate(&self) -> f64;

    /// The slowest limit's stable rate, in permits per second.
    fn slowest_rate(&self) -> f64;

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// What the engine has had to do.
    fn stats(&self) -> Stats;

    /// How many limits every key has.
    fn limit_count(&self) -> usize;

    /// Sleeps the calling thread for `wait` (a blocking acquire).
    fn sleep_blocking(&self, wait: Duration) {
        self.clock().sleep_blocking(wait);
    }
}

/// Where a limiter's state lives, for keys borrowed as `Q`.
///
/// An engine never sees zero permits: the methods check them first.
pub trait Engine<Q: ?Sized + Sync>: Rate {
    /// Reserves `permits` of `key` if the wait fits in `timeout` (`None`:
    /// whatever it is); `None` if refused, with nothing reserved. The
    /// reservation gives its permits back if dropped before its wait has
    /// passed.
    fn take(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send;

    /// [`take`](Self::take), not held, of `permits` as checked (an error
    /// is handed on, nothing taken): the wait, or `None` if refused, handed
    /// to `then`. Its own method, so that the in-process engines' plain
    /// reservations (their fast path) never build a [`Reservation`]; the
    /// check's error and `then` passed in rather than a choice of futures
    /// and a combinator around them, so that an in-process engine's future
    /// is one `ready(then(..))`, which compiles to the plain call wherever
    /// it is polled.
    fn take_wait<T: Send>(
        &self,
        key: &Q,
        permits: Result<u32, Error>,
        timeout: Option<Duration>,
        then: impl FnOnce(Result<Option<Duration>, Error>) -> T + Send,
    ) -> impl Future<Output = T> + Send;

    /// [`take_wait`](Self::take_wait) from a thread that may block. The
    /// default polls it once: the in-process engines' futures are ready
    /// when made ([`now`]). An engine that does I/O blocks its own way.
    fn take_blocking(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        now(self.take_wait(key, Ok(permits), timeout, |taken| taken))
    }

    /// Reserves `cost` of `key` for an open call if the wait fits in
    /// `timeout` (`None`: whatever it is); `None` if refused, with nothing
    /// reserved. The reservation gives its cost back if dropped before its
    /// wait has passed; after, what it hands over settles it (see
    /// [`Limits::open`](crate::core::Limits::open)). `cost` counts for one
    /// limit at least, and for no limit the engine lacks.
    fn take_call(
        &self,
        key: &Q,
        cost: &Cost,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send;

    /// What `key` holds now, read without reserving.
    fn snapshot(&self, key: &Q) -> impl Future<Output = Result<Snapshot, Error>> + Send;

    /// Takes `permits` if they are free now, without waiting and without
    /// I/O; `None` if the engine cannot tell without a round trip.
    fn take_now(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        let _ = (key, permits);
        None
    }

    /// [`snapshot`](Self::snapshot) without I/O; `None` if the engine
    /// cannot tell without a round trip.
    fn snapshot_now(&self, key: &Q) -> Option<Snapshot> {
        let _ = key;
        None
    }

    /// The end of the pause a refusal learned for `key` started (µs, on
    /// the engine's clock: only ever compared with another of its
    /// answers), while it lasts; `None` otherwise, or if the engine cannot
    /// have learned one. Asked by a caller that waited, as it wakes (see
    /// [`acquire`]). Errors read as `None`: the caller goes at its moment,
    /// as it did before it asked.
    fn paused(&self, key: &Q) -> impl Future<Output = Option<u64>> + Send {
        let _ = key;
        ready(None)
    }

    /// [`paused`](Self::paused) from a thread that may block. The default
    /// polls it once, as [`take_blocking`](Self::take_blocking) does.
    fn paused_blocking(&self, key: &Q) -> Option<u64> {
        now(self.paused(key))
    }
}

/// An engine in this process: it answers at once, so its [`Engine`]
/// futures are ready when made, and its reservations give back to it
/// ([`GivesBack`](crate::reservation::GivesBack), which also tells the
/// fail-over engine, an `Arc` that gives back nothing itself, apart). One
/// impl below serves every such engine; timeouts are whole µs here
/// ([`timeout_micros`]).
pub(crate) trait AtOnce<Q: ?Sized + Sync>: Rate + crate::reservation::GivesBack {
    /// [`Engine::take`], answered at once.
    fn reserve_at_once(&self, key: &Q, permits: u32, timeout: u64) -> Option<Reservation<'_>>;

    /// [`Engine::take_wait`], answered at once: the wait in µs, with no
    /// [`Reservation`] built (the fast path).
    fn wait_at_once(&self, key: &Q, permits: u32, timeout: u64) -> Option<u64>;

    /// [`Engine::take_call`], answered at once.
    fn call_at_once(&self, key: &Q, cost: &Cost, timeout: u64) -> Option<Reservation<'_>>;

    /// [`Engine::snapshot`], answered at once.
    fn snapshot_at_once(&self, key: &Q) -> Snapshot;

    /// [`Engine::paused`], answered at once.
    fn paused_at_once(&self, key: &Q) -> Option<u64>;
}

impl<Q: ?Sized + Sync, E: AtOnce<Q>> Engine<Q> for E {
    #[inline(always)]
    fn take(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        let timeout = timeout_micros(timeout);
        ready(Ok(self.reserve_at_once(key, permits, timeout)))
    }

    #[inline(always)]
    fn take_wait<T: Send>(
        &self,
        key: &Q,
        permits: Result<u32, Error>,
        timeout: Option<Duration>,
        then: impl FnOnce(Result<Option<Duration>, Error>) -> T + Send,
    ) -> impl Future<Output = T> + Send {
        let timeout = timeout_micros(timeout);
        let wait = permits.map(|permits| self.wait_at_once(key, permits, timeout));
        ready(then(wait.map(|wait| wait.map(wait_of))))
    }

    fn take_call(
        &self,
        key: &Q,
        cost: &Cost,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Reservation<'_>>, Error>> + Send {
        ready(Ok(self.call_at_once(key, cost, timeout_micros(timeout))))
    }

    fn snapshot(&self, key: &Q) -> impl Future<Output = Result<Snapshot, Error>> + Send {
        ready(Ok(self.snapshot_at_once(key)))
    }

    /// Free now: granted with a wait of zero, no wait being allowed.
    fn take_now(&self, key: &Q, permits: u32) -> Option<Result<bool, Error>> {
        Some(Ok(self.wait_at_once(key, permits, 0) == Some(0)))
    }

    fn snapshot_now(&self, key: &Q) -> Option<Snapshot> {
        Some(self.snapshot_at_once(key))
    }

    fn paused(&self, key: &Q) -> impl Future<Output = Option<u64>> + Send {
        ready(self.paused_at_once(key))
    }
}

/// A timeout in whole µs for the in-process engines (saturating at
/// [`MAX_MICROS`](crate::core::MAX_MICROS)); `u64::MAX` for none.
#[inline(always)]
fn timeout_micros(timeout: Option<Duration>) -> u64 {
    timeout.map_or(u64::MAX, crate::core::micros)
}

/// A wait in µs as a `Duration`, with no arithmetic for the common wait of
/// zero (a granted try's: the division by a million is a tenth of its
/// instructions).
#[inline(always)]
fn wait_of(micros: u64) -> Duration {
    if micros == 0 {
        Duration::ZERO
    } else {
        Duration::from_micros(micros)
    }
}

/// The output of a future that is ready when made: an in-process engine's
/// (their methods do no I/O and never sleep).
#[inline(always)]
pub(crate) fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        // An in-process engine's future never waits: nothing here can.
        Poll::Pending => unreachable!("an in-process limiter's call waited"),
    }
}

// The other bodies are `async` blocks rather than future combinators: a
// block is created small and builds the engine's future in place when
// first polled, where a combinator moves the whole (large, for Redis)
// future at each layer.

/// Reserves `permits` of `key` now; the wait before they may be used.
/// Nothing gives them back.
///
/// This call and [`try_reserve`] are neither `async` blocks nor future
/// combinators: they hand their last step to the engine, whose future (an
/// in-process engine's: `ready`) is all there is to poll. An `async`
/// block's poll, and a combinator's, is a function of its own at some call
/// sites, which cost the local limiter up to two and a half times the time
/// of the plain call (see BENCHMARKS.md, "Plain reservations at every call
/// site").
#[inline(always)]
pub(crate) fn reserve<'a, Q, E>(
    engine: &'a E,
    key: &'a Q,
    permits: u32,
) -> impl Future<Output = Result<Duration, Error>> + Send + 'a
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    checked(engine, key, permits, None, move |taken| {
        let wait = taken?.unwrap_or_default();
        engine.metrics().granted(wait);
        Ok(wait)
    })
}

/// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
/// reserving nothing, otherwise.
#[inline(always)]
pub(crate) fn try_reserve<'a, Q, E>(
    engine: &'a E,
    key: &'a Q,
    permits: u32,
    timeout: Duration,
) -> impl Future<Output = Result<Option<Duration>, Error>> + Send + 'a
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    checked(engine, key, permits, Some(timeout), move |taken| {
        let wait = taken?;
        engine.metrics().tried(wait);
        Ok(wait)
    })
}

/// The engine's `take_wait` if `permits` may be asked for, the error
/// otherwise, handed to `then`.
#[inline(always)]
fn checked<'a, Q, E, T: Send + 'a>(
    engine: &'a E,
    key: &'a Q,
    permits: u32,
    timeout: Option<Duration>,
    then: impl FnOnce(Result<Option<Duration>, Error>) -> T + Send + 'a,
) -> impl Future<Output = T> + Send + 'a
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    let permits = check_permits(permits).map(|()| permits);
    engine.take_wait(key, permits, timeout, then)
}

/// Reserves `permits` of `key` as a reservation that gives them back if
/// dropped.
pub(crate) async fn reservation<'a, Q, E>(
    engine: &'a E,
    key: &Q,
    permits: u32,
) -> Result<Reservation<'a>, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    let taken = try_reservation(engine, key, permits, None).await?;
    Ok(taken.unwrap_or_else(|| Reservation::new(Duration::ZERO, engine.clock(), None)))
}

/// [`reservation`] if the wait fits in `timeout` (any wait without one);
/// `None`, reserving nothing, if refused.
pub(crate) async fn try_reservation<'a, Q, E>(
    engine: &'a E,
    key: &Q,
    permits: u32,
    timeout: Option<Duration>,
) -> Result<Option<Reservation<'a>>, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    check_permits(permits)?;
    let taken = engine.take(key, permits, timeout).await?;
    count(engine, timeout, taken.as_ref().map(Reservation::delay));
    Ok(taken)
}

/// Counts a reservation's wait (`None`: refused): a try's when there is a
/// `timeout`, else a grant's.
fn count(engine: &impl Rate, timeout: Option<Duration>, wait: Option<Duration>) {
    match timeout {
        Some(_) => engine.metrics().tried(wait),
        None => engine.metrics().granted(wait.unwrap_or_default()),
    }
}

/// A request that may reserve more than once (again behind a pause: see
/// [`take_and_wait`]), counted once, when it ends or is dropped, as its
/// last answer left it: granted with the whole of its wait, from its
/// start, or refused. Nothing if it got no answer (an error first).
struct Counted<'a, E: Rate> {
    engine: &'a E,
    timeout: Option<Duration>,
    answer: Option<Option<Duration>>,
}

impl<'a, E: Rate> Counted<'a, E> {
    fn new(engine: &'a E, timeout: Option<Duration>) -> Self {
        Counted {
            engine,
            timeout,
            answer: None,
        }
    }

    /// A reservation's wait (`None`: refused), after `waited` before it.
    fn answered(&mut self, waited: Duration, wait: Option<Duration>) {
        self.answer = Some(wait.map(|wait| waited + wait));
    }
}

impl<E: Rate> Drop for Counted<'_, E> {
    fn drop(&mut self) {
        if let Some(wait) = self.answer {
            count(self.engine, self.timeout, wait);
        }
    }
}

/// Reserves `permits` of `key` and sleeps for the wait; the time slept.
/// Dropped, it gives back what it took.
pub(crate) async fn acquire<Q, E>(engine: &E, key: &Q, permits: u32) -> Result<Duration, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    Ok(take_and_wait(engine, key, permits, None)
        .await?
        .unwrap_or_default())
}

/// [`acquire`] if the wait fits in `timeout`; `false` at once, reserving
/// nothing, otherwise (or once it has waited: see [`take_and_wait`]).
pub(crate) async fn try_acquire<Q, E>(
    engine: &E,
    key: &Q,
    permits: u32,
    timeout: Duration,
) -> Result<bool, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    Ok(take_and_wait(engine, key, permits, Some(timeout))
        .await?
        .is_some())
}

/// Reserves `permits` of `key` if the wait fits in `timeout` (any wait
/// without one) and sleeps for it; the time slept, or `None` if refused.
///
/// A refusal learned while the caller waited (by this process, or through
/// Redis by any) pauses the callers that reserve after it; this caller's
/// moment, set before, may fall inside the pause. So a caller that waited
/// asks, as it wakes, whether a pause holds (see [`Engine::paused`]): if
/// so it does not go but reserves again, behind the pause, within what is
/// left of `timeout` (refused, `None`, if that does not fit), and sleeps
/// again; asked again only of a later pause. What it reserved first stays
/// spent, erring towards limiting: the pause emptied the log it would be
/// given back through.
async fn take_and_wait<Q, E>(
    engine: &E,
    key: &Q,
    permits: u32,
    timeout: Option<Duration>,
) -> Result<Option<Duration>, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    check_permits(permits)?;
    let mut counted = Counted::new(engine, timeout);
    let mut waits = Waits::default();
    loop {
        let left = waits.left(timeout);
        let taken = engine.take(key, permits, left).await?;
        counted.answered(waits.slept, taken.as_ref().map(Reservation::delay));
        let Some(reservation) = taken else {
            return Ok(None);
        };
        let waited = reservation.wait().await;
        if !waits.again(waited, || engine.paused(key)).await {
            return Ok(Some(waits.slept));
        }
    }
}

/// What a caller has waited so far, and the end of the last pause it
/// reserved again behind (see [`take_and_wait`]).
#[derive(Default)]
struct Waits {
    slept: Duration,
    handled: Option<u64>,
}

impl Waits {
    /// What is left of `timeout` (`None`: no bound).
    fn left(&self, timeout: Option<Duration>) -> Option<Duration> {
        timeout.map(|timeout| timeout.saturating_sub(self.slept))
    }

    /// Counts a wait of `waited`; whether the caller wakes inside a pause
    /// it has not yet reserved again behind, as `paused` (asked only if it
    /// waited: one that went at once saw no pause come) tells.
    async fn again<F>(&mut self, waited: Duration, paused: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = Option<u64>>,
    {
        self.slept += waited;
        !waited.is_zero() && self.behind(paused().await)
    }

    /// Whether the pause ending at `paused` is one it has not yet reserved
    /// again behind (then it has).
    fn behind(&mut self, paused: Option<u64>) -> bool {
        match paused {
            Some(until) if self.handled != Some(until) => {
                self.handled = Some(until);
                true
            }
            _ => false,
        }
    }
}

/// Takes a slot of `key` (with a concurrent limit), then reserves `cost`
/// of `key` for a call to an upstream, if both fit in `timeout` together
/// (any wait without one); sleeps for the wait, and returns the call to
/// settle and learn from; `None`, taking nothing, if refused (a slot taken
/// goes back at once). Dropped before it returns, it gives back what it
/// took.
pub(crate) async fn call<'a, Q, E, L>(
    engine: &'a E,
    slots: &'a L,
    key: &Q,
    cost: Cost,
    timeout: Option<Duration>,
    upstream: &'a Upstream,
) -> Result<Option<Call<'a>>, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
    L: TakeSlot<Q>,
{
    let limits = engine.limit_count();
    check_cost(&cost, limits, true)?;
    let Some(slot) = slots.take_slot(key, timeout, engine.clock()).await? else {
        engine.metrics().tried(None);
        return Ok(None);
    };
    let mut counted = Counted::new(engine, timeout);
    // As `take_and_wait`: again behind a pause learned while it waited.
    let mut waits = Waits {
        slept: slot.waited,
        handled: None,
    };
    let pending = loop {
        let left = waits.left(timeout);
        let taken = engine.take_call(key, &cost, left).await?;
        counted.answered(waits.slept, taken.as_ref().map(Reservation::delay));
        let Some(reservation) = taken else {
            return Ok(None);
        };
        let (slept, pending) = reservation.wait_open().await;
        // Kept if dropped (behind a pause, or while it asks for one): the
        // call it opened ends at its estimate, as a dropped one does.
        let mut opened = Opened(pending);
        if !waits.again(slept, || engine.paused(key)).await {
            break opened.0.take();
        }
    };
    let clock = engine.clock();
    Ok(Some(Call {
        waited: waits.slept,
        went: clock.now(),
        clock,
        pending,
        charged: cost,
        limits,
        upstream,
        _slot: slot.slot,
    }))
}

/// An open call made, not yet handed to its [`Call`]: kept if dropped
/// (it went at its moment, so nothing is given back), so that its
/// limiter's log lets it go as it does a dropped [`Call`].
struct Opened<'a>(Option<GiveBack<'a>>);

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        if let Some(pending) = self.0.take() {
            pending.owner.keep(pending.taken);
        }
    }
}

/// [`acquire`] (no `timeout`) or [`try_acquire`] on the calling thread:
/// takes `permits` of `key` if the wait fits in `timeout` (any wait without
/// one), counts it, and sleeps the calling thread for the wait; `None` if
/// refused.
pub(crate) fn take_and_sleep<Q, E>(
    engine: &E,
    key: &Q,
    permits: u32,
    timeout: Option<Duration>,
) -> Result<Option<Duration>, Error>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    check_permits(permits)?;
    // As `take_and_wait`: again behind a pause learned while it slept.
    let mut counted = Counted::new(engine, timeout);
    let mut waits = Waits::default();
    loop {
        let left = waits.left(timeout);
        let taken = engine.take_blocking(key, permits, left)?;
        counted.answered(waits.slept, taken);
        let Some(wait) = taken else {
            return Ok(None);
        };
        waits.slept += wait;
        if wait.is_zero() {
            return Ok(Some(waits.slept));
        }
        engine.sleep_blocking(wait);
        if !waits.behind(engine.paused_blocking(key)) {
            return Ok(Some(waits.slept));
        }
    }
}

/// Takes `permits` of `key` if they are free now, without I/O; counted as
/// a grant when taken (one that is not free is the caller's to reserve
/// next, which counts).
pub(crate) fn take_now<Q, E>(engine: &E, key: &Q, permits: u32) -> Option<Result<bool, Error>>
where
    Q: ?Sized + Sync,
    E: Engine<Q>,
{
    if let Err(error) = check_permits(permits) {
        return Some(Err(error));
    }
    let taken = engine.take_now(key, permits);
    if let Some(Ok(true)) = taken {
        engine.metrics().granted(Duration::ZERO);
    }
    taken
}
