//! Pacing record by record: each reserved as it is read and released at
//! its moment, per key, with a bound on the wait, or as a command.

use std::collections::BinaryHeap;
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::args::{Args, Failure, OnLate};
use crate::commands::Commands;
use crate::copy::{later, reader_gone};
use crate::key::KeyOf;
use crate::limiter::Pacer;
use crate::progress::Counts;
use crate::read::{Chunk, records, stdout_file, trim};

/// A record waiting for its moment.
struct Due {
    at: Instant,
    /// Its number in the input, from 1 (every record read counts).
    seq: u64,
    record: Vec<u8>,
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

/// Paces record by record: per key (records of other keys pass a key that
/// waits), with a bound on the wait, or starting a command per record.
/// Each record is reserved as it is read and released at its moment.
pub(crate) async fn schedule(
    args: &Args,
    pacer: &Pacer,
    key_of: Option<KeyOf>,
    separator: u8,
    mut receiving: mpsc::Receiver<Result<Chunk, Failure>>,
    counts: &Counts,
) -> Result<u64, Failure> {
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    let mut out = io::BufWriter::new(stdout_file()?);
    let mut commands = Commands::new(args);
    let mut seq = 0u64;
    let mut input_open = true;
    let result = async {
        loop {
            // Release what is due.
            let now = Instant::now();
            while due.peek().is_some_and(|d| d.at <= now) {
                let Due { record, seq, .. } = due.pop().expect("peeked");
                counts.records.fetch_add(1, Ordering::Relaxed);
                counts
                    .bytes
                    .fetch_add(record.len() as u64, Ordering::Relaxed);
                if let Some(commands) = &mut commands {
                    out.flush()?;
                    commands.start(seq, record, separator, counts).await;
                } else {
                    out.write_all(&record)?;
                }
            }
            out.flush()?;
            if !input_open && due.is_empty() {
                break;
            }
            let next = due.peek().map(|d| d.at);
            tokio::select! {
                chunk = receiving.recv(), if input_open && due.len() < MAX_DUE => {
                    let Some(chunk) = chunk else {
                        input_open = false;
                        continue;
                    };
                    let chunk = chunk?;
                    for record in records(chunk.bytes(), separator) {
                        seq += 1;
                        let key = key_of.as_ref().map(|k| k.key(trim(record, separator)));
                        match pacer.reserve(key, 1, args.max_wait).await? {
                            Some(wait) => {
                                if !wait.is_zero() {
                                    counts.waited.fetch_add(1, Ordering::Relaxed);
                                }
                                due.push(Due { at: later(wait), seq, record: record.to_vec() });
                            }
                            None if args.on_late == OnLate::Fail => return Err(Failure::Late),
                            None => {
                                counts.dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                () = sleep_until(next), if next.is_some() => {}
            }
        }
        Ok::<(), Failure>(())
    }
    .await;
    let failed = match commands {
        Some(mut commands) => commands.finish(counts).await,
        None => 0,
    };
    match result {
        Ok(()) => Ok(failed),
        Err(Failure::Io(error)) if reader_gone(&error) => Ok(failed),
        Err(failure) => Err(failure),
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
