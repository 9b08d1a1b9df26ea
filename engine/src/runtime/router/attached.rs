//! An attached run of a stream, as the router thread holds it: its network-fed queues and
//! credits, its services, and what ends it (a gap, a lost peer, a peer's failed or later run).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_channel::{Sender, TrySendError};
use crossbeam_utils::sync::Unparker;
use weir_wire::{Epoch, NodeId, Seq, TaskId};

use super::super::channel::Msg;
use super::super::shared::Shared;
use super::{IngestSide, ProtoSide, StreamSide};

pub(super) struct InChannel {
    tx: Sender<Msg>,
    wake: Unparker,
    next: Seq,
}

/// An attached stream, as the router thread holds it.
pub(super) struct Attached {
    /// The run attached.
    pub(super) epoch: Epoch,
    /// A peer has started a later run (this one failed when it heard).
    pub(super) superseded: bool,
    /// Its other nodes were told it failed here.
    pub(super) told: bool,
    pub(super) inputs: HashMap<(TaskId, TaskId), InChannel>,
    pub(super) credits: HashMap<(TaskId, TaskId), (Arc<AtomicU32>, Unparker)>,
    pub(super) shared: Arc<Shared>,
    pub(super) ingest: Option<IngestSide>,
    pub(super) proto: ProtoSide,
    pub(super) status: Arc<super::super::status::StatusBoard>,
}

impl Attached {
    pub(super) fn new(epoch: Epoch, s: StreamSide) -> Self {
        let inputs = s.inputs.into_iter().map(|(k, (tx, wake))| (k, InChannel { tx, wake, next: Seq(0) })).collect();
        let (credits, shared, ingest, proto, status) = (s.credits, s.shared, s.ingest, s.proto, s.status);
        Attached { epoch, superseded: false, told: false, inputs, credits, shared, ingest, proto, status }
    }

    pub(super) fn fail(&self, why: String) {
        self.shared.fail(why);
    }

    /// Whether `node` runs tasks of the stream (only those speak for its channels and its
    /// protocol: another member of the cluster has no say in a stream it does not run).
    pub(super) fn heeds(&self, node: NodeId, what: &str) -> bool {
        let peer = self.status.peers.contains(&node);
        if !peer {
            tracing::warn!(stream = %self.status.stream, %node, "{what} from a node that does not run the stream dropped");
        }
        peer
    }

    /// Checks the channel's sequence number and hands `msg` to its task.
    pub(super) fn deliver(&mut self, from: TaskId, to: TaskId, seq: Seq, msg: Msg) {
        let Some(ch) = self.inputs.get_mut(&(from, to)) else {
            return self.fail(format!("frame for unknown channel {from} -> {to}"));
        };
        if seq != ch.next {
            // A gap means frames were lost (a broken connection): results would be wrong.
            let why = format!("channel {from} -> {to}: expected {}, got {seq}: data lost", ch.next);
            return self.fail(why);
        }
        ch.next = seq.next();
        match ch.tx.try_send(msg) {
            Ok(()) => ch.wake.unpark(),
            Err(TrySendError::Full(_)) => self.fail(format!("channel {from} -> {to} overran its credits")),
            Err(TrySendError::Disconnected(_)) => {} // the task finished or the stream stops
        }
    }

    /// Node `node` of the transport went away (`orderly`: it said goodbye).
    pub(super) fn peer_down(&self, node: NodeId, reason: &str, orderly: bool) {
        self.status.link(node, false, reason.to_string());
        // Not once the stream stops here: peers go as they stop, not always in order.
        let stopping = self.shared.stop.load(Ordering::Acquire) || self.status.stop_requested.load(Ordering::Acquire);
        let peer = self.status.peers.contains(&node);
        if self.status.failover && !orderly && !stopping && peer && !self.status.finished() {
            // Frames to and from it are lost: the stream restarts from its last commit.
            self.fail(format!("node {node} of the stream was lost ({reason})"));
        }
        // Its tasks cannot finish a checkpoint in flight: the coordinator fails it.
        if let Some(inbox) = &self.proto.1 {
            let _ = inbox.send(crate::checkpoint::CoordInput::NodeLost { node });
        }
    }

    /// A node of the stream runs a later run, at `epoch`: this one fails (once), and its node
    /// restarts the stream at that epoch.
    pub(super) fn supersede(&mut self, epoch: Epoch, why: String) {
        self.shared.newer_epoch.fetch_max(epoch.0, Ordering::AcqRel);
        if !std::mem::replace(&mut self.superseded, true) {
            self.fail(why);
        }
    }

    /// Node `node` says its part of this run failed: this run cannot go on either (unless it
    /// stops or has ended here anyway, as for a lost peer).
    pub(super) fn peer_failed(&mut self, node: NodeId, reason: &str) {
        let stopping = self.shared.stop.load(Ordering::Acquire) || self.status.stop_requested.load(Ordering::Acquire);
        if self.heeds(node, "a failed run's notice") && self.status.failover && !stopping && !self.status.finished() {
            // The failing node told every node of the run: no need to tell them again.
            self.told = true;
            self.fail(format!("the run failed on node {node}: {reason}"));
        }
    }

    pub(super) fn peer_up(&self, node: NodeId) {
        self.status.link(node, true, String::new());
        if let Some(inbox) = &self.proto.1 {
            let _ = inbox.send(crate::checkpoint::CoordInput::NodeUp { node });
        }
    }
}
