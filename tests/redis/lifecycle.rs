//! A backend and its limiters over a long-running process's life: used,
//! through an outage and back, then dropped, they leave nothing of theirs
//! in the backend.

use std::time::Duration;

use crate::support::poll::backend_builder;
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use paceline::KeyedRateLimiter;

/// How long a background task may take to end, or a connection to close,
/// on a loaded machine.
const SETTLE: Duration = Duration::from_secs(10);

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
