//! Stdout's reader going away (`| head`): the end of a run, not a
//! failure. The plain copy and the records learn it from a write that
//! fails (a broken pipe, see [`reader_gone`](crate::copy::reader_gone));
//! the commands run per record write to stdout themselves, so paceline
//! asks before each one starts, and a wait for the next record's moment
//! ends when a pipe's reader goes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;

use tokio::io::{Interest, unix::AsyncFd};

use crate::read::stdout_file;

/// Stdout, watched for its reader going away.
pub(crate) struct Stdout {
    /// Whether stdout is a pipe or a socket: a file, a terminal or a
    /// device has no reader to lose.
    piped: bool,
    /// Stdout (a copy of it) registered with the runtime for errors only:
    /// a pipe's write end reports one once its reader has gone (a
    /// socket's closed peer is learned at the next start instead).
    watched: Option<AsyncFd<File>>,
    gone: bool,
}

impl Stdout {
    /// Stdout as it is now; within the runtime.
    pub(crate) fn new() -> Stdout {
        let piped = stdout_file().ok().filter(|file| {
            file.metadata().is_ok_and(|meta| {
                let kind = meta.file_type();
                kind.is_fifo() || kind.is_socket()
            })
        });
        Stdout {
            piped: piped.is_some(),
            watched: piped.and_then(|file| {
                // SAFETY: the `AsyncFd` owns the file, open (and the same)
                // for as long as it lives.
                unsafe { AsyncFd::register_with_interest(file, Interest::ERROR) }.ok()
            }),
            gone: false,
        }
    }

    /// Whether stdout's reader has gone: asked of the system (a `poll`
    /// that does not wait) until it has, then known.
    pub(crate) fn gone(&mut self) -> bool {
        if self.piped && !self.gone {
            self.gone = no_reader(io::stdout().as_raw_fd());
        }
        self.gone
    }

    /// Returns once stdout's reader has gone (a pipe's; never for stdout
    /// not watched). Dropping the future gives up nothing.
    pub(crate) async fn going(&self) {
        let Some(watched) = self.watched.as_ref().filter(|_| !self.gone) else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut ready) = watched.ready(Interest::ERROR).await else {
                return std::future::pending().await;
            };
            if no_reader(watched.as_raw_fd()) {
                return;
            }
            // Reported, but a reader is there again (a named pipe
            // opened anew): wait for the next report.
            ready.clear_ready();
        }
    }
}

/// Whether `fd`, written to, has no reader any more: `poll`, without
/// waiting, reports an error (a pipe's) or a hang-up (a socket's). A file
/// or a terminal never reports one while it can be written.
fn no_reader(fd: RawFd) -> bool {
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
