//! Sliding windows over granted moments: how many grants any window of a
//! given length holds, against what a limit allows there.

/// The largest count of `moments` (µs, sorted) in any window
/// `[t, t + span)`, and the `t` it starts at.
pub fn max_in_window(moments: &[u64], span: u64) -> (usize, u64) {
    let (mut best, mut at, mut lo) = (0, 0, 0);
    for hi in 0..moments.len() {
        while moments[hi] - moments[lo] >= span {
            lo += 1;
        }
        if hi + 1 - lo > best {
            best = hi + 1 - lo;
            at = moments[lo];
        }
    }
    (best, at)
}

/// The most permits of one each a window of `span` µs may hold at `rate`
/// per second with a burst of `burst` µs: the burst, one permit per
/// interval of the window, and the one granted on credit.
pub fn most_in_window(rate: f64, span: u64, burst: u64) -> usize {
    (rate * (span + burst) as f64 / 1e6).floor() as usize + 1
}
