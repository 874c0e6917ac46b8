//! Calls in flight (`Limit::concurrent`) per key: each key has its own `k`
//! slots, and a key with no call holding or waiting for a slot holds no
//! slot state (the heap it took comes back).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::Duration;

use crate::support::alloc::bytes_in_use;
use paceline::clock::FakeClock;
use paceline::{KeyedRateLimiter, Limit, Local};

fn limiter(calls: u32) -> KeyedRateLimiter<u64, Local, FakeClock> {
    KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(1e6).burst(1_000))
        .limit(Limit::concurrent(calls))
        .clock(FakeClock::new())
        .build()
        .unwrap()
}

#[tokio::test]
async fn each_key_has_its_own_slots() {
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let alice = limiter.call("alice", 1).await.unwrap();
    assert!(
        limiter
            .try_call("alice", 1, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    let bob = limiter.try_call("bob", 1, Duration::ZERO).await.unwrap();
    assert!(bob.is_some());
    assert_eq!(limiter.stats().in_flight, 2);
    assert_eq!(limiter.slot_keys(), 2);
    drop(alice);
    assert_eq!(limiter.slot_keys(), 1);
    assert!(
        limiter
            .try_call("alice", 1, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
    );
    drop(bob);
    assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_k_calls_per_key_under_many_tasks() {
    let limiter = Arc::new(limiter(3));
    let keys: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let most: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for task in 0..48u64 {
        let (limiter, keys, most) = (limiter.clone(), keys.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25u64 {
                let key = (task + round) % 4;
                let call = limiter.call(&key, 1).await.unwrap();
                let now = keys[key as usize].fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 3, "{now} calls of key {key} in flight");
                most[key as usize].fetch_max(now, Ordering::SeqCst);
                // Held a while, and until the key has had 3 calls in flight
                // at once (or a thousand turns): the limit is reached, not
                // only kept, however the machine schedules the tasks.
                for turn in 0u64.. {
                    let reached = most[key as usize].load(Ordering::SeqCst) == 3;
                    if turn >= task % 3 && (reached || turn >= 1000) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                keys[key as usize].fetch_sub(1, Ordering::SeqCst);
                drop(call);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for key in 0..4 {
        assert_eq!(most[key].load(Ordering::SeqCst), 3, "key {key}");
    }
    assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
}

#[test]
fn a_keys_slot_state_goes_with_its_last_call_and_its_memory_with_it() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = limiter(2);
        // Every key called once first: what the rate holds of them is
        // there before the count starts.
        for key in 0..20_000u64 {
            drop(limiter.call(&key, 1).await.unwrap());
        }
        assert_eq!(limiter.slot_keys(), 0);
        let before = bytes_in_use();
        let mut calls = Vec::new();
        for key in 0..20_000u64 {
            calls.push(limiter.call(&key, 1).await.unwrap());
        }
        assert_eq!(limiter.slot_keys(), 20_000);
        assert_eq!(limiter.stats().in_flight, 20_000);
        let holding = bytes_in_use() - before;
        assert!(holding > 20_000 * 32, "{holding} bytes for 20 000 keys");
        calls.clear();
        calls.shrink_to_fit();
        assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
        let after = bytes_in_use() - before;
        assert!(
            after < 16 * 1024,
            "{after} bytes still held (20 000 calls took {holding})"
        );
    });
}

#[tokio::test]
async fn a_waiter_dropped_leaves_no_state_behind() {
    let limiter = limiter(1);
    let held = limiter.call(&7, 1).await.unwrap();
    {
        let mut waiting = pin!(limiter.call(&7, 1));
        let polled = waiting
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending());
        assert_eq!(limiter.slot_keys(), 1);
    }
    drop(held);
    assert_eq!(limiter.slot_keys(), 0);
    assert!(
        limiter
            .try_call(&7, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
    );
}

/// Per key, at most `k` calls in flight while calls are cancelled wherever
/// they are (waiting for a slot, or for their place) by `timeout`; once
/// every task is done each key has its `k` slots free again, and no key
/// holds slot state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_cancelled_at_random_points_strand_no_slot_and_never_exceed_k_per_key() {
    // The real clock: a call sleeps for its place holding its slot.
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder()
            .limit(Limit::per_second(2_000.0).burst(2))
            .limit(Limit::concurrent(2))
            .build()
            .unwrap(),
    );
    let keys: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for task in 0..32u64 {
        let (limiter, keys) = (limiter.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..40u64 {
                let key = (task + round) % 4;
                let bound = Duration::from_micros(200 + (task * 37 + round * 101) % 3_000);
                let Ok(call) = tokio::time::timeout(bound, limiter.call(&key, 1)).await else {
                    continue;
                };
                let call = call.unwrap();
                let now = keys[key as usize].fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 2, "{now} calls of key {key} in flight");
                tokio::time::sleep(Duration::from_micros((task * 13 + round) % 700)).await;
                keys[key as usize].fetch_sub(1, Ordering::SeqCst);
                drop(call);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!((limiter.stats().in_flight, limiter.slot_keys()), (0, 0));
    for key in 0..4u64 {
        let first = limiter.try_call(&key, 1, Duration::from_secs(1)).await;
        let second = limiter.try_call(&key, 1, Duration::from_secs(1)).await;
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(first.is_some() && second.is_some());
        let third = limiter
            .try_call(&key, 1, Duration::from_millis(20))
            .await
            .unwrap();
        assert!(third.is_none(), "a third call of key {key} in flight");
    }
}

/// A key dropped at `max_keys` loses its debt, not its calls in flight: a
/// call that holds the key's only slot still counts for it.
#[tokio::test]
async fn a_key_dropped_at_the_cap_keeps_its_calls_in_flight() {
    let limiter = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(10.0).burst(10))
        .limit(Limit::concurrent(1))
        .max_keys(16)
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let call = limiter.call(&0, 1).await.unwrap();
    // Keys in debt, used after key 0, push it out.
    for key in 1..200u64 {
        limiter.reserve(&key, 100).unwrap();
    }
    assert!(limiter.stats().dropped_unfinished >= 1);
    assert!(limiter.stats().keys <= 16);
    assert!(
        limiter
            .try_call(&0, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    drop(call);
    assert!(
        limiter
            .try_call(&0, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
    );
}
