//! The adapters: streams, byte readers and writers, tower services. One
//! test binary; each module is one former test file, its tests' names
//! unchanged.

#[path = "../support/mod.rs"]
mod support;

mod common;
mod corners;
mod http;
mod io;
mod stream;
mod tower;
#[cfg(feature = "tower")]
mod unpolled;
