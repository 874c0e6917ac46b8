//! The script's replies, decoded: a reservation's or a call's (what it
//! wrote of the value, from its hot part on, or the state a refused try
//! found: with one limit that stores nothing, its wait negated), a
//! learn's (the value it wrote), a batch's, a status, and the integers of
//! the other modes. The layout is
//! the value's (see `docs/redis-protocol.md`, Value); a test below holds
//! these constants to the script's.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::script::{Answer, Call, Kept, LogId, Request, ScriptArgs};
use crate::Snapshot;
use crate::core::{FRACTION_BITS, MAX_MICROS, micros};

/// The marker a value starts with.
const MARKER: &[u8; 4] = b"plv1";
/// The marker and the head's four doubles (shape, last_now_micros,
/// next_id, the moment of the last request granted).
const HEAD_LEN: usize = 36;
/// Each limit's state in the hot part: three doubles.
const LIMIT_LEN: usize = 24;
/// `shape = limits + SHAPE * logged requests + BOUND * (bound + 1)`, where
/// `bound` is the limit that bound the last request granted (-1: none),
/// plus `LEARNED` if the value holds what the limits learned.
const SHAPE: f64 = 32.0;
const BOUND: f64 = 4128.0;
const LEARNED: f64 = 70_176.0;
/// The fixed part after the hot one: the TTL's end, then each limit's rate
/// and max_permits (in doubles: 1 + 2 per limit).
const FIXED_PER_LIMIT: usize = 2;

/// The script's reply to a call, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    /// The wait for a granted reservation, the debt for a probe or a
    /// resume, `None` for a refused try. For a give-back: 1 given back, 0
    /// not (as µs, unused).
    pub(crate) wait: Option<Duration>,
    /// How far the key's latest ticket lies ahead of the server's clock
    /// after the call, in µs.
    pub(crate) debt_micros: u64,
    /// What gives a held reservation that waits back.
    pub(crate) token: Option<LogId>,
    /// The limit that set the wait (0 when none did).
    pub(crate) limit: usize,
    /// For a reservation, the limits' states after it (a refused try: as
    /// it found them), with the server's clock: what its snapshot reads,
    /// [`Stored::snapshot`]. (A batch's requests share the state after the
    /// batch.)
    pub(crate) after: Option<Arc<Stored>>,
    /// The fraction of their configured rates the limits run at, learned
    /// from an upstream's answers (see `Limits::learn`), when the reply
    /// carries what the key learned (every grant's and a learn's do, once
    /// it has learned anything); `None` otherwise.
    pub(crate) learned: Option<crate::core::Adopted>,
}

/// A key's state as the script replies it: the server's clock, and per
/// limit its state at the rate in force (a limit not stored as it starts).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    pub(crate) now_micros: u64,
    pub(crate) limits: Vec<StoredLimit>,
    /// What the key learned, when the reply said (a status's says whenever
    /// the key learned anything): its limits run at the rates it makes of
    /// the configured ones.
    pub(crate) learned: Option<crate::core::Adopted>,
}

/// One limit of a [`Stored`] state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StoredLimit {
    pub(crate) stored_permits: f64,
    pub(crate) next_free_micros: u64,
    pub(crate) next_free_fraction: u32,
}

/// `x` as whole µs in `0..=end`, if it is one.
fn whole(x: f64, end: f64) -> Option<u64> {
    ((0.0..=end).contains(&x) && x.fract() == 0.0).then_some(x as u64)
}

/// The limit a reply says bound a request, of `limits` (-1: none, read as
/// the first), if it is one.
fn binding(bound: f64, limits: usize) -> Option<usize> {
    match bound {
        -1.0 => Some(0),
        bound => usize::try_from(whole(bound, limits as f64 - 1.0)?).ok(),
    }
}

fn doubles(bytes: &[u8]) -> impl Iterator<Item = f64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|chunk| f64::from_le_bytes(chunk.try_into().expect("8 bytes")))
}

impl Stored {
    /// One limit that stores nothing, `wait` µs from now: a refused try's
    /// integer reply, read on a clock at 0 (its fraction tells nothing, as
    /// its ticket is ahead).
    fn waiting(wait: u64) -> Stored {
        Stored {
            now_micros: 0,
            limits: vec![StoredLimit {
                stored_permits: 0.0,
                next_free_micros: wait,
                next_free_fraction: 0,
            }],
            learned: None,
        }
    }

    /// A status reply (and a refused try's): the clock, then three doubles
    /// per limit, `limits` of them; a status's then what the key learned,
    /// if it learned anything (see [`learned`]).
    pub(crate) fn decode(bytes: &[u8], limits: usize) -> Option<Stored> {
        let states = 8 + LIMIT_LEN * limits;
        let learned = match bytes.len().checked_sub(states)? {
            0 => None,
            tail if tail == 8 * (4 + limits) => Some(learned(&bytes[states..])?),
            _ => return None,
        };
        let numbers: Vec<f64> = doubles(&bytes[..states]).collect();
        let mut stored = Stored::from_numbers(numbers[0], &numbers[1..])?;
        stored.learned = learned;
        Some(stored)
    }

    /// The clock `now` and the three fields of each limit; `None` unless
    /// every number is one the script keeps (whole µs below 2^53, a
    /// fraction below 2^20, permits at least 0).
    fn from_numbers(now: f64, fields: &[f64]) -> Option<Stored> {
        let max = MAX_MICROS as f64;
        let limits = fields
            .chunks_exact(3)
            .map(|fields| {
                let [stored, next_free, fraction] = fields.try_into().ok()?;
                (0.0..f64::INFINITY).contains(&stored).then_some(())?;
                Some(StoredLimit {
                    stored_permits: stored,
                    next_free_micros: whole(next_free, max)?,
                    next_free_fraction: whole(fraction, f64::from((1u32 << FRACTION_BITS) - 1))?
                        as u32,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Stored {
            now_micros: whole(now, max)?,
            limits,
            learned: None,
        })
    }

    /// The latest ticket, or now (`Limits::earliest`), and the first limit
    /// whose ticket that is, if it lies after now.
    fn earliest(&self) -> (u64, Option<usize>) {
        let mut moment = self.now_micros;
        let mut bound = None;
        for (i, limit) in self.limits.iter().enumerate() {
            if limit.next_free_micros > moment {
                moment = limit.next_free_micros;
                bound = Some(i);
            }
        }
        (moment, bound)
    }

    /// How far the latest ticket lies ahead of the clock, in µs.
    fn debt_micros(&self) -> u64 {
        self.earliest().0 - self.now_micros
    }

    /// The binding limit's snapshot (`Snapshot::binding`), each limit's
    /// state read at its rate in force (the script took it there): the
    /// configured one, or what the key learned makes of it.
    pub(crate) fn snapshot(&self, args: &ScriptArgs) -> Snapshot {
        let mut rates = args.rates().to_vec();
        if let Some(learned) = &self.learned {
            for (rate, cap) in rates.iter_mut().zip(learned.caps.iter()) {
                *rate = learned.rate_of(*rate, *cap);
            }
        }
        let now = self.now_micros;
        let templates = args.templates(&rates);
        let snapshots =
            self.limits
                .iter()
                .zip(templates)
                .enumerate()
                .map(|(i, (limit, mut state))| {
                    state.stored_permits = limit.stored_permits.min(state.max_permits);
                    state.next_free_micros = limit.next_free_micros;
                    state.next_free_fraction = limit.next_free_fraction;
                    Snapshot::of(&state, now, i)
                });
        Snapshot::binding(snapshots).unwrap_or_else(|| Snapshot::waiting(Duration::ZERO, rates[0]))
    }
}

impl Answer for Reply {
    /// The reply to `call` on a limiter with `limits` limits: a granted
    /// reservation's is what it wrote of the value, from its hot part on; a
    /// refused try's the state it found, as a status replies it, or with one
    /// limit that stores nothing its wait negated; any other an integer.
    fn decode(value: Value, call: &Call, limits: usize) -> Option<Reply> {
        let reserves = matches!(call, Call::Reserve(_) | Call::Open { .. });
        match value {
            Value::BulkString(bytes) if bytes.len() == 8 + LIMIT_LEN * limits => {
                Some(refused(Stored::decode(&bytes, limits)?))
            }
            // A held reservation's grant holds an id if it waits, a call's
            // always.
            Value::BulkString(bytes) => granted(&bytes, limits, |wait| match call {
                Call::Reserve(request) => request.held && wait > 0,
                _ => matches!(call, Call::Open { .. }),
            }),
            Value::Int(n) if n < 0 && limits == 1 && reserves => {
                Some(refused(Stored::waiting(n.unsigned_abs())))
            }
            // The debt (a probe's or a resume's), or a give-back's outcome.
            Value::Int(n) => {
                let n = u64::try_from(n).ok()?;
                Some(Reply {
                    wait: Some(Duration::from_micros(n)),
                    debt_micros: n,
                    token: None,
                    limit: 0,
                    after: None,
                    learned: None,
                })
            }
            _ => None,
        }
    }

    fn tokens(self) -> (Vec<LogId>, Option<Kept>) {
        let kept = self.wait.filter(|_| self.token.is_none()).map(|wait| Kept {
            debt_micros: self.debt_micros,
            // Its ticket less its moment.
            charge_micros: self.debt_micros.saturating_sub(micros(wait)),
        });
        (self.token.into_iter().collect(), kept)
    }
}

impl Answer for Vec<Reply> {
    /// A batch's replies, one per request: per request its wait (negated if
    /// refused) and, with several limits, the limit that bound it (-1: none);
    /// then the next id (its held requests that waited got the ids before it,
    /// in order), and the limits' state after the batch, with what the key
    /// learned if anything, as a status replies it.
    fn decode(value: Value, call: &Call, limits: usize) -> Option<Vec<Reply>> {
        let (Call::Batch(requests), Value::BulkString(bytes)) = (call, value) else {
            return None;
        };
        let per = if limits > 1 { 2 } else { 1 };
        let n = requests.len();
        // (The replies and the next id, then the state as a status's.)
        let head = 8 * (per * n + 1);
        let after = Arc::new(Stored::decode(bytes.get(head..)?, limits)?);
        let numbers: Vec<f64> = doubles(&bytes[..head]).collect();
        let next_id = whole(numbers[per * n], MAX_MICROS as f64)?;
        let debt_micros = after.debt_micros();
        let replies: Vec<(Option<Duration>, usize)> = numbers[..per * n]
            .chunks_exact(per)
            .map(|reply| {
                let granted = reply[0] >= 0.0;
                let wait = Duration::from_micros(whole(reply[0].abs(), MAX_MICROS as f64)?);
                let limit = binding(reply.get(1).copied().unwrap_or(-1.0), limits)?;
                Some((granted.then_some(wait), limit))
            })
            .collect::<Option<_>>()?;
        // The ids, counted back from the next one (2^53: none was left).
        let ided = |(request, (wait, _)): (&Request, &(Option<Duration>, usize))| {
            next_id < MAX_MICROS && request.held && wait.is_some_and(|wait| !wait.is_zero())
        };
        let ids = requests.iter().zip(&replies).filter(|r| ided(*r)).count() as u64;
        let mut id = next_id.checked_sub(ids)?;
        Some(
            requests
                .iter()
                .zip(&replies)
                .map(|reply| {
                    let token = ided(reply).then(|| {
                        id += 1;
                        LogId(id - 1)
                    });
                    let (wait, limit) = *reply.1;
                    Reply {
                        wait,
                        debt_micros,
                        token,
                        limit,
                        after: Some(Arc::clone(&after)),
                        learned: after.learned.clone(),
                    }
                })
                .collect(),
        )
    }

    fn tokens(self) -> (Vec<LogId>, Option<Kept>) {
        // (The debt after the batch, which its replies share.)
        let debt_micros = self.first().map_or(0, |reply| reply.debt_micros);
        // The granted requests' moments, in order: each one's charge runs
        // to the next one's moment (the ticket it left), the last one's to
        // the debt's end.
        let granted: Vec<(u64, bool)> = self
            .iter()
            .filter_map(|reply| Some((micros(reply.wait?), reply.token.is_none())))
            .collect();
        let ends = granted
            .iter()
            .skip(1)
            .map(|(moment, _)| *moment)
            .chain([debt_micros]);
        let charges = granted
            .iter()
            .zip(ends)
            .filter(|((_, kept), _)| *kept)
            .map(|((moment, _), end)| end.saturating_sub(*moment))
            .collect::<Vec<u64>>();
        let kept = (!charges.is_empty()).then(|| Kept {
            debt_micros,
            charge_micros: charges.into_iter().fold(0, u64::saturating_add),
        });
        let tokens = self.into_iter().filter_map(|reply| reply.token).collect();
        (tokens, kept)
    }
}

impl Answer for Stored {
    fn decode(value: Value, _: &Call, limits: usize) -> Option<Stored> {
        match value {
            Value::BulkString(bytes) => Stored::decode(&bytes, limits),
            _ => None,
        }
    }

    fn tokens(self) -> (Vec<LogId>, Option<Kept>) {
        (Vec::new(), None)
    }
}

/// What the limits learned, as the script writes it (the factor, the end of
/// the pause, when it last rose, the margin, and a cap per limit): `None`
/// unless it is a state the script keeps.
fn learned(bytes: &[u8]) -> Option<crate::core::Adopted> {
    let numbers: Vec<f64> = doubles(bytes).collect();
    let adopted = crate::core::Adopted {
        factor: *numbers.first()?,
        margin: *numbers.get(3)?,
        caps: numbers.get(4..)?.into(),
        // (Read leniently: it is no part of what is checked below.)
        paused_until: numbers.get(1)?.clamp(0.0, MAX_MICROS as f64) as u64,
    };
    let valid = |x: f64| x > 0.0 && x <= 1.0;
    (valid(adopted.factor) && valid(adopted.margin) && adopted.caps.iter().all(|c| *c > 0.0))
        .then_some(adopted)
}

/// A refused try's reply: the state it found.
fn refused(stored: Stored) -> Reply {
    let (moment, bound) = stored.earliest();
    Reply {
        wait: None,
        debt_micros: moment - stored.now_micros,
        token: None,
        limit: bound.unwrap_or(0),
        after: Some(Arc::new(stored)),
        learned: None,
    }
}

/// A granted reservation's reply: the value it wrote, from the marker or
/// from its hot part on (the rest, if any, is read only for what the
/// limits learned): the head (the shape, with the limit that bound the
/// request and whether the key learned anything; the clock; next_id; the
/// request's moment) and each limit's state, then the fixed part and what
/// the limits learned, its factor first, if the reply holds them. A held
/// reservation that waits, and a call, got the id before next_id (`ided`,
/// given the wait, says whether this one did).
fn granted(bytes: &[u8], limits: usize, ided: impl Fn(u64) -> bool) -> Option<Reply> {
    let bytes = bytes.strip_prefix(&MARKER[..]).unwrap_or(bytes);
    let hot = HEAD_LEN - MARKER.len() + LIMIT_LEN * limits;
    if bytes.len() < hot || !bytes.len().is_multiple_of(8) {
        return None;
    }
    let numbers: Vec<f64> = doubles(&bytes[..hot]).collect();
    let [shape, now, next_id, moment] = numbers[..4].try_into().ok()?;
    if shape % SHAPE != limits as f64 {
        return None;
    }
    let learns = shape >= LEARNED;
    let bound = ((shape % LEARNED) / BOUND).floor() - 1.0;
    let mut after = Stored::from_numbers(now, &numbers[4..])?;
    let max = MAX_MICROS as f64;
    let (moment, next_id) = (whole(moment, max)?, whole(next_id, max)?);
    let wait = moment.checked_sub(after.now_micros)?;
    // (next_id 2^53: none was left, and it got none.)
    let token = match ided(wait) && next_id < MAX_MICROS {
        true => Some(LogId(next_id.checked_sub(1)?)),
        false => None,
    };
    // What the limits learned, after the fixed part: the factor, the end
    // of the pause, when it last rose, the margin, and a cap per limit.
    let learned_at = hot + 8 * (1 + FIXED_PER_LIMIT * limits);
    let learned = bytes
        .get(learned_at..learned_at + 8 * (4 + limits))
        .filter(|_| learns)
        .and_then(learned);
    after.learned.clone_from(&learned);
    Some(Reply {
        wait: Some(Duration::from_micros(wait)),
        debt_micros: after.debt_micros(),
        token,
        limit: binding(bound, limits)?,
        after: Some(Arc::new(after)),
        learned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Bursty, FINE_CHARGE_LIMIT_MICROS, Policy};
    use crate::redis::script::SOURCE;

    /// The value of the script's `local NAME = value` line (a constant that
    /// one branch alone uses is declared there, indented).
    fn lua(name: &str) -> &'static str {
        let prefix = format!("local {name} = ");
        let line = SOURCE
            .lines()
            .map(str::trim_start)
            .find(|line| line.starts_with(&prefix))
            .unwrap_or_else(|| panic!("the script declares no {name}"));
        let value = line[prefix.len()..].split("--").next().unwrap().trim();
        value.trim_matches('\'')
    }

    fn lua_number(name: &str) -> f64 {
        lua(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} = {} is not a number", lua(name)))
    }

    #[test]
    fn the_script_declares_the_same_layout() {
        assert_eq!(lua("MARKER").as_bytes(), MARKER);
        assert_eq!(lua_number("HEAD"), HEAD_LEN as f64);
        assert_eq!(lua_number("SHAPE"), SHAPE);
        assert_eq!(lua_number("BOUND"), BOUND);
        // (The log's count, read as (shape - limits) % BOUND / SHAPE.)
        assert!(lua_number("SHAPE") * lua_number("LOG_CAPACITY") < BOUND);
        assert_eq!(lua_number("LEARNED"), LEARNED);
        assert_eq!(LEARNED, BOUND * 17.0);
        assert_eq!(lua_number("MAX_MICROS"), MAX_MICROS as f64);
        assert_eq!(lua_number("FRACTION_ONE"), f64::from(1u32 << FRACTION_BITS));
        assert_eq!(lua_number("FINE_CHARGE_LIMIT"), FINE_CHARGE_LIMIT_MICROS);
        // A batch no longer than the script takes, and a log as long as
        // the core keeps for a shared key.
        assert!(lua_number("BATCH_CAPACITY") >= super::super::coalesce::MAX_BATCH as f64);
        assert_eq!(lua_number("LOG_CAPACITY"), 128.0);
        assert_eq!(
            lua_number("MAX_LIMITS"),
            super::super::builder::MAX_LIMITS as f64
        );
    }

    /// A request's reply in a batch whose debt after it is `debt` µs:
    /// granted after `wait` µs (`None`: refused), with an id or not.
    fn batched(wait: Option<u64>, id: Option<u64>, debt: u64) -> Reply {
        Reply {
            wait: wait.map(Duration::from_micros),
            debt_micros: debt,
            token: id.map(LogId),
            limit: 0,
            after: None,
            learned: None,
        }
    }

    /// What an abandoned answer's grants without an id charged: a lone
    /// grant, from its moment to the debt's end; in a batch, each from its
    /// moment to the next grant's (the last one's to the debt's end), not
    /// the debt before them, which is others'.
    #[test]
    fn kept_grants_count_their_own_charge_not_the_debt_before_them() {
        // Granted behind 5 s of debt, charged 100 ms.
        let (ids, kept) = batched(Some(5_000_000), None, 5_100_000).tokens();
        assert!(ids.is_empty());
        assert_eq!(
            kept,
            Some(Kept {
                debt_micros: 5_100_000,
                charge_micros: 100_000
            })
        );
        // One with an id is given back, not kept; a refusal charges nothing.
        assert_eq!(
            batched(Some(5_000_000), Some(7), 5_100_000).tokens().1,
            None
        );
        assert_eq!(batched(None, None, 5_000_000).tokens().1, None);
        // A batch: kept (100 ms), refused, held (200 ms, given back), kept
        // (300 ms, the last).
        let debt = 1_600_000;
        let batch = vec![
            batched(Some(1_000_000), None, debt),
            batched(None, None, debt),
            batched(Some(1_100_000), Some(3), debt),
            batched(Some(1_300_000), None, debt),
        ];
        let (ids, kept) = batch.tokens();
        assert_eq!(ids.iter().map(|id| id.0).collect::<Vec<_>>(), [3]);
        assert_eq!(
            kept,
            Some(Kept {
                debt_micros: debt,
                charge_micros: 400_000
            })
        );
    }

    fn le(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_grant_reads_from_the_value_it_wrote() {
        let now = 1_000_000.0;
        // A held reservation that waits 300 µs, given id 41; the key owes
        // 500 µs after it.
        let mut value = MARKER.to_vec();
        // The hot part (the shape: one limit, nothing logged, bound by
        // limit 0), then the TTL's end, the rate and max_permits.
        value.extend(le(&[1.0 + BOUND, now, 42.0, now + 300.0]));
        value.extend(le(&[0.0, now + 500.0, 7.0]));
        value.extend(le(&[2e6, 5.0, 5.0]));
        let bulk = |bytes: &[u8], call| Reply::decode(Value::BulkString(bytes.to_vec()), call, 1);
        let held = Call::Reserve(Request::of(1, None, true));
        let reply = bulk(&value, &held).unwrap();
        // Written whole or only its hot part, the reply reads the same.
        assert_eq!(bulk(&value[4..60], &held), Some(reply.clone()));
        assert_eq!(reply.wait, Some(Duration::from_micros(300)));
        assert_eq!(
            (reply.debt_micros, reply.token, reply.limit),
            (500, Some(LogId(41)), 0)
        );
        let after = reply.after.as_ref().unwrap();
        assert_eq!(after.limits[0].next_free_fraction, 7);
        let args = ScriptArgs::new(&[(Policy::Bursty(Bursty::default()), 5.0)]);
        let snapshot = after.snapshot(&args);
        assert_eq!(
            (snapshot.remaining(), snapshot.wait()),
            (0, Duration::from_micros(500))
        );
        // With no id left (next_id 2^53), it got none.
        let mut spent = value.clone();
        spent[20..28].copy_from_slice(&(MAX_MICROS as f64).to_le_bytes());
        assert_eq!(bulk(&spent, &held).unwrap().token, None);
        // Not held: no token. A refused try: the state it read.
        let plain = Call::Reserve(Request::of(1, None, false));
        assert_eq!(bulk(&value, &plain).unwrap().token, None);
        let reply = bulk(&le(&[now, 0.5, now + 900.0, 0.0]), &plain).unwrap();
        assert_eq!((reply.wait, reply.debt_micros), (None, 900));
        // Nothing stored: the wait, negated; the same snapshot as the
        // state it stands for.
        let reply = Reply::decode(Value::Int(-900), &plain, 1).unwrap();
        assert_eq!((reply.wait, reply.debt_micros), (None, 900));
        let state = Stored::decode(&le(&[now, 0.0, now + 900.0, 7.0]), 1).unwrap();
        assert_eq!(reply.after.unwrap().snapshot(&args), state.snapshot(&args));
        // (Not for several limits, nor for another call.)
        assert_eq!(Reply::decode(Value::Int(-900), &plain, 2), None);
        assert_eq!(Reply::decode(Value::Int(-900), &Call::Probe, 1), None);
        // Anything else is not the script's reply.
        let mut wrong_marker = value.clone();
        wrong_marker[3] = b'2';
        let mut behind = value.clone();
        behind[28..36].copy_from_slice(&(now - 1.0).to_le_bytes());
        let mut fraction = value.clone();
        fraction[52..60].copy_from_slice(&0.5f64.to_le_bytes());
        for bad in [
            Value::BulkString(wrong_marker),
            Value::BulkString(behind),
            Value::BulkString(fraction),
            Value::BulkString(value[..value.len() - 1].to_vec()),
            Value::Nil,
        ] {
            assert_eq!(Reply::decode(bad.clone(), &held, 1), None, "{bad:?}");
        }
    }
}
