//! Pacing record by record: each reserved as it is read and released at
//! its moment, per key, with a bound on the wait, or as a command.

use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::args::{Args, Failure, OnLate};
use crate::commands::Commands;
use crate::copy::{later, reader_gone};
use crate::key::{Key, KeyOf};
use crate::limiter::Pacer;
use crate::progress::{Counts, Written};
use crate::read::{Chunk, records, trim};
use crate::signals;
use crate::stdout;
use crate::stdout::stdout_file;

/// A record waiting for its moment.
struct Due {
    at: Instant,
    /// Its number in the input, from 1 (every record read counts).
    seq: u64,
    /// Its key (`None`: the one rate's).
    key: Option<Key>,
    record: Vec<u8>,
    /// With `--max-wait` and a command: when it is late, `--max-wait`
    /// after it was read, if no command may start for it by then (the
    /// `-j` all running).
    deadline: Option<Instant>,
    /// Whether it waits (for its moment, or behind its key): counted as
    /// it goes out, written or its command started.
    waits: bool,
}

/// The records of one key waiting for their moment.
struct Waiting {
    /// The moment of the last of them.
    last: Instant,
    /// How many wait.
    count: usize,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// The earliest first (the heap is a max-heap).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The most records waiting for their moment before input is held back.
const MAX_DUE: usize = 100_000;

/// The most bytes of records waiting for their moment before input is
/// held back (a longer record still goes in alone).
const MAX_HELD: usize = 64 << 20;

/// Paces record by record: per key (records of other keys pass a key that
/// waits), with a bound on the wait, or starting a command per record.
/// Each record is reserved as it is read and released at its moment.
///
/// What stops the run early (a late record with `--on-late fail`, a
/// record past `--max-record`, a failed read or limiter) stops the
/// reading only: every record granted before it is still released, each
/// at its moment, and the commands run to their end, before the failure
/// is returned. A signal stops it sooner: the records whose moment has
/// come are written, no other, and no command starts; those running (the
/// handler passed the signal on to them) are waited for. Stdout's reader
/// going away (`| head`) ends it with no failure, as it ends the plain
/// copy: at the write that fails, before the next command would start, or
/// while the run waits, as soon as a pipe's reader goes (the commands
/// running are waited for).
pub(crate) async fn schedule(
    args: &Args,
    pacer: &Pacer,
    key_of: Option<KeyOf>,
    separator: u8,
    mut receiving: mpsc::Receiver<Result<Chunk, Failure>>,
    counts: &Counts,
) -> Result<u64, Failure> {
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    // Per key, its records in `due`: a record goes no sooner than the one
    // of its key before it, so that a key's records keep their order even
    // where the limiter grants a later one an earlier moment (a key
    // dropped at --max-keys starts afresh while its records still wait).
    let mut waiting: HashMap<Option<Key>, Waiting> = HashMap::new();
    // The bytes of the records in `due`.
    let mut held = 0usize;
    // Records and bytes counted as they go to stdout (the last record,
    // unterminated, below); a command's as it starts.
    let mut out = io::BufWriter::new(Written::new(stdout_file()?, counts, separator));
    let mut commands = Commands::new(args);
    let mut seq = 0u64;
    let mut input_open = true;
    let mut stopped: Option<Failure> = None;
    // A chunk read whose records are not all reserved yet: from this
    // byte on.
    let mut pending: Option<(Chunk, usize)> = None;
    // The last record, unterminated (its number, and deadline), released
    // while others still wait: it goes after them (written before, or its
    // command run before theirs, the next would join it).
    let mut tail: Option<(u64, Vec<u8>, Option<Instant>, bool)> = None;
    // The late record (`--on-late fail`) whose followers were taken out
    // of `due`.
    let mut purged: Option<u64> = None;
    let signal = signals::caught_async();
    tokio::pin!(signal);
    let watch = stdout::Watch::new();
    let result = async {
        loop {
            let signalled = matches!(stopped, Some(Failure::Signal(_)));
            // Release what is due (after a signal, even one caught while
            // a command waited for room, or once stdout's reader has gone,
            // no command starts).
            let now = Instant::now();
            while due.peek().is_some_and(|d| d.at <= now)
                && !commands.as_ref().is_some_and(Commands::stopped)
            {
                let Due {
                    record,
                    seq,
                    key,
                    deadline,
                    waits,
                    ..
                } = due.pop().expect("peeked");
                held -= record.len();
                if let Some(of_key) = waiting.get_mut(&key) {
                    of_key.count -= 1;
                    if of_key.count == 0 {
                        waiting.remove(&key);
                    }
                }
                // With --on-late fail, none after the late record goes:
                // one granted before it was found late (for want of one
                // of the -j) still waits here.
                if after_the_late(&stopped, seq) {
                    continue;
                }
                if record.last() != Some(&separator) {
                    // The last record of the input: after every other.
                    tail = Some((seq, record, deadline, waits));
                    continue;
                }
                let len = record.len() as u64;
                let went = match &mut commands {
                    Some(commands) => {
                        out.flush()?;
                        // Out at this pass's moment, with the others of
                        // the pass (a burst), unless it waited for one of
                        // the -j: then as it starts.
                        let at = commands.free().then_some(now);
                        if !commands.room(deadline, counts).await {
                            late(args, seq, &mut stopped, counts);
                            continue;
                        }
                        let started = commands.start(seq, record, separator, counts).await;
                        if started {
                            counts.out_at(1, len, at.unwrap_or_else(Instant::now));
                        }
                        started
                    }
                    None => {
                        out.write_all(&record)?;
                        true
                    }
                };
                if went && waits {
                    counts.waited.fetch_add(1, Ordering::Relaxed);
                }
            }
            // The unterminated last record, once every other is out (its
            // command once every other command has ended: what they
            // write goes before it); after a signal, written if its
            // moment has come, but no command starts.
            // The records after the late one that fails the run wait no
            // more: they will not go.
            if let Some(Failure::Late(late)) = stopped
                && purged != Some(late)
            {
                purged = Some(late);
                due.retain(|d| d.seq < late);
                held = due.iter().map(|d| d.record.len()).sum();
                waiting.clear();
                for d in &due {
                    let of_key = waiting.entry(d.key.clone()).or_insert(Waiting {
                        last: d.at,
                        count: 0,
                    });
                    of_key.last = of_key.last.max(d.at);
                    of_key.count += 1;
                }
                if tail.as_ref().is_some_and(|(seq, ..)| *seq > late) {
                    tail = None;
                }
            }
            if (due.is_empty() || signalled)
                && let Some((seq, record, deadline, waits)) = tail.take()
            {
                let len = record.len() as u64;
                let went = match &mut commands {
                    Some(_) if signalled => false,
                    Some(commands) => {
                        out.flush()?;
                        // Late only for want of one of the -j: the wait
                        // for the others to end is its place after them.
                        if !commands.room(deadline, counts).await {
                            late(args, seq, &mut stopped, counts);
                            false
                        } else if commands.start_last(seq, record, separator, counts).await {
                            counts.out(1, len);
                            true
                        } else {
                            false
                        }
                    }
                    None => {
                        // Out (and counted) once all its bytes went.
                        out.write_all(&record)?;
                        out.flush()?;
                        counts.out(1, 0);
                        true
                    }
                };
                if went && waits {
                    counts.waited.fetch_add(1, Ordering::Relaxed);
                }
            }
            out.flush()?;
            let reading = input_open && stopped.is_none();
            if signalled || stdout::gone() || !reading && due.is_empty() {
                break;
            }
            // The records of the chunk read last, reserved in turn, until
            // one reserved before has waited past its moment: it goes out
            // first (the loop's top), then the rest are reserved.
            if let Some((mut chunk, from)) = pending.take() {
                let len = chunk.bytes().len();
                let mut next = from;
                let mut more = false;
                let since = Instant::now();
                while next < len {
                    let start = next;
                    let record = records(&chunk.bytes()[start..], separator)
                        .next()
                        .expect("a record before the chunk's end");
                    next += record.len();
                    // A signal stops the reading at once, inside a
                    // chunk too: nothing after it is reserved (each
                    // record may be a round trip through Redis).
                    if let Some(signal) = signals::caught() {
                        stopped = Some(Failure::Signal(signal));
                        break;
                    }
                    seq += 1;
                    let key = key_of.as_ref().map(|k| k.key(trim(record, separator)));
                    if key.as_ref().is_some_and(|key| key.len() > args.max_key) {
                        stopped = Some(Failure::KeyTooLong(seq, args.max_key));
                        break;
                    }
                    let read = Instant::now();
                    match pacer.reserve(key.as_ref(), 1, args.max_wait).await {
                        Ok(Some(wait)) => {
                            let deadline = args
                                .max_wait
                                .filter(|_| commands.is_some())
                                .and_then(|most| read.checked_add(most));
                            let granted = later(wait);
                            let at = after_its_key(&mut waiting, &key, granted);
                            held += next - start;
                            due.push(Due {
                                at,
                                seq,
                                key,
                                // (A long record: its buffer, not a copy.)
                                record: chunk.record(start..next),
                                deadline,
                                waits: !wait.is_zero() || at > granted,
                            });
                        }
                        Ok(None) if args.on_late == OnLate::Fail => {
                            stopped = Some(Failure::Late(seq));
                            break;
                        }
                        Ok(None) => {
                            counts.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            stopped = Some(error.into());
                            break;
                        }
                    }
                    // (Each reservation may be a round trip through Redis:
                    // a read's worth of them took long enough that the
                    // records reserved first went late, together.)
                    let now = Instant::now();
                    if next < len
                        && now.duration_since(since) >= signals::SPIN_BELOW
                        && due.peek().is_some_and(|d| d.at <= now)
                    {
                        more = true;
                        break;
                    }
                }
                if more {
                    pending = Some((chunk, next));
                }
                continue;
            }
            let room = due.is_empty() || (due.len() < MAX_DUE && held < MAX_HELD);
            let next = due.peek().map(|d| d.at);
            tokio::select! {
                chunk = receiving.recv(), if reading && room => {
                    match chunk {
                        Some(Ok(chunk)) => pending = Some((chunk, 0)),
                        Some(Err(failure)) => stopped = Some(failure),
                        None => input_open = false,
                    }
                }
                () = sleep_until(next), if next.is_some() => {}
                () = watch.going() => {}
                signal = &mut signal, if !signalled => {
                    stopped = Some(Failure::Signal(signal));
                }
            }
        }
        Ok::<(), Failure>(())
    }
    .await;
    let failed = match commands {
        Some(mut commands) => commands.finish(counts).await,
        None => 0,
    };
    match (result, stopped) {
        (Err(Failure::Io(error)), stopped) if reader_gone(&error) => {
            stopped.map_or(Ok(failed), Err)
        }
        (Err(failure), _) | (Ok(()), Some(failure)) => Err(failure),
        (Ok(()), None) => Ok(failed),
    }
}

/// A record late for its command (see [`Due::deadline`]): dropped and
/// counted, or, with `--on-late fail`, the run's failure: the first late
/// record's in input order, also where one after it was found late
/// sooner (its reservation refused while this one, granted, waited for
/// one of the -j); the records before it still go, none after it (see
/// [`after_the_late`]). A failure of the reading met before (a record
/// or key too long, the limiter, a read) came at a record after every one
/// granted, so after this one: this one is the run's failure in its place.
/// Late after a signal, it is dropped.
fn late(args: &Args, seq: u64, stopped: &mut Option<Failure>, counts: &Counts) {
    let first = match stopped {
        None => true,
        Some(Failure::Late(other)) => seq < *other,
        Some(Failure::Signal(_)) => false,
        Some(_) => true,
    };
    if args.on_late == OnLate::Fail && first {
        *stopped = Some(Failure::Late(seq));
    } else {
        counts.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether record `seq` comes after the late record that fails the run
/// (`--on-late fail`): it does not go (neither written nor run, nor
/// counted as dropped: it was not late).
fn after_the_late(stopped: &Option<Failure>, seq: u64) -> bool {
    matches!(stopped, Some(Failure::Late(late)) if seq > *late)
}

/// The moment of a record of `key` granted `at`: no sooner than the
/// records of its key still waiting (the same moment goes in input
/// order), so that they keep their order. Counted among them.
fn after_its_key(
    waiting: &mut HashMap<Option<Key>, Waiting>,
    key: &Option<Key>,
    at: Instant,
) -> Instant {
    match waiting.get_mut(key) {
        Some(of_key) => {
            of_key.last = of_key.last.max(at);
            of_key.count += 1;
            of_key.last
        }
        None => {
            waiting.insert(key.clone(), Waiting { last: at, count: 1 });
            at
        }
    }
}

/// Returns at `at` (never, for none), or soon after a signal or stdout's
/// reader going away. The runtime's timer wakes on whole milliseconds,
/// late: it takes the wait to two milliseconds before `at`, and the rest
/// is slept here, to the moment, as the plain copy sleeps (on the timer
/// alone, at 1 500/s half the records went out together with the one
/// before, and at 500/s they went 1.2 and 2.2 ms apart in turn).
async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        if let Some(coarse) = at.checked_sub(std::time::Duration::from_millis(2)) {
            tokio::time::sleep_until(coarse.into()).await;
        }
        tokio::task::block_in_place(|| signals::sleep_until(at));
    }
}
