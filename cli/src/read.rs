//! Reading stdin: the plain copy's page-aligned window, and the reader
//! thread that hands whole records to the scheduler in chunks.

use std::io::{self, Read};

use tokio::sync::mpsc;

use crate::args::Failure;

/// The size of a read.
pub(crate) const READ_SIZE: usize = 128 * 1024;

/// A page: where reads start.
pub(crate) const PAGE: usize = 4096;

/// Standard input and output as files: read and written directly, with
/// no buffering of their own.
pub(crate) fn std_file(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<std::fs::File> {
    Ok(std::fs::File::from(fd.try_clone_to_owned()?))
}

/// `error`, stdin's, saying so: a failure's message tells a read from a
/// write (its kind stays).
pub(crate) fn reading(error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("reading stdin: {error}"))
}

/// A chunk of stdin: `buf[..len]`, whole records. Its
/// buffer goes back to the reader when it is dropped.
pub(crate) struct Chunk {
    buf: Vec<u8>,
    len: usize,
    pool: std::sync::mpsc::Sender<Vec<u8>>,
}

impl Chunk {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The record at `range` of [`bytes`](Self::bytes), to hold: a copy;
    /// or, for a record alone in a buffer grown past those kept (a long
    /// record, see [`read_stdin`]), that buffer itself, taken (the chunk
    /// is then empty).
    pub(crate) fn record(&mut self, range: std::ops::Range<usize>) -> Vec<u8> {
        if range == (0..self.len) && self.buf.len() > KEPT {
            let mut record = std::mem::take(&mut self.buf);
            record.truncate(self.len);
            record.shrink_to_fit();
            self.len = 0;
            return record;
        }
        self.buf[range].to_vec()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // (Not a buffer taken by `record`.)
        if self.buf.capacity() > 0 {
            let _ = self.pool.send(std::mem::take(&mut self.buf));
        }
    }
}

/// Buffers longer than this (grown for a long record) are dropped when
/// they come back, not kept for the next reads.
const KEPT: usize = 2 * READ_SIZE;

/// Reads stdin into chunks of whole records (ending with `separator`),
/// each sent as soon as it is read; the last record needs no separator. Buffers come back through a pool, so that nothing is
/// allocated or cleared per read.
///
/// A record longer than a buffer stays where it began and the next reads
/// go after it, the buffer growing (at least doubling) until the record
/// ends: its bytes move once per doubling, and the part of a record that
/// begins after a chunk's last separator is copied once, into the next
/// buffer. Such a long record goes in a chunk of its own, so that the
/// scheduler may hold it in that buffer rather than in a copy (see
/// [`Chunk::record`]): what the read that ended it brought after it goes
/// to the next buffer, and on from there. One longer than `max_record`
/// bytes (its separator not counted) ends the reading: the chunk of whole
/// records before it, then [`Failure::TooLong`].
pub(crate) fn read_stdin(
    chunks: mpsc::Sender<Result<Chunk, Failure>>,
    separator: u8,
    max_record: usize,
) {
    use std::os::fd::AsFd;
    let mut stdin = match std_file(io::stdin().as_fd()) {
        Ok(file) => file,
        Err(error) => {
            let _ = chunks.blocking_send(Err(Failure::Io(reading(error))));
            return;
        }
    };
    let (pool, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    let fresh = || {
        returned
            .try_recv()
            .ok()
            .filter(|buf| buf.len() <= KEPT)
            .unwrap_or_else(|| vec![0u8; READ_SIZE])
    };
    let send = |buf: Vec<u8>, len: usize| {
        let chunk = Chunk {
            buf,
            len,
            pool: pool.clone(),
        };
        chunks.blocking_send(Ok(chunk)).is_ok()
    };
    let too_long = |records: &[u8]| too_long(records, separator, max_record);
    let mut buf = fresh();
    // `buf[..filled]`: a record begun before the last read, and what that
    // read brought.
    let mut filled = 0;
    // Whether `buf` grew for the record it begins with: a long record.
    let mut long = false;
    loop {
        if buf.len() - filled < READ_SIZE / 2 {
            // A record longer than the buffer: room for it to go on.
            let len = (buf.len() * 2).max(filled + READ_SIZE);
            buf.resize(len, 0);
            long = true;
        }
        let start = filled;
        let read = loop {
            match stdin.read(&mut buf[start..]) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                // A stdin left non-blocking (O_NONBLOCK, by whoever made
                // the pipe): wait until it can be read, as a blocking read
                // would.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    use std::os::fd::AsRawFd;
                    match crate::signals::readable(stdin.as_raw_fd()) {
                        Some(crate::signals::Woken::Signal(signal)) => {
                            let _ = chunks.blocking_send(Err(Failure::Signal(signal)));
                            return;
                        }
                        // The scheduler, which watches stdout too, ends
                        // the run: nothing more to read for it.
                        Some(crate::signals::Woken::ReaderGone) => return,
                        None => {}
                    }
                }
                other => break other,
            }
        };
        let read = match read {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) => {
                let _ = chunks.blocking_send(Err(Failure::Io(reading(error))));
                return;
            }
        };
        filled += read;
        // Only what the read brought is searched for the last separator
        // (and after a long record, what came after it, moved).
        let mut start = start;
        loop {
            let len =
                memchr::memrchr(separator, &buf[start..filled]).map_or(0, |end| start + end + 1);
            if len == 0 {
                break;
            }
            // The chunk: whole records; a long record alone, up to the
            // read's first separator.
            let end = match std::mem::take(&mut long) {
                true => {
                    memchr::memchr(separator, &buf[start..len]).map_or(len, |at| start + at + 1)
                }
                false => len,
            };
            // What comes after it starts the next buffer: the record
            // begun after the last separator (and after a long record,
            // the whole records before that, searched again).
            let mut next = fresh();
            let tail = filled - end;
            if next.len() < tail + READ_SIZE / 2 {
                next.resize(tail + READ_SIZE, 0);
            }
            next[..tail].copy_from_slice(&buf[end..filled]);
            let whole = too_long(&buf[..end]);
            let sent = match whole {
                Some(0) => true,
                Some(at) => send(buf, at),
                None => send(buf, end),
            };
            if whole.is_some() {
                let _ = chunks.blocking_send(Err(Failure::TooLong(max_record)));
                return;
            }
            if !sent {
                return;
            }
            buf = next;
            filled = tail;
            if end == len {
                break;
            }
            start = 0;
        }
        // `buf[..filled]`: part of one record, no separator yet.
        if filled > max_record {
            let _ = chunks.blocking_send(Err(Failure::TooLong(max_record)));
            return;
        }
    }
    if filled > 0 {
        // The last record, with no separator after it.
        match too_long(&buf[..filled]) {
            Some(end) => {
                if end == 0 || send(buf, end) {
                    let _ = chunks.blocking_send(Err(Failure::TooLong(max_record)));
                }
            }
            None => {
                send(buf, filled);
            }
        }
    }
}

/// Where the first record of `records` (whole records, each with its
/// separator but the last, which may have none) that is longer than `max`
/// bytes (its separator not counted) begins, if one is.
pub(crate) fn too_long(records: &[u8], separator: u8, max: usize) -> Option<usize> {
    if records.len() <= max {
        return None;
    }
    let mut start = 0;
    for record in records.split_inclusive(|b| *b == separator) {
        if trim(record, separator).len() > max {
            return Some(start);
        }
        start += record.len();
    }
    None
}

/// The reading buffer of [`copy`](crate::copy::copy): a page-aligned
/// place for each read of `READ_SIZE`, and in front of it room for the
/// part of a record carried over from the read before (up to a read's
/// worth, copied there).
///
/// A record longer than a read stays where it is instead, and each read
/// goes after it, the storage growing (at least doubling) until the
/// record ends: its bytes move once per doubling, never once per read.
/// Then what is carried goes to the front of a new window of the usual
/// size, and the long record's memory goes back.
pub(crate) struct Window {
    storage: Vec<u8>,
    /// The first page boundary in `storage`.
    base: usize,
    /// The room in front of the read's place (whole pages, at most
    /// `READ_SIZE`).
    front: usize,
    /// The bytes held: `storage[start..end]`.
    start: usize,
    end: usize,
    /// Where the last read began: the bytes held before it were carried
    /// over, and have no separator.
    read_from: usize,
}

impl Window {
    pub(crate) fn new(front: usize) -> Window {
        let storage = vec![0u8; PAGE + front + READ_SIZE];
        let base = storage.as_ptr().align_offset(PAGE).min(PAGE);
        let at = base + front;
        Window {
            storage,
            base,
            front,
            start: at,
            end: at,
            read_from: at,
        }
    }

    /// The read's place when nothing longer than a read is held: a page
    /// boundary, `front` bytes in.
    fn read_at(&self) -> usize {
        self.base + self.front
    }

    /// Whether the storage grew for a long record (and so may no longer
    /// hold a page boundary at `base`).
    fn grown(&self) -> bool {
        self.storage.len() != PAGE + self.front + READ_SIZE
    }

    /// Reads once, after the bytes held.
    pub(crate) fn fill(&mut self, input: &mut impl Read) -> io::Result<usize> {
        if self.storage.len() - self.end < READ_SIZE {
            let len = (self.storage.len() * 2).max(self.end + READ_SIZE);
            self.storage.resize(len, 0);
        }
        self.read_from = self.end;
        let read = input.read(&mut self.storage[self.end..self.end + READ_SIZE])?;
        self.end += read;
        Ok(read)
    }

    /// The bytes held: those carried over, then what the last read
    /// brought.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.end]
    }

    /// How many of [`bytes`](Self::bytes) were carried over from before
    /// the last read.
    pub(crate) fn carried(&self) -> usize {
        self.read_from - self.start
    }

    /// Carries `bytes()[from..]` over to the next read.
    pub(crate) fn keep_from(&mut self, from: usize) {
        let from = self.start + from;
        let len = self.end - from;
        if len > READ_SIZE {
            // Part of a long record: it stays, the next read goes after it.
            self.start = from;
            return;
        }
        let at = if self.grown() || len > self.front {
            let front = len.next_multiple_of(PAGE).max(self.front).min(READ_SIZE);
            let mut fresh = Window::new(front);
            let at = fresh.read_at();
            fresh.storage[at - len..at].copy_from_slice(&self.storage[from..self.end]);
            *self = fresh;
            at
        } else {
            let at = self.read_at();
            self.storage.copy_within(from..self.end, at - len);
            at
        };
        self.start = at - len;
        self.end = at;
        self.read_from = at;
    }
}

/// How many times `byte` occurs in `bytes`, with the processor's vector
/// instructions.
pub(crate) fn count(bytes: &[u8], byte: u8) -> usize {
    bytecount::count(bytes, byte)
}

/// The records of a chunk, each with its separator (the last may have
/// none).
pub(crate) fn records(chunk: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    chunk.split_inclusive(move |b| *b == separator)
}

/// A record without its separator.
pub(crate) fn trim(record: &[u8], separator: u8) -> &[u8] {
    record.strip_suffix(&[separator]).unwrap_or(record)
}
