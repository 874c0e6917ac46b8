//! Held reservations of a few keys against the core (`support::held`), one
//! `Limits` per key (each starts full). And threads on a hot key, with
//! give-backs on a moving clock while new keys churn through a small cap:
//! what the hot key keeps stays within its rate and burst.

use std::time::Duration;

use crate::support::held::{run, take_at_random};
use crate::support::rng::Rng;
use paceline::clock::{Clock, FakeClock};
use paceline::core::micros;
use paceline::{KeyedRateLimiter, Local};

#[test]
fn held_reservations_of_keys_agree_with_the_core() {
    for seed in 0..1000 {
        run::<KeyedRateLimiter<u32, Local, FakeClock>>(seed, 200);
    }
}

/// Threads on one hot key (and churned keys at a small cap) with a moving
/// fake clock: the hot key's kept permits stay within rate × elapsed +
/// burst + 1, with give-backs, keeps, tries and plain reservations. A churned
/// key takes one permit, so it stays nearer to full than the hot key is
/// unless the hot key is within a permit of full: the cap drops keys nearest
/// to full first, and forgives the hot key no more than that permit.
/// (Churned keys of up to 50 permits once let the cap drop the hot key
/// further from full, a few permits forgiven, as `max_keys` allows.)
#[test]
fn a_hot_key_giving_back_among_churned_keys_keeps_within_its_rate() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    for round in 0..6u64 {
        let clock = FakeClock::new();
        clock.advance(Duration::from_secs(10));
        let rate = 100_000.0;
        let burst_us = 1_000u64;
        let limiter: Arc<KeyedRateLimiter<u32, Local, FakeClock>> = Arc::new(
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
                let mut k = 1u32;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let _ = limiter.reserve(&k, 1).unwrap();
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
                    take_at_random(&*limiter, 0, &clock, Rng::new(round * 31 + t))
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
