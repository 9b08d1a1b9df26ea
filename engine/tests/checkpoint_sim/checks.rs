//! The invariants the simulator checks: on the world as it goes (every visible commit a consistent
//! cut, ids reserved and never reused, reports before commits), after every driver call, in
//! quiet moments, and at the end (the reference every run's results must equal).

use std::collections::BTreeMap;

use weir_engine::checkpoint::{CheckpointError, CommitRecord, TaskState};
use weir_engine::wire::{CheckpointId, TaskId, TransId, Version};

use super::TRIGGER_TIMEOUT;
use super::fx::STREAM;
use super::sim::Sim;
use super::world::{Model, World, snapshot_key};

impl World {
    /// A checkpoint starts only on ids the store has reserved, and never on a pair used before.
    pub fn check_issued(&mut self, id: CheckpointId, trans: TransId) {
        let rec = self.stored_ids().unwrap_or_else(|| panic!("checkpoint {id} started without an id record"));
        assert!(id < rec.next_id && trans < rec.next_trans, "{id} {trans} started beyond the reserved {rec:?}");
        let call = self.coord_call;
        match self.issued.get(&(id, trans)) {
            Some(c) => assert_eq!(*c, call, "({id}, {trans}) started twice"),
            None => {
                let highest = self.issued.keys().map(|k| k.0).max();
                assert!(highest.is_none_or(|h| id > h), "checkpoint id went down: {id} after {highest:?}");
                let trans_high = self.issued.keys().map(|k| k.1).max();
                assert!(trans_high.is_none_or(|h| trans > h), "transaction id went down: {trans} after {trans_high:?}");
                self.issued.insert((id, trans), call);
            }
        }
    }

    /// The id record as the store (or the control store) holds it.
    pub fn stored_ids(&self) -> Option<weir_engine::checkpoint::IdRecord> {
        let key = weir_engine::backup::commit::ids_key(STREAM);
        match &self.control {
            Some(c) => c.reserved(),
            None => self.store.peek(&key).and_then(|b| weir_engine::backup::commit::decode_ids(&key, &b).ok()),
        }
    }

    /// After a reservation: the id record never goes back (a restarted coordinator would reuse
    /// ids and transactions).
    pub fn check_ids_grow(&mut self) {
        let now = self.stored_ids();
        if let (Some(before), Some(now)) = (self.ids_seen, now) {
            assert!(
                now.next_id >= before.next_id && now.next_trans >= before.next_trans,
                "the id record went back: {now:?} after {before:?}"
            );
        }
        self.ids_seen = now.or(self.ids_seen);
    }

    /// A record with an id of its own is written only under an id reserved durably, and no
    /// checkpoint ever started under.
    pub fn check_own_id(&self, r: &CommitRecord) {
        let rec = self.stored_ids().unwrap_or_else(|| panic!("record {} written without an id record", r.id));
        assert!(r.id < rec.next_id, "record {} written beyond the reserved {rec:?}", r.id);
        assert!(!self.issued.keys().any(|(i, _)| *i == r.id), "record {} under a checkpoint's id", r.id);
    }

    /// Nothing commits without a successful report from every task.
    pub fn check_reports(&self, r: &CommitRecord) {
        let got = self.reports.get(&r.id).cloned().unwrap_or_default();
        for i in 0..self.topo.n() {
            assert_eq!(got.get(&i), Some(&true), "commit {} without a report from t{i}", r.id);
        }
    }

    pub fn snapshot(&self, t: usize, id: CheckpointId) -> (Model, Version) {
        let key = snapshot_key(t, id);
        let b = self.store.peek(&key).unwrap_or_else(|| panic!("commit {id} names {key}, which is not stored"));
        Model::decode(&b).unwrap_or_else(|| panic!("{key} does not decode"))
    }

    /// The committed state of every task equals the reference computed from the source offsets.
    pub fn check_consistent(&self, r: &CommitRecord) {
        // A fallback record's state is the checkpoint it goes back to.
        let id = r.restore_point().unwrap_or(r.id);
        let topo = &self.topo;
        let (s_n, a_n) = (topo.sources, topo.aggs);
        // A consensus point's record names no offsets: the sources' snapshots have them.
        let version = |s: usize| r.versions.get(&TaskId(s as u32)).copied().unwrap_or_else(|| self.snapshot(s, id).1).0;
        for s in 0..s_n {
            assert_eq!(self.snapshot(s, id).0.emitted, version(s), "source t{s} differs from its offset in {}", r.id);
        }
        for a in 0..a_n {
            let m = self.snapshot(s_n + a, id).0;
            for (input, s) in self.topo.upstreams(s_n + a).into_iter().enumerate() {
                let routed = (0..version(s)).filter(|o| topo.agg_of(s, *o) == a).count() as u64;
                assert_eq!(m.consumed[input], routed, "agg t{} in {} is not a consistent cut", s_n + a, r.id);
            }
        }
        for k in 0..topo.sinks {
            let t = s_n + a_n + k;
            let m = self.snapshot(t, id).0;
            for (input, a) in topo.upstreams(t).into_iter().enumerate() {
                let agg = self.snapshot(a, id).0;
                let out = topo.downstreams(a).iter().position(|d| *d == t).expect("edge");
                // A sink does not hold inputs while it aligns: everything before the cut, and
                // perhaps more (upserts that a replay writes again with the same values).
                assert!(m.consumed[input] >= agg.forwarded[out], "sink t{t} in {} misses rows before the cut", r.id);
            }
        }
    }
}

impl Sim {
    /// After every driver call of task `t`: a restore that failed leaves the task waiting (it
    /// asks again); anything else is a bug. A task told to reset never checkpoints that id again.
    pub fn after_task(&mut self, t: usize, r: Result<(), CheckpointError>) {
        match r {
            Ok(()) => {}
            Err(CheckpointError::Restore { .. }) => assert!(self.tasks[t].driver.uninit()),
            Err(e) => panic!("t{t}: {e}"),
        }
        if let (TaskState::Checkpointing(x), Some(reset)) =
            (self.tasks[t].driver.machine().state(), self.tasks[t].reset_upto)
        {
            assert!(x > reset, "t{t} checkpointing {x} after it was told to reset {reset}");
        }
    }

    /// In a quiet moment (no faults for a while, nothing in flight), no task is left
    /// checkpointing a checkpoint the coordinator has ended.
    pub fn check_quiet(&self) {
        let w = self.w.borrow();
        let Some(quiet) = w.quiet_since else { return };
        if !w.ctl.is_empty() || !w.uploads.is_empty() {
            return;
        }
        let Some(c) = &self.coord else { return };
        for (t, task) in self.tasks.iter().enumerate() {
            if let TaskState::Checkpointing(x) = task.driver.machine().state()
                && !task.finished
                && c.coordinator().in_flight() != Some(x)
                // A task that missed the end of a checkpoint notices at its next retrieve.
                && w.ended.iter().any(|(id, at)| *id >= x && *at >= quiet && w.now > at + 2 * TRIGGER_TIMEOUT + 500)
            {
                panic!("t{t} still checkpointing {x}, which ended long ago\n{}", self.describe());
            }
        }
    }

    /// The reference: every row of every source exactly once, each valued by its rank among
    /// the rows of its source that took the same agg and sink (as that agg counts them).
    pub fn reference(&self) -> BTreeMap<(usize, u64), u64> {
        let w = self.w.borrow();
        let topo = &w.topo;
        let mut rank: BTreeMap<(usize, usize, usize), u64> = BTreeMap::new();
        let mut out = BTreeMap::new();
        for s in 0..topo.sources {
            for o in 0..topo.limit {
                let a = topo.agg_of(s, o);
                let k = topo.sink_of(a, o);
                let r = rank.entry((s, a, k)).or_insert(0);
                *r += 1;
                out.insert((s, o), *r);
            }
        }
        out
    }

    pub fn describe(&self) -> String {
        let w = self.w.borrow();
        let states: Vec<String> = (0..w.topo.n())
            .map(|t| {
                let m = self.tasks[t].driver.machine();
                format!(
                    "t{t}: {:?} latest {:?} failed {:?} closed {:?} finished {}",
                    m.state(),
                    m.latest(),
                    m.failed(),
                    w.closed[t],
                    self.tasks[t].finished
                )
            })
            .collect();
        let chans: Vec<String> =
            w.channels.iter().map(|c| format!("{}->{}: {} queued", c.from, c.to, c.q.len())).collect();
        let trace: Vec<String> = w.trace.iter().cloned().collect();
        format!("{:?}\n{}\n{}\nlast steps:\n{}", w.topo, states.join("\n"), chans.join("\n"), trace.join("\n"))
    }
}
