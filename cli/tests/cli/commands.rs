//! A command per record gets the record's bytes unchanged, in its
//! arguments or on its stdin; one past `--timeout` is killed and counted
//! as failed.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;

/// paceline with `args` (some not UTF-8) and `input`: its output.
fn run_os(args: &[&OsStr], input: &[u8]) -> Output {
    let mut command = Command::new(PACELINE);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn os(text: &[u8]) -> &OsStr {
    OsStr::from_bytes(text)
}

#[test]
fn a_command_gets_the_records_bytes_unchanged() {
    let record = b"caf\xe9 \\ $x \xff\n";
    let text = &record[..record.len() - 1];
    for (command, expected) in [
        // In place of {}, alone, twice, and beside bytes not UTF-8.
        (&[&b"printf"[..], b"%s", b"{}"][..], text.to_vec()),
        (
            &[&b"printf"[..], b"%s", b"{}|{}"][..],
            [text, b"|", text].concat(),
        ),
        (
            &[&b"printf"[..], b"%s", b"\xfe{}\xfd"][..],
            [b"\xfe", text, b"\xfd"].concat(),
        ),
        // With no {}, on its stdin, separator and all.
        (&[&b"cat"[..]][..], record.to_vec()),
    ] {
        let mut args = vec![os(b"100/s"), os(b"--")];
        args.extend(command.iter().map(|arg| os(arg)));
        let output = run_os(&args, record);
        assert!(output.status.success(), "{command:?}: {output:?}");
        assert_eq!(output.stdout, expected, "{command:?}");
    }
}

/// A command still running past `--timeout` is killed and counted as
/// failed (exit status 1), and the run does not wait for it to end.
#[test]
fn a_command_past_its_timeout_is_killed_and_fails() {
    let start = Instant::now();
    let output = run(
        &["100/s", "--timeout", "200ms", "--json", "--", "sleep", "10"],
        b"x\n",
    );
    let took = start.elapsed();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("record 1"), "{stderr}");
    assert!(stderr.contains("--timeout"), "{stderr}");
    assert!(stderr.contains("\"failed\":1"), "{stderr}");
    // Commands that end in time succeed.
    let output = run(&["100/s", "--timeout", "5s", "--", "true"], b"x\ny\n");
    assert!(output.status.success(), "{output:?}");
    // --timeout needs a command, and more than nothing.
    for (args, says) in [
        (&["100/s", "--timeout", "1s"][..], "needs one"),
        (
            &["100/s", "--timeout", "0s", "--", "true"][..],
            "more than zero",
        ),
    ] {
        let output = run(args, b"");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(says));
    }
}

/// `--timeout` kills a command's whole process group: a process it started
/// (in the background, for the shell to wait for) ends with it, and the
/// pipes it held (stdout, stderr) end then, not when it would have ended.
/// With `-j 2`, each command's group.
#[test]
fn a_command_past_its_timeout_is_killed_with_what_it_started() {
    let dir = temp_path("timeout-group");
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = format!("{}/{{}}.pid", dir.display());
    let mut child = paceline(&[
        "100/s",
        "-j",
        "2",
        "--timeout",
        "2s",
        "--json",
        "--",
        "sh",
        "-c",
        "sleep 60 & echo $! > \"$1\"; wait",
        "sh",
        &pid_file,
    ])
    .spawn()
    .unwrap();
    child.stdin.take().unwrap().write_all(b"a\nb\n").unwrap();
    let stdout = read_all(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    let sleeps = || ["a", "b"].map(|record| dir.join(format!("{record}.pid")));
    let kill_sleeps = || {
        for path in sleeps() {
            let pid = std::fs::read_to_string(&path).ok();
            if let Some(pid) = pid
                .and_then(|pid| pid.trim().parse::<i32>().ok())
                .filter(|&pid| pid > 0)
            {
                // SAFETY: a plain kill(2), of the test's own sleep.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    };
    let status = exits_within(&mut child, Duration::from_secs(30), "paceline", kill_sleeps);
    for path in sleeps() {
        let pid = pid_in(&path);
        if !process_ends_within(pid, Duration::from_secs(5)) {
            kill_sleeps();
            panic!(
                "{}: the command's sleep ({pid}) outlived its --timeout",
                path.display()
            );
        }
    }
    let bound = Duration::from_secs(10);
    let stderr = stderr.recv_timeout(bound).expect("stderr still open");
    assert_eq!(status.code(), Some(1), "{status:?}: {stderr}");
    assert!(stderr.contains("\"failed\":2"), "{stderr}");
    assert_eq!(stderr.matches("--timeout").count(), 2, "{stderr}");
    assert_eq!(stdout.recv_timeout(bound).expect("stdout still open"), "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With stderr closed (its reader gone, as in `2>&1 | head`), what paceline
/// would say there is lost, not a panic: every record still gets its
/// command, and the status is the run's own (1: commands failed), for a
/// summary too.
#[test]
fn a_closed_stderr_loses_the_messages_not_the_run() {
    let _one = one_at_a_time();
    for extra in [&[][..], &["--json"][..]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut args = vec!["1e9/s"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "echo ran; exit 3"]);
        let mut child = paceline(&args).stderr(writer).spawn().unwrap();
        child.stdin.take().unwrap().write_all(b"a\nb\nc\n").unwrap();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{extra:?}: {output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "ran\nran\nran\n",
            "{extra:?}"
        );
    }
}

/// Endless input (as `yes` gives), written to `child`'s stdin until it
/// ends.
pub(super) fn feed_endlessly(child: &mut Child) -> std::thread::JoinHandle<()> {
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let records = "y\n".repeat(4096);
        while stdin.write_all(records.as_bytes()).is_ok() {}
    })
}

/// How `child` (run as `what`) ended, within `bound` after its reader
/// went away; killed, and a failure, if it did not.
pub(super) fn ended_within(
    child: &mut Child,
    bound: Duration,
    what: &str,
) -> std::process::ExitStatus {
    exits_within(child, bound, &format!("{what}, its reader gone"), || {})
}

/// With stdout's reader gone (`yes | paceline ... -- echo {} | head -1`),
/// no command starts any more: the run ends, on endless input too, as the
/// plain copy's does, quietly (status 0, nothing on stderr), though
/// commands died of SIGPIPE. Noticed before a command starts (a fast rate,
/// one or four at once), and while waiting for the next record's moment
/// (a minute away, stdin open and quiet: nothing else wakes the run).
#[test]
fn a_reader_that_goes_away_ends_a_run_of_commands_quietly() {
    let _one = one_at_a_time();
    for (rate, endless) in [
        (&["1000/s"][..], true),
        (&["1000/s", "-j", "4"][..], true),
        (&["1/min"][..], false),
    ] {
        let mut args = rate.to_vec();
        args.extend_from_slice(&["--", "echo", "{}"]);
        let (status, said) = reader_leaves_after_a_line(&args, endless);
        assert_eq!(status.code(), Some(0), "{rate:?}: {status:?}: {said}");
        assert_eq!(said, "", "{rate:?}");
    }
}

/// A command that is a shell ends with status 141 where the command it
/// ran was killed by SIGPIPE (`sh -c '... | cat'`): once stdout's reader
/// has gone, that is the run cut short too, not a failure. Before: status
/// 1, 'the command for record 1 failed: exit status: 141'. (Record 1's
/// command writes its line, then, a second later, after the reader has
/// gone, again through `cat`.)
#[test]
fn a_shell_whose_command_met_the_gone_reader_is_not_a_failure() {
    let _one = one_at_a_time();
    let args = [
        "1/min",
        "--",
        "sh",
        "-c",
        "echo \"$1\"; sleep 1; echo \"$1\" | cat",
        "sh",
        "{}",
    ];
    let (status, said) = reader_leaves_after_a_line(&args, false);
    assert_eq!(status.code(), Some(0), "{status:?}: {said}");
    assert_eq!(said, "");
}

/// Runs paceline with `args` on endless input, or on one record and a
/// stdin kept open and quiet; reads the first line (`y`) and goes away:
/// how paceline ended (within 20 s, else a failure) and what it said on
/// stderr.
pub(super) fn reader_leaves_after_a_line(
    args: &[&str],
    endless: bool,
) -> (std::process::ExitStatus, String) {
    let mut child = paceline(args).spawn().unwrap();
    let (writer, stdin) = match endless {
        true => (Some(feed_endlessly(&mut child)), None),
        false => {
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"y\n").unwrap();
            (None, Some(stdin))
        }
    };
    let said = read_all(child.stderr.take().unwrap());
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "y\n", "{args:?}");
    drop(stdout);
    let status = ended_within(&mut child, Duration::from_secs(20), &format!("{args:?}"));
    drop(stdin);
    if let Some(writer) = writer {
        writer.join().unwrap();
    }
    let said = said
        .recv_timeout(Duration::from_secs(10))
        .expect("stderr still open");
    (status, said)
}

/// A command that failed of itself (not of SIGPIPE once the reader was
/// gone) still makes the status 1 when the reader goes away after it.
#[test]
fn a_command_that_failed_before_the_reader_went_away_still_fails_the_run() {
    let _one = one_at_a_time();
    let mut child = paceline(&[
        "1000/s",
        "--",
        "sh",
        "-c",
        "echo \"$1\"; exit 3",
        "sh",
        "{}",
    ])
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let writer = feed_endlessly(&mut child);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "y\n");
    drop(stdout);
    let status = ended_within(&mut child, Duration::from_secs(20), "exit 3");
    writer.join().unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
}

/// Stdout a regular file, or a device: never a reader to lose, every
/// record still gets its command, as ever.
#[test]
fn with_stdout_a_file_every_record_gets_its_command() {
    let path = temp_path("commands-to-a-file");
    for to_file in [true, false] {
        let stdout = match to_file {
            true => std::fs::File::create(&path).unwrap(),
            false => std::fs::File::create("/dev/null").unwrap(),
        };
        let mut child = paceline(&["1e9/s", "--json", "--", "echo", "{}"])
            .stdout(stdout)
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines(200).as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let summary = String::from_utf8_lossy(&output.stderr);
        assert!(summary.contains("\"commands\":200,"), "{summary}");
        assert!(summary.contains("\"failed\":0,"), "{summary}");
        if to_file {
            assert_eq!(std::fs::read_to_string(&path).unwrap(), lines(200));
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// The longest argument Linux lets a command have: 32 pages, its ending
/// NUL included.
fn longest_argument() -> usize {
    // SAFETY: sysconf only reads.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    32 * usize::try_from(page).unwrap() - 1
}

/// A record that would make an argument longer than the system lets one
/// be (`{}` in it) gets no command: named on stderr with its number and
/// why, counted as failed (status 1), the records around it run; one
/// byte less runs, unchanged. Counted with what the argument holds beside
/// the record, and with each `{}`.
#[test]
fn a_record_too_long_for_an_argument_is_named_and_fails_its_command() {
    let most = longest_argument();
    for (arg, fits) in [
        ("{}", most),
        ("x{}", most - 1),
        ("{}{}", most / 2),
        ("<{}|{}>", (most - 3) / 2),
    ] {
        for len in [fits, fits + 1] {
            let record = vec![b'r'; len];
            let input = [&b"first\n"[..], &record, b"\nlast\n"].concat();
            let output = run(&["1e9/s", "--json", "--", "printf", "%s\n", arg], &input);
            let stderr = String::from_utf8_lossy(&output.stderr);
            let case = format!("{arg}, a record of {len} bytes");
            let line = |record: &str| format!("{}\n", arg.replace("{}", record));
            if len == fits {
                assert!(output.status.success(), "{case}: {stderr}");
                let record = String::from_utf8(record).unwrap();
                let expected = [line("first"), line(&record), line("last")].concat();
                assert!(
                    output.stdout == expected.as_bytes(),
                    "{case}: the bytes changed"
                );
            } else {
                assert_eq!(output.status.code(), Some(1), "{case}: {stderr}");
                let expected = [line("first"), line("last")].concat();
                assert_eq!(String::from_utf8_lossy(&output.stdout), expected, "{case}");
                assert!(
                    stderr.contains("record 2 failed") && stderr.contains(&most.to_string()),
                    "{case}: {stderr}"
                );
                assert!(stderr.contains("\"failed\":1,"), "{case}: {stderr}");
            }
        }
    }
}

/// A record too long for an argument is refused before the argument is
/// built: a record of 50 MiB in place of `{}` took a peak of 164 MB (the
/// argument built, then copied, for the system to refuse it), where the
/// record alone takes 76 MB. Here one of 48 MiB between short records:
/// at most 96 MiB at the peak, as a long record is held in every mode.
#[test]
fn a_record_too_long_for_an_argument_is_not_copied_into_one() {
    let mut input = b"a before\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 48 << 20));
    input.extend_from_slice(b"\nb after\n");
    let mut child = paceline(&["1e9/s", "--", "echo", "{}"]).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The input stays open: the peak is read while paceline lives.
    let writer = std::thread::spawn(move || {
        stdin.write_all(&input).unwrap();
        stdin
    });
    let expected = b"a before\nb after\n";
    let mut out = vec![0u8; expected.len()];
    child.stdout.take().unwrap().read_exact(&mut out).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    drop(writer.join().unwrap());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(out, expected);
    assert!(stderr.contains("record 2 failed"), "{stderr}");
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    assert!(peak_kib <= 96 << 10, "a peak of {peak_kib} KiB");
}
