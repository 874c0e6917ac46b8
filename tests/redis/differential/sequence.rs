//! Random sequences of calls, and what the model says the script must
//! answer to each.

use super::calls::{self, LearnArgs, Pending};
use super::model::{Entry, LimitConfig, Model};
use super::{CALLS_SEED, DEEP_SEED, GIVE_BACK_SEED};
use crate::support::rng::Rng;
use paceline::core::{Lesson, MAX_MICROS, State};

const STEPS: usize = 40;
/// The steps of a calls sequence.
const CALLS_STEPS: usize = 60;
/// The steps of a deep sequence.
const DEEP_STEPS: usize = 400;
/// Field comparisons every this many steps (and after the last step).
const FIELDS_EVERY: usize = 4;
/// A realistic clock: microseconds since the epoch, late 2023.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// How numbers are written into ARGV: the redis crate's own encoding of an
/// `f64` (shortest round trip, exponent form, e.g. `1e-300`, `5.0`) or Rust's
/// `Display` (plain decimal, e.g. `0.000…001`, `5`); `inf` either way.
#[derive(Debug, Clone, Copy)]
pub enum Encoding {
    RedisArg,
    Display,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A reservation; with a timeout, a try.
    Reserve {
        permits: u32,
        held: bool,
        timeout: Option<u64>,
    },
    /// Rewrites the key as it is (or writes a missing key as it reads).
    Probe,
    /// Back from a local fallback that ran up these debts.
    Resume {
        debts: Vec<u64>,
    },
    /// Gives back the held reservation with this id.
    Cancel {
        id: u64,
    },
    Status,
    /// Requests applied in order at one clock reading.
    Batch {
        requests: Vec<(u32, bool, Option<u64>)>,
    },
    /// An open call of these counts; with a timeout, a try.
    Call {
        cost: Vec<u32>,
        timeout: Option<u64>,
    },
    /// The call with this id, charged `charged`, cost `actual`.
    Settle {
        id: u64,
        charged: Vec<u32>,
        actual: Vec<u32>,
    },
    /// The held reservation or call with this id will not be given back.
    Keep {
        id: u64,
    },
    Learn {
        lesson: Lesson,
        args: LearnArgs,
    },
}

/// One call, as sent.
#[derive(Debug, Clone)]
pub struct Step {
    /// The clock as read (the last ARGV).
    pub now: u64,
    pub rates: Vec<f64>,
    pub kind: Kind,
}

/// What the script must reply.
#[derive(Debug, Clone)]
pub enum Expect {
    Int(i64),
    /// The value it wrote: the wait, the bound, the debt after it and the
    /// next id.
    Granted {
        wait: u64,
        bound: i64,
        debt: u64,
        next_id: u64,
    },
    /// The states it read (after the rates in force), with the clock.
    Refused {
        now: u64,
        states: Vec<State>,
    },
    Status {
        now: u64,
        states: Vec<State>,
    },
    Batch {
        replies: Vec<[f64; 3]>,
        now: u64,
        states: Vec<State>,
    },
}

/// What the key's value must hold.
#[derive(Debug, Clone)]
pub struct Fields {
    pub states: Vec<State>,
    pub expires: f64,
    pub last_now: u64,
    pub next_id: u64,
    pub record: (u64, i64),
    /// Each request's numbers, as the value lays them out.
    pub log: Vec<Vec<f64>>,
    /// What the limits learned, as the value lays it out.
    pub learned: Option<Vec<f64>>,
}

#[derive(Debug, Clone)]
pub struct Expected {
    pub reply: Expect,
    pub wrote: bool,
    /// The TTL (ms) this step's write set, or `None`.
    pub ttl_ms: Option<f64>,
    /// Whether the key exists after the step.
    pub exists: bool,
    /// The value after the step, when it is compared.
    pub fields: Option<Fields>,
}

pub struct Sequence {
    pub seed: u64,
    pub config: Vec<LimitConfig>,
    pub encoding: Encoding,
    pub steps: Vec<Step>,
    pub expected: Vec<Expected>,
    pub rate_changes: u64,
    pub backward_steps: u64,
    /// Lessons whose caps on what is left were logged, and give-backs or
    /// exact settles that replayed a log holding such a cap.
    pub caps_logged: u64,
    pub caps_replayed: u64,
}

fn random_config(rng: &mut Rng) -> LimitConfig {
    if rng.chance(0.5) {
        let max_burst_micros = match rng.below(100) {
            0..20 => 0,
            20..60 => 1_000_000,
            60..90 => rng.below(100_000_000),
            90..95 => MAX_MICROS,
            _ => u64::MAX, // capped by both sides
        };
        LimitConfig::Bursty { max_burst_micros }
    } else {
        let warmup_micros = match rng.below(100) {
            0..20 => 0,
            20..40 => rng.below(1_000), // sub-millisecond
            40..90 => rng.below(60_000_000),
            90..95 => MAX_MICROS,
            _ => u64::MAX,
        };
        let cold_factor = match rng.below(100) {
            0..25 => 1.0,
            25..60 => 3.0,
            _ => 1.0 + 9.0 * rng.f64(),
        };
        LimitConfig::WarmingUp {
            warmup_micros,
            cold_factor,
        }
    }
}

fn random_rate(rng: &mut Rng) -> f64 {
    match rng.below(100) {
        0..5 => f64::INFINITY,
        5..8 => 1e-300,
        8..10 => f64::from_bits(1), // the smallest positive double
        10..12 => f64::MAX,
        12..30 => *rng.pick(&[1.0, 2.0, 5.0, 10.0, 100.0, 1000.0, 0.5, 0.1, 3.0, 7.0]),
        // Intervals that are not whole microseconds, or below one.
        30..42 => *rng.pick(&[3e4, 1.5e5, 3e5, 7e5, 1.5e6, 3e6, 1e7, 1e9, 1e12, 12_345.678]),
        42..50 => 10f64.powf(4.0 + 6.0 * rng.f64()), // 1e4 ..= 1e10
        _ => 10f64.powf(-3.0 + 9.0 * rng.f64()),     // 1e-3 ..= 1e6
    }
}

fn random_permits(rng: &mut Rng, few: bool) -> u32 {
    match rng.below(100) {
        _ if few => 1 + rng.below(3) as u32,
        0..70 => 1 + rng.below(10) as u32,
        70..80 => 11 + rng.below(990) as u32,
        80..85 => u32::MAX,
        85..90 => 1_000_000,
        _ => (rng.next_u64() as u32).max(1),
    }
}

fn random_timeout(rng: &mut Rng, debt: u64) -> u64 {
    match rng.below(100) {
        0..30 => 0,
        30..50 => rng.below(1_000_000),
        50..75 => (debt + rng.below(3)).saturating_sub(1),
        75..85 => rng.below(1_000_000_000_000),
        85..93 => MAX_MICROS,
        _ => u64::MAX,
    }
}

pub fn generate(seed: u64) -> Sequence {
    let calls = seed >= CALLS_SEED;
    let give_backs = seed >= GIVE_BACK_SEED && !calls;
    let deep = seed >= DEEP_SEED && !calls;
    let steps_in_sequence = match () {
        _ if deep => DEEP_STEPS,
        _ if calls => CALLS_STEPS,
        _ => STEPS,
    };
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(3) as usize;
    let config: Vec<LimitConfig> = (0..n).map(|_| random_config(&mut rng)).collect();
    let encoding = if rng.chance(0.5) {
        Encoding::RedisArg
    } else {
        Encoding::Display
    };
    let mut rates: Vec<f64> = (0..n).map(|_| random_rate(&mut rng)).collect();
    let mut time = EPOCH_2023 + rng.below(1_000_000_000_000);
    let mut model = Model::new(config.clone());
    let mut steps = Vec::with_capacity(steps_in_sequence);
    let mut expected = Vec::with_capacity(steps_in_sequence);
    // The ids of held reservations granted, to give back, and the calls
    // open.
    let mut pending = Pending::default();
    let (mut rate_changes, mut backward_steps) = (0, 0);
    let (mut caps_logged, mut caps_replayed) = (0, 0);
    for i in 0..steps_in_sequence {
        // The clock: mostly small steps, sometimes none, sometimes long idle
        // gaps, sometimes exactly to the latest ticket (and one µs either
        // side), sometimes backwards (a server's clock stepped back).
        let states = model.read(&rates, model.now(time));
        let debt = Model::earliest(&states, model.now(time)).0 - model.now(time);
        let dt = match rng.below(100) {
            _ if deep => match rng.below(100) {
                0..80 => 0,
                _ => rng.below(debt / 64 + 1),
            },
            _ if give_backs => match rng.below(100) {
                0..35 => 0,
                35..85 => rng.below(debt / 16 + 1),
                _ => rng.below(debt / 4 + 1),
            },
            _ if calls => match rng.below(100) {
                0..40 => 0,
                40..70 => rng.below(debt / 8 + 1),
                70..90 => rng.below(100_000),
                _ => rng.below(10_000_000),
            },
            0..20 => 0,
            20..45 => rng.below(1_000),
            45..65 => rng.below(1_000_000),
            65..75 if debt < 86_400_000_000 => (debt + rng.below(3)).saturating_sub(1),
            65..85 => rng.below(60_000_000),
            85..95 => rng.below(3_600_000_000),
            _ => rng.below(3 * 86_400_000_000),
        };
        if rng.chance(0.06) {
            let back = match rng.below(3) {
                0 => rng.below(1_000),
                1 => rng.below(1_000_000),
                _ => rng.below(3_600_000_000),
            };
            time = time.saturating_sub(back);
            backward_steps += 1;
        } else {
            time = (time + dt).min(MAX_MICROS);
        }
        if rng.chance(match () {
            _ if deep => 0.005,
            _ if calls => 0.02,
            _ => 0.1,
        }) {
            rate_changes += 1;
            if rng.chance(0.7) {
                let limit = rng.below(n as u64) as usize;
                rates[limit] = random_rate(&mut rng);
            } else {
                rates = (0..n).map(|_| random_rate(&mut rng)).collect();
            }
        }
        let now = model.now(time);
        let states = model.read(&rates, now);
        let debt = Model::earliest(&states, now).0 - now;
        let held_chance = if give_backs { 0.9 } else { 0.5 };
        let outstanding = &mut pending.held;
        let kind = match rng.below(100) {
            _ if calls => Kind::Status, // (replaced below)
            _ if give_backs => {
                let (queue_until, queueing) = if deep {
                    (steps_in_sequence * 6 / 10, 0.95)
                } else {
                    (steps_in_sequence / 2, 0.7)
                };
                if outstanding.is_empty() || (i < queue_until && rng.chance(queueing)) {
                    Kind::Reserve {
                        permits: random_permits(&mut rng, true),
                        held: rng.chance(held_chance),
                        timeout: None,
                    }
                } else {
                    let id = outstanding.swap_remove(rng.below(outstanding.len() as u64) as usize);
                    Kind::Cancel { id }
                }
            }
            8..30 => Kind::Reserve {
                permits: random_permits(&mut rng, false),
                held: rng.chance(held_chance),
                timeout: Some(random_timeout(&mut rng, debt)),
            },
            30..42 if !outstanding.is_empty() => {
                let id = if rng.chance(0.5) {
                    outstanding.pop().unwrap()
                } else {
                    outstanding.swap_remove(rng.below(outstanding.len() as u64) as usize)
                };
                Kind::Cancel { id }
            }
            42..44 => Kind::Cancel {
                id: rng.below(MAX_MICROS),
            },
            44..48 => Kind::Resume {
                debts: (0..n)
                    .map(|_| match rng.below(100) {
                        0..30 => 0,
                        30..70 => rng.below(1_000_000),
                        70..85 => rng.below(1_000_000_000_000),
                        85..95 => MAX_MICROS,
                        _ => u64::MAX, // capped by both sides
                    })
                    .collect(),
            },
            48..52 => Kind::Probe,
            0..8 | 52..55 => Kind::Status,
            55..62 => Kind::Batch {
                requests: (0..1 + rng.below(12))
                    .map(|_| {
                        let timeout = rng.chance(0.4).then(|| random_timeout(&mut rng, debt));
                        (
                            random_permits(&mut rng, true),
                            rng.chance(held_chance),
                            timeout,
                        )
                    })
                    .collect(),
            },
            _ => Kind::Reserve {
                permits: random_permits(&mut rng, false),
                held: rng.chance(held_chance),
                timeout: None,
            },
        };
        let kind = if calls {
            calls::kind(&mut rng, n, &mut pending)
        } else {
            kind
        };
        let step = Step {
            now: time,
            rates: rates.clone(),
            kind,
        };
        let is_cap = |e: &Entry| e.id <= -102.0;
        let capped = model.log.iter().any(is_cap);
        let (reply, wrote, ttl_ms) = apply(&mut model, &step, now, time, &mut pending);
        match (&step.kind, &reply) {
            (Kind::Learn { .. }, _) => {
                caps_logged += u64::from(model.log.back().is_some_and(is_cap));
            }
            (Kind::Cancel { .. } | Kind::Settle { .. }, Expect::Int(1)) if capped => {
                caps_replayed += 1;
            }
            _ => {}
        }
        let check_fields =
            model.written && (i % FIELDS_EVERY == FIELDS_EVERY - 1 || i == steps_in_sequence - 1);
        expected.push(Expected {
            reply,
            wrote,
            ttl_ms,
            exists: model.written,
            fields: check_fields.then(|| Fields {
                states: model.limits.states().to_vec(),
                expires: model.expires,
                last_now: model.last_now,
                next_id: model.next_id,
                record: model.record,
                log: model.log.iter().map(|e| e.numbers()).collect(),
                learned: model.limits.learned_numbers().map(
                    |(factor, paused_until, increased_at, margin, caps)| {
                        let mut numbers =
                            vec![factor, paused_until as f64, increased_at as f64, margin];
                        numbers.extend(caps);
                        numbers
                    },
                ),
            }),
        });
        steps.push(step);
    }
    Sequence {
        seed,
        config,
        encoding,
        steps,
        expected,
        rate_changes,
        backward_steps,
        caps_logged,
        caps_replayed,
    }
}

/// The model's answer to `step` at `now` (the clock as read: `time`): the
/// reply, whether it writes, and the TTL its write sets, if any.
fn apply(
    model: &mut Model,
    step: &Step,
    now: u64,
    time: u64,
    pending: &mut Pending,
) -> (Expect, bool, Option<f64>) {
    let (reply, wrote, keeps_ttl) = answer(model, step, now, time, pending);
    if !wrote || keeps_ttl {
        return (reply, wrote, None);
    }
    model.last_now = now;
    // A batch applies the TTL rule after each request granted, as their
    // own calls would (`answer` did); any other write once.
    if let Expect::Batch { .. } = reply {
        return (reply, wrote, model.batch_ttl.take());
    }
    let ttl = model.ttl_after_write(time);
    (reply, wrote, ttl)
}

/// The model's answer to `step`: the reply, whether it writes, and whether
/// that write keeps the TTL (a probe of an existing key).
fn answer(
    model: &mut Model,
    step: &Step,
    now: u64,
    time: u64,
    pending: &mut Pending,
) -> (Expect, bool, bool) {
    let rates = &step.rates;
    let debt_of = |states: &[State]| (Model::earliest(states, now).0 - now) as i64;
    match &step.kind {
        Kind::Status => {
            // At the rates in force, as the next reservation finds them.
            let mut next = model.clone();
            next.begin_write(rates, now);
            let states = next.limits.states().to_vec();
            (Expect::Status { now, states }, false, false)
        }
        Kind::Probe if model.written => (Expect::Int(debt_of(model.limits.states())), true, true),
        Kind::Probe => {
            model.begin_write(rates, now);
            model.record = (now, -1);
            (Expect::Int(0), true, false)
        }
        Kind::Resume { debts } => {
            model.begin_write(rates, now);
            let debts: Vec<u64> = debts.iter().map(|&d| d.min(MAX_MICROS)).collect();
            model.resume(&debts, now);
            (Expect::Int(debt_of(model.limits.states())), true, false)
        }
        Kind::Cancel { id } => match model.give_back(*id, now, rates) {
            Some(given) => (Expect::Int(i64::from(given)), true, false),
            None => (Expect::Int(0), false, false),
        },
        Kind::Keep { id } => {
            if model.keep(*id, now, rates) {
                (Expect::Int(1), true, false)
            } else {
                (Expect::Int(0), false, false)
            }
        }
        Kind::Settle {
            id,
            charged,
            actual,
        } => match model.settle(*id, charged, actual, now, rates) {
            Some(Ok(())) => (Expect::Int(1), true, false),
            Some(Err((wait, bound, _))) => {
                let debt = debt_of(model.limits.states()) as u64;
                let next_id = model.next_id;
                let granted = Expect::Granted {
                    wait,
                    bound,
                    debt,
                    next_id,
                };
                (granted, true, false)
            }
            None => (Expect::Int(0), false, false),
        },
        Kind::Learn { lesson, args } => {
            model.begin_write(rates, now);
            model.learn(lesson, &args.learning(), args.pause_micros, now);
            let granted = Expect::Granted {
                wait: 0,
                bound: -1,
                debt: debt_of(model.limits.states()) as u64,
                next_id: model.next_id,
            };
            (granted, true, false)
        }
        Kind::Call { .. } | Kind::Reserve { .. } => {
            // A call is a held reservation of its counts, with an id.
            let (cost, held, call, timeout) = match &step.kind {
                Kind::Call { cost, timeout } => (cost.clone(), true, true, *timeout),
                Kind::Reserve {
                    permits,
                    held,
                    timeout,
                } => (vec![*permits; model.config.len()], *held, false, *timeout),
                _ => unreachable!(),
            };
            let mut next = model.clone();
            next.begin_write(rates, now);
            let timeout = timeout.map(|t| t.min(MAX_MICROS));
            match next.reserve(&cost, now, timeout, held, call) {
                Ok((wait, bound, id)) => {
                    *model = next;
                    if call {
                        pending.calls.push((id.expect("a call has an id"), cost));
                    } else {
                        pending.held.extend(id);
                    }
                    let debt = debt_of(model.limits.states()) as u64;
                    let next_id = model.next_id;
                    (
                        Expect::Granted {
                            wait,
                            bound,
                            debt,
                            next_id,
                        },
                        true,
                        false,
                    )
                }
                Err(_) => (
                    Expect::Refused {
                        now,
                        states: next.limits.states().to_vec(),
                    },
                    false,
                    false,
                ),
            }
        }
        Kind::Batch { requests } => {
            let mut next = model.clone();
            next.begin_write(rates, now);
            let mut replies = Vec::new();
            let mut granted = false;
            for &(permits, held, timeout) in requests {
                let timeout = timeout.map(|t| t.min(MAX_MICROS));
                let cost = vec![permits; model.config.len()];
                match next.reserve(&cost, now, timeout, held, false) {
                    Ok((wait, bound, id)) => {
                        granted = true;
                        if let Some(ttl) = next.ttl_after_write(time) {
                            next.batch_ttl = Some(ttl);
                        }
                        pending.held.extend(id);
                        replies.push([wait as f64, bound as f64, id.map_or(-1.0, |id| id as f64)]);
                    }
                    Err((wait, bound)) => replies.push([-(wait as f64), bound as f64, -1.0]),
                }
            }
            let states = next.limits.states().to_vec();
            if granted {
                *model = next;
            }
            (
                Expect::Batch {
                    replies,
                    now,
                    states,
                },
                granted,
                false,
            )
        }
    }
}
