//! Calls to an upstream through Redis: an open call is reserved by the
//! script (one round trip of its own, never coalesced), then settled,
//! learned from and kept there, in the background and in the order its
//! [`Call`](crate::outbound::Call) made them; by the fallback while Redis
//! is down.
//!
//! # The rule at every switch, for calls
//!
//! - A call the fallback served is settled, learned from and kept by the
//!   fallback (its reservation is the fallback's own), even once Redis is
//!   back: what it changes there is carried back with the key's debt.
//! - A call Redis served is settled in Redis: exactly while the key's log
//!   holds it (128 requests, a carry-back's resume among them; not past a
//!   rate change, a learned one, or a restart that lost the key). If
//!   Redis is down when its settle comes, or the settle fails, what it
//!   cost past its charge is charged to the key in the fallback instead,
//!   which carries it back with the rest of its debt: counted once, as it
//!   is never sent to Redis after (a settle that failed after Redis
//!   applied it is counted twice, erring towards limiting), and what it
//!   cost less is not given back. A lesson learned while Redis is down is
//!   learned by the fallback (what the fallback learns stays there: its
//!   pauses are carried back as debt, at their length, and remembered for
//!   the callers waiting in them; not its factor); a fallback that holds no
//!   keys (failing closed or open) has Redis learn it once it is back, its
//!   waits shortened by the time it waited, as a keep that cannot reach
//!   Redis is sent then.
//! - A key opens in the fallback at the fraction of its rates it learned
//!   in Redis, as the last reply that said so (a call's, a learn's), so
//!   that the fallback keeps the learned rate (not the rates the upstream
//!   reported, which the fallback's share of the rate does not map to).

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::*;
use crate::core::{Cost, Learning, Lesson};

/// The fewest messages of calls made in Redis (keeps, lessons) a fallback
/// holds for Redis while it is down, however few keys it may hold: the
/// calls in flight when Redis went down, as the log of one key in this
/// process holds them.
const MIN_QUEUED: usize = 1024;

/// An open call made in Redis, as its [`GiveBack`] holds it: its key, in
/// the fallback's terms and in Redis's, the script's id for it, and the
/// end of the last operation sent for it, so that its settles, its lessons
/// and its keep reach Redis in the order they were made.
pub(super) struct RedisCall<K> {
    key: K,
    redis_key: Arc<str>,
    token: LogId,
    previous: Mutex<Option<oneshot::Receiver<()>>>,
}

impl<K: Key + Display, C: Clock> Failover<K, C> {
    /// Reserves `cost` of `key` for an open call ([`Engine::take_call`]),
    /// routed as a reservation.
    pub(super) async fn take_call<Q>(
        &self,
        key: &Q,
        cost: &Cost,
        timeout: Option<Duration>,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        // A reply that comes too late is given back (a call has an id).
        let call = |timeout, _| Call::Open {
            cost: cost.clone(),
            timeout,
        };
        self.reserve_routed(
            key,
            timeout,
            call,
            |reply, target| self.granted_call(reply, target, key),
            |local, timeout| now(Engine::take_call(local, key, cost, timeout)),
        )
        .await
    }

    /// A call's granted reply, as a reservation that gives itself back if
    /// dropped before its wait has passed, and then settles the call.
    fn granted_call<Q>(
        &self,
        reply: Reply,
        target: &ProbeTarget,
        key: &Q,
    ) -> Option<Reservation<'_>>
    where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let taken = reply.token.map(|token| RedisCall {
            key: key.to_owned(),
            redis_key: Arc::clone(&target.key),
            token,
            previous: Mutex::new(None),
        });
        self.reservation(reply, taken)
    }

    /// The end of the pause a refusal learned for `key` started, while it
    /// lasts: as Redis's status says (µs on its clock: one round trip, once
    /// the limiter may have learned anything, see [`Engine::paused`]), or,
    /// where it says none or is down, as the fallback or an earlier reply
    /// said (µs on the local clock: see `Books::paused`). An error reads as
    /// none.
    pub(super) async fn paused<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        if !self.learns.load(Ordering::Relaxed) {
            return None;
        }
        // Beside Redis's answer, only the pauses it does not know: each
        // pause is told on one clock only, so that a caller goes behind it
        // once.
        let paused = |stored: Stored| {
            let until = stored.learned.map(|learned| learned.paused_until);
            until
                .filter(|&until| until > stored.now_micros)
                .or_else(|| self.known_pause(key, true))
        };
        let local = |_, _| Ok(Ok(self.paused_locally(key)));
        self.read_status(key, paused, local).await.ok().flatten()
    }

    /// [`paused`](Self::paused) while Redis is down or out of reach: as the
    /// fallback or an earlier reply said.
    pub(super) fn paused_locally<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.local
            .paused_until(key)
            .or_else(|| self.known_pause(key, false))
    }

    /// The end of `key`'s pause as this process knows it, while it lasts
    /// (`ours_only`: only one Redis does not know).
    fn known_pause<Q>(&self, key: &Q, ours_only: bool) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.now();
        let books = self.books();
        let (until, ours) = books.paused.get(key).copied()?;
        (until > now && (ours || !ours_only)).then_some(until)
    }

    /// Remembers that `key`'s pause ends at `until` (µs, local clock);
    /// `ours`: Redis does not know it.
    pub(super) fn note_pause<Q>(&self, books: &mut Books<K>, key: &Q, until: u64, ours: bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.now();
        if let Some(known) = books.paused.get_mut(key) {
            *known = (known.0.max(until), known.1 || ours);
        } else if until > now
            && books
                .paused
                .room(self.max_local_keys, now, |(until, _)| *until)
        {
            books.paused.insert(key.to_owned(), (until, ours));
        }
    }

    /// Notes what a reply that carries the key's state after it says:
    /// what the key owes, and what it learned.
    pub(super) fn note_reply<Q>(&self, key: &Q, reply: &Reply)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if reply.after.is_some() {
            self.note_debt(key, reply.debt_micros);
            self.note_learned(key, reply);
        }
    }

    /// Remembers what `key` learned in Redis, as `reply` said (see
    /// `Books::learned`), and the end of its pause on the local clock (see
    /// `Books::paused`).
    pub(super) fn note_learned<Q>(&self, key: &Q, reply: &Reply)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (Some(learned), Some(after)) = (&reply.learned, &reply.after) else {
            return;
        };
        let mut books = self.books();
        let pause = learned.paused_until.saturating_sub(after.now_micros);
        if pause > 0 {
            let until = self.now().saturating_add(pause);
            self.note_pause(&mut books, key, until, false);
        }
        if learned.is_nothing() {
            books.learned.remove(key);
            return;
        }
        books.learned_count += 1;
        let count = books.learned_count;
        if let Some(known) = books.learned.get_mut(key) {
            known.0.clone_from(learned);
            known.1 = count;
            return;
        }
        if books.learned.len() >= self.max_local_keys {
            forget_stalest(&mut books.learned);
        }
        books
            .learned
            .insert(key.to_owned(), (learned.clone(), count));
    }

    /// `taken` as an open call made in Redis, if it is one.
    pub(super) fn redis_call(taken: &GiveBackId) -> Option<&RedisCall<K>> {
        let GiveBackId::Boxed(taken) = taken else {
            return None;
        };
        taken.downcast_ref::<RedisCall<K>>()
    }

    /// Gives back the open call `call` (dropped before its wait passed; one
    /// whose moment has passed is kept instead, by the script).
    pub(super) fn give_back_call(&self, call: &RedisCall<K>) {
        self.give_back_in_redis(Arc::clone(&call.redis_key), call.token);
    }

    /// `GivesBack::settle` of an open call made in Redis.
    pub(super) fn settle_call(&self, call: &RedisCall<K>, charged: &Cost, actual: &Cost) {
        let op = Call::Settle {
            token: call.token,
            charged: charged.clone(),
            actual: actual.clone(),
        };
        self.in_order(call, op);
    }

    /// `GivesBack::learn` of an open call made in Redis.
    pub(super) fn learn_call(&self, call: &RedisCall<K>, lesson: &Lesson, learning: &Learning) {
        let op = Call::Learn {
            lesson: Box::new(lesson.clone()),
            learning: *learning,
        };
        self.in_order(call, op);
    }

    /// `GivesBack::keep` of an open call made in Redis: it is settled for
    /// good, and leaves the key's log (which would otherwise hold it, and
    /// every request after it, until it fills).
    pub(super) fn keep_call(&self, call: &RedisCall<K>) {
        self.in_order(call, Call::Keep(call.token));
    }

    /// Runs `op` (a settle, a learn or a keep) for `call` in the
    /// background, once the operations sent for it before have ended.
    fn in_order(&self, call: &RedisCall<K>, op: Call) {
        let Some(this) = self.this.upgrade() else {
            return;
        };
        let (done, finished) = oneshot::channel();
        let previous = call
            .previous
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(finished);
        let key = call.key.clone();
        let came = self.now();
        self.backend.spawn(async move {
            if let Some(previous) = previous {
                // (Ended, or dropped with its runtime: either way, go.)
                let _ = previous.await;
            }
            this.apply(&key, op, came).await;
            let _ = done.send(());
        });
    }

    /// Sends `op` for a call of `key`, made at `came`, to Redis, or, while
    /// Redis is down (or if the round trip fails), has the fallback count
    /// it (see the module's rule); a lesson aged by the time it waited.
    async fn apply(&self, key: &K, mut op: Call, came: u64) {
        let target = self.target(key);
        let mut since = came;
        if !self.is_down(&target) {
            let now = self.now();
            aged(&mut op, now.saturating_sub(since));
            since = now;
            // (Not `send`: a settle's or a keep's integer is no debt.)
            match send::<Reply>(&self.backend, &target, op.clone(), None, None).await {
                Ok(reply) => {
                    // A learn's reply, or the charge of a settle's excess:
                    // what the key owes and learned after it.
                    self.note_reply(key, &reply);
                    return;
                }
                Err(Failure::Refused(error)) => {
                    tracing::debug!(key = %target.key, error = %error, "a call's update was refused");
                    return;
                }
                Err(Failure::Down(_)) => {}
            }
        }
        let now = self.now();
        aged(&mut op, now.saturating_sub(since));
        match op {
            Call::Settle {
                charged, actual, ..
            } => {
                let limits = self.script_args.len();
                let more = actual.more_than(&charged, limits);
                if !more.is_zero(limits) {
                    self.locally(key, |local| local.charge(key, &more));
                }
            }
            Call::Learn { lesson, learning } if self.fallback == Fallback::Local => {
                self.locally(key, |local| local.learn_key(key, &lesson, &learning));
            }
            // A fallback that holds no keys cannot learn it: Redis does,
            // once it is back.
            op @ (Call::Learn { .. } | Call::Keep(_)) => {
                let mut books = self.books();
                if books.queued.len() < self.max_queued() {
                    books.queued.push((key.clone(), op, now));
                }
                drop(books);
                self.activate();
            }
            // Nothing else is sent for a call once it is made.
            _ => {}
        }
    }

    /// Runs `update` on `key` in the fallback (opened at its floor and its
    /// learned rates if it is not held), under the lock; nothing for a
    /// limiter that fails open or closed, which holds no keys.
    pub(super) fn locally(&self, key: &K, update: impl FnOnce(&Keyed<K, C>)) {
        if self.fallback != Fallback::Local {
            return;
        }
        let mut books = self.books();
        self.open_locally(&mut books, key);
        update(&self.local);
        drop(books);
        if !self.is_down(&self.target(key)) {
            // Redis came back meanwhile: carry the key back now.
            self.carry_all();
        }
    }

    /// How many messages of calls `Books::queued` holds at most: as many
    /// as the keys the fallback may hold, and at least [`MIN_QUEUED`], so
    /// that the calls in flight on a limiter with one key (or few) when
    /// Redis went down are not cut to one message.
    fn max_queued(&self) -> usize {
        self.max_local_keys.max(MIN_QUEUED)
    }

    /// Sends what calls could not send Redis while it was down (see
    /// `Books::queued`): a lesson's pause shortened by the time it waited
    /// (it pauses from when it is sent); what meets its part of Redis down
    /// again waits for its next recovery (a keep lost for good only leaves
    /// its call in the log until the log fills and lets it go).
    pub(super) async fn send_queued(&self) {
        let queued = std::mem::take(&mut self.books().queued);
        let mut again = Vec::new();
        for (key, mut op, came) in queued {
            let target = self.target(&key);
            let now = self.now();
            aged(&mut op, now.saturating_sub(came));
            let sent = match self.is_down(&target) {
                true => Err(Failure::Down(None)),
                false => send::<Reply>(&self.backend, &target, op.clone(), None, None).await,
            };
            match sent {
                Ok(reply) => self.note_reply(&key, &reply),
                Err(Failure::Down(_)) => again.push((key, op, now)),
                Err(Failure::Refused(_)) => {}
            }
        }
        let mut books = self.books();
        let room = self.max_queued().saturating_sub(books.queued.len());
        books.queued.extend(again.into_iter().take(room));
    }
}

/// Forgets the eighth (one at least) of `learned` heard of longest ago, in
/// one pass: a full map makes room for `len / 8` keys at once, so that
/// the passes cost a few looks per key noted, amortized.
fn forget_stalest<K>(learned: &mut HashMap<K, (crate::core::Adopted, u64)>) {
    let mut counts: Vec<u64> = learned.values().map(|(_, count)| *count).collect();
    if counts.is_empty() {
        return;
    }
    let last = (counts.len() / 8).max(1) - 1;
    let (_, &mut cut, _) = counts.select_nth_unstable(last);
    learned.retain(|_, (_, count)| *count > cut);
}

/// `op` as it is sent or learned `waited` µs after it was made: a
/// lesson's waits count from when it came (as its reply's did), a
/// refusal's pause without `Retry-After` (its learning's) too, and its call
/// went that much longer before it.
fn aged(op: &mut Call, waited: u64) {
    if let Call::Learn { lesson, learning } = op {
        if lesson.throttled && lesson.retry_after_micros.is_none() {
            lesson.retry_after_micros = Some(learning.pause_micros);
        }
        let left = |after: Option<u64>| after.map(|after| after.saturating_sub(waited));
        lesson.retry_after_micros = left(lesson.retry_after_micros);
        for reported in &mut lesson.limits {
            reported.reset_micros = left(reported.reset_micros);
        }
        lesson.sent_ago_micros = Some(lesson.sent_ago_micros.unwrap_or(0).saturating_add(waited));
    }
}
