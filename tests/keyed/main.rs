//! The keyed limiter: each key behaves as its own core limiter, and memory
//! stays bounded. One test binary; `limiter` was `keyed.rs`, `memory` was
//! `keyed_memory.rs`, their tests' names unchanged.

#[path = "../support/mod.rs"]
mod support;

#[global_allocator]
static ALLOCATOR: support::alloc::Counting = support::alloc::Counting;

mod limiter;
mod memory;
mod several_limits;
