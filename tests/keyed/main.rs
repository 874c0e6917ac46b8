//! The keyed limiter: each key behaves as its own core limiter, and memory
//! stays bounded. One test binary; `limiter` was `keyed.rs`, `memory` was
//! `keyed_memory.rs`, their tests' names unchanged (`give_back` holds the
//! former `limiter`'s tests that give back, `model` what they share).

#[path = "../support/mod.rs"]
mod support;

#[global_allocator]
static ALLOCATOR: support::alloc::Counting = support::alloc::Counting;

mod documented;
mod eviction;
mod give_back;
mod held_sequences;
mod hostile_keys;
mod limiter;
mod memory;
mod model;
mod several_limits;
mod slots;
