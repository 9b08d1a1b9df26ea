//! Damaged snapshots: at a restart a task's snapshot of the last commit may be damaged
//! everywhere, as a corrupt file on its node and in the store would be. As on the engine
//! (`runtime/checkpointing/verify.rs`), no task of that node restores it: each asks the
//! coordinator to go back, naming the older commits the node can restore. A task told to restore
//! a damaged snapshot asks again the same way. A halt (tasks of the other node restored the
//! damaged point already) is followed by a restart of every node, as the halt says to do.

use weir_engine::backup::commit::decode_commit;
use weir_engine::checkpoint::{CommitRecord, RecordKind};
use weir_engine::wire::CheckpointId;

use super::world::World;

impl World {
    /// Every readable commit record, newest first (what `last_commit` reads, without faults).
    fn records_newest_first(&self) -> Vec<CommitRecord> {
        let mut keys = self.store.keys("1/checkpoints/");
        keys.sort();
        // With a control store, the records it does not list are no commits.
        let listed = self.listed();
        keys.iter()
            .rev()
            .filter_map(|k| {
                let b = self.store.peek(k)?;
                let listed = listed.as_ref().is_none_or(|l| weir_engine::backup::commit::is_listed(l, k, &b));
                listed.then(|| decode_commit(k, &b).ok()).flatten()
            })
            .collect()
    }

    /// The restore point of the last record, if any.
    pub fn last_point(&self) -> Option<(CommitRecord, CheckpointId)> {
        let r = self.records_newest_first().into_iter().next()?;
        let p = r.restore_point()?;
        Some((r, p))
    }

    /// The restore points older than `below` that every task in `tasks` can restore, newest first
    /// (never past a recorded start from nothing).
    pub fn restorable(&self, tasks: &[usize], below: CheckpointId) -> Vec<CheckpointId> {
        let mut out = Vec::new();
        for r in self.records_newest_first() {
            if r.kind == RecordKind::Fresh {
                break;
            }
            let Some(q) = r.restore_point().filter(|q| *q < below && !out.contains(q)) else { continue };
            if tasks.iter().all(|t| !self.damaged.contains(&(*t, q))) {
                out.push(q);
            }
        }
        out
    }

    /// Sometimes damages the last commit's snapshot of one or two tasks (never when no older
    /// commit would be left whole: the stream would halt for good, which is tested elsewhere).
    pub fn maybe_damage(&mut self) {
        if !self.faults || self.stats.damaged_snapshots >= 4 || !self.rng.chance(600) {
            return;
        }
        let Some((_, p)) = self.last_point() else { return };
        let n = self.topo.n();
        if self.restorable(&(0..n).collect::<Vec<_>>(), p).is_empty() {
            return;
        }
        for _ in 0..=self.rng.below(2) {
            let t = self.rng.below(n as u64) as usize;
            if self.damaged.insert((t, p)) {
                self.stats.damaged_snapshots += 1;
                self.note(format!("t{t}'s snapshot of {p} damaged everywhere"));
            }
        }
    }

    /// For each task: the point it must not restore, the older ones its node can, and why
    /// (when some task of its node cannot restore the last record's point).
    pub fn node_check(&self) -> Vec<Option<(CheckpointId, Vec<CheckpointId>, String)>> {
        let n = self.topo.n();
        let Some((_, p)) = self.last_point() else { return vec![None; n] };
        (0..n)
            .map(|i| {
                let node: Vec<usize> = (0..n).filter(|j| self.topo.node(*j) == self.topo.node(i)).collect();
                let bad = node.iter().find(|j| self.damaged.contains(&(**j, p)))?;
                Some((p, self.restorable(&node, p), format!("t{bad}'s snapshot of {p} is damaged")))
            })
            .collect()
    }
}
