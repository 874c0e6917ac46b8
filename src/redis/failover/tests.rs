//! The fail-over's books on a fake clock.

use std::time::Duration;

use super::*;
use crate::clock::FakeClock;
use crate::core::Bursty;
use crate::redis::backend::Connecting;
use crate::redis::connection::Target;
use crate::redis::runtime::RuntimeRef;

const SECOND: u64 = 1_000_000;

/// A keyed fail-over at 1 permit/s on a fake clock, on a backend that
/// never connects (these tests only read and write its books).
fn failover(max_local_keys: usize) -> (Arc<Failover<String, FakeClock>>, FakeClock) {
    failover_storing(max_local_keys, Duration::ZERO)
}

/// The same, storing `burst` of idle time.
fn failover_storing(
    max_local_keys: usize,
    burst: Duration,
) -> (Arc<Failover<String, FakeClock>>, FakeClock) {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let connecting = Connecting {
        response_timeout: Duration::from_millis(100),
        probe_interval: Duration::from_millis(100),
        ..Connecting::default()
    };
    let backend = Arc::new(Backend::new(
        Target::Single(client),
        RuntimeRef::Owned(None),
        &connecting,
    ));
    let clock = FakeClock::new();
    clock.advance(Duration::from_secs(100));
    let failover = Failover::new(Parts {
        backend,
        naming: Naming::Keyed {
            prefix: "paceline:t:".to_owned(),
        },
        limits: vec![(Policy::Bursty(Bursty::new(burst)), 1.0)],
        fallback: Fallback::Local,
        local_fraction: 1.0,
        max_local_keys,
        clock: clock.clone(),
    })
    .unwrap();
    (failover, clock)
}

fn floor(failover: &Failover<String, FakeClock>, key: &str) -> u64 {
    failover.floor(&failover.books(), key)
}

#[test]
fn a_known_debt_sets_where_the_key_opens() {
    let (failover, clock) = failover(10);
    let now = clock.now_micros();
    failover.note_debt("a", 10 * SECOND);
    assert_eq!(floor(&failover, "a"), now + 10 * SECOND);
    assert_eq!(failover.known_exactly("a"), now + 10 * SECOND);
    // Unknown keys open now; a reply with no debt forgets one.
    assert_eq!(floor(&failover, "b"), now);
    failover.note_debt("a", 0);
    assert_eq!(floor(&failover, "a"), now);
}

#[test]
fn debts_beyond_the_cap_are_kept_per_bucket_and_err_towards_limiting() {
    let (failover, clock) = failover(2);
    let now = clock.now_micros();
    for key in ["a", "b", "c"] {
        failover.note_debt(key, 10 * SECOND);
    }
    assert_eq!(failover.books().known.len(), 2);
    // Every key still opens no earlier than its debt ends...
    for key in ["a", "b", "c"] {
        assert!(floor(&failover, key) >= now + 10 * SECOND, "{key}");
    }
    // ...but the one that did not fit is not known exactly: its
    // carry-back counts what Redis holds as nothing.
    assert_eq!(failover.known_exactly("c"), 0);
    // A key sharing its bucket opens late too (limiting, never granting).
    let bucket = failover.bucket("c");
    let neighbour = (0..)
        .map(|i| format!("n{i}"))
        .find(|key| failover.bucket(key.as_str()) == bucket)
        .unwrap();
    assert_eq!(floor(&failover, &neighbour), now + 10 * SECOND);
    // Debts that have ended make room again.
    clock.advance(Duration::from_secs(11));
    failover.note_debt("d", SECOND);
    assert_eq!(failover.known_exactly("d"), clock.now_micros() + SECOND);
}

#[test]
fn keys_open_no_earlier_than_a_ticket_the_fallback_dropped() {
    let (failover, clock) = failover(1);
    let now = clock.now_micros();
    // The fallback holds one key; a second drops the first, whose
    // ticket lies 10 s ahead.
    failover.local.open("a", now, None);
    crate::store::now(crate::store::reserve(&failover.local, "a", 10)).unwrap();
    failover.local.open("b", now, None);
    assert!(failover.local.ticket("a").is_none());
    assert!(failover.local.dropped_until() >= now + 10 * SECOND);
    assert!(floor(&failover, "c") >= now + 10 * SECOND);
}

/// A key opens in the fallback at the fraction of its rate it learned in
/// Redis, as its last reply said; a key that learned nothing, opened
/// after it, runs at the configured rate (the fallback's template keeps
/// it).
#[test]
fn a_key_opens_at_the_rate_it_learned_and_the_others_at_theirs() {
    let (failover, clock) = failover(10);
    // A reply that says what the key learned.
    let learned = |factor: f64| {
        let learned = crate::core::Adopted {
            factor,
            margin: 1.0,
            caps: vec![f64::INFINITY].into(),
            paused_until: 0,
        };
        Reply {
            wait: Some(Duration::ZERO),
            debt_micros: 0,
            token: None,
            limit: 0,
            after: Some(Arc::new(Stored {
                now_micros: 0,
                limits: Vec::new(),
                learned: Some(learned.clone()),
            })),
            learned: Some(learned),
        }
    };
    failover.note_learned("slow", &learned(0.5));
    let now = clock.now_micros();
    failover.open_locally(&mut failover.books(), "slow");
    failover.open_locally(&mut failover.books(), "fresh");
    let take =
        |key: &str| crate::store::now(crate::store::reserve(&failover.local, key, 1)).unwrap();
    // Both open at now with nothing stored: the first goes at once, the
    // next waits one interval, 2 s at half of 1/s, 1 s at 1/s.
    for key in ["slow", "fresh"] {
        assert_eq!(take(key), Duration::ZERO, "{key}");
    }
    assert_eq!(take("slow"), Duration::from_secs(2));
    assert_eq!(take("fresh"), Duration::from_secs(1));
    assert_eq!(failover.local.ticket("slow"), Some(now + 4 * SECOND));
    // A reply that says the key is back at its rate forgets the factor.
    failover.note_learned("slow", &learned(1.0));
    assert!(failover.books().learned.is_empty());
}

/// The floor after a drop is the dropped key's ticket, not the moment it
/// would be full again (a burst's refill later): with a minute's burst at
/// 1/s, a key 10 s in debt is full 70 s from now, and new keys opened 70 s
/// ahead while the cap ordered keys by when they are full.
#[test]
fn the_floor_after_a_drop_is_the_dropped_ticket() {
    let (failover, clock) = failover_storing(1, Duration::from_secs(60));
    let now = clock.now_micros();
    failover.local.open("a", now, None);
    crate::store::now(crate::store::reserve(&failover.local, "a", 10)).unwrap();
    let ticket = failover.local.ticket("a").unwrap();
    failover.local.open("b", now, None);
    assert!(failover.local.ticket("a").is_none());
    let dropped = failover.local.dropped_until();
    assert!(dropped >= ticket, "{dropped} < ticket {ticket}");
    assert!(
        dropped <= ticket + SECOND,
        "new keys open {} s after the dropped ticket ({} s ahead of now)",
        (dropped - ticket) / SECOND,
        (dropped - now) / SECOND
    );
}
