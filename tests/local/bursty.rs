//! The bursty policy on a fake clock: exact waits, no real sleeping.
//! Expected values come from the rules in `paceline::core`; where a scenario
//! matches the reference behaviour published for the original algorithm's
//! test suite, the comment gives that suite's rounded value (e.g. "R0.20").

use crate::support::fake;

use std::time::Duration;

use fake::{bursty, micros, pause_ms, waits, waits_n};
use paceline::RateLimiter;
use paceline::clock::FakeClock;

#[test]
fn first_acquire_is_free_then_steady_spacing() {
    // Published: R0.00, R0.20, R0.20.
    let (limiter, _) = bursty(5.0);
    assert_eq!(
        waits_n(&limiter, 5),
        [0, 200_000, 200_000, 200_000, 200_000]
    );
}

#[test]
fn a_pause_that_repays_the_debt_makes_the_next_acquire_free() {
    // Published: R0.00, U0.20, R0.00, R0.20.
    let (limiter, clock) = bursty(5.0);
    assert_eq!(waits_n(&limiter, 1), [0]);
    pause_ms(&clock, 200);
    assert_eq!(waits_n(&limiter, 2), [0, 200_000]);
}

#[test]
fn a_partial_pause_shortens_the_next_wait() {
    let (limiter, clock) = bursty(5.0);
    waits_n(&limiter, 1);
    pause_ms(&clock, 150);
    assert_eq!(waits_n(&limiter, 2), [50_000, 200_000]);
}

#[test]
fn idle_time_accumulates_stored_permits_up_to_one_second() {
    // Published: U1.00, U1.00, then R0.00 x4 (1 + 1 + 3 + 1 permits), R0.20.
    let (limiter, clock) = bursty(5.0);
    pause_ms(&clock, 1000);
    pause_ms(&clock, 1000); // makes no difference: the cap is 5 permits
    assert_eq!(waits(&limiter, &[1, 1, 3, 1, 1]), [0, 0, 0, 0, 200_000]);
}

#[test]
fn an_idle_gap_shorter_than_the_burst_stores_part_of_it() {
    let (limiter, clock) = bursty(10.0);
    waits_n(&limiter, 1); // the ticket moves to 100 ms
    pause_ms(&clock, 400); // idle from 100 ms to 400 ms: 3 permits stored
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 0, 100_000]);
}

#[test]
fn weighted_requests_are_paid_by_the_next_caller() {
    // Published: R0.00, R1.00, R1.00, R2.00, R4.00, R8.00.
    let (limiter, _) = bursty(1.0);
    assert_eq!(
        waits(&limiter, &[1, 1, 2, 4, 8, 1]),
        [0, 1_000_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000]
    );
}

#[test]
fn stored_permits_then_fresh_ones_in_one_request() {
    let (limiter, clock) = bursty(4.0);
    pause_ms(&clock, 10_000); // 4 stored
    // 6 permits: 4 stored (free) + 2 fresh (250 ms each) charged to the next caller.
    assert_eq!(waits(&limiter, &[6, 1]), [0, 500_000]);
}

#[test]
fn max_burst_sets_the_cap() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_millis(2500))
        .clock(clock.clone())
        .build()
        .unwrap();
    pause_ms(&clock, 60_000);
    // 25 stored permits, then one fresh permit every 100 ms.
    let w = waits_n(&limiter, 27);
    assert!(w[..26].iter().all(|&w| w == 0), "{w:?}");
    assert_eq!(w[26], 100_000);
}

#[test]
fn zero_max_burst_stores_nothing() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    pause_ms(&clock, 60_000);
    assert_eq!(waits_n(&limiter, 3), [0, 100_000, 100_000]);
}

#[test]
fn a_new_limiter_has_no_stored_permits() {
    let (limiter, _) = bursty(2.0);
    assert_eq!(waits_n(&limiter, 3), [0, 500_000, 500_000]);
}

#[test]
fn reserve_returns_the_wait_without_sleeping() {
    let (limiter, clock) = bursty(5.0);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_millis(200));
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_millis(400));
    assert_eq!(clock_now_ms(&clock), 0, "reserve must not sleep");
}

#[test]
fn a_snapshot_peeks_without_reserving() {
    let (limiter, clock) = bursty(5.0);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
    limiter.reserve(3).unwrap();
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(600)
    );
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(600)
    );
    pause_ms(&clock, 250);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(350)
    );
    pause_ms(&clock, 1000);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
}

#[tokio::test]
async fn async_acquire_sleeps_on_the_limiter_clock() {
    let (limiter, clock) = bursty(5.0);
    assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.acquire(2).await.unwrap(),
        Duration::from_millis(200)
    );
    assert_eq!(
        limiter.acquire(1).await.unwrap(),
        Duration::from_millis(400)
    );
    assert_eq!(clock_now_ms(&clock), 600);
}

fn clock_now_ms(clock: &FakeClock) -> u128 {
    use paceline::clock::Clock;
    clock.now().as_millis()
}

#[test]
fn costs_carry_their_fraction_of_a_microsecond() {
    // Reservations on a frozen clock: the n-th waits for the n − 1 before it.
    let nth_wait = |rate: f64, n: usize| {
        let (limiter, _) = bursty(rate);
        (0..n)
            .map(|_| micros(limiter.reserve(1).expect("valid permits")))
            .last()
            .expect("n > 0")
    };
    // 300 000/s: intervals of 3⅓ µs, so 300 permits push the ticket by
    // 1000 µs less 300 roundings of 2^-20 µs (999.9999 µs), a wait of 999
    // µs once rounded down to what the clock can sleep. Whole microseconds
    // made it 900.
    assert_eq!(nth_wait(300_000.0, 301), 999);
    // 1 000 000/s: exactly 1 µs each.
    assert_eq!(nth_wait(1_000_000.0, 101), 100);
    // 2 000 000/s: half a µs each, which whole microseconds would not have
    // charged at all.
    assert_eq!(nth_wait(2_000_000.0, 1001), 500);
}
