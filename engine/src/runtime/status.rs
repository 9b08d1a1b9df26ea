//! What a node says in a status response ([`StatusRsp`]): each local task's protocol state and
//! row counters (from its [`TaskBoard`]), and the coordinator's recent checkpoints with their
//! per-task statistics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir_wire::msg::{LogStatus, PeerLink, StatusRsp, StreamHealth, TaskHeartbeat};
use weir_wire::{NodeId, StreamId, TaskId};

use super::board::TaskBoard;
use super::checkpointing::CheckpointLog;
use super::checkpointing::coordinator::ManualTrigger;

/// Checkpoints a status response lists.
const RECENT: usize = 20;

/// What a node tells its clients: everything a status response is made of, and its results.
#[derive(Debug)]
pub(crate) struct StatusBoard {
    pub(crate) node: NodeId,
    pub(crate) stream: StreamId,
    /// Its shape, for status.
    pub(crate) info: weir_wire::msg::StreamInfo,
    pub(crate) started: Instant,
    pub(crate) tasks: Vec<Arc<TaskBoard>>,
    /// The checkpoint statistics (on every node with checkpoints; the coordinator's node has the
    /// checkpoints and the health).
    pub(crate) checkpoints: Option<Arc<CheckpointLog>>,
    /// Whether this node coordinates the stream.
    pub(crate) coordinates: bool,
    /// Time between periodic checkpoints (ms; 0: none).
    pub(crate) interval_ms: u64,
    /// The coordinator's manual trigger (clients' `CheckpointNowReq`).
    pub(crate) trigger: ManualTrigger,
    /// What the other nodes' heartbeats last said of their tasks (written by the router).
    pub(crate) peer_tasks: Mutex<BTreeMap<TaskId, (NodeId, TaskHeartbeat)>>,
    /// The other nodes that run tasks of the stream (a stop request goes on to them).
    pub(crate) peers: Vec<NodeId>,
    /// A client asked for the stream to stop (`StopReq`); whoever runs the engine stops it.
    pub(crate) stop_requested: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The local sinks' result stores, which clients read page by page (`ResultsReq`).
    pub(crate) results: crate::state::NodeResults,
    /// The incarnation this engine runs at (0: not a cluster member).
    pub(crate) incarnation: u64,
    /// The stream's restarts on this node before this engine.
    pub(crate) restarts: Vec<weir_wire::msg::RestartInfo>,
    /// Fail when a peer of the stream vanishes (`EngineConfig::failover`).
    pub(crate) failover: bool,
    /// A paused run (no tasks).
    pub(crate) paused: bool,
    /// The links to `peers` (written by the router).
    pub(crate) links: Mutex<BTreeMap<NodeId, PeerLink>>,
    /// The node's membership in the control store.
    pub(crate) member: Option<Arc<dyn crate::cluster::MemberStatus>>,
    /// The ingest logs the node holds (an ingest-log stream's).
    pub(crate) logs: Vec<PartitionLog>,
}

/// One partition's ingest log as status reports it.
#[derive(Debug)]
pub(crate) struct PartitionLog {
    pub(crate) partition: u32,
    pub(crate) log: crate::ingest::LogHandle,
    /// This node runs the partition's source.
    pub(crate) source: bool,
    /// The node keeping the copy (on the source's node with two copies).
    pub(crate) follower: Option<NodeId>,
}

impl PartitionLog {
    /// The logs of `ingest` (every partition's: the node's own and the copies it keeps).
    pub(crate) fn all<T: Send + 'static>(
        ingest: &crate::ingest::IngestService<T>,
        topology: &crate::spec::Topology,
        placement: &crate::spec::Placement,
        me: NodeId,
        replicas: u8,
    ) -> Vec<PartitionLog> {
        let sources: BTreeMap<u32, NodeId> = topology
            .tasks
            .iter()
            .filter_map(|t| match t.kind {
                crate::spec::TaskKind::Source { partition } => Some((partition, placement.node_of(t.id))),
                _ => None,
            })
            .collect();
        (0..ingest.partitions())
            .filter_map(|p| {
                let source = sources.get(&p) == Some(&me);
                let follower = if source && replicas >= 2 { placement.ingest_follower(topology, p) } else { None };
                Some(PartitionLog { partition: p, log: ingest.log(p)?.clone(), source, follower })
            })
            .collect()
    }

    fn status(&self) -> LogStatus {
        // An unreadable directory reports an empty log; the writer reports its own errors.
        let (first, bytes) = self.log.extent().unwrap_or((None, 0));
        let end = self.log.durable_version();
        LogStatus {
            partition: self.partition,
            source: self.source,
            first: first.unwrap_or(end),
            end,
            readable: self.log.readable_version(),
            bytes,
            follower: self.follower.unwrap_or(NodeId(0)),
            in_sync: if self.source { self.log.standing() } else { 0 },
        }
    }
}

impl StatusBoard {
    /// A heartbeat from node `from` with its tasks' summaries.
    pub(crate) fn heard(&self, from: NodeId, tasks: &[TaskHeartbeat]) {
        // Only the stream's nodes speak for its tasks (the transport passes members' alone).
        if !self.peers.contains(&from) {
            return;
        }
        let mut p = self.peer_tasks.lock().unwrap_or_else(|e| e.into_inner());
        for t in tasks.iter().filter(|t| t.stream == self.stream) {
            p.insert(t.task, (from, t.clone()));
        }
    }

    /// The answer to a `ResultsReq`.
    pub(crate) fn results_page(&self, req: &weir_wire::msg::ResultsReq) -> weir_wire::msg::ResultsRsp {
        let stores = self.results.stores();
        let mut rsp = weir_wire::msg::ResultsRsp {
            request: req.request,
            node: self.node,
            stores: stores.len() as u32,
            results: Vec::new(),
            next: None,
            error: String::new(),
        };
        // A page fits a frame: 40 bytes a result, frames of 16 MiB.
        let max = (req.max as usize).clamp(1, 100_000);
        match stores.get(req.store as usize).map(|s| s.page(req.stream, &req.after, max)) {
            Some(Ok((rows, next))) => {
                rsp.results = rows.into_iter().map(Into::into).collect();
                rsp.next = next;
            }
            Some(Err(e)) => rsp.error = e.to_string(),
            None => rsp.error = format!("node {} has {} result stores, not {}", self.node, stores.len(), req.store + 1),
        }
        rsp
    }

    /// The status response to `request`.
    pub(crate) fn response(&self, request: u64) -> StatusRsp {
        StatusRsp {
            request,
            node: self.node,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            tasks: self.tasks.iter().map(|t| t.read(self.stream)).collect(),
            checkpoints: self.checkpoints.as_ref().map(|l| l.recent(RECENT)).unwrap_or_default(),
            streams: match (&self.checkpoints, self.coordinates) {
                (Some(l), true) => {
                    let (committed, failed) = l.totals();
                    vec![StreamHealth {
                        stream: self.stream,
                        healthy: l.healthy(),
                        consecutive_failures: l.consecutive_failures(),
                        committed,
                        failed,
                        not_started: l.not_started(),
                        interval_ms: self.interval_ms,
                        cause: l.cause(),
                    }]
                }
                _ => Vec::new(),
            },
            incarnation: self.incarnation,
            restarts: self.restarts.clone(),
            peers: {
                let l = self.links.lock().unwrap_or_else(|e| e.into_inner());
                let never = |node| PeerLink { node, up: false, since_ms: 0, reason: String::new() };
                self.peers.iter().map(|n| l.get(n).cloned().unwrap_or_else(|| never(*n))).collect()
            },
            restarting: false,
            idle: false,
            paused: self.paused,
            stream: Some(self.info.clone()),
            member: self.member.as_ref().map(|m| m.member_info()),
            // A node keeps no log of a partition it is neither the source's nor the copy's node of
            // (its directory exists, empty).
            logs: self.logs.iter().map(PartitionLog::status).filter(|l| l.source || l.bytes > 0).collect(),
        }
    }

    /// The link to `node` came up or went down (`reason`).
    pub(crate) fn link(&self, node: NodeId, up: bool, reason: String) {
        if !self.peers.contains(&node) {
            return; // a client
        }
        let since_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        // A link up already (as the node's links said when the run started) is up since then.
        if up && l.get(&node).is_some_and(|old| old.up) {
            return;
        }
        l.insert(node, PeerLink { node, up, since_ms, reason });
    }

    /// Whether every local task has finished.
    pub(crate) fn finished(&self) -> bool {
        self.tasks.iter().all(|t| t.is_finished())
    }
}
