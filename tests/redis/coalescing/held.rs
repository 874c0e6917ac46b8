//! A caller that leads its key's round trip and is then held unpolled, or
//! dropped: no other caller of the key waits for it, and what it was
//! granted is given back.

use super::*;

/// Polls `call` once with the task's waker: whether it is still pending.
/// (On a current-thread runtime nothing else runs during that poll, so a
/// call that goes to Redis always is.)
async fn poll_once<F: Future + Unpin>(call: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *call).poll(cx).is_pending())).await
}

/// A limiter at a rate nobody waits for, with a response timeout of 2 s:
/// a caller answered within [`PROMPT`] was answered by Redis, not by its
/// own timer.
async fn roomy(server: &RedisServer, name: &str) -> Arc<RateLimiter<Redis>> {
    let limiter = builder_on(
        backend_builder(server.client()).response_timeout(Duration::from_secs(2)),
        name,
        1000.0,
    )
    .await
    .build()
    .unwrap();
    // The connection is open and the script loaded.
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    Arc::new(limiter)
}

/// Polls `lead` once on a task of its own (so that it leads its key's
/// round trip), then holds it unpolled for [`HOLD`] and drops it;
/// meanwhile `calls` calls of `call`, each started once the one before it
/// ended: each one's answer and how long it waited.
async fn beside_a_held_lead<T, F: Future<Output = T>>(
    lead: Held,
    calls: usize,
    call: impl Fn() -> F,
) -> Vec<(T, Duration)> {
    let (polled, first) = oneshot::channel();
    let holder = tokio::spawn(async move {
        let mut lead = lead;
        let _ = polled.send(poll_once(&mut lead).await);
        tokio::time::sleep(HOLD).await;
        drop(lead);
    });
    assert!(
        first.await.unwrap(),
        "the lead was answered at its first poll"
    );
    let mut answers = Vec::new();
    for _ in 0..calls {
        let start = Instant::now();
        // Answered at the latest once the lead is dropped.
        let answer = tokio::time::timeout(3 * HOLD, call())
            .await
            .expect("a caller of the key is never answered");
        answers.push((answer, start.elapsed()));
    }
    holder.abort();
    answers
}

/// `try_acquire` polled once, leading its key's round trip, then held
/// unpolled: the key's next callers are answered by Redis as promptly as
/// ever, not once the held call is polled again or dropped.
#[tokio::test]
async fn a_try_acquire_held_unpolled_holds_up_no_other_caller_of_its_key() {
    let server = RedisServer::start();
    let limiter = roomy(&server, "held-try").await;
    let lead: Held = {
        let limiter = Arc::clone(&limiter);
        Box::pin(async move {
            let _ = limiter.try_acquire(1, Duration::ZERO).await;
        })
    };
    let answers = beside_a_held_lead(lead, 3, || limiter.try_acquire(1, Duration::ZERO)).await;
    for (i, (answer, waited)) in answers.into_iter().enumerate() {
        println!("caller {i} after the held one waited {waited:?}");
        assert!(answer.unwrap(), "caller {i} was refused");
        assert!(
            waited < PROMPT,
            "caller {i} waited {waited:?} beside a call held for {HOLD:?}"
        );
    }
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// The same with `acquire`, which sleeps once granted.
#[tokio::test]
async fn an_acquire_held_unpolled_holds_up_no_other_caller_of_its_key() {
    let server = RedisServer::start();
    let limiter = roomy(&server, "held-acquire").await;
    let lead: Held = {
        let limiter = Arc::clone(&limiter);
        Box::pin(async move {
            let _ = limiter.acquire(1).await;
        })
    };
    let answers = beside_a_held_lead(lead, 3, || limiter.acquire(1)).await;
    for (i, (answer, waited)) in answers.into_iter().enumerate() {
        println!("caller {i} after the held one waited {waited:?}");
        answer.unwrap();
        assert!(
            waited < PROMPT,
            "caller {i} waited {waited:?} beside a call held for {HOLD:?}"
        );
    }
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// A lead held unpolled for as long as the key is used, and polled to its
/// end only then: every other caller meanwhile is answered promptly, and
/// the held call still gets its own answer.
#[tokio::test]
async fn a_lead_never_polled_again_until_the_end_holds_up_nobody() {
    let server = RedisServer::start();
    let limiter = roomy(&server, "held-long").await;
    let mut lead = Box::pin(limiter.try_acquire(1, Duration::ZERO));
    assert!(
        poll_once(&mut lead).await,
        "the lead was answered at its first poll"
    );
    for i in 0..20 {
        let start = Instant::now();
        let answer = tokio::time::timeout(HOLD, limiter.acquire(1)).await;
        let waited = start.elapsed();
        assert!(answer.is_ok(), "caller {i} not answered within {HOLD:?}");
        answer.unwrap().unwrap();
        assert!(waited < PROMPT, "caller {i} waited {waited:?}");
    }
    assert!(lead.await.unwrap(), "the held call lost its grant");
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// The state of `limiter`'s key as stored.
fn stored(server: &RedisServer, limiter: &RateLimiter<Redis>) -> LimiterState {
    LimiterState::read(&mut server.connection(), &limiter.redis_key()).expect("the key is stored")
}

/// An `acquire` that leads its key's round trip, is held unpolled past its
/// reply and then dropped: the next caller was answered meanwhile, and the
/// held call's grant (its reply never read) is given back.
#[tokio::test]
async fn a_lead_held_past_its_reply_then_dropped_gives_its_grant_back() {
    // One permit per 10 s: a grant's moment stays ahead long enough to be
    // given back.
    const INTERVAL_MICROS: u64 = 10_000_000;
    let server = RedisServer::start();
    let limiter = builder_on(
        backend_builder(server.client()).response_timeout(Duration::from_secs(2)),
        "held-grant",
        0.1,
    )
    .await
    .max_burst(Duration::ZERO)
    .build()
    .unwrap();
    assert!(limiter.reserve(1).await.unwrap().is_zero());
    let before = stored(&server, &limiter);
    let mut lead = Box::pin(limiter.acquire(1));
    assert!(
        poll_once(&mut lead).await,
        "the lead was answered at its first poll"
    );
    // Queued behind the lead's round trip; after it, the key owes 20 s:
    // this try reserves nothing.
    let start = Instant::now();
    let next = tokio::time::timeout(HOLD, limiter.try_acquire(1, Duration::ZERO)).await;
    let waited = start.elapsed();
    println!("the next caller waited {waited:?}");
    assert!(
        matches!(next, Ok(Ok(false))),
        "the next caller: {next:?} after {waited:?}"
    );
    assert!(waited < PROMPT, "the next caller waited {waited:?}");
    // The lead's grant is on the key; its caller never read the reply.
    let granted = stored(&server, &limiter);
    assert!(
        granted.next() >= before.next() + INTERVAL_MICROS / 2,
        "the lead's grant is not on the key: {before:?} then {granted:?}"
    );
    drop(lead);
    let back = within(Duration::from_secs(2), || {
        stored(&server, &limiter).next() < before.next() + INTERVAL_MICROS / 2
    })
    .await;
    assert!(
        back.is_some(),
        "the dropped lead's grant was kept: {before:?} then {:?}",
        stored(&server, &limiter)
    );
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// An `acquire` dropped while the round trip it leads is on the wire (a
/// proxy delays each way by 50 ms): the caller queued behind it is
/// answered as if nothing happened, and the dropped call's grant is given
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_dropped_mid_round_trip_gives_its_grant_back_and_the_key_goes_on() {
    const INTERVAL_MICROS: u64 = 10_000_000;
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = builder_on(
        backend_builder(proxy.client()).response_timeout(Duration::from_secs(2)),
        "dropped-lead",
        0.1,
    )
    .await
    .max_burst(Duration::ZERO)
    .build()
    .unwrap();
    assert!(limiter.reserve(1).await.unwrap().is_zero());
    let before = stored(&server, &limiter);
    proxy.set_latency(Duration::from_millis(50));
    // A round trip now takes 100 ms at least: both stay pending.
    let mut lead = Box::pin(limiter.acquire(1));
    assert!(poll_once(&mut lead).await, "the lead was answered at once");
    let mut next = Box::pin(limiter.try_acquire(1, Duration::ZERO));
    assert!(
        poll_once(&mut next).await,
        "the next caller was answered at once"
    );
    drop(lead);
    let start = Instant::now();
    let next = tokio::time::timeout(HOLD, next).await;
    let waited = start.elapsed();
    println!("the caller queued behind the dropped lead waited {waited:?} more");
    assert!(
        matches!(next, Ok(Ok(false))),
        "the next caller: {next:?} after {waited:?}"
    );
    assert!(waited < PROMPT, "the next caller waited {waited:?}");
    proxy.set_latency(Duration::ZERO);
    let back = within(Duration::from_secs(2), || {
        stored(&server, &limiter).next() < before.next() + INTERVAL_MICROS / 2
    })
    .await;
    assert!(
        back.is_some(),
        "the dropped lead's grant was kept: {before:?} then {:?}",
        stored(&server, &limiter)
    );
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// Redis hangs (SIGSTOP) under a lead held unpolled: the caller queued
/// behind it goes to its fallback within the response timeout, as a
/// single call would, not once the held call is polled again.
#[tokio::test]
async fn a_caller_queued_behind_a_held_lead_on_a_hung_server_falls_back_in_time() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "held-hung", 1000.0)
        .await
        .build()
        .unwrap();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    server.stop();
    let mut lead = Box::pin(limiter.try_acquire(1, Duration::ZERO));
    assert!(
        poll_once(&mut lead).await,
        "the lead was answered at its first poll"
    );
    let start = Instant::now();
    let next = tokio::time::timeout(HOLD, limiter.try_acquire(1, Duration::ZERO)).await;
    let waited = start.elapsed();
    server.cont();
    println!("the caller queued behind a held lead on a hung server waited {waited:?}");
    assert!(
        matches!(next, Ok(Ok(true))),
        "the fallback did not serve the next caller: {next:?} after {waited:?}"
    );
    assert!(
        waited < PROMPT,
        "the next caller waited {waited:?}, with a response timeout of {RESPONSE_TIMEOUT:?}"
    );
    assert!(limiter.stats().degraded);
    drop(lead);
}
