//! Where a call goes: to Redis, or to the fallback while its part of Redis
//! is down or its time is up, after waiting for its key's carry-back (see
//! [the rule at every switch](super)).

use super::*;

/// How many times a call looks at its key's carry-back before the fallback
/// serves it (its wait is bounded by [`Patience`] too).
const MAX_CARRY_WAITS: usize = 8;

/// How long a call may wait for its key's carry-back: until the response
/// timeout from its start, so that it returns within it. Past that, the
/// fallback (which holds the key until its debt is in Redis) serves it; a
/// call that waited goes to Redis with what is left. Either way, a try's
/// timeout counts from the call: the wait is taken off it
/// ([`Patience::waited`]).
struct Patience {
    deadline: tokio::time::Instant,
    /// How long the call waited for its key's carry-back (or its floor's
    /// charge), if it did.
    waited: Option<Duration>,
}

impl Patience {
    /// Whether the call's time is up.
    fn out(&self) -> bool {
        tokio::time::Instant::now() >= self.deadline
    }

    /// What a call that waited has of its time (else none: it has the whole
    /// response timeout, and its try the whole of its timeout).
    fn waited(&self) -> Option<Waited> {
        self.waited.map(|took| Waited {
            took,
            budget: self
                .deadline
                .saturating_duration_since(tokio::time::Instant::now()),
        })
    }
}

/// What a call that waited for its key's carry-back has of its time.
#[derive(Clone, Copy)]
pub(super) struct Waited {
    /// How long it waited.
    took: Duration,
    /// What is left of the response timeout, for a round trip.
    pub(super) budget: Duration,
}

impl Waited {
    /// A try's `timeout`, for a call that `waited`: what is left of it. It
    /// counts from the call, as a call that did not wait counts it (one
    /// that waited for a carry-back that drained the key's debt meanwhile
    /// would otherwise be granted up to that wait more than its timeout,
    /// from its call); as `coalesce` counts it for a call queued behind a
    /// round trip.
    pub(super) fn timeout(waited: Option<Waited>, timeout: Option<Duration>) -> Option<Duration> {
        match waited {
            Some(waited) => timeout.map(|timeout| timeout.saturating_sub(waited.took)),
            None => timeout,
        }
    }
}

/// Where a call goes.
enum Route {
    Redis,
    /// The fallback; the failure that sent it there, if any is known.
    Local(Option<BackendError>),
}

impl<K: Key + Display, C: Clock> Failover<K, C> {
    /// A call of `key` (on `target`, its Redis key): `remote` asks Redis;
    /// while the key's part of Redis is down, `local` asks the fallback,
    /// told the failure and whether the caller may still wait for a
    /// carry-back of the key (it then routes again once that has ended).
    /// Each is told what the call has of its time if it waited for one
    /// ([`Waited`]).
    pub(super) async fn routed<'a, Q, T, R>(
        &'a self,
        key: &Q,
        target: &ProbeTarget,
        remote: impl Fn(Option<Waited>) -> R,
        local: impl Fn(
            Option<BackendError>,
            bool,
            Option<Waited>,
        ) -> Result<Result<T, Error>, Carried<'a>>,
    ) -> Result<T, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
        R: Future<Output = Result<T, Failure>>,
    {
        let mut patience = Patience {
            deadline: self.backend.options.response_deadline(),
            waited: None,
        };
        loop {
            let failure = match self.route(key, target, &mut patience).await {
                Route::Redis => match remote(patience.waited()).await {
                    Ok(answer) => return Ok(answer),
                    Err(Failure::Refused(error)) => return Err(error),
                    Err(Failure::Down(failure)) => failure,
                },
                Route::Local(failure) => failure,
            };
            match local(failure, !patience.out(), patience.waited()) {
                Ok(result) => return result,
                Err(carried) => self.await_carry(key, carried, &mut patience).await,
            }
        }
    }

    /// Where a call of `key` goes: to the fallback while its part of Redis
    /// is down or its `patience` is out; otherwise to Redis, once what the
    /// fallback holds for the key has been carried back.
    async fn route<Q>(&self, key: &Q, target: &ProbeTarget, patience: &mut Patience) -> Route
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A key whose carry-back (or charge) keeps failing to start (its
        // runtime gone), so that its mark is lifted at once, pass after
        // pass, is served where it is held.
        for _ in 0..MAX_CARRY_WAITS {
            if self.is_down(target) || patience.out() {
                return Route::Local(None);
            }
            if self.active.load(Ordering::Acquire) {
                let carried = {
                    let mut books = self.books();
                    let carried = self.carrying(&books, key);
                    if carried.is_none() && self.local.ticket(key).is_some() {
                        books.carrying.insert(key.to_owned());
                        drop(books);
                        self.spawn_carry(key.to_owned());
                        // The rest of the fallback's keys go back too.
                        self.carry_all();
                        continue;
                    }
                    carried
                };
                if let Some(carried) = carried {
                    self.await_carry(key, carried, patience).await;
                    continue;
                }
            }
            match self.charge_floor(key, target) {
                Floor::Charged => return Route::Redis,
                // Another call charges the key: once it has, the route is
                // looked at again (Redis, whose debt then includes the
                // charge; or, if the charge found Redis down, the
                // fallback).
                Floor::Busy(charging) => self.await_carry(key, charging, patience).await,
                // This call's own charge: once it has ended, the call goes
                // to Redis (charged, even if the keys charged are too many
                // to remember it), unless Redis was found down meanwhile.
                Floor::Charging(charging) => {
                    self.await_carry(key, charging, patience).await;
                    if self.is_down(target) || patience.out() {
                        return Route::Local(None);
                    }
                    return Route::Redis;
                }
            }
        }
        Route::Local(None)
    }

    /// Waits for the carry-back (or the floor's charge) of `key` to end,
    /// at most until the call's time is up, and counts the wait in
    /// `patience`. The wake-up is every key's: one for another key's end
    /// waits again, so that only this key's end counts as a pass of the
    /// route.
    async fn await_carry<Q>(&self, key: &Q, mut carried: Carried<'_>, patience: &mut Patience)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let since = tokio::time::Instant::now();
        loop {
            if tokio::time::timeout_at(patience.deadline, carried)
                .await
                .is_err()
            {
                break;
            }
            match self.carrying(&self.books(), key) {
                Some(again) => carried = again,
                None => break,
            }
        }
        *patience.waited.get_or_insert_default() += since.elapsed();
    }
}
