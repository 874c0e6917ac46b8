//! Which part of Redis a backend finds down, and its health counters.
//!
//! A single server is one *zone*; a cluster has one per hash slot (how a
//! node's slots go down: the cluster row of `crate::redis`'s "When Redis
//! fails"), and is down as a whole ([`Zone::All`]) when it cannot be reached
//! at all. Checking whether a zone is down is one atomic load while nothing
//! is.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::Stats;
use crate::meter::BackendMetrics;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// A part of what a backend talks to that can be down on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Zone {
    /// The whole backend: a single server, or a cluster that cannot be
    /// reached at all.
    All,
    /// One hash slot of a cluster, and so the keys of the node serving it.
    Slot(u16),
}

/// A backend's health: what is down, and counters of the switches.
#[derive(Debug)]
pub(crate) struct Health {
    /// The whole backend is down.
    all: AtomicBool,
    /// On a cluster, one bit per hash slot that is down; `None` for a
    /// single server.
    slots: Option<Box<[AtomicU64]>>,
    /// How many zones are down (`all` counts as one, each slot as one).
    down: AtomicUsize,
    fallbacks: AtomicU64,
    recoveries: AtomicU64,
    /// Bumped whenever a zone comes back, so that a keyed limiter knows
    /// when to carry the keys its fallback holds back to Redis.
    zone_recoveries: AtomicU64,
    /// Woken whenever a zone comes back: for calls waiting in a fallback
    /// for what Redis serves again (a slot).
    up: tokio::sync::Notify,
    fallback_calls: AtomicU64,
    last_error: Mutex<String>,
    metrics: BackendMetrics,
}

impl Health {
    /// Health for a single server, or for a cluster.
    pub(crate) fn new(cluster: bool) -> Health {
        Health {
            all: AtomicBool::new(false),
            slots: cluster.then(|| (0..SLOTS / 64).map(|_| AtomicU64::new(0)).collect()),
            down: AtomicUsize::new(0),
            fallbacks: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            zone_recoveries: AtomicU64::new(0),
            up: tokio::sync::Notify::new(),
            fallback_calls: AtomicU64::new(0),
            last_error: Mutex::new(String::new()),
            metrics: BackendMetrics::new(),
        }
    }

    /// The backend's metrics.
    pub(crate) fn metrics(&self) -> &BackendMetrics {
        &self.metrics
    }

    /// Whether this is a cluster's health (one zone per slot).
    pub(crate) fn is_cluster(&self) -> bool {
        self.slots.is_some()
    }

    /// The zone a Redis key belongs to.
    pub(crate) fn zone_of(&self, key: &str) -> Zone {
        if self.is_cluster() {
            Zone::Slot(key_slot(key.as_bytes()))
        } else {
            Zone::All
        }
    }

    /// Whether anything is down.
    #[inline]
    pub(crate) fn any_down(&self) -> bool {
        self.down.load(Ordering::Acquire) != 0
    }

    /// Whether calls in `zone` are to be served by the fallback.
    #[inline]
    pub(crate) fn is_down(&self, zone: Zone) -> bool {
        let slot_down = || match (zone, &self.slots) {
            (Zone::Slot(slot), Some(slots)) => {
                let (word, bit) = slot_bit(slot);
                slots[word].load(Ordering::Acquire) & bit != 0
            }
            _ => false,
        };
        self.any_down() && (self.all.load(Ordering::Acquire) || slot_down())
    }

    /// Whether calls on the Redis key `key` are to be served by the
    /// fallback. Hashes the key only while something is down.
    #[inline]
    pub(crate) fn is_down_key(&self, key: &str) -> bool {
        self.any_down() && self.is_down(self.zone_of(key))
    }

    /// Marks `zone` down; returns whether it was up. The first zone to go
    /// down counts one switch to the fallbacks.
    pub(crate) fn mark_down(&self, zone: Zone) -> bool {
        let newly = match (zone, &self.slots) {
            (Zone::All, _) => !self.all.swap(true, Ordering::AcqRel),
            (Zone::Slot(slot), Some(slots)) => {
                let (word, bit) = slot_bit(slot);
                slots[word].fetch_or(bit, Ordering::AcqRel) & bit == 0
            }
            (Zone::Slot(_), None) => return false,
        };
        if newly && self.down.fetch_add(1, Ordering::AcqRel) == 0 {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            self.metrics.switched(1, true, true);
        }
        newly
    }

    /// Marks every zone of `zones` up again; returns how many were down.
    /// When that leaves nothing down, it counts one recovery, before the
    /// zones read as up: whoever sees a zone up after its last one is down
    /// also sees the recovery counted.
    ///
    /// Zones are marked down and up by one thread at a time (the backend's
    /// probe lock); only reads are concurrent.
    pub(crate) fn mark_up_all(&self, zones: &[Zone]) -> usize {
        let mut all = false;
        let mut clear: BTreeMap<usize, u64> = BTreeMap::new();
        for zone in zones {
            match (zone, &self.slots) {
                (Zone::All, _) => all = self.all.load(Ordering::Acquire),
                (Zone::Slot(slot), Some(slots)) => {
                    let (word, bit) = slot_bit(*slot);
                    if slots[word].load(Ordering::Acquire) & bit != 0 {
                        *clear.entry(word).or_default() |= bit;
                    }
                }
                (Zone::Slot(_), None) => {}
            }
        }
        let count = usize::from(all)
            + clear
                .values()
                .map(|b| b.count_ones() as usize)
                .sum::<usize>();
        if count == 0 {
            return 0;
        }
        self.zone_recoveries.fetch_add(1, Ordering::AcqRel);
        if self.down.fetch_sub(count, Ordering::AcqRel) == count {
            self.recoveries.fetch_add(1, Ordering::Relaxed);
            self.metrics.switched(1, false, false);
        }
        if all {
            self.all.store(false, Ordering::Release);
        }
        if let Some(slots) = &self.slots {
            for (word, bits) in clear {
                slots[word].fetch_and(!bits, Ordering::AcqRel);
            }
        }
        self.up.notify_waiters();
        count
    }

    /// Returns once calls on the Redis key `key` are no longer served by
    /// the fallback; never, if they are not now (a failure that marked
    /// nothing down leaves its caller in the fallback, as before).
    pub(crate) async fn back_up(&self, key: &str) {
        if !self.is_down_key(key) {
            return std::future::pending().await;
        }
        loop {
            // (Registered before the look: a zone marked up after it
            // wakes it.)
            let mut up = std::pin::pin!(self.up.notified());
            up.as_mut().enable();
            if !self.is_down_key(key) {
                return;
            }
            up.await;
        }
    }

    /// The slots that are down, in order.
    pub(crate) fn down_slots(&self) -> Vec<u16> {
        let Some(slots) = &self.slots else {
            return Vec::new();
        };
        let mut down = Vec::new();
        for (word, bits) in slots.iter().enumerate() {
            let mut bits = bits.load(Ordering::Acquire);
            while bits != 0 {
                down.push((word * 64) as u16 + bits.trailing_zeros() as u16);
                bits &= bits - 1;
            }
        }
        down
    }

    /// How many times a zone has come back.
    pub(crate) fn zone_recoveries(&self) -> u64 {
        self.zone_recoveries.load(Ordering::Acquire)
    }

    pub(crate) fn count_fallback_call(&self) {
        self.fallback_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_last_error(&self, error: &str) {
        if let Ok(mut last) = self.last_error.lock() {
            error.clone_into(&mut last);
        }
    }

    pub(crate) fn last_error(&self) -> String {
        self.last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
    }

    /// The counters; `degraded` says whether anything is down.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            degraded: self.any_down(),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            fallback_calls: self.fallback_calls.load(Ordering::Relaxed),
            ..Stats::default()
        }
    }
}

fn slot_bit(slot: u16) -> (usize, u64) {
    let slot = slot % SLOTS;
    (usize::from(slot / 64), 1 << (slot % 64))
}

/// The hash slot of a Redis key, as a cluster computes it: CRC16 (XMODEM)
/// of the key, or of its [hash tag](hash_tag), modulo 16 384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// A Redis key's hash tag, if it has one: the part between its first `{`
/// and the first `}` after it, when that is not empty.
pub(crate) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC16 with polynomial 0x1021 and initial value 0 (XMODEM): the redis
/// client's own dependency computes it (the client does not make its slot
/// number public).
fn crc16(bytes: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_clusters() {
        // The check value of CRC16/XMODEM, and slots Redis computes.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"somekey"), 11_058);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn zones_go_down_and_come_back_one_by_one() {
        let health = Health::new(true);
        assert!(!health.any_down());
        assert!(health.mark_down(Zone::Slot(5)));
        assert!(!health.mark_down(Zone::Slot(5)));
        assert!(health.mark_down(Zone::Slot(16_383)));
        assert!(health.is_down(Zone::Slot(5)) && !health.is_down(Zone::Slot(6)));
        assert_eq!(health.down_slots(), [5, 16_383]);
        assert_eq!(health.mark_up_all(&[Zone::Slot(5), Zone::Slot(5)]), 1);
        assert!(health.any_down());
        assert!(health.mark_down(Zone::All));
        assert!(health.is_down(Zone::Slot(6)));
        assert_eq!(
            health.mark_up_all(&[Zone::All, Zone::Slot(16_383), Zone::Slot(7)]),
            2
        );
        assert!(!health.any_down());
        assert_eq!(health.mark_up_all(&[Zone::Slot(16_383)]), 0);
        let stats = health.stats();
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 1));
        assert_eq!(health.zone_recoveries(), 2);
    }
}
