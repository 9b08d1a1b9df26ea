//! Moving a lost node's tasks to the survivors: the decision, on the coordinator's node.
//!
//! A node of the stream's placement that has been down longer than `restart.move_after` (its
//! link down since then, or never up since this node started) has its tasks placed on the
//! other nodes ([`Placement::moved`]: least loaded per level). The coordinator's node writes the
//! new placement as the next version's record in the store (`engine::backup::placement`), then
//! fails its stream with the incarnation `version << 32`: the survivors hear of the newer
//! incarnation, restart, read the record and restore the moved tasks from the remote store. The
//! coordinator's own tasks never move (a standby coordinator is a later step), and nothing moves
//! once the local tasks have ended.
//!
//! Invariant: the record is durable before any node runs the new placement, and every node
//! starts from the newest record, so all members of one incarnation run one placement.

use std::collections::BTreeSet;
use std::time::Duration;

use weir_engine::backup::Store;
use weir_engine::backup::placement::{PlacementRecord, write_placement};
use weir_engine::spec::{Placement, StreamSpec, Topology};
use weir_engine::wire::msg::PeerLink;
use weir_engine::wire::{NodeId, StreamId};

/// The nodes of `nodes` (but `me`) down for at least `after` at `now_ms`, with how long (ms).
/// A node never connected counts from `started_ms` (when this node started).
pub fn overdue(
    nodes: &BTreeSet<NodeId>,
    me: NodeId,
    links: &[PeerLink],
    now_ms: u64,
    after: Duration,
    started_ms: u64,
) -> Vec<(NodeId, u64)> {
    let after = after.as_millis() as u64;
    nodes
        .iter()
        .filter(|n| **n != me)
        .filter_map(|n| {
            let link = links.iter().find(|l| l.node == *n);
            if link.is_some_and(|l| l.up) {
                return None;
            }
            let since = link.map_or(0, |l| l.since_ms);
            let since = if since == 0 { started_ms } else { since };
            let down = now_ms.saturating_sub(since);
            (down >= after).then_some((*n, down))
        })
        .collect()
}

/// Watches the links of the coordinator's node and moves the tasks of a node lost too long.
pub struct Mover<'a> {
    store: &'a dyn Store,
    stream: StreamId,
    topology: Topology,
    placement: &'a Placement,
    version: u32,
    me: NodeId,
    after: Duration,
    started_ms: u64,
    warned: bool,
    /// Copies of each ingest-log partition: with 2, a lost node's sources go where their
    /// copies are.
    replicas: u8,
}

impl<'a> Mover<'a> {
    /// For the engine running `placement` (version `version`) on node `me`.
    pub fn new(
        store: &'a dyn Store,
        spec: &StreamSpec,
        placement: &'a Placement,
        version: u32,
        me: NodeId,
        after: Duration,
        started_ms: u64,
    ) -> Self {
        let topology = spec.topology();
        Self { store, stream: spec.id, topology, placement, version, me, after, started_ms, warned: false, replicas: 1 }
    }

    /// With `replicas` copies of each ingest-log partition ([`Placement::moved_with_replicas`]).
    pub fn with_ingest_replicas(mut self, replicas: u8) -> Self {
        self.replicas = replicas;
        self
    }

    /// Whether this node decides: it runs the coordinator (the lowest node of the placement).
    fn decides(&self) -> bool {
        self.placement.nodes(&self.topology).first() == Some(&self.me)
    }

    /// When a node has been lost too long: its tasks' new placement is stored, and the answer is
    /// why the stream restarts and the incarnation it restarts at.
    pub fn check(&mut self, links: &[PeerLink], now_ms: u64) -> Option<(String, u64)> {
        if !self.decides() {
            return None;
        }
        let nodes = self.placement.nodes(&self.topology);
        let lost = overdue(&nodes, self.me, links, now_ms, self.after, self.started_ms);
        if lost.is_empty() {
            return None;
        }
        let gone: Vec<NodeId> = lost.iter().map(|(n, _)| *n).collect();
        let to: Vec<NodeId> = nodes.iter().filter(|n| !gone.contains(n)).copied().collect();
        let moved = self.placement.moved_with_replicas(&self.topology, &gone, &to, self.replicas);
        let tasks: Vec<String> = self
            .placement
            .tasks_of(&self.topology)
            .into_iter()
            .filter(|(_, n)| gone.contains(n))
            .map(|(t, _)| format!("{} to node {}", t.0, moved.node_of(t).0))
            .collect();
        let who: Vec<String> = lost
            .iter()
            .map(|(n, ms)| {
                format!("node {} has been down for {}", n.0, humantime::format_duration(Duration::from_secs(ms / 1000)))
            })
            .collect();
        let why = format!("{}: its tasks move to the other nodes (task {})", who.join(", "), tasks.join(", task "));
        let version = self.version + 1;
        let record = PlacementRecord::new(version, &self.topology, &moved, gone, &why);
        match write_placement(self.store, self.stream, &record) {
            // The stored record's reason: an earlier try of this move may have landed unanswered.
            Ok(stored) => {
                tracing::warn!(placement = version, reason = %stored.reason, "moving the tasks of a lost node");
                Some((stored.reason, u64::from(version) << 32))
            }
            Err(e) => {
                // Tried again at the next check; the stream keeps waiting for the node meanwhile.
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(placement = version, error = %e, "cannot store the placement that moves a lost node's tasks");
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(node: u32, up: bool, since_ms: u64) -> PeerLink {
        PeerLink { node: NodeId(node), up, since_ms, reason: String::new() }
    }

    #[test]
    fn a_node_down_longer_than_move_after_is_overdue_and_one_up_never_is() {
        let nodes: BTreeSet<NodeId> = [1, 2, 3].map(NodeId).into();
        let after = Duration::from_secs(30);
        let links = [link(2, true, 1_000), link(3, false, 10_000)];
        assert!(overdue(&nodes, NodeId(1), &links, 39_999, after, 0).is_empty());
        assert_eq!(overdue(&nodes, NodeId(1), &links, 40_000, after, 0), [(NodeId(3), 30_000)]);
        // Never connected: counted from this node's start.
        let never = [link(2, true, 1_000)];
        assert!(overdue(&nodes, NodeId(1), &never, 40_000, after, 20_000).is_empty());
        assert_eq!(overdue(&nodes, NodeId(1), &never, 50_000, after, 20_000), [(NodeId(3), 30_000)]);
    }

    #[test]
    fn the_coordinators_node_stores_the_next_placement_and_restarts_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = weir_engine::backup::LocalDirStore::new(dir.path());
        let spec = StreamSpec::generator(StreamId(1), 3, 3, 3);
        let p = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2), NodeId(3)]);
        let links = [link(2, true, 1), link(3, false, 1_000)];
        // Not the coordinator's node: it never decides.
        let mut two = Mover::new(&store, &spec, &p, 0, NodeId(2), Duration::from_secs(2), 0);
        assert_eq!(two.check(&links, 10_000), None);
        let mut one = Mover::new(&store, &spec, &p, 0, NodeId(1), Duration::from_secs(2), 0);
        assert_eq!(one.check(&links, 2_999), None);
        let (why, incarnation) = one.check(&links, 3_000).unwrap();
        assert_eq!(incarnation, 1 << 32);
        assert!(why.starts_with("node 3 has been down for 2s: its tasks move"), "{why}");
        let r = weir_engine::backup::placement::latest_placement(&store, StreamId(1)).unwrap().unwrap();
        assert_eq!((r.version, r.moved.clone()), (1, vec![NodeId(3)]));
        assert!(r.placement(&spec.topology()).unwrap().nodes(&spec.topology()).iter().all(|n| *n != NodeId(3)));
    }
}
