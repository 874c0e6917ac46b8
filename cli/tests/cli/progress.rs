//! The progress line on a terminal: drawn over itself on stderr, never
//! left under what else reaches the screen (paceline's messages, the
//! records themselves).

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};

use super::*;

/// A pseudo-terminal: its controlling side (what the screen shows) and the
/// side a program writes to.
fn terminal() -> (File, OwnedFd) {
    let (mut screen, mut program) = (-1, -1);
    // SAFETY: openpty(3) fills in the two descriptors; the name, settings
    // and size may be null.
    let opened = unsafe {
        libc::openpty(
            &mut screen,
            &mut program,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened, and are owned here alone.
    unsafe { (File::from_raw_fd(screen), OwnedFd::from_raw_fd(program)) }
}

/// The lines a terminal shows for `bytes` (a carriage return goes back to
/// the line's start, and what follows overwrites it), without the spaces
/// at their ends.
fn screen_lines(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = Vec::new();
    let (mut line, mut at): (Vec<char>, usize) = (Vec::new(), 0);
    for c in text.chars() {
        match c {
            '\r' => at = 0,
            '\n' => {
                lines.push(line.iter().collect::<String>().trim_end().to_owned());
                (line, at) = (Vec::new(), 0);
            }
            c => {
                if at < line.len() {
                    line[at] = c;
                } else {
                    line.push(c);
                }
                at += 1;
            }
        }
    }
    if !line.is_empty() {
        lines.push(line.iter().collect::<String>().trim_end().to_owned());
    }
    lines
}

/// Runs paceline with `args`, `input` on stdin, stderr (and stdout too,
/// if `stdout_too`) on a terminal: how it ended, and what the terminal
/// shows.
fn on_a_terminal(
    args: &[&str],
    input: &[u8],
    stdout_too: bool,
) -> (std::process::ExitStatus, Vec<String>) {
    let (screen, program) = terminal();
    let mut command = paceline(args);
    if stdout_too {
        command.stdout(program.try_clone().unwrap());
    } else {
        command.stdout(Stdio::null());
    }
    let mut child = command.stderr(program).spawn().unwrap();
    // (The program's side is closed here once `command` goes: the screen
    // reads to its end once paceline has ended.)
    drop(command);
    let shown = read_all_bytes(screen);
    child.stdin.take().unwrap().write_all(input).unwrap();
    let status = exits_within(&mut child, Duration::from_secs(30), "paceline", || {});
    let shown = shown.recv_timeout(Duration::from_secs(10)).unwrap();
    (status, screen_lines(&shown))
}

/// `pipe` read to its end (a terminal's controlling side ends with an
/// error once no program holds the other), on a thread of its own.
fn read_all_bytes(mut pipe: File) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(read @ 1..) = pipe.read(&mut buf) {
            bytes.extend_from_slice(&buf[..read]);
        }
        let _ = sender.send(bytes);
    });
    receiver
}

/// A message said while the progress line is drawn (a command failed)
/// starts a line of its own: it is not written after the progress line's
/// text, nor under it.
#[test]
fn a_message_is_not_written_onto_the_progress_line() {
    let _one = one_at_a_time();
    let (status, shown) = on_a_terminal(
        &["4/s", "--", "sh", "-c", "exit 3"],
        b"a\nb\nc\nd\ne\n",
        false,
    );
    assert_eq!(status.code(), Some(1), "{shown:#?}");
    let said: Vec<&String> = shown.iter().filter(|l| l.contains("paceline:")).collect();
    assert_eq!(said.len(), 5, "{shown:#?}");
    for line in said {
        assert!(
            line.starts_with("paceline: the command for record"),
            "{shown:#?}"
        );
        assert!(line.ends_with("failed: exit status: 3"), "{shown:#?}");
    }
    // The last line is the summary, on a line of its own.
    let last = shown.last().expect("a summary");
    assert!(last.starts_with("5 records, "), "{shown:#?}");
}

/// With stdout on the terminal too, the records are what it shows: each
/// on a line of its own, as it was read, no progress line drawn among
/// them.
#[test]
fn records_on_the_terminal_are_not_written_onto_a_progress_line() {
    let _one = one_at_a_time();
    let input = lines(6);
    let (status, shown) = on_a_terminal(&["8/s"], input.as_bytes(), true);
    assert!(status.success(), "{status:?} {shown:#?}");
    let records: Vec<String> = input.lines().map(str::to_owned).collect();
    assert_eq!(shown, records);
}
