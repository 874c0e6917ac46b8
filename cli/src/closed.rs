//! Standard input or output closed when paceline started (`<&-`, `>&-`).
//!
//! The runtime opens `/dev/null` in place of a closed standard descriptor
//! before `main` runs, so a closed stdout would swallow every record and a
//! closed stdin read as empty input, both with status 0. What was closed
//! is seen before that, as the program is loaded, and the run then stops
//! with status 5 before it reads anything.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// One bit per descriptor (0 and 1) found closed at load.
static CLOSED: AtomicU8 = AtomicU8::new(0);

/// Runs as the program is loaded, before the runtime replaces a closed
/// standard descriptor.
extern "C" fn look() {
    for fd in [0, 1] {
        // SAFETY: `fcntl(F_GETFD)` only reads the descriptor's flags; it
        // fails with `EBADF` where the descriptor is not open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            CLOSED.fetch_or(1 << fd, Ordering::Relaxed);
        }
    }
}

#[cfg(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly",
    target_os = "illumos",
    target_os = "solaris"
))]
#[used]
#[unsafe(link_section = ".init_array")]
static LOOK: extern "C" fn() = look;

#[cfg(target_vendor = "apple")]
#[used]
#[unsafe(link_section = "__DATA,__mod_init_func")]
static LOOK: extern "C" fn() = look;

/// An error if stdin or stdout was closed when paceline started: records
/// read from nothing, or written (or the commands' output) to nothing.
pub(crate) fn check() -> io::Result<()> {
    let closed = CLOSED.load(Ordering::Relaxed);
    let which = match (closed & 1 != 0, closed & 2 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "standard input is",
        (false, true) => "standard output is",
        (true, true) => "standard input and output are",
    };
    Err(io::Error::other(format!(
        "{which} closed: nothing was read or written"
    )))
}
