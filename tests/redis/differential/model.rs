//! What the script must hold and reply, from `core::Limits`: the limits'
//! states, and beside them what the script keeps of its own (the log of
//! requests that may be given back, the ids it gives, the TTL it records,
//! the record of the last grant).
//!
//! A give-back's state comes from a twin: a `Limits` that replays every
//! request, resume and rate change the key saw, but those given back. (The
//! script logs a resume, where `Limits::resume` empties the log, so that a
//! reservation that reached Redis late is still given back exactly after
//! the carry-back of an outage; what the twin replays is the definition of
//! an exact give-back in `core::Limits`.)

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use paceline::core::{Bursty, Limits, MAX_MICROS, Policy, State, WarmingUp};

/// The most requests the script's log keeps.
pub const LOG_CAPACITY: usize = 64;
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
/// limit i, 1-based, whose debt is `permits`), permits, now and moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub id: f64,
    pub permits: u64,
    pub now: u64,
    pub moment: u64,
}

/// What the key saw, in order, for the twin to replay.
#[derive(Debug, Clone)]
enum Op {
    Reserve {
        permits: u32,
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

impl Model {
    pub fn new(config: Vec<LimitConfig>) -> Model {
        let limits = Limits::new(config.iter().map(|c| c.full(1.0, 0)).collect()).unwrap();
        Model {
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

    /// A call that writes: the key is written as it reads if it was
    /// missing, then takes the rates in force (State::set_rate of each
    /// limit whose rate changed; the log empties).
    pub fn begin_write(&mut self, rates: &[f64], now: u64) {
        if !self.written {
            self.start = self.fresh(rates, now);
            self.limits = Limits::new(self.start.clone()).unwrap();
            self.history.clear();
            self.given_back.clear();
            self.log.clear();
            self.next_id = 0;
            self.expires = 0.0;
            self.written = true;
        }
        for (i, &rate) in rates.iter().enumerate() {
            if self.limits.states()[i].permits_per_second() != rate {
                self.limits.set_rate(Some(i), rate, now).unwrap();
                self.history.push(Op::SetRate {
                    limit: i,
                    rate,
                    now,
                });
                self.log.clear();
            }
        }
    }

    /// The log before a request is logged: those used leave it, and the
    /// oldest when it is full.
    fn expire(&mut self, now: u64) {
        while let Some(front) = self.log.front() {
            if front.moment > now && self.log.len() < LOG_CAPACITY {
                break;
            }
            self.log.pop_front();
        }
    }

    /// A reservation of `permits` at `now` (after `begin_write`); `Err`
    /// with its wait and bound if a try with `timeout` is refused.
    pub fn reserve(
        &mut self,
        permits: u32,
        now: u64,
        timeout: Option<u64>,
        held: bool,
    ) -> Result<Grant, (u64, i64)> {
        let (moment, bound) = Self::earliest(self.limits.states(), now);
        if timeout.is_some_and(|t| moment - now > t) {
            return Err((moment - now, bound));
        }
        let id = (held && moment > now).then(|| {
            let id = self.next_id.max(now);
            self.next_id = id + 1;
            id
        });
        self.expire(now);
        if id.is_some() || !self.log.is_empty() {
            self.log.push_back(Entry {
                id: id.map_or(-1.0, |id| id as f64),
                permits: u64::from(permits),
                now,
                moment,
            });
        }
        let granted = self.limits.reserve(permits, now, false);
        assert_eq!(granted.moment_micros, moment);
        self.history.push(Op::Reserve { permits, now, id });
        self.record = (moment, bound);
        Ok((moment - now, bound, id))
    }

    /// A resume of `debts` (one per limit) at `now`.
    pub fn resume(&mut self, debts: &[u64], now: u64) {
        for (i, &debt) in debts.iter().enumerate() {
            self.expire(now);
            if !self.log.is_empty() {
                self.log.push_back(Entry {
                    id: -2.0 - i as f64,
                    permits: debt,
                    now,
                    moment: now,
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

    /// A give-back of `id` at `now` with the call's `rates`: whether it
    /// was given back.
    pub fn give_back(&mut self, id: u64, now: u64, rates: &[f64]) -> bool {
        let states = self.limits.states();
        if !self.written
            || states
                .iter()
                .zip(rates)
                .any(|(s, &r)| s.permits_per_second() != r)
        {
            return false;
        }
        let Some(place) = self
            .log
            .iter()
            .position(|e| e.id == id as f64 && e.moment > now)
        else {
            return false;
        };
        let first = self.log.iter().position(|e| e.moment > now).unwrap();
        self.log.remove(place);
        self.log.drain(..first);
        self.given_back.insert(id);
        // The twin: every request but those given back.
        let mut twin = Limits::new(self.start.clone()).unwrap();
        for op in &self.history {
            match op {
                Op::Reserve { permits, now, id } => {
                    if id.is_none_or(|id| !self.given_back.contains(&id)) {
                        twin.reserve(*permits, *now, false);
                    }
                }
                Op::Resume { debts, now } => twin.resume(debts, *now),
                Op::SetRate { limit, rate, now } => {
                    twin.set_rate(Some(*limit), *rate, *now).unwrap()
                }
            }
        }
        self.limits = Limits::new(twin.states().to_vec()).unwrap();
        self.record = (now, -1);
        true
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
        let need = if need < TTL_CAP_MS - 2.0 {
            if need > 0.0 { need.ceil() + 2.0 } else { 2.0 }
        } else {
            TTL_CAP_MS
        };
        let time = time as f64;
        if time + need * 1000.0 <= self.expires {
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
