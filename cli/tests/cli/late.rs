//! `--on-late fail` ends the run with status 3, but only after every
//! record granted before the late one has gone out, each at its moment.

use super::*;

#[test]
fn a_late_record_fails_the_run_after_the_records_granted_before_it() {
    let _one = one_at_a_time();
    let output = run(
        &["1/s", "--on-late", "fail", "--max-wait", "10ms"],
        b"a\nb\nc\n",
    );
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(output.stdout, b"a\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("record 2"), "{stderr}");

    // At 2/s, waits of 0 and 500 ms fit in 600 ms, 1 s does not: the
    // first two go, the second at its moment, then the run fails.
    let start = Instant::now();
    let mut child = fed(
        &["2/s", "--on-late", "fail", "--max-wait", "600ms"],
        b"1\n2\n3\n4\n",
    );
    let got = timed_lines(&mut child, start);
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let texts: Vec<&str> = got.iter().map(|(_, line)| line.as_str()).collect();
    assert_eq!(texts, ["1", "2"]);
    // (Since the start: a line reaches this reader later than it was
    // written, never sooner, so load cannot fake this.)
    let second = got[1].0;
    assert!(
        second >= Duration::from_millis(499),
        "the second came {second:?} after the start"
    );
}

#[test]
fn per_key_and_with_a_command_too() {
    let _one = one_at_a_time();
    // Each key's first record is granted; the second of `a` is late.
    let output = run(
        &[
            "1/s",
            "--key",
            "1",
            "--on-late",
            "fail",
            "--max-wait",
            "10ms",
        ],
        b"a 1\nb 1\na 2\nb 2\n",
    );
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(output.stdout, b"a 1\nb 1\n");
    // A command runs for each record granted, and ends, before the exit.
    let output = run(
        &[
            "1/s",
            "--on-late",
            "fail",
            "--max-wait",
            "10ms",
            "--",
            "sh",
            "-c",
            "sleep 0.2; echo \"$1\"",
            "sh",
            "{}",
        ],
        b"a\nb\nc\n",
    );
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(output.stdout, b"a\n");
}

/// With a command, the wait for one of the `-j` to be free counts too: a
/// record no command could start for within `--max-wait` of its reading is
/// late (before, all four below ran, the last 1.5 s late). With
/// room, every record runs.
#[test]
fn with_a_command_the_wait_for_a_job_counts() {
    let _one = one_at_a_time();
    let command = ["--", "sh", "-c", "echo \"$1\"; sleep 0.5", "sh", "{}"];
    let args = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["100/s", "--max-wait", "100ms", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&command);
        args
    };
    // One at a time: the first runs half a second, and the others, granted
    // within 30 ms, are late for it.
    let output = run(&args(&[]), b"1\n2\n3\n4\n");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(output.stdout, b"1\n");
    let summary = String::from_utf8_lossy(&output.stderr);
    assert!(summary.contains("\"dropped\":3"), "{summary}");
    // Failing on a late record: status 3, once the first has run.
    let output = run(&args(&["--on-late", "fail"]), b"1\n2\n3\n4\n");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(output.stdout, b"1\n");
    assert!(String::from_utf8_lossy(&output.stderr).contains("record 2"));
    // Four at once: room for each.
    let output = run(&args(&["-j", "4"]), b"1\n2\n3\n4\n");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let mut lines: Vec<&[u8]> = output.stdout.split(|b| *b == b'\n').collect();
    lines.sort();
    assert_eq!(lines, [&b""[..], b"1", b"2", b"3", b"4"]);
}

/// The last record, unterminated, runs its command once every other has
/// ended (what they write goes first), but with room among the `-j` it is
/// not late for that: it runs as it would with a newline at its end
/// (before, with `--max-wait` it was dropped whenever the other commands
/// ran longer than that, for want of its newline).
#[test]
fn an_unterminated_last_record_is_not_late_for_the_commands_before_it() {
    let _one = one_at_a_time();
    let args = [
        "100/s",
        "--max-wait",
        "100ms",
        "--json",
        "-j",
        "4",
        "--",
        "sh",
        "-c",
        "echo \"$1\"; sleep 0.5",
        "sh",
        "{}",
    ];
    for input in [&b"1\n2\n3\n"[..], b"1\n2\n3"] {
        let output = run(&args, input);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        let mut lines: Vec<&[u8]> = output.stdout.split(|b| *b == b'\n').collect();
        lines.sort();
        assert_eq!(lines, [&b""[..], b"1", b"2", b"3"], "{output:?}");
        let summary = String::from_utf8_lossy(&output.stderr);
        assert!(summary.contains("\"dropped\":0"), "{summary}");
    }
}

/// With `--on-late fail` and a command, a record found late for want of
/// one of the `-j` ends the run there: a record after it, read and granted
/// before it was released, runs no command, though one of the `-j` came
/// free within that record's own `--max-wait`. Before, it ran after the
/// failure ('run 3', status 3, "none after").
///
/// At 24/min (2.5 s apart) with `--max-wait 4s`: record 1 runs until 4.85
/// s; record 2 (read at 0, due at 2.5 s) is late at 4 s; record 3 (read at
/// 1.75 s, due at 5 s) would have had one free at 4.85 s, before its own
/// bound of 5.75 s. Load only makes record 1 end later, which that bound
/// leaves 0.9 s for.
#[test]
fn no_record_after_the_late_one_runs_with_on_late_fail() {
    let _one = one_at_a_time();
    let mut child = paceline(&[
        "24/min",
        "--max-wait",
        "4s",
        "--on-late",
        "fail",
        "--json",
        "--",
        "sh",
        "-c",
        "echo \"run $1\"; [ \"$1\" = 1 ] && sleep 4.85; true",
        "sh",
        "{}",
    ])
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"1\n2\n").unwrap();
    std::thread::sleep(Duration::from_millis(1750));
    let _ = stdin.write_all(b"3\n");
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "run 1\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("record 2 would have waited"), "{stderr}");
    assert!(stderr.contains("\"commands\":1,"), "{stderr}");
}

/// The failure names the first late record in input order, and with
/// `--on-late fail` nothing is dropped: records 2 and 3, granted and then
/// late for want of the one `-j` (record 1 runs 4 s, their bound is 2.5
/// s), come before record 4, whose reservation (3 s away) was refused as
/// it was read. Before, the run failed on record 4 ("the records before it
/// went out") with records 2 and 3 counted as dropped.
#[test]
fn on_late_fail_names_the_first_late_record_and_drops_none() {
    let _one = one_at_a_time();
    let output = run(
        &[
            "1/s",
            "--max-wait",
            "2500ms",
            "--on-late",
            "fail",
            "--json",
            "--",
            "sh",
            "-c",
            "echo \"run $1\"; [ \"$1\" = 1 ] && sleep 4; true",
            "sh",
            "{}",
        ],
        b"1\n2\n3\n4\n",
    );
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "run 1\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("record 2 would have waited"), "{stderr}");
    assert!(stderr.contains("\"dropped\":0,"), "{stderr}");
}

/// A record late for want of one of the `-j` fails the run with `--on-late
/// fail` though a failure further on in the input (a record past
/// `--max-record`) was met first: it comes first in the input, and the run
/// stops there. Record 1 runs 2 s; record 2, due at 0.5 s, waits for it
/// past its `--max-wait` of 1 s; record 3, too long, was read with it.
/// Before, record 2 was counted as dropped and the run ended with status
/// 6 for record 3, nothing said of record 2.
#[test]
fn a_late_record_is_named_though_a_longer_one_after_it_was_met_first() {
    let _one = one_at_a_time();
    let mut input = b"1\n2\n".to_vec();
    input.extend_from_slice(&[b'x'; 2000]);
    input.extend_from_slice(b"\n4\n");
    let args = |on_late: &'static str| {
        [
            "2/s",
            "--max-wait",
            "1s",
            "--on-late",
            on_late,
            "--max-record",
            "1000",
            "--json",
            "--",
            "sh",
            "-c",
            "echo \"run $1\"; [ \"$1\" = 1 ] && sleep 2; true",
            "sh",
            "{}",
        ]
    };
    let output = run(&args("fail"), &input);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "run 1\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("record 2 would have waited"), "{stderr}");
    assert!(stderr.contains("\"dropped\":0,"), "{stderr}");
    // Dropping it, the run still ends on the record too long.
    let output = run(&args("drop"), &input);
    assert_eq!(output.status.code(), Some(6), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "run 1\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--max-record"), "{stderr}");
    assert!(stderr.contains("\"dropped\":1,"), "{stderr}");
}
