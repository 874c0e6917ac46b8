//! SIGINT and SIGTERM end a run in order: the records whose moment has
//! come are out, none still waiting is written, no command starts and
//! those running are waited for, the summary is printed, and paceline
//! ends by the signal (a shell reports 130 or 143).

use std::os::unix::process::ExitStatusExt;

use super::*;

/// Starts paceline with `args`, writes `input` and keeps its stdin open;
/// once its first line is out, sends `signal`: the lines it wrote in all,
/// how it ended, its stderr, and how long it took after the signal.
fn signalled(
    args: &[&str],
    input: &[u8],
    signal: i32,
) -> (Vec<String>, std::process::ExitStatus, String, Duration) {
    let mut child = paceline(args).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let sent = Instant::now();
    let mut lines = vec![first.trim_end().to_owned()];
    lines.extend(stdout.lines().map(Result::unwrap));
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    drop(stdin);
    (lines, status, stderr, took)
}

#[test]
fn a_signal_ends_the_run_after_what_is_due_and_before_what_is_not() {
    let _one = one_at_a_time();
    for args in [&["2/s", "--json"][..], &["2/s", "--json", "--key", "1"][..]] {
        for (signal, input) in [
            // Waiting for the second record's moment.
            (libc::SIGINT, &b"a 1\na 2\na 3\n"[..]),
            // Waiting for input (stdin stays open).
            (libc::SIGTERM, &b"a 1\n"[..]),
        ] {
            let (lines, status, stderr, took) = signalled(args, input, signal);
            let case = format!("{args:?}, signal {signal}");
            assert_eq!(lines, ["a 1"], "{case}");
            assert_eq!(status.signal(), Some(signal), "{case}: {status:?}");
            assert!(took < Duration::from_secs(2), "{case}: took {took:?}");
            assert!(stderr.contains("\"records\":1,"), "{case}: {stderr}");
        }
    }
}

#[test]
fn after_a_signal_no_command_starts_and_those_running_end() {
    let _one = one_at_a_time();
    // The first record's command runs 0.3 s; the second's moment (0.5 s)
    // comes after the signal (0.1 s): it never starts.
    let (lines, status, stderr, _) = signalled(
        &[
            "2/s",
            "--json",
            "--",
            "sh",
            "-c",
            "echo started; sleep 0.3; echo \"$1\"",
            "sh",
            "{}",
        ],
        b"first\nsecond\n",
        libc::SIGTERM,
    );
    assert_eq!(lines, ["started", "first"]);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(stderr.contains("\"commands\":1,"), "{stderr}");
}

/// Waiting for a command that runs on, the run ends at a second signal.
#[test]
fn a_second_signal_ends_the_run_at_once() {
    let mut child = paceline(&["10/s", "--", "sh", "-c", "exec sleep 5 > /dev/null"])
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let kill = |child: &Child| {
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    };
    (&stdin).write_all(b"x\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    kill(&child);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "it did not wait for its command"
    );
    kill(&child);
    let sent = Instant::now();
    let status = child.wait().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    drop(stdin);
}

/// A signal that comes once the input is over, while only a command
/// runs, still ends the run by it, once the command has ended.
#[test]
fn a_signal_after_the_input_ends_the_run_by_it_too() {
    let mut child = paceline(&["10/s", "--", "sh", "-c", "exec sleep 0.5 > /dev/null"])
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"x\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}
