//! The one-limit script's batch mode against the same script one call at a
//! time, on one real redis-server with the clock passed in: a batch of
//! requests must leave exactly the key its requests would leave one by one
//! at that clock reading (the value's bytes, ledger included, and its TTL)
//! and reply, for each request, exactly what its own call would (the same
//! token bytes, or the same refusal). Random batches of 1 to 1 024 requests
//! mix permits, held reservations, tries that are refused mid-batch, both
//! policies, rate changes and idle gaps between batches, and give-backs of
//! earlier grants. (The script one call at a time is held to the core by
//! the differential test, so a batch is held to the core's fold too.)

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::rng::Rng;
use paceline::redis::format::{BATCH_CAPACITY, SCRIPT};
use redis::Value;

/// The limiter's arguments, ARGV[3..=6].
#[derive(Debug, Clone)]
struct Config {
    rate: String,
    policy: &'static str,
    micros: u64,
    cold_factor: String,
}

impl Config {
    fn random(rng: &mut Rng) -> Config {
        let rate = *rng.pick(&["0.5", "2.0", "10.0", "333.0", "1000.0", "1e6", "inf"]);
        if rng.chance(0.3) {
            Config {
                rate: rate.to_owned(),
                policy: "warming_up",
                micros: 1 + rng.below(3_000_000),
                cold_factor: format!("{:?}", 1.0 + 4.0 * rng.f64()),
            }
        } else {
            Config {
                rate: rate.to_owned(),
                policy: "bursty",
                micros: rng.below(3_000_000),
                cold_factor: "0".to_owned(),
            }
        }
    }
}

/// One request of a batch, as its own call's ARGV[1] and ARGV[2].
fn random_request(rng: &mut Rng) -> (String, String) {
    let permits = match rng.below(10) {
        0 => 1 + rng.below(1_000),
        1..=3 => 1 + rng.below(5),
        _ => 1,
    };
    let plus = if rng.chance(0.4) { "+" } else { "" };
    let timeout = match rng.below(4) {
        0 => 0,
        1 => rng.below(50_000) as i64,
        _ => -1,
    };
    (format!("{permits}{plus}"), timeout.to_string())
}

/// `EVALSHA` of the script on `key`.
fn eval(sha: &str, key: &str, mode: &str, second: &[u8], config: &Config, now: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(1)
        .arg(key)
        .arg(mode)
        .arg(second)
        .arg(&config.rate)
        .arg(config.policy)
        .arg(config.micros)
        .arg(&config.cold_factor)
        .arg(now);
    cmd
}

/// Runs `calls` on `key` in one transaction, then reads the key's value and
/// TTL and removes the TTL (the clock here is passed in, not Redis's: a
/// TTL of a few ms must not expire the key between steps).
fn transact(
    connection: &mut redis::Connection,
    key: &str,
    calls: Vec<redis::Cmd>,
) -> (Vec<Value>, Option<Vec<u8>>, i64) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let count = calls.len();
    for call in calls {
        pipe.add_command(call);
    }
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    pipe.cmd("PERSIST").arg(key).ignore();
    let mut replies: Vec<Value> = pipe.query(connection).unwrap();
    let ttl = match replies.pop() {
        Some(Value::Int(ttl)) => ttl,
        other => panic!("PTTL replied {other:?}"),
    };
    let value = match replies.pop() {
        Some(Value::BulkString(bytes)) => Some(bytes),
        Some(Value::Nil) => None,
        other => panic!("GET replied {other:?}"),
    };
    assert_eq!(replies.len(), count);
    (replies, value, ttl)
}

/// A batch's reply, per request: its token as its own call would reply it
/// (`Some` bytes, with its group's id if it has one), `None` for a grant
/// whose give-back could return nothing (it did not wait, and a later
/// request was granted), or its refusal (`Err(-debt)`). The tokens come
/// first, one after another (76 bytes each), then per request -debt if
/// refused, else 0 (no token), 1 (a token) or its group's id + 2; then the
/// key's debt after the batch.
fn own_replies(reply: Vec<Value>, what: &str) -> Vec<Result<Option<Vec<u8>>, i64>> {
    let mut reply = reply.into_iter();
    let Some(Value::BulkString(tokens)) = reply.next() else {
        panic!("{what}: a batch's reply starts with its tokens");
    };
    let Some(Value::Int(debt)) = reply.next_back() else {
        panic!("{what}: a batch's reply ends with the debt");
    };
    assert!(debt >= 0, "{what}: debt {debt}");
    let mut tokens = tokens.chunks(76);
    let replies = reply
        .map(|item| match item {
            Value::Int(n) if n < 0 => Err(n),
            Value::Int(0) => Ok(None),
            Value::Int(code) => {
                let mut token = tokens.next().expect("a token per code").to_vec();
                assert_eq!(token.len(), 76, "{what}: a token is 76 bytes");
                if code > 1 {
                    token.extend(((code - 2) as f64).to_le_bytes());
                }
                Ok(Some(token))
            }
            other => panic!("{what}: a request replied {other:?}"),
        })
        .collect();
    assert!(tokens.next().is_none(), "{what}: a token per code, no more");
    replies
}

/// The same TTL was set on both keys (the value's expires_micros, compared
/// exactly, records it), read as much real time apart as the transactions
/// since `started` took at most.
fn same_ttl(a: i64, b: i64, started: std::time::Instant, what: &str) {
    let took = started.elapsed().as_millis() as u64;
    assert!(
        (a < 0) == (b < 0) && a.abs_diff(b) <= took + 2,
        "{what}: the TTL, {a} and {b} ms, {took} ms apart"
    );
}

#[test]
fn a_batch_is_its_requests_one_by_one() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query(&mut connection)
        .unwrap();
    // `BATCH_SEEDS=500` for a longer run.
    let seeds = std::env::var("BATCH_SEEDS").map_or(60, |s| s.parse().unwrap());
    let (mut batches, mut requests, mut refused, mut held_ids, mut untokened) = (0, 0, 0, 0, 0);
    for seed in 0..seeds {
        let mut rng = Rng::new(7000 + seed);
        let (batched, single) = (format!("b:{seed}"), format!("s:{seed}"));
        let mut config = Config::random(&mut rng);
        let mut now = 1_000_000 + rng.below(1_000_000);
        // Tokens granted so far, the same bytes on both keys.
        let mut tokens: Vec<Vec<u8>> = Vec::new();
        for step in 0..40 {
            let what = format!("seed {seed} step {step} ({config:?})");
            now += match rng.below(6) {
                0 => rng.below(3_000_000),
                1 | 2 => rng.below(2_000),
                _ => 0,
            };
            if rng.chance(0.1) {
                // A rate (or configuration) change between batches.
                let next = Config::random(&mut rng);
                config = Config {
                    policy: config.policy,
                    cold_factor: config.cold_factor.clone(),
                    ..next
                };
            }
            if rng.chance(0.15) && !tokens.is_empty() {
                // A give-back of an earlier grant, on both keys.
                let token = tokens.swap_remove(rng.below(tokens.len() as u64) as usize);
                let cancel = |key: &str| vec![eval(&sha, key, "cancel", &token, &config, now)];
                let started = std::time::Instant::now();
                let a = transact(&mut connection, &batched, cancel(&batched));
                let b = transact(&mut connection, &single, cancel(&single));
                assert_eq!((&a.0, &a.1), (&b.0, &b.1), "{what}: a give-back");
                same_ttl(a.2, b.2, started, &what);
                continue;
            }
            let size = match rng.below(20) {
                0 => 1 + rng.below(BATCH_CAPACITY as u64) as usize,
                1..=4 => 1,
                _ => 1 + rng.below(64) as usize,
            };
            let batch: Vec<(String, String)> =
                (0..size).map(|_| random_request(&mut rng)).collect();
            // Runs of the same request written once, with `*count`, or
            // each written out.
            let text = if rng.chance(0.5) {
                batch
                    .chunk_by(|a, b| a == b)
                    .map(|run| format!("{}:{}*{}", run[0].0, run[0].1, run.len()))
                    .collect::<Vec<_>>()
                    .join(",")
            } else {
                batch
                    .iter()
                    .map(|(permits, timeout)| format!("{permits}:{timeout}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let started = std::time::Instant::now();
            let (mut a, a_value, a_ttl) = transact(
                &mut connection,
                &batched,
                vec![eval(&sha, &batched, "batch", text.as_bytes(), &config, now)],
            );
            let calls = batch
                .iter()
                .map(|(permits, timeout)| {
                    eval(&sha, &single, permits, timeout.as_bytes(), &config, now)
                })
                .collect();
            let (b, b_value, b_ttl) = transact(&mut connection, &single, calls);
            let Some(Value::Array(a)) = a.pop() else {
                panic!("{what}: a batch replies an array");
            };
            let a = own_replies(a, &what);
            assert_eq!(a.len(), size, "{what}: one reply per request");
            let last_grant = a.iter().rposition(Result::is_ok);
            for (r, (a, b)) in a.iter().zip(&b).enumerate() {
                let what = format!("{what}: request {r} of {size} ({:?})", batch[r]);
                match (a, b) {
                    (Err(a), Value::Int(b)) => {
                        assert_eq!(a, b, "{what}");
                        refused += 1;
                    }
                    (Ok(Some(a)), Value::BulkString(b)) => {
                        assert_eq!(a, b, "{what}");
                        held_ids += usize::from(a.len() > 76);
                        tokens.push(a.clone());
                    }
                    // A grant without its token: one that did not wait
                    // (the token records the reservation's moment, field
                    // 9, as the ticket it found: not ahead of now, field
                    // 6), and not the last.
                    (Ok(None), Value::BulkString(b)) => {
                        let field = |n: usize| {
                            f64::from_le_bytes(b[4 + 8 * (n - 1)..][..8].try_into().unwrap())
                        };
                        assert!(
                            field(9) <= field(6),
                            "{what}: a grant that waits has no token"
                        );
                        assert_ne!(Some(r), last_grant, "{what}: the last grant has no token");
                        untokened += 1;
                    }
                    (a, b) => panic!("{what}: {a:?} against its own call's {b:?}"),
                }
            }
            assert_eq!(a_value, b_value, "{what}: the value");
            same_ttl(a_ttl, b_ttl, started, &what);
            tokens.truncate(200);
            batches += 1;
            requests += size;
        }
    }
    // The mix was what it claims to be.
    assert!(batches > 20 * seeds as usize, "{batches} batches");
    assert!(refused > requests / 50, "{refused} of {requests} refused");
    assert!(
        held_ids > 100,
        "{held_ids} grants with a group in the ledger"
    );
    assert!(
        untokened > 100,
        "{untokened} grants with nothing to give back"
    );
}

#[test]
fn a_bad_batch_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let config = Config {
        rate: "10.0".to_owned(),
        policy: "bursty",
        micros: 1_000_000,
        cold_factor: "0".to_owned(),
    };
    let too_many = vec!["1:-1"; BATCH_CAPACITY + 1].join(",");
    let too_many_runs = format!("1:-1*{BATCH_CAPACITY},1:0");
    for bad in [
        "",
        "1:x",
        "0:-1",
        "1:-2",
        "1",
        "1:-1,,2",
        "-1:0",
        "1++:0",
        "1:-1*0",
        "1:-1*",
        "1:-1*x",
        "1:-1**2",
        &too_many,
        &too_many_runs,
    ] {
        let result: redis::RedisResult<Value> = eval_script(&mut connection, "k", bad, &config);
        let error = result.expect_err(bad).to_string();
        assert!(error.contains("paceline: ARGV[2]"), "{bad}: {error}");
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg("k")
        .query(&mut connection)
        .unwrap();
    assert!(!exists);
    // The largest batch goes.
    let full = vec!["1:-1"; BATCH_CAPACITY].join(",");
    let Value::Array(replies) = eval_script(&mut connection, "k", &full, &config).unwrap() else {
        panic!("an array");
    };
    assert_eq!(own_replies(replies, "full").len(), BATCH_CAPACITY);
    let runs = format!("1:-1*{},2+:0*1", BATCH_CAPACITY - 1);
    let Value::Array(replies) = eval_script(&mut connection, "k", &runs, &config).unwrap() else {
        panic!("an array");
    };
    assert_eq!(own_replies(replies, "runs").len(), BATCH_CAPACITY);
}

fn eval_script(
    connection: &mut redis::Connection,
    key: &str,
    batch: &str,
    config: &Config,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT)
        .arg(1)
        .arg(key)
        .arg("batch")
        .arg(batch)
        .arg(&config.rate)
        .arg(config.policy)
        .arg(config.micros)
        .arg(&config.cold_factor)
        .arg(Duration::from_secs(5).as_micros() as u64);
    cmd.query(connection)
}
