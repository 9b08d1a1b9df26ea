//! The restore point at start: the commit record's, or (without one) the seed's consensus of what
//! the tasks committed, recorded before any task hears of it.

use std::collections::BTreeMap;

use weir_wire::msg::RestoreBasis;
use weir_wire::{CheckpointId, TaskId, TransId};

use super::{CommitRecord, CoordAction, Coordinator, IdRecord, Phase, RecordKind};

impl Coordinator {
    /// (Re)starts with what the durable meta holds: the id record and the last commit record.
    pub(super) fn restart(&mut self, now: u64, ids: IdRecord, last_commit: Option<CommitRecord>) -> Vec<CoordAction> {
        self.now = now;
        // Never below a committed id, whatever the meta says.
        self.next_id = ids.next_id.max(last_commit.as_ref().map_or(CheckpointId(1), |c| c.id.next()));
        self.next_trans = ids
            .next_trans
            .max(last_commit.as_ref().and_then(CommitRecord::trans).map_or(TransId(1), |t| TransId(t.0 + 1)));
        self.reserved = IdRecord { next_id: self.next_id, next_trans: self.next_trans };
        self.asked = self.reserved;
        self.reserving = None;
        self.flight = None;
        self.earliest_first = now + self.cfg.first_delay_ms;
        self.last_commit = last_commit.clone();
        self.new_stream = last_commit.is_none() && ids == IdRecord::default();
        match last_commit {
            // Every task restores the record (the engine's before it starts; a task that
            // asks gets it).
            Some(c) => {
                let basis = match c.kind {
                    RecordKind::Fallback(_) => RestoreBasis::Fallback,
                    _ => RestoreBasis::Committed,
                };
                self.choose(c.restore_point(), basis, BTreeMap::new())
            }
            None => {
                self.phase = Phase::Consensus {
                    deadline: now + self.cfg.consensus_wait_ms,
                    latest: BTreeMap::new(),
                    asking: BTreeMap::new(),
                };
                Vec::new()
            }
        }
    }

    /// Chooses the restore point and answers the tasks that asked.
    pub(super) fn choose(
        &mut self,
        id: Option<CheckpointId>,
        basis: RestoreBasis,
        asking: BTreeMap<TaskId, u64>,
    ) -> Vec<CoordAction> {
        self.phase = Phase::Running;
        let basis = if id.is_none() { RestoreBasis::Fresh } else { basis };
        self.restore_point = Some((id, basis));
        asking.into_iter().filter_map(|(t, request)| self.restore_one(t, request)).collect()
    }

    /// The `SendRestore` answering task `t`'s `request` (none before the point is chosen).
    pub(super) fn restore_one(&self, task: TaskId, request: u64) -> Option<CoordAction> {
        let (id, basis) = self.restore_point.clone()?;
        // A consensus or fallback record names no offsets: the task takes them from its manifest.
        let version =
            self.last_commit.as_ref().filter(|c| Some(c.id) == id).and_then(|c| c.versions.get(&task).copied());
        Some(CoordAction::SendRestore { task, node: self.node_of(task), id, version, basis, request })
    }

    /// A starting task asks for its restore point, with the latest checkpoint it committed.
    pub(super) fn consensus(&mut self, task: TaskId, latest: Option<CheckpointId>, request: u64) -> Vec<CoordAction> {
        if !self.cfg.tasks.iter().any(|(t, _, _)| *t == task) {
            return Vec::new();
        }
        if let Some(l) = latest {
            self.used(l);
        }
        let done = match &mut self.phase {
            Phase::Consensus { latest: l, asking, .. } => {
                l.insert(task, latest);
                asking.insert(task, request);
                l.len() == self.cfg.tasks.len()
            }
            Phase::Recording { asking, .. } => {
                asking.insert(task, request);
                return Vec::new();
            }
            // Its node found nothing damaged, so it may hold the point given up already: told it
            // by this coordinator or an earlier one, restored, or with the answer on its way. It
            // cannot be counted on to go back; the wait ends in a halt (docs/checkpoint.md).
            Phase::FallingBack { .. } => return Vec::new(),
            Phase::Down | Phase::Halted => return Vec::new(),
            // Chosen already: the task asks again, and gets the same answer.
            Phase::Running => return self.restore_one(task, request).into_iter().collect(),
        };
        if done { self.finish_consensus() } else { Vec::new() }
    }

    pub(super) fn finish_consensus(&mut self) -> Vec<CoordAction> {
        let Phase::Consensus { latest, asking, .. } = std::mem::replace(&mut self.phase, Phase::Running) else {
            return Vec::new();
        };
        // The seed's rule: the minimum of what every task has; a task that did not answer counts
        // as having nothing (and nothing is below every checkpoint).
        let all = self.cfg.tasks.iter().map(|(t, _, _)| latest.get(t).copied().flatten());
        // The choice is recorded before any task hears it, a start from nothing too: a
        // coordinator that restarts meanwhile makes the same one (the tasks that restored do not
        // ask again, and stale requests of theirs must not sway it).
        let record = match all.min().flatten() {
            Some(min) => {
                // An id of its own, past every id used (the chosen checkpoint's record may still
                // be in the store, damaged or unlisted: its key is never written again), a task's
                // included ([`Self::consensus`] raised the next id past each).
                let id = self.next_id;
                self.next_id = id.next();
                CommitRecord::consensus(id, min, self.now)
            }
            // A stream that never reserved an id, and whose tasks all said so, has nothing
            // anywhere to restore: no later choice can differ, and its first checkpoint keeps id 1.
            None if self.new_stream && latest.values().all(Option::is_none) => {
                return self.choose(None, RestoreBasis::Fresh, asking);
            }
            None => {
                // An id of its own, past every id used, so the record sorts above older ones.
                let id = self.next_id;
                self.next_id = id.next();
                CommitRecord::fresh(id, self.now)
            }
        };
        self.record(record, asking, None)
    }

    /// The consensus point's record is durable: answer the tasks.
    pub(super) fn consensus_recorded(&mut self) -> Vec<CoordAction> {
        let Phase::Recording { record, asking, halt, .. } = std::mem::replace(&mut self.phase, Phase::Running) else {
            return Vec::new();
        };
        let point = record.restore_point();
        let basis = match record.kind {
            RecordKind::Fallback(_) => RestoreBasis::Fallback,
            _ => RestoreBasis::Consensus,
        };
        self.last_commit = Some(record);
        if let Some(reason) = halt {
            self.phase = Phase::Halted;
            return vec![CoordAction::Halt { reason }];
        }
        self.choose(point, basis, asking)
    }
}
