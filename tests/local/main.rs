//! The local limiter: the algorithm's spec on a fake clock, bad input,
//! cancel safety, concurrency, the trait. One test binary; each module is
//! one former test file, its tests' names unchanged.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod bursty;
mod cancellation;
mod concurrency;
mod core_invariants;
mod exactness;
mod limiter_trait;
mod set_rate;
mod try_acquire;
mod warming_up;
