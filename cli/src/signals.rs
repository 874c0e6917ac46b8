//! SIGINT and SIGTERM. The first ends the run in order: nothing more is
//! read, records whose moment has come are written, those still waiting
//! for theirs are not, no command starts, the commands running are
//! waited for, the summary is printed; then paceline ends by that same
//! signal, so that its parent sees it (a shell reports 130 or 143, and a
//! script stops as it would have). A second one ends it at once.
//!
//! The handler only notes the signal and writes a byte to a pipe, which
//! every wait of the run watches: a read of stdin (`poll` before it), a
//! sleep until a record's moment, the scheduler's `select!`.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The first signal caught (0: none yet).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The pipe the handler writes to (its write end) and every wait watches
/// (its read end); -1 before [`install`].
static WAKE: AtomicI32 = AtomicI32::new(-1);
static WATCH: AtomicI32 = AtomicI32::new(-1);

/// Catches SIGINT and SIGTERM from now on.
pub(crate) fn install() -> io::Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    for fd in fds {
        // Neither end goes to the commands, and neither blocks: the
        // handler must never wait, and a wait drains what it finds.
        // SAFETY: `fd` is a descriptor this function just opened.
        unsafe {
            if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0
                || libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
    }
    WATCH.store(fds[0], Ordering::SeqCst);
    WAKE.store(fds[1], Ordering::SeqCst);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed `sigaction` is a valid value to fill in; the
        // handler does only what a signal handler may (atomics, write,
        // signal, raise).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // Calls that a signal interrupts go on: only the pipe wakes
            // the waits.
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

extern "C" fn on_signal(signal: libc::c_int) {
    if CAUGHT
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // The second: end now, by it (delivered as the handler returns).
        // SAFETY: both are async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
        return;
    }
    let fd = WAKE.load(Ordering::SeqCst);
    let byte = 1u8;
    // SAFETY: `write` is async-signal-safe; the pipe does not block (a
    // full pipe already wakes every wait).
    unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
}

/// The signal caught, if one was.
pub(crate) fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Ends the process by `signal`, as if it had not been caught.
pub(crate) fn end_by(signal: i32) -> ! {
    // SAFETY: restoring the default action and raising a signal have no
    // preconditions.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
    // Should the signal not end it (it always does), the status a shell
    // would report.
    std::process::exit(128 + signal)
}

/// What ended a wait before its end: a signal caught, or stdout's reader
/// gone (see [`stdout`](crate::stdout)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    Signal(i32),
    ReaderGone,
}

/// How a wait's end ends the run: by the signal, or as a write to a gone
/// reader does (quietly, see [`reader_gone`](crate::copy::reader_gone)).
impl From<Woken> for crate::args::Failure {
    fn from(woken: Woken) -> Self {
        match woken {
            Woken::Signal(signal) => crate::args::Failure::Signal(signal),
            Woken::ReaderGone => crate::args::Failure::Io(io::ErrorKind::BrokenPipe.into()),
        }
    }
}

/// What ends a wait now, if anything.
fn woken() -> Option<Woken> {
    match caught() {
        Some(signal) => Some(Woken::Signal(signal)),
        None => crate::stdout::gone().then_some(Woken::ReaderGone),
    }
}

/// `poll`s `fd` (if any) for reading, the signals' pipe, and stdout (a
/// pipe's or socket's) for its reader going away, at most `timeout_ms`
/// (-1: no bound); goes on where interrupted.
fn poll(fd: Option<RawFd>, timeout_ms: libc::c_int) {
    let mut fds = [
        libc::pollfd {
            fd: WATCH.load(Ordering::SeqCst),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // A negative descriptor is left out.
            fd: fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // No event asked for: errors and hang-ups are always reported.
            fd: crate::stdout::watched_fd().unwrap_or(-1),
            events: 0,
            revents: 0,
        },
    ];
    // SAFETY: `fds` holds three valid `pollfd`s.
    unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout_ms) };
}

/// Waits until `fd` can be read (or is at its end, or failed), a signal
/// is caught or stdout's reader goes: which of the last two, if one came.
pub(crate) fn readable(fd: RawFd) -> Option<Woken> {
    if woken().is_none() {
        poll(Some(fd), -1);
    }
    woken()
}

/// A sleep ends some 50 µs after it was due (the system's timer slack), so
/// a wait shorter than this is spun instead: at rates of millions of records
/// a second the waits are microseconds, and each sleep would lose several
/// times its length.
pub(crate) const SPIN_BELOW: Duration = Duration::from_micros(100);

/// Returns at `due`, not before, or as soon as a signal is caught or
/// stdout's reader goes: which, if one came. Waits of more than a couple
/// of milliseconds watch the signals' pipe and stdout until a millisecond
/// before `due`; the rest is slept, or spun below [`SPIN_BELOW`].
pub(crate) fn sleep_until(due: Instant) -> Option<Woken> {
    loop {
        if let Some(woken) = woken() {
            return Some(woken);
        }
        let left = due.saturating_duration_since(Instant::now());
        if left > Duration::from_millis(2) {
            let ms = (left - Duration::from_millis(1)).as_millis();
            poll(None, ms.min(i32::MAX as u128) as libc::c_int);
        } else {
            if left >= SPIN_BELOW {
                std::thread::sleep(left);
            }
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            return None;
        }
    }
}

/// The signal caught, once one is (never, if none is). For the scheduler's
/// `select!`.
pub(crate) async fn caught_async() -> i32 {
    use tokio::io::{Interest, unix::AsyncFd};
    let fd = WATCH.load(Ordering::SeqCst);
    let watched = (fd >= 0)
        .then(|| {
            // SAFETY: the pipe's read end is open, and stays open (and the
            // same) for the whole process.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            // SAFETY: as above, for as long as the `AsyncFd` lives.
            unsafe { AsyncFd::register_with_interest(borrowed, Interest::READABLE) }.ok()
        })
        .flatten();
    loop {
        if let Some(signal) = caught() {
            return signal;
        }
        match &watched {
            Some(watched) => match watched.readable().await {
                Ok(mut ready) => ready.clear_ready(),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short waits are spun, longer ones slept, long ones watched; either
    /// way the wait ends at its moment, never before it.
    #[test]
    fn a_wait_never_ends_before_its_moment() {
        for wait in [0, 1, 7, 40, 99, 100, 101, 350, 1_500, 2_500, 4_000] {
            let due = Instant::now() + Duration::from_micros(wait);
            assert_eq!(sleep_until(due), None);
            assert!(Instant::now() >= due, "a wait of {wait} µs ended early");
        }
    }
}
