//! Held reservations against the core: random sequences of reservations
//! that may be given back, drops, keeps, tries, plain reservations and rate
//! changes (extreme rates and clocks near 2^53 µs included), applied both to
//! a `RateLimiter` on a `FakeClock` and to the core's `Limits`, which log
//! what is held; waits agree to the microsecond (stored permits are held as
//! time in the word). And threads doing the same with a moving clock while
//! the rate is published again and again: what they keep stays within the
//! rate and the burst.

use std::time::Duration;

use crate::support::rng::Rng;
use paceline::clock::{Clock, FakeClock};
use paceline::core::{Bursty, Limits, Policy, State, micros};
use paceline::{Local, RateLimiter};

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

fn run(seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let clock = FakeClock::new();
    let start = if rng.chance(0.3) {
        (1u64 << 53) - rng.below(1 << 36)
    } else {
        rng.below(1 << 36)
    };
    clock.advance(Duration::from_micros(start));
    let rate = *rng.pick(&RATES);
    let burst = Duration::from_micros(*rng.pick(&[0u64, 1, 1_000, 500_000, 1_000_000, 3_000_000]));
    let limiter: RateLimiter<Local, FakeClock> = RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(burst)
        .clock(clock.clone())
        .build()
        .unwrap();
    let state = State::new(
        Policy::Bursty(Bursty::new(burst)),
        rate,
        micros(clock.now()),
    )
    .unwrap();
    let mut core = Limits::new(vec![state]).unwrap();
    let mut held: Vec<(paceline::Reservation<'_>, Option<u64>)> = Vec::new();
    let mut log = vec![format!("rate {rate} burst {burst:?}")];
    for step in 0..steps {
        let pause = match rng.below(4) {
            0 => 0,
            1 => rng.below(10),
            2 => rng.below(2_000_000),
            _ => rng.below(100),
        };
        clock.advance(Duration::from_micros(pause));
        let now = micros(clock.now());
        match rng.below(12) {
            0 => {
                let rate = *rng.pick(&RATES);
                log.push(format!("+{pause} set_rate {rate}"));
                core.set_rate(None, rate, now).unwrap();
                limiter.set_rate(rate).unwrap();
            }
            1..=4 => {
                let permits = 1 + rng.below(3) as u32;
                let g = core.reserve(permits, now, true);
                let r = limiter.reservation(permits).unwrap();
                log.push(format!(
                    "+{pause} reservation {permits} at {now}: core {} lim {}",
                    g.wait_micros,
                    micros(r.delay())
                ));
                let diff = g.wait_micros.abs_diff(micros(r.delay()));
                assert!(diff <= 1, "seed {seed} step {step}\n{}", log.join("\n"));
                held.push((r, g.id));
            }
            5..=6 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (r, id) = held.swap_remove(i);
                let core_back = id.is_some_and(|id| core.give_back(id, now));
                log.push(format!(
                    "+{pause} drop #{i} (id {id:?}) at {now}: core gave back {core_back}"
                ));
                drop(r);
            }
            7 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (r, id) = held.swap_remove(i);
                if let Some(id) = id {
                    core.keep(id, now);
                }
                log.push(format!("+{pause} keep #{i} at {now}"));
                r.keep();
            }
            8 => {
                let timeout = rng.below(3_000_000);
                let e = core
                    .try_reserve(1, now, timeout, false)
                    .map(|g| g.wait_micros);
                let g = limiter
                    .try_reserve(1, Duration::from_micros(timeout))
                    .unwrap()
                    .map(micros);
                log.push(format!(
                    "+{pause} try {timeout} at {now}: core {e:?} lim {g:?}"
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
                let g = micros(limiter.reserve(permits).unwrap());
                log.push(format!(
                    "+{pause} reserve {permits} at {now}: core {e} lim {g}"
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
fn held_reservations_agree_with_the_core() {
    for seed in 0..1000 {
        run(seed, 200);
    }
}

#[test]
fn threads_giving_back_on_a_moving_clock_keep_within_the_rate() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    for round in 0..8u64 {
        let clock = FakeClock::new();
        clock.advance(Duration::from_secs(10));
        let rate = 100_000.0;
        let burst_us = if round % 2 == 0 { 1_000u64 } else { 0 };
        let limiter: Arc<RateLimiter<Local, FakeClock>> = Arc::new(
            RateLimiter::builder()
                .permits_per_second(rate)
                .max_burst(Duration::from_micros(burst_us))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let start = micros(clock.now());
        let stop = Arc::new(AtomicBool::new(false));
        let setter = {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    limiter.set_rate(rate).unwrap();
                    std::thread::yield_now();
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
                        let owed = limiter.snapshot().unwrap().wait() > Duration::from_micros(300);
                        match rng.below(10) {
                            0..5 => {
                                let to = Duration::from_micros(rng.below(200));
                                if limiter.try_reserve(1, to).unwrap().is_some() {
                                    kept += 1;
                                }
                            }
                            5 if !owed => {
                                limiter.reserve(1).unwrap();
                                kept += 1;
                            }
                            6..8 if !owed => {
                                let r = limiter.reservation(1).unwrap();
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
        setter.join().unwrap();
        let end = micros(clock.now()) + micros(limiter.snapshot().unwrap().wait());
        let most = (rate * (end - start + burst_us) as f64 / 1e6).floor() as u64 + 1;
        assert!(
            kept <= most,
            "round {round}: kept {kept} > {most} (elapsed {})",
            end - start
        );
    }
}
