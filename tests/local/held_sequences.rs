//! Held reservations against the core (`support::held`), on a
//! `RateLimiter`: waits agree to the microsecond. And threads doing the
//! same with a moving clock while the rate is published again and again:
//! what they keep stays within the rate and the burst.

use std::time::Duration;

use crate::support::held::{run, take_at_random};
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
                    take_at_random(&*limiter, 0, &clock, Rng::new(round * 31 + t))
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
