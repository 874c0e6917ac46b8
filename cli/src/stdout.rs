//! Stdout's reader going away (`| head`): the end of a run, not a
//! failure. A write learns it when it fails (a broken pipe, see
//! [`reader_gone`](crate::copy::reader_gone)); but a run may go long
//! without writing (a record waiting for its moment at a slow rate, input
//! that does not come, commands that write to stdout themselves), so every
//! wait of the run also watches stdout when it is a pipe or a socket, and
//! the run ends as soon as its reader goes.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{Interest, unix::AsyncFd};

/// Stdout's descriptor.
const STDOUT: RawFd = 1;

/// Once known, that stdout's reader has gone.
static GONE: AtomicBool = AtomicBool::new(false);

/// `error`, stdout's, saying so: a failure's message tells a write from a
/// read (its kind stays: a reader gone is still known as such). A socket
/// reset by its reader (gone with what was written unread) is a reader
/// gone, as a pipe's.
pub(crate) fn writing(error: std::io::Error) -> std::io::Error {
    use std::io::ErrorKind;
    let kind = match error.kind() {
        ErrorKind::ConnectionReset => ErrorKind::BrokenPipe,
        kind => kind,
    };
    std::io::Error::new(kind, format!("writing stdout: {error}"))
}

/// Standard output, written directly (through `BufWriter`s of the
/// callers').
pub(crate) fn stdout_file() -> std::io::Result<File> {
    use std::os::fd::AsFd;
    let fd = std::io::stdout().as_fd().try_clone_to_owned();
    Ok(File::from(fd.map_err(writing)?))
}

/// Whether stdout is a pipe or a socket: a file, a terminal or a device
/// has no reader to lose. Asked once.
pub(crate) fn piped() -> bool {
    static PIPED: OnceLock<bool> = OnceLock::new();
    *PIPED.get_or_init(|| {
        stdout_file().is_ok_and(|file| {
            file.metadata().is_ok_and(|meta| {
                let kind = meta.file_type();
                kind.is_fifo() || kind.is_socket()
            })
        })
    })
}

/// Stdout's descriptor where a wait should watch it for its reader going
/// away; `None` where it has none to lose.
pub(crate) fn watched_fd() -> Option<RawFd> {
    piped().then_some(STDOUT)
}

/// Whether stdout's reader has gone: asked of the system (a `poll` that
/// does not wait) until it has, then known.
pub(crate) fn gone() -> bool {
    if GONE.load(Ordering::Relaxed) {
        return true;
    }
    let gone = piped() && no_reader(STDOUT);
    if gone {
        GONE.store(true, Ordering::Relaxed);
    }
    gone
}

/// Stdout registered with the async runtime, for a `select!` to wait on
/// its reader going away.
pub(crate) struct Watch {
    /// A copy of stdout, registered for what its reader's going reports: a
    /// pipe's write end an error; a socket a hang-up, which comes with its
    /// end of input (read readiness: a socket stdout is written, never
    /// read, so that wakes only when its peer sends, shuts down or goes).
    watched: Option<(AsyncFd<File>, Interest)>,
}

impl Watch {
    /// Stdout as it is now; within the runtime.
    pub(crate) fn new() -> Watch {
        let file = stdout_file().ok().filter(|_| piped());
        Watch {
            watched: file.and_then(|file| {
                let socket = file
                    .metadata()
                    .is_ok_and(|meta| meta.file_type().is_socket());
                let interest = match socket {
                    true => Interest::ERROR.add(Interest::READABLE),
                    false => Interest::ERROR,
                };
                // SAFETY: the `AsyncFd` owns the file, open (and the same)
                // for as long as it lives.
                let watched = unsafe { AsyncFd::register_with_interest(file, interest) };
                watched.ok().map(|watched| (watched, interest))
            }),
        }
    }

    /// Returns once stdout's reader has gone (a pipe's or a socket's;
    /// never for stdout not watched). Dropping the future gives up nothing.
    pub(crate) async fn going(&self) {
        let Some((watched, interest)) = self.watched.as_ref().filter(|_| !gone()) else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut ready) = watched.ready(*interest).await else {
                return std::future::pending().await;
            };
            if no_reader(watched.as_raw_fd()) {
                GONE.store(true, Ordering::Relaxed);
                return;
            }
            // Reported, but a reader is there (a named pipe opened anew,
            // a socket's peer that sent or shut down its side only): wait
            // for the next report.
            ready.clear_ready();
        }
    }
}

/// Waits until stdout can be written, or has failed (its reader gone: the
/// write after this says so), for a stdout left non-blocking. A signal
/// ends the wait early, and the write is tried again: as a blocking write,
/// it goes on until it can be made.
pub(crate) fn writable() {
    let mut polled = libc::pollfd {
        fd: STDOUT,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: `polled` is one valid `pollfd`.
    unsafe { libc::poll(&mut polled, 1, -1) };
}

/// Whether `fd`, written to, has no reader any more: `poll`, without
/// waiting, reports an error (a pipe's) or a hang-up (a socket's). A file
/// or a terminal never reports one while it can be written.
pub(crate) fn no_reader(fd: RawFd) -> bool {
    let mut polled = libc::pollfd {
        fd,
        // No event asked for: errors and hang-ups are always reported.
        events: 0,
        revents: 0,
    };
    // SAFETY: `polled` is one valid `pollfd`.
    let ready = unsafe { libc::poll(&mut polled, 1, 0) };
    ready > 0 && polled.revents & (libc::POLLERR | libc::POLLHUP) != 0
}
