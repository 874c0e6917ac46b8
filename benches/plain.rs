//! What the plain-loop benchmarks (`call_site`, `threads`) share: their
//! settings from the environment, and their rounds of paceline and
//! `governor` side by side, with the table of medians they print.

/// The median of `xs` (the upper one of an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The number in the environment variable `name`, or `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `rounds` rounds of `cases` (a name, paceline's side, `governor`'s
/// side), the two sides of each case in turn, `measure` giving a side's
/// nanoseconds per call; then prints a table of each side's median and the
/// median of the per-round ratios, under `unit` (what the times are).
pub fn compare<S>(rounds: usize, cases: &[(&str, S, S)], unit: &str, measure: impl Fn(&S) -> f64) {
    let mut times = vec![(vec![], vec![], vec![]); cases.len()];
    for _ in 0..rounds {
        for (i, (_, ours, theirs)) in cases.iter().enumerate() {
            let (a, b) = (measure(ours), measure(theirs));
            times[i].0.push(a);
            times[i].1.push(b);
            times[i].2.push(a / b);
        }
    }
    println!("| case | paceline {unit} | governor {unit} | ratio |");
    println!("|---|---:|---:|---:|");
    for ((name, ..), (ours, theirs, ratios)) in cases.iter().zip(times) {
        println!(
            "| {name} | {:.2} | {:.2} | {:.3} |",
            median(ours),
            median(theirs),
            median(ratios)
        );
    }
}
