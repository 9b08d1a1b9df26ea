//! Falling back: a starting task that cannot restore the chosen point (its files damaged or
//! missing on its node and in the store) asks for an older one, and the coordinator takes the
//! whole stream back together to the newest committed checkpoint every task can restore.
//!
//! Invariants:
//! - The decision waits for every task of the stream (or the consensus wait): each says which
//!   older commits its node can restore, and the stream goes to the newest that all can.
//! - Only tasks that said they cannot restore the point count: one whose node found nothing
//!   damaged may hold that point already (told it by this coordinator or an earlier one, and the
//!   answer perhaps still on its way), so it cannot go back with the others.
//! - The choice is recorded before any task hears it, under an id of its own (a
//!   [`RecordKind::Fallback`] record sorts above the one it supersedes), so a restarted
//!   coordinator makes it again.
//! - Never a start from nothing while commits exist: with no older commit every task can
//!   restore, the stream halts with what was found.
//! - So when some tasks did not say so (other nodes), they cannot go back with the others: the fallback is
//!   recorded, so restarting every node takes the stream back together, and the stream halts
//!   saying so.

use std::collections::{BTreeMap, BTreeSet};

use weir_wire::{CheckpointId, TaskId};

use super::{CommitRecord, CoordAction, Coordinator, Phase};

impl Coordinator {
    /// Task `task` cannot restore `id`; its node can restore the older commits `restorable`.
    pub(super) fn cannot_restore(
        &mut self,
        task: TaskId,
        id: CheckpointId,
        restorable: Vec<CheckpointId>,
        reason: String,
        request: u64,
    ) -> Vec<CoordAction> {
        if !self.cfg.tasks.iter().any(|(t, _, _)| *t == task) {
            return Vec::new();
        }
        self.used(id);
        // Only below what it cannot restore.
        let restorable: BTreeSet<CheckpointId> = restorable.into_iter().filter(|b| *b < id).collect();
        let mut out = Vec::new();
        match &mut self.phase {
            Phase::Running if self.restore_point.as_ref().is_some_and(|(p, _)| *p == Some(id)) => {
                // A checkpoint started meanwhile cannot finish: this task restores nothing.
                if self.flight.as_ref().is_some_and(|f| f.committing.is_none()) {
                    out = self.fail(crate::checkpoint::CheckpointFailure::CannotRestore { task, id });
                }
                self.phase = Phase::FallingBack {
                    from: id,
                    deadline: self.now + self.cfg.consensus_wait_ms,
                    can: BTreeMap::new(),
                    asking: BTreeMap::new(),
                    reasons: BTreeMap::new(),
                };
            }
            // An answer to an older question: the point chosen since is the answer.
            Phase::Running => return self.restore_one(task, request).into_iter().collect(),
            Phase::FallingBack { from, .. } if *from == id => {}
            // A point given up already, or the one being recorded: counts as a request.
            Phase::FallingBack { asking, .. } | Phase::Recording { asking, .. } => {
                asking.insert(task, request);
                return self.fallback_if_complete();
            }
            Phase::Consensus { .. } => {
                // Something was committed: not a new stream, even if nothing is restorable.
                self.new_stream = false;
                let latest = restorable.last().copied();
                return self.handle(super::CoordInput::Consensus { task, latest, request });
            }
            Phase::Down | Phase::Halted => return Vec::new(),
        }
        if let Phase::FallingBack { can, asking, reasons, .. } = &mut self.phase {
            can.insert(task, Some(restorable));
            asking.insert(task, request);
            reasons.insert(task, reason);
        }
        out.extend(self.fallback_if_complete());
        out
    }

    /// Decides once every task of the stream has answered.
    pub(super) fn fallback_if_complete(&mut self) -> Vec<CoordAction> {
        match &self.phase {
            Phase::FallingBack { can, .. } if can.len() == self.cfg.tasks.len() => self.finish_fallback(),
            _ => Vec::new(),
        }
    }

    /// Chooses the newest commit every task can restore, and records it.
    pub(super) fn finish_fallback(&mut self) -> Vec<CoordAction> {
        let Phase::FallingBack { from, can, asking, reasons, .. } = std::mem::replace(&mut self.phase, Phase::Running)
        else {
            return Vec::new();
        };
        // The tasks of a node say the same: each different finding once.
        let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (t, r) in &reasons {
            by_reason.entry(r.as_str()).or_default().push(t.to_string());
        }
        let found: Vec<String> = by_reason.iter().map(|(r, ts)| format!("{r} (asked by {})", ts.join(", "))).collect();
        let found = found.join("; ");
        let mut sets = can.values().flatten();
        let first = sets.next().cloned().unwrap_or_default();
        let to = sets.fold(first, |all, s| all.intersection(s).copied().collect()).last().copied();
        let Some(to) = to else {
            self.phase = Phase::Halted;
            let reason = format!(
                "no committed checkpoint older than {from} that every task can restore ({found}); the stream \
                 does not start empty while commits exist: repair the store, or start the stream afresh"
            );
            return vec![CoordAction::FallingBack { from, to: None, reason: found }, CoordAction::Halt { reason }];
        };
        let missing: Vec<String> =
            self.cfg.tasks.iter().filter(|(t, _, _)| !can.contains_key(t)).map(|(t, _, _)| t.to_string()).collect();
        let halt = (!missing.is_empty()).then(|| {
            format!(
                "tasks {} restored checkpoint {from} and cannot go back to {to} with the others; the fallback to \
                 {to} is recorded: restart every node of the stream to go back together",
                missing.join(", ")
            )
        });
        let id = self.next_id;
        self.next_id = id.next();
        let record = CommitRecord::fallback(id, to, self.now);
        let mut out = vec![CoordAction::FallingBack { from, to: Some(to), reason: found }];
        out.extend(self.record(record, asking, halt));
        out
    }
}
