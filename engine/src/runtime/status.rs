//! What a node says in a status response ([`StatusRsp`]): each local task's protocol state and
//! row counters (from its [`TaskBoard`]), and the coordinator's recent checkpoints with their
//! per-task statistics.

use std::sync::Arc;
use std::time::Instant;

use weir_wire::msg::{StatusRsp, StreamHealth};
use weir_wire::{NodeId, StreamId};

use super::board::TaskBoard;
use super::checkpointing::CheckpointLog;
use super::checkpointing::coordinator::ManualTrigger;

/// Checkpoints a status response lists.
const RECENT: usize = 20;

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
    pub(crate) trigger: ManualTrigger,
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
