//! The Redis tests' backend settings.

use std::time::Duration;

/// The response timeout and probe interval of the Redis tests' backends.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(100);
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Scheduling slack on a shared 2-core machine.
pub const SLACK: Duration = Duration::from_millis(250);

/// A backend's builder on `client` with the tests' timeout and probe
/// interval, for the options a test sets itself.
pub fn backend_builder(client: redis::Client) -> paceline::redis::RedisBackendBuilder {
    paceline::redis::RedisBackend::builder(client)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
}

/// A backend on `client` with the tests' timeout and probe interval.
pub async fn backend(client: redis::Client) -> paceline::redis::RedisBackend {
    backend_builder(client).build().await.unwrap()
}

/// A backend on `client` that waits for Redis as long as a loaded machine
/// makes a call take (5 s), for a test that checks what Redis grants or
/// holds, not how soon it answers: a call that merely runs late must not
/// fail or send the limiter to its fallback. (A killed server's calls
/// still fail at once, on the closed connection.)
pub async fn patient_backend(client: redis::Client) -> paceline::redis::RedisBackend {
    backend_builder(client)
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A Redis limiter's builder at `rate` under `name`, on a backend of its
/// own on `client` (one connection, as a process of its own has) with the
/// tests' timeout and probe interval.
pub async fn builder(
    client: redis::Client,
    name: &str,
    rate: f64,
) -> paceline::Builder<paceline::NoKey, paceline::redis::Redis> {
    paceline::RateLimiter::builder()
        .permits_per_second(rate)
        .redis(&backend(client).await, name)
}
