//! The simulator's side of the drivers' traits: [`SimPort`] (a model task on simulated channels),
//! [`SimTaskFx`] and [`SimCoordFx`] (the scheduler, the faulty store, the task's meta record).
//! Each holds the world through a `RefCell`, borrowed for the length of one call.

use std::cell::RefCell;

use weir_engine::backup::Store;
use weir_engine::backup::commit::CommitWrite;
use weir_engine::backup::commit_point::PointError;
use weir_engine::checkpoint::driver::{Clock, CoordEffects, Hold, RestorePoint, TaskEffects, TaskPort, UploadRequest};
use weir_engine::checkpoint::{CheckpointError, CommitRecord, CoordInput, IdRecord, RecordKind, Role, TaskInput};
use weir_engine::wire::msg::{CheckpointOutcome, CheckpointStats, RestoreBasis};
use weir_engine::wire::{CheckpointId, Seq, StreamId, TaskId, TransId, Version};

use super::cuts::Cut;
use super::world::World;
use super::world::{Ctl, Item, Model, snapshot_key};

pub const STREAM: StreamId = StreamId(1);

/// A model task as its driver's port.
pub struct SimPort<'a> {
    pub w: &'a RefCell<World>,
    pub t: usize,
}

impl TaskPort for SimPort<'_> {
    type Captured = Model;

    fn close_input(&mut self, i: usize, _id: CheckpointId) -> Hold {
        let mut w = self.w.borrow_mut();
        let t = self.t;
        // An agg cuts its inputs for half of its checkpoints (as one with replay snapshots
        // does when it can): every input of a checkpoint, or none.
        let cutting = w.cuts[t].iter().any(Option::is_some);
        let holding = w.closed[t].iter().any(|c| *c);
        if w.setups[t].role == Role::Agg && (cutting || (!holding && w.rng.chance(500))) {
            let outs = w.setups[t].downstreams.len();
            w.cuts[t][i] = Some(Cut { forwarded: vec![0; outs], ..Cut::default() });
            w.stats.cut_inputs += 1;
            return Hold::Cut;
        }
        w.closed[t][i] = true;
        Hold::Closed
    }

    fn reopen_input(&mut self, i: usize) {
        let mut w = self.w.borrow_mut();
        w.closed[self.t][i] = false;
        w.release(self.t, Some(i));
    }

    fn reopen_all_inputs(&mut self) {
        let mut w = self.w.borrow_mut();
        w.closed[self.t].iter_mut().for_each(|c| *c = false);
        w.release(self.t, None);
    }

    fn queue_source_trigger(&mut self, id: CheckpointId, _savepoint: bool) {
        self.w.borrow_mut().queued_trigger[self.t] = Some(id);
    }

    fn capture(&mut self, id: CheckpointId) -> Result<Model, CheckpointError> {
        let mut w = self.w.borrow_mut();
        if w.faults && w.rng.chance(15) {
            w.stats.snapshot_failures += 1;
            return Err(CheckpointError::Snapshot { task: TaskId(self.t as u32), id, reason: "disk full".into() });
        }
        Ok(w.at_cuts(self.t))
    }

    fn forward_trigger(&mut self, id: CheckpointId, trans: TransId) -> Result<Vec<(TaskId, Seq)>, CheckpointError> {
        let mut w = self.w.borrow_mut();
        let downs = w.topo.downstreams(self.t);
        let sent =
            downs.into_iter().map(|d| (TaskId(d as u32), w.push(self.t, d, Item::Trigger { id, trans }))).collect();
        w.release(self.t, None); // rows past the cuts go behind the barrier
        Ok(sent)
    }

    fn next_seq(&self, from: TaskId) -> Option<Seq> {
        let w = self.w.borrow();
        w.chan_of.get(&(from.0 as usize, self.t)).map(|ci| Seq(w.channels[*ci].expected))
    }

    fn restore(&mut self, point: Option<RestorePoint>) -> Result<Version, CheckpointError> {
        let mut w = self.w.borrow_mut();
        let t = self.t;
        w.cuts[t].iter_mut().for_each(|c| *c = None); // the state they cut is replaced
        let Some(p) = point else {
            w.models[t] = w.empty(t);
            return Ok(Version(0));
        };
        assert!(w.commits.iter().any(|c| c.id == p.id), "t{t} told to restore {}, which never committed", p.id);
        if w.damaged.contains(&(t, p.id)) {
            let restorable = w.restorable(&[t], p.id);
            let reason = format!("t{t}'s snapshot of {} is damaged", p.id);
            return Err(CheckpointError::Damaged { task: TaskId(t as u32), id: p.id, reason, restorable });
        }
        let key = snapshot_key(t, p.id);
        let failed = |reason: String| CheckpointError::Restore { task: TaskId(t as u32), id: Some(p.id), reason };
        w.stats.restores_from_store += 1;
        let bytes = w.store.get(&key).map_err(|e| failed(e.to_string()));
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                w.stats.restore_failures += 1;
                return Err(e);
            }
        };
        let (m, version) = Model::decode(&bytes).unwrap_or_else(|| panic!("{key} does not decode"));
        w.models[t] = m;
        Ok(p.version.unwrap_or(version))
    }
}

/// A task's effects in the simulation.
pub struct SimTaskFx<'a> {
    pub w: &'a RefCell<World>,
    pub t: usize,
}

impl Clock for SimTaskFx<'_> {
    fn wall_us(&self) -> u64 {
        self.w.borrow().now * 1000
    }

    fn mono_us(&self) -> u64 {
        self.w.borrow().now * 1000
    }
}

impl TaskEffects<Model> for SimTaskFx<'_> {
    fn send_task(&mut self, to: TaskId, input: TaskInput) {
        let mut w = self.w.borrow_mut();
        if matches!(input, TaskInput::RetrieveTrigger { .. }) {
            w.stats.retrieves += 1;
        }
        let (from, to_i) = (self.t, to.0 as usize);
        w.post(Some((from, to_i)), Ctl::ToTask(to, input));
    }

    fn send_coord(&mut self, input: CoordInput) {
        let mut w = self.w.borrow_mut();
        let t = self.t;
        w.post(Some((t, super::COORD)), Ctl::ToCoord(input));
    }

    fn upload(&mut self, job: UploadRequest<Model>) {
        let mut w = self.w.borrow_mut();
        if w.faults && w.rng.chance(5) {
            w.stats.store_hangs += 1;
            return; // the store never answers: the checkpoint times out
        }
        let due = w.now + 1 + w.rng.below(300);
        w.uploads.push((due, self.t, job));
    }

    fn read_committed(&mut self) -> Result<Option<(CheckpointId, Version)>, CheckpointError> {
        Ok(self.w.borrow().persisted[self.t])
    }

    fn persist_committed(&mut self, id: CheckpointId, version: Version, _ts: u64) -> Result<(), CheckpointError> {
        self.w.borrow_mut().persisted[self.t] = Some((id, version));
        Ok(())
    }

    fn delete_snapshots_before(&mut self, _id: CheckpointId) {}

    fn drop_snapshot(&mut self, id: CheckpointId) {
        // A snapshot a visible commit names is a restore point: it must never be deleted.
        let w = self.w.borrow();
        assert!(
            !w.commits.iter().any(|c| c.id == id),
            "t{} dropped its snapshot of {id}, which a commit names",
            self.t
        );
    }
}

/// The coordinator's effects in the simulation.
pub struct SimCoordFx<'a> {
    pub w: &'a RefCell<World>,
}

impl Clock for SimCoordFx<'_> {
    fn wall_us(&self) -> u64 {
        self.w.borrow().now * 1000
    }

    fn mono_us(&self) -> u64 {
        self.w.borrow().now * 1000
    }
}

impl SimCoordFx<'_> {
    /// Schedules the answer of a store write (never lost; sometimes it never comes).
    fn answer(w: &mut World, input: CoordInput) {
        if w.faults && w.rng.chance(20) {
            w.stats.store_hangs += 1;
            return;
        }
        let at = w.now + 1 + w.rng.below(if w.faults { 200 } else { 20 });
        let n = w.coord_incarnation;
        w.ctl.push((at, Ctl::StoreDone(n, input)));
    }
}

impl CoordEffects for SimCoordFx<'_> {
    fn halt(&mut self, reason: String) {
        let mut w = self.w.borrow_mut();
        // Only damage halts a stream: without any, a halt is a bug.
        assert!(!w.damaged.is_empty(), "the simulated stream halted with nothing damaged: {reason}");
        w.halted = Some(reason);
    }

    fn send_task(&mut self, to: TaskId, input: TaskInput) {
        let mut w = self.w.borrow_mut();
        if let TaskInput::SourceReq { id, trans, .. } = input {
            w.check_issued(id, trans);
        }
        w.post(Some((super::COORD, to.0 as usize)), Ctl::ToTask(to, input));
    }

    fn send_restore(
        &mut self,
        to: TaskId,
        id: Option<CheckpointId>,
        version: Option<Version>,
        basis: RestoreBasis,
        request: u64,
    ) {
        let point = id.map(|id| RestorePoint { id, version, manifest_crc: None });
        self.w.borrow_mut().post(Some((super::COORD, to.0 as usize)), Ctl::Restore(to, point, basis, request));
    }

    fn persist_ids(&mut self, ids: IdRecord) {
        let mut w = self.w.borrow_mut();
        let reserved = w.book.reserve(&*w.store, &ids);
        w.note(format!("reserve {ids:?}: {reserved:?}"));
        w.check_ids_grow();
        let answer = match reserved {
            Ok(()) => CoordInput::IdsPersisted(ids),
            Err(e) => {
                w.stats.id_record_failures += 1;
                // No coordinator but the live one writes here: nothing may fence it.
                assert!(!matches!(e, PointError::Fenced { .. }), "the coordinator fenced: {e}");
                CoordInput::IdsFailed { reason: e.to_string() }
            }
        };
        Self::answer(&mut w, answer);
    }

    fn write_commit(&mut self, record: CommitRecord) {
        let mut w = self.w.borrow_mut();
        // No key of the store holds two records: a record is written again only as it was.
        let first = w.written.entry(record.id).or_insert_with(|| record.clone());
        assert_eq!(*first, record, "two records under id {}", record.id);
        if !matches!(record.kind, RecordKind::Commit(_)) {
            w.check_own_id(&record);
        }
        match record.kind {
            // The consensus's choice: a checkpoint that committed, under an id above every
            // commit's (no record key is written twice).
            RecordKind::Consensus(to) => {
                assert!(w.commits.iter().any(|c| c.id == to), "consensus record of {to}, which never committed");
                assert!(w.commits.iter().all(|c| c.id < record.id), "consensus record {} reuses an id", record.id);
            }
            // A start from nothing takes an id no checkpoint ever had.
            RecordKind::Fresh => {
                assert!(w.commits.iter().all(|c| c.id < record.id), "fresh record {} reuses an id", record.id);
                w.stats.fresh_records += 1;
            }
            RecordKind::Commit(_) => w.check_reports(&record),
            // Going back: to a checkpoint that committed, under an id above every commit's.
            RecordKind::Fallback(to) => {
                assert!(!w.damaged.is_empty(), "fallback record {} to {to}, but nothing is damaged", record.id);
                assert!(w.commits.iter().any(|c| c.id == to), "fallback to {to}, which never committed");
                assert!(w.commits.iter().all(|c| c.id < record.id), "fallback record {} reuses an id", record.id);
                w.stats.fallbacks += 1;
            }
        }
        let outcome = w.book.commit(&*w.store, &record);
        w.note(format!("commit {} {:?}: {outcome:?}", record.id, record.kind));
        // What counts is what a restart would read: the record visible in the store, or with a
        // control store, the record its point names.
        let counts = match w.point() {
            Some(p) => p == record.id,
            None => w.store.peek(&weir_engine::backup::commit::commit_key(STREAM, record.id)).is_some(),
        };
        if counts {
            if record.kind != RecordKind::Fresh {
                w.check_consistent(&record);
            }
            if let RecordKind::Commit(_) = record.kind {
                assert!(w.commits.iter().all(|c| c.id < record.id), "commit ids must grow");
                w.commits.push(record.clone());
            }
            w.note(format!("commit {} visible", record.id));
        }
        let answer = match outcome {
            CommitWrite::Durable => CoordInput::CommitDurable { id: record.id },
            CommitWrite::Refused(reason) => panic!("the coordinator fenced: {reason}"),
            CommitWrite::Failed(reason) => {
                w.stats.commit_write_failures += 1;
                CoordInput::CommitFailed { id: record.id, reason }
            }
        };
        if w.faults && w.rng.chance(30) {
            // The coordinator dies right after the write, before it tells any task.
            w.stats.crashes_after_commit_write += 1;
            w.crash_coordinator = true;
            return;
        }
        Self::answer(&mut w, answer);
    }

    fn finished(&mut self, stats: CheckpointStats) {
        let mut w = self.w.borrow_mut();
        if let CheckpointOutcome::Failed { reason } = &stats.outcome {
            w.note(format!("checkpoint {} failed: {reason}", stats.checkpoint));
            w.stats.failed_checkpoints += 1;
            if reason.contains("refused") {
                w.stats.refusals += 1;
            }
        }
        let now = w.now;
        w.ended.push((stats.checkpoint, now));
    }
}

/// The last commit in the store and the id record, as a restarting coordinator reads them
/// (either read may fail: the coordinator then stays down and tries again).
pub fn coordinator_start(w: &World) -> Result<(Option<CommitRecord>, IdRecord), String> {
    let begun = w.book.begin(&*w.store).map_err(|e| e.to_string())?;
    Ok((begun.last, begun.ids))
}
