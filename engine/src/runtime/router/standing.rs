//! What a node answers for a stream with no run attached here: starting a run, between two runs
//! (the restart strategy's delay), idle (the placement puts none of its tasks here) or fenced (the node holds
//! no lease). The node stays a member all the while: its peers stay connected and its links
//! are tracked here, so `weir status` sees it restarting, idle or fenced, with its restarts and
//! links (a node starting says it restarts, with no restarts yet); `weir stop` stops it; an append is refused (retryable while it restarts, "not here"
//! otherwise, so a producer looks for the partition elsewhere).
//!
//! Invariant: an attached run answers for its stream; a [`Standing`] answers only while none is.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir_wire::msg::{IngestOutcome, PeerLink, RestartInfo, StatusRsp, StreamInfo};
use weir_wire::{NodeId, StreamId};

/// Why a stream has no run on a node now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StandingPhase {
    /// Starting a run (reading its placement, opening its state).
    Starting,
    /// Waiting out the restart strategy's delay before the next run.
    Restarting,
    /// None of the stream's tasks is placed on the node.
    Idle,
    /// The node holds no lease in the control store: it runs nothing until it holds one.
    Fenced,
}

/// What a node says of a stream it runs no run of now.
#[derive(Clone, Debug)]
pub struct Standing {
    /// Why it runs none.
    pub phase: StandingPhase,
    /// The stream's incarnation (run epoch) on the node: the last run's, or (idle) the
    /// placement's.
    pub incarnation: u64,
    /// The node's restarts of the stream, oldest first.
    pub restarts: Vec<RestartInfo>,
    /// The stream's shape.
    pub info: StreamInfo,
    /// The node's membership in the control store (none without one).
    pub member: Option<Arc<dyn crate::cluster::MemberStatus>>,
    /// Set when a client asks the stream to stop (or a peer passes such a request on).
    pub stop: Arc<AtomicBool>,
    /// Since when it stands so.
    pub since: Instant,
}

/// Each stream's standing on a node, shared by the node and its router.
pub(crate) type Standings = Arc<Mutex<BTreeMap<StreamId, Standing>>>;

/// The node's links to the other members of the cluster.
#[derive(Debug)]
pub(crate) struct Links(BTreeMap<NodeId, PeerLink>);

/// [`Links`], shared by the node and its router.
pub(crate) type SharedLinks = Arc<Mutex<Links>>;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Links {
    /// Links to `members`, none up yet.
    pub(crate) fn new(members: &[NodeId]) -> Self {
        let down = |n: NodeId| PeerLink { node: n, up: false, since_ms: 0, reason: String::new() };
        Links(members.iter().map(|n| (*n, down(*n))).collect())
    }

    /// `node` came up or went down (`reason`); nodes that are not members are clients.
    pub(super) fn set(&mut self, node: NodeId, up: bool, reason: &str) {
        if let Some(l) = self.0.get_mut(&node) {
            *l = PeerLink { node, up, since_ms: now_ms(), reason: reason.to_string() };
        }
    }

    pub(crate) fn all(&self) -> Vec<PeerLink> {
        self.0.values().cloned().collect()
    }
}

impl Standing {
    /// The node's status while it stands so.
    pub(super) fn status(&self, request: u64, node: NodeId, peers: Vec<PeerLink>) -> StatusRsp {
        let idle = self.phase == StandingPhase::Idle;
        StatusRsp {
            logs: Vec::new(),
            request,
            node,
            uptime_ms: if idle { self.since.elapsed().as_millis() as u64 } else { 0 },
            tasks: Vec::new(),
            checkpoints: Vec::new(),
            streams: Vec::new(),
            incarnation: self.incarnation,
            restarts: self.restarts.clone(),
            peers,
            restarting: !idle,
            idle,
            paused: false,
            stream: Some(self.info.clone()),
            member: self.member.as_ref().map(|m| m.member_info()),
        }
    }

    /// What becomes of an append to the stream on `node` now.
    pub(super) fn ingest(&self, node: NodeId) -> IngestOutcome {
        match self.phase {
            // Its partitions went with its tasks: the producer finds their node.
            StandingPhase::Idle => IngestOutcome::NotHere {
                reason: format!("node {node} runs no task of the stream now (its tasks moved to the other nodes)"),
            },
            // Its tasks may have moved, or may run here again once it holds a lease.
            StandingPhase::Fenced => IngestOutcome::NotHere {
                reason: format!("node {node} holds no lease in etcd: it runs nothing until it holds one"),
            },
            StandingPhase::Restarting | StandingPhase::Starting => {
                IngestOutcome::Rejected { reason: format!("node {node} is starting its stream"), retryable: true }
            }
        }
    }

    /// A stop was asked for.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}
