//! The moments around a switch to the fallback and back: each permit
//! granted is counted once in the schedule every process sees. Real
//! faults: a killed server, a stopped one (SIGSTOP, data kept).

use std::time::{Duration, Instant};

use crate::support::poll::{backend_builder, patient_backend};

use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{KeyedRateLimiter, RateLimiter};

const MS: Duration = Duration::from_millis(1);

/// 1 permit/s per key, with `burst` of stored permits.
fn keyed(backend: &RedisBackend, name: &str, burst: Duration) -> KeyedRateLimiter<String, Redis> {
    KeyedRateLimiter::<String>::builder()
        .redis(backend, name)
        .permits_per_second(1.0)
        .max_burst(burst)
        .local_fraction(1.0)
        .build()
        .unwrap()
}

/// 1 permit/s, no burst; the fallback paces at `local_fraction` of it.
fn single(backend: &RedisBackend, name: &str, local_fraction: f64) -> RateLimiter<Redis> {
    single_at(backend, name, 1.0, local_fraction)
}

/// `rate` permits/s, no burst; the fallback paces at `local_fraction` of
/// it.
fn single_at(
    backend: &RedisBackend,
    name: &str,
    rate: f64,
    local_fraction: f64,
) -> RateLimiter<Redis> {
    RateLimiter::builder()
        .redis(backend, name)
        .permits_per_second(rate)
        .max_burst(Duration::ZERO)
        .local_fraction(local_fraction)
        .build()
        .unwrap()
}

/// A backend whose response timeout (1 s) a loaded machine does not
/// reach, for a test that stalls the server: a stalled call still fails
/// within a second, while one that merely runs late is not served by the
/// fallback (a setup call would then be counted at the fallback's rate) and
/// a carry-back's resume is not sent twice (which errs towards limiting).
async fn stall_backend(client: redis::Client) -> RedisBackend {
    backend_builder(client)
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap()
}

/// When a debt in Redis ends, as far as this process can tell: the debt
/// read, from when the read was sent and from when its reply came.
#[derive(Clone, Copy, Debug)]
struct Ends {
    earliest: Instant,
    latest: Instant,
}

impl Ends {
    /// Read from Redis by `reader` (another process, on a patient backend).
    async fn read(reader: &RateLimiter<Redis>) -> Ends {
        let sent = Instant::now();
        let owed = reader.snapshot().await.unwrap().wait();
        Ends {
            earliest: sent + owed,
            latest: Instant::now() + owed,
        }
    }

    /// The same debt, `more` later.
    fn plus(self, more: Duration) -> Ends {
        Ends {
            earliest: self.earliest + more,
            latest: self.latest + more,
        }
    }
}

async fn recovered(what: impl Fn() -> bool) {
    within(Duration::from_secs(10), what)
        .await
        .expect("recovers once the server is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_carried_back_in_the_background_get_no_burst_meanwhile() {
    const DEBT: Duration = Duration::from_secs(600);
    let mut server = RedisServer::start();
    // Patient: a carry-back or a call that merely runs late on a loaded
    // machine must not send the limiter back to its fallback.
    let backend = patient_backend(server.client()).await;
    let limiter = keyed(&backend, "race", Duration::from_secs(5));
    limiter.reserve("first", 1).await.unwrap();
    server.kill();
    let keys: Vec<String> = (0..1_000).map(|i| format!("user{i}")).collect();
    // Six hundred permits each from the fallback: ten minutes of debt,
    // which outlasts the checks below however slowly a loaded machine runs
    // them (twenty seconds could run out, and a key then rightly go).
    let lent = Instant::now();
    for key in &keys {
        assert_eq!(limiter.reserve(key, 600).await.unwrap(), Duration::ZERO);
    }
    assert_eq!(limiter.stats().keys, 1_000);
    server.restart();
    recovered(|| !limiter.stats().degraded).await;
    // At once, while the carry-back runs: no key reads as idle.
    let mut granted = Vec::new();
    for key in &keys {
        if limiter
            .try_reserve(key, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
        {
            granted.push(key.clone());
        }
    }
    assert!(
        granted.is_empty(),
        "{} keys granted: {:?}",
        granted.len(),
        &granted[..granted.len().min(5)]
    );
    let carried = within(Duration::from_secs(5), || limiter.stats().keys == 0)
        .await
        .expect("every key goes back");
    eprintln!("1 000 keys carried back within {carried:?} of the sweep");
    // Each key owes Redis what the fallback granted it, less the time
    // since (Redis's clock moves no more).
    for key in keys.iter().step_by(97) {
        let wait = limiter.snapshot(key).await.unwrap().wait();
        let since = lent.elapsed();
        assert!(
            wait <= DEBT && wait + since + MS >= DEBT,
            "{key} owes {wait:?}, {since:?} after the fallback's grants"
        );
    }
}

/// The first process stalls with the server (a timeout a loaded machine
/// does not reach: a resume that merely ran late would be sent again); the
/// second only reads, on a patient backend. Ten seconds a permit, so that
/// the debts outlast the test; bounds come from measured time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_limiter_never_called_again_still_carries_its_debt_back() {
    const PERMIT: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    let (one, two) = (
        stall_backend(server.client()).await,
        patient_backend(server.client()).await,
    );
    let (first, second) = (
        single_at(&one, "quiet-after", 0.1, 1.0),
        single_at(&two, "quiet-after", 0.1, 1.0),
    );
    let sent = Instant::now();
    assert_eq!(first.reserve(1).await.unwrap(), Duration::ZERO);
    let reported = Instant::now();
    server.stop();
    // Ten permits from the fallback of the first process only, after the
    // one Redis reported (noted once its reply came).
    let asked = Instant::now();
    let wait = first.reserve(10).await.unwrap();
    let answered = Instant::now();
    assert!(first.stats().degraded);
    assert!(
        answered + wait >= sent + PERMIT && asked + wait <= reported + PERMIT,
        "the fallback waits {wait:?} from between {:?} and {:?} after the first call; \
         Redis's debt ends between {PERMIT:?} and {:?}",
        asked - sent,
        answered - sent,
        reported - sent + PERMIT,
    );
    server.cont();
    let back = Instant::now();
    recovered(|| !first.stats().degraded).await;
    // The first process makes no further call; once its background
    // carry-back has run, the second sees its debt.
    recovered(|| first.stats().keys == 0).await;
    eprintln!(
        "the debt reached Redis {:?} after the server came back",
        back.elapsed()
    );
    // Eleven permits from Redis's first grant; at most the time the first
    // reply took to be noted later (the carry-back counts from the debt as
    // noted), never ten permits more.
    let read = Instant::now();
    let wait = second.snapshot().await.unwrap().wait();
    let (earliest, latest) = (read + wait, Instant::now() + wait);
    let lag = reported - sent;
    assert!(
        latest >= sent + 11 * PERMIT && earliest <= reported + 11 * PERMIT + lag,
        "the second process's debt ends between {:?} and {:?} after the first call, \
         expected between {:?} and {:?}",
        earliest - sent,
        latest - sent,
        11 * PERMIT,
        reported - sent + 11 * PERMIT + lag,
    );
    assert_eq!(second.try_reserve(1, Duration::ZERO).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_debts_beyond_max_local_keys_still_open_the_fallback_late() {
    let mut server = RedisServer::start();
    // Patient: the killed server's calls fail at once, and the debts must
    // reach Redis first.
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "cap")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(2)
        .build()
        .unwrap();
    for key in ["a", "b", "c"] {
        assert_eq!(limiter.reserve(key, 10).await.unwrap(), Duration::ZERO);
    }
    server.kill();
    for key in ["a", "b", "c"] {
        assert_eq!(
            limiter.try_reserve(key, 1, Duration::ZERO).await.unwrap(),
            None,
            "{key} owes ten seconds"
        );
    }
    assert!(limiter.stats().degraded);
}

/// On a patient backend: the server is killed, so its calls fail at once
/// on the closed connection, while a call that merely runs late before is
/// not served by the fallback (which would then hold the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_during_an_outage_reports_the_debt_redis_reported() {
    let mut server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = keyed(&backend, "query", Duration::ZERO);
    let sent = Instant::now();
    assert_eq!(limiter.reserve("owes", 10).await.unwrap(), Duration::ZERO);
    let reported = Instant::now();
    server.kill();
    // The first call finds Redis down; the next read the fallback.
    let _ = limiter.snapshot("owes").await.unwrap().wait();
    let asked = Instant::now();
    let wait = limiter.snapshot("owes").await.unwrap().wait();
    let answered = Instant::now();
    assert!(limiter.stats().degraded);
    // Ten seconds from when Redis granted them, noted once the reply came:
    // between the reservation's call and its reply, read between the
    // snapshot's call and its answer.
    let ends = (
        sent + Duration::from_secs(10),
        reported + Duration::from_secs(10),
    );
    assert!(
        answered + wait >= ends.0 && asked + wait <= ends.1,
        "the snapshot says {wait:?} from between {:?} and {:?} after the reservation's \
         call; the debt ends between {:?} and {:?}",
        asked - sent,
        answered - sent,
        ends.0 - sent,
        ends.1 - sent,
    );
    assert_eq!(limiter.stats().keys, 0, "a query opens nothing");
    assert_eq!(
        limiter
            .try_reserve("owes", 1, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
}

/// Each outage's permit is counted once in Redis, the first outage's debt
/// not again in the second. Bounds come from measured time: a debt's end is
/// read by another process (between when the read went and when its reply
/// came), and the fallback opens at the end Redis last reported, noted
/// locally up to the time its call took later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_outage_does_not_count_the_first_ones_debt_again() {
    // Ten seconds a permit; the fallback paces at half the rate: a permit
    // it grants is twenty seconds of its own schedule and ten of the shared
    // one. The debts outlast the test however slowly a loaded machine runs
    // it, and a permit counted twice is ten seconds off, more than any
    // call takes.
    const PERMIT: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    let limiter = single_at(&stall_backend(server.client()).await, "twice", 0.1, 0.5);
    let reader = single_at(&patient_backend(server.client()).await, "twice", 0.1, 0.5);
    // Two permits of debt in Redis. (Should this call outrun its timeout,
    // the fallback serves it and carries it back: what Redis then holds is
    // read below.)
    let set = Instant::now();
    assert_eq!(limiter.reserve(2).await.unwrap(), Duration::ZERO);
    recovered(|| !limiter.stats().degraded && limiter.stats().keys == 0).await;
    // The limiter noted the debt from a reply to a call sent since `set`:
    // at most `lag` after Redis reported it.
    let mut lag = set.elapsed();
    let mut ends = Ends::read(&reader).await;
    for outage in 1..=2 {
        server.stop();
        // One more permit from the fallback: it waits for the debt Redis
        // last reported (noted at most `lag` late), and adds a permit.
        let asked = Instant::now();
        let wait = limiter.reserve(1).await.unwrap();
        let answered = Instant::now();
        assert!(limiter.stats().degraded);
        assert!(
            asked + wait <= ends.latest + lag && answered + wait >= ends.earliest,
            "outage {outage}: waits {wait:?} from between {:?} and {:?} after the \
             start; the debt ends between {:?} and {:?} (noted up to {lag:?} late)",
            asked - set,
            answered - set,
            ends.earliest - set,
            ends.latest - set,
        );
        let back = Instant::now();
        server.cont();
        // Once the key is carried back, Redis holds its debt plus one
        // permit, and at most the note's lag more (the carry-back counts
        // from the debt as noted), never another permit.
        recovered(|| !limiter.stats().degraded && limiter.stats().keys == 0).await;
        let carried = Instant::now();
        let after = Ends::read(&reader).await;
        let expected = ends.plus(PERMIT);
        assert!(
            after.latest >= expected.earliest && after.earliest <= expected.latest + lag,
            "after outage {outage}: the debt ends between {:?} and {:?} after the start, \
             expected between {:?} and {:?} (plus up to {lag:?})",
            after.earliest - set,
            after.latest - set,
            expected.earliest - set,
            expected.latest - set,
        );
        ends = after;
        // The resume's reply, which the next outage's floor comes from.
        lag = carried - back;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_drops_the_permits_stored_during_the_outage() {
    let server = RedisServer::start();
    // A response timeout a loaded machine does not reach: a late reply
    // would be served by failing open, and let a second try through.
    let backend = backend_builder(server.client())
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    // Ten seconds a permit (five stored at most): the checks below end
    // before another permit is due, however slowly a loaded machine runs
    // them (at one a second, ten calls took over a second and two went).
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "open")
        .permits_per_second(0.1)
        .max_burst(Duration::from_secs(50))
        .fallback(Fallback::FailOpen)
        .build()
        .unwrap();
    assert_eq!(limiter.reserve("k", 1).await.unwrap(), Duration::ZERO);
    server.stop();
    // Everything goes while Redis is down.
    for _ in 0..10 {
        assert_eq!(limiter.reserve("k", 1).await.unwrap(), Duration::ZERO);
    }
    server.cont();
    // Once the key is carried back: a call that waited out the carry-back
    // would be served by failing open.
    recovered(|| !limiter.stats().degraded && limiter.stats().keys == 0).await;
    let mut granted = 0;
    for _ in 0..10 {
        if limiter
            .try_reserve("k", 1, Duration::ZERO)
            .await
            .unwrap()
            .is_some()
        {
            granted += 1;
        }
    }
    assert!(granted <= 1, "{granted} granted at once after the outage");
}

/// Callers of a key whose debt is on its way back to Redis wait for it at
/// most the response timeout in all, the bound of every call: a caller
/// that would wait longer is served by the fallback, which holds the key
/// until its debt is in Redis. Each round trip here takes about 56% of the
/// response timeout (a proxy delays each way), so a caller that waited for
/// the carry-back and then made a round trip of its own would take longer.
/// The timeout is 2.5 s, so that what is left of it (1.1 s) covers a round
/// trip that a loaded machine delays: one that outran it would rightly mark
/// Redis down (with 400 ms left, then 800 ms, a loaded machine outran it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_a_key_being_carried_back_return_within_the_response_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(2_500);
    let server = RedisServer::start();
    let proxy = crate::support::proxy::Proxy::in_front_of(&server);
    let backend = RedisBackend::builder(proxy.client())
        .response_timeout(TIMEOUT)
        .probe_interval(100 * MS)
        .build()
        .await
        .unwrap();
    let limiter = std::sync::Arc::new(single(&backend, "slow-carry", 1.0));
    assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
    server.stop();
    // Its connection reset, the call fails at once instead of after the
    // timeout: served by the fallback, which now holds the key and its
    // debt (the server stays stopped until the callers start).
    proxy.reset_all();
    limiter.reserve(1).await.unwrap();
    assert!(limiter.stats().degraded);
    proxy.set_latency(700 * MS);
    server.cont();
    // Callers all along the recovery and the key's carry-back. Each also
    // measures how late its pauses end: a starved process returns that
    // much later from any wait, a call's included.
    let started = Instant::now();
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let limiter = std::sync::Arc::clone(&limiter);
            tokio::spawn(async move {
                let (mut slowest, mut late) = (Duration::ZERO, Duration::ZERO);
                while started.elapsed() < Duration::from_secs(4) {
                    let call = Instant::now();
                    limiter.try_reserve(1, Duration::ZERO).await.unwrap();
                    slowest = slowest.max(call.elapsed());
                    let pause = Instant::now();
                    tokio::time::sleep(20 * MS).await;
                    late = late.max(pause.elapsed().saturating_sub(20 * MS));
                }
                (slowest, late)
            })
        })
        .collect();
    let (mut slowest, mut late) = (Duration::ZERO, Duration::ZERO);
    for caller in callers {
        let (caller_slowest, caller_late) = caller.await.unwrap();
        slowest = slowest.max(caller_slowest);
        late = late.max(caller_late);
    }
    eprintln!("the slowest call took {slowest:?}; a pause ended up to {late:?} late");
    // On a quiet machine pauses end on time, and the bound is the timeout
    // and 150 ms; a caller that waited for the carry-back and then made a
    // round trip of its own would add that round trip (56% of the timeout)
    // to its wait.
    assert!(
        slowest <= TIMEOUT + 150 * MS + late,
        "a call took {slowest:?}, past the response timeout of {TIMEOUT:?} \
         (pauses ended up to {late:?} late)"
    );
    assert!(!limiter.stats().degraded, "{:?}", limiter.stats());
    // The key goes back once its callers stop: with round trips of more
    // than half the response timeout, a caller that waited for a carry-back
    // has too little time left for its own round trip, and the fallback
    // serves it (holding the key again) while calls keep coming.
    let back = within(Duration::from_secs(6), || limiter.stats().keys == 0).await;
    assert!(
        back.is_some(),
        "the key never went back: {:?}",
        limiter.stats()
    );
}

/// After an outage in which the fallback dropped a key with a debt (more
/// keys than it holds), the first calls of another key are charged up to
/// that ticket once, however many come at once (each round trip takes 40
/// ms here, through a proxy): the first charges it, the others wait for it
/// and go to Redis after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_charged_the_dropped_floor_once_by_its_first_callers() {
    let server = RedisServer::start();
    let proxy = crate::support::proxy::Proxy::in_front_of(&server);
    let limiter = |backend: &RedisBackend| {
        std::sync::Arc::new(
            KeyedRateLimiter::<String>::builder()
                .redis(backend, "floor")
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .max_keys(2)
                .build()
                .unwrap(),
        )
    };
    // Time enough for every caller to wait for the first's round trip and
    // make its own, and for the first's charge on a loaded machine (2 s: a
    // charge whose reply outran 1 s once was charged again from the
    // fallback, which errs towards limiting: ten seconds more).
    let backend = RedisBackend::builder(proxy.client())
        .response_timeout(Duration::from_secs(2))
        .probe_interval(100 * MS)
        .build()
        .await
        .unwrap();
    let first = limiter(&backend);
    assert_eq!(first.reserve("a", 1).await.unwrap(), Duration::ZERO);
    server.stop();
    // Three keys in the fallback, which holds two: the one with the least
    // debt (ten seconds from when the fallback served it) is dropped.
    let dropped_sent = Instant::now();
    for (key, permits) in [("b", 10), ("c", 20), ("d", 30)] {
        first.reserve(key, permits).await.unwrap();
    }
    assert!(first.stats().degraded);
    server.cont();
    recovered(|| !first.stats().degraded).await;
    proxy.set_latency(20 * MS);
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let first = std::sync::Arc::clone(&first);
            tokio::spawn(async move { first.reserve("x", 1).await.unwrap() })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    // And once only for later calls (the keys carried back fill what the
    // fallback keeps of Redis's debts: this one is kept by its bucket).
    first.reserve("x", 1).await.unwrap();
    // Whatever the fallback served (a call that ran past its timeout) is
    // in Redis too.
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    // Read by another process, on a patient backend (a read that merely
    // runs late would otherwise be answered by its fallback, which knows
    // no debt): up to the dropped ticket, then the nine permits, charged
    // once each; once per caller, it would owe over 80 s. Redis's clock
    // only advances: the debt left is what was charged less the time since
    // the dropped key's call.
    let other = patient_backend(server.client()).await;
    let owed = limiter(&other).snapshot("x").await.unwrap().wait();
    let since = dropped_sent.elapsed();
    assert!(
        owed + since >= Duration::from_secs(19) && owed <= Duration::from_secs(20),
        "the key owes {owed:?}, {since:?} after the dropped key's call"
    );
}

/// A keyed limiter `name` at 1/s, no burst, half the rate while Redis is
/// down, whose fallback holds two keys.
fn at_half(backend: &RedisBackend, name: &str) -> std::sync::Arc<KeyedRateLimiter<String, Redis>> {
    std::sync::Arc::new(
        KeyedRateLimiter::<String>::builder()
            .redis(backend, name)
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .local_fraction(0.5)
            .max_keys(2)
            .build()
            .unwrap(),
    )
}

/// A backend on `server` that waits 1 s for Redis and probes every 100 ms.
async fn one_second_backend(server: &RedisServer) -> RedisBackend {
    backend_builder(server.client())
        .response_timeout(Duration::from_secs(1))
        .probe_interval(100 * MS)
        .build()
        .await
        .unwrap()
}

/// A limiter `name` at half the rate while Redis is down (`at_half`), on
/// a backend of its own, whose fallback served b ten permits (its ticket
/// 20 s on, at 0.5/s), then c and d `others` permits each, and so dropped
/// b, in an outage the server is left in (stopped); and when b's call was
/// made.
async fn with_b_dropped(
    server: &RedisServer,
    name: &str,
    others: [u32; 2],
) -> (std::sync::Arc<KeyedRateLimiter<String, Redis>>, Instant) {
    let first = at_half(&one_second_backend(server).await, name);
    assert_eq!(first.reserve("a", 1).await.unwrap(), Duration::ZERO);
    server.stop();
    let dropped_sent = Instant::now();
    for (key, permits) in [("b", 10), ("c", others[0]), ("d", others[1])] {
        first.reserve(key, permits).await.unwrap();
    }
    (first, dropped_sent)
}

/// The same at a share of the rate (0.5): the dropped key's ticket is at
/// the fallback's half rate, the charge at the shared rate, so the debt
/// Redis reports after it ends before the ticket; the key is still charged
/// once (four calls: one charge of about half the ticket's span, then four
/// permits), not again at every call until its debt reaches the ticket.
/// And what the fallback dropped is counted in the limiter's stats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_share_the_dropped_floor_is_charged_once_and_counted() {
    let server = RedisServer::start();
    let (first, dropped_sent) = with_b_dropped(&server, "floor-share", [20, 30]).await;
    let stats = first.stats();
    assert!(stats.degraded, "{stats:?}");
    assert!(
        stats.dropped_unfinished >= 1,
        "b was dropped with its debt: {stats:?}"
    );
    server.cont();
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    let mut waits = Vec::new();
    for _ in 0..4 {
        waits.push(first.reserve("x", 1).await.unwrap());
    }
    let other = patient_backend(server.client()).await;
    let owed = at_half(&other, "floor-share")
        .snapshot("x")
        .await
        .unwrap()
        .wait();
    let since = dropped_sent.elapsed();
    // One charge of half of what is left of b's 20 s at the first call
    // (about 9 to 10 s, ending about 10 s after b's call, later by half of
    // any delay before it), then 4 s: about 14 s after b's call. Charged
    // at every call it would come to about 20.5 s.
    assert!(
        owed + since >= Duration::from_secs(13) && owed + since <= Duration::from_secs(17),
        "x owes {owed:?}, {since:?} after the dropped key's call (waits {waits:?})"
    );
}

/// A caller that waited for another's charge of the dropped floor looks at
/// its route again: when the charge found Redis stalled (past its response
/// timeout) and its caller was served by the fallback, which opened the
/// key there, the waiter goes there too, and the key is carried back
/// whole. It used to go straight to Redis, ahead of the carry-back, which
/// then found Redis's debt past the fallback's ticket and carried nothing:
/// the fallback's permit was counted nowhere (8 permits at 1/s within 6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_waited_for_a_failed_floor_charge_follows_it_to_the_fallback() {
    let server = RedisServer::start();
    let (first, _) = with_b_dropped(&server, "floor-waiter", [10, 10]).await;
    server.cont();
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    // c's and d's debts in Redis (about 9.5 s) end; b's floor is ahead.
    tokio::time::sleep(Duration::from_secs(10)).await;
    // x's first call charges the floor in a stalled Redis; a second waits.
    server.stop();
    let at = |first: std::sync::Arc<_>, permits| {
        tokio::spawn(async move {
            let limiter: &KeyedRateLimiter<String, paceline::redis::Redis> = &first;
            let wait = limiter.reserve("x", permits).await.unwrap();
            Instant::now() + wait
        })
    };
    let charger = at(std::sync::Arc::clone(&first), 1);
    tokio::time::sleep(400 * MS).await;
    let waiter = at(std::sync::Arc::clone(&first), 6);
    let charger_at = charger.await.unwrap();
    server.cont();
    let waiter_at = waiter.await.unwrap();
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    let other = at_half(&patient_backend(server.client()).await, "floor-waiter");
    let wait = other.reserve("x", 1).await.unwrap();
    let next_at = Instant::now() + wait;
    // 1 permit/s, no burst: 8 permits (1 + 6 + 1) span at least 7 s.
    let span = next_at - charger_at.min(waiter_at);
    assert!(span >= 6500 * MS, "8 permits of x granted within {span:?}");
}

/// A grant Redis made after its caller was dropped (a late grant: it stays
/// charged) is heard of before the key next opens in the fallback: the key
/// opens after it, and the carry-back adds all the fallback granted. It used
/// to subtract the late grant's span from the fallback's debt as if the
/// fallback had served that caller too: at a share below 1 the carry then
/// lost the fallback's permits (5 permits at 1/s, and another process's
/// next permit at the same moment as their first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_heard_of_before_the_key_opens_is_not_taken_off_its_carry() {
    let server = RedisServer::start();
    let first = at_half(&one_second_backend(&server).await, "late-first");
    assert_eq!(first.reserve("a", 1).await.unwrap(), Duration::ZERO);
    // A stall shorter than the response timeout: x's caller gives up after
    // 200 ms, and Redis grants its 20 permits once it is back.
    server.stop();
    assert!(
        tokio::time::timeout(200 * MS, first.reserve("x", 20))
            .await
            .is_err()
    );
    tokio::time::sleep(300 * MS).await;
    server.cont();
    tokio::time::sleep(300 * MS).await;
    assert!(!first.stats().degraded);
    // An outage (y's call finds it), in which the fallback serves x.
    server.stop();
    first.reserve("y", 1).await.unwrap();
    assert!(first.stats().degraded);
    let local_at = Instant::now() + first.reserve("x", 5).await.unwrap();
    server.cont();
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    let other = at_half(&patient_backend(server.client()).await, "late-first");
    let next_at = Instant::now() + other.reserve("x", 1).await.unwrap();
    // 1 permit/s, no burst: the fallback's 5 permits (at 0.5/s locally)
    // take 5 s of the shared schedule; the next permit comes after them.
    assert!(
        next_at >= local_at + 4500 * MS,
        "the next permit {:?} after the first of the fallback's 5",
        next_at.saturating_duration_since(local_at)
    );
}

/// A key's first caller after an outage in which the fallback dropped keys
/// with their debts waits for its key's floor charge, and only for that:
/// the end of another key's charge or carry-back does not send it to the
/// fallback while Redis is up. Each round trip takes two seconds here (a
/// proxy delays each way); the charges of 24 other keys go out just before
/// the test key's (their callers give up at once: the charges run on), so
/// their replies come back one by one, 20 ms apart, while that key's
/// caller waits, each waking every caller waiting for a key's mark. That
/// caller used to count each wake-up as a look at its route, and after
/// eight was routed to the fallback while its key was still being charged
/// and Redis was up (the fallback counted the call; had the key's charge
/// just ended, it would have served it and held the key). Now its call
/// goes to Redis once its key is charged, and the fallback counts no call
/// of it. The fallback holds 32 keys, so that every charge is remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_waiting_for_its_keys_floor_charge_is_not_sent_to_the_fallback_by_other_keys() {
    floor_charge_behind_others(32).await;
}

/// The same with a fallback that holds two keys, and so remembers two keys
/// charged: the test key's charge is one too many to remember. Its caller,
/// whose charge it is, goes to Redis once it has ended, charged once (it
/// used to look again, find its key not among those charged, charge it
/// again and again, a round trip each, until its time was up, and go to the
/// fallback). (A later call of such a key is charged again: erring
/// towards limiting, as documented.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_keys_charge_is_not_remembered_goes_to_redis_charged_once() {
    floor_charge_behind_others(2).await;
}

/// The test key's first call after an outage, behind 24 other keys' floor
/// charges, each round trip two seconds, on a limiter whose fallback holds
/// `max_keys`.
async fn floor_charge_behind_others(max_keys: usize) {
    use futures::FutureExt;
    // A round trip of two seconds: the others' charges, sent 20 ms apart
    // (480 ms on a quiet machine), have all gone out, and x's call has
    // begun, before the first of their replies is back, however late a
    // loaded machine runs the loop (x's bucket among 64 may hold another
    // key's charge once its reply is back, and x then counts as charged:
    // with a round trip of one second, a loaded machine's loop once took
    // that long, and x, charged nothing, waited 0).
    const ONE_WAY: Duration = Duration::from_secs(1);
    const OTHERS: usize = 24;
    let mut server = RedisServer::start();
    let proxy = crate::support::proxy::Proxy::in_front_of(&server);
    // A response timeout that neither the charge nor the call after it (a
    // second each) reaches on a loaded machine: the test key's call has
    // all the time it needs to wait for its charge and go to Redis.
    let backend = RedisBackend::builder(proxy.client())
        .response_timeout(Duration::from_secs(10))
        .probe_interval(100 * MS)
        .build()
        .await
        .unwrap();
    let limiter = std::sync::Arc::new(
        KeyedRateLimiter::<String>::builder()
            .redis(&backend, "route-passes")
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .local_fraction(0.5)
            .max_keys(max_keys)
            .build()
            .unwrap(),
    );
    assert_eq!(limiter.reserve("a", 1).await.unwrap(), Duration::ZERO);
    server.kill();
    // More keys than the fallback holds, each with a ticket 200 s on (100
    // permits at 0.5/s), beyond anything this test waits: some are dropped
    // with their debts.
    for i in 0..40 {
        limiter
            .reserve(format!("held{i}").as_str(), 100)
            .await
            .unwrap();
    }
    let stats = limiter.stats();
    assert!(stats.degraded && stats.dropped_unfinished >= 1, "{stats:?}");
    server.restart();
    recovered(|| !limiter.stats().degraded && limiter.stats().keys == 0).await;
    proxy.set_latency(ONE_WAY);
    // The other keys' first calls: each charges its key's floor in the
    // background, its round trip sent; its caller gives up.
    for i in 0..OTHERS {
        let key = format!("other{i}");
        assert!(limiter.reserve(key.as_str(), 1).now_or_never().is_none());
        tokio::time::sleep(20 * MS).await;
    }
    // x's first call: its charge goes out behind the others', whose
    // replies come first while its caller waits.
    let fallback_calls = limiter.stats().fallback_calls;
    let started = Instant::now();
    let wait = {
        let limiter = std::sync::Arc::clone(&limiter);
        tokio::spawn(async move { limiter.reserve("x", 1).await })
    }
    .await
    .unwrap()
    .unwrap();
    let took = started.elapsed();
    proxy.set_latency(Duration::ZERO);
    let stats = limiter.stats();
    eprintln!("x's first call took {took:?} and waits {wait:?}");
    assert!(
        stats.fallback_calls == fallback_calls && !stats.degraded && stats.keys == 0,
        "Redis up all along, yet x's first call went to the fallback \
         ({} fallback calls; it took {took:?}): {stats:?}",
        stats.fallback_calls - fallback_calls
    );
    // The call was charged (about half of the latest dropped ticket), as
    // the test needs, and once: as long as another key charged once. (The
    // longest of the others' waits: a key is charged less when its bucket
    // holds a debt Redis reported for another key, as the keys that went
    // back at the recovery may have, and which keys share one depends on a
    // hash seed drawn at random.)
    let mut once = Duration::ZERO;
    for i in 0..OTHERS {
        let key = format!("other{i}");
        once = once.max(limiter.snapshot(key.as_str()).await.unwrap().wait());
    }
    assert!(
        wait >= Duration::from_secs(30) && wait.as_secs_f64() < 1.5 * once.as_secs_f64(),
        "x waits {wait:?}, a key charged once {once:?}"
    );
}

/// A grant Redis makes late (its caller, served by the fallback, stopped
/// waiting) behind another process's debt this process never heard of:
/// the carry-back takes off what the fallback granted only that grant's
/// own charge, not the whole debt Redis reported with it. It used to take
/// off the span from the debt the key opened at to the end of that debt,
/// the other process's reservations included: the fallback's 50 permits
/// (5 s at 10/s) were never carried back, and the next permit through Redis
/// came 0.1 s after the other process's 80, not 5 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_behind_another_process_debt_does_not_hide_the_fallbacks_grants() {
    let server = RedisServer::start();
    let backend = backend_builder(server.client())
        .response_timeout(300 * MS)
        .probe_interval(100 * MS)
        .build()
        .await
        .unwrap();
    let first = single_at(&backend, "late-behind", 10.0, 1.0);
    let other = single_at(
        &patient_backend(server.client()).await,
        "late-behind",
        10.0,
        1.0,
    );
    // The connection warm; the debt this process heard of passes.
    assert_eq!(first.reserve(1).await.unwrap(), Duration::ZERO);
    tokio::time::sleep(300 * MS).await;
    // Another process's 8 s of debt, which this one never hears of.
    let before_other = Instant::now();
    assert_eq!(other.reserve(80).await.unwrap(), Duration::ZERO);
    let other_end = before_other + 8_000 * MS;
    server.stop();
    // Times out: the fallback serves it (the key opens there at now); its
    // request, queued on the stopped server, is granted there once it
    // resumes, behind the other process's debt, and nobody waits for it.
    first.reserve(1).await.unwrap();
    assert!(first.stats().degraded);
    // 5 s of the fallback's schedule (at 10/s, its share 1).
    let local_end = Instant::now() + first.reserve(50).await.unwrap() + 5_000 * MS;
    server.cont();
    recovered(|| !first.stats().degraded && first.stats().keys == 0).await;
    let carried_at = Instant::now();
    let next_at = Instant::now() + other.reserve(1).await.unwrap();
    // Redis owes the other process's 8 s, the late permit, and what was
    // left of the fallback's schedule when it was carried back.
    let left = local_end.saturating_duration_since(carried_at);
    println!(
        "the fallback's schedule had {left:?} left when carried back; the next permit \
         through Redis {:?} after the other process's debt",
        next_at.saturating_duration_since(other_end)
    );
    assert!(
        left >= 1_000 * MS,
        "the recovery took too long: {left:?} left"
    );
    assert!(
        next_at + 100 * MS >= other_end + left,
        "the next permit through Redis came {:?} after the other process's debt, with \
         {left:?} of the fallback's schedule left",
        next_at.saturating_duration_since(other_end)
    );
}
