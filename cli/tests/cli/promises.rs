//! The promises of `paceline --help` and cli/README.md, one by one: each
//! flag's accepted forms and refusals, the exit statuses, the summary's
//! numbers, records kept whole.

use super::*;

/// A Redis URL on a loopback port nothing listens on: bound, then let go.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("redis://127.0.0.1:{port}/")
}

/// paceline with `args`, `input` on a stdin then closed, given `bound` to
/// end; killed then. What it wrote to stdout by then, and how it ended
/// (`None`: it was still running).
fn output_within(
    args: &[&str],
    input: &[u8],
    bound: Duration,
) -> (Vec<u8>, Option<std::process::ExitStatus>, String) {
    let mut child = fed(args, input);
    let stdout = child.stdout.take().unwrap();
    let stderr = read_all(child.stderr.take().unwrap());
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stdout = stdout;
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        let _ = sender.send(bytes);
    });
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
    let bytes = receiver.recv().unwrap();
    (bytes, status, stderr.recv().unwrap())
}

/// The records of `bytes` split at `separator`, sorted (an empty piece
/// after the last separator is no record).
fn sorted_records(bytes: &[u8], separator: u8) -> Vec<Vec<u8>> {
    let mut records: Vec<Vec<u8>> = bytes
        .split(|b| *b == separator)
        .map(<[u8]>::to_vec)
        .collect();
    if records.last().is_some_and(Vec::is_empty) {
        records.pop();
    }
    records.sort();
    records
}

// ---------------------------------------------------------------------
// What the help or README says, where the program once did otherwise.
// ---------------------------------------------------------------------

/// Per key, a last record with no newline may go before a record of
/// another key still waiting: it must not be glued to it. `a 1`, `a 2`,
/// `b 3` (unterminated) at 2/s per key came out `a 1\nb 3a 2\n`: a reader
/// saw the records `a 1` and `b 3a 2`. The three records must stay three,
/// by lines and by NUL: such a record now goes after the others.
#[test]
fn an_unterminated_last_record_that_overtakes_is_not_glued_to_the_next() {
    for (separator, flag) in [(b'\n', None), (0u8, Some("-0"))] {
        for key in [&["--key", "1"][..], &["--key-regex", "^(\\w)"][..]] {
            let mut args = vec!["2/s"];
            args.extend_from_slice(key);
            args.extend(flag);
            let input = [&b"a 1"[..], b"a 2", b"b 3"].join(&separator);
            let output = run(&args, &input);
            assert!(output.status.success(), "{args:?}: {output:?}");
            assert_eq!(
                sorted_records(&output.stdout, separator),
                vec![b"a 1".to_vec(), b"a 2".to_vec(), b"b 3".to_vec()],
                "{args:?}: got {:?}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
    }
}

/// An empty `--name` is a bad argument (status 2), named as `--name`,
/// whatever Redis does: with Redis unreachable and `--on-down closed` it
/// ended with status 4 ("cannot use Redis"), the name never checked; with
/// `--on-down local` it first said it would pace on a limiter of its own,
/// then "the limiter's name (its Redis key) must not be empty", no flag
/// named.
#[test]
fn an_empty_name_is_a_bad_argument_named_as_such() {
    let url = closed_port_url();
    for on_down in ["local", "open", "closed"] {
        let output = run(
            &["10/s", "--redis", &url, "--name=", "--on-down", on_down],
            b"x\n",
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{on_down}: {stderr}");
        assert!(stderr.contains("--name"), "{on_down}: {stderr}");
        assert!(output.stdout.is_empty(), "{on_down}: {output:?}");
    }
}

/// A burst past what the limiter stores is refused (status 2), named as the
/// user wrote it (the message said `paceline: invalid argument: limit 0:
/// its burst of 200000 is more than ...`).
#[test]
fn a_burst_too_large_is_refused_naming_burst() {
    let output = run(&["1/day", "--burst", "200000"], b"x\n");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--burst"), "{stderr}");
}

/// `--json` reports the "rate": with `--bytes` it read 0.000 (and the
/// progress line 0.0/s) after 200 bytes went at 100 bytes a second, the
/// rate of records, of which a byte stream has none; and "waited" (the
/// "records that waited") counted bytes. The rate of a byte run is its
/// bytes a second, as the help now says, and "waited" its bytes.
#[test]
fn the_summary_of_a_byte_run_gives_its_rate() {
    let output = run(
        &["--bytes", "100/s", "--burst", "100", "--json"],
        &[b'x'; 150],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout.len(), 150);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("\"rate\":0.000"), "{stderr}");
}

/// `--json` reports the "rate": it was the records over the run's
/// seconds, so 3 records at 2/s read 3.0 (the first goes at once: the 3
/// take 1 s), and 5 at 2/s with `--burst 3` read 5.0. It is the pace they
/// went at: those out after the first moment (a burst, or the first
/// record; commands started together with one of the -j free for each)
/// over the seconds from it to the last; in every mode, and in bytes with
/// `--bytes`. (The span is 1 s; the bounds are wide for a loaded
/// machine, and the old figures are above them.)
#[test]
fn the_summary_rate_is_the_pace_records_went_at() {
    let _one = one_at_a_time();
    let three = lines(3);
    let five = lines(5);
    for (args, input, rate) in [
        (&["2/s"][..], three.as_bytes(), 2.0),
        (&["2/s", "--burst", "3"][..], five.as_bytes(), 2.0),
        (
            &["2/s", "--burst", "3", "--key", "1"][..],
            five.as_bytes(),
            2.0,
        ),
        (&["2/s", "--max-wait", "1h"][..], three.as_bytes(), 2.0),
        (&["2/s", "--", "true"][..], three.as_bytes(), 2.0),
        (
            &["2/s", "--burst", "3", "-j", "3", "--", "true"][..],
            five.as_bytes(),
            2.0,
        ),
        (
            &["--bytes", "200/s", "--burst", "100"][..],
            &[b'x'; 300][..],
            200.0,
        ),
    ] {
        let args = [&["--json"][..], args].concat();
        let output = run(&args, input);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        let got = fidelity::summary_number(&stderr, "rate");
        // A late record lowers the rate, a late first raises it a little;
        // over the run's seconds it read 1.5 and 2.5 times the rate.
        assert!(
            got >= 0.5 * rate && got <= 1.35 * rate,
            "{args:?}: a rate of {got}, not {rate}: {stderr}"
        );
    }
    // Nothing after the first moment: no pace to tell.
    for (args, input) in [
        (&["2/s", "--json"][..], lines(1).as_bytes()),
        (&["2/s", "--json", "--", "true"][..], lines(1).as_bytes()),
        (&["2/s", "--json"][..], &b""[..]),
    ] {
        let output = run(args, input);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains("\"rate\":null,"), "{args:?}: {stderr}");
    }
}

/// `--json` reports the "records" out: with `--bytes` it read 0 whatever
/// went (`printf "a\nb\nc" | paceline --bytes 1e9/s --json`: records 0,
/// bytes 5). A byte run's records are those among its bytes, by the
/// separator, as every other run counts them: the last unterminated one
/// too, once all of it went.
#[test]
fn the_summary_of_a_byte_run_counts_its_records() {
    for (args, input, records) in [
        (&["--bytes", "1e9/s", "--json"][..], &b"a\nb\nc"[..], 3),
        (&["--bytes", "1e9/s", "--json"][..], b"a\nb\n\n", 3),
        (&["--bytes", "1e9/s", "--json"][..], b"", 0),
        (&["--bytes", "1e9/s", "--json", "-0"][..], b"a\0b\nc\0", 2),
        (
            &["--bytes", "100/s", "--burst", "100", "--json"][..],
            b"1\n2\n3",
            3,
        ),
    ] {
        let output = run(args, input);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(output.stdout, input);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let expected = format!("\"records\":{records},\"bytes\":{},", input.len());
        assert!(stderr.contains(&expected), "{args:?} {input:?}: {stderr}");
    }
}

// ---------------------------------------------------------------------
// What holds, pinned.
// ---------------------------------------------------------------------

/// Rates read as the help writes them, in every spelling the parser
/// knows; `10/2s` and unknown units are refused with status 2 and a
/// message that says how to write one.
#[test]
fn rates_in_every_documented_form() {
    for rate in [
        "10/s",
        "1/min",
        "0.5/s",
        "1e3/h",
        "5/day",
        "10/sec",
        "10/second",
        "10/m",
        "10/minute",
        "10/hour",
        "10/d",
        " 10 / s",
    ] {
        let output = run(&[rate, "--max-wait", "1h"], b"x\n");
        assert!(output.status.success(), "{rate}: {output:?}");
        assert_eq!(output.stdout, b"x\n", "{rate}");
    }
    for rate in ["10/2s", "10/S", "10/secs", "10/", "/s", "10"] {
        let output = run(&[rate], b"x\n");
        assert_eq!(output.status.code(), Some(2), "{rate}: {output:?}");
        assert!(output.stdout.is_empty(), "{rate}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("bad rate") && stderr.contains("10/s"),
            "{rate}: {stderr}"
        );
    }
}

/// `--max-wait` is a bound, not a strict one: at 10/s a record that
/// waits exactly one interval (100 ms) goes, the one after is dropped.
#[test]
fn max_wait_lets_a_wait_of_exactly_the_bound_go() {
    let _one = one_at_a_time();
    for key in [&[][..], &["--key", "1"][..]] {
        let mut args = vec!["10/s", "--max-wait", "100ms", "--json"];
        args.extend_from_slice(key);
        let output = run(&args, b"a\na\na\n");
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(output.stdout, b"a\na\n", "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("\"dropped\":1"), "{args:?}: {stderr}");
    }
}

/// `--key` past the record's fields, and `--key-regex` matching nothing,
/// are the empty key: such records share one key (the second waits a
/// minute at 1/min, where a record of its own key goes at once).
#[test]
fn no_field_and_no_match_are_one_empty_key() {
    for key in [&["--key", "3"][..], &["--key-regex", "zzz"][..]] {
        let mut args = vec!["1/min"];
        args.extend_from_slice(key);
        let (stdout, status, _) = output_within(&args, b"a b\nc d\n", Duration::from_secs(3));
        assert_eq!(stdout, b"a b\n", "{args:?}");
        assert!(status.is_none(), "{args:?}: ended {status:?}");
    }
}

/// "5 reading or writing failed": stdout on a full device, stdin a
/// directory, in the plain copy, the byte stream and the scheduled run;
/// the message says which failed.
#[test]
fn failed_reads_and_writes_end_with_status_five() {
    for args in [
        &["1e6/s"][..],
        &["--bytes", "1e6/s"][..],
        &["1e6/s", "--key", "1"][..],
        &["1e6/s", "--max-wait", "1s"][..],
    ] {
        let mut child = paceline(args)
            .stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"a\n").unwrap();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(5), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("paceline: writing stdout: "),
            "{args:?}: {stderr}"
        );
        let output = paceline(args)
            .stdin(std::fs::File::open(std::env::temp_dir()).unwrap())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(5), "{args:?} < dir: {output:?}");
        assert!(output.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("paceline: reading stdin: "),
            "{args:?}: {stderr}"
        );
    }
}

/// "Statuses 3 to 6 win over 1": a command failed, then a late record
/// (3), a record too long (6), a key too long (6).
#[test]
fn statuses_three_to_six_win_over_a_failed_command() {
    for (args, input, code) in [
        (
            &[
                "10/s",
                "--max-wait",
                "50ms",
                "--on-late",
                "fail",
                "--",
                "false",
            ][..],
            &b"a\nb\n"[..],
            3,
        ),
        (
            &["1e6/s", "--max-record", "4", "--", "false"][..],
            &b"a\nbbbbbbbb\n"[..],
            6,
        ),
        (
            &["1e6/s", "--key", "1", "--max-key", "1", "--", "false"][..],
            &b"a\nbb\n"[..],
            6,
        ),
    ] {
        let output = run(args, input);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
    }
}

/// `--on-down open` with Redis unreachable lets every record through at
/// once; `closed` does not start (4); nothing but records on stdout.
#[test]
fn on_down_open_lets_everything_through_and_closed_does_not_start() {
    let url = closed_port_url();
    for mode in [&[][..], &["--key", "1"][..]] {
        let mut args = vec!["1/min", "--redis", url.as_str(), "--on-down", "open"];
        args.extend_from_slice(mode);
        let (stdout, status, stderr) = output_within(&args, b"a\na\na\n", Duration::from_secs(20));
        assert_eq!(stdout, b"a\na\na\n", "{args:?}: {stderr}");
        assert!(status.is_some_and(|s| s.success()), "{args:?}: {stderr}");
        assert!(stderr.contains("--on-down open"), "{stderr}");
        let mut args = vec!["1/min", "--redis", url.as_str(), "--on-down", "closed"];
        args.extend_from_slice(mode);
        let output = run(&args, b"a\n");
        assert_eq!(output.status.code(), Some(4), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty());
    }
}

/// CRLF, bytes that are not UTF-8 and a last record without a newline go
/// through unchanged, to stdout and to `{}`; `\r` is whitespace to
/// `--key`.
#[test]
fn crlf_and_other_bytes_stay_bytes() {
    let input = b"k1 \xff\xfe\r\nk1 y\r\nk2 z";
    for mode in [&[][..], &["--key", "1"][..], &["--max-wait", "1h"][..]] {
        let mut args = vec!["1e6/s"];
        args.extend_from_slice(mode);
        let output = run(&args, input);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(output.stdout, input, "{args:?}");
    }
    let output = run(
        &[
            "1e6/s",
            "--",
            "sh",
            "-c",
            "printf '[%s]' \"$1\"",
            "sh",
            "{}",
        ],
        input,
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, b"[k1 \xff\xfe\r][k1 y\r][k2 z]");
}
