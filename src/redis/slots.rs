//! A cluster's slot map, read from `CLUSTER SLOTS`.

use super::health::SLOTS;

/// A cluster's slot map: which node serves each slot.
pub(super) struct SlotMap {
    /// The node index of each slot, `u16::MAX` where none is known.
    owners: Vec<u16>,
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply: `[start, end, [host, port, ...], ...]`
    /// per range, the primary first.
    pub(super) fn parse(reply: &redis::Value) -> Option<SlotMap> {
        use redis::Value::{Array, BulkString, Int, SimpleString};
        let Array(ranges) = reply else {
            return None;
        };
        let mut owners = vec![u16::MAX; usize::from(SLOTS)];
        let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
        for range in ranges {
            let Array(range) = range else {
                return None;
            };
            let [Int(start), Int(end), Array(primary), ..] = &range[..] else {
                return None;
            };
            let node = match &primary[..] {
                [BulkString(bytes), Int(port), ..] => (bytes.clone(), *port),
                [SimpleString(text), Int(port), ..] => (text.clone().into_bytes(), *port),
                _ => return None,
            };
            let index = nodes.iter().position(|n| *n == node).unwrap_or_else(|| {
                nodes.push(node);
                nodes.len() - 1
            });
            let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
            if start > end || end >= owners.len() {
                return None;
            }
            owners[start..=end].fill(u16::try_from(index).ok()?);
        }
        Some(SlotMap { owners })
    }

    pub(super) fn owner(&self, slot: u16) -> Option<usize> {
        self.owners
            .get(usize::from(slot))
            .filter(|owner| **owner != u16::MAX)
            .map(|owner| usize::from(*owner))
    }

    pub(super) fn slots_of(&self, node: usize) -> Vec<u16> {
        (0..SLOTS)
            .filter(|slot| self.owner(*slot) == Some(node))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut range = vec![Value::Int(start), Value::Int(end)];
        range.extend(nodes);
        Value::Array(range)
    }

    #[test]
    fn a_slot_map_groups_each_primarys_ranges() {
        let reply = Value::Array(vec![
            range(0, 99, vec![node("10.0.0.1", 7000), node("10.0.0.9", 7009)]),
            range(100, 16_000, vec![node("10.0.0.2", 7000)]),
            // A primary with two ranges.
            range(16_001, 16_383, vec![node("10.0.0.1", 7000)]),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        let first = map.owner(0).unwrap();
        assert_eq!(map.owner(99), Some(first));
        assert_eq!(map.owner(16_383), Some(first));
        assert_ne!(map.owner(100), Some(first));
        let slots = map.slots_of(first);
        assert_eq!(slots.len(), 100 + 383);
        assert_eq!((slots[99], slots[100]), (99, 16_001));
    }

    #[test]
    fn a_slot_map_leaves_uncovered_slots_ownerless_and_rejects_nonsense() {
        let map = SlotMap::parse(&Value::Array(vec![range(5, 5, vec![node("h", 1)])])).unwrap();
        assert_eq!((map.owner(4), map.owner(6)), (None, None));
        assert!(map.owner(5).is_some());
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(10, 5, vec![node("h", 1)])]),
            Value::Array(vec![range(0, 16_384, vec![node("h", 1)])]),
            Value::Array(vec![range(-1, 5, vec![node("h", 1)])]),
            Value::Array(vec![range(0, 5, vec![])]),
        ] {
            assert!(SlotMap::parse(&bad).is_none(), "{bad:?}");
        }
    }
}
