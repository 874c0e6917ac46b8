//! What the script must hold and reply, from `core::Limits`: the limits'
//! states, and beside them what the script keeps of its own (the log of
//! requests that may be given back, the ids it gives, the TTL it records,
//! the record of the last grant).
//!
//! A give-back's state comes from a twin: a `Limits` that replays every
//! request, resume, rate change and lesson the key saw, but those given
//! back (a lesson's caps on what is left where it was learned, as the
//! script's log replays them). (The
//! script logs a resume, where `Limits::resume` empties the log, so that a
//! reservation that reached Redis late is still given back exactly after
//! the carry-back of an outage; what the twin replays is the definition of
//! an exact give-back in `core::Limits`.)

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use paceline::Cost;
use paceline::core::{
    Bursty, Granted, Learning, Lesson, Limits, MAX_MICROS, Policy, State, WarmingUp,
};

/// The most requests the script's log keeps.
pub const LOG_CAPACITY: usize = 128;
/// The script's TTL cap, in milliseconds: floor(2^53 / 1000).
const TTL_CAP_MS: f64 = 9_007_199_254_740.0;
/// The most the script adds to a TTL it sets, in milliseconds.
const TTL_MAX_SLACK_MS: f64 = 1_000.0;

/// One limit's configuration, fixed for a sequence (its rate is not).
#[derive(Debug, Clone)]
pub enum LimitConfig {
    Bursty {
        max_burst_micros: u64,
    },
    WarmingUp {
        warmup_micros: u64,
        cold_factor: f64,
    },
}

impl LimitConfig {
    pub fn policy(&self) -> Policy {
        match *self {
            LimitConfig::Bursty { max_burst_micros } => {
                Policy::Bursty(Bursty::new(Duration::from_micros(max_burst_micros)))
            }
            LimitConfig::WarmingUp {
                warmup_micros,
                cold_factor,
            } => Policy::WarmingUp(WarmingUp::new(
                Duration::from_micros(warmup_micros),
                cold_factor,
            )),
        }
    }

    /// Its arguments after the rate: policy, max_burst_micros |
    /// warmup_micros, cold_factor.
    pub fn argv(&self) -> (&'static str, u64, f64) {
        match *self {
            LimitConfig::Bursty { max_burst_micros } => ("bursty", max_burst_micros, 0.0),
            LimitConfig::WarmingUp {
                warmup_micros,
                cold_factor,
            } => ("warming_up", warmup_micros, cold_factor),
        }
    }

    /// The limit at `rate` as a missing key reads it at `now`: full.
    pub fn full(&self, rate: f64, now: u64) -> State {
        State::full(self.policy(), rate, now).expect("a valid rate")
    }
}

/// A request in the script's log: its id (-1: none; -1 - i: the resume of
/// limit i, 1-based, whose debt is its every count; -101 - i: a lesson's
/// cap on what limit i stores, what the upstream said is left as its every
/// count), now, moment (a resume's or a cap's: its now), whether it is an
/// open call, and its count for each limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: f64,
    pub now: u64,
    pub moment: u64,
    pub open: bool,
    pub counts: Vec<u64>,
}

impl Entry {
    /// Its doubles, as the value lays them out: the first count of an open
    /// call as -1 - count.
    pub fn numbers(&self) -> Vec<f64> {
        let first = self.counts[0] as f64;
        let first = if self.open { -1.0 - first } else { first };
        let mut numbers = vec![self.id, first, self.now as f64, self.moment as f64];
        numbers.extend(self.counts[1..].iter().map(|&c| c as f64));
        numbers
    }
}

/// What the key saw, in order, for the twin to replay.
#[derive(Debug, Clone)]
enum Op {
    Reserve {
        cost: Vec<u32>,
        now: u64,
        id: Option<u64>,
    },
    Resume {
        debts: Vec<u64>,
        now: u64,
    },
    SetRate {
        limit: usize,
        rate: f64,
        now: u64,
    },
    Learn {
        lesson: Lesson,
        learning: Learning,
        now: u64,
    },
}

/// The key as the script must hold it.
#[derive(Clone)]
pub struct Model {
    pub config: Vec<LimitConfig>,
    /// Whether the key was written (else it is missing).
    pub written: bool,
    /// The limits as the key was first written.
    start: Vec<State>,
    pub limits: Limits,
    /// The rates the calls configured (the ceilings of what is learned).
    ceilings: Vec<f64>,
    history: Vec<Op>,
    given_back: HashSet<u64>,
    pub log: VecDeque<Entry>,
    pub next_id: u64,
    pub expires: f64,
    pub last_now: u64,
    /// The record: the moment of the last grant and the limit that bound it.
    pub record: (u64, i64),
    /// The TTL a batch set last, if it set one.
    pub batch_ttl: Option<f64>,
}

/// A grant: its wait, the limit that bound it (-1: none), its id.
pub type Grant = (u64, i64, Option<u64>);

/// Charges `cost` to `limits` at `now` as a request that does not wait
/// (an open call, kept at once): its grant.
fn charge(limits: &mut Limits, cost: &[u32], now: u64) -> Granted {
    let granted = limits
        .open(&Cost::each(cost.iter().copied()), now, u64::MAX)
        .expect("no timeout");
    limits.keep(granted.id.expect("a call has an id"), now);
    granted
}

impl Model {
    pub fn new(config: Vec<LimitConfig>) -> Model {
        let limits = Limits::new(config.iter().map(|c| c.full(1.0, 0)).collect()).unwrap();
        Model {
            ceilings: vec![1.0; config.len()],
            config,
            written: false,
            start: Vec::new(),
            limits,
            history: Vec::new(),
            given_back: HashSet::new(),
            log: VecDeque::new(),
            next_id: 0,
            expires: 0.0,
            last_now: 0,
            record: (0, -1),
            batch_ttl: None,
        }
    }

    /// The clock the script computes with: never below the key's latest.
    pub fn now(&self, time: u64) -> u64 {
        if self.written {
            time.max(self.last_now)
        } else {
            time
        }
    }

    /// The limits as a call at `rates` reads them at `now` (a missing key:
    /// full).
    pub fn read(&self, rates: &[f64], now: u64) -> Vec<State> {
        if self.written {
            self.limits.states().to_vec()
        } else {
            self.fresh(rates, now)
        }
    }

    fn fresh(&self, rates: &[f64], now: u64) -> Vec<State> {
        self.config
            .iter()
            .zip(rates)
            .map(|(c, &rate)| c.full(rate, now))
            .collect()
    }

    /// The latest ticket, or now, and the limit it is (-1: none).
    pub fn earliest(states: &[State], now: u64) -> (u64, i64) {
        let mut moment = now;
        let mut bound = -1;
        for (i, state) in states.iter().enumerate() {
            if state.next_free_micros() > moment {
                moment = state.next_free_micros();
                bound = i as i64;
            }
        }
        (moment, bound)
    }

    /// The limits' rates now.
    fn rates(&self) -> Vec<f64> {
        self.limits
            .states()
            .iter()
            .map(State::permits_per_second)
            .collect()
    }

    /// The limits at the configured `rates`, as a call that writes finds
    /// them at `now`: what they learned makes of them the rates they run
    /// at (State::set_rate of each limit whose rate changes; the log
    /// empties).
    pub fn set_rates(&mut self, rates: &[f64], now: u64) -> bool {
        let before = self.rates();
        for (i, &rate) in rates.iter().enumerate() {
            if self.ceilings[i] != rate {
                self.limits.set_rate(Some(i), rate, now).unwrap();
                self.ceilings[i] = rate;
                self.history.push(Op::SetRate {
                    limit: i,
                    rate,
                    now,
                });
            }
        }
        let changed = self.rates() != before;
        if changed {
            self.log.clear();
        }
        changed
    }

    /// Whether the rates in force at `rates` differ from the limits'
    /// (a call then finds the log void).
    pub fn rates_change(&self, rates: &[f64], now: u64) -> bool {
        let mut next = self.clone();
        next.set_rates(rates, now)
    }

    /// A call that writes: the key is written as it reads if it was
    /// missing, then takes the rates in force.
    pub fn begin_write(&mut self, rates: &[f64], now: u64) {
        if !self.written {
            self.start = self.fresh(rates, now);
            self.limits = Limits::new(self.start.clone()).unwrap();
            self.ceilings = rates.to_vec();
            self.history.clear();
            self.given_back.clear();
            self.log.clear();
            self.next_id = 0;
            self.expires = 0.0;
            self.written = true;
        }
        self.set_rates(rates, now);
    }

    /// Whether `entry` stays at the head of the log at `now`
    /// (Limits::expire): it has an id, and is open or its moment is ahead.
    fn stays(entry: &Entry, now: u64) -> bool {
        entry.id >= 0.0 && (entry.open || entry.moment > now)
    }

    /// The log before a request is logged: those at its head that can no
    /// longer be given back leave it, and the oldest when it is full.
    fn expire(&mut self, now: u64) {
        while let Some(front) = self.log.front() {
            if Self::stays(front, now) && self.log.len() < LOG_CAPACITY {
                break;
            }
            self.log.pop_front();
        }
    }

    /// The log after a give-back, keep or settle: the requests before the
    /// first that stays leave it.
    fn fold_front(&mut self, now: u64) {
        let first = self
            .log
            .iter()
            .position(|e| Self::stays(e, now))
            .unwrap_or(self.log.len());
        self.log.drain(..first);
    }

    /// A reservation of `cost` at `now` (after `begin_write`), held, or an
    /// open call (`open`); `Err` with its wait and bound if a try with
    /// `timeout` is refused.
    pub fn reserve(
        &mut self,
        cost: &[u32],
        now: u64,
        timeout: Option<u64>,
        held: bool,
        open: bool,
    ) -> Result<Grant, (u64, i64)> {
        let (moment, bound) = Self::earliest(self.limits.states(), now);
        if timeout.is_some_and(|t| moment - now > t) {
            return Err((moment - now, bound));
        }
        // Ids end at 2^53 - 2: a held reservation that finds none left gets
        // none, and next_id says so (2^53); a call is refused with an error,
        // which no sequence here meets (its clock starts in 2023 and moves
        // days at a step).
        let id = (open || held && moment > now)
            .then(|| {
                let id = self.next_id.max(now);
                self.next_id = if id < MAX_MICROS - 1 {
                    id + 1
                } else {
                    MAX_MICROS
                };
                assert!(!open || id < MAX_MICROS - 1, "a call with no id left");
                (id < MAX_MICROS - 1).then_some(id)
            })
            .flatten();
        self.expire(now);
        if id.is_some() || !self.log.is_empty() {
            self.log.push_back(Entry {
                id: id.map_or(-1.0, |id| id as f64),
                now,
                moment,
                open,
                counts: cost.iter().map(|&c| u64::from(c)).collect(),
            });
        }
        let granted = charge(&mut self.limits, cost, now);
        assert_eq!(granted.moment_micros, moment);
        self.history.push(Op::Reserve {
            cost: cost.to_vec(),
            now,
            id,
        });
        self.record = (moment, bound);
        Ok((moment - now, bound, id))
    }

    /// A resume of `debts` (one per limit) at `now`: each limit's debt is
    /// logged in turn while the log holds anything.
    pub fn resume(&mut self, debts: &[u64], now: u64) {
        for (i, &debt) in debts.iter().enumerate() {
            self.expire(now);
            if !self.log.is_empty() {
                self.log.push_back(Entry {
                    id: -2.0 - i as f64,
                    now,
                    moment: now,
                    open: false,
                    counts: vec![debt; debts.len()],
                });
            }
        }
        self.limits.resume(debts, now);
        self.history.push(Op::Resume {
            debts: debts.to_vec(),
            now,
        });
        self.record = (now, -1);
    }

    /// The twin: the limits had every request but those given back been
    /// made, with the costs settled since, each lesson learned where it
    /// was (what it said is left caps what the twin stores there).
    fn replay(&mut self) {
        let mut twin = Limits::new(self.start.clone()).unwrap();
        for op in &self.history {
            match op {
                Op::Reserve { cost, now, id } => {
                    if id.is_none_or(|id| !self.given_back.contains(&id)) {
                        charge(&mut twin, cost, *now);
                    }
                }
                Op::Resume { debts, now } => twin.resume(debts, *now),
                Op::SetRate { limit, rate, now } => {
                    twin.set_rate(Some(*limit), *rate, *now).unwrap()
                }
                Op::Learn {
                    lesson,
                    learning,
                    now,
                } => twin.learn(lesson, *now, learning),
            }
        }
        self.limits = twin;
    }

    /// Whether the rates in force at `rates` leave the log as it is (a
    /// give-back, keep or exact settle may use it).
    fn log_stands(&self, rates: &[f64], now: u64) -> bool {
        self.written && !self.log.is_empty() && !self.rates_change(rates, now)
    }

    /// A give-back of `id` at `now` with the call's `rates`: `Some(true)`
    /// if it was given back, `Some(false)` if an open call whose moment has
    /// passed was kept instead (a write), `None` if nothing changed.
    pub fn give_back(&mut self, id: u64, now: u64, rates: &[f64]) -> Option<bool> {
        if !self.log_stands(rates, now) {
            return None;
        }
        let id = id as f64;
        if let Some(place) = self.log.iter().position(|e| e.id == id && e.moment > now) {
            let first = self.log.iter().position(|e| Self::stays(e, now)).unwrap();
            self.log.remove(place);
            self.log.drain(..first);
            self.given_back.insert(id as u64);
            self.replay();
            self.record = (now, -1);
            return Some(true);
        }
        let entry = self.log.iter_mut().find(|e| e.id == id && e.open)?;
        (entry.id, entry.open) = (-1.0, false);
        self.fold_front(now);
        self.record = (now, -1);
        Some(false)
    }

    /// A keep of `id` at `now`: whether the log held it.
    pub fn keep(&mut self, id: u64, now: u64, rates: &[f64]) -> bool {
        if !self.log_stands(rates, now) {
            return false;
        }
        let Some(entry) = self.log.iter_mut().find(|e| e.id == id as f64) else {
            return false;
        };
        (entry.id, entry.open) = (-1.0, false);
        self.fold_front(now);
        self.record = (now, -1);
        true
    }

    /// A settle of the call `id`, charged `charged`, at `actual`: `Some` if
    /// it writes: `Ok` if it was exact, else the grant of what it cost past
    /// its charge.
    pub fn settle(
        &mut self,
        id: u64,
        charged: &[u32],
        actual: &[u32],
        now: u64,
        rates: &[f64],
    ) -> Option<Result<(), Grant>> {
        let logged =
            self.log_stands(rates, now) && self.log.iter().any(|e| e.id == id as f64 && e.open);
        if logged {
            let entry = self
                .log
                .iter_mut()
                .find(|e| e.id == id as f64 && e.open)
                .unwrap();
            entry.counts = actual.iter().map(|&c| u64::from(c)).collect();
            self.fold_front(now);
            for op in &mut self.history {
                if let Op::Reserve {
                    cost, id: Some(i), ..
                } = op
                    && *i == id
                {
                    cost.clone_from(&actual.to_vec());
                }
            }
            self.replay();
            self.record = (now, -1);
            return Some(Ok(()));
        }
        let more: Vec<u32> = actual
            .iter()
            .zip(charged)
            .map(|(a, c)| a.saturating_sub(*c))
            .collect();
        if more.iter().all(|&m| m == 0) {
            return None;
        }
        self.begin_write(rates, now);
        Some(Err(self.reserve(&more, now, None, false, false).unwrap()))
    }

    /// A learn of `lesson` under `learning` (whose pause is
    /// `pause_micros`) at `now` (after `begin_write`).
    pub fn learn(&mut self, lesson: &Lesson, learning: &Learning, pause_micros: u64, now: u64) {
        let before = self.rates();
        self.limits.learn(lesson, now, learning);
        let n = self.config.len();
        let pause = lesson
            .throttled
            .then(|| now.saturating_add(lesson.retry_after_micros.unwrap_or(pause_micros)));
        let pausing = (0..n).any(|i| {
            let spent = lesson.limits.get(i).and_then(|r| {
                (r.remaining == Some(0)).then_some(now.saturating_add(r.reset_micros?))
            });
            pause
                .max(spent)
                .is_some_and(|until| until.min(MAX_MICROS) > now)
        });
        if pausing || self.rates() != before {
            self.log.clear();
        }
        // What the upstream says each limit has left caps what it stores
        // (one fewer: beside the one that goes when nothing is owed), and
        // is logged, in turn, while the log holds anything (whether it
        // took some away or not), so that a replay caps at the same place
        // (0 included: a spent limit with a reset is paused above).
        for (i, reported) in lesson.limits.iter().enumerate().take(n) {
            if let Some(left) = reported
                .remaining
                .map(|left| (left as f64 - 1.0).max(0.0) as u64)
            {
                self.expire(now);
                if !self.log.is_empty() {
                    self.log.push_back(Entry {
                        id: -102.0 - i as f64,
                        now,
                        moment: now,
                        open: false,
                        counts: vec![left; n],
                    });
                }
            }
        }
        self.history.push(Op::Learn {
            lesson: lesson.clone(),
            learning: *learning,
            now,
        });
        self.record = (now, -1);
    }

    /// The script's TTL rule after a write at `time` (the clock as read):
    /// the TTL set, if one is, and the end recorded. The same f64
    /// operations as the script.
    pub fn ttl_after_write(&mut self, time: u64) -> Option<f64> {
        let mut need = 0.0;
        for (i, state) in self.limits.states().iter().enumerate() {
            let cool_down = match &state.policy() {
                Policy::WarmingUp(w) if state.max_permits() > 0.0 => {
                    w.warmup_micros as f64 / state.max_permits()
                }
                _ => state.stable_interval_micros(),
            };
            let limit = (state.next_free_micros() as f64 - time as f64) / 1000.0
                + (state.max_permits() - state.stored_permits()) * cool_down / 1000.0;
            if i == 0 || limit > need {
                need = limit;
            }
        }
        let raw = need;
        let need = if need < TTL_CAP_MS - 2.0 {
            if need > 0.0 { need.ceil() + 2.0 } else { 2.0 }
        } else {
            TTL_CAP_MS
        };
        let time = time as f64;
        // (The script keeps a TTL that covers the need with 3 ms to spare
        // at once, as it reads it.)
        if time + raw * 1000.0 + 3000.0 <= self.expires || time + need * 1000.0 <= self.expires {
            None
        } else {
            let ttl = (need + need.min(TTL_MAX_SLACK_MS)).min(TTL_CAP_MS);
            self.expires = time + ttl * 1000.0;
            Some(ttl)
        }
    }
}

/// A whole µs, checked.
pub fn micros(x: f64) -> u64 {
    assert!(
        x >= 0.0 && x.fract() == 0.0 && x <= MAX_MICROS as f64,
        "{x}"
    );
    x as u64
}
