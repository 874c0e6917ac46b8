//! A backend and its limiters over a long-running process's life: used,
//! through an outage and back, then dropped, they leave no task and no
//! connection behind; runtimes that go away under them answer every
//! caller, and nothing panics; thousands of limiters made and dropped on
//! one backend leave nothing of theirs in it.

use std::sync::Arc;
use std::time::Duration;

use crate::support::poll::backend_builder;
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use paceline::outbound::Feedback;
use paceline::redis::{Fallback, RedisBackend};
use paceline::{Cost, KeyedRateLimiter, Limit, RateLimiter};

/// How long a background task may take to end, or a connection to close,
/// on a loaded machine.
const SETTLE: Duration = Duration::from_secs(10);

/// The clients connected to `server` now, the asking one included.
fn connected_clients(server: &RedisServer) -> usize {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Waits, on the real clock, up to [`SETTLE`] for `done`.
fn settles(mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < SETTLE {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every kind of limiter on `backend`, used through Redis, through an
/// outage (the proxy refuses and resets, the fallbacks serve, the probe
/// runs) and back (carry-backs), then dropped.
async fn use_everything(backend: &RedisBackend, proxy: &Proxy, tag: &str) {
    let single = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .redis(backend, &format!("{tag}-single"))
        .build()
        .unwrap();
    let keyed = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1_000.0)
        .redis(backend, &format!("{tag}-keyed"))
        .build()
        .unwrap();
    let several = RateLimiter::builder()
        .limit(Limit::per_second(1_000.0))
        .limit(Limit::per(100_000.0, Duration::from_secs(60)))
        .redis(backend, &format!("{tag}-several"))
        .build()
        .unwrap();
    let slots = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(4))
        .redis(backend, &format!("{tag}-slots"))
        .slot_ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let round = |n: u32| {
        let (single, keyed, several, slots) = (&single, &keyed, &several, &slots);
        async move {
            for i in 0..n {
                single.acquire(1).await.unwrap();
                keyed.acquire(&format!("k{i}"), 1).await.unwrap();
                several.acquire(1).await.unwrap();
                let call = slots.call(Cost::from(1)).await.unwrap();
                call.learn(&Feedback::new(200));
                drop(call);
                let call = single.call(1).await.unwrap();
                call.finish(
                    &Feedback::new(429).with_retry_after(Duration::from_millis(1)),
                    1,
                )
                .unwrap();
            }
        }
    };
    round(5).await;
    // A held lease and a reservation pending across the outage.
    let held = slots.call(1).await.unwrap();
    let pending = single.reserve(1).await.unwrap();
    let _ = pending;
    proxy.refuse_new(true);
    proxy.reset_all();
    round(5).await;
    assert!(backend.stats().degraded, "{:?}", backend.stats());
    proxy.refuse_new(false);
    proxy.heal();
    let start = std::time::Instant::now();
    while backend.stats().degraded && start.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!backend.stats().degraded, "{:?}", backend.stats());
    round(5).await;
    drop(held);
}

/// A backend built in a runtime of the test's, used by every kind of
/// limiter through an outage and back, then dropped with them: every task
/// it started ends, and every connection it opened closes.
#[test]
fn a_dropped_backend_leaves_no_task_and_no_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let runtime = runtime();
    let idle_tasks = runtime.metrics().num_alive_tasks();
    let idle_clients = connected_clients(&server);
    runtime.block_on(async {
        let backend = backend_builder(proxy.client()).build().await.unwrap();
        use_everything(&backend, &proxy, "a").await;
    });
    let tasks = || runtime.metrics().num_alive_tasks();
    assert!(
        settles(|| tasks() <= idle_tasks),
        "{} tasks alive, {idle_tasks} before",
        tasks()
    );
    assert!(
        settles(|| proxy.connections() == 0),
        "{} connections open",
        proxy.connections()
    );
    assert!(
        settles(|| connected_clients(&server) <= idle_clients),
        "{} clients, {idle_clients} before",
        connected_clients(&server)
    );
}

/// The same with a backend of its own runtime (`build_blocking`): once it
/// and its limiters are dropped, its connection closes (with the backend,
/// which shuts its runtime down).
#[test]
fn a_dropped_blocking_backend_closes_its_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend_builder(proxy.client()).build_blocking().unwrap();
    let runtime = runtime();
    runtime.block_on(use_everything(&backend, &proxy, "b"));
    assert!(proxy.connections() > 0);
    drop(backend);
    drop(runtime);
    assert!(
        settles(|| proxy.connections() == 0),
        "{} connections open",
        proxy.connections()
    );
}

/// The panics of this process's threads from now on whose place is not a
/// test's own file (a failed assertion of another test): the crate's, its
/// dependencies'. The hook is installed once and chains the one before.
fn panics_elsewhere() -> Arc<std::sync::Mutex<Vec<String>>> {
    static SEEN: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<String>>>> =
        std::sync::OnceLock::new();
    Arc::clone(SEEN.get_or_init(|| {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let noted = Arc::clone(&seen);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let place = info
                .location()
                .map(|l| l.file().to_owned())
                .unwrap_or_default();
            if !place.starts_with("tests/") {
                let thread = std::thread::current().name().unwrap_or("?").to_owned();
                noted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(format!("{thread}: {info}"));
            }
            previous(info);
        }));
        seen
    }))
}

/// Runs `f` on a thread of its own; its result, or `None` if it did not
/// return within `within`.
fn bounded<T: Send + 'static>(
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    finished.recv_timeout(within).ok()
}

/// A runtime dropped while its tasks sleep in `acquire`, wait queued
/// behind a key's round trip, hold a slot's lease, and wait for a Redis
/// that does not answer (`hung`), or while its probe runs (`down`): the
/// drop returns, nothing panics, and callers blocking on other threads
/// meanwhile each get an answer within their bound.
fn dropped_under_calls(current_thread: bool, hung: bool, down: bool) {
    let panics = panics_elsewhere();
    let panicked = panics.lock().unwrap().len();
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let runtime = if current_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        runtime()
    };
    let response_timeout = Duration::from_millis(500);
    let (backend, single, keyed, slots) = runtime.block_on(async {
        let backend = backend_builder(proxy.client())
            .response_timeout(response_timeout)
            .build()
            .await
            .unwrap();
        let single = Arc::new(
            RateLimiter::builder()
                .permits_per_second(2.0)
                .redis(&backend, "shutdown-single")
                .build()
                .unwrap(),
        );
        let keyed = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .permits_per_second(2.0)
                .redis(&backend, "shutdown-keyed")
                .build()
                .unwrap(),
        );
        let slots = Arc::new(
            RateLimiter::builder()
                .permits_per_second(1_000.0)
                .limit(Limit::concurrent(2))
                .redis(&backend, "shutdown-slots")
                .slot_ttl(Duration::from_millis(300))
                .build()
                .unwrap(),
        );
        (backend, single, keyed, slots)
    });
    runtime.block_on(async {
        // Leases held (renewed every 100 ms) and a call waiting for one.
        for _ in 0..3 {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move {
                let _call = slots.call(1).await;
                std::future::pending::<()>().await;
            });
        }
        for i in 0..64 {
            let (single, keyed) = (Arc::clone(&single), Arc::clone(&keyed));
            tokio::spawn(async move {
                loop {
                    let _ = single.acquire(1).await;
                    let _ = keyed.acquire(&format!("k{}", i % 4), 1).await;
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    if hung {
        proxy.blackhole_all();
    }
    if down {
        proxy.refuse_new(true);
        proxy.reset_all();
    }
    // Callers blocking on other threads, before and after the drop.
    let callers: Vec<_> = (0..4)
        .map(|i| {
            let (single, keyed) = (Arc::clone(&single), Arc::clone(&keyed));
            std::thread::spawn(move || {
                let mut longest = Duration::ZERO;
                let timed = |call: &dyn Fn()| {
                    let start = std::time::Instant::now();
                    call();
                    start.elapsed()
                };
                for _ in 0..6 {
                    let one = timed(&|| {
                        let _ = single.try_acquire_blocking(1, Duration::from_millis(50));
                    });
                    let other = timed(&|| {
                        let _ = keyed.try_acquire_blocking(&format!("k{i}"), 1, Duration::ZERO);
                    });
                    longest = longest.max(one).max(other);
                    std::thread::sleep(Duration::from_millis(50));
                }
                longest
            })
        })
        .collect();
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    let dropped = bounded(Duration::from_secs(10), move || drop(runtime));
    assert!(dropped.is_some(), "dropping the runtime hung");
    // A blocking call waits for the runtime twice the response timeout and
    // a second, and as long again for a call that had started there; a
    // loaded machine gets two seconds more.
    let bound = 2 * (2 * response_timeout + Duration::from_secs(1)) + Duration::from_secs(2);
    for caller in callers {
        let longest = caller.join().unwrap();
        assert!(longest < bound, "a blocking call took {longest:?}");
    }
    // And after it, at once served by the fallback or refused (the keys'
    // debt is far ahead: a try, not a wait).
    let after = bounded(Duration::from_secs(10), move || {
        let tried = single.try_acquire_blocking(1, Duration::ZERO);
        drop((single, keyed, slots, backend));
        tried.map_err(|e| e.to_string())
    });
    assert!(after.is_some(), "a blocking call after the drop hung");
    std::thread::sleep(Duration::from_millis(200));
    let panics = panics.lock().unwrap();
    assert!(
        panics.len() == panicked,
        "panics: {:#?}",
        &panics[panicked..]
    );
}

#[test]
fn a_runtime_dropped_under_waiting_and_leased_calls() {
    dropped_under_calls(false, false, false);
}

#[test]
fn a_current_thread_runtime_dropped_under_waiting_and_leased_calls() {
    dropped_under_calls(true, false, false);
}

#[test]
fn a_current_thread_runtime_dropped_while_redis_hangs() {
    dropped_under_calls(true, true, false);
}

#[test]
fn a_current_thread_runtime_dropped_while_the_probe_runs() {
    dropped_under_calls(true, false, true);
}

#[test]
fn a_runtime_dropped_while_redis_hangs() {
    dropped_under_calls(false, true, false);
}

#[test]
fn a_runtime_dropped_while_the_probe_runs() {
    dropped_under_calls(false, false, true);
}

/// Makes limiter number `i` on `backend`, one of each kind in turn, and
/// uses it once.
async fn one_more(backend: &RedisBackend, i: usize) {
    let name = format!("tenant-{i}");
    match i % 4 {
        0 => {
            let limiter = RateLimiter::builder()
                .permits_per_second(1_000.0)
                .redis(backend, &name)
                .build()
                .unwrap();
            limiter.acquire(1).await.unwrap();
        }
        1 => {
            let limiter = KeyedRateLimiter::<String>::builder()
                .permits_per_second(1_000.0)
                .redis(backend, &name)
                .build()
                .unwrap();
            limiter.acquire(&format!("k{i}"), 1).await.unwrap();
        }
        2 => {
            let limiter = RateLimiter::builder()
                .permits_per_second(1_000.0)
                .limit(Limit::concurrent(2))
                .redis(backend, &name)
                .build()
                .unwrap();
            let call = limiter.call(1).await.unwrap();
            call.finish(&Feedback::new(200), 1).unwrap();
        }
        _ => {
            let limiter = RateLimiter::builder()
                .limit(Limit::per_second(1_000.0))
                .limit(Limit::per(100_000.0, Duration::from_secs(60)))
                .redis(backend, &name)
                .fallback(Fallback::Local)
                .build()
                .unwrap();
            let reservation = limiter.reservation(1).await.unwrap();
            drop(reservation);
        }
    }
}

/// A process that makes a limiter per tenant, uses it and drops it (a
/// config reload), 10 000 times on one backend, through outages: the
/// memory it holds after the 10 000th is what it held after the 2 000th.
#[test]
fn ten_thousand_limiters_made_and_dropped_leave_nothing_behind() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    // One thread does everything: the allocator counts it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = backend_builder(proxy.client()).build().await.unwrap();
        let mut held = Vec::new();
        for i in 0..10_000 {
            if i % 1_000 == 500 {
                // An outage: this limiter's call is served by its
                // fallback, then Redis comes back.
                proxy.refuse_new(true);
                proxy.reset_all();
                one_more(&backend, i).await;
                one_more(&backend, i + 1).await;
                assert!(backend.stats().degraded);
                proxy.refuse_new(false);
                let start = std::time::Instant::now();
                while backend.stats().degraded && start.elapsed() < SETTLE {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(!backend.stats().degraded);
            } else {
                one_more(&backend, i).await;
            }
            if i == 1_999 || i == 9_999 {
                // Background work (give-backs, releases) ends.
                tokio::time::sleep(Duration::from_millis(300)).await;
                held.push(crate::support::alloc::bytes_in_use());
            }
        }
        let grown = held[1] - held[0];
        assert!(
            grown < 64 * 1024,
            "{grown} bytes more after 8 000 more limiters"
        );
    });
}

/// Many limiters alive through an outage, each served by its fallback,
/// then dropped together (a config reload after the outage): the memory
/// they took goes with them.
#[test]
fn limiters_dropped_after_an_outage_free_their_memory() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = backend_builder(proxy.client()).build().await.unwrap();
        // Once first, so that what the first ones allocate for good is
        // there before the count starts.
        let reload = |tag: &'static str, n: usize| {
            let backend = &backend;
            let proxy = &proxy;
            async move {
                let limiters: Vec<_> = (0..n)
                    .map(|i| {
                        KeyedRateLimiter::<String>::builder()
                            .permits_per_second(1_000.0)
                            .redis(backend, &format!("{tag}-{i}"))
                            .build()
                            .unwrap()
                    })
                    .collect();
                proxy.refuse_new(true);
                proxy.reset_all();
                for limiter in &limiters {
                    limiter.acquire("k", 1).await.unwrap();
                }
                assert!(backend.stats().degraded);
                proxy.refuse_new(false);
                let start = std::time::Instant::now();
                while (backend.stats().degraded || limiters.iter().any(|l| l.stats().keys > 0))
                    && start.elapsed() < SETTLE
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(!backend.stats().degraded);
                drop(limiters);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        };
        reload("first", 2_000).await;
        reload("lone", 1).await;
        let before = crate::support::alloc::bytes_in_use();
        reload("second", 2_000).await;
        // (Each took about 1.4 KB.)
        let held = crate::support::alloc::bytes_in_use() - before;
        assert!(
            held < 512 * 1024,
            "2 000 limiters dropped hold {held} bytes"
        );
    });
}
