//! What the keyed limiter forgets, and when: sweeps, the
//! cap, give-backs, rate changes, learning and slots, on a fake clock.

use std::time::Duration;

use crate::support::alloc::bytes_in_use;
use paceline::clock::{Clock, FakeClock};
use paceline::outbound::{Feedback, Quota};
use paceline::{KeyedRateLimiter, Limit, Local};

const MS: Duration = Duration::from_millis(1);

fn bursty(clock: &FakeClock, max_keys: Option<usize>) -> KeyedRateLimiter<u64, Local, FakeClock> {
    let builder = KeyedRateLimiter::<u64>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .clock(clock.clone());
    match max_keys {
        Some(cap) => builder.max_keys(cap),
        None => builder,
    }
    .build()
    .unwrap()
}

/// A limiter used only through `call` sweeps its idle shards too: the
/// docs promise memory follows the keys active within about one sweep
/// period "in every shard, whichever keys the calls are on".
#[tokio::test]
async fn a_limiter_used_only_through_call_sweeps_every_shard() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    for key in 0..10_000u64 {
        drop(limiter.call(&key, 1).await.unwrap());
    }
    assert_eq!(limiter.stats().keys, 10_000);
    clock.advance(Duration::from_secs(3));
    // One key in use, by calls only, for three seconds.
    for _ in 0..3_000 {
        drop(limiter.call(&0, 1).await.unwrap());
        clock.advance(MS);
    }
    let held = limiter.stats().keys;
    assert!(held <= 64, "{held} keys held after 3 s of calls on one key");
}

/// The same with reserve: the rounds of visits sweep every shard.
#[test]
fn a_limiter_used_through_reserve_sweeps_every_shard() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    for key in 0..10_000u64 {
        limiter.reserve(&key, 1).unwrap();
    }
    clock.advance(Duration::from_secs(3));
    for _ in 0..3_000 {
        limiter.reserve(&0, 1).unwrap();
        clock.advance(MS);
    }
    let held = limiter.stats().keys;
    assert!(held <= 64, "{held} keys held");
}

/// At the cap the least recently used go: a key that learned (held as
/// limits) and was used after every other key must not be the one that
/// loses its debt.
#[tokio::test]
async fn at_the_cap_a_learned_key_used_last_is_not_the_least_recently_used() {
    let clock = FakeClock::new();
    // max_keys 16: one shard, a batch of one.
    let limiter = bursty(&clock, Some(16));
    for key in 1..16u64 {
        assert_eq!(limiter.reserve(&key, 5).unwrap(), Duration::ZERO);
    }
    clock.advance(Duration::from_millis(100));
    let learner = 100u64;
    let call = limiter.call(&learner, 5).await.unwrap();
    call.learn(&Feedback::new(200));
    drop(call);
    assert_eq!(limiter.stats().keys, 16);
    clock.advance(Duration::from_millis(100));
    // A new key at the cap: one key must go, the least recently used (one
    // of 1..16, all used at 0, before the learner at 100 ms).
    limiter.reserve(&200, 1).unwrap();
    assert_eq!(limiter.stats().dropped_unfinished, 1);
    assert_eq!(limiter.stats().keys, 16);
    // The learner kept: 6 stored at 200 ms, so 10 go at once and leave
    // 0.4 s of debt.
    assert_eq!(limiter.reserve(&learner, 10).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.reserve(&learner, 1).unwrap(),
        Duration::from_millis(400),
        "the learner, used last, lost its debt at the cap"
    );
}

/// A paused key is not dropped during its pause, whatever sweeps run.
#[tokio::test]
async fn a_paused_key_stays_paused_through_sweeps_and_a_flood() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    let call = limiter.call(&7, 1).await.unwrap();
    call.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(30)));
    drop(call);
    let start = clock.now();
    // Floods and long idle gaps while the pause lasts.
    for round in 0..5u64 {
        for key in 0..5_000u64 {
            limiter.reserve(&(1_000 + round * 10_000 + key), 1).unwrap();
        }
        clock.advance(Duration::from_secs(5));
        for _ in 0..100 {
            limiter.reserve(&1, 1).unwrap();
        }
    }
    let elapsed = clock.now() - start;
    assert!(elapsed < Duration::from_secs(30));
    let wait = limiter.try_reserve(&7, 1, Duration::ZERO).unwrap();
    assert!(wait.is_none(), "the paused key was re-made unpaused");
}

/// A reservation still outstanding keeps its key through sweeps by time
/// (its own shard's and the visits), and giving it back after them is exact.
#[test]
fn a_give_back_after_a_sweep_is_exact() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    // Empty key 5, then 20 at once (next free at 2 s), then 10 waiting 2 s.
    assert_eq!(limiter.reserve(&5, 10).unwrap(), Duration::ZERO);
    let r = limiter.reservation(&5, 20).unwrap();
    assert_eq!(r.delay(), Duration::ZERO);
    let r2 = limiter.reservation(&5, 10).unwrap();
    assert_eq!(r2.delay(), Duration::from_secs(2));
    // 1.5 s of calls on other keys, past the sweep period (1 s).
    for _ in 0..30 {
        clock.advance(Duration::from_millis(50));
        for key in 100..140u64 {
            limiter.reserve(&key, 1).unwrap();
        }
    }
    drop(r2);
    // As if r2 never was: next free at 2 s, now 1.5 s.
    assert_eq!(limiter.reserve(&5, 1).unwrap(), Duration::from_millis(500));
    drop(r);
}

/// Control for the learned-key LRU probe: with no new key at the cap the
/// learner owes what the probe expects.
#[tokio::test]
async fn control_the_learner_owes_400ms_without_the_cap() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(16));
    for key in 1..16u64 {
        limiter.reserve(&key, 5).unwrap();
    }
    clock.advance(Duration::from_millis(100));
    let call = limiter.call(&100, 5).await.unwrap();
    call.learn(&Feedback::new(200));
    drop(call);
    clock.advance(Duration::from_millis(100));
    assert_eq!(limiter.reserve(&100, 10).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.reserve(&100, 1).unwrap(),
        Duration::from_millis(400)
    );
}

/// The same with a call in flight (an open call holds its key as limits):
/// the key of the call made last is chosen as least recently used.
#[tokio::test]
async fn at_the_cap_a_key_with_a_call_in_flight_used_last_is_not_the_least_recently_used() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(16));
    for key in 1..16u64 {
        assert_eq!(limiter.reserve(&key, 5).unwrap(), Duration::ZERO);
    }
    clock.advance(Duration::from_millis(100));
    let caller = 100u64;
    let call = limiter.call(&caller, 5).await.unwrap();
    clock.advance(Duration::from_millis(100));
    limiter.reserve(&200, 1).unwrap();
    assert_eq!(limiter.stats().dropped_unfinished, 1);
    drop(call);
    // Kept: 5 stored at 100 ms, 6 at 200 ms: 10 go at once, 0.4 s owed.
    assert_eq!(limiter.reserve(&caller, 10).unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.reserve(&caller, 1).unwrap(),
        Duration::from_millis(400),
        "the key of the call in flight, used last, lost its debt at the cap"
    );
}

/// Among keys held as words alone, the cap drops the key nearest to full
/// (it loses the least), not the least recently used: a key used at 0 ms
/// that drained 9 of 10 permits (full at 900 ms) stays, and one used at
/// 500 ms that took one (full at 600 ms) goes. Each is checked against a
/// twin limiter without the cap.
#[test]
fn at_the_cap_among_words_the_key_nearest_to_full_goes() {
    let clock = FakeClock::new();
    let (capped, twin) = (bursty(&clock, Some(16)), bursty(&clock, None));
    let (old, recent) = (1u64, 100u64);
    for limiter in [&capped, &twin] {
        assert_eq!(limiter.reserve(&old, 9).unwrap(), Duration::ZERO);
    }
    clock.advance(Duration::from_millis(100));
    for key in 2..16u64 {
        capped.reserve(&key, 9).unwrap();
        twin.reserve(&key, 9).unwrap();
    }
    clock.advance(Duration::from_millis(400));
    capped.reserve(&recent, 1).unwrap();
    twin.reserve(&recent, 1).unwrap();
    clock.advance(Duration::from_millis(10));
    capped.reserve(&200, 1).unwrap();
    assert_eq!(capped.stats().dropped_unfinished, 1);
    let next = |limiter: &KeyedRateLimiter<u64, Local, FakeClock>, key: u64| {
        (
            limiter.reserve(&key, 10).unwrap(),
            limiter.reserve(&key, 1).unwrap(),
        )
    };
    assert_eq!(
        next(&capped, old),
        next(&twin, old),
        "the key deepest in debt lost it"
    );
    assert_ne!(
        next(&capped, recent),
        next(&twin, recent),
        "the key nearest to full stayed"
    );
}

/// A key held full and a key never seen are alike after set_rate: both at
/// the new rate's burst.
#[test]
fn after_set_rate_a_held_full_key_and_a_new_key_are_alike() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    limiter.reserve(&1, 1).unwrap();
    clock.advance(Duration::from_millis(200)); // key 1 full again, still held
    assert_eq!(limiter.stats().keys, 1);
    limiter.set_rate(100.0).unwrap();
    assert_eq!(limiter.stats().keys, 1);
    for key in [1u64, 2] {
        assert_eq!(
            limiter.reserve(&key, 100).unwrap(),
            Duration::ZERO,
            "key {key}"
        );
        assert_eq!(
            limiter.reserve(&key, 1).unwrap(),
            Duration::ZERO,
            "key {key}: a burst of 100, then the next at once (nothing owed)"
        );
        assert_eq!(
            limiter.reserve(&key, 1).unwrap(),
            Duration::from_millis(10),
            "key {key}"
        );
    }
    // Swept and re-made after a sweep period: still the new rate's burst.
    clock.advance(Duration::from_secs(3));
    limiter.reserve(&3, 1).unwrap();
    assert_eq!(limiter.reserve(&1, 100).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(&1, 1).unwrap(), Duration::from_millis(10));
}

/// A try_call refused by the schedule gives its slot back at once and
/// leaves no slot state; a call that waits on the schedule and is dropped
/// does too.
#[tokio::test]
async fn a_call_refused_by_the_schedule_leaves_no_slot_state() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(1.0).burst(1))
        .limit(Limit::concurrent(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    drop(limiter.call(&1, 1).await.unwrap());
    drop(limiter.call(&1, 1).await.unwrap());
    let refused = limiter.try_call(&1, 1, Duration::ZERO).await.unwrap();
    assert!(refused.is_none());
    assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
    {
        let waiting = std::pin::pin!(limiter.call(&1, 1));
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let _ = std::future::Future::poll(waiting, &mut cx);
    }
    assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
}

/// Through set_rate to no limit and back, the keys held are counted right
/// and a flood goes with its memory.
#[test]
fn set_rate_to_infinity_and_back_keeps_counts_and_memory() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    for key in 0..100u64 {
        limiter.reserve(&key, 20).unwrap();
    }
    assert_eq!(limiter.stats().keys, 100);
    limiter.set_rate(f64::INFINITY).unwrap();
    assert_eq!(limiter.stats().keys, 100);
    let before = bytes_in_use();
    for key in 1_000..21_000u64 {
        assert_eq!(limiter.reserve(&key, 1).unwrap(), Duration::ZERO);
    }
    let flooded = bytes_in_use() - before;
    limiter.set_rate(10.0).unwrap();
    let keys = limiter.stats().keys;
    assert!(keys <= 20_100, "{keys}");
    clock.advance(Duration::from_secs(3));
    for _ in 0..3_000 {
        limiter.reserve(&5_000_000, 1).unwrap();
        clock.advance(MS);
    }
    let keys = limiter.stats().keys;
    assert!(keys <= 2, "{keys} keys held");
    let after = bytes_in_use() - before;
    assert!(after < 64 * 1024, "{after} bytes held (flood {flooded})");
}

/// With max_keys 1 (one shard, one key), a flood keeps one key and its
/// memory stays small; every drop of a key in debt is counted.
#[test]
fn max_keys_one_holds_one_key_and_counts_each_debt_dropped() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(1));
    let before = bytes_in_use();
    for key in 0..10_000u64 {
        // 11 permits: every key ends in debt.
        limiter.reserve(&key, 11).unwrap();
        assert_eq!(limiter.stats().keys, 1);
    }
    assert_eq!(limiter.stats().dropped_unfinished, 9_999);
    let after = bytes_in_use() - before;
    assert!(after < 16 * 1024, "{after} bytes");
    // Full keys are not counted: 10 000 keys that each take one permit
    // and read as full again before the next comes.
    let clock2 = FakeClock::new();
    let limiter = bursty(&clock2, Some(1));
    for key in 0..1_000u64 {
        limiter.reserve(&key, 1).unwrap();
        clock2.advance(Duration::from_millis(100));
    }
    assert_eq!(limiter.stats().dropped_unfinished, 0);
}

/// `dropped_unfinished` counts exactly the keys that lost something: a
/// key that reads as full at the cap is dropped first and not counted.
#[test]
fn at_the_cap_a_key_that_reads_full_goes_uncounted() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(16));
    for key in 0..16u64 {
        limiter.reserve(&key, if key == 3 { 1 } else { 5 }).unwrap();
    }
    // 100 ms later key 3 is full again; the others owe nothing but are not
    // full.
    clock.advance(Duration::from_millis(100));
    limiter.reserve(&100, 1).unwrap();
    assert_eq!(limiter.stats().dropped_unfinished, 0);
    assert_eq!(limiter.stats().keys, 16);
    limiter.reserve(&101, 1).unwrap();
    assert_eq!(limiter.stats().dropped_unfinished, 1);
    assert_eq!(limiter.stats().keys, 16);
}

/// Several limits per key: a waiting reservation keeps its key through
/// sweeps, and its give-back after them is exact.
#[test]
fn several_limits_give_back_after_sweeps_is_exact() {
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(10.0).burst(10))
        .limit(Limit::per(600.0, Duration::from_secs(60)).burst(20))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(&5, 20).unwrap(), Duration::ZERO);
    let r = limiter.reservation(&5, 10).unwrap();
    let first = r.delay();
    assert!(first > Duration::ZERO);
    // Other keys' calls sweep every shard for half the wait.
    let steps = (first.as_millis() / 2 / 50) as u32;
    for _ in 0..steps {
        clock.advance(Duration::from_millis(50));
        for key in 100..140u64 {
            limiter.reserve(&key, 1).unwrap();
        }
    }
    let now = clock.now();
    drop(r);
    // As if r never was: what 1 waits is what the 20 left, from now.
    let expected = {
        let twin_clock = FakeClock::new();
        let twin = KeyedRateLimiter::<u64>::builder()
            .limit(Limit::per_second(10.0).burst(10))
            .limit(Limit::per(600.0, Duration::from_secs(60)).burst(20))
            .clock(twin_clock.clone())
            .build()
            .unwrap();
        twin.reserve(&5, 20).unwrap();
        twin_clock.advance(now);
        twin.reserve(&5, 1).unwrap()
    };
    assert_eq!(limiter.reserve(&5, 1).unwrap(), expected);
}

/// A paused key at the cap: a flood of new keys (all in debt) after the
/// pause began does not push it out while far fewer than max_keys are
/// held, and keeps it paused.
#[tokio::test]
async fn a_paused_key_is_kept_paused_while_a_flood_fills_the_cap() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(64));
    let call = limiter.call(&7, 1).await.unwrap();
    call.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(20)));
    drop(call);
    for key in 1_000..11_000u64 {
        limiter.reserve(&key, 11).unwrap();
        if key % 1_000 == 0 {
            clock.advance(Duration::from_secs(1));
        }
    }
    assert!(limiter.stats().keys <= 64);
    assert!(clock.now() < Duration::from_secs(20));
    assert!(
        limiter
            .try_reserve(&7, 1, Duration::ZERO)
            .unwrap()
            .is_none(),
        "the paused key was re-made unpaused"
    );
}

/// A flood of keys that each learned (a call answered 200, or 429 with a
/// short pause) goes with its memory once idle, as any other.
#[tokio::test]
async fn a_flood_of_learned_keys_gives_its_memory_back() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, None);
    let before = bytes_in_use();
    for key in 0..5_000u64 {
        let call = limiter.call(&key, 1).await.unwrap();
        let feedback = if key % 2 == 0 {
            Feedback::new(200)
        } else {
            Feedback::new(429).with_retry_after(Duration::from_millis(100))
        };
        call.learn(&feedback);
    }
    assert_eq!(limiter.stats().keys, 5_000);
    let flooded = bytes_in_use() - before;
    clock.advance(Duration::from_secs(5));
    for _ in 0..3_000 {
        limiter.reserve(&1_000_000, 1).unwrap();
        clock.advance(MS);
    }
    assert!(limiter.stats().keys <= 2, "{}", limiter.stats().keys);
    let after = bytes_in_use() - before;
    assert!(after < 64 * 1024, "{after} bytes held (flood {flooded})");
}

/// The cap is on the keys every shard holds together: below it no debt
/// is dropped, however the keys fall across shards (each key here owes
/// a minute); at it, each new key drops others (nearest to full, and
/// counted), and the limiter never holds more than the cap.
#[test]
fn max_keys_counts_the_keys_of_every_shard_together() {
    for cap in [16, 64, 1_000, 4_096] {
        let clock = FakeClock::new();
        let limiter = KeyedRateLimiter::<u64>::builder()
            .permits_per_second(1.0 / 60.0)
            .max_burst(Duration::ZERO)
            .max_keys(cap)
            .clock(clock.clone())
            .build()
            .unwrap();
        for key in 0..cap as u64 {
            // Each key's first request goes; its second would wait a minute.
            assert_eq!(limiter.reserve(&key, 1).unwrap(), Duration::ZERO, "{cap}");
        }
        let stats = limiter.stats();
        assert_eq!((stats.keys, stats.dropped_unfinished), (cap, 0), "{cap}");
        for key in 0..cap as u64 {
            assert_eq!(
                limiter.reserve(&key, 1).unwrap(),
                Duration::from_secs(60),
                "{cap}: key {key} forgot its debt below the cap"
            );
        }
        for key in cap as u64..3 * cap as u64 {
            limiter.reserve(&key, 1).unwrap();
            assert!(limiter.stats().keys <= cap, "{cap}: {:?}", limiter.stats());
        }
        assert!(
            limiter.stats().dropped_unfinished >= 2 * cap as u64 - 1,
            "{cap}"
        );
    }
}

/// An answer that teaches 1 a second (a burst under one permit).
fn one_a_second() -> Feedback {
    let mut quota = Quota::default();
    quota.limit = Some(1);
    quota.window = Some(Duration::from_secs(1));
    Feedback::new(200).with_quota(quota)
}

/// A call's answer that comes back after the cap dropped its key makes
/// room as any new key does: one key, counted, loses its debt. The keys
/// read for that at the configured burst (10), not at the burst the
/// answer taught (under one permit), by which a key with one permit
/// stored of ten read as full: all 16 keys went, uncounted, and came back
/// full, 176 permits granted at once where 41 go.
#[tokio::test]
async fn an_answer_after_its_key_was_dropped_leaves_the_other_keys_their_debt() {
    let clock = FakeClock::new();
    // max_keys 16: one shard, a batch of one.
    let limiter = bursty(&clock, Some(16));
    let call = limiter.call(&100, 1).await.unwrap();
    for key in 1..17u64 {
        // One permit stored of ten. At the cap, key 16 drops the caller's
        // key, the nearest to full.
        assert_eq!(limiter.reserve(&key, 9).unwrap(), Duration::ZERO);
    }
    assert_eq!(limiter.stats().dropped_unfinished, 1);
    call.learn(&one_a_second());
    drop(call);
    let stats = limiter.stats();
    assert_eq!((stats.keys, stats.dropped_unfinished), (16, 2), "{stats:?}");
    let granted: Vec<u64> = (1..17u64)
        .map(|key| {
            let mut granted = 0;
            while limiter
                .try_reserve(&key, 1, Duration::ZERO)
                .unwrap()
                .is_some()
            {
                granted += 1;
            }
            granted
        })
        .collect();
    // The key dropped for the answer's: its burst and one into debt; every
    // other: its one stored and one into debt.
    assert_eq!(granted.iter().sum::<u64>(), 11 + 15 * 2, "{granted:?}");
    assert_eq!(
        granted.iter().filter(|&&n| n == 2).count(),
        15,
        "{granted:?}"
    );
}

/// An answer that comes back after the cap dropped its key, at a call
/// that moves the shard's keys to a base near the clock (hours after the
/// last), leaves them at the configured rate: they had moved at the rate
/// the answer taught, 1 a second and a burst under one permit, for every
/// key of the shard, those never seen included.
#[tokio::test]
async fn an_answer_after_its_key_was_dropped_leaves_the_shard_at_its_rate() {
    let clock = FakeClock::new();
    let limiter = bursty(&clock, Some(16));
    let call = limiter.call(&100, 1).await.unwrap();
    // 15 keys owe 3 hours, with a reservation held behind the debt.
    let mut held = Vec::new();
    for key in 1..16u64 {
        limiter.reserve(&key, 10 + 108_010).unwrap();
        let reservation = limiter.reservation(&key, 1).unwrap();
        assert!(reservation.can_give_back());
        held.push(reservation);
    }
    clock.advance(Duration::from_millis(10_800_500));
    // A new call at the cap drops the first caller's key.
    let second = limiter.call(&17, 1).await.unwrap();
    assert_eq!(limiter.stats().dropped_unfinished, 1);
    // The held reservations' moments pass; the first answer comes back.
    clock.advance(Duration::from_millis(700));
    call.learn(&one_a_second());
    for reservation in held {
        reservation.keep();
    }
    drop((call, second));
    clock.advance(Duration::from_secs(5));
    for key in [1u64, 2, 500] {
        // Full at 10 a second: ten stored and one at once, then 100 ms.
        for permit in 0..11 {
            let wait = limiter.reserve(&key, 1).unwrap();
            assert_eq!(wait, Duration::ZERO, "key {key} permit {permit}");
        }
        assert_eq!(limiter.reserve(&key, 1).unwrap(), 100 * MS, "key {key}");
    }
}
