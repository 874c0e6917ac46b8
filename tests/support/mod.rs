//! Shared helpers for the integration tests that need a Redis server.
//!
//! A test file includes it with `mod support;` and uses what it needs; the
//! rest would be dead code in that test binary.
#![allow(dead_code)]

pub mod alloc;
pub mod fake;
pub mod held;
#[cfg(feature = "redis")]
pub mod limiter_state;
pub mod manual;
#[cfg(feature = "redis")]
pub mod poll;
#[cfg(feature = "redis")]
pub mod proxy;
#[cfg(feature = "redis-cluster")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod rng;
pub mod window;
pub mod within;
