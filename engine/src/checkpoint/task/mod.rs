//! The task side of the checkpoint protocol as a pure state machine: [`TaskMachine::handle`] takes
//! one [`TaskInput`] (a message, an event from the task's own I/O, or a tick) and returns the
//! [`TaskAction`]s the runtime must carry out, in order. No clock, no I/O, no locks: the runtime
//! drives it on the task's worker thread, and the deterministic simulator drives it in tests.
//!
//! Invariants:
//! - A trigger that is discarded (expired, failed, invalid, duplicate) changes nothing but the
//!   discard counter: discarded means not processed. "Invalid" is an id below the active one; an
//!   id above it ends the active checkpoint (see `abandon`).
//! - Peers are matched by task id, never by node.
//! - The task stalls only for alignment plus its local snapshot: inputs reopen as soon as the
//!   snapshot is taken, not at the global commit.
//! - After a failure or a reset the task is back in `Ready` with every input open and the failed id
//!   remembered; nothing at or below a failed id is acted on again.

mod ending;
mod interface;
mod retrieve;

pub use interface::*;
use weir_wire::msg::{TaskCheckpointStats, TriggerKind};
use weir_wire::{CheckpointId, Seq, TaskId, TransId, Version};

use super::{CheckpointError, TaskFailure};

/// Where a task is in its checkpoint.
#[derive(Clone, Debug)]
enum Stage {
    /// Collecting barriers (a source: until it reaches its queued trigger).
    Aligning,
    /// The snapshot is taken and the task runs again; the upload runs in the background.
    Uploading,
    /// The snapshot is durable; waiting until every downstream is ready.
    Durable(UploadDone),
    /// Ready sent upstream (a source answered the coordinator) and reported, last at
    /// `last_sent`; until the checkpoint ends, unconfirmed ready messages and the report are
    /// resent (the coordinator ignores duplicates), so a lost one cannot stall it.
    Reported { report: Report, last_sent: u64 },
}

#[derive(Clone, Debug)]
struct Active {
    id: CheckpointId,
    trans: TransId,
    stage: Stage,
    /// Per upstream: its trigger is in.
    triggers: Vec<bool>,
    /// The source request to answer (sources).
    source_req: bool,
    offset: Version,
    /// Per downstream: the sequence number our trigger had on that channel, once dispatched.
    dispatched: Vec<Option<Seq>>,
    /// Per downstream: it is ready.
    downstream_ready: Vec<bool>,
    /// Per upstream: our ready was confirmed.
    ready_confirmed: Vec<bool>,
    last_retrieve_at: u64,
}

impl Active {
    fn snapshot_taken(&self) -> bool {
        !matches!(self.stage, Stage::Aligning)
    }

    /// The report of this checkpoint with `outcome` (upload figures once durable, else zero).
    /// A task reports once per checkpoint: on success when durable, or on its failure before.
    fn report(&self, outcome: Result<Version, TaskFailure>) -> Report {
        let up = match &self.stage {
            Stage::Durable(up) => up.clone(),
            _ => UploadDone::default(),
        };
        Report {
            id: self.id,
            trans: self.trans,
            outcome,
            manifest_crc: up.manifest_crc,
            stats: TaskCheckpointStats {
                upload_bytes: up.bytes,
                upload_us: up.upload_us,
                files: up.files,
                ..TaskCheckpointStats::default()
            },
        }
    }
}

/// The task side of the protocol for one task.
#[derive(Clone, Debug)]
pub struct TaskMachine {
    setup: TaskSetup,
    state: TaskState,
    latest: Option<CheckpointId>,
    latest_version: Version,
    latest_ts: Option<u64>,
    failed: Option<CheckpointId>,
    active: Option<Active>,
    /// Per upstream: it sent its end of stream, so no trigger will ever come from it: it counts
    /// as aligned in every checkpoint from now on.
    ended: Vec<bool>,
    now: u64,
    /// Checkpoints this task started.
    pub started: u64,
    /// Inputs discarded.
    pub discarded: u64,
    /// Triggers injected after a successful retrieve.
    pub injected: u64,
}

impl TaskMachine {
    /// A task in `Uninit`; feed `Restored` to make it ready.
    pub fn new(setup: TaskSetup) -> Self {
        Self {
            ended: vec![false; setup.upstreams.len()],
            setup,
            state: TaskState::Uninit,
            latest: None,
            latest_version: Version(0),
            latest_ts: None,
            failed: None,
            active: None,
            now: 0,
            started: 0,
            discarded: 0,
            injected: 0,
        }
    }

    /// The task's setup.
    pub fn setup(&self) -> &TaskSetup {
        &self.setup
    }

    /// Lifecycle state.
    pub fn state(&self) -> TaskState {
        self.state
    }

    /// Last committed checkpoint, if any.
    pub fn latest(&self) -> Option<CheckpointId> {
        self.latest
    }

    /// Source offset of the last committed checkpoint.
    pub fn latest_version(&self) -> Version {
        self.latest_version
    }

    /// When the last committed checkpoint committed (ms), when this task heard of the commit
    /// (not for a restored one).
    pub fn latest_ts(&self) -> Option<u64> {
        self.latest_ts
    }

    /// Last failed checkpoint.
    pub fn failed(&self) -> Option<CheckpointId> {
        self.failed
    }

    /// Whether the task is between the start of a checkpoint (its first trigger, or a source's
    /// request) and its snapshot, holding inputs: the part of a checkpoint the pipeline waits
    /// for. A task that holds no input (see [`TaskSetup::hold_inputs`]) pauses nothing while it
    /// waits for its last trigger.
    pub fn aligning(&self) -> bool {
        self.setup.hold_inputs && self.active.as_ref().is_some_and(|a| !a.snapshot_taken())
    }

    fn upstream_index(&self, t: TaskId) -> Option<usize> {
        self.setup.upstreams.iter().position(|(u, _)| *u == t)
    }

    fn downstream_index(&self, t: TaskId) -> Option<usize> {
        self.setup.downstreams.iter().position(|(d, _)| *d == t)
    }

    fn begin(&mut self, id: CheckpointId, trans: TransId, source_req: bool) {
        let now = self.now;
        self.state = TaskState::Checkpointing(id);
        self.started += 1;
        self.active = Some(Active {
            id,
            trans,
            triggers: self.ended.clone(),
            source_req,
            offset: Version(0),
            stage: Stage::Aligning,
            dispatched: vec![None; self.setup.downstreams.len()],
            downstream_ready: vec![false; self.setup.downstreams.len()],
            ready_confirmed: vec![false; self.setup.upstreams.len()],
            last_retrieve_at: now,
        });
    }

    fn discard(&mut self, why: Discard) -> Vec<TaskAction> {
        self.discarded += 1;
        vec![TaskAction::Discarded(why)]
    }

    /// Handles one input.
    pub fn handle(&mut self, input: TaskInput) -> Vec<TaskAction> {
        if self.state == TaskState::Stopped {
            return Vec::new();
        }
        match input {
            TaskInput::Tick { now } => self.tick(now),
            TaskInput::Restored { id, version } => {
                self.latest = id;
                self.latest_version = version;
                self.active = None;
                self.state = TaskState::Ready;
                vec![TaskAction::ReopenAllInputs]
            }
            // A checkpoint may fail before this task has restored: it must not take part in it
            // afterwards (a barrier of it may still be on the way).
            TaskInput::Reset { failed, .. } if self.state == TaskState::Uninit => {
                self.failed = Some(self.failed.map_or(failed, |f| f.max(failed)));
                Vec::new()
            }
            // A source asked to checkpoint before it restored says so: the checkpoint cannot
            // complete without it, so it ends now instead of at its timeout (a downstream that
            // aligned on it meanwhile would ask it in vain).
            TaskInput::SourceReq { id, trans, .. } if self.state == TaskState::Uninit => {
                vec![TaskAction::SendSourceRsp { id, trans, answer: SourceAnswer::NotRestored }]
            }
            _ if self.state == TaskState::Uninit => Vec::new(),
            TaskInput::SourceReq { id, trans, expire_at, kind } => {
                self.source_req(id, trans, matches!(kind, TriggerKind::Savepoint), expire_at)
            }
            TaskInput::SourceReachedTrigger { id, offset } => match &mut self.active {
                Some(a) if a.id == id && a.source_req && !a.snapshot_taken() => {
                    a.offset = offset;
                    vec![TaskAction::Snapshot { id, trans: a.trans, offset }]
                }
                _ => self.discard(Discard::Invalid),
            },
            TaskInput::Trigger { from, id, trans } => self.trigger(from, id, trans),
            TaskInput::UpstreamEnded { from } => {
                let Some(i) = self.upstream_index(from) else { return self.discard(Discard::Misdirected) };
                self.ended[i] = true;
                match self.active.as_mut() {
                    // An alignment waiting for this upstream is complete without it.
                    Some(a) if !a.triggers[i] => {
                        a.triggers[i] = true;
                        if a.triggers.iter().all(|t| *t) && !a.snapshot_taken() {
                            return vec![TaskAction::Snapshot { id: a.id, trans: a.trans, offset: Version(0) }];
                        }
                        Vec::new()
                    }
                    _ => Vec::new(),
                }
            }
            TaskInput::SnapshotTaken { id, result } => self.snapshot_taken(id, result),
            TaskInput::TriggerDispatched { to, seq } => {
                let i = self.downstream_index(to);
                if let (Some(a), Some(i)) = (self.active.as_mut(), i)
                    && a.snapshot_taken()
                {
                    a.dispatched[i] = Some(seq);
                }
                Vec::new()
            }
            TaskInput::Uploaded { id, result } => match &mut self.active {
                Some(a) if a.id == id && matches!(a.stage, Stage::Uploading) => match result {
                    Ok(up) => {
                        a.stage = Stage::Durable(up);
                        self.try_ready()
                    }
                    Err(e) => self.fail(TaskFailure::Upload(e)),
                },
                _ => Vec::new(),
            },
            TaskInput::Ready { from, id, trans } => self.ready(from, id, trans),
            TaskInput::ReadyRsp { from, id } => {
                let i = self.upstream_index(from);
                if let (Some(a), Some(i)) = (self.active.as_mut(), i)
                    && a.id == id
                {
                    a.ready_confirmed[i] = true;
                }
                Vec::new()
            }
            TaskInput::RetrieveTrigger { from, id } => self.retrieve(from, id),
            TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, next_seq } => {
                self.trigger_rsp(from, id, trans, code, trigger_seq, next_seq)
            }
            TaskInput::Update { id, version, ts, .. } => self.update(id, version, ts),
            TaskInput::Reset { failed, .. } => self.reset(failed),
        }
    }

    fn source_req(&mut self, id: CheckpointId, trans: TransId, savepoint: bool, expire_at: u64) -> Vec<TaskAction> {
        let answer = |answer| vec![TaskAction::SendSourceRsp { id, trans, answer }];
        if self.setup.role != Role::Source {
            return answer(SourceAnswer::NotSource);
        }
        if let Some(latest) = self.latest
            && id <= latest
        {
            return answer(SourceAnswer::AlreadyCompleted(latest));
        }
        if let Some(f) = self.failed
            && id <= f
        {
            return answer(SourceAnswer::AlreadyFailed(f));
        }
        let mut out = Vec::new();
        if let TaskState::Checkpointing(active) = self.state {
            if active == id {
                return self.discard(Discard::Duplicate); // a resent request: already working on it
            }
            if id < active {
                return answer(SourceAnswer::Busy(active));
            }
            out = self.abandon();
        }
        if self.now > expire_at {
            out.extend(self.discard(Discard::Stale));
            return out;
        }
        self.begin(id, trans, true);
        out.push(TaskAction::QueueSourceTrigger { id, trans, savepoint });
        out
    }

    fn trigger(&mut self, from: TaskId, id: CheckpointId, trans: TransId) -> Vec<TaskAction> {
        let Some(i) = self.upstream_index(from) else { return self.discard(Discard::Misdirected) };
        if self.latest.is_some_and(|l| id < l) {
            return self.discard(Discard::Expired);
        }
        if let Some(f) = self.failed
            && id <= f
        {
            return self.discard(Discard::Failed);
        }
        if Some(id) == self.latest {
            // The checkpoint completed here; the upstream missed our ready: resend it. The input
            // stays closed if it is held for a newer checkpoint's alignment.
            let (to, node) = self.setup.upstreams[i];
            let mut out = vec![TaskAction::SendReady { to, node, id, trans }];
            if !self.active.as_ref().is_some_and(|a| a.triggers[i]) {
                out.push(TaskAction::ReopenInput(i));
            }
            return out;
        }
        let mut out = Vec::new();
        if let TaskState::Checkpointing(active) = self.state {
            if id < active {
                return self.discard(Discard::Invalid);
            }
            if id > active {
                out = self.abandon();
                self.begin(id, trans, false);
            } else {
                let a = self.active.as_ref().expect("active");
                if a.triggers.iter().all(|t| *t) || a.triggers[i] {
                    return self.discard(Discard::Duplicate);
                }
            }
        } else {
            self.begin(id, trans, false);
        }
        let a = self.active.as_mut().expect("active");
        a.triggers[i] = true;
        if self.setup.hold_inputs {
            out.push(TaskAction::CloseInput(i));
        }
        if a.triggers.iter().all(|t| *t) {
            out.push(TaskAction::Snapshot { id, trans: a.trans, offset: Version(0) });
        }
        out
    }

    fn snapshot_taken(&mut self, id: CheckpointId, result: Result<(), CheckpointError>) -> Vec<TaskAction> {
        match &mut self.active {
            Some(a) if a.id == id && !a.snapshot_taken() => {
                if let Err(e) = result {
                    return self.fail(TaskFailure::Snapshot(e));
                }
                a.stage = Stage::Uploading;
                // Resume at once: the snapshot holds the cut; the upload runs in the background.
                vec![TaskAction::ReopenAllInputs, TaskAction::Upload { id }]
            }
            _ => Vec::new(),
        }
    }

    fn ready(&mut self, from: TaskId, id: CheckpointId, trans: TransId) -> Vec<TaskAction> {
        let Some(i) = self.downstream_index(from) else { return self.discard(Discard::Misdirected) };
        let mut out = Vec::new();
        match &mut self.active {
            Some(a) if a.id == id && a.trans != trans => return self.discard(Discard::Invalid),
            Some(a) if a.id == id => {
                a.downstream_ready[i] = true; // a duplicate sets it again: no effect
                out.push(TaskAction::SendReadyRsp { to: from, id });
                out.extend(self.try_ready());
            }
            // Confirm late or repeated ready messages of finished checkpoints so they stop.
            _ if self.latest.is_some_and(|l| id <= l) || self.failed.is_some_and(|f| id <= f) => {
                out.push(TaskAction::SendReadyRsp { to: from, id })
            }
            _ => out.push(TaskAction::Discarded(Discard::Invalid)),
        }
        out
    }

    /// Sends ready upstream (or answers the coordinator) once the snapshot is durable and every
    /// downstream is ready.
    fn try_ready(&mut self) -> Vec<TaskAction> {
        let now = self.now;
        let role = self.setup.role;
        let Some(a) = self.active.as_mut() else { return Vec::new() };
        if !matches!(a.stage, Stage::Durable(_)) || !a.downstream_ready.iter().all(|r| *r) {
            return Vec::new();
        }
        let report = a.report(Ok(a.offset));
        let mut out = Vec::new();
        if role == Role::Source {
            out.push(TaskAction::SendSourceRsp { id: a.id, trans: a.trans, answer: SourceAnswer::Done(a.offset) });
        }
        for (to, node) in &self.setup.upstreams {
            out.push(TaskAction::SendReady { to: *to, node: *node, id: a.id, trans: a.trans });
        }
        a.stage = Stage::Reported { report: report.clone(), last_sent: now };
        out.push(TaskAction::SendReport(report));
        out
    }

    fn tick(&mut self, now: u64) -> Vec<TaskAction> {
        self.now = now;
        let Some(a) = self.active.as_mut() else { return Vec::new() };
        let mut out = Vec::new();
        // Missing triggers: reopen that input and ask the upstream.
        let timeout = self.setup.trigger_timeout_ms;
        if !a.snapshot_taken() && now.saturating_sub(a.last_retrieve_at) >= timeout {
            a.last_retrieve_at = now;
            for (i, got) in a.triggers.iter().enumerate() {
                if !got {
                    let (to, node) = self.setup.upstreams[i];
                    out.push(TaskAction::ReopenInput(i));
                    out.push(TaskAction::SendRetrieveTrigger { to, node, id: a.id });
                }
            }
        }
        // Unconfirmed ready messages (and the report, and a source's answer): resend.
        if let Stage::Reported { report, last_sent } = &mut a.stage
            && now.saturating_sub(*last_sent) >= self.setup.ready_resend_ms
        {
            *last_sent = now;
            for (i, (to, node)) in self.setup.upstreams.iter().enumerate() {
                if !a.ready_confirmed[i] {
                    out.push(TaskAction::SendReady { to: *to, node: *node, id: a.id, trans: a.trans });
                }
            }
            if a.source_req {
                let answer = SourceAnswer::Done(a.offset);
                out.push(TaskAction::SendSourceRsp { id: a.id, trans: a.trans, answer });
            }
            out.push(TaskAction::SendReport(report.clone()));
        }
        out
    }
}
