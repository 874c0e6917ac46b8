//! The calls profile: open calls with a count per limit, settled (while
//! the log holds them, and after it let them go), kept, given back, and
//! lessons learned (refusals that lower and pause, successes that raise,
//! reported rates that cap, spent and remaining quotas), among plain and
//! held reservations, give-backs, resumes and rate changes.

use std::time::Duration;

use super::sequence::Kind;
use crate::support::rng::Rng;
use paceline::core::{Learning, Lesson, Reported};

/// The constants of a learn, as numbers (what ARGV carries), and the
/// [`Learning`] they make.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnArgs {
    pub decrease: f64,
    pub increase: f64,
    pub interval_micros: u64,
    pub floor: f64,
    pub pause_micros: u64,
    pub margin: f64,
}

impl LearnArgs {
    pub fn learning(&self) -> Learning {
        Learning::default()
            .decrease(self.decrease)
            .increase(self.increase)
            .interval(Duration::from_micros(self.interval_micros))
            .floor(self.floor)
            .pause(Duration::from_micros(self.pause_micros))
            .margin(self.margin)
    }
}

impl Default for LearnArgs {
    /// `Learning::default()`'s.
    fn default() -> Self {
        LearnArgs {
            decrease: 0.7,
            increase: 0.05,
            interval_micros: 1_000_000,
            floor: 0.05,
            pause_micros: 1_000_000,
            margin: 0.97,
        }
    }
}

/// The calls a sequence has open (id, and what each was last charged), and
/// the held reservations it may give back.
#[derive(Debug, Default)]
pub struct Pending {
    pub held: Vec<u64>,
    pub calls: Vec<(u64, Vec<u32>)>,
}

fn cost(rng: &mut Rng, n: usize) -> Vec<u32> {
    loop {
        let cost: Vec<u32> = (0..n)
            .map(|_| match rng.below(100) {
                0..15 => 0,
                15..60 => 1 + rng.below(3) as u32,
                60..90 => rng.below(1_000) as u32,
                _ => rng.below(100_000) as u32,
            })
            .collect();
        if cost.iter().any(|&c| c > 0) {
            return cost;
        }
    }
}

fn learn_args(rng: &mut Rng) -> LearnArgs {
    if rng.chance(0.6) {
        return LearnArgs::default();
    }
    LearnArgs {
        decrease: 0.1 + 0.9 * rng.f64(),
        increase: *rng.pick(&[0.0, 0.05, 0.3, 1.0]),
        interval_micros: *rng.pick(&[1_000, 250_000, 1_000_000, 5_000_000]),
        floor: *rng.pick(&[0.05, 0.2, 0.5, 1.0]),
        pause_micros: *rng.pick(&[0, 1_000, 1_000_000, 30_000_000]),
        margin: *rng.pick(&[1.0, 0.97, 0.5]),
    }
}

fn lesson(rng: &mut Rng, n: usize) -> Lesson {
    let (throttled, success) = match rng.below(100) {
        0..25 => (true, false),
        25..75 => (false, true),
        75..78 => (true, true),
        _ => (false, false),
    };
    let retry_after_micros = match rng.below(100) {
        0..40 => None,
        40..50 => Some(0),
        50..95 => Some(rng.below(5_000_000)),
        _ => Some(u64::MAX),
    };
    let limits = (0..rng.below(n as u64 + 1))
        .map(|_| Reported {
            rate: match rng.below(100) {
                0..50 => None,
                50..90 => Some(10f64.powf(-1.0 + 5.0 * rng.f64())),
                _ => Some(*rng.pick(&[1.0, 100.0, 1e9])),
            },
            remaining: match rng.below(100) {
                0..50 => None,
                50..70 => Some(0),
                70..98 => Some(1 + rng.below(50)),
                // (Logged as a double: above 2^53, rounded.)
                _ => Some(*rng.pick(&[1 << 53, (1 << 53) + 3, u64::MAX])),
            },
            reset_micros: match rng.below(100) {
                0..40 => None,
                40..45 => Some(0),
                _ => Some(rng.below(60_000_000)),
            },
        })
        .collect();
    // How long before the lesson its call went: often across the end of
    // a pause (up to 5 s, as the retries above).
    let sent_ago_micros = match rng.below(100) {
        0..40 => None,
        40..95 => Some(rng.below(6_000_000)),
        _ => Some(*rng.pick(&[0, u64::MAX])),
    };
    Lesson {
        throttled,
        success,
        retry_after_micros,
        sent_ago_micros,
        limits,
    }
}

/// The next call of a calls sequence of `n` limits.
pub fn kind(rng: &mut Rng, n: usize, pending: &mut Pending) -> Kind {
    let open = !pending.calls.is_empty();
    match rng.below(100) {
        0..25 => Kind::Call {
            cost: cost(rng, n),
            timeout: rng.chance(0.2).then(|| rng.below(3_000_000)),
        },
        25..42 if open => {
            let i = rng.below(pending.calls.len() as u64) as usize;
            let (id, charged) = pending.calls[i].clone();
            let actual = if rng.chance(0.2) {
                charged.clone()
            } else {
                cost(rng, n)
            };
            pending.calls[i].1.clone_from(&actual);
            Kind::Settle {
                id,
                charged,
                actual,
            }
        }
        42..52 if open => {
            let i = rng.below(pending.calls.len() as u64) as usize;
            Kind::Keep {
                id: pending.calls.swap_remove(i).0,
            }
        }
        52..56 if open => {
            let i = rng.below(pending.calls.len() as u64) as usize;
            Kind::Cancel {
                id: pending.calls.swap_remove(i).0,
            }
        }
        56..68 => Kind::Learn {
            lesson: lesson(rng, n),
            args: learn_args(rng),
        },
        68..76 if !pending.held.is_empty() => {
            let i = rng.below(pending.held.len() as u64) as usize;
            Kind::Cancel {
                id: pending.held.swap_remove(i),
            }
        }
        76..78 => Kind::Keep {
            id: rng.below(1 << 52),
        },
        78..80 => Kind::Resume {
            debts: (0..n).map(|_| rng.below(2_000_000)).collect(),
        },
        _ => Kind::Reserve {
            permits: 1 + rng.below(5) as u32,
            held: rng.chance(0.5),
            timeout: rng.chance(0.2).then(|| rng.below(2_000_000)),
        },
    }
}
