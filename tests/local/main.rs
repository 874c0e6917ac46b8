//! The local limiter: the algorithm's spec on a fake clock, bad input,
//! cancel safety, concurrency, the trait, the lock-free word against the
//! core, and a few smoke tests on the real clock. One test binary; each
//! module is one former test file, its tests' names unchanged (`give_back`
//! holds the limiter's tests of the former `cancellation`).

#[path = "../support/mod.rs"]
mod support;

#[global_allocator]
static ALLOCATOR: support::alloc::Counting = support::alloc::Counting;

mod bad_input;
mod blocking;
mod bursty;
mod calls;
mod cancellation;
mod classic;
mod concurrency;
mod core_invariants;
mod core_limits;
mod documented;
mod exactness;
mod extremes;
mod fast_path;
mod first_principles;
mod give_back;
mod held_sequences;
mod interleavings;
mod learn;
mod limiter_trait;
mod pause;
mod pause_exact;
mod random_options;
mod real_clock;
mod set_rate;
mod settle;
mod several_limits;
mod slots;
mod try_acquire;
mod unpolled;
mod warming_up;
