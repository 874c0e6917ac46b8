//! The command line keeping what its help and README promise under
//! strain: bad input, extremes of every option, keys past the cap, a
//! command per record, stopped pipes and signals. Records keep their
//! order and bytes, the summary counts what happened and no more, and
//! what is bounded says so.

use super::*;

/// paceline with `args`, `input` on a stdin then closed (or kept open
/// with `keep_open`), given `bound` to end; killed then (SIGKILL). What
/// it wrote to stdout by then, how it ended (`None`: it was still
/// running) and its stderr.
fn within(
    args: &[&str],
    input: &[u8],
    keep_open: bool,
    bound: Duration,
) -> (Vec<u8>, Option<std::process::ExitStatus>, String) {
    let mut child = paceline(args).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Written on a thread: paceline may stop reading before the end.
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
        match keep_open {
            true => Some(stdin),
            false => None,
        }
    });
    let stdout = read_all_bytes(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(writer.join().unwrap());
    (stdout.recv().unwrap(), status, stderr.recv().unwrap())
}

/// All of `pipe`'s bytes, read on a thread of its own.
fn read_all_bytes(mut pipe: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = sender.send(bytes);
    });
    receiver
}

/// The number after `"name":` in a `--json` summary.
pub(super) fn summary_number(stderr: &str, name: &str) -> f64 {
    let field = format!("\"{name}\":");
    let at = stderr
        .rfind(&field)
        .unwrap_or_else(|| panic!("no {name} in {stderr}"))
        + field.len();
    let text: String = stderr[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    text.parse()
        .unwrap_or_else(|_| panic!("{name}: {text:?} in {stderr}"))
}

/// The lines of `bytes` whose first field is `key`, in the order they came.
fn lines_of_key(bytes: &[u8], key: &str) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|line| line.split_whitespace().next() == Some(key))
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------
// Order, keys and counts.
// ---------------------------------------------------------------------

/// Records of one key come out in the order they came in, whatever
/// `--max-keys` dropped. At 1/s per key with `--max-keys 1`: `a 1` goes,
/// `a 2` waits a second; `b 1` drops key `a` (it forgets its debt, as the
/// help says); `a 3` drops `b`, and `a`, back, starts afresh. Starting
/// afresh may let `a 3` go sooner than the rate would, but never before
/// `a 2`, still waiting (not `a 1, b 1, a 3, a 2`); with a command per
/// record, the commands start in that order too.
#[test]
fn records_of_one_key_keep_their_order_when_the_key_is_dropped_at_the_cap() {
    let input = b"a 1\na 2\nb 1\na 3\n";
    for args in [
        &["1/s", "--key", "1", "--max-keys", "1"][..],
        &["1/s", "--key-regex", "^(\\w)", "--max-keys", "1"][..],
        &[
            "1/s",
            "--key",
            "1",
            "--max-keys",
            "1",
            "--",
            "sh",
            "-c",
            "echo \"$1\"",
            "sh",
            "{}",
        ][..],
    ] {
        let output = run(args, input);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(
            lines_of_key(&output.stdout, "a"),
            ["a 1", "a 2", "a 3"],
            "{args:?}: got {:?}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
}

/// `--max-keys N`: "The most keys held at once. At the cap, keys ... go".
/// Below the cap no key is dropped: 63 keys with `--max-keys 64`, each
/// seen twice at 1/min, let the first 63 records go and hold the second
/// 63 a minute. The cap is split between parts of the key space (here
/// four of 16 keys each), one of which overflows long before 64 keys:
/// keys are dropped with 63 held (the summary counts 20 to 50), and their
/// second record goes at once, a minute early.
#[test]
fn fewer_keys_than_max_keys_are_never_dropped() {
    let _one = one_at_a_time();
    let mut input = String::new();
    for _ in 0..2 {
        for key in 1..=63 {
            input.push_str(&format!("k{key} x\n"));
        }
    }
    let (stdout, status, stderr) = within(
        &["1/min", "--key", "1", "--max-keys", "64", "--json"],
        input.as_bytes(),
        false,
        Duration::from_secs(3),
    );
    assert!(status.is_none(), "ended {status:?}: {stderr}");
    let out = String::from_utf8_lossy(&stdout).lines().count();
    assert_eq!(
        out, 63,
        "with 63 keys under a cap of 64, {out} records went within 3 s at 1/min per key"
    );
}

/// The summary's count of keys dropped unfinished, where there must be
/// none: at or under the cap, each key seen once. It said 20 to 30 for 60
/// keys under a cap of 64, and 1 to 3 (most runs) for 32 keys under 32:
/// the same cause as above, the cap shared out between parts of the key
/// space.
#[test]
fn the_summary_counts_no_dropped_keys_at_or_under_the_cap() {
    for (keys, cap) in [(60, 64), (32, 32), (900, 1000)] {
        let input: String = (1..=keys).map(|key| format!("k{key}\n")).collect();
        let cap_text = cap.to_string();
        let output = run(
            &["1/min", "--key", "1", "--max-keys", &cap_text, "--json"],
            input.as_bytes(),
        );
        assert!(output.status.success(), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            summary_number(&stderr, "keys_dropped_unfinished"),
            0.0,
            "{keys} keys, --max-keys {cap}: {stderr}"
        );
    }
}

/// A last record without a newline must not be glued to the next (the
/// help of --key: "A last record without a separator goes out after every
/// other (its bytes stay its own: written sooner, the next would join
/// it)"). To stdout see promises.rs; here through a command that copies
/// its record from stdin: `a 1`, `a 2`, `b 3` (unterminated) at 2/s per
/// key, the last record's key free at once, still come out as three
/// records, not `a 1\nb 3a 2\n` (its command starts once every other
/// has ended).
#[test]
fn an_unterminated_last_record_is_not_glued_to_the_next_through_a_command() {
    for args in [
        &["2/s", "--key", "1", "--", "cat"][..],
        &["2/s", "--key-regex", "^(\\w)", "--", "cat"][..],
    ] {
        let output = run(args, b"a 1\na 2\nb 3");
        assert!(output.status.success(), "{args:?}: {output:?}");
        let mut records: Vec<&[u8]> = output.stdout.split(|b| *b == b'\n').collect();
        if records.last().is_some_and(|r| r.is_empty()) {
            records.pop();
        }
        records.sort();
        assert_eq!(
            records,
            [&b"a 1"[..], b"a 2", b"b 3"],
            "{args:?}: got {:?}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
}

/// `--json`: "records and bytes out". With stdout a full device, nothing
/// goes out (status 5), and the summary counts nothing out (not
/// `"records":2,"bytes":8`), in every mode.
#[test]
fn the_summary_counts_nothing_out_when_no_write_succeeded() {
    for mode in [
        &["1e6/s"][..],
        &["1e6/s", "--key", "1"][..],
        &["1e6/s", "--max-wait", "1s"][..],
        &["--bytes", "1e6/s"][..],
    ] {
        let mut args = mode.to_vec();
        args.push("--json");
        let mut child = paceline(&args)
            .stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"a 1\nb 2\n")
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(5), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            summary_number(&stderr, "records"),
            0.0,
            "{args:?}: {stderr}"
        );
        assert_eq!(summary_number(&stderr, "bytes"), 0.0, "{args:?}: {stderr}");
    }
}

/// `--key`: memory is bounded: once 100 000 records wait, of every key
/// together, no more input is read until fewer do, so the records behind
/// a key's deep backlog in the input wait for that room, whatever their
/// key. 150 000 records of key `a` at 100 000/s, then `b 1`: `b 1` is read
/// only with fewer than 100 000 waiting, in a read of at most 256 KiB
/// (some 29 000 of these records), so at least 20 000 of `a`'s go before
/// it, where with no bound it would go at once. Every record goes, each
/// key's in order, bytes unchanged.
#[test]
fn a_key_with_a_deep_backlog_holds_back_what_comes_behind_it() {
    let _one = one_at_a_time();
    let mut input = String::new();
    for i in 1..=150_000 {
        input.push_str(&format!("a {i}\n"));
    }
    input.push_str("b 1\n");
    let output = run(&["100000/s", "--key", "1"], input.as_bytes());
    assert!(output.status.success(), "{:?}", output.status);
    let out = String::from_utf8(output.stdout).unwrap();
    let expected: Vec<String> = (1..=150_000).map(|i| format!("a {i}")).collect();
    assert!(
        lines_of_key(out.as_bytes(), "a") == expected,
        "the records of key a changed or left their order"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 150_001);
    let b = lines
        .iter()
        .position(|line| *line == "b 1")
        .expect("b 1 out");
    assert!(b >= 20_000, "b 1 went after only {b} records of a");
}

/// `--json` counts "commands started, commands failed (those that could
/// not start too)". Three records through a program that is not there:
/// `"commands":0,"failed":3` (not 3 started), the failures named, as the
/// help says: "A command that fails (exits non-zero, is killed, cannot
/// start, ...)".
#[test]
fn a_command_that_cannot_start_is_not_counted_as_started() {
    let output = run(
        &["1e6/s", "--json", "--", "/nonexistent/program", "{}"],
        b"a\nb\nc\n",
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot run /nonexistent/program"),
        "{stderr}"
    );
    assert_eq!(summary_number(&stderr, "failed"), 3.0, "{stderr}");
    assert_eq!(summary_number(&stderr, "commands"), 0.0, "{stderr}");
}

/// `--key-regex`: "the key is the first group REGEX captures in the
/// record (the first that takes part in the match; its whole match if
/// none does)". With `a=(\w+)|b=(\w+)`, the record `b=x 2` has one group
/// that captures, the second, `x`: its key is `x`, as `a=x 1`'s is (not
/// the whole match `b=x`), and at 1/min it waits a minute.
#[test]
fn the_key_is_the_first_group_that_captures() {
    let (stdout, status, stderr) = within(
        &["1/min", "--key-regex", "a=(\\w+)|b=(\\w+)"],
        b"a=x 1\nb=x 2\n",
        false,
        Duration::from_secs(3),
    );
    assert_eq!(stdout, b"a=x 1\n", "{stderr}");
    assert!(status.is_none(), "ended {status:?}: {stderr}");
}

/// `--key-regex` takes the whole regex language: case-insensitive
/// matching and Unicode classes were refused as bad arguments (status 2,
/// "make sure the unicode-case feature is enabled", "Unicode property not
/// found"). `USER=a 1` and `user=a 2` share the key `a`, as `été 1` and
/// `été 2` share `été`: at 1/min the second waits a minute.
#[test]
fn the_key_regex_matches_without_case_and_by_unicode_class() {
    for (regex, input, first) in [
        (
            r"(?i)user=(\w+)",
            &b"USER=a 1\nuser=a 2\n"[..],
            &b"USER=a 1\n"[..],
        ),
        (
            r"^(\p{L}+)",
            "été 1\nété 2\n".as_bytes(),
            "été 1\n".as_bytes(),
        ),
    ] {
        let (stdout, status, stderr) = within(
            &["1/min", "--key-regex", regex],
            input,
            false,
            Duration::from_secs(3),
        );
        assert_eq!(stdout, first, "{regex}: {stderr}");
        assert!(status.is_none(), "{regex}: ended {status:?}: {stderr}");
    }
}

// ---------------------------------------------------------------------
// Extremes, empty input, signals, bytes that are not text.
// ---------------------------------------------------------------------

/// Every option at its extremes (zero, NaN, infinities, the largest
/// numbers, durations of centuries, empty strings) is either refused as a
/// bad argument (status 2, a message naming what is wrong) or runs: one
/// record in, that record out. Never a panic, never another status.
#[test]
fn options_at_their_extremes_are_refused_or_run_never_panic() {
    let max = u64::MAX.to_string();
    let refused: &[&[&str]] = &[
        &[""],
        &["NaN/s"],
        &["inf/s"],
        &["-inf/s"],
        &["-1/s"],
        &["1e-320/day"],
        &["1e309/s"],
        &["--bytes", "1e300GiB/s"],
        &["--bytes", "NaN/s"],
        &["10/s", "--limit", ""],
        &["10/s", "--limit", "0/s"],
        &["10/s", "--burst", &max],
        &["10/s", "--burst", "-1"],
        &["10/s", "--warmup", "-1s"],
        &["10/s", "--warmup", "NaNs"],
        &["10/s", "--max-wait", "1e999s"],
        &["10/s", "--max-wait", "99999999999999999999999999s"],
        &["10/s", "--timeout", "0.0001us", "--", "true"],
        &["10/s", "--max-record", "0.5"],
        &["10/s", "--max-record", "inf"],
        &["10/s", "--max-record", "NaN"],
        &["10/s", "--max-key", "0"],
        &["10/s", "--max-keys", "0", "--key", "1"],
        &["10/s", "--max-keys", "-1", "--key", "1"],
        &["10/s", "--key", "-1"],
        &["10/s", "-j", "-1", "--", "true"],
    ];
    for args in refused {
        let output = run(args, b"x\n");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let runs: &[&[&str]] = &[
        &["1e-300/s"],
        &["1e300/s"],
        &["1e308/s"],
        &["1e-300/s", "--key", "1"],
        &["1e308/s", "--key", "1"],
        &["1e-300/s", "--max-wait", "0s"],
        &["--bytes", "1e300/s"],
        &["--bytes", "4e12/s"],
        &["10/s", "--max-keys", &max, "--key", "1"],
        &["10/s", "--key", &max],
        &["10/s", "--key-regex", ""],
        &["10/s", "--warmup", "0s"],
        &["10/s", "--warmup", "9999999999999999999s"],
        &["10/s", "--max-wait", "9999999999999999999s"],
        &["10/s", "--max-record", "256TiB"],
        &["10/s", "--max-key", "256TiB", "--key", "1"],
        &["10/s", "--limit", "1e-300/day"],
    ];
    for args in runs {
        let output = run(args, b"x\n");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(output.stdout, b"x\n", "{args:?}");
    }
    // With a command: a timeout of centuries, jobs past any table.
    for args in [
        &["1e6/s", "--timeout", "9999999999999999999s", "--", "cat"][..],
        &["1e6/s", "-j", &max, "--", "cat"][..],
    ] {
        let output = run(args, b"x\n");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");
        assert_eq!(output.stdout, b"x\n", "{args:?}");
    }
}

/// An empty input, in every mode: nothing out, status 0, a summary of
/// nothing.
#[test]
fn an_empty_input_ends_at_once_in_every_mode() {
    for mode in [
        &["1e6/s"][..],
        &["1e6/s", "-0"][..],
        &["--bytes", "1e6/s"][..],
        &["1e6/s", "--key", "1"][..],
        &["1e6/s", "--key-regex", "(x)"][..],
        &["1e6/s", "--max-wait", "1s"][..],
        &["1e6/s", "--", "false"][..],
    ] {
        let mut args = vec!["--json"];
        args.extend_from_slice(mode);
        let output = run(&args, b"");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(summary_number(&stderr, "records"), 0.0, "{args:?}");
        assert_eq!(summary_number(&stderr, "bytes"), 0.0, "{args:?}");
    }
}

/// SIGTERM in the middle of `--bytes`: what went out is a prefix of the
/// input, byte for byte, the summary counts exactly those bytes, and
/// paceline ends by the signal. (A lower bound only on what went: 1 000
/// bytes a second, the signal after 0.5 s.)
#[test]
fn a_signal_mid_bytes_leaves_a_counted_prefix() {
    let _one = one_at_a_time();
    let input: Vec<u8> = (0..5_000u32).map(|i| (i * 31 % 256) as u8).collect();
    let mut child = paceline(&["--bytes", "1000/s", "--json"]).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&input).unwrap();
    let stdout = read_all_bytes(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = exits_within(
        &mut child,
        Duration::from_secs(20),
        "--bytes, SIGTERM",
        || {},
    );
    drop(stdin);
    let out = stdout.recv().unwrap();
    let said = stderr.recv().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}: {said}");
    assert!(
        !out.is_empty() && out.len() < input.len(),
        "{} bytes",
        out.len()
    );
    assert!(input.starts_with(&out), "not a prefix of the input");
    assert_eq!(summary_number(&said, "bytes"), out.len() as f64, "{said}");
}

/// A partial record (no newline yet, stdin still open) is no record: at
/// SIGTERM it is not written, in every record mode; the record before it
/// is. With `--bytes` the bytes read are out already.
#[test]
fn a_partial_record_is_not_written_at_a_signal() {
    let _one = one_at_a_time();
    for (mode, expected) in [
        (&["1e6/s"][..], &b"a 1\n"[..]),
        (&["1e6/s", "--key", "1"][..], b"a 1\n"),
        (&["1e6/s", "--max-wait", "1s"][..], b"a 1\n"),
        (&["1e6/s", "-0"][..], b"a 1\npartial"),
        (&["--bytes", "1e6/s"][..], b"a 1\npartial"),
    ] {
        let mut child = paceline(mode).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"a 1\npartial").unwrap();
        let stdout = read_all_bytes(child.stdout.take().unwrap());
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let status = exits_within(&mut child, Duration::from_secs(20), "partial", || {});
        drop(stdin);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{mode:?}");
        let out = stdout.recv().unwrap();
        // -0: the newline is no separator, nothing is whole yet.
        let expected: &[u8] = if mode.contains(&"-0") { b"" } else { expected };
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected),
            "{mode:?}"
        );
    }
}

/// A record with a NUL byte cannot be a command's argument: its command
/// fails, named with its record's number and why, and every other record
/// still gets its command (status 1). (Its why read "cannot run printf:
/// nul byte found in provided data", as if the command could not be
/// found.) On its stdin the same record goes through whole.
#[test]
fn a_nul_byte_in_place_of_braces_fails_that_command_clearly() {
    let output = run(&["1e6/s", "--", "printf", "[%s]", "{}"], b"a\0b\nc\n");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(output.stdout, b"[c]");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("record 1 failed: the record holds a NUL byte (at byte 1)"),
        "{stderr}"
    );
    let output = run(&["1e6/s", "--", "cat"], b"a\0b\nc\n");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, b"a\0b\nc\n");
}

/// 200 000 keys, each once, at 1/min per key with the default cap: every
/// record out at once, in input order, bytes unchanged, and at a fast
/// rate through a cap of 10 (keys full at once: none unfinished).
#[test]
fn two_hundred_thousand_keys_go_through_unchanged() {
    let input: String = (1..=200_000).map(|i| format!("k{i} x\n")).collect();
    for args in [
        &["1/min", "--key", "1", "--json"][..],
        &["1e9/s", "--key", "1", "--max-keys", "10", "--json"][..],
    ] {
        let output = run(args, input.as_bytes());
        assert!(output.status.success(), "{args:?}: {:?}", output.status);
        assert!(
            output.stdout == input.as_bytes(),
            "{args:?}: the bytes changed"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(summary_number(&stderr, "records"), 200_000.0, "{stderr}");
        if args.contains(&"1e9/s") {
            assert_eq!(
                summary_number(&stderr, "keys_dropped_unfinished"),
                0.0,
                "{stderr}"
            );
        }
    }
}

/// A closed stdin or stdout (`<&-`, `>&-`) is a failure to read or write,
/// status 5, before anything is read: not empty input, and not records
/// swallowed with status 0. Output sent to `/dev/null` on purpose is
/// still a success.
#[test]
fn a_closed_stdin_or_stdout_fails_the_run_and_dev_null_does_not() {
    let run = |redirect: &str| {
        let script = format!("exec \"$0\" 1e9/s {redirect}");
        let mut child = Command::new("sh")
            .args(["-c", &script, PACELINE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(b"a\nb\n");
        let output = child.wait_with_output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(">&-");
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("standard output is closed"), "{stderr}");
    let (code, stderr) = run("<&-");
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("standard input is closed"), "{stderr}");
    let (code, stderr) = run(">/dev/null");
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
}
