use std::time::Duration;

use super::*;
use crate::clock::FakeClock;
use crate::core::Bursty;

/// At the cap, a new key whose shard holds few keys does not make room
/// there, where its only other key may be one in use and in debt: the
/// shard holding the most drops one of its own, nearest to full.
#[test]
fn at_the_cap_a_sparse_shard_leaves_the_drop_to_the_fullest() {
    let state = State::new(Policy::Bursty(Bursty::new(Duration::from_secs(1))), 1.0, 0).unwrap();
    // 64 keys: four shards of 16.
    let keyed = Keyed::from_limits(vec![state], FakeClock::new(), Some(64), Mode::Full);
    assert_eq!(keyed.shards.len(), 4);
    let in_debt = |key: &String| {
        keyed.reserve_micros(key, 5, u64::MAX, false).unwrap();
    };
    let hot = "hot".to_string();
    in_debt(&hot);
    let same_shard = |key: &String| std::ptr::eq(keyed.shard(key), keyed.shard(&hot));
    let mut names = (0..).map(|i| format!("key{i}"));
    for key in names.by_ref().filter(|key| !same_shard(key)).take(63) {
        in_debt(&key);
    }
    assert_eq!(keyed.len(), 64);
    assert_eq!(keyed.dropped_unfinished.load(Relaxed), 0);
    let newcomer = names.find(|key| same_shard(key)).unwrap();
    in_debt(&newcomer);
    assert_eq!(keyed.len(), 64);
    assert_eq!(keyed.dropped_unfinished.load(Relaxed), 1);
    // The hot key still owes what it owed: a try that waits for nothing is
    // refused.
    assert!(keyed.reserve_micros(&hot, 1, 0, false).is_none());
}
