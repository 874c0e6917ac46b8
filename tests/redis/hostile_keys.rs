//! Hostile key text (separators, braces, backslashes, NUL, newlines,
//! huge keys, the slots suffix) and names or prefixes that concatenate
//! alike never reach another (limiter, key)'s state, in Redis or in the
//! fallback, and a flood of such keys stays bounded.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::poll::{RESPONSE_TIMEOUT, SLACK, backend, backend_builder, patient_backend};
use crate::support::redis_server::RedisServer;
use paceline::redis::{Redis, RedisBackend};
use paceline::{Error, KeyedRateLimiter, Limit, RateLimiter};

/// Names whose concatenations with the keys below could meet.
const NAMES: [&str; 13] = [
    "a",
    "a:b",
    "a:b:c",
    "a\\",
    "a\\:b",
    "a:",
    "{t}",
    "{t}:b",
    "a}b",
    "a{b",
    "{}",
    "paceline:v1:a",
    "a\\slots",
];

/// Hostile key texts.
fn keys() -> Vec<String> {
    [
        "",
        "b",
        "b:c",
        "c",
        ":",
        "::",
        "b\\:c",
        "\\",
        "\\\\",
        "\\:",
        "{t}",
        "{",
        "}",
        "{}",
        "\\(",
        "\\)",
        "(",
        ")",
        "\0",
        "b\0c",
        "\n",
        "b\r\nc",
        "slots",
        "\\slots",
        "b\\slots",
        "{b}\\slots",
        "\u{7f}",
        "é",
        "\u{fffd}",
        "%s",
        "*",
        "?",
        " ",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// One permit every 2 s and no burst: a pair that shares its state with
/// one already granted waits about 2 s on its first grant.
fn keyed(backend: &RedisBackend, name: &str) -> KeyedRateLimiter<String, Redis> {
    KeyedRateLimiter::<String>::builder()
        .redis(backend, name)
        .permits_per_second(0.5)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap()
}

fn single(backend: &RedisBackend, name: &str) -> RateLimiter<Redis> {
    RateLimiter::builder()
        .redis(backend, name)
        .permits_per_second(0.5)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap()
}

fn all_keys(server: &RedisServer) -> Vec<Vec<u8>> {
    let mut con = server.connection();
    redis::cmd("KEYS").arg("*").query(&mut con).unwrap()
}

/// Every (name, key) pair, keyed or not, gets its first permit at once
/// (no other pair's grant reached it), and lands on a Redis key of its
/// own whose bytes are the documented escape of the name and the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_pairs_share_no_redis_key_nor_state() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let mut redis_keys = HashSet::new();
    let mut pairs = 0;
    for name in NAMES {
        let one = single(&backend, name);
        let first = Instant::now();
        assert_eq!(
            one.reserve(1).await.unwrap(),
            Duration::ZERO,
            "single {name:?} met another's state"
        );
        assert!(redis_keys.insert(one.redis_key()), "{name:?}");
        pairs += 1;
        let many = keyed(&backend, name);
        for key in keys() {
            assert_eq!(
                many.reserve(&key, 1).await.unwrap(),
                Duration::ZERO,
                "({name:?}, {key:?}) met another pair's state ({})",
                many.redis_key(&key)
            );
            // The documented escape, byte for byte.
            let escaped_name = name.replace('\\', "\\\\").replace(':', "\\:");
            let escaped_key = key
                .replace('\\', "\\\\")
                .replace('{', "\\(")
                .replace('}', "\\)");
            assert_eq!(
                many.redis_key(&key),
                format!("paceline:v1:{escaped_name}:{escaped_key}")
            );
            assert!(redis_keys.insert(many.redis_key(&key)), "{name:?} {key:?}");
            pairs += 1;
        }
        // And each saw its own grant: the second waits for the rest of its
        // 2 s (the keys' reservations took some of it, more on a loaded
        // machine).
        let wait = one.reserve(1).await.unwrap();
        assert!(
            wait + first.elapsed() >= Duration::from_millis(1900),
            "{name:?}: {wait:?} after {:?}",
            first.elapsed()
        );
    }
    let stored: HashSet<Vec<u8>> = all_keys(&server).into_iter().collect();
    assert_eq!(stored.len(), pairs, "one Redis key per pair");
    let expected: HashSet<Vec<u8>> = redis_keys.into_iter().map(String::into_bytes).collect();
    assert_eq!(stored, expected, "the Redis keys are the documented bytes");
}

/// A 1 MiB key (and one of 1 MiB of braces and backslashes) is a Redis key
/// of its own, apart from its 1 MiB - 1 prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_keys_are_their_own() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    // A minute an interval: the four reservations of 1 MiB keys before the
    // check take seconds on a loaded machine.
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "a")
        .permits_per_second(1.0 / 60.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let big = "x".repeat(1 << 20);
    let braces = "{\\}".repeat((1 << 20) / 3);
    let start = Instant::now();
    for key in [&big, &big[1..], &braces, &braces[1..]] {
        assert_eq!(limiter.reserve(key, 1).await.unwrap(), Duration::ZERO);
    }
    // Its own grant holds it for a minute from then.
    let wait = limiter.reserve(&big, 1).await.unwrap();
    let elapsed = start.elapsed();
    assert!(
        wait + elapsed >= Duration::from_millis(59_990) && wait > Duration::ZERO,
        "{wait:?} after {elapsed:?}, degraded {}",
        limiter.stats().degraded
    );
    let stored = all_keys(&server);
    assert_eq!(stored.len(), 4);
    assert!(stored.contains(&limiter.redis_key(&braces).into_bytes()));
}

/// Keys of keyed limiters with a concurrent limit: each (name, key) has
/// slots of its own, no slots key is a limiter's key (a call on every
/// pair, rate and slot, fails on none), and one slot held on every pair
/// leaves every other pair's slot free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_keys_of_hostile_pairs_are_apart() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiters: Vec<(&str, KeyedRateLimiter<String, Redis>)> = NAMES
        .iter()
        .map(|name| {
            let limiter = KeyedRateLimiter::<String>::builder()
                .redis(&backend, name)
                .permits_per_second(0.5)
                .max_burst(Duration::ZERO)
                .limit(Limit::concurrent(1))
                .build()
                .unwrap();
            (*name, limiter)
        })
        .collect();
    let mut held = Vec::new();
    for (name, limiter) in &limiters {
        for key in keys() {
            let slot = limiter
                .hold_slot(key.as_str(), Some(Duration::ZERO))
                .await
                .unwrap();
            assert!(
                slot.as_ref().is_some_and(|(held, _)| *held),
                "({name:?}, {key:?}) found its slot taken"
            );
            held.push(slot);
            // The rate's key beside it holds the limiter's value, its own.
            assert_eq!(
                limiter.reserve(key.as_str(), 1).await.unwrap(),
                Duration::ZERO,
                "({name:?}, {key:?})"
            );
        }
    }
    let zsets: usize = all_keys(&server)
        .iter()
        .filter(|key| {
            let kind: String = redis::cmd("TYPE")
                .arg(key.as_slice())
                .query(&mut server.connection())
                .unwrap();
            kind == "zset"
        })
        .count();
    assert_eq!(zsets, NAMES.len() * keys().len());
    assert_eq!(all_keys(&server).len(), 2 * NAMES.len() * keys().len());
    drop(held);
}

/// A backend's key prefix: empty, or holding `:` or a brace, is refused;
/// one with a backslash or other text is taken, and backends with prefixes
/// that concatenate alike with names share nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_prefixes_keep_limiters_apart() {
    let server = RedisServer::start();
    for bad in ["", "a:", ":", "{a}", "a{", "}"] {
        let built = backend_builder(server.client())
            .key_prefix(bad)
            .build()
            .await;
        assert!(
            matches!(built, Err(Error::InvalidArgument(_))),
            "prefix {bad:?} accepted"
        );
    }
    let mut seen = HashSet::new();
    for prefix in ["a", "a\\", "a\\\\", "paceline", "v1", "\\", "a b", "\0"] {
        let backend = backend_builder(server.client())
            .response_timeout(Duration::from_secs(5))
            .key_prefix(prefix)
            .build()
            .await
            .unwrap();
        for name in ["v1", "v1:a", "a", "a:v1", "\\"] {
            let one = single(&backend, name);
            assert_eq!(
                one.reserve(1).await.unwrap(),
                Duration::ZERO,
                "{prefix:?} {name:?}"
            );
            assert!(seen.insert(one.redis_key()));
            let many = keyed(&backend, name);
            for key in ["", "v1", "a", ":v1:a"] {
                assert_eq!(
                    many.reserve(key, 1).await.unwrap(),
                    Duration::ZERO,
                    "{prefix:?} {name:?} {key:?}"
                );
                assert!(seen.insert(many.redis_key(key)));
            }
        }
    }
    assert_eq!(all_keys(&server).len(), seen.len());
}

/// While Redis is down the fallback keeps hostile keys apart as Redis
/// does: each key's first permit at once, its second not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_keeps_hostile_keys_apart() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = keyed(&backend, "a");
    limiter.reserve("warm", 1).await.unwrap();
    server.kill();
    for key in keys() {
        assert_eq!(
            limiter.reserve(&key, 1).await.unwrap(),
            Duration::ZERO,
            "{key:?}"
        );
    }
    assert!(limiter.stats().degraded);
    for key in keys() {
        assert!(
            !limiter.try_acquire(&key, 1, Duration::ZERO).await.unwrap(),
            "{key:?}"
        );
    }
}

/// A flood of distinct hostile keys (1 KiB each, braces and backslashes)
/// while Redis is down: the fallback holds at most `max_keys`, each call
/// returns within the response timeout, and Redis takes the keys back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_hostile_keys_in_the_fallback_is_bounded() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "flood")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(64)
        .build()
        .unwrap();
    limiter.reserve("warm", 1).await.unwrap();
    server.kill();
    let pad = "{\\}:".repeat(256);
    // A call runs late now and then on a loaded machine (one took over 2 s
    // with two suites running at once): none may hang, and a few in a
    // thousand at most may take longer than the response timeout and some
    // slack (a fallback that waited for Redis would make every call late).
    let mut late = 0;
    for i in 0..20_000u32 {
        let key = format!("{pad}{i}");
        let start = Instant::now();
        limiter.reserve(&key, 1).await.unwrap();
        let took = start.elapsed();
        assert!(took <= 100 * RESPONSE_TIMEOUT, "call {i} took {took:?}");
        late += usize::from(took > RESPONSE_TIMEOUT + SLACK);
        assert!(limiter.stats().keys <= 64, "{} keys", limiter.stats().keys);
    }
    assert!(late <= 40, "{late} calls of 20 000 were late");
    server.restart();
    crate::support::within::within(Duration::from_secs(10), || !limiter.stats().degraded)
        .await
        .expect("recovers");
    crate::support::within::within(Duration::from_secs(10), || limiter.stats().keys == 0)
        .await
        .expect("carries the held keys back");
    // At most max_keys keys reached Redis (their debts), each its own.
    let stored = all_keys(&server);
    assert!(stored.len() <= 65, "{} keys in Redis", stored.len());
}

/// A key of hostile text whose Redis key holds someone else's value: the
/// error names that key with its bytes (the escaped Redis key, as
/// `redis_key` gives it) in the crate's words, and the script's words
/// (which tell the operator to delete the key) name none: Lua cut them at
/// a NUL and Redis rewrote a CRLF, so they named another key's (`b\0c`'s
/// error said `paceline:v1:a:b`). The value is left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_names_the_hostile_key_whole() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = keyed(&backend, "a");
    for key in ["b\0c", "b\r\nc", "%s%d", "{x}"] {
        let redis_key = limiter.redis_key(key);
        let _: () = redis::cmd("SET")
            .arg(&redis_key)
            .arg("foreign")
            .query(&mut server.connection())
            .unwrap();
        let error = limiter.reserve(key, 1).await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::Backend(_)), "{error:?}");
        assert!(text.contains(&redis_key), "{key:?}: {text:?}");
        let script = text.split_once("ResponseError").map_or("", |(_, s)| s);
        // The script names no key (its words were cut at a NUL, or had a
        // CRLF rewritten, and named another key's: "key paceline:v1:a:b").
        assert!(
            !script.contains("paceline:v1:"),
            "{key:?}: the script's error names a key: {script:?}"
        );
        let kept: String = redis::cmd("GET")
            .arg(&redis_key)
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(kept, "foreign");
    }
}

/// The same for a slots key holding another type: the script's error
/// names the slots key whole, never another key's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_error_names_the_hostile_key_whole() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "a")
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(1))
        .build()
        .unwrap();
    for key in ["b\0c", "b\r\nc"] {
        let slots_key = format!("{{{}}}\\slots", limiter.redis_key(key));
        let _: () = redis::cmd("SET")
            .arg(&slots_key)
            .arg("foreign")
            .query(&mut server.connection())
            .unwrap();
        let error = match limiter.hold_slot(key, Some(Duration::ZERO)).await {
            Err(error) => error,
            Ok(_) => panic!("{key:?}: a slot over a foreign value"),
        };
        let text = error.to_string();
        let script = text.split_once("ResponseError").map_or("", |(_, s)| s);
        assert!(text.contains(&slots_key), "{key:?}: {text:?}");
        assert!(
            !script.contains("paceline:v1:"),
            "{key:?}: the script's error names a key: {text:?}"
        );
    }
}

/// A flood of distinct hostile keys while Redis is up holds nothing in
/// this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_hostile_keys_through_redis_holds_nothing_here() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "flood")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .max_keys(16)
        .build()
        .unwrap();
    let pad = "{\\}:\0".repeat(64);
    for i in 0..5_000u32 {
        let key = format!("{pad}{i}");
        assert_eq!(limiter.reserve(&key, 1).await.unwrap(), Duration::ZERO);
    }
    let stats = limiter.stats();
    assert_eq!(stats.keys, 0);
    assert!(!stats.degraded);
    // (Each key expires a second after its grant, once refilled.)
    assert!(all_keys(&server).len() <= 5_000);
}
