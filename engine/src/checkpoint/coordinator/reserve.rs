//! The coordinator's id reservations: blocks of ids for checkpoints, and the id of a record
//! of its own (a consensus, a start from nothing, a fallback) before that record is written.
//!
//! Invariants: every `PersistIds` asks for at least what any earlier one asked for, so the
//! store's id record, which each write replaces and which the store thread writes in order,
//! never goes back (a fallback's reservation while a block's is on its way included); and a
//! checkpoint starts on a reservation's answer only while the coordinator is running.

use std::collections::BTreeMap;

use weir_wire::{CheckpointId, TaskId};

use super::{CommitRecord, CoordAction, Coordinator, IdRecord, Phase};

impl Coordinator {
    /// The write of an id record asking for at least `want`, and for at least what any earlier
    /// write asked for.
    pub(super) fn persist(&mut self, want: IdRecord) -> CoordAction {
        self.asked = self.asked.max(want);
        CoordAction::PersistIds(self.asked)
    }

    /// An id record is durable (even one that answers late): everything below it is reserved.
    pub(super) fn ids_persisted(&mut self, r: IdRecord) -> Vec<CoordAction> {
        self.reserved = self.reserved.max(r);
        self.asked = self.asked.max(r);
        if let Phase::Recording { record, reserved: reserved @ false, .. } = &mut self.phase
            && record.id < self.reserved.next_id
        {
            *reserved = true;
            // The answers come in the order of the asks: one for a block asked before the
            // record is this one, and no checkpoint waits for it any more.
            self.reserving = None;
            return vec![CoordAction::WriteCommit(record.clone())];
        }
        // A block's answer starts the checkpoint it was for, unless a restart's or fallback's
        // record came meanwhile (the next tick starts one once that is done).
        if self.reserving.take().is_none() || !matches!(self.phase, Phase::Running) || !self.ids_reserved() {
            return Vec::new();
        }
        self.start(self.now)
    }

    /// Records `record` before any task hears of it (see [`Phase::Recording`]).
    pub(super) fn record(
        &mut self,
        record: CommitRecord,
        asking: BTreeMap<TaskId, u64>,
        halt: Option<String>,
    ) -> Vec<CoordAction> {
        let reserved = record.id < self.reserved.next_id;
        let retry_at = self.now + self.cfg.store_timeout_ms;
        self.phase = Phase::Recording { record, retry_at, asking, halt, reserved };
        self.write_record()
    }

    /// The next write of the record being recorded: its id's reservation, or the record.
    pub(super) fn write_record(&mut self) -> Vec<CoordAction> {
        let Phase::Recording { record, reserved, .. } = &self.phase else { return Vec::new() };
        if *reserved {
            return vec![CoordAction::WriteCommit(record.clone())];
        }
        // At least what is reserved already: `persist` asks past every earlier ask.
        let want = IdRecord { next_id: self.next_id.max(record.id.next()), next_trans: self.next_trans };
        vec![self.persist(want)]
    }

    /// `id` is in use (a task holds it, or cannot restore it), whenever that is heard of: no
    /// later record or checkpoint takes it (the id record may be behind or gone, and a damaged
    /// checkpoint's record may still be in the store).
    pub(super) fn used(&mut self, id: CheckpointId) {
        self.next_id = self.next_id.max(id.next());
    }

    /// Whether the next id and transaction are reserved durably.
    pub(super) fn ids_reserved(&self) -> bool {
        self.next_id < self.reserved.next_id && self.next_trans < self.reserved.next_trans
    }
}
