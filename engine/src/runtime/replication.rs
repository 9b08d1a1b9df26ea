//! The engine's side of ingest replication: which partitions this node ships and to whom
//! ([`crate::spec::Placement::ingest_follower`]), over the node's transport.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use weir_wire::msg::{Message, Replicate, ReplicateAck};
use weir_wire::transport::{Transport, TransportSender};
use weir_wire::{FrameEncoder, NodeId};

use super::EngineConfig;
use crate::cluster::{ControlInSync, InSyncRecord};
use crate::ingest::in_sync::InSyncSet;
use crate::ingest::replication::{ReplicaLink, Replication};
use crate::spec::{Placement, StreamSpec, TaskKind, Topology};

/// The replication of the partitions whose sources run on `me`, with `cfg.ingest_replicas`
/// copies; `None` with one copy, or without a transport or another node to keep a copy. With
/// `cfg.in_sync`, a thread of its own writes the partitions' in-sync sets for the writer.
pub(super) fn of(
    spec: &StreamSpec,
    topology: &Topology,
    placement: &Placement,
    me: NodeId,
    cfg: &EngineConfig,
    transport: Option<&Transport>,
) -> Option<Replication> {
    if cfg.ingest_replicas < 2 {
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
    let (in_sync, alone, lag) = match &cfg.in_sync {
        Some((book, lag)) => {
            let alone = starting_alone(book, me, &followers);
            (Some(InSyncWorker::start(book.clone(), me, followers.clone())), alone, *lag)
        }
        None => (None, BTreeSet::new(), Duration::ZERO),
    };
    tracing::info!(stream = %spec.id, followers = ?followers, alone = ?alone, "ingest partitions replicated");
    let link = TransportLink { sender: transport.sender(), encoder: FrameEncoder::new() };
    Some(Replication { stream: spec.id, followers, link: Box::new(link), in_sync, alone, lag })
}

/// The partitions whose in-sync set says their follower is out, for this primary and that
/// follower: they start acknowledging alone. A set that cannot be read counts as in: waiting
/// for the follower is always safe.
fn starting_alone(book: &ControlInSync, me: NodeId, followers: &BTreeMap<u32, NodeId>) -> BTreeSet<u32> {
    followers
        .iter()
        .filter(|(p, f)| match book.read(**p) {
            Ok(r) => InSyncRecord::strands(r.as_ref(), me, **f),
            Err(e) => {
                tracing::warn!(partition = **p, error = %e, "cannot read the in-sync set: appends wait for the follower");
                false
            }
        })
        .map(|(p, _)| *p)
        .collect()
}

/// Writes in-sync sets on a thread of its own, so the ingest writer never waits for the
/// control store. It ends when the writer drops its side.
struct InSyncWorker {
    requests: crossbeam_channel::Sender<(u32, bool, u64)>,
    answers: crossbeam_channel::Receiver<(u32, u64, bool)>,
}

impl InSyncWorker {
    fn start(book: Arc<ControlInSync>, me: NodeId, followers: BTreeMap<u32, NodeId>) -> Box<dyn InSyncSet> {
        let (requests, rx) = crossbeam_channel::unbounded::<(u32, bool, u64)>();
        let (tx, answers) = crossbeam_channel::unbounded();
        let spawned = std::thread::Builder::new().name("weir-in-sync".into()).spawn(move || {
            for (p, in_sync, seq) in rx {
                let Some(follower) = followers.get(&p).copied() else { continue };
                let done = match book.set(p, InSyncRecord { primary: me, follower, in_sync }) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(partition = p, in_sync, error = %e, "in-sync set not written");
                        false
                    }
                };
                if tx.send((p, seq, done)).is_err() {
                    break;
                }
            }
        });
        if let Err(e) = spawned {
            // Requests then go unanswered: every copy stays in its set, and appends wait for it.
            tracing::error!(error = %e, "cannot start the in-sync thread");
        }
        Box::new(Self { requests, answers })
    }
}

impl InSyncSet for InSyncWorker {
    fn request(&mut self, partition: u32, in_sync: bool, seq: u64) {
        let _ = self.requests.send((partition, in_sync, seq));
    }

    fn answer(&mut self) -> Option<(u32, u64, bool)> {
        self.answers.try_recv().ok()
    }
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
