//! Giving back reservations on the local limiter: a dropped `acquire`, a
//! `timeout(d, acquire(n))` that fired, a cancelled `Reservation`, against
//! the core's [`Limits`] and on the real clock.

use crate::support;

use std::time::{Duration, Instant};

use paceline::clock::FakeClock;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};
use paceline::{Limiter, RateLimiter};
use support::rng::Rng;

/// The local limiter gives back as the core's [`Limits`] (one limit) does:
/// the same reservations, cancellations and idle gaps on both give the
/// same waits, to the bit for a warming-up limiter (it runs the limits
/// themselves, under its lock), and to the microseconds the word may round
/// stored permits by for a bursty one (a reservation that waits and may be
/// given back is made under the lock, and logged).
#[test]
fn the_local_limiter_gives_back_as_the_core() {
    for seed in 0..1_000 {
        let mut rng = Rng::new(0x10CA_1000 + seed);
        let rate = [5.0, 10.0, 1_000.0][rng.below(3) as usize];
        let warm = rng.chance(0.3);
        let clock = FakeClock::new();
        let builder = RateLimiter::builder().permits_per_second(rate);
        let (limiter, policy) = if warm {
            let warmup = Duration::from_secs(1);
            (
                builder.warmup(warmup).clock(clock.clone()).build().unwrap(),
                Policy::WarmingUp(WarmingUp::new(warmup, 3.0)),
            )
        } else {
            (
                builder.clock(clock.clone()).build().unwrap(),
                Policy::Bursty(Bursty::default()),
            )
        };
        let mut core = Limits::new(vec![State::new(policy, rate, 0).unwrap()]).unwrap();
        let mut now = 0;
        let mut held = Vec::new();
        for step in 0..60 {
            match rng.below(6) {
                0..3 => {
                    let p = rng.range(1, 3) as u32;
                    let r = limiter.reservation(p).unwrap();
                    let c = core.reserve(p, now, true);
                    let got = r.delay().as_micros() as u64;
                    // The word holds stored permits as time to 2^-20 µs and
                    // rounds each resync's spend to whole µs where the core
                    // counts permits in f64: a few µs apart at most (3 over
                    // these 1 000 sequences).
                    let allowed = if warm { 0 } else { 3 };
                    assert!(
                        got.abs_diff(c.wait_micros) <= allowed,
                        "seed {seed} step {step}: {got} µs, core {c:?}"
                    );
                    if r.can_give_back() && rng.chance(0.5) {
                        held.push((r, c));
                    } else {
                        r.keep();
                    }
                }
                3 if !held.is_empty() => {
                    let (r, c) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    drop(r);
                    if let Some(id) = c.id {
                        core.give_back(id, now);
                    }
                }
                _ => {
                    // Time passes only once nothing is held: a reservation is
                    // given back before its wait is over.
                    for (r, c) in held.drain(..) {
                        drop(r);
                        if let Some(id) = c.id {
                            core.give_back(id, now);
                        }
                    }
                    let gap = rng.range(0, 300_000);
                    clock.advance(Duration::from_micros(gap));
                    now += gap;
                }
            }
        }
    }
}

/// Two reservations of an hour each wait; the first is dropped, half an
/// hour passes, eleven callers queue behind the second, and the second is
/// dropped too. A limiter that never made the two would have been idle for
/// that half hour (dropping all but one second of it): the next caller goes
/// where it would, not an hour's charge earlier.
#[test]
fn a_waiter_dropped_after_another_never_lets_the_next_caller_in_early() {
    const S: Duration = Duration::from_secs(1);
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(1.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap();
    let a = limiter.reservation(3600).unwrap();
    let b = limiter.reservation(3600).unwrap();
    assert_eq!((a.delay(), b.delay()), (S, 3601 * S));
    clock.advance(S / 2);
    drop(a); // B keeps its slot
    clock.advance(1800 * S - S / 2);
    // Without A and B these would go at 1800 s (on the one stored permit)
    // and then one a second.
    let queued: Vec<_> = (0..11).map(|_| limiter.reservation(1).unwrap()).collect();
    assert_eq!(queued[0].delay(), 1801 * S); // behind B
    clock.advance(S);
    drop(b);
    // After the eleven, as the limiter without A and B: 1810 s.
    assert_eq!(limiter.reservation(1).unwrap().delay(), 9 * S);
    for r in queued {
        r.keep();
    }
}

#[test]
fn a_dropped_reservation_puts_back_exactly_what_it_took() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    let before = format!("{limiter:?}");
    let b = limiter.reservation(5).unwrap();
    assert_eq!(b.delay(), Duration::from_millis(100));
    drop(b);
    assert_eq!(format!("{limiter:?}"), before);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(100)
    );
}

#[test]
fn a_waiting_caller_keeps_its_slot_and_the_next_takes_the_dropped_one() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = limiter.reservation(1).unwrap();
    let b = limiter.reservation(1).unwrap();
    let c = limiter.reservation(1).unwrap();
    assert_eq!(
        [a.delay(), b.delay(), c.delay()],
        [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_millis(200)
        ]
    );
    drop(b);
    let d = limiter.reservation(1).unwrap();
    assert_eq!(d.delay(), Duration::from_millis(200), "D takes C's slot");
    assert_eq!(c.wait_blocking(), Duration::from_millis(200), "C keeps it");
    d.keep();
    a.keep();
}

/// The slot test above on the real clock (the local twin of
/// `a_dropped_waiter_gives_its_slot_to_the_next_caller_through_redis`): A
/// goes at once, B and C wait one and two intervals; B is dropped, and D,
/// reserved next, is scheduled at C's slot, not one interval after it. C
/// keeps its slot: C and D both go about two intervals after A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_gives_its_slot_to_the_next_caller_on_the_real_clock() {
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    let a = limiter.reservation(1).unwrap();
    let b = limiter.reservation(1).unwrap();
    let c = limiter.reservation(1).unwrap();
    assert!(a.delay().is_zero());
    let (b_delay, c_delay) = (b.delay(), c.delay());
    assert!(
        c_delay > b_delay + Duration::from_millis(80),
        "{b_delay:?} {c_delay:?}"
    );
    drop(b);
    let d = limiter.reservation(1).unwrap();
    let d_delay = d.delay();
    // D is scheduled at C's slot (less the real time between the two
    // reservations), not one interval later.
    let gap = c_delay.saturating_sub(d_delay);
    assert!(
        d_delay <= c_delay && gap <= Duration::from_millis(60),
        "C at {c_delay:?}, D at {d_delay:?}"
    );
    a.keep();
    let (c_done, d_done) = tokio::join!(
        async {
            c.wait().await;
            start.elapsed()
        },
        async {
            d.wait().await;
            start.elapsed()
        }
    );
    println!("C {c_delay:?} went at {c_done:?}; D {d_delay:?} went at {d_done:?}");
    // Sleeps never end early: C waited out its own slot, and so did D.
    assert!(
        c_done >= c_delay && d_done >= d_delay,
        "{c_done:?} {d_done:?}"
    );
    // One slot: on the same runtime, they end within a scheduling hiccup of
    // each other (one interval apart were D pushed back).
    assert!(
        c_done.abs_diff(d_done) <= Duration::from_millis(60),
        "C went at {c_done:?}, D at {d_done:?}"
    );
}

#[test]
fn warming_up_limiters_give_back_through_the_lock() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(2.0)
        .warmup(Duration::from_secs(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reserve(1).unwrap(); // cold: the next waits 1.375 s
    let before = format!("{limiter:?}");
    let b = limiter.reservation(1).unwrap();
    assert_eq!(b.delay(), Duration::from_millis(1_375));
    drop(b);
    assert_eq!(format!("{limiter:?}"), before);
}

/// `timeout(1 ms, acquire(1))`, twenty times, on the real clock: each one
/// gives its reservation back, so at most one interval of debt is left.
#[tokio::test(flavor = "current_thread")]
async fn timed_out_acquires_leave_at_most_one_interval_of_debt() {
    let limiter = RateLimiter::bursty(10.0).unwrap();
    let mut timed_out = 0;
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(1), limiter.acquire(1))
            .await
            .is_err()
        {
            timed_out += 1;
        }
    }
    assert!(timed_out >= 18, "{timed_out} of 20 timed out");
    let debt = limiter.snapshot().unwrap().wait();
    assert!(debt <= Duration::from_millis(100), "debt left: {debt:?}");
    // The same through the trait object.
    let shared: std::sync::Arc<dyn Limiter> =
        std::sync::Arc::new(RateLimiter::bursty(10.0).unwrap());
    for _ in 0..20 {
        let _ = tokio::time::timeout(Duration::from_millis(1), shared.acquire(1)).await;
    }
    let debt = shared.snapshot().await.unwrap().wait();
    assert!(debt <= Duration::from_millis(100), "debt left: {debt:?}");
}
