//! What accumulated between two snapshots: the blocks live in the second and not in the first,
//! grouped by allocating stack as [`explain`](crate::explain::explain) groups them.

use crate::explain::{group, Holder, View};
use crate::model::{BlockState, Snapshot, StackId};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// Blocks live in `after` and not in `before`: the memory that accumulated between the two.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Difference {
    pub bytes: u64,
    pub blocks: u64,
    /// `bytes / (after_requests - before_requests)`, when the request counts are known.
    pub bytes_per_request: Option<f64>,
    pub holders: Vec<Holder>,
    /// Live bytes in each snapshot.
    pub before_bytes: u64,
    pub after_bytes: u64,
}

pub fn diff(
    before: &Snapshot,
    after: &Snapshot,
    view: View,
    requests: Option<(u64, u64)>,
) -> Difference {
    // The two snapshots intern their stacks apart: compare stacks by their frames' texts, each
    // distinct stack once.
    fn live<'s>(
        snapshot: &'s Snapshot,
        canonical: &mut HashMap<Vec<(&'s str, i64, &'s str)>, u32>,
    ) -> (Vec<(u64, u64, u32)>, u64) {
        let mut ids: FxHashMap<StackId, u32> = FxHashMap::default();
        let mut blocks = Vec::new();
        let mut bytes = 0;
        for b in snapshot
            .segments
            .iter()
            .flat_map(|s| snapshot.blocks(s))
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            let id = *ids.entry(b.stack).or_insert_with(|| {
                let text = snapshot
                    .stack(b.stack)
                    .map(|f| (&*f.filename, f.line, &*f.name))
                    .collect();
                let next = canonical.len() as u32;
                *canonical.entry(text).or_insert(next)
            });
            blocks.push((b.address, b.size, id));
            bytes += b.size;
        }
        (blocks, bytes)
    }
    let mut canonical = HashMap::new();
    let (old, before_bytes) = live(before, &mut canonical);
    let seen: HashSet<(u64, u64, u32)> = old.into_iter().collect();
    let added: Vec<_> = after
        .segments
        .iter()
        .flat_map(|s| after.blocks(s))
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .zip(live(after, &mut canonical).0)
        .filter(|(_, key)| !seen.contains(key))
        .map(|(b, _)| (b.stack, b.size))
        .collect();
    let bytes: u64 = added.iter().map(|(_, size)| size).sum();
    Difference {
        bytes,
        blocks: added.len() as u64,
        bytes_per_request: requests
            .filter(|(a, b)| b > a)
            .map(|(a, b)| bytes as f64 / (b - a) as f64),
        holders: group(after, added, view),
        before_bytes,
        after_bytes: after
            .segments
            .iter()
            .flat_map(|s| after.blocks(s))
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum(),
    }
}
