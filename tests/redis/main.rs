//! The Redis limiters against real redis-servers, each test starting its
//! own on a free loopback port: the script, exactness, the limiters, keyed
//! limiting, the backend, clusters, and every kind of fault. One test
//! binary; each module is one former test file (`tests/redis_<name>.rs`),
//! its tests' names unchanged. The seeded chaos test stays a binary of its
//! own (`tests/redis_chaos.rs`): it loads both cores for its whole run.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

mod backend;
mod cluster;
mod contention;
mod differential;
mod exactness;
mod faults;
mod keyed;
mod limiter;
mod outages;
mod proxy_harness;
mod recovery;
mod reliability;
mod script;
