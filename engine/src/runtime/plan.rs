//! The wiring of one node's share of a stream, decided before anything is built: which tasks run
//! here and on which worker, what each edge with a local end is (a queue between two local
//! tasks, a queue the network feeds, credits towards a task on another node), which nodes are
//! this node's peers, and which node takes each ingest partition's appends. A function of the
//! topology, the placement and the node alone, so tests check the wiring without starting
//! anything; [`super::Engine::start`] builds what it says.
//!
//! Invariants: every edge with a local end is in [`Plan::edges`] exactly once, and no other
//! edge is; local tasks go to workers round robin in task order.

use std::collections::HashMap;

use weir_wire::{NodeId, TaskId};

use crate::spec::{Placement, TaskDesc, Topology};

/// What an edge with a local end is on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EdgeKind {
    /// Both ends are local: one bounded queue.
    Local,
    /// The sender is on `from`: a queue the router fills from the network.
    FromNetwork { from: NodeId },
    /// The receiver is on `to`: credits it grants.
    ToNetwork { to: NodeId },
}

/// One node's wiring of a stream.
#[derive(Debug)]
pub(crate) struct Plan<'t> {
    /// The tasks placed here, in task order.
    pub(crate) local: Vec<&'t TaskDesc>,
    /// The worker of each local task.
    pub(crate) worker_of: HashMap<TaskId, usize>,
    /// Every edge with a local end, as (from, to).
    pub(crate) edges: Vec<((TaskId, TaskId), EdgeKind)>,
    /// The other nodes with tasks of the stream, ascending.
    pub(crate) peers: Vec<NodeId>,
    /// The node whose source reads each ingest partition (this node for a partition no source
    /// reads).
    pub(crate) owners: Vec<NodeId>,
}

impl<'t> Plan<'t> {
    /// The wiring on `me` of `topo` placed by `placement`, over `workers` workers, for a stream
    /// of `partitions` partitions.
    pub(crate) fn of(topo: &'t Topology, placement: &Placement, me: NodeId, workers: usize, partitions: u32) -> Self {
        let local: Vec<&TaskDesc> = topo.tasks.iter().filter(|t| placement.node_of(t.id) == me).collect();
        let worker_of = local.iter().enumerate().map(|(i, t)| (t.id, i % workers.max(1))).collect();
        let mut edges = Vec::new();
        for t in &topo.tasks {
            for d in &t.downstreams {
                let (from, to) = (placement.node_of(t.id), placement.node_of(*d));
                let kind = match (from == me, to == me) {
                    (true, true) => EdgeKind::Local,
                    (false, true) => EdgeKind::FromNetwork { from },
                    (true, false) => EdgeKind::ToNetwork { to },
                    (false, false) => continue,
                };
                edges.push(((t.id, *d), kind));
            }
        }
        let mut peers: Vec<NodeId> = topo.tasks.iter().map(|t| placement.node_of(t.id)).filter(|n| *n != me).collect();
        peers.sort();
        peers.dedup();
        let owners = (0..partitions).map(|p| topo.source_of(p).map_or(me, |t| placement.node_of(t))).collect();
        Plan { local, worker_of, edges, peers, owners }
    }

    /// Whether an edge crosses to or from another node (the node needs a transport).
    pub(crate) fn needs_net(&self) -> bool {
        self.edges.iter().any(|(_, k)| *k != EdgeKind::Local)
    }
}

#[cfg(test)]
mod tests {
    use weir_wire::StreamId;

    use super::*;
    use crate::spec::StreamSpec;

    #[test]
    fn a_spread_stream_wires_local_queues_network_queues_and_credits_on_each_node() {
        let spec = StreamSpec::generator(StreamId(1), 2, 2, 2);
        let topo = spec.topology();
        let nodes = [NodeId(1), NodeId(2)];
        let placement = Placement::spread(&topo, &nodes);
        let all: usize = topo.tasks.iter().map(|t| t.downstreams.len()).sum();
        let mut crossing = 0;
        for me in nodes {
            let plan = Plan::of(&topo, &placement, me, 2, spec.partitions);
            assert!(plan.local.iter().all(|t| placement.node_of(t.id) == me));
            assert_eq!(plan.peers, nodes.iter().copied().filter(|n| *n != me).collect::<Vec<_>>());
            for ((from, to), kind) in &plan.edges {
                let (f, t) = (placement.node_of(*from), placement.node_of(*to));
                let want = match (f == me, t == me) {
                    (true, true) => EdgeKind::Local,
                    (false, true) => EdgeKind::FromNetwork { from: f },
                    (true, false) => EdgeKind::ToNetwork { to: t },
                    (false, false) => panic!("{from}->{to}: no end on node {me}"),
                };
                assert_eq!(*kind, want, "{from}->{to} on node {me}");
                crossing += usize::from(matches!(kind, EdgeKind::ToNetwork { .. }));
            }
            // Round robin over the workers, in task order.
            for (i, t) in plan.local.iter().enumerate() {
                assert_eq!(plan.worker_of[&t.id], i % 2);
            }
            assert!(plan.needs_net());
        }
        // Each crossing edge is credits on its sender's node and a queue on its receiver's;
        // each local one a queue on its node.
        let local_edges: usize = nodes
            .iter()
            .map(|me| {
                Plan::of(&topo, &placement, *me, 2, 2).edges.iter().filter(|(_, k)| *k == EdgeKind::Local).count()
            })
            .sum();
        assert_eq!(local_edges + crossing, all);
    }

    #[test]
    fn a_node_with_every_task_needs_no_network_and_owns_every_partition() {
        let spec = StreamSpec::generator(StreamId(1), 3, 2, 1);
        let topo = spec.topology();
        let placement = Placement::single(NodeId(7));
        let plan = Plan::of(&topo, &placement, NodeId(7), 4, 3);
        assert_eq!(plan.local.len(), topo.tasks.len());
        assert!(!plan.needs_net());
        assert!(plan.peers.is_empty());
        assert_eq!(plan.owners, vec![NodeId(7); 3]);
        let other = Plan::of(&topo, &placement, NodeId(8), 4, 3);
        assert!(other.local.is_empty() && other.edges.is_empty());
        assert_eq!(other.peers, vec![NodeId(7)]);
    }
}
