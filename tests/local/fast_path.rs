//! The lock-free local limiter against the core it stands for.
//!
//! * A differential test: random sequences of pauses (some very long),
//!   reservations (some huge), tries with random and borderline timeouts and
//!   rate changes (infinite and tiny rates included), applied both to the
//!   core's `Limits` of one limit and to a `RateLimiter` on a `FakeClock`.
//!   Waits must agree to the microsecond, refusals exactly.
//! * Concurrency: threads on a frozen clock get distinct consecutive slots,
//!   also while stored permits are spent and while the rate changes; on a
//!   moving clock, no window holds more than the rate allows, also while
//!   the rate changes.
//! * Nothing allocates when no wait is due.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::support::alloc::allocations;
use crate::support::rng::Rng;
use crate::support::window::{max_in_window, most_in_window};
use paceline::Local;
use paceline::RateLimiter;
use paceline::clock::{Clock, FakeClock, Sleep, SystemClock};
use paceline::core::{Bursty, Limits, MAX_MICROS, Policy, State, micros};

// ---------------------------------------------------------------------------
// The differential test.

const RATES: [f64; 14] = [
    1e-300,
    1e-9,
    1e-3,
    0.5,
    1.0,
    3.0,
    7.0,
    1e3,
    333_333.0,
    1e6,
    3e6,
    1e9,
    1e300,
    f64::INFINITY,
];

fn random_rate(rng: &mut Rng) -> f64 {
    if rng.chance(0.2) {
        // Anything from very slow to very fast.
        10f64.powf(rng.f64() * 24.0 - 12.0)
    } else {
        *rng.pick(&RATES)
    }
}

fn random_burst(rng: &mut Rng) -> Duration {
    *rng.pick(&[
        Duration::ZERO,
        Duration::from_micros(1),
        Duration::from_millis(250),
        Duration::from_secs(1),
        Duration::from_secs(1),
        Duration::from_secs(1),
        Duration::from_secs(7),
        Duration::from_secs(3600),
        // Longer than the word holds: the limiter runs the core under its lock.
        Duration::from_secs(86_400),
        Duration::MAX,
    ])
}

fn random_pause(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=3 => Duration::ZERO,
        4 => Duration::from_nanos(rng.below(5_000)),
        5 | 6 => Duration::from_micros(rng.below(1_000_000)),
        7 => Duration::from_micros(rng.below(30_000_000)),
        8 => Duration::from_micros(rng.below(1 << 40)), // up to 12 days
        _ => {
            if rng.chance(0.1) {
                Duration::from_micros(rng.below(1 << 54)) // past MAX_MICROS, sometimes
            } else {
                Duration::from_micros(rng.below(1 << 36))
            }
        }
    }
}

fn random_permits(rng: &mut Rng) -> u32 {
    match rng.below(8) {
        0..=3 => 1,
        4 => rng.range(2, 10) as u32,
        5 => rng.range(1, 5_000) as u32,
        6 => rng.range(1, u64::from(u32::MAX)) as u32,
        _ => u32::MAX,
    }
}

/// A timeout for a try, often right at the border of the current debt.
fn random_timeout(rng: &mut Rng, debt: u64) -> Duration {
    match rng.below(6) {
        0 => Duration::ZERO,
        1 => Duration::from_micros(debt),
        2 => Duration::from_micros(debt.saturating_sub(1)),
        3 => Duration::from_micros(debt + 1),
        4 => Duration::from_micros(rng.below(10_000_000)),
        _ => *rng.pick(&[Duration::MAX, Duration::from_secs(3600)]),
    }
}

/// How far the limiter strayed from the core.
#[derive(Default)]
struct Divergence {
    compared: u64,
    differing: u64,
    max_diff: u64,
    /// Tries refused by one and granted by the other, with a timeout between
    /// their two debts.
    split_refusals: u64,
}

impl Divergence {
    fn compare(&mut self, expected: u64, got: u64, exact: bool, context: impl Fn() -> String) {
        let diff = expected.abs_diff(got);
        self.compared += 1;
        if diff > 0 {
            self.differing += 1;
            self.max_diff = self.max_diff.max(diff);
        }
        let allowed = if exact { 0 } else { 1 };
        assert!(
            diff <= allowed,
            "{}: core {expected}, limiter {got}",
            context()
        );
    }
}

/// Runs one random sequence. `exact`: the configuration never stores
/// permits, or runs in mutex mode, so the limiter must agree to the bit.
fn run_sequence(seed: u64, steps: usize, divergence: &mut Divergence) {
    let mut rng = Rng::new(seed);
    let clock = FakeClock::new();
    clock.advance(Duration::from_micros(rng.below(1 << 40)));
    let rate = random_rate(&mut rng);
    let burst = random_burst(&mut rng);
    let exact = burst.is_zero() || burst >= Duration::from_secs(86_400);
    let limiter = RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(burst)
        .clock(clock.clone())
        .build()
        .unwrap();
    // As the builder creates it.
    let state = State::new(
        Policy::Bursty(Bursty::new(burst)),
        rate,
        micros(clock.now()),
    )
    .unwrap();
    let mut core = Limits::new(vec![state]).unwrap();
    let mut log = vec![format!("rate {rate}, burst {burst:?}")];
    for step in 0..steps {
        let pause = random_pause(&mut rng);
        clock.advance(pause);
        let now = micros(clock.now());
        let debt = core.earliest(now).0 - now;
        let context = |log: &[String], what: &str| {
            format!(
                "seed {seed:#x}, step {step}: {what}\n  history:\n    {}",
                log.join("\n    ")
            )
        };
        match rng.below(10) {
            0 => {
                let rate = random_rate(&mut rng);
                log.push(format!("+{pause:?} set_rate({rate})"));
                core.set_rate(None, rate, now).unwrap();
                limiter.set_rate(rate).unwrap();
                assert_eq!(limiter.rate(), rate);
            }
            1..=4 => {
                let permits = random_permits(&mut rng);
                let timeout = random_timeout(&mut rng, debt);
                let limiter_debt = micros(limiter.snapshot().unwrap().wait());
                let before = core.clone();
                let expected = core
                    .try_reserve(permits, now, micros(timeout), false)
                    .map(|granted| granted.wait_micros);
                let got = limiter.try_reserve(permits, timeout).unwrap().map(micros);
                log.push(format!(
                    "+{pause:?} try_reserve({permits}, {timeout:?}) at {now}: \
                     core {expected:?}, limiter {got:?}"
                ));
                match (expected, got) {
                    (Some(e), Some(g)) => divergence.compare(e, g, exact, || context(&log, "wait")),
                    (None, None) => {}
                    _ => {
                        // Only a timeout that lies between two debts a
                        // rounding apart may split them.
                        let (low, high) = (debt.min(limiter_debt), debt.max(limiter_debt));
                        let timeout = micros(timeout);
                        assert!(
                            !exact && high - low <= 1 && low <= timeout && timeout < high,
                            "{}",
                            context(&log, "the refusals differ")
                        );
                        divergence.split_refusals += 1;
                        // Take the limiter's decision, so that both go on alike.
                        core = before;
                        if got.is_some() {
                            core.reserve(permits, now, false);
                        }
                    }
                }
            }
            5 => {
                let got = micros(limiter.snapshot().unwrap().wait());
                log.push(format!(
                    "+{pause:?} snapshot wait at {now}: core {debt}, limiter {got}"
                ));
                divergence.compare(debt, got, exact, || context(&log, "snapshot wait"));
            }
            _ => {
                let permits = random_permits(&mut rng);
                let expected = core.reserve(permits, now, false).wait_micros;
                let got = micros(limiter.reserve(permits).unwrap());
                log.push(format!(
                    "+{pause:?} reserve({permits}) at {now}: core {expected}, limiter {got}"
                ));
                divergence.compare(expected, got, exact, || context(&log, "wait"));
            }
        }
    }
}

fn report(what: &str, divergence: &Divergence) {
    eprintln!(
        "{what}: {} waits compared, {} differed by at most {} µs; {} tries split by a timeout between the two debts",
        divergence.compared, divergence.differing, divergence.max_diff, divergence.split_refusals
    );
}

/// Runs `count` random sequences of `steps` steps from `first_seed`, prints
/// how far the limiter and the core diverged, and checks that a rounding
/// difference is rare: stored permits are held to 2^-20 µs. (Each difference
/// is at most 1 µs: `Divergence::compare` checks that as it goes.)
fn check_sequences(first_seed: u64, count: u64, steps: usize) {
    let mut divergence = Divergence::default();
    for seed in 0..count {
        run_sequence(first_seed + seed, steps, &mut divergence);
    }
    report(&format!("{count} sequences of {steps} steps"), &divergence);
    assert!(
        divergence.differing * 1000 < divergence.compared,
        "{} of {} waits differ",
        divergence.differing,
        divergence.compared
    );
}

#[test]
fn random_sequences_agree_with_the_core() {
    check_sequences(0x5eed_0000, 20_000, 120);
}

/// Long sequences on one limiter, to let rounding differences accumulate if
/// they could.
#[test]
fn long_sequences_agree_with_the_core() {
    check_sequences(0x10_0000, 20, 5_000);
}

// ---------------------------------------------------------------------------
// Exact edge cases.

fn on_fake_clock(rate: f64, burst: Duration) -> (RateLimiter<Local, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(burst)
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

fn wait_micros(limiter: &RateLimiter<Local, FakeClock>, permits: u32) -> u64 {
    micros(limiter.reserve(permits).unwrap())
}

#[test]
fn saturation_at_max_micros() {
    let (limiter, clock) = on_fake_clock(1e-300, Duration::from_secs(1));
    assert_eq!(wait_micros(&limiter, u32::MAX), 0);
    assert_eq!(wait_micros(&limiter, u32::MAX), MAX_MICROS);
    assert_eq!(
        limiter.try_reserve(1, Duration::MAX).unwrap(),
        Some(Duration::from_micros(MAX_MICROS))
    );
    clock.advance(Duration::from_micros(MAX_MICROS + 5));
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
    assert_eq!(wait_micros(&limiter, 1), 0);
}

#[test]
fn a_full_burst_behind_a_debt_is_served_after_the_debt() {
    // Leaving an infinite rate with a debt outstanding stores a full burst
    // behind it: a state the word cannot hold, served under the lock.
    let (limiter, clock) = on_fake_clock(2.0, Duration::from_secs(1));
    assert_eq!(wait_micros(&limiter, 1), 0);
    limiter.set_rate(f64::INFINITY).unwrap(); // the 500 ms debt stays
    limiter.set_rate(4.0).unwrap(); // 4 stored, behind the debt
    assert_eq!(wait_micros(&limiter, 1), 500_000);
    assert_eq!(wait_micros(&limiter, 3), 500_000);
    assert_eq!(wait_micros(&limiter, 1), 500_000);
    assert_eq!(wait_micros(&limiter, 1), 750_000);
    clock.advance(Duration::from_secs(10));
    // Back on the word: a full burst of 4, then 250 ms apart.
    let waits: Vec<u64> = (0..6).map(|_| wait_micros(&limiter, 1)).collect();
    assert_eq!(waits, [0, 0, 0, 0, 0, 250_000]);
}

#[test]
fn a_long_idle_gap_rebases_without_changing_the_schedule() {
    let (limiter, clock) = on_fake_clock(10.0, Duration::from_secs(1));
    for gap_hours in [1u64, 5, 30, 24 * 365] {
        clock.advance(Duration::from_secs(gap_hours * 3600));
        let waits: Vec<u64> = (0..12).map(|_| wait_micros(&limiter, 1)).collect();
        assert_eq!(
            waits,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100_000],
            "after {gap_hours} h"
        );
        // The ticket is 200 ms ahead; 250 ms later half a permit is stored.
        clock.advance(Duration::from_millis(250));
        assert_eq!(wait_micros(&limiter, 2), 0);
        assert_eq!(wait_micros(&limiter, 1), 150_000);
        clock.advance(Duration::from_millis(150));
    }
}

#[test]
fn zero_burst_and_infinite_rate() {
    let (limiter, clock) = on_fake_clock(1000.0, Duration::ZERO);
    clock.advance(Duration::from_secs(5));
    assert_eq!(
        (0..3).map(|_| wait_micros(&limiter, 1)).collect::<Vec<_>>(),
        [0, 1000, 2000]
    );
    let (limiter, _) = on_fake_clock(f64::INFINITY, Duration::from_secs(1));
    for _ in 0..3 {
        assert_eq!(wait_micros(&limiter, u32::MAX), 0);
    }
}

// ---------------------------------------------------------------------------
// Concurrency.

fn frozen(rate: f64) -> (Arc<RateLimiter<Local, FakeClock>>, FakeClock) {
    let (limiter, clock) = on_fake_clock(rate, Duration::from_secs(1));
    (Arc::new(limiter), clock)
}

fn hammer(limiter: &Arc<RateLimiter<Local, FakeClock>>, threads: usize, each: usize) -> Vec<u64> {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let limiter = Arc::clone(limiter);
            std::thread::spawn(move || {
                (0..each)
                    .map(|_| micros(limiter.reserve(1).unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut waits: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    waits.sort_unstable();
    waits
}

#[test]
fn threads_spending_stored_permits_get_each_permit_once() {
    // 1000/s, idle for a second: 1000 stored permits, then one every 1 ms.
    let (limiter, clock) = frozen(1000.0);
    clock.advance(Duration::from_secs(5));
    let waits = hammer(&limiter, 8, 500);
    // 1000 stored permits and the first fresh one go at once; the fresh
    // one's cost is paid by the next caller.
    let mut expected = vec![0; 1001];
    expected.extend((1..=2999).map(|i| i * 1000));
    assert_eq!(waits, expected);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(3000)
    );
}

#[test]
fn set_rate_racing_reservations_loses_and_duplicates_nothing() {
    // Intervals of 1000 and 1500 µs: on a frozen clock every reservation
    // starts where the previous one ended, so the sorted waits form a chain
    // whose steps are one interval each. A permit granted twice repeats a
    // wait; a lost one leaves a gap of two intervals (2000 µs or more).
    for round in 0..20 {
        let (limiter, _) = frozen(1000.0);
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(AtomicU64::new(0));
        let changer = {
            let limiter = Arc::clone(&limiter);
            let stop = Arc::clone(&stop);
            let changes = Arc::clone(&changes);
            std::thread::spawn(move || {
                let mut fast = false;
                while !stop.load(Ordering::Relaxed) {
                    limiter
                        .set_rate(if fast { 1000.0 } else { 1000.0 / 1.5 })
                        .unwrap();
                    fast = !fast;
                    changes.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let waits = hammer(&limiter, 3, 3000);
        stop.store(true, Ordering::Relaxed);
        changer.join().unwrap();
        assert_eq!(waits[0], 0);
        for pair in waits.windows(2) {
            let step = pair[1] - pair[0];
            assert!(
                step == 1000 || step == 1500,
                "round {round}: waits {} then {} ({} rate changes)",
                pair[0],
                pair[1],
                changes.load(Ordering::Relaxed)
            );
        }
        let last_step = micros(limiter.snapshot().unwrap().wait()) - waits[waits.len() - 1];
        assert!(last_step == 1000 || last_step == 1500, "{last_step}");
    }
}

thread_local! {
    /// The last reading a `Recording` clock gave this thread (µs).
    static LAST_READ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A fake clock that remembers, per thread, the last reading it gave: the
/// one the limiter's call just used.
#[derive(Clone, Default)]
struct Recording {
    inner: FakeClock,
}

impl Clock for Recording {
    fn now(&self) -> Duration {
        let now = self.inner.now();
        LAST_READ.with(|last| last.set(micros(now)));
        now
    }

    fn now_micros(&self) -> u64 {
        let now = self.inner.now_micros();
        LAST_READ.with(|last| last.set(now));
        now
    }

    fn sleep_blocking(&self, duration: Duration) {
        self.inner.sleep_blocking(duration);
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner.sleep(duration)
    }
}

/// The moment a call that just returned `wait` granted its permit: the
/// clock reading it used, plus the wait.
fn granted_moment(wait: Duration) -> u64 {
    LAST_READ.with(|last| last.get()) + micros(wait)
}

/// Rate changes among 50 000, 100 000 and 200 000/s (a 1 ms burst, the same
/// time at every rate) while threads reserve on a fake clock that moves
/// under them: with tries, plain and kept reservations of one permit, no
/// window of `T` µs holds more grants, at their granted moments, than the
/// fastest rate allows, `200 000/s · (T + 1 ms) + 1`. Three rates, not two
/// in turn: the word's generation counter wraps at 512, an even number, so
/// with two a configuration 512 generations old is that of the same rate,
/// and a reservation computed from it that wins its compare-and-swap after
/// a wrap goes unseen.
#[test]
fn set_rate_cycling_three_rates_never_over_grants_in_any_window() {
    const RATES: [f64; 3] = [50_000.0, 100_000.0, 200_000.0];
    const BURST: u64 = 1_000;
    const ROUNDS: u64 = 4;
    const CALLS: usize = 50_000;
    for seed in 0..ROUNDS {
        let clock = Recording::default();
        clock.inner.advance(Duration::from_secs(10));
        let limiter: Arc<RateLimiter<Local, Recording>> = Arc::new(
            RateLimiter::builder()
                .permits_per_second(RATES[0])
                .max_burst(Duration::from_micros(BURST))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let changer = {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut changes = 0;
                while !stop.load(Ordering::Relaxed) {
                    limiter.set_rate(RATES[changes % RATES.len()]).unwrap();
                    changes += 1;
                }
                changes
            })
        };
        let mover = {
            let (clock, stop) = (clock.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    clock.inner.advance(Duration::from_micros(1));
                    std::hint::spin_loop();
                }
            })
        };
        let workers: Vec<_> = (0..4)
            .map(|thread| {
                let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(0x3A7E_0000 + seed * 97 + thread);
                    let mut moments = Vec::with_capacity(CALLS);
                    for _ in 0..CALLS {
                        if rng.chance(0.5) {
                            clock.inner.advance(Duration::from_micros(rng.below(4)));
                        }
                        // Plain and kept reservations only when little is
                        // owed, so that the clock catches up.
                        let little_owed =
                            || limiter.snapshot().unwrap().wait() < Duration::from_micros(200);
                        match rng.below(10) {
                            0..6 => {
                                let timeout = Duration::from_micros(rng.below(300));
                                if let Some(wait) = limiter.try_reserve(1, timeout).unwrap() {
                                    moments.push(granted_moment(wait));
                                }
                            }
                            6..8 if little_owed() => {
                                let wait = limiter.reserve(1).unwrap();
                                moments.push(granted_moment(wait));
                            }
                            8.. if little_owed() => {
                                let reservation = limiter.reservation(1).unwrap();
                                moments.push(granted_moment(reservation.delay()));
                                reservation.keep();
                            }
                            _ => {}
                        }
                    }
                    moments
                })
            })
            .collect();
        let mut moments: Vec<u64> = workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap())
            .collect();
        stop.store(true, Ordering::Relaxed);
        let changes = changer.join().unwrap();
        mover.join().unwrap();
        moments.sort_unstable();
        for span in [100, 1_000, 5_000, 20_000, 100_000] {
            let (count, at) = max_in_window(&moments, span);
            let most = most_in_window(RATES[2], span, BURST);
            assert!(
                count <= most,
                "seed {seed}: {count} permits granted in the {span} µs from {at} µs, at most \
                 {most} allowed ({} grants, {changes} rate changes)",
                moments.len()
            );
        }
    }
}

#[test]
fn threads_with_a_moving_clock_get_the_rate_and_no_more() {
    // 100 000/s with a 10 ms burst (1000 permits). Three threads try to take
    // single permits without waiting and move the clock 1 µs every 4 tries.
    let (limiter, clock) = on_fake_clock(100_000.0, Duration::from_millis(10));
    let limiter = Arc::new(limiter);
    clock.advance(Duration::from_secs(1)); // a full burst
    let tries = 40_000;
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let clock = clock.clone();
            std::thread::spawn(move || {
                let mut granted = 0u64;
                for i in 0..tries {
                    if limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() {
                        granted += 1;
                    }
                    if i % 4 == 3 {
                        clock.advance(Duration::from_micros(1));
                    }
                }
                granted
            })
        })
        .collect();
    let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let moved = 3 * tries / 4;
    // The burst, one permit per 10 µs, and the one granted on credit.
    let most = 1000 + moved / 10 + 1;
    assert!(granted <= most, "granted {granted} > {most}");
    // With ten tries per permit, hardly any permit is left untaken.
    assert!(granted + 3 >= most, "granted {granted} < {most} - 3");
}

// ---------------------------------------------------------------------------
// No allocation, no timer when nothing is owed.

/// A fake clock that counts sleeps.
#[derive(Clone, Default)]
struct CountingClock {
    inner: FakeClock,
    sleeps: Arc<AtomicU64>,
}

impl Clock for CountingClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn sleep_blocking(&self, duration: Duration) {
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        self.inner.sleep_blocking(duration);
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        self.inner.sleep(duration)
    }
}

#[test]
fn acquire_without_a_wait_neither_allocates_nor_sleeps() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // The system clock, fast enough that nothing is ever owed.
    let limiter = RateLimiter::bursty(1e9).unwrap();
    let counting = CountingClock::default();
    let fake = RateLimiter::builder()
        .permits_per_second(1000.0)
        .clock(counting.clone())
        .build()
        .unwrap();
    counting.inner.advance(Duration::from_secs(10)); // 1000 stored
    runtime.block_on(async {
        let before = allocations();
        for _ in 0..1000 {
            assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
        }
        for _ in 0..1000 {
            assert_eq!(fake.acquire(1).await.unwrap(), Duration::ZERO);
        }
        assert_eq!(allocations() - before, 0, "acquire allocated");
    });
    assert_eq!(counting.sleeps.load(Ordering::Relaxed), 0, "acquire slept");
}

#[test]
fn reserve_and_try_reserve_do_not_allocate() {
    let limiter: RateLimiter<Local, SystemClock> = RateLimiter::bursty(1e9).unwrap();
    let slow = RateLimiter::bursty(1.0 / 3600.0).unwrap();
    let before = allocations();
    for _ in 0..1000 {
        assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
        assert!(limiter.try_reserve(1, Duration::ZERO).unwrap().is_some());
        let _ = slow.try_reserve(1, Duration::ZERO).unwrap();
    }
    assert_eq!(allocations() - before, 0, "reserve allocated");
}
