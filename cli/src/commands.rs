//! A command per record (`-- CMD`), at most `-j` at once, each killed past
//! `--timeout`. The record goes to it unchanged: in place of each `{}` in
//! its arguments, or as its stdin when none has `{}`.
//!
//! Each command leads a process group of its own: `--timeout` kills the
//! whole group, what the command started too (a shell's children, which
//! would otherwise run on, holding stdout open), and SIGINT and SIGTERM
//! caught by paceline are passed on to it (see [`signals`]).
//!
//! The commands write to paceline's stdout. Once its reader has gone
//! (`| head`), no command starts: the run ends as the plain copy's does,
//! and a command killed by SIGPIPE then (it wrote to that reader) is not
//! a failure.

use std::ffi::{OsStr, OsString};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

use crate::args::Args;
use crate::progress::Counts;
use crate::read::trim;
use crate::signals::{self, Group};
use crate::stdout;

/// The commands run per record, at most `jobs` at once.
pub(crate) struct Commands {
    program: OsString,
    args: Vec<OsString>,
    /// Whether an argument holds `{}`: the record goes there, not to the
    /// command's stdin.
    substituted: bool,
    /// The longest argument the system lets a command have, if it has
    /// such a bound: a record that would make one longer gets no command.
    longest_argument: Option<usize>,
    jobs: usize,
    /// How long a command may run before it is killed.
    timeout: Option<Duration>,
    /// The number of each running command's record, and whether it
    /// succeeded (or why not).
    running: JoinSet<(u64, Result<(), Failed>)>,
    failed: u64,
}

/// Why a command failed.
struct Failed {
    why: String,
    /// It was killed by SIGPIPE, or exited 141 as a shell whose command
    /// was: it wrote to a pipe with no reader.
    broken_pipe: bool,
}

impl Commands {
    /// The commands of `args`, if any; within the runtime.
    pub(crate) fn new(args: &Args) -> Option<Commands> {
        let (program, rest) = args.command.split_first()?;
        signals::track_groups(args.jobs);
        Some(Commands {
            program: program.clone(),
            args: rest.to_vec(),
            substituted: rest.iter().any(|arg| holds_braces(arg)),
            longest_argument: longest_argument(),
            jobs: args.jobs,
            timeout: args.timeout,
            running: JoinSet::new(),
            failed: 0,
        })
    }

    /// Whether no command may start any more: a signal was caught, or
    /// stdout's reader has gone.
    pub(crate) fn stopped(&self) -> bool {
        signals::caught().is_some() || stdout::gone()
    }

    /// Whether one of the `-j` is free: a command may start at once.
    pub(crate) fn free(&self) -> bool {
        self.running.len() < self.jobs
    }

    /// Starts the command for `record` (number `number` of the input,
    /// from 1), once fewer than `jobs` run; whether it did (not once
    /// [`stopped`](Self::stopped), which may come while it waits for
    /// room; not if it could not start, which is counted as failed, and
    /// as started only if it did).
    pub(crate) async fn start(
        &mut self,
        number: u64,
        record: Vec<u8>,
        separator: u8,
        counts: &Counts,
    ) -> bool {
        while self.running.len() >= self.jobs {
            self.reap_one(counts).await;
        }
        if self.stopped() {
            return false;
        }
        let mut command = tokio::process::Command::new(&self.program);
        // A group of its own, led by the command.
        #[cfg(unix)]
        command.process_group(0);
        if self.substituted {
            let text = trim(&record, separator);
            // Checked before any is built: a record of 50 MiB took 164
            // MB, its argument built and copied, for the system to
            // refuse it.
            if let Some(why) = self.unfit(text) {
                self.failed(number, &why, counts);
                return false;
            }
            for arg in &self.args {
                match substitute(arg, text) {
                    Ok(arg) => command.arg(arg),
                    Err(why) => {
                        self.failed(number, &why, counts);
                        return false;
                    }
                };
            }
            command.stdin(Stdio::null());
        } else {
            command.args(&self.args);
            command.stdin(Stdio::piped());
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                let why = format!("cannot run {}: {error}", self.program.to_string_lossy());
                self.failed(number, &why, counts);
                return false;
            }
        };
        counts.commands.fetch_add(1, Ordering::Relaxed);
        // In the signals' table from now until its leader is waited for.
        let group = child.id().and_then(Group::enter);
        let input = child.stdin.take();
        let timeout = self.timeout;
        self.running.spawn(async move {
            let run = async {
                if let Some(mut stdin) = input {
                    // A command that does not read its stdin is not a
                    // failure.
                    let _ = stdin.write_all(&record).await;
                }
                child.wait().await
            };
            let ended = match timeout {
                None => Some(run.await),
                Some(timeout) => tokio::time::timeout(timeout, run).await.ok(),
            };
            let outcome = match ended {
                Some(Ok(status)) if status.success() => Ok(()),
                Some(Ok(status)) => Err(Failed {
                    why: status.to_string(),
                    broken_pipe: broken_pipe(status),
                }),
                Some(Err(error)) => Err(format!("waiting for it failed: {error}").into()),
                None => {
                    // The whole group, the command's leader still not
                    // waited for (its id is not another's); the command
                    // alone should that fail.
                    let killed = match group.as_ref().map(Group::kill) {
                        Some(Ok(())) => Ok(()),
                        _ => child.start_kill(),
                    };
                    let killed = match killed {
                        Ok(()) => match child.wait().await {
                            Ok(_) => "killed".to_owned(),
                            Err(error) => format!("killed, but waiting for it failed: {error}"),
                        },
                        Err(error) => format!("killing it failed: {error}"),
                    };
                    Err(format!(
                        "still running after --timeout {:?}: {killed}",
                        timeout.unwrap_or_default()
                    )
                    .into())
                }
            };
            // Its leader waited for: out of the table.
            drop(group);
            (number, outcome)
        });
        true
    }

    /// Waits until one of the `-j` is free for the next command, or
    /// `deadline` passes first: whether one is free (the record is late
    /// otherwise, and nothing runs for it).
    pub(crate) async fn room(
        &mut self,
        deadline: Option<std::time::Instant>,
        counts: &Counts,
    ) -> bool {
        while self.running.len() >= self.jobs {
            let Some(deadline) = deadline else {
                self.reap_one(counts).await;
                continue;
            };
            tokio::select! {
                // (Cancel-safe: a command that ends meanwhile stays in the
                // set, reaped by the next call.)
                () = self.reap_one(counts) => {}
                () = tokio::time::sleep_until(deadline.into()) => return false,
            }
        }
        true
    }

    /// Starts the command for the last record of the input, unterminated,
    /// as [`start`](Self::start) does, but once every other command has
    /// ended: what they write goes before what it writes (the record
    /// copied to stdout, written sooner, would join the next).
    pub(crate) async fn start_last(
        &mut self,
        number: u64,
        record: Vec<u8>,
        separator: u8,
        counts: &Counts,
    ) -> bool {
        while !self.running.is_empty() {
            self.reap_one(counts).await;
        }
        self.start(number, record, separator, counts).await
    }

    /// Why `record` cannot go in place of each `{}`, if it cannot: it
    /// holds a NUL byte, which ends an argument (the command would get
    /// less than the record), or it would make an argument longer than
    /// the system lets one be.
    fn unfit(&self, record: &[u8]) -> Option<String> {
        if let Some(at) = record.iter().position(|&b| b == 0) {
            return Some(format!(
                "the record holds a NUL byte (at byte {at}), which no argument can carry \
                 (with no {{}} in the command, the record goes to its stdin as it is)"
            ));
        }
        let len = record.len();
        let most = self.longest_argument?;
        let (at, arg_len) = self
            .args
            .iter()
            .map(|arg| substituted_len(arg, len))
            .enumerate()
            .find(|(_, arg_len)| *arg_len > most)?;
        Some(format!(
            "the record is {len} bytes: in place of {{}}, argument {} would be {arg_len} \
             bytes, more than the {most} an argument may have here (with no {{}} in the \
             command, the record goes to its stdin, at any length)",
            at + 1
        ))
    }

    /// Counts a command that failed, and says so.
    fn failed(&mut self, number: u64, why: &str, counts: &Counts) {
        say!("paceline: the command for record {number} failed: {why}");
        self.failed += 1;
        counts.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits for a command to end; counts it if it failed, but for one
    /// killed by SIGPIPE once stdout's reader has gone: cut short with
    /// the run, not failed.
    async fn reap_one(&mut self, counts: &Counts) {
        match self.running.join_next().await {
            Some(Ok((_, Ok(())))) | None => {}
            Some(Ok((_, Err(failed)))) if failed.broken_pipe && stdout::gone() => {}
            Some(Ok((number, Err(failed)))) => self.failed(number, &failed.why, counts),
            Some(Err(error)) => {
                self.failed += 1;
                counts.failed.fetch_add(1, Ordering::Relaxed);
                say!("paceline: a command's task failed: {error}");
            }
        }
    }

    /// Waits for every command; how many failed.
    pub(crate) async fn finish(&mut self, counts: &Counts) -> u64 {
        while !self.running.is_empty() {
            self.reap_one(counts).await;
        }
        self.failed
    }
}

impl From<String> for Failed {
    fn from(why: String) -> Failed {
        Failed {
            why,
            broken_pipe: false,
        }
    }
}

/// Whether a command was killed by SIGPIPE, or says it was as a shell
/// does: a shell whose last command was killed by a signal exits with 128
/// and its number (`sh -c 'curl ... | jq .'` exits 141 where `jq` met a
/// pipe with no reader).
#[cfg(unix)]
fn broken_pipe(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGPIPE) || status.code() == Some(128 + libc::SIGPIPE)
}

#[cfg(not(unix))]
fn broken_pipe(_: std::process::ExitStatus) -> bool {
    false
}

/// Whether `arg` holds `{}`.
fn holds_braces(arg: &OsStr) -> bool {
    arg.as_encoded_bytes().windows(2).any(|pair| pair == b"{}")
}

/// How long `arg` is with a record of `len` bytes in place of each `{}`
/// (as [`substitute`] finds them).
fn substituted_len(arg: &OsStr, len: usize) -> usize {
    let mut rest = arg.as_encoded_bytes();
    let mut out = 0usize;
    while let Some(at) = rest.windows(2).position(|pair| pair == b"{}") {
        out = out.saturating_add(at).saturating_add(len);
        rest = &rest[at + 2..];
    }
    out.saturating_add(rest.len())
}

/// The longest argument a command may have, its ending NUL not counted.
/// On Linux, 32 pages a string (`MAX_ARG_STRLEN`), its NUL counted, and no
/// more than the arguments and environment together (`ARG_MAX`, which
/// `sysconf` gives as much as the kernel takes or more); elsewhere that
/// whole.
#[cfg(unix)]
fn longest_argument() -> Option<usize> {
    // SAFETY: sysconf only reads.
    let [page, all] = [libc::_SC_PAGESIZE, libc::_SC_ARG_MAX].map(|name| {
        usize::try_from(unsafe { libc::sysconf(name) })
            .ok()
            .filter(|n| *n > 0)
    });
    let one = match cfg!(any(target_os = "linux", target_os = "android")) {
        true => page.map(|page| page.saturating_mul(32)),
        false => None,
    };
    let most = match (one, all) {
        (Some(one), Some(all)) => one.min(all),
        (one, all) => one.or(all)?,
    };
    Some(most - 1)
}

#[cfg(not(unix))]
fn longest_argument() -> Option<usize> {
    None
}

/// `arg` with each `{}` replaced by `record`, byte for byte.
#[cfg(unix)]
fn substitute(arg: &OsStr, record: &[u8]) -> Result<OsString, String> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut rest = arg.as_bytes();
    let mut out = Vec::with_capacity(rest.len() + record.len());
    while let Some(at) = rest.windows(2).position(|pair| pair == b"{}") {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(record);
        rest = &rest[at + 2..];
    }
    out.extend_from_slice(rest);
    Ok(OsString::from_vec(out))
}

/// `arg` with each `{}` replaced by `record`, which must be UTF-8 here: a
/// command's arguments on this system cannot carry other bytes unchanged,
/// and a record is never altered.
#[cfg(not(unix))]
fn substitute(arg: &OsStr, record: &[u8]) -> Result<OsString, String> {
    let record = std::str::from_utf8(record).map_err(|_| {
        "the record is not UTF-8, and on this system a command's arguments carry \
         only UTF-8 unchanged (without {} in the command, the record goes to its \
         stdin as it is)"
            .to_owned()
    })?;
    let arg = arg
        .to_str()
        .ok_or_else(|| "an argument of the command is not UTF-8".to_owned())?;
    Ok(arg.replace("{}", record).into())
}
