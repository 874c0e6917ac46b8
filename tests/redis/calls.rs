//! Calls to an upstream through Redis (`RateLimiter::call`,
//! `KeyedRateLimiter::call`): settles exact while the key's log holds the
//! call (a twin that reserved the real cost in the first place ends on the
//! same tickets, to the 2^-20 µs), the excess charged once it let go; a
//! refusal learned by one instance slows every instance of the key, and
//! one started later; a dropped call is kept; the fallback keeps the
//! learned rate when Redis dies, and counts a settle that arrives then.
//!
//! Redis reads its own clock (TIME), so each test keeps its keys in debt
//! far ahead of it: every request's moment is then a ticket, whatever the
//! clock reads, and the tickets compare exactly. Settles, lessons and keeps
//! go in the background: a test waits for the key's log to empty (the
//! keep comes last) before it reads.

use std::time::{Duration, Instant};

use crate::support::limiter_state::{LimitState, Value};
use crate::support::poll::patient_backend;
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use crate::support::rng::Rng;
use crate::support::within::within;
use paceline::clock::{Clock, FakeClock};
use paceline::outbound::{Call, Feedback};
use paceline::redis::{Fallback, Redis};
use paceline::{Cost, KeyedRateLimiter, Limit, RateLimiter, Snapshot};

/// A limit's ticket, in 2^-20 µs.
fn ticket(limit: &LimitState) -> u128 {
    ((limit.next_free_micros as u128) << 20) + limit.next_free_fraction as u128
}

/// `key`'s value once its log is empty (every call kept), within 5 s.
async fn settled(server: &RedisServer, key: &str) -> Value {
    let mut con = server.connection();
    let mut value = None;
    within(Duration::from_secs(5), || {
        value = Value::read(&mut con, key);
        value.as_ref().is_some_and(|v| v.logged().is_none())
    })
    .await
    .unwrap_or_else(|| panic!("{key}'s log never emptied: {value:?}"));
    value.unwrap()
}

/// A lesson: refused, asked to wait `retry_after`.
fn refused(retry_after: Duration) -> Feedback {
    Feedback::new(429).with_retry_after(retry_after)
}

/// 1 000 requests and 100 000 tokens per second, no burst, under `name`,
/// on a backend of its own (a process of its own).
async fn requests_and_tokens(
    server: &RedisServer,
    name: &str,
    clock: &FakeClock,
) -> RateLimiter<Redis, FakeClock> {
    RateLimiter::builder()
        .limit(Limit::per_second(1_000.0).burst(1))
        .limit(Limit::per_second(100_000.0).burst(1))
        .redis(&patient_backend(server.client()).await, name)
        .fallback(Fallback::FailClosed)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// `rate` permits per second, no burst, under `name`, on a backend of its
/// own.
async fn paced(
    server: &RedisServer,
    name: &str,
    rate: f64,
    clock: &FakeClock,
    fallback: Fallback,
) -> RateLimiter<Redis, FakeClock> {
    RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(Duration::ZERO)
        .redis(&patient_backend(server.client()).await, name)
        .fallback(fallback)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn counts(rng: &mut Rng) -> [u32; 2] {
    [1 + rng.below(3) as u32, rng.below(2_000) as u32]
}

/// Calls settled at their real cost (some twice, the last standing), then
/// dropped, among plain reservations, leave their key where a twin that
/// reserved the real costs in the first place leaves its own: the same
/// distance travelled by every ticket, to the 2^-20 µs.
#[tokio::test]
async fn a_settled_call_leaves_the_key_as_a_twin_that_reserved_its_cost() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let settled_limiter = requests_and_tokens(&server, "settled", &clock).await;
    let twin = requests_and_tokens(&server, "twin", &clock).await;
    // 10 s of debt on the first limit: every request after goes at its
    // ticket.
    settled_limiter.reserve(10_000).await.unwrap();
    twin.reserve(10_000).await.unwrap();
    let before = [
        settled(&server, "paceline:v1:settled").await,
        settled(&server, "paceline:v1:twin").await,
    ];
    let mut rng = Rng::new(0xCA11);
    for i in 0..20 {
        let (estimate, actual) = (counts(&mut rng), counts(&mut rng));
        let call = settled_limiter.call(Cost::each(estimate)).await.unwrap();
        call.settle(Cost::each(actual)).unwrap();
        drop(twin.call(Cost::each(actual)).await.unwrap());
        if i % 4 == 0 {
            settled_limiter.reserve(2).await.unwrap();
            twin.reserve(2).await.unwrap();
        }
    }
    let after = [
        settled(&server, "paceline:v1:settled").await,
        settled(&server, "paceline:v1:twin").await,
    ];
    for limit in 0..2 {
        let travelled: Vec<u128> = (0..2)
            .map(|key| ticket(&after[key].limits[limit]) - ticket(&before[key].limits[limit]))
            .collect();
        assert_eq!(travelled[0], travelled[1], "limit {limit}");
        assert_eq!(after[0].limits[limit].stored_permits, 0.0);
    }
    // (Far ahead of the clock, as the test needs.)
    assert!(after[0].limits[0].next_free_micros > after[0].last_now_micros + 5e6);
}

/// Once the log has let a call go (here a rate change emptied it), what
/// it cost past its estimate is charged as a request that does not wait,
/// and what it cost less is not given back.
#[tokio::test]
async fn a_call_the_log_let_go_is_charged_its_excess_and_gives_nothing_back() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let let_go = paced(&server, "let_go", 1_000.0, &clock, Fallback::FailClosed).await;
    let twin = paced(
        &server,
        "let_go_twin",
        1_000.0,
        &clock,
        Fallback::FailClosed,
    )
    .await;
    for limiter in [&let_go, &twin] {
        limiter.reserve(10_000).await.unwrap();
    }
    let before = [
        settled(&server, "paceline:v1:let_go").await,
        settled(&server, "paceline:v1:let_go_twin").await,
    ];
    let more = let_go.call(5).await.unwrap();
    let less = let_go.call(5).await.unwrap();
    drop(twin.call(5).await.unwrap());
    drop(twin.call(5).await.unwrap());
    for limiter in [&let_go, &twin] {
        limiter.set_rate(500.0).unwrap();
        limiter.reserve(1).await.unwrap();
    }
    more.settle(8).unwrap();
    less.settle(2).unwrap();
    // The twin: the excess of the first, nothing of the second.
    twin.reserve(3).await.unwrap();
    let twin_after = settled(&server, "paceline:v1:let_go_twin").await;
    let expected = ticket(&twin_after.limits[0]) - ticket(&before[1].limits[0]);
    let travelled = |server: &RedisServer| {
        let mut con = server.connection();
        let value = Value::read(&mut con, "paceline:v1:let_go").unwrap();
        ticket(&value.limits[0]) - ticket(&before[0].limits[0])
    };
    within(Duration::from_secs(5), || travelled(&server) == expected)
        .await
        .unwrap_or_else(|| panic!("travelled {}, the twin {expected}", travelled(&server)));
    // Nothing else comes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(travelled(&server), expected);
}

/// A refusal learned by one instance lowers the rate (× 0.7) and pauses
/// every instance of the key until its Retry-After: another instance's
/// next request goes one learned interval after the pause, and an
/// instance started after runs at the learned rate too.
#[tokio::test]
async fn a_refusal_learned_by_one_instance_slows_every_instance_of_the_key() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let one = paced(&server, "shared", 10.0, &clock, Fallback::FailClosed).await;
    let other = paced(&server, "shared", 10.0, &clock, Fallback::FailClosed).await;
    let call = one.call(1).await.unwrap();
    call.learn(&refused(Duration::from_secs(3)));
    drop(call);
    let mut con = server.connection();
    let mut value = None;
    within(Duration::from_secs(5), || {
        value = Value::read(&mut con, "paceline:v1:shared");
        value.as_ref().is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson reached Redis");
    let learned = value.unwrap().learned.unwrap();
    let (factor, paused_until) = (learned[0], learned[1]);
    assert_eq!(factor, 0.7);
    // The other instance: at the end of the pause, then 1/7 s apart.
    other.reserve(1).await.unwrap();
    let value = settled(&server, "paceline:v1:shared").await;
    assert_eq!(value.limits[0].permits_per_second, 10.0 * 0.7);
    let interval = 1e6 / (10.0 * 0.7);
    let first = value.limits[0].next_free_micros - paused_until;
    assert!((first - interval).abs() <= 1.0, "{first} after the pause");
    let before = ticket(&value.limits[0]);
    other.reserve(10).await.unwrap();
    let value = settled(&server, "paceline:v1:shared").await;
    let ten = (ticket(&value.limits[0]) - before) as f64 / f64::from(1u32 << 20);
    assert!((ten - 10.0 * interval).abs() <= 1.0, "{ten} µs for 10");
    // An instance started now runs at the learned rate.
    let later = paced(&server, "shared", 10.0, &clock, Fallback::FailClosed).await;
    let before = ticket(&value.limits[0]);
    later.reserve(10).await.unwrap();
    let value = settled(&server, "paceline:v1:shared").await;
    let ten = (ticket(&value.limits[0]) - before) as f64 / f64::from(1u32 << 20);
    assert!((ten - 10.0 * interval).abs() <= 1.0, "{ten} µs for 10");
}

/// A call stays in the key's log past its moment, so that it can still be
/// settled exactly; dropping it keeps it, and the log empties.
#[tokio::test]
async fn a_dropped_call_is_kept_and_the_log_empties() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    // (Slow: the key lives, with its log, for seconds.)
    let limiter = paced(&server, "kept", 1.0, &clock, Fallback::FailClosed).await;
    let call = limiter.call(1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut con = server.connection();
    let value = Value::read(&mut con, "paceline:v1:kept").unwrap();
    assert_eq!(value.logged(), Some(1), "open past its moment: {value:?}");
    assert!(value.log[0][1] < 0.0, "logged as open: {value:?}");
    // Others' requests are logged behind it while it is open.
    limiter.reserve(1).await.unwrap();
    assert_eq!(
        Value::read(&mut con, "paceline:v1:kept").unwrap().logged(),
        Some(2)
    );
    drop(call);
    settled(&server, "paceline:v1:kept").await;
}

/// A keyed limiter through Redis: each key settles its calls exactly (as
/// a twin key that reserved the real costs), and learns alone.
#[tokio::test]
async fn keyed_calls_settle_and_learn_per_key() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(1_000.0).burst(1))
        .limit(Limit::per_second(100_000.0).burst(1))
        .redis(&patient_backend(server.client()).await, "upstreams")
        .fallback(Fallback::FailClosed)
        .clock(clock.clone())
        .build()
        .unwrap();
    let key = |k: &str| limiter.redis_key(k);
    for k in ["a", "b"] {
        limiter.reserve(k, 10_000).await.unwrap();
    }
    let before = [
        settled(&server, &key("a")).await,
        settled(&server, &key("b")).await,
    ];
    let mut rng = Rng::new(0xB0B);
    for _ in 0..10 {
        let (estimate, actual) = (counts(&mut rng), counts(&mut rng));
        let call = limiter.call("a", Cost::each(estimate)).await.unwrap();
        call.settle(Cost::each(actual)).unwrap();
        drop(limiter.call("b", Cost::each(actual)).await.unwrap());
    }
    let after = [
        settled(&server, &key("a")).await,
        settled(&server, &key("b")).await,
    ];
    for limit in 0..2 {
        assert_eq!(
            ticket(&after[0].limits[limit]) - ticket(&before[0].limits[limit]),
            ticket(&after[1].limits[limit]) - ticket(&before[1].limits[limit]),
            "limit {limit}"
        );
    }
    // A refusal on "a" is learned by "a" alone.
    let call = limiter.call("a", 1).await.unwrap();
    call.learn(&refused(Duration::ZERO));
    drop(call);
    let learned = settled(&server, &key("a")).await;
    let mut con = server.connection();
    within(Duration::from_secs(5), || {
        Value::read(&mut con, &key("a")).is_some_and(|v| v.learned.is_some())
    })
    .await
    .unwrap_or_else(|| panic!("a learned nothing: {learned:?}"));
    let a = Value::read(&mut con, &key("a")).unwrap();
    assert_eq!(a.learned.as_ref().unwrap()[0], 0.7);
    assert_eq!(a.limits[0].permits_per_second, 1_000.0 * 0.7);
    assert_eq!(a.limits[1].permits_per_second, 100_000.0 * 0.7);
    let b = Value::read(&mut con, &key("b")).unwrap();
    assert_eq!((b.learned, b.limits[0].permits_per_second), (None, 1_000.0));
}

/// Redis dies after the key learned a refusal: the fallback opens the key
/// at the learned rate (10/s × 0.7, on the limiter's own clock), and a
/// settle of a call Redis served, arriving while it is down, is charged
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_redis_dies_the_fallback_keeps_the_learned_rate() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = paced(&server, "dying", 10.0, &clock, Fallback::Local).await;
    let call = limiter.call(1).await.unwrap();
    call.learn(&refused(Duration::ZERO));
    drop(call);
    settled(&server, "paceline:v1:dying").await;
    // A call's reply carries what the key learned.
    let served = limiter.call(1).await.unwrap();
    assert!(!limiter.stats().degraded);
    server.kill();
    let interval = Duration::from_nanos((1e9_f64 / (10.0 * 0.7)).round() as u64);
    let wait = |first: Duration, second: Duration| second.saturating_sub(first);
    let first = limiter.reserve(1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    let second = limiter.reserve(1).await.unwrap();
    let apart = wait(first, second);
    assert!(
        apart.abs_diff(interval) <= Duration::from_micros(1),
        "{apart:?} apart, not {interval:?}"
    );
    // The settle of the call Redis served: its excess, 3 permits, is
    // charged to the fallback's key (3 intervals more for the next).
    served.settle(4).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let wait = limiter.snapshot().await.unwrap().wait();
        if wait.saturating_sub(second) >= 3 * interval {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the excess never reached the fallback: {wait:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next = limiter.reserve(1).await.unwrap();
    let apart = wait(second, next);
    assert!(
        apart.abs_diff(4 * interval) <= Duration::from_micros(4),
        "{apart:?} apart, not {:?}",
        4 * interval
    );
}

/// A rate the upstream reported, learned in Redis, reaches the fallback
/// too, at the process's share: a limiter configured at 10/s that learned
/// the upstream allows 4/s, taking half when Redis is down, goes on at
/// half of 0.97 of 4/s, not at half of 10/s.
#[tokio::test]
async fn when_redis_dies_the_fallback_keeps_the_reported_rate_at_its_share() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&patient_backend(server.client()).await, "reported")
        .fallback(Fallback::Local)
        .local_fraction(0.5)
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(1).await.unwrap();
    let policy: [(&str, &[u8]); 1] = [("ratelimit-policy", b"4;w=1")];
    call.learn(&Feedback::from_headers(
        200,
        policy,
        std::time::SystemTime::now(),
    ));
    drop(call);
    settled(&server, "paceline:v1:reported").await;
    // A call's reply carries what the key learned: its snapshots read the
    // key at the learned rate.
    drop(limiter.call(1).await.unwrap());
    assert_eq!(limiter.snapshot().await.unwrap().rate(), 4.0 * 0.97);
    server.kill();
    let first = limiter.reserve(1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    let second = limiter.reserve(1).await.unwrap();
    let interval = Duration::from_secs_f64(1.0 / (4.0 * 0.97 * 0.5));
    let apart = second.saturating_sub(first);
    assert!(
        apart.abs_diff(interval) <= Duration::from_micros(1),
        "{apart:?} apart, not {interval:?}"
    );
    // A call the fallback serves learns the same rate, at the same share.
    let call = limiter.call(1).await.unwrap();
    call.learn(&Feedback::from_headers(
        200,
        policy,
        std::time::SystemTime::now(),
    ));
    drop(call);
    let third = limiter.reserve(1).await.unwrap();
    let fourth = limiter.reserve(1).await.unwrap();
    let apart = fourth.saturating_sub(third);
    assert!(
        apart.abs_diff(interval) <= Duration::from_micros(1),
        "{apart:?} apart after a lesson in the fallback, not {interval:?}"
    );
}

/// What the upstream says is left caps the key's stored permits in Redis,
/// and the call's settle after the lesson does not undo the cap: the key's
/// log holds it, and the settle's replay caps at the same place (before
/// caps were logged, the replay from the log's base undid it: 9 at once).
#[tokio::test]
async fn a_cap_on_what_is_left_survives_the_settle() {
    let server = RedisServer::start();
    // 0.1/s with a burst of 10: a loaded machine's stall of ten seconds
    // adds one.
    let limiter = RateLimiter::builder()
        .limit(Limit::per(10.0, Duration::from_secs(100)))
        .redis(&patient_backend(server.client()).await, "left")
        .build()
        .unwrap();
    let call = limiter.call(1).await.unwrap();
    let mut quota = paceline::outbound::Quota::default();
    quota.remaining = Some(2);
    call.learn(&Feedback::new(200).with_quota(quota));
    call.settle(1).unwrap();
    settled(&server, "paceline:v1:left").await;
    let mut at_once = 0;
    while limiter
        .try_reserve(1, Duration::ZERO)
        .await
        .unwrap()
        .is_some()
        && at_once < 20
    {
        at_once += 1;
    }
    // The 2 left (one stored, and the one that goes when nothing is owed),
    // and ten seconds' worth of slack; 9 before the fix.
    assert!(
        at_once <= 3,
        "{at_once} at once after the upstream said 2 are left"
    );
}

/// Requests at 1/s with no burst, and tokens (named so) at 0.1/s storing
/// up to 9: a loaded machine's stall of ten seconds adds one token.
async fn requests_and_slow_tokens(server: &RedisServer, name: &str) -> RateLimiter<Redis> {
    RateLimiter::builder()
        .limit(Limit::per_second(1.0))
        .limit(Limit::per(10.0, Duration::from_secs(100)).named("tokens"))
        .redis(&patient_backend(server.client()).await, name)
        .build()
        .unwrap()
}

/// The upstream says `remaining` tokens are left.
fn tokens_left(remaining: u64) -> Feedback {
    let mut quota = paceline::outbound::Quota::named("tokens");
    quota.remaining = Some(remaining);
    Feedback::new(200).with_quota(quota)
}

/// A cap that took nothing away in Redis, because a held reservation made
/// before had taken more, still binds once that reservation is given back:
/// the key then stores what it would had the reservation never been made
/// and the upstream said the same then. (Before caps were logged, the
/// give-back replayed the log without the cap: 9 tokens stored after the
/// upstream said 7 were left.)
#[tokio::test]
async fn a_cap_that_took_nothing_away_survives_a_give_back_in_redis() {
    let server = RedisServer::start();
    let limiter = requests_and_slow_tokens(&server, "left_given").await;
    // An open call puts the requests 10 s in debt, and keeps the log open.
    let call = limiter.call(Cost::each([10, 0])).await.unwrap();
    // A reservation waits for the requests; the tokens, charged then,
    // store 4 after it.
    let held = limiter.reservation(5).await.unwrap();
    assert!(held.delay() > Duration::from_secs(5), "{:?}", held.delay());
    // The upstream says 7 tokens are left (6 stored, beside the one when
    // nothing is owed): the cap takes nothing away.
    call.learn(&tokens_left(7));
    let mut con = server.connection();
    within(Duration::from_secs(5), || {
        Value::read(&mut con, "paceline:v1:left_given").is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson lands");
    drop(held);
    drop(call);
    let value = settled(&server, "paceline:v1:left_given").await;
    // Without the reservation the key stored all 9 tokens when the
    // upstream said 7 were left: 6 (the cap, at its place).
    let tokens = value.limits[1].stored_permits;
    assert_eq!(tokens, 6.0, "{value:?}");
}

/// A settle in Redis after a cap that took tokens away is exact: what the
/// call's estimate over-counted of the requests is given back. (Before caps
/// were logged, the cap emptied the key's log, and the settle gave nothing
/// back: the requests stayed 20 s in debt.)
#[tokio::test]
async fn a_settle_after_a_cap_that_took_permits_away_is_exact_in_redis() {
    let server = RedisServer::start();
    let limiter = requests_and_slow_tokens(&server, "left_settled").await;
    // Estimated at 20 requests (20 s of debt) and 1 token: 8 tokens stored.
    let call = limiter.call(Cost::each([20, 1])).await.unwrap();
    // The upstream says 2 tokens are left; the call cost 1 request.
    call.learn(&tokens_left(2));
    call.settle(Cost::each([1, 1])).unwrap();
    let value = settled(&server, "paceline:v1:left_settled").await;
    // The requests owe the 1 s of the one they counted, not 20.
    let debt = value.limits[0].next_free_micros - value.last_now_micros;
    assert!(debt <= 1e6, "{debt} µs of debt: {value:?}");
    // (2 left: 1 stored, beside the one when nothing is owed.)
    assert_eq!(value.limits[1].stored_permits, 1.0, "{value:?}");
}

/// "Nothing left", with no reset to wait for, caps what the key stores at
/// nothing, in the log (a call open) and outside it: it once capped
/// nothing, and the tokens kept all they stored (9, where "1 left" kept 1).
#[tokio::test]
async fn nothing_left_without_a_reset_stores_nothing_in_redis() {
    let server = RedisServer::start();
    let limiter = requests_and_slow_tokens(&server, "left_none").await;
    // An open call (its request 1 s in debt, 1 token of 10): logged.
    let call = limiter.call(Cost::each([1, 1])).await.unwrap();
    call.learn(&tokens_left(0));
    call.settle(Cost::each([1, 1])).unwrap();
    let value = settled(&server, "paceline:v1:left_none").await;
    assert_eq!(value.limits[1].stored_permits, 0.0, "{value:?}");
    // Not logged: a second key, whose call's estimate nothing waits for
    // (it is kept, and leaves the log, before the lesson).
    let other = requests_and_slow_tokens(&server, "left_none_plain").await;
    let call = other.call(Cost::each([0, 1])).await.unwrap();
    call.settle(Cost::each([0, 1])).unwrap();
    let value = settled(&server, "paceline:v1:left_none_plain").await;
    assert_eq!(value.limits[1].stored_permits, 8.0, "{value:?}");
    let call = other.call(Cost::each([0, 1])).await.unwrap();
    call.learn(&tokens_left(0));
    drop(call);
    let value = settled(&server, "paceline:v1:left_none_plain").await;
    assert_eq!(value.limits[1].stored_permits, 0.0, "{value:?}");
}

/// A snapshot reads the key at the rates in force, what it learned
/// included, whichever instance taught it: one that has made no call since
/// another learned the upstream's rate reads the same rate and burst as
/// that one. (It once read them at what its own last reply had said: the
/// configured rate and burst, its stored permits resynced at that rate.)
#[tokio::test]
async fn a_snapshot_reads_what_another_instance_taught_the_key() {
    let server = RedisServer::start();
    let limiter = || async {
        RateLimiter::builder()
            .limit(Limit::per(10.0, Duration::from_secs(10)))
            .redis(&patient_backend(server.client()).await, "taught")
            .build()
            .unwrap()
    };
    let (a, b) = (limiter().await, limiter().await);
    // The upstream: 1 per 4 s (the limiter runs at 0.97 of it).
    let mut quota = paceline::outbound::Quota::default();
    quota.limit = Some(1);
    quota.window = Some(Duration::from_secs(4));
    let call = a.call(1).await.unwrap();
    call.learn(&Feedback::new(200).with_quota(quota));
    drop(call);
    let mut con = server.connection();
    within(Duration::from_secs(5), || {
        Value::read(&mut con, "paceline:v1:taught").is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson lands");
    let (theirs, mine) = (b.snapshot().await.unwrap(), a.snapshot().await.unwrap());
    assert_eq!(mine.rate(), 0.97 / 4.0);
    assert_eq!(
        (theirs.rate(), theirs.burst()),
        (mine.rate(), mine.burst()),
        "b reads {theirs:?}, a {mine:?}"
    );
}

/// 10 per second under `name`, failing closed, on a backend of its own on
/// `client` (a direct one, or one through a proxy), on the real clock. Its
/// burst (10 s) keeps the key, and what it learned, in Redis for 10 s after
/// a pause (a key that reads as full expires, and forgets what it learned).
async fn ten_per_second(client: redis::Client, name: &str) -> RateLimiter<Redis> {
    RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(10))
        .redis(&patient_backend(client).await, name)
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap()
}

/// Ends `call` with a refusal asking for `retry_after`, at its estimate
/// (`finish`: the settle first, then the lesson), while `proxy` holds
/// every chunk it reads for 2 s: the settle's request sits in the proxy
/// for 2 s, its reply comes at once (the latency is lifted after 1 s,
/// long after the request was read and long before Redis replies), and
/// the lesson, sent after that reply, goes at once too. When the call
/// was answered.
async fn finish_behind_a_slow_settle(
    call: Call<'_>,
    proxy: &Proxy,
    retry_after: Duration,
) -> Instant {
    proxy.set_latency(Duration::from_secs(2));
    let answered = Instant::now();
    call.finish(&refused(retry_after), 1).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set_latency(Duration::ZERO);
    answered
}

/// `limiter`'s snapshots, until `landed` says one shows the lesson (within
/// 10 s): when it was asked for and when it came, since `answered`, and it.
async fn landed(
    limiter: &RateLimiter<Redis>,
    answered: Instant,
    landed: impl Fn(Duration, &Snapshot) -> bool,
) -> (Duration, Duration, Snapshot) {
    loop {
        let asked = answered.elapsed();
        let snapshot = limiter.snapshot().await.unwrap();
        let came = answered.elapsed();
        if landed(asked, &snapshot) {
            return (asked, came, snapshot);
        }
        assert!(
            came < Duration::from_secs(10),
            "the lesson never landed: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A refusal whose lesson waited behind its call's slow settle
/// (`finish` settles first, and a call's updates reach Redis in order)
/// pauses the key until its Retry-After, counted from the answer, not from
/// when the lesson reached Redis: it is aged by the time it waited, as a
/// lesson queued while Redis was down is. The settle's round trip takes
/// about 2 s (a proxy holds it), the upstream asks for 3 s: aged, the
/// pause ends 3 s after the answer, about 1 s after the lesson lands; not
/// aged, it would end 3 s after it lands, 5 s after the answer. Another
/// instance's snapshot reads the pause as its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_that_waited_behind_a_slow_settle_pauses_from_the_answer() {
    let retry_after = Duration::from_secs(3);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let one = ten_per_second(proxy.client(), "aged").await;
    let other = ten_per_second(server.client(), "aged").await;
    let call = one.call(1).await.unwrap();
    let answered = finish_behind_a_slow_settle(call, &proxy, retry_after).await;
    // The lesson lands when the rate falls to 0.7 of 10.
    let (asked, came, snapshot) = landed(&other, answered, |_, s| s.rate() < 10.0).await;
    assert_eq!(snapshot.rate(), 7.0);
    // It waited behind the settle (else this test shows nothing).
    assert!(
        asked >= Duration::from_millis(1_500),
        "landed {asked:?} after the answer"
    );
    // The pause ends between `asked + wait` and `came + wait` after the answer.
    let (earliest, latest) = (asked + snapshot.wait(), came + snapshot.wait());
    assert!(
        latest + Duration::from_millis(100) >= retry_after,
        "the pause ended {latest:?} after the answer, before its Retry-After"
    );
    assert!(
        earliest < retry_after + Duration::from_millis(750),
        "the pause ends {earliest:?} after the answer (landed {asked:?}..{came:?} after it, \
         its wait then {:?}): its Retry-After counted from when it landed, not from the answer",
        snapshot.wait()
    );
}

/// A refusal of a call that went before the key's last pause ended lowers
/// nothing (the upstream refused it for the load that caused that pause),
/// also when its lesson waited behind its slow settle: its call's age
/// counts that wait. One call is refused with a 0.5 s pause (the rate
/// falls to 0.7 of 10); another, which went with it, before that
/// refusal was learned, is refused too, its lesson 2 s behind its settle.
/// Aged, it went inside the first pause: 7/s stays. Not aged, it would
/// look 2 s younger, gone after that pause ended, and lower the rate again,
/// to 4.9/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_that_waited_behind_a_slow_settle_keeps_its_calls_age() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let one = ten_per_second(proxy.client(), "aged-age").await;
    let other = ten_per_second(server.client(), "aged-age").await;
    let early = one.call(1).await.unwrap();
    let late = one.call(1).await.unwrap();
    let start = Instant::now();
    early.learn(&refused(Duration::from_millis(500)));
    drop(early);
    landed(&other, start, |_, s| s.rate() < 10.0).await;
    let answered = finish_behind_a_slow_settle(late, &proxy, Duration::from_secs(3)).await;
    // The second lesson lands when its 3 s pause shows (the first one's
    // has ended by the time the latency is lifted).
    let (asked, _, snapshot) = landed(&other, answered, |asked, s| {
        asked >= Duration::from_secs(1) && s.wait() >= Duration::from_millis(500)
    })
    .await;
    assert!(
        asked >= Duration::from_millis(1_500),
        "landed {asked:?} after the answer"
    );
    assert_eq!(
        snapshot.rate(),
        7.0,
        "a refusal of a call that went inside the first pause lowered the rate again"
    );
}

/// A call dropped once its wait has passed, while it asks Redis whether a
/// pause came meanwhile (a round trip, made slow here by a proxy), ends at
/// its estimate as a dropped `Call` does: it is kept, and the key's log
/// empties. (It stayed open in the log, every request after it logged
/// behind it, until 128 more had come.)
#[tokio::test]
async fn a_call_dropped_while_it_asks_for_a_pause_is_kept_and_the_log_empties() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(0.1)
        .max_burst(Duration::ZERO)
        .redis(&patient_backend(proxy.client()).await, "asks")
        .fallback(Fallback::FailClosed)
        .clock(clock.clone())
        .build()
        .unwrap();
    // The first goes at once; the second waits ten seconds (on the fake
    // clock, at once), then asks whether a pause holds.
    drop(limiter.call(1).await.unwrap());
    settled(&server, "paceline:v1:asks").await;
    proxy.set_latency(Duration::from_millis(300));
    let before = clock.now();
    {
        let mut call = std::pin::pin!(limiter.call(1));
        // Polled until its wait has passed: the poll that slept on the
        // fake clock sent the question, whose answer is 600 ms away.
        while clock.now() == before {
            let tick = std::pin::pin!(tokio::time::sleep(Duration::from_millis(1)));
            if let futures::future::Either::Left(_) =
                futures::future::select(call.as_mut(), tick).await
            {
                panic!("the call returned before it could be dropped");
            }
        }
    }
    proxy.set_latency(Duration::ZERO);
    settled(&server, "paceline:v1:asks").await;
}

/// A keyed limiter whose fallback holds 2 keys: "old-0" and "old-1"
/// learned a refusal, then their Redis keys expired (what they learned is
/// gone there); "new" learns one now, and Redis dies. The fallback runs
/// "new" at what it learned, 10/s × 0.7, as a key that learned runs in
/// Redis: what keys learned was remembered for at most 2 keys and never
/// forgotten, so the two dead keys held the room and "new" ran at 10/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_dead_keys_learned_leaves_room_for_a_live_keys_lesson() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&patient_backend(server.client()).await, "forgetful")
        .fallback(Fallback::Local)
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let learn = |key: &'static str| {
        let (limiter, server) = (&limiter, &server);
        async move {
            let call = limiter.call(key, 1).await.unwrap();
            call.learn(&refused(Duration::ZERO));
            drop(call);
            settled(server, &limiter.redis_key(key)).await;
            // A grant's reply carries what the key learned.
            limiter.reserve(key, 1).await.unwrap();
        }
    };
    for key in ["old-0", "old-1"] {
        learn(key).await;
    }
    let mut con = server.connection();
    let gone = within(Duration::from_secs(5), || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("paceline:v1:forgetful:old*")
            .query(&mut con)
            .unwrap();
        keys.is_empty()
    })
    .await;
    assert!(gone.is_some(), "the old keys never expired");
    learn("new").await;
    server.kill();
    let first = limiter.reserve("new", 1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    let second = limiter.reserve("new", 1).await.unwrap();
    let interval = Duration::from_nanos((1e9_f64 / (10.0 * 0.7)).round() as u64);
    let apart = second.saturating_sub(first);
    assert!(
        apart.abs_diff(interval) <= Duration::from_micros(1),
        "{apart:?} apart, not {interval:?}"
    );
}
