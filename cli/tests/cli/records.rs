//! Records longer than a read: unchanged in every mode, and bounded by
//! `--max-record` (exit status 6, the records before it written).

use super::*;

/// `before` short records, one of `len` bytes (key `k`, then letters),
/// then `after` short ones.
fn with_long_record(len: usize, before: usize, after: usize) -> Vec<u8> {
    let mut input = Vec::new();
    for i in 0..before {
        input.extend_from_slice(format!("a before {i}\n").as_bytes());
    }
    input.extend_from_slice(b"k ");
    input.extend((0..len - 2).map(|i| b'a' + (i % 26) as u8));
    input.push(b'\n');
    for i in 0..after {
        input.extend_from_slice(format!("b after {i}\n").as_bytes());
    }
    input
}

/// 20 MiB in one record, with records around it, byte for byte through
/// each mode: a plain copy (from a pipe and from a file), per key, bytes,
/// and a command that copies its stdin.
#[test]
fn a_record_of_twenty_mebibytes_comes_out_unchanged_in_every_mode() {
    let input = with_long_record(20 << 20, 3, 3);
    let file = temp_path("long-record");
    std::fs::write(&file, &input).unwrap();
    for args in [
        &["1e9/s"][..],
        &["1e9/s", "--key", "1"][..],
        &["--bytes", "1e12/s"][..],
        &["1e9/s", "--", "cat"][..],
    ] {
        let output = run(args, &input);
        assert!(output.status.success(), "{args:?}: {:?}", output.status);
        assert!(output.stdout == input, "{args:?}: the bytes changed");
    }
    let from_file = paceline(&["1e9/s"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(from_file.status.success(), "{:?}", from_file.status);
    assert!(from_file.stdout == input, "from a file: the bytes changed");
}

/// A long record is held once: in the buffer it was read into, not in a
/// copy as well. With `--key`, `--max-wait` or a command, a record of 50
/// MiB took a peak of 127 MB (its 64 MiB buffer and a copy of it to wait
/// for its moment), where the plain copy takes 76 MB; now 76 MB too. Here
/// a record of 48 MiB, with records before and after it in the reads
/// that begin and end it: at most 96 MiB at the peak (before: over 112).
#[test]
fn a_long_record_is_held_once_in_every_mode() {
    let input = with_long_record(48 << 20, 3, 3);
    for args in [
        &["1e9/s", "--key", "1"][..],
        &["1e9/s", "--max-wait", "1s"][..],
        &["1e9/s", "--", "cat"][..],
    ] {
        let mut child = paceline(args).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let fed = input.clone();
        // The input stays open: the peak is read while paceline lives.
        let writer = std::thread::spawn(move || {
            stdin.write_all(&fed).unwrap();
            stdin
        });
        let mut out = vec![0u8; input.len()];
        child.stdout.take().unwrap().read_exact(&mut out).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let stdin = writer.join().unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert!(out == input, "{args:?}: the bytes changed");
        let peak_kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {status}"));
        assert!(peak_kib <= 96 << 10, "{args:?}: a peak of {peak_kib} KiB");
    }
}

/// A record past `--max-record` ends the run with status 6: every record
/// before it is written, nothing of it or after it; terminated or not, in
/// a read or across several, plain or scheduled (per key, a command).
#[test]
fn a_record_longer_than_max_record_ends_the_run_after_those_before_it() {
    let before: Vec<u8> = (0..5)
        .flat_map(|i| format!("a {i}\n").into_bytes())
        .collect();
    for len in [1_001, 300_000] {
        let long = vec![b'x'; len];
        for terminated in [true, false] {
            let mut input = before.clone();
            input.extend_from_slice(&long);
            if terminated {
                input.extend_from_slice(b"\nb after\n");
            }
            for args in [
                &["1e9/s", "--max-record", "1000"][..],
                &["1e9/s", "--max-record", "1000", "--key", "1"][..],
                &["1e9/s", "--max-record", "1000", "--", "cat"][..],
            ] {
                let output = run(args, &input);
                let case = format!("{args:?}, {len} bytes, terminated {terminated}");
                assert_eq!(output.status.code(), Some(6), "{case}: {output:?}");
                assert_eq!(
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&before),
                    "{case}"
                );
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(stderr.contains("--max-record"), "{case}: {stderr}");
            }
        }
    }
    // Exactly the bound is fine.
    let mut input = vec![b'x'; 1000];
    input.push(b'\n');
    let output = run(&["1e9/s", "--max-record", "1000"], &input);
    assert!(output.status.success(), "{output:?}");
    assert!(output.stdout == input);
    // A bad size is refused as a bad argument.
    for bad in ["0", "lots", "-5"] {
        let output = run(&["1e9/s", "--max-record", bad], b"");
        assert_eq!(output.status.code(), Some(2), "{bad}: {output:?}");
    }
}

/// With no `--max-record`, the bound is 64 MiB.
#[test]
fn the_default_bound_is_sixty_four_mebibytes() {
    let mut input = b"first\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', (64 << 20) + 1));
    input.push(b'\n');
    let output = run(&["1e9/s"], &input);
    assert_eq!(output.status.code(), Some(6), "{:?}", output.status);
    assert_eq!(output.stdout, b"first\n");
}

/// A stdin left non-blocking (O_NONBLOCK on the pipe, as some parents
/// leave it) is read as any other, in every mode: the records that come
/// after a first read found nothing go out unchanged. With `--key`,
/// `--max-wait` or a command the reader took the first EAGAIN for a
/// failed read (status 5, "Resource temporarily unavailable", nothing
/// out).
#[test]
fn a_non_blocking_stdin_is_read_in_every_mode() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let _one = one_at_a_time();
    for args in [
        &["1e9/s"][..],
        &["1e9/s", "--key", "1"][..],
        &["1e9/s", "--max-wait", "1s"][..],
    ] {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
        // (Close-on-exec: paceline must not hold the writing end itself.)
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the descriptors were just opened, and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor this test owns.
        unsafe {
            let flags = libc::fcntl(fds[0], libc::F_GETFL);
            assert_eq!(
                libc::fcntl(fds[0], libc::F_SETFL, flags | libc::O_NONBLOCK),
                0
            );
        }
        let child = Command::new(PACELINE)
            .args(args)
            .stdin(Stdio::from(read))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Nothing there when paceline first reads: the input comes later.
        std::thread::sleep(Duration::from_millis(200));
        let mut write = std::fs::File::from(write);
        write.write_all(b"a 1\nb 2\n").unwrap();
        drop(write);
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success() && output.stdout == b"a 1\nb 2\n",
            "{args:?}: {:?}, stdout {:?}, stderr {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A stdout left non-blocking (O_NONBLOCK on the pipe, as some parents
/// leave it) is written as any other, in every mode, however slow its
/// reader: each record waits until the pipe has room. Paceline took the
/// first EAGAIN of a full pipe for a failed write (status 5, "Resource
/// temporarily unavailable", the output cut off, inside a record).
#[test]
fn a_non_blocking_stdout_is_written_in_every_mode() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let _one = one_at_a_time();
    // More than a pipe holds.
    let input = lines(100_000);
    for args in [
        &["1e9/s"][..],
        &["--bytes", "1e12/s"][..],
        &["1e9/s", "--key", "1"][..],
        &["1e9/s", "--max-wait", "1h"][..],
    ] {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
        // (Close-on-exec: paceline must not hold the reading end itself.)
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the descriptors were just opened, and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor this test owns.
        unsafe {
            let flags = libc::fcntl(fds[1], libc::F_GETFL);
            assert_eq!(
                libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK),
                0
            );
        }
        let mut child = paceline(args).stdout(Stdio::from(write)).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let fed = input.clone();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(fed.as_bytes());
        });
        // A slow reader: the pipe fills before it reads.
        std::thread::sleep(Duration::from_millis(300));
        let out = read_all(std::fs::File::from(read));
        let output = child.wait_with_output().unwrap();
        writer.join().unwrap();
        let out = out.recv().unwrap();
        assert!(
            output.status.success() && out == input,
            "{args:?}: {:?}, {} of {} bytes out, stderr {}",
            output.status,
            out.len(),
            input.len(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
