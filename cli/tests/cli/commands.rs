//! A command per record gets the record's bytes unchanged, in its
//! arguments or on its stdin; one past `--timeout` is killed and counted
//! as failed.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;

/// paceline with `args` (some not UTF-8) and `input`: its output.
fn run_os(args: &[&OsStr], input: &[u8]) -> Output {
    let mut command = Command::new(PACELINE);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn os(text: &[u8]) -> &OsStr {
    OsStr::from_bytes(text)
}

#[test]
fn a_command_gets_the_records_bytes_unchanged() {
    let record = b"caf\xe9 \\ $x \xff\n";
    let text = &record[..record.len() - 1];
    for (command, expected) in [
        // In place of {}, alone, twice, and beside bytes not UTF-8.
        (&[&b"printf"[..], b"%s", b"{}"][..], text.to_vec()),
        (
            &[&b"printf"[..], b"%s", b"{}|{}"][..],
            [text, b"|", text].concat(),
        ),
        (
            &[&b"printf"[..], b"%s", b"\xfe{}\xfd"][..],
            [b"\xfe", text, b"\xfd"].concat(),
        ),
        // With no {}, on its stdin, separator and all.
        (&[&b"cat"[..]][..], record.to_vec()),
    ] {
        let mut args = vec![os(b"100/s"), os(b"--")];
        args.extend(command.iter().map(|arg| os(arg)));
        let output = run_os(&args, record);
        assert!(output.status.success(), "{command:?}: {output:?}");
        assert_eq!(output.stdout, expected, "{command:?}");
    }
}
