//! What an [`Engine`] tells and takes while it runs: its threads, status, counters, results,
//! checkpoints, and control messages to its tasks (its start and stop are in the module above).

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_wire::TaskId;

use super::{CheckpointLog, Control, Engine, EngineError, EngineStats, IngestToken};
use crate::ingest::IngestService;
use crate::state::NodeResults;

impl Engine {
    /// The kernel thread ids of the engine's worker threads (Linux; empty elsewhere), for
    /// per-thread tools (`top -H`, `perf -t`) and for measuring the engine's own CPU time.
    pub fn worker_threads(&self) -> Vec<u32> {
        self.worker_tids.iter().map(|t| t.load(Ordering::Relaxed)).filter(|t| *t != 0).collect()
    }

    /// This node's status: its tasks' protocol state and counters and, on the coordinator's
    /// node, the recent checkpoints with per-task statistics. Clients get the same over the
    /// transport by sending a `StatusReq`.
    pub fn status(&self) -> weir_wire::msg::StatusRsp {
        self.status.response(0)
    }

    /// What the other nodes' heartbeats last said of their tasks of this stream (latest, active
    /// and failed checkpoint each), with the node each came from, in task order.
    pub fn peer_tasks(&self) -> Vec<(weir_wire::NodeId, weir_wire::msg::TaskHeartbeat)> {
        self.status.peer_tasks.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The result stores of the node's sinks.
    pub fn results(&self) -> &NodeResults {
        &self.results
    }

    /// The transport's listen address, when the engine has one.
    pub fn transport_addr(&self) -> Option<std::net::SocketAddr> {
        self.node.as_ref().and_then(|n| n.node.transport_addr())
    }

    /// The node's ingest writer (ingest-log streams).
    pub fn ingest(&self) -> Option<&IngestService<IngestToken>> {
        self.ingest.as_deref()
    }

    /// Acknowledgements of local appends (engines without a transport).
    pub fn ingest_acks(&self) -> Option<&crossbeam_channel::Receiver<crate::ingest::Appended<IngestToken>>> {
        self.ingest_acks.as_ref()
    }

    /// Whether a client asked for the stream to stop (a `StopReq` to this node or to a peer,
    /// which sent it on; [`super::EngineConfig::stop_requested`]): the engine keeps running
    /// until [`Engine::stop`]; `weir node` stops it and exits.
    pub fn stop_requested(&self) -> bool {
        self.status.stop_requested.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Why the engine failed (a task's error, lost data on a channel, a halt of the
    /// coordinator), once it has; [`Engine::wait`] returns it too.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.get().cloned()
    }

    /// The epoch of the newest later run of the stream a peer was seen in (its frames or its
    /// heartbeats), when one was: the epoch to restart at.
    pub fn newer_epoch(&self) -> Option<weir_wire::Epoch> {
        let e = self.shared.newer_epoch.load(std::sync::atomic::Ordering::Acquire);
        (e > 0).then_some(weir_wire::Epoch(e))
    }

    /// Whether every local task has finished (a bounded stream ended, or the engine stopped).
    pub fn is_finished(&self) -> bool {
        !self.status.paused && self.workers.iter().all(|w| w.is_finished())
    }

    /// Whether this is a paused run ([`super::EngineConfig::paused`]): no task runs until the
    /// next run.
    pub fn is_paused(&self) -> bool {
        self.status.paused
    }

    /// Whether the stream's checkpoint coordinator runs on this node (in this run).
    pub fn coordinates(&self) -> bool {
        self.status.coordinates
    }

    /// What the engine restored when it started (engines with checkpoints): the checkpoint, and
    /// whether it came from the commit record, the tasks' consensus, or nothing (fresh). `None`
    /// while the tasks still wait for the coordinator's restore point (no commit record).
    pub fn restored(&self) -> Option<(weir_wire::msg::RestoreBasis, Option<weir_wire::CheckpointId>)> {
        self.coordinator.as_ref().and_then(|c| c.restored.get().cloned())
    }

    /// Starts a checkpoint now (the coordinator's manual trigger), on the coordinator's node; it
    /// waits for the one in flight and the minimum pause. Clients send `CheckpointNowReq` to any
    /// node instead.
    pub fn trigger_checkpoint(&self) -> Result<(), EngineError> {
        Ok(self.status.trigger.fire(self.status.stream, false)?)
    }

    /// As [`Self::trigger_checkpoint`], for a savepoint: every task writes all its state, so it
    /// restores with other parallelism. Every checkpoint is one until one commits (an agg that
    /// is replaying its windows' rows fails it, and the next is asked for again).
    pub fn take_savepoint(&self) -> Result<(), EngineError> {
        Ok(self.status.trigger.fire(self.status.stream, true)?)
    }

    /// Statistics of finished checkpoints (engines with checkpoints).
    pub fn checkpoints(&self) -> Option<&CheckpointLog> {
        self.coordinator.as_ref().map(|c| c.log.as_ref())
    }

    /// Sends `c` to local task `task` (handled before its next input).
    pub fn control(&self, task: TaskId, c: Control) -> Result<(), EngineError> {
        let Some(h) = self.controls.get(&task) else {
            return Err(EngineError::Config(format!("task {task} does not run on this engine")));
        };
        if !h.send_timeout(c, Duration::from_secs(1)) {
            return Err(EngineError::Failed(format!("task {task} does not take control messages")));
        }
        Ok(())
    }
}
