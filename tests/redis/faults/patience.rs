//! A try that waits for its key's carry-back counts its timeout from its
//! call: the time it waited is taken off it, whether it then goes to Redis
//! or, its time up, to the fallback. The window: the connection dies
//! silently under a call, which the fallback serves; once the probe's fresh
//! connection brings Redis back, the key's carry-back waits for that lost
//! round trip (up to the response timeout), and the try waits behind it.

use super::*;

/// The response timeout: wide, so that what is left of it after a wait
/// covers a round trip that a loaded machine delays.
const TIMEOUT: Duration = Duration::from_secs(4);

/// A backend through `proxy` with [`TIMEOUT`], and a limiter on it at 10/s
/// with no burst and the whole rate while Redis is down, its connection
/// open; then the connection dies silently under a call of `permits`,
/// which the fallback serves once the timeout has passed (the key is held
/// there), and Redis comes back by the probe's fresh connection: the key's
/// carry-back has started, and waits for the lost round trip. Returns the
/// limiter and when it was seen back on Redis.
async fn carrying_back(proxy: &Proxy, name: &str, permits: u32) -> (RateLimiter<Redis>, Instant) {
    let backend = backend_builder(proxy.client())
        .response_timeout(TIMEOUT)
        .coalesce(false)
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&backend, name)
        .local_fraction(1.0)
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
    proxy.blackhole_existing();
    assert_eq!(limiter.reserve(permits).await.unwrap(), Duration::ZERO);
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("back on Redis");
    (limiter, Instant::now())
}

/// On the Redis path: a try of 2 s, called 1.5 s after the carry-back
/// started, waits for it (about 2.5 s), then goes to Redis. Another process
/// reserved 3.5 s of permits just before the call: from the call, the
/// permit is 3.5 s away (refused); counted from its round trip, it is about
/// 1 s away and fits. (It is refused while the wait lasts under 3.5 s, and
/// shows the fault while it lasts over 1.5 s: the call's lateness after
/// the recovery shortens it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_waits_for_a_carry_back_counts_its_timeout_from_its_call() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let other = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&patient_backend(server.client()).await, "carried-try")
        .build()
        .unwrap();
    let (limiter, back) = carrying_back(&proxy, "carried-try", 1).await;
    tokio::time::sleep_until((back + Duration::from_millis(1_500)).into()).await;
    assert_eq!(other.reserve(35).await.unwrap(), Duration::ZERO);
    let (fits, took) = try_for_two_seconds(&limiter).await;
    assert!(
        took >= Duration::from_millis(1_500),
        "the try waited {took:?}: too little for a carry-back"
    );
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    assert!(
        !fits,
        "a try of 2 s was granted {took:?} after its call, its permit 3.5 s after it"
    );
}

/// On the fallback path: a try of 2 s, called as the carry-back starts,
/// waits for it until its response timeout (4 s) has passed (the
/// carry-back's resume, slowed by the proxy, ends later), then the
/// fallback, which still holds the key, serves it. The fallback's schedule
/// ends 5.5 s after the lost call, which it served just before Redis came
/// back: from the try's call, the permit is about 5.5 s away (refused);
/// counted from when the fallback serves it, about 1.5 s, and it fits.
/// (It is refused while Redis comes back within 1.5 s of the lost call,
/// and shows the fault however late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_whose_patience_runs_out_behind_a_carry_back_counts_its_timeout_from_its_call() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let (limiter, _) = carrying_back(&proxy, "impatient-try", 55).await;
    // The resume, sent once the carry-back stops waiting for the lost round
    // trip, takes 2 s: past the try's time.
    proxy.set_latency(Duration::from_secs(1));
    let (fits, took) = try_for_two_seconds(&limiter).await;
    assert!(
        took >= TIMEOUT - Duration::from_millis(500),
        "the try waited {took:?}: too little for its time to run out"
    );
    assert_eq!(limiter.stats().fallback_calls, 2, "{:?}", limiter.stats());
    assert!(
        !fits,
        "a try of 2 s was granted {took:?} after its call, its permit about 5.5 s after it"
    );
}

/// A try of one permit within 2 s on `limiter`: whether it fit, and how
/// long it took from its call.
async fn try_for_two_seconds(limiter: &RateLimiter<Redis>) -> (bool, Duration) {
    let called = Instant::now();
    let fits = limiter
        .try_acquire(1, Duration::from_secs(2))
        .await
        .unwrap();
    let took = called.elapsed();
    println!(
        "the try returned {fits} after {took:?}: {:?}",
        limiter.stats()
    );
    (fits, took)
}
