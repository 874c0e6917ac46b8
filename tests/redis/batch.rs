//! The script's batch mode against the same script one call at a time, on
//! one real redis-server with the clock passed in: a batch of requests
//! must leave exactly the key its requests would leave one by one at that
//! clock reading (the value's bytes, log included, and its TTL) and reply,
//! for each request, exactly what its own call would (the same wait, bound
//! and id, or the same refusal), then the state after the last. Random
//! batches of 1 to 1 024 requests mix permits, held reservations, tries
//! that are refused mid-batch, one or two limits of both policies, rate
//! changes and idle gaps between batches, and give-backs of earlier
//! grants. (The script one call at a time is held to the core by the
//! differential test, so a batch is held to the core's fold too.)

use std::time::Duration;

use crate::support::limiter_state::{Reserved, lua_number, script_source};
use crate::support::redis_server::RedisServer;
use crate::support::rng::Rng;
use redis::Value;

/// One limit's arguments.
#[derive(Debug, Clone)]
struct Limit {
    rate: String,
    policy: &'static str,
    micros: u64,
    cold_factor: String,
}

/// The limiter's arguments after ARGV[2]: one or two limits.
#[derive(Debug, Clone)]
struct Config(Vec<Limit>);

impl Limit {
    fn random(rng: &mut Rng) -> Limit {
        let rate = *rng.pick(&["0.5", "2.0", "10.0", "333.0", "1000.0", "1e6", "inf"]);
        if rng.chance(0.3) {
            Limit {
                rate: rate.to_owned(),
                policy: "warming_up",
                micros: 1 + rng.below(3_000_000),
                cold_factor: format!("{:?}", 1.0 + 4.0 * rng.f64()),
            }
        } else {
            Limit {
                rate: rate.to_owned(),
                policy: "bursty",
                micros: rng.below(3_000_000),
                cold_factor: "0".to_owned(),
            }
        }
    }
}

impl Config {
    fn random(rng: &mut Rng) -> Config {
        Config((0..1 + rng.below(2)).map(|_| Limit::random(rng)).collect())
    }

    /// The same limits, some at another rate.
    fn new_rates(&self, rng: &mut Rng) -> Config {
        Config(
            self.0
                .iter()
                .map(|limit| Limit {
                    rate: if rng.chance(0.5) {
                        Limit::random(rng).rate
                    } else {
                        limit.rate.clone()
                    },
                    ..limit.clone()
                })
                .collect(),
        )
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
    cmd.arg(sha).arg(1).arg(key).arg(mode).arg(second);
    for limit in &config.0 {
        cmd.arg(&limit.rate)
            .arg(limit.policy)
            .arg(limit.micros)
            .arg(&limit.cold_factor);
    }
    cmd.arg(now);
    cmd
}

/// Runs `calls` on `key` in one transaction, then reads the key's value and
/// TTL and removes the TTL (the clock here is passed in, not Redis's: a
/// TTL of a few ms must not expire the key between steps). `None` if a key
/// expired meanwhile: Redis's clock runs on between the calls, and a loaded
/// machine can spread a long run of them over more than a key's TTL.
fn transact(
    connection: &mut redis::Connection,
    key: &str,
    calls: Vec<redis::Cmd>,
) -> Option<(Vec<Value>, Option<Vec<u8>>, i64)> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let count = calls.len();
    pipe.cmd("INFO").arg("stats");
    for call in calls {
        pipe.add_command(call);
    }
    pipe.cmd("INFO").arg("stats");
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
    let expired = |info: Option<Value>| -> String {
        let info: String = redis::from_redis_value(info.expect("INFO")).unwrap();
        let line = info.lines().find(|l| l.starts_with("expired_keys:"));
        line.expect("expired_keys").to_owned()
    };
    let after = expired(replies.pop());
    let before = expired(Some(replies.remove(0)));
    assert_eq!(replies.len(), count);
    (before == after).then_some((replies, value, ttl))
}

/// A batch's reply: per request its wait (negated if refused) and, with
/// several limits, the limit that bound it (-1: none); then the next id,
/// the clock and the limits' states after the batch (three doubles each),
/// as a status replies them. Returned per request as its wait, the limit
/// that bound it (one limit: the only one if it waited) and its id (-1:
/// none; the held requests that waited got the ids before the next one,
/// in order); and the clock and states.
fn own_replies(
    reply: &Value,
    limits: usize,
    held: &[bool],
    what: &str,
) -> (Vec<[f64; 3]>, Vec<f64>) {
    let Value::BulkString(bytes) = reply else {
        panic!("{what}: a batch replies one string, got {reply:?}");
    };
    let numbers: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|chunk| f64::from_le_bytes(chunk.try_into().unwrap()))
        .collect();
    let per = if limits > 1 { 2 } else { 1 };
    assert_eq!(bytes.len() % 8, 0, "{what}");
    // (Then, if the key learned anything, what: four numbers and a cap
    // per limit.)
    let base = per * held.len() + 2 + 3 * limits;
    assert!(
        numbers.len() == base || numbers.len() == base + 4 + limits,
        "{what}: {} numbers",
        numbers.len()
    );
    let (replies, tail) = numbers.split_at(per * held.len());
    let ided = |(r, held): (&[f64], &bool)| *held && r[0] > 0.0;
    let ids = replies
        .chunks_exact(per)
        .zip(held)
        .filter(|r| ided(*r))
        .count();
    let mut id = tail[0] - ids as f64;
    let replies = replies
        .chunks_exact(per)
        .zip(held)
        .map(|(r, held)| {
            let bound = match r.get(1) {
                Some(&bound) => bound,
                None if r[0] != 0.0 => 0.0,
                None => -1.0,
            };
            let own = if ided((r, held)) {
                id += 1.0;
                id - 1.0
            } else {
                -1.0
            };
            [r[0], bound, own]
        })
        .collect();
    (replies, tail[1..2 + 3 * limits].to_vec())
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
        .arg(script_source())
        .query(&mut connection)
        .unwrap();
    let capacity = lua_number("BATCH_CAPACITY");
    // `BATCH_SEEDS=500` for a longer run.
    let seeds = std::env::var("BATCH_SEEDS").map_or(60, |s| s.parse().unwrap());
    let (mut batches, mut requests, mut refused, mut held_ids) = (0, 0, 0, 0);
    let mut lessons = 0;
    // A step whose key expired between its calls (a loaded machine): both
    // keys start again, empty.
    let mut restarts = 0;
    let mut restart = |connection: &mut redis::Connection, keys: [&str; 2], ids: &mut Vec<u64>| {
        let _: () = redis::cmd("DEL").arg(&keys[..]).query(connection).unwrap();
        ids.clear();
        restarts += 1;
    };
    for seed in 0..seeds {
        let mut rng = Rng::new(7000 + seed);
        let (batched, single) = (format!("b:{seed}"), format!("s:{seed}"));
        let mut config = Config::random(&mut rng);
        let limits = config.0.len();
        let mut now = 1_000_000 + rng.below(1_000_000);
        // The ids granted so far, the same on both keys.
        let mut ids: Vec<u64> = Vec::new();
        for step in 0..40 {
            let what = format!("seed {seed} step {step} ({config:?})");
            now += match rng.below(6) {
                0 => rng.below(3_000_000),
                1 | 2 => rng.below(2_000),
                _ => 0,
            };
            if rng.chance(0.1) {
                // A rate change between batches.
                config = config.new_rates(&mut rng);
            }
            if rng.chance(0.15) && !ids.is_empty() {
                // A give-back of an earlier grant, on both keys.
                let id = ids
                    .swap_remove(rng.below(ids.len() as u64) as usize)
                    .to_string();
                let cancel =
                    |key: &str| vec![eval(&sha, key, "give_back", id.as_bytes(), &config, now)];
                let started = std::time::Instant::now();
                let a = transact(&mut connection, &batched, cancel(&batched));
                let b = transact(&mut connection, &single, cancel(&single));
                let (Some(a), Some(b)) = (a, b) else {
                    restart(&mut connection, [&batched, &single], &mut ids);
                    continue;
                };
                assert_eq!(
                    (&a.0, live(&a.1)),
                    (&b.0, live(&b.1)),
                    "{what}: a give-back"
                );
                same_ttl(a.2, b.2, started, &what);
                continue;
            }
            if rng.chance(0.12) {
                // A lesson learned from an upstream (a pause, lower or
                // higher rates, caps) or an open call, on both keys.
                let (mode, second) = if rng.chance(0.8) {
                    ("learn", random_lesson(&mut rng, limits))
                } else {
                    let counts: Vec<String> = (0..limits)
                        .map(|_| (1 + rng.below(4)).to_string())
                        .collect();
                    let timeout = if rng.chance(0.5) {
                        -1
                    } else {
                        rng.below(50_000) as i64
                    };
                    ("call", format!("{}:{timeout}", counts.join(",")))
                };
                let call = |key: &str| vec![eval(&sha, key, mode, second.as_bytes(), &config, now)];
                let started = std::time::Instant::now();
                let a = transact(&mut connection, &batched, call(&batched));
                let b = transact(&mut connection, &single, call(&single));
                let (Some(a), Some(b)) = (a, b) else {
                    restart(&mut connection, [&batched, &single], &mut ids);
                    continue;
                };
                // (Their replies carry the value's head, whose count of
                // dead requests may differ: see below.)
                assert_eq!(live(&a.1), live(&b.1), "{what}: a {mode} {second}");
                same_ttl(a.2, b.2, started, &what);
                lessons += 1;
                continue;
            }
            let size = match rng.below(20) {
                0 => 1 + rng.below(capacity as u64) as usize,
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
            let a = transact(
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
            let b = transact(&mut connection, &single, calls);
            let (Some((mut a, a_value, a_ttl)), Some((b, b_value, b_ttl))) = (a, b) else {
                restart(&mut connection, [&batched, &single], &mut ids);
                continue;
            };
            let held: Vec<bool> = batch.iter().map(|(p, _)| p.ends_with('+')).collect();
            let (replies, after) = own_replies(&a.pop().unwrap(), limits, &held, &what);
            assert_eq!(replies.len(), size, "{what}: one reply per request");
            for (r, (a, b)) in replies.iter().zip(&b).enumerate() {
                let what = format!("{what}: request {r} of {size} ({:?})", batch[r]);
                match Reserved::from_reply(b, limits)
                    .unwrap_or_else(|e| panic!("{what}: its own call: {e}"))
                {
                    Reserved::Granted {
                        wait, bound, value, ..
                    } => {
                        let held = batch[r].0.ends_with('+') && wait > 0;
                        let id = if held { value.next_id - 1.0 } else { -1.0 };
                        assert_eq!(a, &[wait as f64, bound as f64, id], "{what}");
                        if held {
                            ids.push(id as u64);
                            held_ids += 1;
                        }
                    }
                    refusal @ Reserved::Refused { .. } => {
                        let wait = refusal.refused_wait().unwrap();
                        assert_eq!((a[0], a[2]), (-(wait as f64), -1.0), "{what}");
                        refused += 1;
                    }
                }
            }
            // (The calls one by one may leave requests that left the log
            // in the value, dead: a batch writes it whole.)
            assert_eq!(live(&a_value), live(&b_value), "{what}: the value");
            if let Some(value) = &b_value {
                // The state after the batch is the key's.
                let stored = crate::support::limiter_state::Value::decode(value).unwrap();
                let fields: Vec<f64> = stored
                    .limits
                    .iter()
                    .flat_map(|l| [l.stored_permits, l.next_free_micros, l.next_free_fraction])
                    .collect();
                if replies.iter().any(|r| r[0] >= 0.0) {
                    assert_eq!(after[0], stored.last_now_micros, "{what}: the clock after");
                    assert_eq!(after[1..], fields[..], "{what}: the state after");
                }
            }
            same_ttl(a_ttl, b_ttl, started, &what);
            ids.truncate(200);
            batches += 1;
            requests += size;
        }
    }
    if restarts > 0 {
        println!("{restarts} steps found a key expired between its calls, and started again");
    }
    // The mix was what it claims to be.
    assert!(batches > 20 * seeds as usize, "{batches} batches");
    assert!(refused > requests / 50, "{refused} of {requests} refused");
    assert!(held_ids > 100, "{held_ids} grants with an id");
    assert!(
        lessons > 2 * seeds as usize,
        "{lessons} lessons and open calls"
    );
}

/// A learn's ARGV[2]: a refusal or a success, its `Retry-After`, the
/// constants, and what the upstream reported of some of the `limits`.
fn random_lesson(rng: &mut Rng, limits: usize) -> String {
    let some = |rng: &mut Rng, chance: f64, below: u64| {
        if rng.chance(chance) {
            rng.below(below).to_string()
        } else {
            String::new()
        }
    };
    let (throttled, success) = *rng.pick(&[(1, 0), (0, 1), (0, 1), (0, 0)]);
    let retry_after = some(rng, 0.5, 3_000_000);
    let decrease = 0.1 + 0.9 * rng.f64();
    let increase = *rng.pick(&["0", "0.05", "1"]);
    let interval = *rng.pick(&[1_000, 1_000_000]);
    let floor = *rng.pick(&["0.05", "0.5", "1"]);
    let pause = *rng.pick(&[0, 1_000, 1_000_000]);
    let margin = *rng.pick(&["1", "0.5"]);
    let sent_ago = some(rng, 0.5, 3_000_000);
    let mut text = format!(
        "{throttled},{success},{retry_after},{decrease},{increase},{interval},{floor},{pause},{margin},{sent_ago}"
    );
    for _ in 0..rng.below(limits as u64 + 1) {
        let rate = *rng.pick(&["", "", "5e-1", "2e1", "1e3"]);
        let remaining = some(rng, 0.6, 4);
        let reset = some(rng, 0.6, 5_000_000);
        text.push_str(&format!(";{rate},{remaining},{reset}"));
    }
    text
}

#[test]
fn a_bad_batch_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let config = Config(vec![Limit {
        rate: "10.0".to_owned(),
        policy: "bursty",
        micros: 1_000_000,
        cold_factor: "0".to_owned(),
    }]);
    let capacity = lua_number("BATCH_CAPACITY");
    let too_many = vec!["1:-1"; capacity + 1].join(",");
    let too_many_runs = format!("1:-1*{capacity},1:0");
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
    let full = vec!["1:-1"; capacity].join(",");
    let reply = eval_script(&mut connection, "k", &full, &config).unwrap();
    let plain = vec![false; capacity];
    assert_eq!(own_replies(&reply, 1, &plain, "full").0.len(), capacity);
    let runs = format!("1:-1*{},2+:0*1", capacity - 1);
    let reply = eval_script(&mut connection, "k", &runs, &config).unwrap();
    let mut held = plain;
    held[capacity - 1] = true;
    assert_eq!(own_replies(&reply, 1, &held, "runs").0.len(), capacity);
}

fn eval_script(
    connection: &mut redis::Connection,
    key: &str,
    batch: &str,
    config: &Config,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script_source())
        .arg(1)
        .arg(key)
        .arg("batch")
        .arg(batch);
    for limit in &config.0 {
        cmd.arg(&limit.rate)
            .arg(limit.policy)
            .arg(limit.micros)
            .arg(&limit.cold_factor);
    }
    cmd.arg(Duration::from_secs(5).as_micros() as u64);
    cmd.query(connection)
}

/// A value without the requests that left its log.
fn live(value: &Option<Vec<u8>>) -> Option<crate::support::limiter_state::Value> {
    value.as_ref().map(|bytes| {
        let mut value = crate::support::limiter_state::Value::decode(bytes).unwrap();
        value.dead.clear();
        value
    })
}
