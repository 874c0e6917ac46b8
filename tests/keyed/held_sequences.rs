//! Held reservations of a few keys against the core, one `Limits` per key
//! (each starts full): random sequences of reservations that may be given
//! back, drops, keeps, tries, plain reservations and rate changes, extreme
//! rates and clocks near 2^53 µs included. And threads on a hot key, with
//! give-backs on a moving clock while new keys churn through a small cap:
//! what the hot key keeps stays within its rate and burst.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::rng::Rng;
use paceline::clock::{Clock, FakeClock};
use paceline::core::{Bursty, Limits, Policy, State, micros};
use paceline::{KeyedRateLimiter, Local};

const RATES: [f64; 11] = [
    0.5,
    1.0,
    3.0,
    7.0,
    1e3,
    333_333.0,
    1e6,
    1e-9,
    1e15,
    1e-300,
    f64::INFINITY,
];

fn run(seed: u64, steps: usize) {
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
    let limiter: KeyedRateLimiter<u32, Local, FakeClock> = KeyedRateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(burst)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut cores: HashMap<u32, Limits> = HashMap::new();
    let mut held: Vec<(paceline::Reservation<'_>, u32, Option<u64>)> = Vec::new();
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
        let key = rng.below(4) as u32;
        let core = cores.entry(key).or_insert_with(|| {
            Limits::new(vec![
                State::full(Policy::Bursty(Bursty::new(burst)), rate, now).unwrap(),
            ])
            .unwrap()
        });
        match rng.below(12) {
            0 => {
                rate = *rng.pick(&RATES);
                log.push(format!("+{pause} set_rate {rate}"));
                for c in cores.values_mut() {
                    c.set_rate(None, rate, now).unwrap();
                }
                limiter.set_rate(rate).unwrap();
            }
            1..=4 => {
                let permits = 1 + rng.below(3) as u32;
                let g = core.reserve(permits, now, true);
                let r = limiter.reservation(&key, permits).unwrap();
                log.push(format!(
                    "+{pause} k{key} reservation {permits} at {now}: core {} lim {}",
                    g.wait_micros,
                    micros(r.delay())
                ));
                let diff = g.wait_micros.abs_diff(micros(r.delay()));
                assert!(diff <= 1, "seed {seed} step {step}\n{}", log.join("\n"));
                held.push((r, key, g.id));
            }
            5..=6 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (r, k, id) = held.swap_remove(i);
                let c = cores.get_mut(&k).unwrap();
                let core_back = id.is_some_and(|id| c.give_back(id, now));
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
                let e = core
                    .try_reserve(1, now, timeout, false)
                    .map(|g| g.wait_micros);
                let g = limiter
                    .try_reserve(&key, 1, Duration::from_micros(timeout))
                    .unwrap()
                    .map(micros);
                log.push(format!(
                    "+{pause} k{key} try {timeout} at {now}: core {e:?} lim {g:?}"
                ));
                match (e, g) {
                    (Some(a), Some(b)) => assert!(
                        a.abs_diff(b) <= 1,
                        "seed {seed} step {step}\n{}",
                        log.join("\n")
                    ),
                    (None, None) => {}
                    _ => panic!("seed {seed} step {step}\n{}", log.join("\n")),
                }
            }
            _ => {
                let permits = 1 + rng.below(3) as u32;
                let e = core.reserve(permits, now, false).wait_micros;
                let g = micros(limiter.reserve(&key, permits).unwrap());
                log.push(format!(
                    "+{pause} k{key} reserve {permits} at {now}: core {e} lim {g}"
                ));
                assert!(
                    e.abs_diff(g) <= 1,
                    "seed {seed} step {step}\n{}",
                    log.join("\n")
                );
            }
        }
    }
}

#[test]
fn held_reservations_of_keys_agree_with_the_core() {
    for seed in 0..1000 {
        run(seed, 200);
    }
}

/// Threads on one hot key (and churned keys at a small cap) with a moving
/// fake clock: the hot key's kept permits stay within rate × elapsed +
/// burst + 1, with give-backs, keeps, tries and plain reservations.
#[test]
fn a_hot_key_giving_back_among_churned_keys_keeps_within_its_rate() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    for round in 0..6u64 {
        let clock = FakeClock::new();
        clock.advance(Duration::from_secs(10));
        let rate = 100_000.0;
        let burst_us = 1_000u64;
        let limiter: Arc<KeyedRateLimiter<u64, Local, FakeClock>> = Arc::new(
            KeyedRateLimiter::builder()
                .permits_per_second(rate)
                .max_burst(Duration::from_micros(burst_us))
                .max_keys(if round % 2 == 0 { 64 } else { 100_000 })
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let start = micros(clock.now());
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let (limiter, stop, clock) = (Arc::clone(&limiter), Arc::clone(&stop), clock.clone());
            std::thread::spawn(move || {
                let mut k = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let _ = limiter.reserve(&k, 1 + (k % 50) as u32).unwrap();
                    if k.is_multiple_of(8) {
                        clock.advance(Duration::from_micros(1));
                    }
                }
            })
        };
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(round * 31 + t);
                    let mut kept = 0u64;
                    let mut held = Vec::new();
                    for _ in 0..20_000 {
                        if rng.chance(0.5) {
                            clock.advance(Duration::from_micros(rng.below(3)));
                        }
                        let owed =
                            limiter.snapshot(&0).unwrap().wait() > Duration::from_micros(300);
                        match rng.below(10) {
                            0..5 => {
                                let to = Duration::from_micros(rng.below(200));
                                if limiter.try_reserve(&0, 1, to).unwrap().is_some() {
                                    kept += 1;
                                }
                            }
                            5 if !owed => {
                                limiter.reserve(&0, 1).unwrap();
                                kept += 1;
                            }
                            6..8 if !owed => {
                                let r = limiter.reservation(&0, 1).unwrap();
                                if r.can_give_back() && rng.chance(0.6) {
                                    held.push(r);
                                } else {
                                    r.keep();
                                    kept += 1;
                                }
                            }
                            _ if !held.is_empty() => {
                                let r: paceline::Reservation<'_> =
                                    held.swap_remove(rng.below(held.len() as u64) as usize);
                                drop(r);
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
                })
            })
            .collect();
        let kept: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
        // Everything kept is owed by the end: the debt counts too.
        let end = micros(clock.now()) + micros(limiter.snapshot(&0).unwrap().wait());
        let most = (rate * (end - start + burst_us) as f64 / 1e6).floor() as u64 + 1;
        let stats = limiter.stats();
        assert!(
            kept <= most,
            "round {round}: kept {kept} > {most} (elapsed {}) dropped {}",
            end - start,
            stats.dropped_unfinished
        );
    }
}
