//! The several-limits script against the core's `Limits`, reply by reply,
//! on one real redis-server with the clock passed in: random limits of both
//! policies, reservations (held or not), tries, queries, give-backs, rate
//! changes, carry-backs from a fallback (resume), probes, batches (several
//! requests in one call, as they would go one by one) and idle gaps. Waits, the limit that bound each, refusals and
//! give-backs must agree exactly, and so must the states the script
//! stores, field by field. Also: bad arguments and a corrupted value are
//! clear errors that write nothing.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::rng::Rng;
use paceline::Local;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};
use paceline::redis::format::{SEVERAL_LOG_CAPACITY, SEVERAL_SCRIPT};
use redis::Value;

/// One limit's configuration, as the script takes it.
#[derive(Debug, Clone, Copy)]
struct Config {
    rate: f64,
    bursty: bool,
    micros: u64,
    cold_factor: f64,
}

impl Config {
    fn random(rng: &mut Rng) -> Config {
        let rate = *rng.pick(&[0.5, 2.0, 10.0, 333.0, 1000.0, 1e6, f64::INFINITY]);
        if rng.chance(0.3) {
            Config {
                rate,
                bursty: false,
                micros: 1 + rng.below(3_000_000),
                cold_factor: 1.0 + 4.0 * rng.f64(),
            }
        } else {
            Config {
                rate,
                bursty: true,
                micros: rng.below(3_000_000),
                cold_factor: 0.0,
            }
        }
    }

    fn policy(&self) -> Policy {
        if self.bursty {
            Policy::Bursty(Bursty::new(Duration::from_micros(self.micros)))
        } else {
            Policy::WarmingUp(WarmingUp::new(
                Duration::from_micros(self.micros),
                self.cold_factor,
            ))
        }
    }

    /// The limit full at `now`, as a missing key reads.
    fn full(&self, now: u64) -> State {
        State::full(self.policy(), self.rate, now).unwrap()
    }
}

/// A number as the script reads it back exactly.
fn text(value: f64) -> String {
    if value.is_infinite() {
        "inf".to_owned()
    } else {
        format!("{value:?}")
    }
}

struct Script {
    script: redis::Script,
    connection: redis::Connection,
}

impl Script {
    fn call(&mut self, key: &str, first: &str, second: i64, limits: &[Config], now: u64) -> Value {
        self.call_with(key, first, &second.to_string(), limits, now)
    }

    fn call_with(
        &mut self,
        key: &str,
        first: &str,
        second: &str,
        limits: &[Config],
        now: u64,
    ) -> Value {
        let mut invocation = self.script.key(key);
        invocation.arg(first).arg(second).arg(limits.len());
        for limit in limits {
            invocation
                .arg(text(limit.rate))
                .arg(if limit.bursty { "bursty" } else { "warming_up" })
                .arg(limit.micros)
                .arg(text(limit.cold_factor));
        }
        invocation.arg(now);
        // The TTL the script sets is computed for the simulated clock and
        // runs on the real one, a few milliseconds for a key that refills
        // fast: the call and the PERSIST go in one MULTI/EXEC, so that a
        // loaded machine cannot expire the key between them.
        invocation.load(&mut self.connection).unwrap();
        let (reply,): (Value,) = redis::pipe()
            .atomic()
            .invoke_script(&invocation)
            .cmd("PERSIST")
            .arg(key)
            .ignore()
            .query(&mut self.connection)
            .unwrap();
        reply
    }
}

fn ints(value: &Value) -> Vec<i64> {
    match value {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Int(n) => *n,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// The states the script stored, as (stored, ticket, fraction); `None`
/// if the key is missing.
fn stored_states(
    connection: &mut redis::Connection,
    key: &str,
    n: usize,
) -> Option<Vec<(f64, u64, u32)>> {
    let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(connection).unwrap();
    let value = value?;
    assert_eq!(&value[..4], b"thr4");
    let field = |at: usize| f64::from_le_bytes(value[at..at + 8].try_into().unwrap());
    (0..n)
        .map(|i| {
            let at = 44 + 40 * i;
            (field(at), field(at + 8) as u64, field(at + 16) as u32)
        })
        .collect::<Vec<_>>()
        .into()
}

#[test]
fn the_script_and_the_core_agree_call_by_call() {
    let server = RedisServer::start();
    let mut script = Script {
        script: redis::Script::new(SEVERAL_SCRIPT),
        connection: server.connection(),
    };
    // `SEVERAL_SEEDS=2000` for a longer run.
    let seeds = std::env::var("SEVERAL_SEEDS").map_or(150, |s| s.parse().unwrap());
    for seed in 0..seeds {
        let mut rng = Rng::new(1000 + seed);
        let key = format!("several:{seed}");
        let count = 2 + rng.below(3) as usize;
        let mut limits: Vec<Config> = (0..count).map(|_| Config::random(&mut rng)).collect();
        let mut now = 1_000_000 + rng.below(1_000_000);
        let mut core: Option<Limits> = None;
        // The held reservations on both sides: (script id, core id).
        let mut held: Vec<(i64, u64)> = Vec::new();
        for step in 0..120 {
            now += match rng.below(10) {
                0 => rng.below(5_000_000),
                1..=4 => 0,
                _ => rng.below(200_000),
            };
            let core = core.get_or_insert_with(|| {
                let states = limits.iter().map(|l| l.full(now)).collect();
                Limits::with_capacity(states, SEVERAL_LOG_CAPACITY).unwrap()
            });
            let what = format!("seed {seed} step {step} at {now}, limits {limits:?}");
            match rng.below(10) {
                0 => {
                    // A rate change, applied by the next reservation.
                    let index = rng.below(count as u64) as usize;
                    let rate = *rng.pick(&[0.25, 1.0, 7.0, 500.0, 1e-3, f64::INFINITY]);
                    limits[index].rate = rate;
                    let exists: bool = redis::cmd("EXISTS")
                        .arg(&key)
                        .query(&mut script.connection)
                        .unwrap();
                    if exists {
                        core.set_rate(Some(index), rate, now).unwrap();
                    } else {
                        // A missing key knows no earlier rate: it reads as
                        // full at the new one.
                        let states = limits.iter().map(|l| l.full(now)).collect();
                        *core = Limits::with_capacity(states, SEVERAL_LOG_CAPACITY).unwrap();
                    }
                    let reply = ints(&script.call(&key, "1", -1, &limits, now));
                    let granted = core.reserve(1, now, false);
                    assert_eq!(reply[1], granted.wait_micros as i64, "{what}");
                    held.clear();
                }
                1 if !held.is_empty() => {
                    let (script_id, core_id) = held.remove(rng.below(held.len() as u64) as usize);
                    let reply = ints(&script.call(&key, "cancel", script_id, &limits, now));
                    let took = core.give_back(core_id, now);
                    assert_eq!(reply, vec![i64::from(took)], "{what}: give-back");
                }
                3 if rng.chance(0.2) => {
                    // Back from a fallback: a debt per limit.
                    let debts: Vec<u64> = (0..count).map(|_| rng.below(2_000_000)).collect();
                    let text: Vec<String> = debts.iter().map(u64::to_string).collect();
                    let reply =
                        ints(&script.call_with(&key, "resume", &text.join(","), &limits, now));
                    core.resume(&debts, now);
                    let (moment, bound) = core.earliest(now);
                    let bound = bound.map_or(-1, |b| b as i64);
                    assert_eq!(
                        reply,
                        vec![1, (moment - now) as i64, bound, -1, (moment - now) as i64],
                        "{what}: resume"
                    );
                    held.clear();
                }
                4 if rng.chance(0.2) => {
                    let existed: bool = redis::cmd("EXISTS")
                        .arg(&key)
                        .query(&mut script.connection)
                        .unwrap();
                    let reply = ints(&script.call(&key, "probe", -1, &limits, now));
                    let (moment, bound) = core.earliest(now);
                    let bound = bound.map_or(-1, |b| b as i64);
                    assert_eq!(
                        reply,
                        vec![1, (moment - now) as i64, bound, -1, (moment - now) as i64],
                        "{what}: probe"
                    );
                    if !existed {
                        // Written as it read, full as of now: the same
                        // limits as the core's, full since earlier.
                        assert!(core.reads_as_full(now), "{what}: probe of a missing key");
                        let states = limits.iter().map(|l| l.full(now)).collect();
                        *core = Limits::with_capacity(states, SEVERAL_LOG_CAPACITY).unwrap();
                    }
                }
                5 if rng.chance(0.3) => {
                    // A batch: the same as its requests one by one at one
                    // clock reading.
                    let runs = 1 + rng.below(20) as usize;
                    let mut text = Vec::new();
                    let mut expected = Vec::new();
                    for _ in 0..runs {
                        // Sometimes a run of the same request, `*count`.
                        let times = if rng.chance(0.2) { 2 + rng.below(4) } else { 1 };
                        let permits = 1 + rng.below(3) as u32;
                        let is_held = rng.chance(0.5);
                        let timeout = if rng.chance(0.5) {
                            -1
                        } else {
                            rng.below(2_000_000) as i64
                        };
                        text.push(format!(
                            "{permits}{}:{timeout}{}",
                            if is_held { "+" } else { "" },
                            if times > 1 {
                                format!("*{times}")
                            } else {
                                String::new()
                            }
                        ));
                        for _ in 0..times {
                            expected.push(if timeout < 0 {
                                Some(core.reserve(permits, now, is_held))
                            } else {
                                core.try_reserve(permits, now, timeout as u64, is_held)
                            });
                        }
                    }
                    let size = expected.len();
                    let reply =
                        ints(&script.call_with(&key, "batch", &text.join(","), &limits, now));
                    assert_eq!(reply.len(), 4 * size + 1, "{what}: batch reply");
                    for (r, granted) in expected.iter().enumerate() {
                        let entry = &reply[4 * r..4 * r + 4];
                        match granted {
                            Some(g) => {
                                let bound = g.bound_by.map_or(-1, |b| b as i64);
                                assert_eq!(
                                    entry[..3],
                                    [1, g.wait_micros as i64, bound],
                                    "{what}: batch {r}"
                                );
                                assert_eq!(entry[3] >= 0, g.id.is_some(), "{what}: batch {r} id");
                                if let Some(id) = g.id {
                                    held.push((entry[3], id));
                                }
                            }
                            None => assert_eq!(entry[0], 0, "{what}: batch {r} refused"),
                        }
                    }
                    let after = core.earliest(now).0 - now;
                    assert_eq!(reply[4 * size], after as i64, "{what}: batch debt");
                }
                2 => {
                    let reply = ints(&script.call(&key, "0", -1, &limits, now));
                    let (moment, bound) = core.earliest(now);
                    let bound = bound.map_or(-1, |b| b as i64);
                    assert_eq!(
                        reply,
                        vec![1, (moment - now) as i64, bound, -1, (moment - now) as i64],
                        "{what}: query"
                    );
                }
                _ => {
                    let permits = 1 + rng.below(4) as u32;
                    let is_held = rng.chance(0.5);
                    let timeout = if rng.chance(0.5) {
                        -1
                    } else {
                        rng.below(3_000_000) as i64
                    };
                    let first = format!("{permits}{}", if is_held { "+" } else { "" });
                    let reply = ints(&script.call(&key, &first, timeout, &limits, now));
                    let expected = if timeout < 0 {
                        Some(core.reserve(permits, now, is_held))
                    } else {
                        core.try_reserve(permits, now, timeout as u64, is_held)
                    };
                    match expected {
                        Some(granted) => {
                            let bound = granted.bound_by.map_or(-1, |b| b as i64);
                            assert_eq!(
                                reply[..3],
                                [1, granted.wait_micros as i64, bound],
                                "{what}"
                            );
                            assert_eq!(reply[3] >= 0, granted.id.is_some(), "{what}: id");
                            if let Some(id) = granted.id {
                                held.push((reply[3], id));
                            }
                            let after = core.earliest(now).0 - now;
                            assert_eq!(reply[4], after as i64, "{what}: debt after");
                        }
                        None => assert_eq!(reply[0], 0, "{what}: refused"),
                    }
                }
            }
            let Some(stored) = stored_states(&mut script.connection, &key, count) else {
                // Never written: it reads as full, and so must the core.
                assert!(core.reads_as_full(now), "{what}: missing key");
                continue;
            };
            for (i, state) in core.states().iter().enumerate() {
                let (stored_permits, ticket, fraction) = stored[i];
                assert_eq!(
                    (stored_permits.to_bits(), ticket, fraction),
                    (
                        state.stored_permits().to_bits(),
                        state.next_free_micros(),
                        state.next_free_fraction()
                    ),
                    "{what}: limit {i} stored {stored_permits} vs {}",
                    state.stored_permits()
                );
            }
        }
    }
}

#[test]
fn bad_arguments_and_a_corrupted_value_are_errors_that_write_nothing() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let script = redis::Script::new(SEVERAL_SCRIPT);
    let call = |connection: &mut redis::Connection, args: &[&str]| -> redis::RedisResult<Value> {
        let mut invocation = script.key("bad");
        for arg in args {
            invocation.arg(*arg);
        }
        invocation.invoke(connection)
    };
    let limit = ["10.0", "bursty", "1000000", "0"];
    let two = |first: &str, second: &str| {
        let mut args = vec![first.to_owned(), second.to_owned(), "2".to_owned()];
        args.extend(limit.iter().map(|s| (*s).to_owned()));
        args.extend(limit.iter().map(|s| (*s).to_owned()));
        args
    };
    for args in [
        two("0+", "-1"),
        two("-1", "-1"),
        two("x", "-1"),
        two("1", "nan"),
        vec![
            "1".into(),
            "-1".into(),
            "1".into(),
            "1.0".into(),
            "bursty".into(),
            "0".into(),
            "0".into(),
        ],
        {
            let mut a = two("1", "-1");
            a[3] = "0".into();
            a
        },
        {
            let mut a = two("1", "-1");
            a[4] = "fast".into();
            a
        },
        {
            let mut a = two("1", "-1");
            a.pop();
            a
        },
        two("batch", ""),
        two("batch", "1:x"),
        two("batch", "0:-1"),
        two("batch", "1:-1,,2"),
        two("batch", &vec!["1:-1"; 1025].join(",")),
        two("batch", "1:-1*1025"),
        two("batch", "1:-1*0"),
        two("batch", "1:-1*"),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let error = call(&mut connection, &args).unwrap_err();
        assert!(error.to_string().contains("paceline"), "{args:?}: {error}");
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg("bad")
        .query(&mut connection)
        .unwrap();
    assert!(!exists, "a refused call wrote the key");

    // A value this script did not write is left alone, with an error.
    for corrupt in [b"thr2garbage".to_vec(), vec![0u8; 44], b"thr4".repeat(30)] {
        let _: () = redis::cmd("SET")
            .arg("bad")
            .arg(&corrupt)
            .query(&mut connection)
            .unwrap();
        let args = two("1", "-1");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let error = call(&mut connection, &args).unwrap_err();
        assert!(error.to_string().contains("does not recognise"), "{error}");
        let after: Vec<u8> = redis::cmd("GET").arg("bad").query(&mut connection).unwrap();
        assert_eq!(after, corrupt);
    }
}

/// A key written by the one-limit script, or by this one with another
/// number of limits, is read, not refused: its limits by position, the
/// others full.
#[test]
fn older_values_are_read_as_the_first_limits() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let single = redis::Script::new(paceline::redis::format::SCRIPT);
    let t0: u64 = 5_000_000;
    for _ in 0..2 {
        let _: redis::Value = single
            .key("upgraded")
            .arg("1")
            .arg("-1")
            .arg("10.0")
            .arg("bursty")
            .arg("0")
            .arg("0")
            .arg(t0)
            .invoke(&mut connection)
            .unwrap();
    }
    let mut script = Script {
        script: redis::Script::new(SEVERAL_SCRIPT),
        connection,
    };
    let ten = Config {
        rate: 10.0,
        bursty: true,
        micros: 0,
        cold_factor: 0.0,
    };
    let one = Config { rate: 1.0, ..ten };
    // The one-limit key's ticket (t0 + 200 ms) is the first limit's.
    let reply = ints(&script.call("upgraded", "1", -1, &[ten, one], t0));
    assert_eq!(reply, vec![1, 200_000, 0, -1, 1_200_000]);
    let states = stored_states(&mut script.connection, "upgraded", 2).unwrap();
    assert_eq!((states[0].1, states[1].1), (t0 + 300_000, t0 + 1_200_000));
    // A third limit joins full; back to two, the third is dropped.
    let half = Config { rate: 0.5, ..ten };
    let reply = ints(&script.call("upgraded", "1", -1, &[ten, one, half], t0));
    assert_eq!(reply, vec![1, 1_200_000, 1, -1, 3_200_000]);
    let reply = ints(&script.call("upgraded", "0", -1, &[ten, one], t0));
    assert_eq!(reply, vec![1, 2_200_000, 1, -1, 2_200_000]);
}

mod limiters {
    //! The Redis limiters built with several limits: the same rules as
    //! locally, shared through one key, and across an outage.

    use std::time::Duration;

    use crate::support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK, backend, within};
    use crate::support::redis_server::RedisServer;
    use paceline::Limit;
    use paceline::redis::{Fallback, RedisRateLimiter};

    const S: Duration = Duration::from_secs(1);

    fn close(got: Duration, expected: Duration) -> bool {
        got <= expected && expected - got <= Duration::from_millis(200)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_limiter_waits_for_the_latest_limit_and_gives_back_to_all() {
        let server = RedisServer::start();
        let limiter = RedisRateLimiter::builder(server.client(), "several")
            .limit(Limit::per_second(100.0).burst(1))
            .limit(Limit::per_minute(6.0).burst(2))
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .await
            .unwrap();
        // The per-minute limit starts with its one stored permit, the
        // per-second one with none: the first goes at once, the second
        // waits 10 ms (per second) and is charged 10 s per minute.
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        let second = limiter.reserve(1).await.unwrap();
        assert!(second <= Duration::from_millis(10), "{second:?}");
        let held = limiter.reservation(1).await.unwrap();
        assert!(close(held.delay(), 10 * S), "{:?}", held.delay());
        assert_eq!(held.limit(), Some(1));
        assert!(close(limiter.available_in().await.unwrap(), 20 * S));
        // Refused: nothing charged.
        assert_eq!(limiter.try_reserve(1, S).await.unwrap(), None);
        assert!(close(limiter.available_in().await.unwrap(), 20 * S));
        // Given back in the background, to both limits.
        drop(held);
        let mut wait = limiter.available_in().await.unwrap();
        for _ in 0..100 {
            if close(wait, 10 * S) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            wait = limiter.available_in().await.unwrap();
        }
        assert!(close(wait, 10 * S), "{wait:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_limit_s_rate_changes_alone_or_all_scale() {
        let server = RedisServer::start();
        let limiter = RedisRateLimiter::builder(server.client(), "several-rates")
            .limit(Limit::per_second(100.0).burst(1))
            .limit(Limit::per_minute(6.0).burst(1))
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .await
            .unwrap();
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        // One a second instead of one per 10 s: the debt already owed stays.
        limiter.set_limit_rate(1, 1.0).unwrap();
        assert_eq!(limiter.rate(), 100.0);
        let wait = limiter.reserve(1).await.unwrap();
        assert!(close(wait, 10 * S), "{wait:?}");
        assert!(close(limiter.available_in().await.unwrap(), 11 * S));
        // Halving the first halves them all: 2 s apart now.
        limiter.set_rate(50.0).unwrap();
        let wait = limiter.reserve(1).await.unwrap();
        assert!(close(wait, 11 * S), "{wait:?}");
        assert!(close(limiter.available_in().await.unwrap(), 13 * S));
        assert!(limiter.set_limit_rate(2, 1.0).is_err());
        assert!(limiter.set_limit_rate(0, f64::NAN).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keyed_redis_limiter_keeps_every_limit_per_key() {
        let server = RedisServer::start();
        let backend = backend(server.client()).await;
        let limiter = backend
            .keyed_limiter::<String>("several-keyed")
            .limit(Limit::per_second(10.0).burst(3))
            .limit(Limit::per_hour(3.0).burst(4))
            .build()
            .unwrap();
        // Each key starts full: 2 at once per second, 3 an hour. Three go
        // at once, the fourth 100 ms later (charged a third of the hour),
        // the fifth not within a second.
        for _ in 0..3 {
            let granted = limiter.try_reserve("a", 1, Duration::ZERO).await.unwrap();
            assert_eq!(granted, Some(Duration::ZERO));
        }
        let fourth = limiter.try_reserve("a", 1, S).await.unwrap().unwrap();
        assert!(fourth <= Duration::from_millis(100), "{fourth:?}");
        assert_eq!(limiter.try_reserve("a", 1, S).await.unwrap(), None);
        let other = limiter.try_reserve("b", 1, Duration::ZERO).await.unwrap();
        assert_eq!(other, Some(Duration::ZERO));
        let wait = limiter.available_in("a").await.unwrap();
        assert!(close(wait, 1200 * S), "{wait:?}");
    }

    /// Redis killed: the fallback serves every limit locally (at their
    /// share), and after the restart each limit's debt is carried back, so
    /// the key does not open with a burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_is_served_locally_and_every_limit_carried_back() {
        let mut server = RedisServer::start();
        let limiter = RedisRateLimiter::builder(server.client(), "several-outage")
            .limit(Limit::per_second(1000.0).burst(1))
            .limit(Limit::per_minute(60.0).burst(1))
            .fallback(Fallback::Local)
            .response_timeout(RESPONSE_TIMEOUT)
            .probe_interval(PROBE_INTERVAL)
            .build()
            .await
            .unwrap();
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        server.kill();
        // Served locally: the per-minute limit binds (1 s apart), and the
        // key opens at the debt Redis reported (1 s).
        let first = limiter.reserve(1).await.unwrap();
        assert!(limiter.is_degraded());
        assert!(first <= S + SLACK, "{first:?}");
        let second = limiter.reserve(1).await.unwrap();
        assert!(second > first && second <= 2 * S + SLACK, "{second:?}");
        server.restart();
        within(5 * S, || !limiter.is_degraded())
            .await
            .expect("back on Redis");
        // The fallback's grants were carried into Redis: the next waits
        // behind them, per minute, as if Redis had granted them.
        let after = limiter.available_in().await.unwrap();
        println!("fallback waits {first:?}, {second:?}; after the carry-back {after:?}");
        assert!(after >= S, "carried back: {after:?}");
        assert!(after <= 3 * S + SLACK, "{after:?}");
    }
}

mod shared {
    //! Three processes' worth of limiters (three backends, three
    //! connections) share one key with two limits: in every sliding
    //! window, the grants stay within each limit.

    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crate::support::poll::backend;
    use crate::support::redis_server::RedisServer;
    use paceline::Limit;

    /// Each limit: (permits per second, burst).
    const LIMITS: [(f64, f64); 2] = [(100.0, 10.0), (30.0, 20.0)];
    const RUN: Duration = Duration::from_secs(2);
    /// Wake-ups run late, never early: grants can bunch up by that much.
    const JITTER: Duration = Duration::from_millis(25);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_processes_on_one_key_never_over_grant_any_limit() {
        let server = RedisServer::start();
        let grants = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let mut tasks = Vec::new();
        let mut backends = Vec::new();
        for _ in 0..3 {
            let backend = backend(server.client()).await;
            let limiter = Arc::new(
                backend
                    .limiter("shared-quota")
                    .limit(Limit::per_second(LIMITS[0].0).burst(LIMITS[0].1 as u64 + 1))
                    .limit(Limit::per(60.0, Duration::from_secs(2)).burst(LIMITS[1].1 as u64 + 1))
                    .build()
                    .unwrap(),
            );
            for _ in 0..4 {
                let limiter = Arc::clone(&limiter);
                let grants = Arc::clone(&grants);
                tasks.push(tokio::spawn(async move {
                    while start.elapsed() < RUN {
                        limiter.acquire(1).await.unwrap();
                        grants.lock().unwrap().push(start.elapsed());
                    }
                }));
            }
            backends.push(backend);
        }
        for task in tasks {
            task.await.unwrap();
        }
        drop(backends);
        let mut grants = grants.lock().unwrap().clone();
        grants.sort();
        // Over the run: the second limit's burst and rate, plus what the
        // last requests reserved past the end.
        let total = grants.len() as f64;
        let most = LIMITS[1].1 + LIMITS[1].0 * (RUN + JITTER).as_secs_f64() + 12.0;
        assert!(total <= most, "{total} grants in {RUN:?}, at most {most}");
        assert!(
            total >= LIMITS[1].0 * RUN.as_secs_f64() * 0.8,
            "{total} grants: too few"
        );
        for (rate, burst) in LIMITS {
            for (a, &first) in grants.iter().enumerate() {
                for (b, &last) in grants.iter().enumerate().skip(a) {
                    let window = (last - first + JITTER).as_secs_f64();
                    let allowed = burst + rate * window + 2.0;
                    let count = (b - a + 1) as f64;
                    assert!(
                        count <= allowed,
                        "{count} grants within {:?} at {rate}/s, burst {burst}",
                        last - first
                    );
                }
            }
        }
    }
}
