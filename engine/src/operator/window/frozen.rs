//! [`FrozenState`]: what a snapshot takes of an agg at a barrier.

use std::sync::Arc;

use super::{Acc, ShardMap};

/// An agg's state at a barrier: the open windows' shards, shared with the operator until it
/// writes to them (see [`super::WindowTable`]), and the operator's progress and counters.
#[derive(Clone, Debug, Default)]
pub struct FrozenState {
    /// Open windows, oldest first, each with its shards.
    pub windows: Vec<(i64, Vec<Arc<ShardMap>>)>,
    /// Progress per upstream.
    pub progress: Vec<Option<i64>>,
    /// Late rows so far.
    pub late_rows: u64,
    /// Rows so far.
    pub rows: u64,
    /// The epoch of this snapshot: its entries are stamped at most this, and those stamped above
    /// an older snapshot's epoch changed since that one ([`FrozenState::changed_since`]).
    pub epoch: u32,
    /// Shards of the oldest window emitted already (it fired and was being emitted), which
    /// hold nothing any more.
    pub cursor: usize,
    /// Spills the agg made before this snapshot, since its start or restore: a snapshot is a
    /// delta only of one with the same count.
    pub spill_gen: u32,
    /// The written windows (those with entries here), each with the lowest epoch its entries
    /// may be stamped at: one the chain's files do not hold needs a full file if that is at or
    /// below the chain's epoch (a delta would leave its older entries out).
    pub floors: Vec<(i64, u32)>,
}

impl FrozenState {
    /// Every (window start, key, aggregate) written after the snapshot of `epoch` (one this
    /// agg took earlier, or 0: every entry written since the start or the restore), window by
    /// window. Restored entries are stamped 0, so no epoch sees them: a whole snapshot takes
    /// [`Self::entries`].
    pub fn changed_since(&self, epoch: u32) -> impl Iterator<Item = (i64, u64, Acc)> + '_ {
        self.windows.iter().flat_map(move |(s, shards)| {
            shards.iter().flat_map(move |m| m.iter_since(epoch).map(move |(k, a)| (*s, k, *a)))
        })
    }

    /// An upper bound of [`Self::changed_since`]'s count, without looking at entries: exact
    /// when `epoch` is this snapshot's predecessor (each shard counts what it stamps), else the
    /// entries of shards written after that snapshot.
    pub fn changed_bound(&self, epoch: u32) -> usize {
        let shards = self.windows.iter().flat_map(|(_, shards)| shards.iter());
        shards
            .map(|m| match m.epoch() {
                e if e <= epoch => 0,
                e if e == epoch + 1 => m.stamped(),
                _ => m.len(),
            })
            .sum()
    }

    /// Open (window start, key, aggregate) entries.
    pub fn len(&self) -> usize {
        self.windows.iter().flat_map(|(_, shards)| shards.iter()).map(|m| m.len()).sum()
    }

    /// Whether no window holds an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every (window start, key, aggregate), window by window, unordered within a window.
    pub fn entries(&self) -> impl Iterator<Item = (i64, u64, Acc)> + '_ {
        self.windows
            .iter()
            .flat_map(|(s, shards)| shards.iter().flat_map(move |m| m.iter().map(move |(k, a)| (*s, k, *a))))
    }
}
