//! The least a line-pacing copy has to do, as an anchor for the `cli`
//! benchmark: read stdin 128 KiB at a time into a page-aligned buffer,
//! count the newlines with vector instructions, write what was read to
//! stdout. No arguments, no limiter, no error messages: what is left
//! between this and `cat` is the counting and a Rust program's start.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;

fn main() -> std::io::Result<()> {
    const PAGE: usize = 4096;
    const READ: usize = 128 * 1024;
    let mut input = File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut output = File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut storage = vec![0u8; PAGE + READ];
    let at = storage.as_ptr().align_offset(PAGE).min(PAGE);
    let mut lines = 0usize;
    loop {
        let n = input.read(&mut storage[at..at + READ])?;
        if n == 0 {
            break;
        }
        lines += bytecount::count(&storage[at..at + n], b'\n');
        output.write_all(&storage[at..at + n])?;
    }
    // Kept, so that the count is not optimised away.
    std::hint::black_box(lines);
    Ok(())
}
