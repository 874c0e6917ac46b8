//! Keys are bytes: keys that differ only in bytes that are not UTF-8 are
//! paced apart, here and through Redis.

use super::*;

/// Four records whose keys differ only in their last byte, none of them
/// UTF-8.
fn four_keys() -> Vec<u8> {
    let mut input = Vec::new();
    for last in [0xffu8, 0xfe, 0xfd, 0xfc] {
        input.extend_from_slice(b"a");
        input.push(last);
        input.extend_from_slice(b" record\n");
    }
    input
}

/// At 1/min per key, four records of four keys go at once (one key for
/// all would take three minutes; the bound leaves a loaded machine room),
/// and come out unchanged.
fn at_once(args: &[&str]) {
    let input = four_keys();
    let start = Instant::now();
    let output = run(args, &input);
    let took = start.elapsed();
    assert!(output.status.success(), "{args:?}: {output:?}");
    assert!(output.stdout == input, "{args:?}: the bytes changed");
    assert!(
        took < Duration::from_secs(30),
        "{args:?}: four keys took {took:?}, as if they were one"
    );
}

#[test]
fn keys_that_differ_only_in_bytes_that_are_not_utf8_are_paced_apart() {
    let _one = one_at_a_time();
    at_once(&["1/min", "--key", "1"]);
    // Unicode's \S matches whole characters only: (?-u:\S) any byte.
    at_once(&["1/min", "--key-regex", "^((?-u:\\S)+)"]);
    // The same key still waits: two records of one key at 2/s.
    let start = Instant::now();
    let output = run(&["2/s", "--key", "1"], b"a\xff 1\na\xff 2\n");
    assert!(output.status.success(), "{output:?}");
    assert!(start.elapsed() >= Duration::from_millis(400));
}

#[test]
fn through_redis_too() {
    let _one = one_at_a_time();
    let server = redis_server::RedisServer::start();
    let url = server.url();
    let mut con = server.client().get_connection().unwrap();
    // `a\xfc` (the key's form), with its backslash escaped by the library.
    let expected: Vec<String> = ["fc", "fd", "fe", "ff"]
        .iter()
        .map(|hex| format!("paceline:v1:bytes:a\\\\x{hex}"))
        .collect();
    // Each key is its own Redis key, named by the escaped form. (A run
    // whose first answer from Redis took longer than the response timeout,
    // on a loaded machine, rightly paced its records on its fallback and
    // wrote no key: run again, up to three times.)
    let mut keys: Vec<String> = Vec::new();
    for _ in 0..3 {
        at_once(&["1/min", "--key", "1", "--redis", &url, "--name", "bytes"]);
        keys = redis::cmd("KEYS")
            .arg("paceline:*bytes*")
            .query(&mut con)
            .unwrap();
        keys.sort();
        if !keys.is_empty() {
            break;
        }
    }
    assert_eq!(keys, expected);
}

/// A key longer than `--max-key` ends the run with status 6, as a record
/// too long does: the records before it go out, it and those after do not.
/// So the keys held take `--max-keys` times `--max-key` bytes at most,
/// however long the records (the default is 1 KiB).
#[test]
fn a_key_longer_than_max_key_ends_the_run_after_those_before_it() {
    let _one = one_at_a_time();
    let mut input = b"a 1\nbb 2\n".to_vec();
    input.extend(std::iter::repeat_n(b'k', 1_025));
    input.extend_from_slice(b" 3\nc 4\n");
    for args in [
        &["1e9/s", "--key", "1"][..],
        &["1e9/s", "--key-regex", "^(\\S+)"][..],
        &["1e9/s", "--key", "1", "--max-key", "1"][..],
    ] {
        let output = run(args, &input);
        assert_eq!(output.status.code(), Some(6), "{args:?}: {output:?}");
        let before = if args.contains(&"--max-key") {
            "a 1\n"
        } else {
            "a 1\nbb 2\n"
        };
        assert_eq!(String::from_utf8_lossy(&output.stdout), before, "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--max-key"), "{args:?}: {stderr}");
    }
    // Raised, it goes through.
    let output = run(&["1e9/s", "--key", "1", "--max-key", "2KiB"], &input);
    assert!(output.status.success(), "{output:?}");
    assert!(output.stdout == input);
}

/// Keys dropped at `--max-keys` before they are full forget what they
/// owe, as the help says, and the summary counts them: at 1/min a key
/// back after its drop goes at once, where held it would wait a minute.
#[test]
fn keys_dropped_at_the_cap_before_they_are_full_are_counted() {
    let _one = one_at_a_time();
    let output = run(
        &["1/min", "--key", "1", "--max-keys", "2", "--json", "-q"],
        b"a 1\nb 1\nc 1\na 2\n",
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, b"a 1\nb 1\nc 1\na 2\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // `a` when `c` came, then `b` when `a` came back.
    assert!(
        stderr.contains("\"keys_dropped_unfinished\":2}"),
        "{stderr}"
    );
    // Held keys: none dropped, and the summary says so.
    let output = run(&["1/min", "--key", "1", "--json", "-q"], b"a 1\nb 1\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"keys_dropped_unfinished\":0}"),
        "{stderr}"
    );
}
