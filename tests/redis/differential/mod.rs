//! Differential test: the script (`lua/`) in Redis and `paceline::core::Limits`
//! in Rust, with one to three limits, driven by the same random sequences
//! of reservations (held or not), tries, batches, statuses,
//! probes, resumes, give-backs of earlier reservations, rate changes (of
//! one limit or all) and clock jumps (forwards and backwards), must give
//! the same replies (waits, bounds, ids, refusals, debts, states) and the
//! same value, bit for bit: each limit's state, the clock, the ids, the
//! record of the last grant, the log and the TTL bookkeeping. With one
//! limit `Limits` is `core::State` itself, so this holds the script to the
//! core's arithmetic too (see `model.rs` for what is modelled beside it).
//!
//! The script runs with an explicit `now`, so both sides see the same
//! clock. The TTL it sets is computed for that simulated clock, so real
//! time must not expire the key: each sequence is one MULTI/EXEC block (no
//! expiry between its commands), and every write that sets a TTL is
//! followed by a check of that TTL and a PERSIST. A write that must keep
//! the TTL it finds, and a step that must not write, are then checked to
//! have left no TTL behind. The rates include many whose interval is not a
//! whole microsecond, or is below one, so that fractions are exercised.
//!
//! Besides the mixed sequences, a give-back profile builds a queue of held
//! reservations and gives them back in random order while the clock creeps
//! through the queue, a deep one queues more than the log holds, and a
//! calls profile mixes open calls with a count per limit, their settles
//! (while the log holds them, and after it let them go), keeps and
//! give-backs, and lessons learned (`calls.rs`), among the rest: what the
//! limits learned is compared too.
//!
//! Replay one sequence with
//! `PACELINE_DIFF_SEED=<seed> cargo test --all-features --test redis differential -- --nocapture`;
//! `PACELINE_DIFF_SEQUENCES=<n>` changes how many sequences run.

mod argv;
mod calls;
mod model;
mod sequence;
mod totals;

use std::time::Instant;

use crate::support::limiter_state::Value as Stored;
use crate::support::redis_server::RedisServer;
use model::{LOG_CAPACITY, micros};
use redis::Value;
use sequence::{Expect, Sequence, generate};
use totals::Totals;

const SEQUENCES: u64 = 1_500;
const BASE_SEED: u64 = 0x5EED_0000;
/// Seeds from here on generate the give-back profile: one such sequence
/// for every 4 of the mixed profile.
pub const GIVE_BACK_SEED: u64 = 0x6B0B_0000;
/// Seeds from here on generate the deep profile: more held reservations
/// than the log holds, then give-backs; one for every 20 of the mixed
/// profile.
pub const DEEP_SEED: u64 = 0x7DEE_0000;
/// Seeds from here on generate the calls profile (see `calls.rs`); one for
/// every 3 of the mixed profile.
pub const CALLS_SEED: u64 = 0x8CA1_0000;

/// Compares one number bit for bit.
fn same_bits(name: &str, script: f64, core: f64) -> Result<(), String> {
    if script.to_bits() == core.to_bits() {
        Ok(())
    } else {
        Err(format!("{name}: script {script:e}, core {core:e}"))
    }
}

fn doubles(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|chunk| f64::from_le_bytes(chunk.try_into().unwrap()))
        .collect()
}

fn int_of(value: &Value) -> Result<i64, String> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(format!("expected an integer reply, got {other:?}")),
    }
}

/// The states a reply carries (three doubles per limit, at the rates in
/// force) against the core's.
fn same_states(script: &[f64], core: &[paceline::core::State]) -> Result<(), String> {
    if script.len() != 3 * core.len() {
        return Err(format!(
            "{} numbers for {} limits",
            script.len(),
            core.len()
        ));
    }
    for (i, (fields, state)) in script.chunks_exact(3).zip(core).enumerate() {
        same_bits(
            &format!("limit {i} stored"),
            fields[0],
            state.stored_permits(),
        )?;
        same_bits(
            &format!("limit {i} ticket"),
            fields[1],
            state.next_free_micros() as f64,
        )?;
        same_bits(
            &format!("limit {i} fraction"),
            fields[2],
            f64::from(state.next_free_fraction()),
        )?;
    }
    Ok(())
}

/// The rate and max_permits of each limit of a value against the core's.
fn same_rates(value: &Stored, core: &[paceline::core::State]) -> Result<(), String> {
    for (i, (limit, state)) in value.limits.iter().zip(core).enumerate() {
        same_bits(
            &format!("limit {i} rate"),
            limit.permits_per_second,
            state.permits_per_second(),
        )?;
        same_bits(
            &format!("limit {i} max"),
            limit.max_permits,
            state.max_permits(),
        )?;
    }
    Ok(())
}

/// Checks one reply against what the core expects.
fn check_reply(reply: &Value, expect: &Expect, limits: usize) -> Result<(), String> {
    match (expect, reply) {
        (Expect::Int(n), reply) => {
            let got = int_of(reply)?;
            (got == *n)
                .then_some(())
                .ok_or(format!("replied {got}, core {n}"))
        }
        (
            Expect::Granted {
                wait,
                bound,
                debt,
                next_id,
                ..
            },
            Value::BulkString(bytes),
        ) => {
            let value = Stored::decode(bytes)?;
            if bytes.len() < 32 + 24 * limits || value.limits.len() != limits {
                return Err(format!("a grant replies its hot part at least: {value:?}"));
            }
            let now = micros(value.last_now_micros);
            let latest = value
                .limits
                .iter()
                .map(|l| micros(l.next_free_micros))
                .fold(now, u64::max);
            let got = (
                micros(value.moment_micros) - now,
                value.bound as i64,
                latest - now,
                micros(value.next_id),
            );
            let core = (*wait, *bound, *debt, *next_id);
            (got == core).then_some(()).ok_or(format!(
                "granted (wait, bound, debt, next_id): script {got:?}, core {core:?}"
            ))
        }
        // A refused try of one limit that stores nothing replies its wait,
        // negated (its fraction tells nothing: the ticket is ahead); any
        // other the state it found, as a status.
        (Expect::Refused { now, states }, Value::Int(n)) => {
            let [state] = &states[..] else {
                return Err(format!("an integer refusal of {} limits", states.len()));
            };
            same_bits("stored", 0.0, state.stored_permits())?;
            let wait = state.next_free_micros() as i64 - *now as i64;
            (wait > 0 && *n == -wait)
                .then_some(())
                .ok_or(format!("refused with {n}, core's wait {wait}"))
        }
        (Expect::Refused { now, states }, Value::BulkString(bytes))
        | (Expect::Status { now, states }, Value::BulkString(bytes)) => {
            let numbers = doubles(bytes);
            if bytes.len() != 8 + 24 * limits {
                return Err(format!("a state of {} bytes", bytes.len()));
            }
            if matches!(expect, Expect::Refused { .. })
                && limits == 1
                && states[0].stored_permits() == 0.0
            {
                return Err("a refusal storing nothing replies its wait".into());
            }
            same_bits("now", numbers[0], *now as f64)?;
            same_states(&numbers[1..], states)
        }
        (
            Expect::Batch {
                replies,
                now,
                states,
            },
            Value::BulkString(bytes),
        ) => {
            // Per request its wait and (several limits) its bound; then the
            // next id: the core's ids are the ones before it, in order; the
            // state after it, and what the key learned if anything (checked
            // in the value).
            let numbers = doubles(bytes);
            let (n, per) = (replies.len(), if limits > 1 { 2 } else { 1 });
            let states_end = per * n + 2 + 3 * limits;
            if bytes.len() != 8 * states_end && bytes.len() != 8 * (states_end + 4 + limits) {
                return Err(format!("a batch of {n} replied {} bytes", bytes.len()));
            }
            let ids: Vec<f64> = replies
                .iter()
                .map(|r| r[2])
                .filter(|id| *id >= 0.0)
                .collect();
            let mut id = numbers[per * n] - ids.len() as f64;
            for (r, (got, core)) in numbers.chunks_exact(per).zip(replies).enumerate() {
                let bound = match got.get(1) {
                    Some(&bound) => bound,
                    None if got[0] != 0.0 => 0.0,
                    None => -1.0,
                };
                let own = if core[2] >= 0.0 {
                    id += 1.0;
                    id - 1.0
                } else {
                    -1.0
                };
                if [got[0], bound, own] != core[..] {
                    return Err(format!("request {r}: script {got:?}, core {core:?}"));
                }
            }
            same_bits("now after the batch", numbers[per * n + 1], *now as f64)?;
            same_states(&numbers[per * n + 2..states_end], states)
        }
        (expect, reply) => Err(format!("replied {reply:?}, core expects {expect:?}")),
    }
}

/// Checks the key's value against the model's.
fn check_value(value: &Stored, expect: &sequence::Fields) -> Result<(), String> {
    same_bits("expires_micros", value.expires_micros, expect.expires)?;
    same_bits(
        "last_now_micros",
        value.last_now_micros,
        expect.last_now as f64,
    )?;
    same_bits("next_id", value.next_id, expect.next_id as f64)?;
    same_bits("record moment", value.moment_micros, expect.record.0 as f64)?;
    same_bits("record bound", value.bound, expect.record.1 as f64)?;
    let fields: Vec<f64> = value
        .limits
        .iter()
        .flat_map(|l| [l.stored_permits, l.next_free_micros, l.next_free_fraction])
        .collect();
    same_states(&fields, &expect.states)?;
    same_rates(value, &expect.states)?;
    if value.log != expect.log {
        return Err(format!(
            "log: script {:?}, core {:?}",
            value.log, expect.log
        ));
    }
    let bits = |numbers: &Option<Vec<f64>>| {
        numbers
            .as_ref()
            .map(|n| n.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    if bits(&value.learned) != bits(&expect.learned) {
        return Err(format!(
            "learned: script {:?}, core {:?}",
            value.learned, expect.learned
        ));
    }
    Ok(())
}

/// Runs one sequence through the script and compares; returns a
/// description of the first disagreement.
fn check(
    seq: &Sequence,
    con: &mut redis::Connection,
    script: &redis::Script,
    totals: &mut Totals,
) -> Result<(), String> {
    let key = format!("diff:{}", seq.seed);
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (step, expected) in seq.steps.iter().zip(&seq.expected) {
        let mut invocation = script.prepare_invoke();
        invocation.key(&key);
        seq.arguments(step, &mut invocation);
        pipe.invoke_script(&invocation);
        pipe.cmd("PTTL").arg(&key);
        if expected.ttl_ms.is_some() {
            pipe.cmd("PERSIST").arg(&key);
        }
        if expected.fields.is_some() {
            pipe.cmd("GET").arg(&key);
        }
    }
    let replies: Vec<Value> = pipe
        .query(con)
        .map_err(|e| format!("the transaction failed: {e}"))?;
    let mut replies = replies.iter();
    let mut next_reply = || replies.next().ok_or("too few replies".to_string());
    for (i, (step, expected)) in seq.steps.iter().zip(&seq.expected).enumerate() {
        let fail = |what: String| format!("step {i} ({step:?}): {what}");
        let reply = next_reply()?;
        check_reply(reply, &expected.reply, seq.config.len()).map_err(fail)?;
        totals.count(step, &expected.reply);
        let pttl = int_of(next_reply()?).map_err(fail)?;
        if let Some(ttl) = expected.ttl_ms {
            // Set just now (PTTL reads the real clock, which may have moved).
            if !(pttl as f64 <= ttl && pttl as f64 >= (ttl - 1_000.0).max(0.0)) {
                return Err(fail(format!("PTTL {pttl} ms, expected {ttl} ms")));
            }
            if int_of(next_reply()?).map_err(fail)? != 1 {
                return Err(fail("PERSIST found no TTL".into()));
            }
            totals.ttls_set += 1;
        } else {
            // A write that keeps the TTL it finds, or no write at all: still
            // no TTL (-1, every TTL set was removed), or still no key (-2).
            let untouched = if expected.exists { -1 } else { -2 };
            if pttl != untouched {
                return Err(fail(format!(
                    "a step that sets no TTL left PTTL {pttl}, expected {untouched} (wrote: {})",
                    expected.wrote
                )));
            }
            totals.ttls_kept += u64::from(expected.wrote);
        }
        if let Some(fields) = &expected.fields {
            let bytes = match next_reply()? {
                Value::BulkString(bytes) => bytes,
                other => return Err(fail(format!("GET replied {other:?}"))),
            };
            let value = Stored::decode(bytes).map_err(fail)?;
            check_value(&value, fields).map_err(fail)?;
            // A grant replies what it wrote: the whole value, or the value
            // from its hot part on.
            if let (Expect::Granted { .. }, Value::BulkString(reply)) = (&expected.reply, reply) {
                let at = if reply.starts_with(b"plv1") { 0 } else { 4 };
                if bytes.get(at..at + reply.len()) != Some(&reply[..]) {
                    return Err(fail("the grant's reply is not what it wrote".into()));
                }
            }
            totals.field_checks += 1;
            totals.fractional_states +=
                u64::from(value.limits.iter().any(|l| l.next_free_fraction != 0.0));
            totals.logs_checked += u64::from(!value.log.is_empty());
            totals.full_logs += u64::from(value.log.len() == LOG_CAPACITY);
        }
    }
    if replies.next().is_some() {
        return Err("too many replies".into());
    }
    totals.sequences += 1;
    totals.limits[seq.config.len() - 1] += 1;
    totals.rate_changes += seq.rate_changes;
    totals.backward_steps += seq.backward_steps;
    totals.caps_logged += seq.caps_logged;
    totals.caps_replayed += seq.caps_replayed;
    Ok(())
}

#[test]
fn lua_script_and_core_agree() {
    let seeds: Vec<u64> = match std::env::var("PACELINE_DIFF_SEED") {
        Ok(seed) => vec![seed.parse().expect("PACELINE_DIFF_SEED: a decimal seed")],
        Err(_) => {
            let n = std::env::var("PACELINE_DIFF_SEQUENCES")
                .map(|n| n.parse().expect("PACELINE_DIFF_SEQUENCES: a number"))
                .unwrap_or(SEQUENCES);
            (BASE_SEED..BASE_SEED + n)
                .chain(GIVE_BACK_SEED..GIVE_BACK_SEED + n / 4)
                .chain(DEEP_SEED..DEEP_SEED + n / 20)
                .chain(CALLS_SEED..CALLS_SEED + n / 3)
                .collect()
        }
    };
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = crate::support::limiter_state::script();
    script.load(&mut con).expect("SCRIPT LOAD");
    let started = Instant::now();
    let mut totals = Totals::default();
    for &seed in &seeds {
        let seq = generate(seed);
        if let Err(what) = check(&seq, &mut con, &script, &mut totals) {
            panic!(
                "the script and the core disagree: {what}\n{}\nreplay: \
                 PACELINE_DIFF_SEED={seed} cargo test --all-features --test redis differential -- --nocapture",
                seq.describe()
            );
        }
    }
    println!("differential: {totals:?}; {:.1?}", started.elapsed());
    assert_eq!(totals.sequences, seeds.len() as u64);
    // The sequences must actually exercise every outcome.
    if seeds.len() > 100 {
        let each = seeds.len() as u64 / 5;
        assert!(totals.limits.iter().all(|&n| n > each), "{totals:?}");
        assert!(
            totals.tries_refused > 100 && totals.tries_granted > 100,
            "{totals:?}"
        );
        assert!(
            totals.given_back > 100 && totals.given_nothing > 100,
            "{totals:?}"
        );
        assert!(
            totals.resumes > 100 && totals.probes > 100 && totals.batches > 100,
            "{totals:?}"
        );
        assert!(
            totals.statuses > 50 && totals.backward_steps > 100,
            "{totals:?}"
        );
        assert!(
            totals.ttls_set > 100 && totals.ttls_kept > 100,
            "{totals:?}"
        );
        assert!(
            totals.fractional_states > 100 && totals.logs_checked > 100,
            "{totals:?}"
        );
        assert!(
            totals.full_logs > 10 && totals.rate_changes > 100,
            "{totals:?}"
        );
        assert!(
            totals.calls > 100 && totals.calls_refused > 10 && totals.kept > 100,
            "{totals:?}"
        );
        assert!(
            totals.settled_exactly > 100 && totals.settled_after > 100 && totals.learned > 100,
            "{totals:?}"
        );
        assert!(
            totals.caps_logged > 50 && totals.caps_replayed > 50,
            "{totals:?}"
        );
    }
}
