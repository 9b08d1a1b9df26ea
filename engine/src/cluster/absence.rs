//! How long each node has been absent from the cluster (no member key), as one observer saw
//! it: the leader moves the tasks of a node absent longer than `restart.move_after`.
//!
//! Invariant: a node's absence is counted from the first step that saw it absent since it was
//! last seen present; an observer that starts (a new leader) counts from its own first
//! observation, never from a time it did not see.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use weir_wire::NodeId;

/// Absent nodes and since when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Absence {
    since: BTreeMap<NodeId, Instant>,
}

impl Absence {
    /// Records one observation at `now`: the nodes in `absent` are absent, every other present.
    pub fn observe(&mut self, absent: &[NodeId], now: Instant) {
        self.since.retain(|n, _| absent.contains(n));
        for n in absent {
            self.since.entry(*n).or_insert(now);
        }
    }

    /// Whether `node` was absent at the last observation.
    pub fn is_absent(&self, node: NodeId) -> bool {
        self.since.contains_key(&node)
    }

    /// Forgets every observation (the observer stopped leading).
    pub fn reset(&mut self) {
        self.since.clear();
    }

    /// The nodes absent for at least `after` at `now`, with for how long.
    pub fn overdue(&self, after: Duration, now: Instant) -> Vec<(NodeId, Duration)> {
        self.since.iter().map(|(n, t)| (*n, now.saturating_duration_since(*t))).filter(|(_, d)| *d >= after).collect()
    }
}
