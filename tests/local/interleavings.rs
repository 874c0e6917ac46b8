//! Interleavings forced through the clock: a call stopped inside one of its
//! clock readings (the first: after it loaded the limiter's word, before it
//! stepped from it; a later one: under the lock) while other calls run,
//! then let go. Whatever it read before, it must act as if it came after
//! the calls that finished while it was stopped: the limiter answers and
//! ends as the same calls made one after another do, to the bit.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use paceline::clock::{Clock, FakeClock, Sleep};
use paceline::{Limiter, Local, RateLimiter, Reservation, Snapshot};

use crate::support::rng::Rng;

/// A fake clock that can stop one thread inside its next clock reading
/// until the test lets it go.
#[derive(Clone, Default)]
struct Stopping {
    inner: FakeClock,
    stop: Arc<Mutex<Option<Stop>>>,
}

/// The thread to stop, the readings to let it take first, and the channels
/// that tell the test it stopped and let it go.
struct Stop {
    thread: ThreadId,
    skip: usize,
    stopped: Sender<()>,
    go: Receiver<()>,
}

impl Stopping {
    /// Stops `thread` in its reading after the next `skip`; returns what
    /// says it stopped and what lets it go.
    fn arm(&self, thread: ThreadId, skip: usize) -> (Receiver<()>, Sender<()>) {
        let (stopped, stopped_rx) = channel();
        let (go_tx, go) = channel();
        *self.stop.lock().unwrap() = Some(Stop {
            thread,
            skip,
            stopped,
            go,
        });
        (stopped_rx, go_tx)
    }

    /// Stops nobody.
    fn disarm(&self) {
        *self.stop.lock().unwrap() = None;
    }

    fn pass(&self) {
        let mut stop = self.stop.lock().unwrap();
        let Some(armed) = stop
            .as_mut()
            .filter(|s| s.thread == std::thread::current().id())
        else {
            return;
        };
        if armed.skip > 0 {
            armed.skip -= 1;
            return;
        }
        let Stop { stopped, go, .. } = stop.take().unwrap();
        drop(stop);
        stopped.send(()).unwrap();
        go.recv().unwrap();
    }
}

impl Clock for Stopping {
    fn now(&self) -> Duration {
        self.pass();
        self.inner.now()
    }

    fn now_micros(&self) -> u64 {
        self.pass();
        self.inner.now_micros()
    }

    fn sleep_blocking(&self, duration: Duration) {
        self.inner.sleep_blocking(duration);
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner.sleep(duration)
    }
}

/// 1 000 per second, a 10 ms burst (10 permits), on a stopping clock.
fn limiter() -> (RateLimiter<Local, Stopping>, Stopping) {
    let clock = Stopping::default();
    clock.inner.advance(Duration::from_secs(1));
    let limiter = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .max_burst(Duration::from_millis(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

/// Runs `stopped` on a thread stopped in its first clock reading while
/// `meanwhile` runs; its answer.
fn stopped_while<T: Send>(
    clock: &Stopping,
    stopped: impl FnOnce() -> T + Send,
    meanwhile: impl FnOnce(),
) -> T {
    std::thread::scope(|s| {
        let go = Arc::new(AtomicBool::new(false));
        let handle = {
            let go = Arc::clone(&go);
            s.spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                stopped()
            })
        };
        let (stopped_rx, go_tx) = clock.arm(handle.thread().id(), 0);
        go.store(true, Ordering::Release);
        stopped_rx.recv().unwrap();
        meanwhile();
        go_tx.send(()).unwrap();
        handle.join().unwrap()
    })
}

/// A try stopped after it loaded a word that owes a permit, while the
/// word's configuration slot is rewritten with a base 20 ms later (the word
/// goes to the lock and back: a reservation that waits is logged, and a
/// call after its moment empties the log; or the rate is set twice), finds
/// 9 permits stored, as any call then does. (It used to read the old word
/// under the new base, as a debt 20 ms ahead, and refuse: a refusal writes
/// nothing, so no compare-and-swap caught it.)
#[test]
fn a_try_stopped_while_the_words_slot_is_rewritten_is_not_refused() {
    type Try = fn(&RateLimiter<Local, Stopping>) -> bool;
    let tries: [(&str, Try); 3] = [
        ("try_reserve", |l| {
            l.try_reserve(1, Duration::ZERO).unwrap() == Some(Duration::ZERO)
        }),
        ("take_now", |l| Limiter::take_now(l, 1).unwrap().unwrap()),
        ("try_acquire", |l| {
            l.try_acquire_blocking(1, Duration::from_micros(500))
                .unwrap()
        }),
    ];
    type Meanwhile = fn(&RateLimiter<Local, Stopping>, &FakeClock);
    let ways: [(&str, Meanwhile); 2] = [
        ("to the lock and back", |limiter, clock| {
            // Logged, so the word goes to the lock.
            let held = limiter.reservation(1).unwrap();
            assert_eq!(held.delay(), Duration::from_millis(1));
            assert!(held.can_give_back());
            clock.advance(Duration::from_millis(20));
            // Its moment has passed: the log empties and the word comes
            // back, rebased, with 10 stored, 9 after this call.
            assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
            drop(held);
        }),
        ("two rate changes", |limiter, clock| {
            clock.advance(Duration::from_millis(20));
            limiter.set_rate(1_000.0).unwrap();
            limiter.set_rate(1_000.0).unwrap();
            assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
        }),
    ];
    for (name, try_one) in tries {
        for (way, meanwhile) in ways {
            let (limiter, clock) = limiter();
            // Nothing stored: the first goes at once, and the next owes 1 ms.
            assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
            let granted = stopped_while(
                &clock,
                || try_one(&limiter),
                || meanwhile(&limiter, &clock.inner),
            );
            assert!(granted, "{name}, {way}: refused with 9 permits stored");
            assert_eq!(limiter.snapshot().unwrap().stored(), 8.0, "{name}, {way}");
        }
    }
}

// ---------------------------------------------------------------------------
// Random interleavings against the calls one after another.

/// A call of the random interleavings.
#[derive(Debug, Clone, Copy)]
enum Call {
    Reserve(u32),
    /// A try with a timeout in µs.
    Try(u32, u64),
    TakeNow(u32),
    /// A reservation, kept at once (`true`) or held to be given back.
    Held(u32, bool),
    /// Drops the held reservation at this index (modulo how many are held).
    GiveBack(usize),
    SetRate(f64),
    /// Moves the clock, µs.
    Advance(u64),
    Snapshot,
}

/// What a call answered.
#[derive(Debug, PartialEq)]
enum Answer {
    Wait(Option<u64>),
    Taken(bool),
    Held(u64, bool),
    /// A snapshot's wait (µs), remaining and stored.
    Snap(u64, u64, f64),
    Done,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

/// Makes `call` on `limiter`, keeping what it holds in `held`.
fn make<'a, C: Clock>(
    limiter: &'a RateLimiter<Local, C>,
    clock: &FakeClock,
    held: &mut Vec<Reservation<'a>>,
    call: Call,
) -> Answer {
    match call {
        Call::Reserve(p) => Answer::Wait(Some(micros(limiter.reserve(p).unwrap()))),
        Call::Try(p, t) => {
            let timeout = Duration::from_micros(t);
            Answer::Wait(limiter.try_reserve(p, timeout).unwrap().map(micros))
        }
        Call::TakeNow(p) => Answer::Taken(Limiter::take_now(limiter, p).unwrap().unwrap()),
        Call::Held(p, keep) => {
            let reservation = limiter.reservation(p).unwrap();
            let answer = Answer::Held(micros(reservation.delay()), reservation.can_give_back());
            if keep {
                reservation.keep();
            } else {
                held.push(reservation);
            }
            answer
        }
        Call::GiveBack(i) => {
            if !held.is_empty() {
                let i = i % held.len();
                drop(held.remove(i));
            }
            Answer::Done
        }
        Call::SetRate(rate) => {
            limiter.set_rate(rate).unwrap();
            Answer::Done
        }
        Call::Advance(by) => {
            clock.advance(Duration::from_micros(by));
            Answer::Done
        }
        Call::Snapshot => {
            let s = limiter.snapshot().unwrap();
            Answer::Snap(micros(s.wait()), s.remaining(), s.stored())
        }
    }
}

/// Rates with whole and fractional intervals, and none (mutex mode).
const RATES: [f64; 8] = [
    1_000.0,
    250.0,
    4_000.0,
    500.0,
    3.0,
    7.0,
    333_333.0,
    f64::INFINITY,
];

/// Clock moves: none, a µs, parts of a permit, and hours (the word
/// rebases).
const MOVES: [u64; 8] = [0, 1, 250, 999, 5_000, 20_000, 9_000_000_000, 10_800_000_000];

/// Who makes a random call.
#[derive(Clone, Copy, PartialEq)]
enum Who {
    /// The calls before and after.
    Any,
    /// The call stopped in its clock reading: it holds what it reserves,
    /// and neither gives back nor moves the clock; a try half the time.
    Stopped,
    /// The calls meanwhile: moving the clock and the word's generation
    /// (rate changes, reservations logged) half the time.
    Meanwhile,
}

/// A random call for `who`.
fn random_call(rng: &mut Rng, who: Who) -> Call {
    let p = rng.range(1, 3) as u32;
    let kind = match who {
        Who::Any => rng.below(9),
        Who::Stopped if rng.chance(0.5) => rng.range(1, 2),
        Who::Stopped => rng.below(6),
        Who::Meanwhile if rng.chance(0.5) => *rng.pick(&[3, 4, 7]),
        Who::Meanwhile => rng.below(9),
    };
    match kind {
        0 | 8 => Call::Reserve(p),
        1 => Call::Try(p, rng.below(8_000)),
        2 => Call::TakeNow(p),
        3 => Call::Held(p, who != Who::Stopped && rng.chance(0.3)),
        4 => Call::SetRate(*rng.pick(&RATES)),
        5 => Call::Snapshot,
        6 => Call::GiveBack(rng.below(8) as usize),
        _ => Call::Advance(*rng.pick(&MOVES)),
    }
}

/// 1 000 per second, a 10 ms burst, on `clock`.
fn limiter_on<C: Clock>(clock: C) -> RateLimiter<Local, C> {
    RateLimiter::builder()
        .permits_per_second(1_000.0)
        .max_burst(Duration::from_millis(10))
        .clock(clock)
        .build()
        .unwrap()
}

/// What one run answered: the stopped call, the calls meanwhile, those
/// after, and the snapshot at the end.
type Run = (Answer, Vec<Answer>, Vec<Answer>, Snapshot);

/// One random interleaving (see the module's documentation).
struct Interleaving {
    start: u64,
    before: Vec<Call>,
    stopped: Call,
    skip: usize,
    meanwhile: Vec<Call>,
    after: Vec<Call>,
}

impl Interleaving {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let before = (0..rng.below(8))
            .map(|_| random_call(&mut rng, Who::Any))
            .collect();
        Interleaving {
            start: rng.below(30_000),
            before,
            stopped: random_call(&mut rng, Who::Stopped),
            skip: rng.below(3) as usize,
            meanwhile: (0..rng.range(1, 4))
                .map(|_| random_call(&mut rng, Who::Meanwhile))
                .collect(),
            after: (0..rng.below(4))
                .map(|_| random_call(&mut rng, Who::Any))
                .chain([Call::Snapshot, Call::Reserve(1), Call::Snapshot])
                .collect(),
        }
    }

    /// The calls one after another on a fake clock, the stopped one after
    /// the first `split` of those meanwhile.
    fn in_turn(&self, split: usize) -> (Vec<Answer>, Run) {
        let clock = FakeClock::new();
        clock.advance(Duration::from_micros(self.start));
        let limiter = limiter_on(clock.clone());
        let mut held = Vec::new();
        let run = |calls: &[Call], held: &mut Vec<_>| -> Vec<Answer> {
            calls
                .iter()
                .map(|&call| make(&limiter, &clock, held, call))
                .collect()
        };
        let before = run(&self.before, &mut held);
        let mut meanwhile = run(&self.meanwhile[..split], &mut held);
        let mut its_own = Vec::new();
        let stopped = make(&limiter, &clock, &mut its_own, self.stopped);
        meanwhile.extend(run(&self.meanwhile[split..], &mut held));
        held.extend(its_own);
        let after = run(&self.after, &mut held);
        drop(held);
        let end = limiter.snapshot().unwrap();
        (before, (stopped, meanwhile, after, end))
    }

    /// The calls with the stopped one on a thread of its own, stopped in
    /// its clock reading after `skip` while those meanwhile run on another;
    /// what it answered, whether it stopped, and how many of those
    /// meanwhile had finished when it was let go.
    fn interleaved(&self) -> (Vec<Answer>, Run, bool, usize) {
        let clock = Stopping::default();
        clock.inner.advance(Duration::from_micros(self.start));
        let limiter = limiter_on(clock.clone());
        let mut held = Vec::new();
        let before = self
            .before
            .iter()
            .map(|&call| make(&limiter, &clock.inner, &mut held, call))
            .collect();
        let done = AtomicBool::new(false);
        let finished = AtomicUsize::new(0);
        let (mut stopped, mut finished_before) = (false, 0);
        let (answer, its_own, meanwhile) = std::thread::scope(|s| {
            let (limiter, clock, done, finished) = (&limiter, &clock, &done, &finished);
            let call = self.stopped;
            let go = Arc::new(AtomicBool::new(false));
            let thread = {
                let go = Arc::clone(&go);
                s.spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    let mut its_own = Vec::new();
                    let answer = make(limiter, &clock.inner, &mut its_own, call);
                    done.store(true, Ordering::Release);
                    (answer, its_own)
                })
            };
            let (stopped_rx, go_tx) = clock.arm(thread.thread().id(), self.skip);
            go.store(true, Ordering::Release);
            // It stops, or finishes having read the clock fewer times.
            while !stopped && !done.load(Ordering::Acquire) {
                stopped = stopped_rx.try_recv().is_ok();
                std::thread::yield_now();
            }
            clock.disarm();
            let (held, calls) = (&mut held, &self.meanwhile);
            let other = s.spawn(move || {
                calls
                    .iter()
                    .map(|&call| {
                        let answer = make(limiter, &clock.inner, held, call);
                        finished.fetch_add(1, Ordering::Release);
                        answer
                    })
                    .collect::<Vec<_>>()
            });
            if stopped {
                // Until those meanwhile are done, or one waits for what the
                // stopped call holds (the lock): it goes on once that call
                // is let go. (A slow one may finish on either side of the
                // stopped call: every split from here is one after another.)
                let mut last = (0, Instant::now());
                loop {
                    let now = finished.load(Ordering::Acquire);
                    if now == calls.len() {
                        break;
                    }
                    if now != last.0 {
                        last = (now, Instant::now());
                    } else if last.1.elapsed() > Duration::from_millis(20) {
                        break;
                    }
                    std::thread::yield_now();
                }
                finished_before = finished.load(Ordering::Acquire);
                go_tx.send(()).unwrap();
            }
            let meanwhile = other.join().unwrap();
            let (answer, its_own) = thread.join().unwrap();
            (answer, its_own, meanwhile)
        });
        held.extend(its_own);
        let after = self
            .after
            .iter()
            .map(|&call| make(&limiter, &clock.inner, &mut held, call))
            .collect();
        drop(held);
        let end = limiter.snapshot().unwrap();
        let run = (answer, meanwhile, after, end);
        (before, run, stopped, finished_before)
    }
}

/// Random calls, one of them stopped in its first, second or third clock
/// reading while one to four others run (reservations held and given
/// back, tries, rate changes among whole, fractional and infinite rates,
/// clock moves of up to hours that rebase the word, snapshots): every
/// answer and the state at the end are those of the calls one after
/// another, the stopped one after those that finished while it was
/// stopped. (A refusal computed from a word loaded before its slot was
/// rewritten used to be answered as is.)
#[test]
fn a_call_stopped_in_its_clock_reading_acts_after_the_calls_that_ran_meanwhile() {
    let mut stops = 0;
    for seed in 0..1_000 {
        let interleaving = Interleaving::new(0x5709_0000 + seed);
        let (before, got, stopped, finished) = interleaving.interleaved();
        let splits = if stopped {
            finished..=interleaving.meanwhile.len()
        } else {
            0..=0
        };
        stops += usize::from(stopped);
        let mut in_turn = Vec::new();
        let same = splits.into_iter().any(|split| {
            let (turn_before, run) = interleaving.in_turn(split);
            assert_eq!(before, turn_before, "seed {seed}");
            let same = got == run;
            in_turn.push(run);
            same
        });
        assert!(
            same,
            "seed {seed}: {:?} stopped in reading {} ({stopped}, after {finished} of those \
             meanwhile), meanwhile {:?}, before {:?}, after {:?}:\n got {got:?}\n one after \
             another {in_turn:?}",
            interleaving.stopped,
            interleaving.skip,
            interleaving.meanwhile,
            interleaving.before,
            interleaving.after,
        );
    }
    // Most calls read the clock once, some more.
    assert!(stops > 300, "{stops} of 1 000 stopped");
}
