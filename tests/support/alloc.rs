//! A global allocator that counts, per thread, the bytes allocated and not
//! freed and the number of allocations, so that a test sees what the code
//! it drives on its own thread does while other tests run. A test binary
//! that uses it installs it in its `main.rs`:
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static BYTES: Cell<isize> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note(bytes: isize, allocations: u64) {
    let _ = BYTES.try_with(|n| n.set(n.get() + bytes));
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + allocations));
}

// SAFETY: delegates to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize, 1);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize), 0);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize, 1);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The bytes this thread has allocated and not freed.
pub fn bytes_in_use() -> isize {
    BYTES.with(Cell::get)
}

/// The allocations (and reallocations) this thread has made.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}
