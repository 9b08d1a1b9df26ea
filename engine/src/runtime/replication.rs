//! The engine's side of ingest replication: which partitions this node ships and to whom
//! ([`crate::spec::Placement::ingest_follower`]), over the node's transport.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use weir_wire::msg::{Message, Replicate, ReplicateAck};
use weir_wire::transport::TransportSender;
use weir_wire::{FrameEncoder, NodeId};

use super::EngineConfig;
use crate::cluster::ControlInSync;
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
    transport: Option<&TransportSender>,
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
    let (in_sync, lag) = match &cfg.in_sync {
        Some(s) => (Some(InSyncWorker::start(s.book.clone(), followers.clone(), s.may_leave.clone())), s.lag),
        None => (None, Duration::ZERO),
    };
    tracing::info!(stream = %spec.id, followers = ?followers, in_sync_lag = ?lag, "ingest partitions replicated");
    let link = TransportLink { sender: transport.clone(), encoder: FrameEncoder::new() };
    Some(Replication { stream: spec.id, followers, link: Box::new(link), in_sync, lag })
}

/// Writes in-sync sets on a thread of its own, so the ingest writer never waits for the
/// control store. It ends once the writer drops its side (a write under way finishes, and the
/// next run's first write ends whatever this run's could still land).
struct InSyncWorker {
    requests: Option<crossbeam_channel::Sender<(u32, bool, u64)>>,
    answers: crossbeam_channel::Receiver<(u32, u64, bool)>,
    stop: Arc<AtomicBool>,
    /// Requests sent and not answered, answered as failed if the thread is gone.
    out: Vec<(u32, u64)>,
    may_leave: Arc<AtomicBool>,
}

impl InSyncWorker {
    fn start(
        book: Arc<ControlInSync>,
        followers: BTreeMap<u32, NodeId>,
        may_leave: Arc<AtomicBool>,
    ) -> Box<dyn InSyncSet> {
        let (requests, rx) = crossbeam_channel::unbounded::<(u32, bool, u64)>();
        let (tx, answers) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new().name("weir-in-sync".into()).spawn(move || {
            for (p, in_sync, seq) in rx {
                if stopped.load(Ordering::Acquire) {
                    break;
                }
                let Some(follower) = followers.get(&p).copied() else { continue };
                let done = match book.set(p, follower, in_sync, seq) {
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
        let requests = match spawned {
            Ok(_) => Some(requests),
            Err(e) => {
                // Every request then fails: copies stay unknown, and appends wait for them.
                tracing::error!(error = %e, "cannot start the in-sync thread: appends wait for every copy");
                None
            }
        };
        Box::new(Self { requests, answers, stop, out: Vec::new(), may_leave })
    }
}

impl Drop for InSyncWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl InSyncSet for InSyncWorker {
    fn request(&mut self, partition: u32, in_sync: bool, seq: u64) {
        self.out.push((partition, seq));
        if let Some(r) = &self.requests
            && r.send((partition, in_sync, seq)).is_err()
        {
            self.requests = None;
        }
    }

    fn may_leave(&self) -> bool {
        self.may_leave.load(Ordering::Acquire)
    }

    fn answer(&mut self) -> Option<(u32, u64, bool)> {
        let answer = match self.answers.try_recv() {
            Ok(a) => Some(a),
            Err(e) => {
                if e.is_disconnected() {
                    self.requests = None;
                }
                // The thread is gone: what it owed fails.
                self.requests.is_none().then(|| self.out.first().map(|(p, seq)| (*p, *seq, false))).flatten()
            }
        };
        if let Some((p, seq, _)) = answer {
            self.out.retain(|o| *o != (p, seq));
        }
        answer
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
