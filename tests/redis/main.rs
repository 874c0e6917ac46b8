//! The Redis limiters against real redis-servers (each test starts its own
//! on a free loopback port): the script against the core, the limiters'
//! behaviour, the shared backend, clusters, and real faults. One test
//! binary; each module is one area, its tests' names unchanged.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

#[global_allocator]
static ALLOCATOR: support::alloc::Counting = support::alloc::Counting;

mod backend;
mod batch;
mod blocking;
mod calls;
mod cancellation;
mod chaos;
#[cfg(feature = "redis-cluster")]
mod cluster;
#[cfg(feature = "redis-cluster")]
mod cluster_promises;
mod coalescing;
mod contention;
mod differential;
mod documented;
mod exactness;
mod faults;
mod hostile_keys;
mod hostile_upstream;
mod keyed;
mod lifecycle;
mod limiter;
mod pause;
mod proxy_harness;
mod recovery;
mod runtimes;
mod script;
mod several;
mod slots;
mod snapshot;
mod unpolled;
