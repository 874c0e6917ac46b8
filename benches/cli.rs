//! The `paceline` command against `cat` (and `pv -q` where it is installed),
//! timed as whole processes at a rate it never reaches, into `/dev/null`:
//! start-up, reading, counting records and writing, everything a user waits
//! for. Beside them, `count-copy` (this package's `count_copy.rs`): the
//! least any copy that counts lines does, so the floor of the ratio.
//!
//! ```text
//! cargo build --release -p paceline-cli
//! cargo bench -p paceline-benches --bench cli [-- FILTER]
//! ```
//!
//! A and B run in turn (A B, then B A, ...), and each case reports the
//! median of the pairwise ratios of wall time: pairs keep the ratio
//! meaningful while a shared machine's speed drifts. Runs per case:
//! `PACELINE_BENCH_RUNS` (60 by default). The inputs are written once into
//! the system's temporary directory: 10^6 and 10^7 numbered lines (as `seq`
//! prints them), 200 MB of pseudo-random bytes, and one record (a line) of
//! 12, 24 and 48 MiB, each through every mode that holds records whole (a
//! plain copy, per key, a command per record) and as bytes.
//!
//! `PACELINE_BENCH_BINARY` names another `paceline` to time instead of
//! this workspace's release build (an earlier version, say).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One comparison: `a` against `b`, both reading `input`.
struct Case {
    name: &'static str,
    a: Vec<String>,
    b: Vec<String>,
    input: PathBuf,
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let runs: usize = std::env::var("PACELINE_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(60);
    let paceline = binary();
    let dir = std::env::temp_dir().join("paceline-bench-cli");
    fs::create_dir_all(&dir).expect("a directory for the inputs");
    let lines6 = input(&dir, "lines-1e6.txt", |w| numbered_lines(w, 1_000_000));
    let lines7 = input(&dir, "lines-1e7.txt", |w| numbered_lines(w, 10_000_000));
    let bytes = input(&dir, "bytes-200MB.bin", |w| random_bytes(w, 200_000_000));
    let empty = input(&dir, "empty", |_| Ok(()));
    let records: Vec<(usize, PathBuf)> = [12, 24, 48]
        .into_iter()
        .map(|mib| {
            let name = format!("record-{mib}MiB.txt");
            (mib, input(&dir, &name, |w| one_record(w, mib << 20)))
        })
        .collect();

    let pl = |args: &[&str]| -> Vec<String> {
        std::iter::once(paceline.display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect()
    };
    let cat = vec!["cat".to_owned()];
    let mut cases: Vec<Case> = vec![
        Case {
            name: "bytes, 200 MB",
            a: pl(&["--bytes", "1e12/s"]),
            b: cat.clone(),
            input: bytes,
        },
        Case {
            name: "lines, 10^6",
            a: pl(&["1e9/s"]),
            b: cat.clone(),
            input: lines6.clone(),
        },
        Case {
            name: "lines, 10^6, bare count-copy",
            a: vec![env!("CARGO_BIN_EXE_count-copy").to_owned()],
            b: cat.clone(),
            input: lines6.clone(),
        },
        Case {
            name: "lines, 10^7",
            a: pl(&["1e9/s"]),
            b: cat.clone(),
            input: lines7,
        },
        Case {
            name: "start-up (empty input)",
            a: pl(&["1e9/s"]),
            b: cat.clone(),
            input: empty,
        },
    ];
    for (mib, record) in &records {
        for (mode, args) in [
            ("a plain copy", &["1e9/s"][..]),
            ("per key", &["1e9/s", "--key", "1"][..]),
            ("bytes", &["--bytes", "1e12/s"][..]),
            ("a command (cat)", &["1e9/s", "--", "cat"][..]),
        ] {
            cases.push(Case {
                name: leak(format!("one {mib} MiB record, {mode}")),
                a: pl(args),
                b: cat.clone(),
                input: record.clone(),
            });
        }
    }
    if Command::new("pv").arg("--version").output().is_ok() {
        cases.push(Case {
            name: "lines, 10^6, against pv -q",
            a: pl(&["1e9/s"]),
            b: vec!["pv".to_owned(), "-q".to_owned()],
            input: lines6,
        });
    } else {
        println!("(pv is not installed: its case is skipped)");
    }

    println!(
        "{:<40} {:>10} {:>10} {:>8} {:>15} {:>11}",
        "case", "A median", "B median", "A/B", "A/B min-max", "A's speed"
    );
    for case in cases
        .iter()
        .filter(|c| filter.as_ref().is_none_or(|f| c.name.contains(f.as_str())))
    {
        let (a, b, ratios) = compare(case, runs);
        println!(
            "{:<40} {:>8.2}ms {:>8.2}ms {:>8.3} {:>7.2}-{:<7.2} {:>10.2}x",
            case.name,
            ms(a),
            ms(b),
            median(&ratios),
            ratios[0],
            ratios[ratios.len() - 1],
            1.0 / median(&ratios),
        );
        println!("    A: {}\n    B: {}", case.a.join(" "), case.b.join(" "));
    }
}

/// A and B in turn, `runs` pairs after three of each not counted: the
/// median wall time of each and the sorted pairwise ratios A/B.
fn compare(case: &Case, runs: usize) -> (Duration, Duration, Vec<f64>) {
    for _ in 0..3 {
        run(&case.a, &case.input);
        run(&case.b, &case.input);
    }
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs.max(1) {
        let (ta, tb) = if i % 2 == 0 {
            let ta = run(&case.a, &case.input);
            (ta, run(&case.b, &case.input))
        } else {
            let tb = run(&case.b, &case.input);
            (run(&case.a, &case.input), tb)
        };
        ratios.push(ta.as_secs_f64() / tb.as_secs_f64());
        a.push(ta);
        b.push(tb);
    }
    a.sort();
    b.sort();
    ratios.sort_by(f64::total_cmp);
    (a[a.len() / 2], b[b.len() / 2], ratios)
}

/// One whole process, from its start to its exit, reading `input` and
/// writing to `/dev/null`.
fn run(command: &[String], input: &Path) -> Duration {
    let stdin = File::open(input).expect("the input");
    let stdout = File::options()
        .write(true)
        .open("/dev/null")
        .expect("/dev/null");
    let start = Instant::now();
    let status = Command::new(&command[0])
        .args(&command[1..])
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", command[0]));
    let elapsed = start.elapsed();
    assert!(
        status.success(),
        "{} exited with {status}",
        command.join(" ")
    );
    elapsed
}

fn median(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A case's name, made once and kept for the run.
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

/// `PACELINE_BENCH_BINARY`, or the release build of `paceline` in this
/// workspace's target directory.
fn binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("PACELINE_BENCH_BINARY") {
        return PathBuf::from(binary);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let binary = target.join("release/paceline");
    let binary = fs::canonicalize(&binary).unwrap_or(binary);
    if !binary.exists() {
        eprintln!(
            "{} is missing: build it first with\n  cargo build --release -p paceline-cli",
            binary.display()
        );
        std::process::exit(2);
    }
    let built = modified(&binary);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sources = [root.join("src"), root.join("cli/src")];
    if sources
        .iter()
        .map(|dir| newest(dir))
        .max()
        .unwrap_or(std::time::UNIX_EPOCH)
        > built
    {
        eprintln!(
            "warning: {} is older than the sources; rebuild it with\n  cargo build --release -p paceline-cli",
            binary.display()
        );
    }
    binary
}

fn modified(path: &Path) -> std::time::SystemTime {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// The latest modification time of any file under `dir`.
fn newest(dir: &Path) -> std::time::SystemTime {
    let Ok(entries) = fs::read_dir(dir) else {
        return modified(dir);
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                newest(&path)
            } else {
                modified(&path)
            }
        })
        .max()
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// `dir/name`, written by `write` unless it is already there.
fn input(dir: &Path, name: &str, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> PathBuf {
    let path = dir.join(name);
    if !path.exists() {
        let partial = dir.join(format!("{name}.partial"));
        let mut out = BufWriter::new(File::create(&partial).expect("an input file"));
        write(&mut out).expect("the input written");
        out.flush().expect("the input written");
        fs::rename(&partial, &path).expect("the input in place");
    }
    path
}

/// `1\n2\n...n\n`, as `seq n` prints it.
fn numbered_lines(out: &mut dyn Write, n: u64) -> io::Result<()> {
    for i in 1..=n {
        writeln!(out, "{i}")?;
    }
    Ok(())
}

/// One line of `len` bytes, its newline included: `k `, then letters.
fn one_record(out: &mut dyn Write, len: usize) -> io::Result<()> {
    let letters: Vec<u8> = (0..1 << 16).map(|i| b'a' + (i % 26) as u8).collect();
    out.write_all(b"k ")?;
    let mut left = len - 3;
    while left > 0 {
        let n = left.min(letters.len());
        out.write_all(&letters[..n])?;
        left -= n;
    }
    out.write_all(b"\n")
}

/// `len` pseudo-random bytes (xorshift), with no structure to help anyone.
fn random_bytes(out: &mut dyn Write, len: usize) -> io::Result<()> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut block = [0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len());
        out.write_all(&block[..n])?;
        left -= n;
    }
    Ok(())
}
