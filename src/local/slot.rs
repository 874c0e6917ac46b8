//! The word's two configurations, in atomics: what the lock-free step
//! reads while another thread may be writing the slot not in use.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::core::word::{Config, Settings};

/// A configuration slot, readable while another thread rewrites it (a reader
/// that sees a torn slot has an outdated generation and fails its
/// compare-and-swap).
#[derive(Debug, Default)]
pub(super) struct Slot {
    interval: AtomicU64,
    max_permits: AtomicU64,
    burst: AtomicU64,
    base: AtomicU64,
    unit_charge: AtomicU64,
    ceiling: AtomicU64,
}

impl Slot {
    /// Writes `config`; the caller publishes it by a release of the word.
    pub(super) fn store(&self, config: &Config) {
        self.interval.store(config.interval.to_bits(), Relaxed);
        self.max_permits
            .store(config.max_permits.to_bits(), Relaxed);
        self.burst.store(config.burst, Relaxed);
        self.base.store(config.base as u64, Relaxed);
        self.unit_charge.store(config.unit_charge, Relaxed);
        self.ceiling.store(config.ceiling, Relaxed);
    }
}

/// Read after an acquire of the word, field by field.
impl Settings for Slot {
    #[inline(always)]
    fn base(&self) -> i64 {
        self.base.load(Relaxed) as i64
    }

    #[inline(always)]
    fn burst(&self) -> u64 {
        self.burst.load(Relaxed)
    }

    #[inline(always)]
    fn ceiling(&self) -> u64 {
        self.ceiling.load(Relaxed)
    }

    #[inline(always)]
    fn unit_charge(&self) -> u64 {
        self.unit_charge.load(Relaxed)
    }

    #[inline(always)]
    fn interval(&self) -> f64 {
        f64::from_bits(self.interval.load(Relaxed))
    }

    #[inline(always)]
    fn config(&self) -> Config {
        Config {
            interval: self.interval(),
            max_permits: f64::from_bits(self.max_permits.load(Relaxed)),
            burst: self.burst(),
            base: self.base(),
            unit_charge: self.unit_charge(),
            ceiling: self.ceiling(),
        }
    }
}
