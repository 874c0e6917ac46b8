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
