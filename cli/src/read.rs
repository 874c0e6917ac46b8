//! Reading stdin: the plain copy's page-aligned window, and the reader
//! thread that hands whole records to the scheduler in chunks.

use std::io::{self, Read};

use tokio::sync::mpsc;

/// The size of a read.
pub(crate) const READ_SIZE: usize = 128 * 1024;

/// A page: where reads start.
pub(crate) const PAGE: usize = 4096;

/// Standard input and output as files: read and written directly, with
/// no buffering of their own.
pub(crate) fn std_file(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<std::fs::File> {
    Ok(std::fs::File::from(fd.try_clone_to_owned()?))
}

/// Standard output, written directly (through `BufWriter`s of the
/// callers').
pub(crate) fn stdout_file() -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    std_file(io::stdout().as_fd())
}

/// A chunk of stdin: `buf[..len]`, whole records (or bytes as read). Its
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
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let _ = self.pool.send(std::mem::take(&mut self.buf));
    }
}

/// Reads stdin into chunks of whole records (`separator`; `None`: bytes,
/// as read), each sent as soon as it is read; the last record needs no
/// separator. Buffers come back through a pool, so that nothing is
/// allocated or cleared per read.
pub(crate) fn read_stdin(chunks: mpsc::Sender<io::Result<Chunk>>, separator: Option<u8>) {
    use std::os::fd::AsFd;
    let mut stdin = match std_file(io::stdin().as_fd()) {
        Ok(file) => file,
        Err(error) => {
            let _ = chunks.blocking_send(Err(error));
            return;
        }
    };
    let (pool, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    // Bytes of a record begun in the previous read, carried to the next.
    let mut carried: Vec<u8> = Vec::new();
    loop {
        let mut buf = returned.try_recv().unwrap_or_else(|_| vec![0u8; READ_SIZE]);
        // A record longer than a buffer: room for it and a read more.
        if buf.len() < carried.len() + READ_SIZE / 2 {
            buf.resize(carried.len() + READ_SIZE, 0);
        }
        buf[..carried.len()].copy_from_slice(&carried);
        let start = carried.len();
        let read = loop {
            match stdin.read(&mut buf[start..]) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let read = match read {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) => {
                let _ = chunks.blocking_send(Err(error));
                return;
            }
        };
        let filled = start + read;
        let len = match separator {
            None => filled,
            Some(separator) => match buf[start..filled].iter().rposition(|b| *b == separator) {
                Some(end) => start + end + 1,
                None => 0,
            },
        };
        carried.clear();
        carried.extend_from_slice(&buf[len..filled]);
        if len == 0 {
            let _ = pool.send(buf);
            continue;
        }
        let chunk = Chunk {
            buf,
            len,
            pool: pool.clone(),
        };
        if chunks.blocking_send(Ok(chunk)).is_err() {
            return;
        }
    }
    if !carried.is_empty() {
        let len = carried.len();
        let _ = chunks.blocking_send(Ok(Chunk {
            buf: carried,
            len,
            pool,
        }));
    }
}

/// The reading buffer of [`copy`](crate::copy::copy): a page-aligned place for each read of
/// `READ_SIZE`, and in front of it room for the part of a record carried
/// over from the read before.
pub(crate) struct Window {
    storage: Vec<u8>,
    /// Where the read's place is: a page boundary, `front` bytes in.
    read_at: usize,
    /// The room in front of the read's place (whole pages).
    front: usize,
    /// The bytes carried over, just before the read's place.
    pub(crate) carried: usize,
    /// What the last read brought.
    read: usize,
}

impl Window {
    pub(crate) fn new(front: usize) -> Window {
        let storage = vec![0u8; PAGE + front + READ_SIZE];
        let base = storage.as_ptr().align_offset(PAGE).min(PAGE);
        Window {
            storage,
            read_at: base + front,
            front,
            carried: 0,
            read: 0,
        }
    }

    /// Reads once, after the carried bytes.
    pub(crate) fn fill(&mut self, input: &mut impl Read) -> io::Result<usize> {
        self.read = 0;
        self.read = input.read(&mut self.storage[self.read_at..self.read_at + READ_SIZE])?;
        Ok(self.read)
    }

    /// The carried bytes and what the last read brought.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.storage[self.read_at - self.carried..self.read_at + self.read]
    }

    /// Carries `bytes()[from..]` over to the next read, making more room
    /// in front if it is longer than the room there.
    pub(crate) fn keep_from(&mut self, from: usize) {
        let range = self.read_at - self.carried + from..self.read_at + self.read;
        let len = range.len();
        if len <= self.front {
            self.storage.copy_within(range, self.read_at - len);
        } else {
            let mut bigger = Window::new(len.next_multiple_of(PAGE));
            let to = bigger.read_at - len;
            bigger.storage[to..bigger.read_at].copy_from_slice(&self.storage[range]);
            *self = bigger;
        }
        self.carried = len;
        self.read = 0;
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
