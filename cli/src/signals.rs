//! SIGINT and SIGTERM. The first ends the run in order: nothing more is
//! read, records whose moment has come are written, those still waiting
//! for theirs are not, no command starts, the commands running are sent
//! that same signal and waited for, the summary is printed; then paceline
//! ends by that same signal, so that its parent sees it (a shell reports
//! 130 or 143, and a script stops as it would have). A second one ends it
//! at once, the commands running killed first.
//!
//! Each command leads a process group of its own, so that `--timeout`
//! kills what it started too; a terminal's Ctrl-C, sent to paceline's
//! group, no longer reaches it, so the handler passes the signal on to
//! every running command's group, as the terminal did when they shared
//! paceline's; and so for a stop (Ctrl-Z: the groups stop, then
//! paceline), the continue after it, a hangup and a quit (the groups get
//! it, then paceline ends by it). Beyond that the handler only notes the signal and writes a
//! byte to a pipe, which every wait of the run watches: a read of stdin
//! (`poll` before it), a sleep until a record's moment, the scheduler's
//! `select!`.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::time::{Duration, Instant};

/// The first signal caught (0: none yet).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The pipe the handler writes to (its write end) and every wait watches
/// (its read end); -1 before [`install`].
static WAKE: AtomicI32 = AtomicI32::new(-1);
static WATCH: AtomicI32 = AtomicI32::new(-1);

/// The process groups of the commands running, for the handler: a slot
/// each, 0 when free, a group's id (its leader's pid) while its leader
/// runs, negated once the group was sent the first signal. Null before
/// [`track_groups`], then never freed (the handler may read it at any
/// moment).
static GROUPS: AtomicPtr<Slots> = AtomicPtr::new(ptr::null_mut());

struct Slots(Box<[AtomicI32]>);

/// More slots than a system has processes are never all used.
const MAX_GROUPS: usize = 1 << 22;

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
    // A signal ignored from the start stays ignored (a hang-up, by a
    // parent that asked to outlive its terminal; an interrupt, by a shell's
    // `&` without job control): whoever started paceline asked for that.
    for signal in [libc::SIGINT, libc::SIGTERM] {
        if ignored(signal) {
            continue;
        }
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
        // The second: end now, by it (delivered as the handler returns),
        // the commands' groups killed first: nothing they started is left
        // running.
        to_every_group(libc::SIGKILL);
        raise_default(signal);
        return;
    }
    // The code this handler interrupted may be about to read errno.
    let errno = Errno::save();
    for slot in slots() {
        pass_on(slot, signal);
    }
    let fd = WAKE.load(Ordering::SeqCst);
    let byte = 1u8;
    // SAFETY: `write` is async-signal-safe; the pipe does not block (a
    // full pipe already wakes every wait).
    unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    errno.restore();
}

/// The slots of the running commands' groups (none before
/// [`track_groups`]); async-signal-safe.
fn slots() -> &'static [AtomicI32] {
    let slots = GROUPS.load(Ordering::SeqCst);
    // SAFETY: once set, the table is never freed nor changed but through
    // its atomics.
    unsafe { slots.as_ref() }.map_or(&[], |slots| &slots.0)
}

/// Sends `signal` to the group in `slot`, unless it was sent it already
/// (or the slot is free): either the handler or [`Group::enter`] sends it,
/// never both. Async-signal-safe.
fn pass_on(slot: &AtomicI32, signal: libc::c_int) {
    let group = slot.load(Ordering::SeqCst);
    if group > 0
        && slot
            .compare_exchange(group, -group, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        // SAFETY: `kill` is async-signal-safe; a group that has ended
        // already (ESRCH) needs nothing.
        unsafe { libc::kill(-group, signal) };
    }
}

/// Keeps a slot for the process group of each of `jobs` commands running
/// at once, for the handler to signal; before the first command starts.
pub(crate) fn track_groups(jobs: usize) {
    let slots: Box<[AtomicI32]> = std::iter::repeat_with(|| AtomicI32::new(0))
        .take(jobs.clamp(1, MAX_GROUPS))
        .collect();
    // Leaked, as any table set before it: the handler may be reading it.
    GROUPS.store(Box::into_raw(Box::new(Slots(slots))), Ordering::SeqCst);
    // What a terminal does to its foreground group, passed on to the
    // commands' groups, which are not in it: a stop (Ctrl-Z) and the
    // continue after it, a hangup, a quit; each unless ignored from the
    // start (the commands then ignore it too, as they inherit that).
    // (Best effort: a handler that cannot be installed leaves that signal
    // as it was.)
    if !ignored(libc::SIGTSTP) {
        set_handler(libc::SIGTSTP, on_stop);
        set_handler(libc::SIGCONT, on_continue);
    }
    for signal in [libc::SIGHUP, libc::SIGQUIT] {
        if !ignored(signal) {
            set_handler(signal, on_ending);
        }
    }
}

/// Whether `signal` is ignored now (as it was when paceline started, if
/// asked before paceline catches it).
fn ignored(signal: libc::c_int) -> bool {
    // SAFETY: a zeroed `sigaction` is a valid value to read into; a null
    // new action only reads the current one.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

/// Whether a stop sent to paceline's group would stop it: not if the
/// group is orphaned (no member's parent in the session outside it), where
/// the system drops a stop's default action. Told by paceline's own
/// parent: one in another session (paceline started in a session of its
/// own, by a daemon or a container's init, or its parent gone) leaves the
/// group orphaned; one in the session (a shell, a script) is taken to hold
/// it. Async-signal-safe.
fn stops() -> bool {
    // SAFETY: plain system calls with no preconditions.
    unsafe {
        let session = libc::getsid(libc::getppid());
        session >= 0 && session == libc::getsid(0)
    }
}

/// Catches `signal` with `handler` (calls it interrupts go on); whether it
/// could. Async-signal-safe.
fn set_handler(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) -> bool {
    // SAFETY: a zeroed `sigaction` is a valid value to fill in; sigaction
    // is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut()) == 0
    }
}

/// Sends `signal` to every running command's group. Async-signal-safe.
fn to_every_group(signal: libc::c_int) {
    for slot in slots() {
        let group = slot.load(Ordering::SeqCst).abs();
        if group != 0 {
            // SAFETY: `kill` is async-signal-safe; a group that has ended
            // already (ESRCH) needs nothing.
            unsafe { libc::kill(-group, signal) };
        }
    }
}

/// Raises `signal` with its default action, taken as the handler returns
/// (the signal is blocked while its handler runs). Async-signal-safe.
fn raise_default(signal: libc::c_int) {
    // SAFETY: both are async-signal-safe.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// A stop (Ctrl-Z): the commands' groups stop too, then paceline does,
/// as the terminal's group would have. (A command started as the stop
/// comes, not yet in the table, runs on until the continue: paceline,
/// stopped, cannot stop it then.)
extern "C" fn on_stop(signal: libc::c_int) {
    let errno = Errno::save();
    // In an orphaned group the system drops the stop for paceline: so
    // for its commands too, or nothing would ever continue them.
    if stops() {
        to_every_group(signal);
        raise_default(signal);
    }
    errno.restore();
}

/// Continued after a stop: the commands' groups continue too, and the
/// next stop is caught again.
extern "C" fn on_continue(signal: libc::c_int) {
    let errno = Errno::save();
    set_handler(libc::SIGTSTP, on_stop);
    to_every_group(signal);
    errno.restore();
}

/// A hangup, or a quit (Ctrl-\\): the commands' groups get it, then
/// paceline ends by it, as it did before it caught it (the run is not
/// ended in order: a hangup leaves nobody to read what it would say, and a
/// quit asks for no order).
extern "C" fn on_ending(signal: libc::c_int) {
    let errno = Errno::save();
    to_every_group(signal);
    raise_default(signal);
    errno.restore();
}

/// A running command's process group (it leads it), in the handler's
/// table from [`Group::enter`] until dropped: to drop once its leader has
/// been waited for, not before (until then the command may run on, and
/// must get the signals caught).
pub(crate) struct Group {
    id: libc::pid_t,
    slot: Option<&'static AtomicI32>,
}

impl Group {
    /// The group led by the command just started, `leader`.
    pub(crate) fn enter(leader: u32) -> Option<Group> {
        let id = libc::pid_t::try_from(leader).ok().filter(|&id| id > 0)?;
        let slot = slots().iter().find(|slot| {
            slot.compare_exchange(0, id, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        // A signal caught before the group was in its slot did not reach
        // it (one caught since is sent once, by whichever comes first).
        if let Some(signal) = caught() {
            match slot {
                Some(slot) => pass_on(slot, signal),
                // SAFETY: a plain kill(2) of a group this process leads.
                None => unsafe {
                    libc::kill(-id, signal);
                },
            }
        }
        Some(Group { id, slot })
    }

    /// Kills the whole group: the command and every process it started
    /// that is still in its group. One that has ended already is not a
    /// failure.
    pub(crate) fn kill(&self) -> io::Result<()> {
        // SAFETY: a plain kill(2) of a group this process leads, whose
        // leader it has not waited for yet.
        if unsafe { libc::kill(-self.id, libc::SIGKILL) } == 0 {
            return Ok(());
        }
        match io::Error::last_os_error() {
            error if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            error => Err(error),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.store(0, Ordering::SeqCst);
        }
    }
}

/// errno as a signal handler found it, to leave it so.
struct Errno(libc::c_int);

impl Errno {
    fn save() -> Errno {
        // SAFETY: the calling thread's errno is always there.
        Errno(errno_location().map_or(0, |at| unsafe { *at }))
    }

    fn restore(self) {
        if let Some(at) = errno_location() {
            // SAFETY: as above.
            unsafe { *at = self.0 };
        }
    }
}

/// Where the calling thread's errno is, where the system says.
fn errno_location() -> Option<*mut libc::c_int> {
    #[cfg(any(target_os = "linux", target_os = "dragonfly"))]
    // SAFETY: no preconditions.
    return Some(unsafe { libc::__errno_location() });
    #[cfg(any(target_os = "android", target_os = "netbsd", target_os = "openbsd"))]
    // SAFETY: no preconditions.
    return Some(unsafe { libc::__errno() });
    #[cfg(any(target_vendor = "apple", target_os = "freebsd"))]
    // SAFETY: no preconditions.
    return Some(unsafe { libc::__error() });
    #[allow(unreachable_code)]
    None
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
