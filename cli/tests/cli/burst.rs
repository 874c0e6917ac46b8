//! `--burst N`: N records at once after an idle spell, then the rate.

use super::*;

/// The first `n` lines of paceline's output with when each came, and
/// then paceline stopped.
fn first_lines(args: &[&str], input: &[u8], n: usize) -> Vec<(Duration, String)> {
    let start = Instant::now();
    let mut child = fed(args, input);
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let got: Vec<(Duration, String)> = stdout
        .lines()
        .take(n)
        .map(|line| (start.elapsed(), line.unwrap()))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    got
}

#[test]
fn a_burst_of_five_lets_exactly_five_go_at_once() {
    let _one = one_at_a_time();
    for args in [
        &["2/s", "--burst", "5"][..],
        &["2/s", "--burst", "5", "--key", "1"][..],
    ] {
        let got = first_lines(args, lines(10).as_bytes(), 6);
        let texts: Vec<&str> = got.iter().map(|(_, line)| line.as_str()).collect();
        assert_eq!(
            texts,
            ["line 1", "line 2", "line 3", "line 4", "line 5", "line 6"]
        );
        let first = got[0].0;
        let fifth = got[4].0 - first;
        // Five at once (paced, the fifth would come 2 s after the first;
        // the bound leaves a loaded machine room); the sixth one interval
        // (500 ms) after the first.
        assert!(
            fifth < Duration::from_secs(1),
            "{args:?}: the fifth after {fifth:?}"
        );
        // (Since the start, as a line reaches this reader later than it
        // was written, never sooner.)
        let sixth = got[5].0;
        assert!(
            sixth >= Duration::from_millis(499),
            "{args:?}: the sixth after {sixth:?}"
        );
    }
}

#[test]
fn a_burst_of_zero_is_refused() {
    let output = run(&["2/s", "--burst", "0"], b"x\n");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--burst") && stderr.contains("at least 1"),
        "{stderr}"
    );
}

/// A burst is N at once or refused: one past what the limiter stores
/// (104 250 at one a day) ends the run with status 2 before any record,
/// where it was cut in silence (104 250 went, then one a day).
#[test]
fn a_burst_past_what_the_limiter_stores_is_refused() {
    let output = run(&["1/day", "--burst", "200000"], b"x\n");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at most 104250"), "{stderr}");
}

/// The reason for a burst refused at a tiny rate says the rate in a few
/// digits, not a fraction hundreds of digits long.
#[test]
fn a_burst_refused_at_a_tiny_rate_says_the_rate_readably() {
    let output = run(&["1e-300/s", "--burst", "2"], b"x\n");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at 1e-300 per second"), "{stderr}");
    assert!(stderr.len() < 300, "{stderr}");
}
