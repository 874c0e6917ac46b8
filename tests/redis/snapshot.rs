//! Snapshots through Redis: one round trip reads a key's state on the
//! server's clock, under the rate in force; several limits read as the
//! binding one; a fallback answers while Redis is down; a value that is
//! not the limiter's is an error.

use std::time::{Duration, Instant};

use crate::support::poll::{RESPONSE_TIMEOUT, patient_backend};
use crate::support::redis_server::RedisServer;
use paceline::redis::{Fallback, RedisBackend};
use paceline::{Error, KeyedRateLimiter, Limit, RateLimiter};

const MS: Duration = Duration::from_millis(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reads_full_then_counts_down_to_its_wait() {
    let server = RedisServer::start();
    // Patient: a late reply must not send a call to the fallback.
    let backend = patient_backend(server.client()).await;
    // One a second: what the clock stores while the test runs is bounded
    // below by the time its calls take here.
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "snap")
        .permits_per_second(1.0)
        .max_burst(Duration::from_secs(5))
        .build()
        .unwrap();
    let key = "alice".to_owned();
    // A key never seen reads as full: five stored, six at once.
    let fresh = limiter.snapshot(&key).await.unwrap();
    assert_eq!(
        (fresh.remaining(), fresh.burst(), fresh.wait()),
        (6, 6, Duration::ZERO)
    );
    assert_eq!((fresh.rate(), fresh.stored()), (1.0, 5.0));
    // Reading wrote nothing.
    let mut con = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.redis_key(&key))
        .query(&mut con)
        .unwrap();
    assert!(!exists);
    // Permits the clock stores in `elapsed` (at 1/s), at most.
    let stored_in = |elapsed: Duration| (elapsed + MS).as_secs();
    // Four go: two remain, and what the clock stored meanwhile.
    let start = Instant::now();
    for _ in 0..4 {
        assert!(limiter.try_acquire(&key, 1, Duration::ZERO).await.unwrap());
    }
    let read = Instant::now();
    let after = limiter.snapshot(&key).await.unwrap();
    let most = 2 + stored_in(start.elapsed());
    assert!((2..=most).contains(&after.remaining()), "{after:?}");
    // Exactly as many as it said go at once, and what was stored since;
    // then one owes its interval.
    let remaining = after.remaining();
    let mut granted = 0;
    while limiter.try_acquire(&key, 1, Duration::ZERO).await.unwrap() {
        granted += 1;
    }
    let most = remaining + 1 + stored_in(read.elapsed());
    assert!(granted >= remaining && granted <= most, "{granted}");
    // Past the 5 stored and the 1 fresh at the first call, each permit
    // costs an interval from then: the next is due that long after it, and
    // the wait is that less the time since.
    let asked = Instant::now();
    let owed = limiter.snapshot(&key).await.unwrap();
    let since_first = start.elapsed();
    let due = Duration::from_secs(4 + granted - 5);
    assert!(
        owed.wait() <= Duration::from_secs(1) && owed.wait() + since_first + MS >= due,
        "{owed:?}, {since_first:?} after the first call"
    );
    // (Unless a stalled machine let the debt pass before the read.)
    if !owed.wait().is_zero() {
        assert_eq!(owed.remaining(), 0);
        assert_eq!(owed.wait_for(3), Some(owed.wait() + 2000 * MS));
        assert_eq!(owed.full_in(), owed.wait() + 5000 * MS);
        assert_eq!(owed.wait_for(7), None);
    }
    // The trait's answer and the wait agree, less the time between them
    // (Redis read its clock for each within the span from before the first
    // was asked to after the second answered).
    let wait = limiter.snapshot(&key).await.unwrap().wait();
    let between = asked.elapsed();
    assert!(
        wait <= owed.wait() && wait + between + MS >= owed.wait(),
        "{wait:?} then {:?}, {between:?} later",
        owed.wait()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_reads_as_the_next_reservation_takes_it() {
    let server = RedisServer::start();
    // Patient: a late reply must not send a call to the fallback.
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "snap")
        .permits_per_second(10.0)
        .max_burst(Duration::from_secs(1))
        .build()
        .unwrap();
    let key = "k".to_owned();
    // Stored 10 of 10, then 5 taken: 5 of 10 stored, in Redis at rate 10.
    for _ in 0..5 {
        assert!(limiter.try_acquire(&key, 1, Duration::ZERO).await.unwrap());
    }
    let start = Instant::now();
    let before = limiter.snapshot(&key).await.unwrap();
    // Doubled: the same fraction of twice the burst, and what the clock
    // stored between the reads (at most 20/s over the time they took here).
    limiter.set_rate(20.0).unwrap();
    let after = limiter.snapshot(&key).await.unwrap();
    let between = (start.elapsed() + MS).as_secs_f64();
    assert_eq!((after.rate(), after.burst()), (20.0, 21));
    let expected = before.stored() / 10.0 * 20.0;
    assert!(
        after.stored() >= expected && after.stored() <= expected + 20.0 * between,
        "{before:?} {after:?}, {between} s apart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_read_as_the_binding_one() {
    let server = RedisServer::start();
    // Patient: a late reply must not send a call to the fallback.
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "several-snap")
        .limit(Limit::per_second(100.0).burst(1))
        .limit(Limit::per(6.0, Duration::from_secs(60)).burst(3))
        .build()
        .unwrap();
    // Both full: the per-second limit lets one go at once (no burst), the
    // per-minute one three; one remains, and the per-second binds.
    let fresh = limiter.snapshot().await.unwrap();
    assert_eq!((fresh.remaining(), fresh.limit()), (1, 0));
    let start = Instant::now();
    for _ in 0..3 {
        limiter.reserve(1).await.unwrap();
    }
    // The per-minute limit now owes 10 s from the first call, less the
    // time since: it binds, and says so.
    let owed = limiter.snapshot().await.unwrap();
    let since_first = start.elapsed();
    assert_eq!((owed.remaining(), owed.limit()), (0, 1));
    assert!(
        owed.wait() <= 10_000 * MS && owed.wait() + since_first + MS >= 10_000 * MS,
        "{owed:?}, {since_first:?} after the first call"
    );
    assert_eq!(owed.rate(), 0.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_the_fallback_answers() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "down-snap")
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .fallback(Fallback::Local)
        .build()
        .unwrap();
    server.kill();
    // The fallback's own limiter: one goes, then the interval is owed.
    let _ = limiter.snapshot().await.unwrap();
    let start = Instant::now();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let owed = limiter.snapshot().await.unwrap();
    let since = start.elapsed();
    // One interval after the permit, less the time since (unless a stalled
    // machine let it pass before the read).
    assert!(
        owed.wait() <= 100 * MS && owed.wait() + since + MS >= 100 * MS,
        "{owed:?}, {since:?} after the permit"
    );
    assert!(owed.wait().is_zero() || owed.remaining() == 0, "{owed:?}");

    let closed = RedisBackend::builder(server.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .await
        .and_then(|backend| {
            RateLimiter::builder()
                .redis(&backend, "closed-snap")
                .permits_per_second(10.0)
                .fallback(Fallback::FailClosed)
                .build()
        });
    // Built while down (or refused): either way, no snapshot to read.
    if let Ok(closed) = closed {
        assert!(closed.snapshot().await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_not_the_limiters_is_an_error() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "snap")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    let key = "corrupt".to_owned();
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg(limiter.redis_key(&key))
        .arg("not a limiter")
        .query(&mut con)
        .unwrap();
    match limiter.snapshot(&key).await {
        Err(Error::Backend(error)) => {
            assert!(error.to_string().contains("does not recognise"), "{error}")
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// A reservation carries the state its own reply said the script left:
/// what the `RateLimit` headers of that very request report, however many
/// requests of other processes came after it, where a second read would
/// count them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_reads_the_state_its_own_call_left() {
    let server = RedisServer::start();
    let build = |backend: &RedisBackend| {
        RateLimiter::builder()
            // One a minute: nothing comes back while the test runs.
            .limit(Limit::per(1.0, Duration::from_secs(60)).burst(5))
            .redis(backend, "own-reply")
            .build()
            .unwrap()
    };
    // Two processes on one key.
    let (one, other) = (
        build(&patient_backend(server.client()).await),
        build(&patient_backend(server.client()).await),
    );
    let first = one.reservation(1).await.unwrap();
    let mine = first.snapshot().expect("a Redis reply's state");
    assert_eq!((mine.remaining(), mine.burst()), (4, 5));
    // Another process takes three more.
    for _ in 0..3 {
        other.reservation(1).await.unwrap().keep();
    }
    // The first request's own state is unchanged; a read now sees the rest.
    assert_eq!(first.snapshot().unwrap().remaining(), 4);
    assert_eq!(one.snapshot().await.unwrap().remaining(), 1);
    let last = one.reservation(1).await.unwrap();
    assert_eq!(last.snapshot().unwrap().remaining(), 0);
    // A refused try has no reservation; one served by a limiter in this
    // process carries no reply.
    let local = RateLimiter::bursty(1.0).unwrap();
    assert!(local.reservation(1).unwrap().snapshot().is_none());
}

/// A reservation on a key that learned a lower rate reads its own state
/// at that rate, as a read of the key does: every reservation, not only
/// one whose reply held the whole value (the second read the configured
/// 100 a second, while the key ran at 9.7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_on_a_key_that_learned_reads_the_learned_rate() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .limit(Limit::per(100.0, Duration::from_secs(1)))
        .redis(&patient_backend(server.client()).await, "learned-own")
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    let call = limiter.call(1).await.unwrap();
    let feedback = paceline::outbound::Feedback::from_headers(
        200,
        [("RateLimit-Policy", &b"10;w=1"[..])],
        std::time::SystemTime::now(),
    );
    call.learn(&feedback);
    drop(call);
    let mut learned = 0.0;
    for _ in 0..400 {
        learned = limiter.snapshot().await.unwrap().rate();
        if learned < 100.0 {
            break;
        }
        tokio::time::sleep(5 * MS).await;
    }
    assert!(learned < 100.0, "the key never learned: {learned}");
    // A debt of 10 s keeps the key (which forgets what it learned once it
    // expires, when it reads as full).
    limiter.reserve(100).await.unwrap();
    for i in 0..3 {
        let reservation = limiter.reservation(1).await.unwrap();
        let own = reservation.snapshot().expect("a Redis reply's state");
        reservation.keep();
        assert_eq!(own.rate(), learned, "reservation {i}");
    }
}
