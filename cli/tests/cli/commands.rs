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
