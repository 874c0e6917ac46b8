//! Held reservations against the core: random sequences of reservations
//! that may be given back, drops, keeps, tries, plain reservations and rate
//! changes (extreme rates and clocks near 2^53 µs included), applied both to
//! a limiter on a `FakeClock` and to the core's `Limits` (one per key),
//! which log what is held: waits agree to the microsecond (stored permits
//! are held as time in the word). Run by the local tests on a `RateLimiter`
//! (one key, starting empty) and by the keyed tests on a `KeyedRateLimiter`
//! (a few keys, each starting full).

use std::collections::HashMap;
use std::time::Duration;

use crate::support::rng::Rng;
use paceline::clock::{Clock, FakeClock};
use paceline::core::{Bursty, Limits, Policy, State, micros};
use paceline::{KeyedRateLimiter, Local, RateLimiter, Reservation};

const RATES: [f64; 12] = [
    0.5,
    1.0,
    3.0,
    7.0,
    1e3,
    333_333.0,
    1e6,
    1e-3,
    1e-9,
    1e15,
    1e-300,
    f64::INFINITY,
];

/// A bursty limiter the sequences drive, by key.
pub trait Subject: Sized {
    /// How many keys the sequences use.
    const KEYS: u64;
    /// Whether a key starts full (a keyed limiter's, when first seen), or
    /// empty when the limiter is built.
    const FULL: bool;
    fn build(rate: f64, burst: Duration, clock: &FakeClock) -> Self;
    fn reservation(&self, key: u32, permits: u32) -> Reservation<'_>;
    fn reserve(&self, key: u32, permits: u32) -> Duration;
    fn try_reserve(&self, key: u32, permits: u32, timeout: Duration) -> Option<Duration>;
    fn set_rate(&self, rate: f64);
    /// How long a request of `key` made now would wait.
    fn wait(&self, key: u32) -> Duration;
}

impl Subject for RateLimiter<Local, FakeClock> {
    const KEYS: u64 = 1;
    const FULL: bool = false;

    fn build(rate: f64, burst: Duration, clock: &FakeClock) -> Self {
        RateLimiter::builder()
            .permits_per_second(rate)
            .max_burst(burst)
            .clock(clock.clone())
            .build()
            .unwrap()
    }

    fn reservation(&self, _: u32, permits: u32) -> Reservation<'_> {
        RateLimiter::reservation(self, permits).unwrap()
    }

    fn reserve(&self, _: u32, permits: u32) -> Duration {
        RateLimiter::reserve(self, permits).unwrap()
    }

    fn try_reserve(&self, _: u32, permits: u32, timeout: Duration) -> Option<Duration> {
        RateLimiter::try_reserve(self, permits, timeout).unwrap()
    }

    fn set_rate(&self, rate: f64) {
        RateLimiter::set_rate(self, rate).unwrap();
    }

    fn wait(&self, _: u32) -> Duration {
        RateLimiter::snapshot(self).unwrap().wait()
    }
}

impl Subject for KeyedRateLimiter<u32, Local, FakeClock> {
    const KEYS: u64 = 4;
    const FULL: bool = true;

    fn build(rate: f64, burst: Duration, clock: &FakeClock) -> Self {
        KeyedRateLimiter::builder()
            .permits_per_second(rate)
            .max_burst(burst)
            .clock(clock.clone())
            .build()
            .unwrap()
    }

    fn reservation(&self, key: u32, permits: u32) -> Reservation<'_> {
        KeyedRateLimiter::reservation(self, &key, permits).unwrap()
    }

    fn reserve(&self, key: u32, permits: u32) -> Duration {
        KeyedRateLimiter::reserve(self, &key, permits).unwrap()
    }

    fn try_reserve(&self, key: u32, permits: u32, timeout: Duration) -> Option<Duration> {
        KeyedRateLimiter::try_reserve(self, &key, permits, timeout).unwrap()
    }

    fn set_rate(&self, rate: f64) {
        KeyedRateLimiter::set_rate(self, rate).unwrap();
    }

    fn wait(&self, key: u32) -> Duration {
        KeyedRateLimiter::snapshot(self, &key).unwrap().wait()
    }
}

/// One sequence of `steps`, drawn from `seed`, on a limiter of type `S`
/// and on the core; panics, with the sequence, where they disagree.
pub fn run<S: Subject>(seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let clock = FakeClock::new();
    let start = if rng.chance(0.3) {
        (1u64 << 53) - rng.below(1 << 36)
    } else {
        rng.below(1 << 36)
    };
    clock.advance(Duration::from_micros(start));
    let mut rate = *rng.pick(&RATES);
    let burst = Duration::from_micros(*rng.pick(&[0u64, 1, 1_000, 500_000, 1_000_000, 3_000_000]));
    let limiter = S::build(rate, burst, &clock);
    let policy = Policy::Bursty(Bursty::new(burst));
    let mut cores: HashMap<u32, Limits> = HashMap::new();
    if !S::FULL {
        let state = State::new(policy.clone(), rate, micros(clock.now())).unwrap();
        cores.insert(0, Limits::new(vec![state]).unwrap());
    }
    let mut held: Vec<(Reservation<'_>, u32, Option<u64>)> = Vec::new();
    let mut log = vec![format!("rate {rate} burst {burst:?}")];
    for step in 0..steps {
        let pause = match rng.below(5) {
            0 => 0,
            1 => rng.below(10),
            2 => rng.below(2_000_000),
            3 => rng.below(30_000_000),
            _ => rng.below(100),
        };
        clock.advance(Duration::from_micros(pause));
        let now = micros(clock.now());
        let key = rng.below(S::KEYS) as u32;
        cores.entry(key).or_insert_with(|| {
            Limits::new(vec![State::full(policy.clone(), rate, now).unwrap()]).unwrap()
        });
        let fail = |log: &[String]| format!("seed {seed} step {step}\n{}", log.join("\n"));
        match rng.below(12) {
            0 => {
                rate = *rng.pick(&RATES);
                log.push(format!("+{pause} set_rate {rate}"));
                for core in cores.values_mut() {
                    core.set_rate(None, rate, now).unwrap();
                }
                limiter.set_rate(rate);
            }
            1..=4 => {
                let permits = 1 + rng.below(3) as u32;
                let g = cores.get_mut(&key).unwrap().reserve(permits, now, true);
                let r = limiter.reservation(key, permits);
                log.push(format!(
                    "+{pause} k{key} reservation {permits} at {now}: core {} lim {}",
                    g.wait_micros,
                    micros(r.delay())
                ));
                assert!(
                    g.wait_micros.abs_diff(micros(r.delay())) <= 1,
                    "{}",
                    fail(&log)
                );
                held.push((r, key, g.id));
            }
            5..=6 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (r, k, id) = held.swap_remove(i);
                let core = cores.get_mut(&k).unwrap();
                let core_back = id.is_some_and(|id| core.give_back(id, now));
                log.push(format!(
                    "+{pause} drop k{k} (id {id:?}) at {now}: core gave back {core_back}"
                ));
                drop(r);
            }
            7 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (r, k, id) = held.swap_remove(i);
                if let Some(id) = id {
                    cores.get_mut(&k).unwrap().keep(id, now);
                }
                log.push(format!("+{pause} keep k{k} at {now}"));
                r.keep();
            }
            8 => {
                let timeout = rng.below(3_000_000);
                let e = cores
                    .get_mut(&key)
                    .unwrap()
                    .try_reserve(1, now, timeout, false)
                    .map(|g| g.wait_micros);
                let g = limiter
                    .try_reserve(key, 1, Duration::from_micros(timeout))
                    .map(micros);
                log.push(format!(
                    "+{pause} k{key} try {timeout} at {now}: core {e:?} lim {g:?}"
                ));
                match (e, g) {
                    (Some(a), Some(b)) => assert!(a.abs_diff(b) <= 1, "{}", fail(&log)),
                    (None, None) => {}
                    _ => panic!("{}", fail(&log)),
                }
            }
            _ => {
                let permits = 1 + rng.below(3) as u32;
                let e = cores
                    .get_mut(&key)
                    .unwrap()
                    .reserve(permits, now, false)
                    .wait_micros;
                let g = micros(limiter.reserve(key, permits));
                log.push(format!(
                    "+{pause} k{key} reserve {permits} at {now}: core {e} lim {g}"
                ));
                assert!(e.abs_diff(g) <= 1, "{}", fail(&log));
            }
        }
    }
}

/// One of several threads taking permits of `key` on a `clock` they move:
/// tries, plain reservations, and reservations held then given back or
/// kept (no more while over 300 µs is owed), 20 000 of them drawn from
/// `rng`; how many permits it kept, those still held at the end included.
pub fn take_at_random<S: Subject>(limiter: &S, key: u32, clock: &FakeClock, mut rng: Rng) -> u64 {
    let mut kept = 0u64;
    let mut held = Vec::new();
    for _ in 0..20_000 {
        if rng.chance(0.5) {
            clock.advance(Duration::from_micros(rng.below(3)));
        }
        let owed = limiter.wait(key) > Duration::from_micros(300);
        match rng.below(10) {
            0..5 => {
                let to = Duration::from_micros(rng.below(200));
                if limiter.try_reserve(key, 1, to).is_some() {
                    kept += 1;
                }
            }
            5 if !owed => {
                limiter.reserve(key, 1);
                kept += 1;
            }
            6..8 if !owed => {
                let r = limiter.reservation(key, 1);
                if r.can_give_back() && rng.chance(0.6) {
                    held.push(r);
                } else {
                    r.keep();
                    kept += 1;
                }
            }
            _ if !held.is_empty() => {
                drop(held.swap_remove(rng.below(held.len() as u64) as usize));
            }
            _ => {}
        }
    }
    // Whatever is still held may be kept: count it.
    kept += held.len() as u64;
    for r in held {
        r.keep();
    }
    kept
}
