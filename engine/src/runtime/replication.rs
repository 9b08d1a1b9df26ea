//! The engine's side of ingest replication: which partitions this node ships and to whom
//! ([`crate::spec::Placement::ingest_follower`]), over the node's transport.

use std::collections::BTreeMap;

use weir_wire::msg::{Message, Replicate, ReplicateAck};
use weir_wire::transport::{Transport, TransportSender};
use weir_wire::{FrameEncoder, NodeId};

use crate::ingest::replication::{ReplicaLink, Replication};
use crate::spec::{Placement, StreamSpec, TaskKind, Topology};

/// The replication of the partitions whose sources run on `me`, with `replicas` copies; `None`
/// with one copy, or without a transport or another node to keep a copy.
pub(super) fn of(
    spec: &StreamSpec,
    topology: &Topology,
    placement: &Placement,
    me: NodeId,
    replicas: u8,
    transport: Option<&Transport>,
) -> Option<Replication> {
    if replicas < 2 {
        return None;
    }
    let transport = transport?;
    let followers: BTreeMap<u32, NodeId> = topology
        .tasks
        .iter()
        .filter_map(|t| match t.kind {
            TaskKind::Source { partition } if placement.node_of(t.id) == me => {
                placement.ingest_follower(topology, partition).map(|f| (partition, f))
            }
            _ => None,
        })
        .collect();
    tracing::info!(stream = %spec.id, followers = ?followers, "ingest partitions replicated");
    let link = TransportLink { sender: transport.sender(), encoder: FrameEncoder::new() };
    Some(Replication { stream: spec.id, followers, link: Box::new(link) })
}

/// Replication messages over the transport, never blocking the ingest writer: a full queue or
/// a peer that is down is a message not sent, which the primary sends again later.
struct TransportLink {
    sender: TransportSender,
    encoder: FrameEncoder,
}

impl TransportLink {
    fn send<M: Message>(&mut self, to: NodeId, msg: &M) -> bool {
        match self.encoder.encode(msg) {
            Ok(f) => self.sender.try_send(to, f).is_ok(),
            Err(e) => {
                tracing::error!(error = %e, "cannot encode a replication message");
                false
            }
        }
    }
}

impl ReplicaLink for TransportLink {
    fn ship(&mut self, to: NodeId, msg: &Replicate) -> bool {
        self.send(to, msg)
    }

    fn answer(&mut self, to: NodeId, msg: &ReplicateAck) -> bool {
        self.send(to, msg)
    }
}
