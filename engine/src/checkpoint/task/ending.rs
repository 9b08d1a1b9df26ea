//! How a task's checkpoint ends: committed (`update`), failed by the coordinator (`reset`),
//! overtaken by a newer one (`abandon`), or failed here (`fail`). Each leaves the task in
//! `Ready` with its inputs open, except that a late end of an older checkpoint never disturbs a
//! newer one in progress.

use weir_wire::{CheckpointId, Version};

use super::{SourceAnswer, TaskAction, TaskMachine, TaskState};
use crate::checkpoint::TaskFailure;

impl TaskMachine {
    pub(super) fn update(&mut self, id: CheckpointId, version: Version, ts: u64) -> Vec<TaskAction> {
        if self.latest.is_some_and(|l| id <= l) {
            return Vec::new();
        }
        self.latest = Some(id);
        self.latest_version = version;
        self.latest_ts = Some(ts);
        let mut out = vec![TaskAction::PersistCommitted { id, version, ts }];
        // A late update for an older checkpoint must not disturb a newer one in progress (its
        // alignment holds inputs closed).
        if self.active.as_ref().is_none_or(|a| a.id <= id) {
            self.active = None;
            self.state = TaskState::Ready;
            out.push(TaskAction::ReopenAllInputs);
        }
        out.push(TaskAction::DeleteSnapshotsBefore(id));
        out
    }

    pub(super) fn reset(&mut self, failed: CheckpointId) -> Vec<TaskAction> {
        if self.latest.is_some_and(|l| failed <= l) {
            return Vec::new();
        }
        self.failed = Some(self.failed.map_or(failed, |f| f.max(failed)));
        match &self.active {
            // The snapshot stays: the coordinator may have given up on a commit whose record
            // still became visible. The next commit's `DeleteSnapshotsBefore` collects it.
            Some(a) if a.id <= failed => {
                self.active = None;
                self.state = TaskState::Ready;
                vec![TaskAction::ReopenAllInputs]
            }
            // A late reset of an older checkpoint must not reopen a newer one's aligned inputs.
            Some(_) => Vec::new(),
            None => vec![TaskAction::ReopenAllInputs],
        }
    }

    /// A newer checkpoint proves the active one is over: the coordinator runs one at a time and
    /// allocates a new id only after the old one committed or failed. (The seed discards every
    /// other id; but a reset overtaken by the next checkpoint's request or trigger then makes that
    /// checkpoint fail as well, and the next: a livelock.) The old id counts as failed
    /// here; its snapshot stays, since it may have committed (a late update then records that).
    pub(super) fn abandon(&mut self) -> Vec<TaskAction> {
        let Some(a) = self.active.take() else { return Vec::new() };
        self.failed = Some(self.failed.map_or(a.id, |f| f.max(a.id)));
        self.state = TaskState::Ready;
        vec![TaskAction::ReopenAllInputs]
    }

    /// Fails the active checkpoint locally: report, remember the id, back to Ready.
    pub(super) fn fail(&mut self, why: TaskFailure) -> Vec<TaskAction> {
        let Some(a) = self.active.take() else { return Vec::new() };
        self.failed = Some(self.failed.map_or(a.id, |f| f.max(a.id)));
        self.state = TaskState::Ready;
        let mut out = Vec::new();
        if a.source_req {
            out.push(TaskAction::SendSourceRsp {
                id: a.id,
                trans: a.trans,
                answer: SourceAnswer::Failed(why.to_string()),
            });
        }
        out.push(TaskAction::SendReport(a.report(Err(why))));
        out.push(TaskAction::DropSnapshot(a.id));
        out.push(TaskAction::ReopenAllInputs);
        out
    }
}
