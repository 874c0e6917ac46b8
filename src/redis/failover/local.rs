//! Serving locally while Redis is down, and carrying back what was served:
//! the books of known debts, the floor a key opens at, and the carry-back
//! (see [the rule at every switch](super)).

use super::*;

impl<K: Key + Display, C: Clock> Failover<K, C> {
    /// Serves `key` from the fallback (or fails open or closed): opens the
    /// key at its floor and runs `serve` on the local limiter, under the
    /// lock. `Err` with a wake-up to await if the key is being carried back
    /// and the caller is `patient` (it then routes again); an impatient one
    /// is served here.
    pub(super) fn serve_locally<'a, Q>(
        &'a self,
        key: &Q,
        target: &ProbeTarget,
        failure: Option<BackendError>,
        patient: bool,
        serve: impl FnOnce(&'a Keyed<K, C>) -> Result<Option<Reservation<'a>>, Error>,
    ) -> Result<Result<Option<Reservation<'a>>, Error>, Carried<'a>>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.fallback == Fallback::FailClosed {
            self.count_fallback_call();
            return Ok(Err(self.closed_error(failure)));
        }
        let mut books = self.books();
        if patient && let Some(carried) = self.carrying(&books, key) {
            // Not served: counted where it is, once it routes again.
            return Err(carried);
        }
        self.count_fallback_call();
        self.open_locally(&mut books, key);
        let served = match self.fallback {
            // Given back, settled and learned from through the fail-over,
            // so that what changes the key once Redis is back reaches it.
            Fallback::Local => serve(&self.local).map(|served| served.map(|r| r.owned_by(self))),
            _ => Ok(Some(Reservation::new(
                Duration::ZERO,
                self.local.clock(),
                None,
            ))),
        };
        drop(books);
        if !self.is_down(target) {
            // Redis came back meanwhile: carry the key back now.
            self.carry_all();
        }
        Ok(served)
    }

    /// What `key` holds while its part of Redis is down: the fallback's
    /// state if it holds the key; otherwise nothing stored and its floor
    /// to wait for (nothing is opened); for a `patient` caller, once any
    /// carry-back of the key has ended. Failing open, every request goes.
    pub(super) fn snapshot_locally<'a, Q>(
        &'a self,
        key: &Q,
        failure: Option<BackendError>,
        patient: bool,
    ) -> Result<Result<Snapshot, Error>, Carried<'a>>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ?Sized,
    {
        let books = match self.fallback {
            Fallback::Local => self.books(),
            Fallback::FailClosed => {
                self.count_fallback_call();
                return Ok(Err(self.closed_error(failure)));
            }
            Fallback::FailOpen => {
                self.count_fallback_call();
                return Ok(Ok(Snapshot::waiting(Duration::ZERO, f64::INFINITY)));
            }
        };
        if patient && let Some(carried) = self.carrying(&books, key) {
            // Not answered: counted where it is, once it routes again.
            return Err(carried);
        }
        self.count_fallback_call();
        if self.local.ticket(key).is_some() {
            return Ok(Ok(self.local.snapshot_of(key)));
        }
        let wait = self.floor(&books, key).saturating_sub(self.now());
        let rate = f64::from_bits(self.rate_bits.load(Ordering::Relaxed));
        Ok(Ok(Snapshot::waiting(Duration::from_micros(wait), rate)))
    }

    /// A call the fallback serves (or refuses, failing closed), counted
    /// once: this limiter's, and the backend's. A caller that waits for its
    /// key's carry-back instead is counted where it is then served.
    fn count_fallback_call(&self) {
        self.fallback_calls.fetch_add(1, Ordering::Relaxed);
        self.backend.health.count_fallback_call();
    }

    /// The fallback holds keys from now on: the backend tells this limiter
    /// when Redis recovers, so that they go back even if never called.
    pub(super) fn activate(&self) {
        self.active.store(true, Ordering::Release);
        if !self.registered.swap(true, Ordering::AcqRel) {
            let this: Weak<dyn Recover> = self.this.clone();
            self.backend.on_recovery(this);
        }
    }

    /// Holds `key` in the fallback (active from then on), unless it does
    /// already: at its floor and its learned rates (`Books::learned`), under
    /// the lock, in `books`.
    ///
    /// A late grant heard of before the key opens is then part of its floor:
    /// the fallback's schedule starts after it, so the carry-back must not
    /// take it for one of the fallback's grants. It becomes the key's known
    /// debt (which only grows by it), and only late grants heard of while the
    /// key is held have their own charge subtracted from what the key
    /// carries back.
    pub(super) fn open_locally<Q>(&self, books: &mut Books<K>, key: &Q)
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.activate();
        if self.local.ticket(key).is_none() {
            let floor = self.floor(books, key);
            if !books.late.is_empty()
                && let Some(LateGrants { until: late, .. }) =
                    books.late.remove(&*self.redis_key(key))
            {
                // (A key whose debt does not fit among the known ones is
                // carried back from now: that errs towards limiting.)
                if let Some(known) = books.known.get_mut(key) {
                    *known = (*known).max(late);
                } else if books.known.len() < self.max_local_keys {
                    books.known.insert(key.to_owned(), late);
                    self.known_len.store(books.known.len(), Ordering::Relaxed);
                }
            }
            // At its share of the rates the upstream reports.
            let learned = books.learned.get(key).map(|(learned, _)| learned.clone());
            let learned = learned.map(|learned| learned.scaled(self.local_fraction));
            self.local.open(key, floor, learned.as_ref());
            // (0: none known, as `known_exactly` says.)
            let known = books.known.get(key).copied().unwrap_or(0);
            // (Those of keys dropped at the cap go once as many again came:
            // a look at each of at most twice `max_local_keys` entries.)
            if books.opened.len() >= self.max_local_keys.saturating_mul(2) {
                books
                    .opened
                    .retain(|held, _| self.local.ticket::<K>(held).is_some());
            }
            books.opened.insert(key.to_owned(), known);
        }
    }

    /// Where `key` opens in the fallback: no earlier than the debt Redis
    /// reported for it ([`reported`](Self::reported)), its late grants' debt
    /// and the fallback's dropped keys.
    pub(super) fn floor<Q>(&self, books: &Books<K>, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ?Sized,
    {
        self.reported(books, key)
            .max(self.late_in(books, key))
            .max(self.local.dropped_until())
    }

    /// No earlier than now, the end of the debt Redis reported for `key`
    /// (for a key not known exactly, the latest of its bucket).
    fn reported<Q>(&self, books: &Books<K>, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let known = books.known.get(key).copied();
        self.now()
            .max(known.unwrap_or_else(|| books.overflow[self.bucket(key)]))
    }

    /// A wake-up for the end of `key`'s carry-back, if one is under way
    /// (taken under the lock, so that the end cannot pass unseen).
    pub(super) fn carrying<Q>(&self, books: &Books<K>, key: &Q) -> Option<Carried<'_>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        books
            .carrying
            .contains(key)
            .then(|| Box::pin(self.carried.notified()))
    }

    pub(super) fn bucket<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        (self.bucket_hasher.hash_one(key) % BUCKETS as u64) as usize
    }

    /// Remembers how long `key` owes after a Redis reply.
    pub(super) fn note_debt<Q>(&self, key: &Q, debt_micros: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if debt_micros == 0 && self.known_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut books = self.books();
        let now = self.now();
        let until = now.saturating_add(debt_micros);
        if debt_micros == 0 {
            books.known.remove(key);
        } else if let Some(known) = books.known.get_mut(key) {
            *known = until;
        } else if books.known.room(self.max_local_keys, now, |until| *until) {
            books.known.insert(key.to_owned(), until);
        } else {
            // Kept coarsely: a key of this bucket opens no earlier.
            let bucket = &mut books.overflow[self.bucket(key)];
            *bucket = (*bucket).max(until);
        }
        self.known_len.store(books.known.len(), Ordering::Relaxed);
    }

    /// The exact end of the debt Redis reported for `key`, if it is known
    /// (0 otherwise: what Redis holds is then taken to be nothing, which
    /// errs towards limiting): by a reply, or by a late grant.
    pub(super) fn known_exactly<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.books().known.get(key).copied().unwrap_or(0)
    }

    /// Waits, at most the response timeout, for the round trips of `key`
    /// whose callers stopped waiting (see [`Late`]): a grant Redis made
    /// late is then known before the carry-back, which counts it once.
    /// (After a stall, Redis answers them first, before the probe that
    /// finds it back: the wait is a task's turn.)
    async fn await_answers(&self, key: &K) {
        let redis_key = self.redis_key(key);
        let deadline = self.backend.options.response_deadline();
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if !self.books().awaited.contains_key(&redis_key) {
                return;
            }
            if tokio::time::timeout_at(deadline, answered).await.is_err() {
                return;
            }
        }
    }

    /// `key`'s late grants (see [`Late`]; none: zeros), taken: the
    /// carry-back counts them once.
    fn late_grants<Q>(&self, key: &Q) -> LateGrants
    where
        Q: Display + ?Sized,
    {
        let mut books = self.books();
        if books.late.is_empty() {
            return LateGrants::default();
        }
        books.late.remove(&*self.redis_key(key)).unwrap_or_default()
    }

    /// When the debt of late grants of `key` ends (see [`Late`]), if one
    /// was heard of (0 otherwise).
    fn late_in<Q>(&self, books: &Books<K>, key: &Q) -> u64
    where
        Q: Display + ?Sized,
    {
        if books.late.is_empty() {
            return 0;
        }
        books
            .late
            .get(&*self.redis_key(key))
            .map_or(0, |late| late.until)
    }

    /// After an outage in which the fallback dropped keys with debts: the
    /// first call of a key whose debt Redis reported ends before the
    /// latest dropped ticket has it charged up to it, once, in the
    /// background (so that no caller's progress hangs on a future that may
    /// never be polled again): the key is marked as being carried
    /// meanwhile, and its callers, that one included, wait for it (as for
    /// a carry-back): that one then goes to Redis, the others find it among
    /// the keys charged. (Not by its
    /// debt: the ticket is at the fallback's share of the rate, the charge
    /// at the shared rate, so with a share below 1 the debt Redis reports
    /// ends before the ticket.) A key past `max_local_keys` of them is
    /// charged again at its next call, erring towards limiting; one whose
    /// charge found Redis down goes where its route then says. A key Redis
    /// lost meanwhile gets back the debt it had reported too (see
    /// [`resume_lost`](Self::resume_lost)).
    pub(super) fn charge_floor<'a, Q>(&'a self, key: &Q, target: &ProbeTarget) -> Floor<'a>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let dropped = self.local.dropped_until();
        if dropped == 0 || self.fallback != Fallback::Local || dropped <= self.now() {
            return Floor::Charged;
        }
        let mut books = self.books();
        if let Some(charging) = self.carrying(&books, key) {
            return Floor::Busy(charging);
        }
        if books.floored_for != dropped {
            books.floored.clear();
            books.floored_for = dropped;
        }
        if books.floored.contains(key) {
            return Floor::Charged;
        }
        // A key not known exactly goes by its bucket, where its own
        // charge is noted too: it is charged once either way (a key
        // whose bucket holds a later debt of another is not charged).
        let known = self.reported(&books, key);
        let known_exactly = books.known.get(key).copied();
        let Some(failover) = self.this.upgrade().filter(|_| dropped > known) else {
            return Floor::Charged;
        };
        books.carrying.insert(key.to_owned());
        let charging = self.carrying(&books, key).expect("marked above");
        drop(books);
        let marked = Marked {
            failover,
            key: key.to_owned(),
        };
        // The same for every limit.
        let debt = self.at_shared_rate(dropped - known);
        let resume = Call::Resume {
            debts_micros: vec![debt; self.script_args.len()].into(),
        };
        let target = target.clone();
        // Where the debt Redis reported for the key ends, if known (see
        // `resume_lost`: a key it lost is charged that debt too).
        let reported = known_exactly.unwrap_or(0);
        // Dropped unrun (the runtime gone), it lifts the mark at once.
        self.backend.spawn(async move {
            let failover = &marked.failover;
            let charged = match failover.send::<K>(&marked.key, &target, resume, None).await {
                Ok(reply) => {
                    let key = &marked.key;
                    (failover.resume_lost(key, &target, reported, &[debt], &reply)).await
                }
                Err(failure) => Err(failure),
            };
            if let Ok(()) | Err(Failure::Refused(_)) = charged {
                let mut books = failover.books();
                if books.floored_for == dropped && books.floored.len() < failover.max_local_keys {
                    books.floored.insert(marked.key.clone());
                }
            }
        });
        Floor::Charging(charging)
    }

    /// Time at the local rate, as time at the shared rate (the same permits
    /// take `local_fraction` of it there).
    pub(super) fn at_shared_rate(&self, local_micros: u64) -> u64 {
        (local_micros as f64 * self.local_fraction) as u64
    }

    /// Carries `key` back in the background (its caller marked it as being
    /// carried; see [`Marked`]).
    pub(super) fn spawn_carry(&self, key: K) {
        let Some(failover) = self.this.upgrade() else {
            return;
        };
        let marked = Marked { failover, key };
        self.backend.spawn(async move {
            marked.failover.carry(&marked.key).await;
        });
    }

    /// Carries the fallback's debt of `key` into its Redis key: one resume
    /// with what the fallback granted beyond the debt the key opened at
    /// (and one more if Redis then owes less than that debt and the
    /// resume), then the fallback forgets the key. If Redis is down again, the key stays in
    /// the fallback, with its debt. (Its caller's [`Marked`] then wakes the
    /// key's callers.)
    pub(super) async fn carry(&self, key: &K) {
        let target = self.target(key);
        self.await_answers(key).await;
        // From the debt the key opened at: what Redis granted since (a
        // round trip sent before the switch, answered in time) is Redis's.
        let opened = self.books().opened.get(key).copied();
        let mut known = opened.unwrap_or_else(|| self.known_exactly(key));
        // What grants Redis made after their callers stopped waiting (see
        // [`Late`]) while the fallback held the key charged it beyond the
        // debt it reported: those callers were served by the fallback too,
        // so with one limit that much of the fallback's debt is in Redis
        // already: their own charge, at most, not the whole debt Redis
        // reported with them (another process's reservations among it).
        // (One heard of before the key opened is in its known debt: see
        // `open_locally`.) (With several, how much each limit was charged
        // is not known: the fallback's whole debt goes, erring towards
        // limiting.)
        let LateGrants {
            until: mut late,
            charge: late_charge,
        } = self.late_grants(key);
        // A pause the fallback learned (a refusal's, or a limit's the
        // upstream said is spent until its reset) is time, not permits:
        // carried at its length (not at the shared rate); a refusal's is
        // remembered for the callers waiting in it.
        let paused = self.local.paused_until(key);
        let pauses = self.local.pauses(key).unwrap_or_default();
        // Where Redis's debt for the key ends at least, as its replies
        // said: a later resume adds to it.
        let mut reported = self.known_exactly(key).max(known).max(late);
        while let Some(tickets) = self.local.tickets(key) {
            // One debt per limit (one for a limiter with one limit).
            let ticket = tickets.iter().copied().max().unwrap_or(0);
            let from = self.now().max(known);
            let charged = if tickets.len() == 1 {
                late.saturating_sub(from).min(late_charge)
            } else {
                0
            };
            let debts_micros = tickets
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let debt = self.at_shared_rate(t.saturating_sub(from));
                    let pause = pauses.get(i).map_or(0, |until| until.saturating_sub(from));
                    debt.max(pause).saturating_sub(charged)
                })
                .collect::<Box<[u64]>>();
            let least = debts_micros.iter().copied().min().unwrap_or(0);
            let resume = Call::Resume {
                debts_micros: debts_micros.clone(),
            };
            match self.send(key, &target, resume, None).await {
                Ok(reply) => {
                    let now = self.now();
                    let owed = reported.saturating_sub(now).saturating_add(least);
                    let lost = self
                        .resume_lost(key, &target, reported, &debts_micros, &reply)
                        .await;
                    reported = now.saturating_add(reply.debt_micros.max(owed));
                    match lost {
                        Ok(()) => {}
                        Err(Failure::Refused(_)) => {
                            self.local.forget_if_paid(key, u64::MAX);
                            break;
                        }
                        // Sent again whole with the next carry-back.
                        Err(Failure::Down(_)) => break,
                    }
                    if let Some(until) = paused {
                        self.note_pause(&mut self.books(), key, until, true);
                    }
                    if self.local.forget_if_paid(key, ticket) {
                        break;
                    }
                    // Granted meanwhile (it should not be): the rest.
                    known = ticket;
                    late = 0;
                }
                // The key holds something else: calls report it.
                Err(Failure::Refused(_)) => {
                    self.local.forget_if_paid(key, u64::MAX);
                    break;
                }
                Err(Failure::Down(_)) => break,
            }
        }
        // (Under the lock, as keys open in the fallback.)
        let mut books = self.books();
        if opened.is_some() && self.local.ticket(key).is_none() {
            books.opened.remove(key);
        }
    }

    /// After a resume of `key` that added `debts` to its limits (`reply`:
    /// what Redis then owes, the latest limit's debt), where Redis had
    /// reported a debt ending at `reported` (µs, local clock): if Redis
    /// kept less of that debt than it reported, it lost the key meanwhile
    /// (a restart, a flush, a failover to a replica that never got it), or
    /// a give-back that ran late (queued on a hung server) freed time; the
    /// fallback's callers wait behind it all the same: one more resume
    /// charges every limit what is missing (the whole debt for a key lost:
    /// which limit held it is not known). With several limits carried
    /// unequally, the reply may read the same either way (the limit that
    /// got the most shows it, whatever the others kept): what Redis then
    /// holds of each limit tells. Less than a response timeout is not told
    /// from how late a reply was read.
    async fn resume_lost(
        &self,
        key: &K,
        target: &ProbeTarget,
        reported: u64,
        debts: &[u64],
        reply: &Reply,
    ) -> Result<(), Failure> {
        let owed = reported.saturating_sub(self.now());
        let timeout = micros(self.backend.options.response_timeout);
        // What Redis kept of its debt, on the limit that kept the most, at
        // least and at most, as the reply reads.
        let least = debts.iter().copied().min().unwrap_or(0);
        let most = debts.iter().copied().max().unwrap_or(0);
        let kept = reply.debt_micros.saturating_sub(most);
        if kept.saturating_add(timeout) >= owed {
            return Ok(());
        }
        let kept = match reply.debt_micros.saturating_sub(least) {
            // Lost or not: asked.
            at_most if at_most.saturating_add(timeout) >= owed => {
                let stored: Stored = send(&self.backend, target, Call::Status, None, None).await?;
                let after = stored
                    .limits
                    .iter()
                    .map(|limit| limit.next_free_micros.saturating_sub(stored.now_micros));
                let kept = after
                    .zip(debts)
                    .map(|(after, debt)| after.saturating_sub(*debt));
                kept.max().unwrap_or(0)
            }
            _ => kept,
        };
        let lost = owed.saturating_sub(kept);
        if lost <= timeout {
            return Ok(());
        }
        let debts_micros = vec![lost; self.script_args.len()].into();
        self.send(key, target, Call::Resume { debts_micros }, None)
            .await
            .map(drop)
    }

    /// Carries every key the fallback holds back to Redis (64 at a time),
    /// skipping keys whose part of Redis is still down and keys already on
    /// their way. Runs once at a time; asked while running, it runs again.
    pub(crate) fn carry_all(&self) {
        if self.carrying_all.swap(true, Ordering::AcqRel) {
            self.again.store(true, Ordering::Release);
            return;
        }
        let Some(this) = self.this.upgrade() else {
            self.carrying_all.store(false, Ordering::Release);
            return;
        };
        self.backend.spawn(async move {
            loop {
                this.again.store(false, Ordering::Release);
                let keys = this.local.keys();
                futures::stream::iter(keys)
                    .for_each_concurrent(CARRY_CONCURRENCY, |key| {
                        let this = &this;
                        async move {
                            if this.is_down(&this.target(&key)) {
                                return;
                            }
                            if !this.books().carrying.insert(key.clone()) {
                                return;
                            }
                            let marked = Marked {
                                failover: Arc::clone(this),
                                key,
                            };
                            this.carry(&marked.key).await;
                        }
                    })
                    .await;
                this.send_queued().await;
                // Once the fallback holds nothing, calls skip the lock again.
                let books = this.books();
                if books.carrying.is_empty() && books.queued.is_empty() && this.local.len() == 0 {
                    this.active.store(false, Ordering::Release);
                }
                drop(books);
                if !this.again.swap(false, Ordering::AcqRel) {
                    this.carrying_all.store(false, Ordering::Release);
                    // Asked again between the check and the store: run.
                    if !this.again.load(Ordering::Acquire)
                        || this.carrying_all.swap(true, Ordering::AcqRel)
                    {
                        break;
                    }
                }
            }
        });
    }

    pub(super) fn closed_error(&self, failure: Option<BackendError>) -> Error {
        let keys = match &self.naming {
            Naming::Single { key, .. } => format!("key {key}"),
            Naming::Keyed { prefix } => format!("keys {prefix}*"),
        };
        Error::Backend(failure.unwrap_or_else(|| {
            BackendError::new(format!(
                "Redis is unavailable and the limiter fails closed ({keys}; last error: {})",
                self.backend.health.last_error()
            ))
        }))
    }
}
