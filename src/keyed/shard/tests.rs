use std::time::Duration;

use super::*;
use crate::core::{Bursty, Policy};

/// `count` shards of one limiter capped at `keys`, each key at 1/s with a
/// second's burst, and the count of keys they hold together.
fn capped(count: usize, keys: usize) -> (Vec<Shard<u64>>, Arc<AtomicUsize>) {
    let state = State::new(Policy::Bursty(Bursty::new(Duration::from_secs(1))), 1.0, 0).unwrap();
    let template = Limits::new(vec![state]).unwrap();
    let cap = Cap {
        keys,
        share: (keys / count).max(1),
    };
    let held = Arc::new(AtomicUsize::new(0));
    let shards = (0..count)
        .map(|_| {
            let held = Arc::clone(&held);
            Shard::new(
                template.clone(),
                RandomState::new(),
                Some(cap),
                held,
                Mode::Full,
                0,
            )
        })
        .collect();
    (shards, held)
}

/// A new key of `table` at time 0, put in debt (5 permits at 1/s) so that
/// no sweep can drop it as full; what was dropped for it.
fn in_debt(table: &mut Table<u64>, key: u64) -> Dropped {
    let (granted, dropped) = table.reserve(&key, 0, 5, u64::MAX, false);
    assert!(granted.is_some());
    dropped
}

/// New keys that pass the cap together on other shards, each seeing the
/// others' counts as they were, are dropped back to it by the next new
/// key's shard: as many as they passed it by, not a share's sixteenth.
#[test]
fn keys_that_raced_past_the_cap_are_dropped_back_to_it() {
    let (shards, held) = capped(4, 8);
    for key in 0..7 {
        assert_eq!(in_debt(&mut shards[0].write(), key).unfinished, 0);
    }
    assert_eq!(held.load(Relaxed), 7);
    // Three new keys at once on three other shards: each sees 7 held.
    let mut racing: Vec<_> = shards[1..].iter().map(Shard::write).collect();
    for (table, key) in racing.iter_mut().zip(100..) {
        assert_eq!(in_debt(table, key).unfinished, 0);
    }
    drop(racing);
    assert_eq!(held.load(Relaxed), 10, "two past the cap of 8");
    // The next new key: its shard drops three of its keys in debt, so that
    // the limiter holds 8 with it.
    let dropped = in_debt(&mut shards[0].write(), 7);
    assert_eq!(dropped.unfinished, 3);
    assert_eq!(held.load(Relaxed), 8);
}
