//! What a node says in a status response ([`StatusRsp`]): each local task's protocol state and
//! row counters, and the coordinator's recent checkpoints with their per-task statistics.
//!
//! Workers publish into a task's [`TaskBoard`] with relaxed atomic stores: per batch for the
//! counters, per protocol input for the state. Readers (the router answering a client, or
//! `Engine::status`) take no lock the workers could wait on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use weir_wire::msg::{StatusRsp, StreamHealth, TaskState as WireState, TaskStatus};
use weir_wire::{CheckpointId, NodeId, StreamId, TaskId};

use super::checkpointing::CheckpointLog;
use crate::checkpoint::TaskState;

/// Checkpoints a status response lists.
const RECENT: usize = 20;

/// One task's published status.
#[derive(Debug)]
pub(crate) struct TaskBoard {
    task: TaskId,
    /// 0 uninit, 1 ready, 2 checkpointing, 3 stopped.
    state: AtomicU8,
    latest: AtomicU64,
    /// 0: none.
    active: AtomicU64,
    /// 0: none.
    failed: AtomicU64,
    pub(crate) rows_in: AtomicU64,
    pub(crate) rows_out: AtomicU64,
}

impl TaskBoard {
    pub(crate) fn new(task: TaskId) -> Arc<Self> {
        Arc::new(Self {
            task,
            state: AtomicU8::new(1),
            latest: AtomicU64::new(0),
            active: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
        })
    }

    /// Publishes the checkpoint machine's view.
    pub(crate) fn publish(&self, state: TaskState, latest: CheckpointId, failed: Option<CheckpointId>) {
        let (s, active) = match state {
            TaskState::Uninit => (0, 0),
            TaskState::Ready => (1, 0),
            TaskState::Checkpointing(id) => (2, id.0),
            TaskState::Stopped => (3, 0),
        };
        self.state.store(s, Ordering::Relaxed);
        self.active.store(active, Ordering::Relaxed);
        self.latest.store(latest.0, Ordering::Relaxed);
        self.failed.store(failed.map_or(0, |f| f.0), Ordering::Relaxed);
    }

    fn read(&self, stream: StreamId) -> TaskStatus {
        let opt = |v: u64| (v != 0).then_some(CheckpointId(v));
        TaskStatus {
            stream,
            task: self.task,
            state: match self.state.load(Ordering::Relaxed) {
                0 => WireState::Uninit,
                1 => WireState::Ready,
                2 => WireState::Checkpointing,
                _ => WireState::Stopped,
            },
            latest: CheckpointId(self.latest.load(Ordering::Relaxed)),
            active: opt(self.active.load(Ordering::Relaxed)),
            failed: opt(self.failed.load(Ordering::Relaxed)),
            rows_in: self.rows_in.load(Ordering::Relaxed),
            rows_out: self.rows_out.load(Ordering::Relaxed),
        }
    }
}

/// Everything a status response is made of.
#[derive(Debug)]
pub(crate) struct StatusBoard {
    pub(crate) node: NodeId,
    pub(crate) stream: StreamId,
    pub(crate) started: Instant,
    pub(crate) tasks: Vec<Arc<TaskBoard>>,
    /// The checkpoint statistics (on every node with checkpoints; the coordinator's node has the
    /// checkpoints and the health).
    pub(crate) checkpoints: Option<Arc<CheckpointLog>>,
    /// Whether this node coordinates the stream.
    pub(crate) coordinates: bool,
    /// The coordinator's manual trigger (clients' `CheckpointNowReq`).
    pub(crate) trigger: super::checkpointing::ManualTrigger,
}

impl StatusBoard {
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
                    }]
                }
                _ => Vec::new(),
            },
        }
    }
}
