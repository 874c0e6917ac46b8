//! Held reservations against the core (`support::held`), on a
//! `RateLimiter`: waits agree to the microsecond. And threads doing the
//! same with a moving clock while the rate is published again and again:
//! what they keep stays within the rate and the burst.

use std::time::Duration;

use crate::support::held::run;
use crate::support::rng::Rng;
use paceline::clock::{Clock, FakeClock};
use paceline::core::micros;
use paceline::{Local, RateLimiter};

#[test]
fn held_reservations_agree_with_the_core() {
    for seed in 0..1000 {
        run::<RateLimiter<Local, FakeClock>>(seed, 200);
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
