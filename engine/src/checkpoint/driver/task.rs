//! [`TaskDriver`]: runs one task's [`TaskMachine`] on the task, through a [`TaskPort`] (the task)
//! and [`TaskEffects`] (everything else). The engine drives it on the task's worker thread; the
//! simulator drives the same code on model tasks.
//!
//! Invariants:
//! - Actions are carried out in the order the machine returns them, completions (the snapshot
//!   taken, the barrier dispatched) fed back before the next action.
//! - While the machine is `Uninit` the driver tells its caller that no data may move
//!   ([`TaskDriver::poll`] returns `false`) and asks the coordinator for the restore point, again
//!   every 500 ms until answered.
//! - A trigger response reaches the machine with the channel's position on this side.

use weir_wire::msg::RestoreBasis;
use weir_wire::{CheckpointId, Seq, TaskId, TransId, Version};

use super::Clock;
use crate::checkpoint::{CheckpointError, CoordInput, Role, TaskAction, TaskInput, TaskMachine, TaskState};

/// Something the task saw in its data that the protocol must hear of, returned by its poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The barrier of `id` arrived from upstream `from` (the task stopped right behind it).
    Barrier {
        /// Upstream.
        from: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
    },
    /// Upstream `from` ended its stream.
    UpstreamEnded {
        /// Upstream.
        from: TaskId,
    },
    /// A source's output drained up to the trigger it queued; `offset` rows came before it.
    ReachedTrigger {
        /// Checkpoint.
        id: CheckpointId,
        /// Rows emitted before the trigger.
        offset: Version,
    },
}

/// What one task restores: a checkpoint, with what the commit record says of the task when there
/// is one (a consensus point has no record: the manifest, checked by its own checksum, says the
/// offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestorePoint {
    /// Checkpoint.
    pub id: CheckpointId,
    /// The task's offset in the commit record.
    pub version: Option<Version>,
    /// The checksum of the task's manifest in the commit record.
    pub manifest_crc: Option<u32>,
}

/// A snapshot for the uploader: the state captured at the barrier, to write and ship off the
/// data path. Its completion comes back as `TaskInput::Uploaded`.
#[derive(Debug)]
pub struct UploadRequest<C> {
    /// Checkpoint.
    pub id: CheckpointId,
    /// The source offset in it.
    pub version: Version,
    /// The captured state.
    pub captured: C,
}

/// What a port did with an input whose barrier came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Held back until the snapshot: nothing after the barrier is taken before it (the
    /// pipeline behind that input waits).
    Closed,
    /// Taken on: the port recorded where the barrier cut the input, and its capture is the state
    /// at each input's cut, however much it took past one. The port owes that: what rows past a
    /// cut change in the state is left out of the capture, and nothing they cause goes
    /// downstream before the barrier (an agg with replay snapshots: their windows are rebuilt
    /// by a restore, and their progress waits, so no window fires on them).
    Cut,
}

/// The task a driver runs on.
pub trait TaskPort {
    /// The state copied at a barrier.
    type Captured;
    /// Input `i`'s barrier of checkpoint `id` came: holds the input back until the snapshot
    /// (aligned), or records where the barrier cut it and keeps taking it ([`Hold::Cut`]).
    fn close_input(&mut self, i: usize, id: CheckpointId) -> Hold;
    /// Takes input `i` again.
    fn reopen_input(&mut self, i: usize);
    /// Takes every input again.
    fn reopen_all_inputs(&mut self);
    /// A source: put the trigger of `id` behind the data already emitted; the task's poll
    /// returns [`Signal::ReachedTrigger`] when it gets there.
    fn queue_source_trigger(&mut self, id: CheckpointId, savepoint: bool);
    /// Copies the operator state for checkpoint `id` (the synchronous part of a snapshot).
    fn capture(&mut self, id: CheckpointId) -> Result<Self::Captured, CheckpointError>;
    /// Puts the barrier on every output; returns each downstream with the barrier's sequence
    /// number on that channel.
    fn forward_trigger(&mut self, id: CheckpointId, trans: TransId) -> Result<Vec<(TaskId, Seq)>, CheckpointError>;
    /// The next sequence number expected on the channel from upstream `from`.
    fn next_seq(&self, from: TaskId) -> Option<Seq>;
    /// Restores the state of `point` (none: start empty) into the task; returns the source offset
    /// to resume from.
    fn restore(&mut self, point: Option<RestorePoint>) -> Result<Version, CheckpointError>;
}

/// What a task's driver does outside the task.
pub trait TaskEffects<C>: Clock {
    /// A protocol message to another task (lost messages are resent or time out).
    fn send_task(&mut self, to: TaskId, input: TaskInput);
    /// A message to the coordinator: reports, source answers, consensus requests.
    fn send_coord(&mut self, input: CoordInput);
    /// Writes and ships a snapshot in the background.
    fn upload(&mut self, job: UploadRequest<C>);
    /// The committed id and offset in the task's meta record (`None`: no record). An unreadable
    /// record is an error, never "nothing".
    fn read_committed(&mut self) -> Result<Option<(CheckpointId, Version)>, CheckpointError>;
    /// Records the committed id durably (atomically: the old record or the new one).
    fn persist_committed(&mut self, id: CheckpointId, version: Version, ts: u64) -> Result<(), CheckpointError>;
    /// Deletes local snapshots older than `id`.
    fn delete_snapshots_before(&mut self, id: CheckpointId);
    /// Deletes the local snapshot of `id` (a checkpoint that failed here).
    fn drop_snapshot(&mut self, id: CheckpointId);
    /// The task's pause for checkpoint `id` ended: alignment plus synchronous snapshot (µs).
    fn paused(&mut self, _id: CheckpointId, _pause_us: u64) {}
    /// The task started or stopped aligning.
    fn aligning(&mut self, _on: bool) {}
    /// The task restored (statistics and logs).
    fn restored(&mut self, _basis: RestoreBasis, _id: Option<CheckpointId>) {}
}

/// The clock readings of a task's part of one checkpoint (the machine has no clock).
#[derive(Clone, Copy, Debug)]
struct TaskClock {
    id: CheckpointId,
    first_us: u64,
    first_at_us: u64,
    align_us: u64,
    snapshot_us: u64,
}

/// How often the machine gets a tick.
const TICK_US: u64 = 100_000;
/// How often a task waiting for its restore point asks again.
const CONSENSUS_RETRY_US: u64 = 500_000;
/// A warning per this much waiting for the restore point.
const WAIT_WARNING_US: u64 = 10_000_000;

/// One task's checkpoint driver.
#[derive(Debug)]
pub struct TaskDriver<C> {
    machine: TaskMachine,
    /// State captured at the barrier, until the machine asks for its upload.
    captured: Option<(C, Version)>,
    /// Clock readings of the newest checkpoint this task saw the start of.
    clock: Option<TaskClock>,
    aligning: bool,
    /// An input of the checkpoint under way is held back ([`Hold::Closed`]); cleared when the
    /// machine stops aligning.
    held: bool,
    last_tick_us: Option<u64>,
    /// While `Uninit`: when the task first and last asked for its restore point, and the
    /// warnings so far.
    waiting_since_us: Option<u64>,
    asked_us: Option<u64>,
    warned: u64,
    /// This start of the task: its restore requests carry it, and it takes only answers to them.
    start: u64,
    /// A restore point this task cannot restore (its files damaged on its node and in the
    /// store), the older commits its node can, and why: its requests ask to go back.
    cannot: Option<(CheckpointId, Vec<CheckpointId>, String)>,
}

impl<C> TaskDriver<C> {
    /// A driver of `machine` (normally `Uninit`); `start` tells this start of the task from
    /// every other.
    pub fn new(machine: TaskMachine, start: u64) -> Self {
        Self {
            machine,
            captured: None,
            clock: None,
            aligning: false,
            held: false,
            last_tick_us: None,
            waiting_since_us: None,
            asked_us: None,
            warned: 0,
            start,
            cannot: None,
        }
    }

    /// The task (with every other task of its node) cannot restore `id`, the point the commit
    /// record names; its node can restore the older commits `restorable`. It stays `Uninit`
    /// and asks the coordinator to take the stream back.
    pub fn cannot_restore(&mut self, id: CheckpointId, restorable: Vec<CheckpointId>, reason: String) {
        self.cannot = Some((id, restorable, reason));
    }

    /// The machine.
    pub fn machine(&self) -> &TaskMachine {
        &self.machine
    }

    /// The task.
    pub fn task(&self) -> TaskId {
        self.machine.setup().task
    }

    /// Whether the task still waits for its restore point (no data may move).
    pub fn uninit(&self) -> bool {
        self.machine.state() == TaskState::Uninit
    }

    /// Whether the task is between a checkpoint's start and its snapshot with something held
    /// back: a source before its trigger, an agg with a closed input (an agg whose inputs are
    /// all [`Hold::Cut`] holds nothing while it waits for its last barrier).
    pub fn aligning(&self) -> bool {
        self.aligning
    }

    /// A protocol message or completion for the machine.
    pub fn handle<P, E>(&mut self, port: &mut P, fx: &mut E, input: TaskInput) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        let input = match input {
            TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, .. } => {
                TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, next_seq: port.next_seq(from) }
            }
            other => other,
        };
        self.feed(port, fx, input)
    }

    /// What the task's poll saw.
    pub fn signal<P, E>(&mut self, port: &mut P, fx: &mut E, signal: Signal) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        match signal {
            Signal::Barrier { from, id, trans } => {
                if self.clock.is_none_or(|c| c.id < id) {
                    self.clock = Some(Self::clock_start(fx, id));
                }
                self.feed(port, fx, TaskInput::Trigger { from, id, trans })
            }
            Signal::UpstreamEnded { from } => self.feed(port, fx, TaskInput::UpstreamEnded { from }),
            Signal::ReachedTrigger { id, offset } => {
                self.clock = Some(Self::clock_start(fx, id));
                self.feed(port, fx, TaskInput::SourceReachedTrigger { id, offset })
            }
        }
    }

    /// Before the task's data work: while `Uninit`, asks for the restore point and returns `false`
    /// (no data may move); otherwise ticks the machine every 100 ms and returns `true`.
    pub fn poll<P, E>(&mut self, port: &mut P, fx: &mut E) -> Result<bool, CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        if self.uninit() {
            self.ask_restore(fx)?;
            return Ok(false);
        }
        let now = fx.mono_us();
        if self.last_tick_us.is_none_or(|t| now.saturating_sub(t) >= TICK_US) {
            self.last_tick_us = Some(now);
            let ms = fx.now_ms();
            self.feed(port, fx, TaskInput::Tick { now: ms })?;
        }
        Ok(true)
    }

    /// Restores `point` (none: a start from the beginning) and makes the task ready: the commit
    /// record's point before the workers start (`request` none), or the coordinator's answer to
    /// `request`. A task restored already (the answer came twice), or whose request this does not
    /// answer (an answer to an earlier start), ignores it.
    pub fn restore<P, E>(
        &mut self,
        port: &mut P,
        fx: &mut E,
        point: Option<RestorePoint>,
        basis: RestoreBasis,
        request: Option<u64>,
    ) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        let checkpoint = point.map(|p| p.id);
        if !self.uninit() || request.is_some_and(|r| r != self.start) {
            tracing::debug!(task = %self.task(), ?checkpoint, "restore point for a task already restored, or for another start: ignored");
            return Ok(());
        }
        let version = match port.restore(point) {
            Ok(v) => v,
            // The coordinator's point is damaged for this task: ask it for an older one.
            Err(CheckpointError::Damaged { id, reason, restorable, .. }) if request.is_some() => {
                tracing::warn!(task = %self.task(), checkpoint = %id, %reason, "cannot restore the restore point; asking for an older one");
                self.cannot = Some((id, restorable, reason));
                self.asked_us = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.cannot = None;
        match checkpoint {
            Some(id) => tracing::info!(task = %self.task(), checkpoint = %id, ?basis, version = version.0, "restored"),
            None => tracing::debug!(task = %self.task(), "starting from the beginning"),
        }
        fx.restored(basis, checkpoint);
        self.feed(port, fx, TaskInput::Restored { id: checkpoint, version })
    }

    fn clock_start<E: Clock>(fx: &E, id: CheckpointId) -> TaskClock {
        TaskClock { id, first_us: fx.mono_us(), first_at_us: fx.wall_us(), align_us: 0, snapshot_us: 0 }
    }

    /// Asks the coordinator for the restore point with what this task last committed (the
    /// seed's consensus request); again every 500 ms until answered: the request, the answer or
    /// the connection to the coordinator's node may not be there yet.
    fn ask_restore<E: TaskEffects<C>>(&mut self, fx: &mut E) -> Result<(), CheckpointError> {
        let now = fx.mono_us();
        if self.asked_us.is_some_and(|t| now.saturating_sub(t) < CONSENSUS_RETRY_US) {
            return Ok(());
        }
        let since = *self.waiting_since_us.get_or_insert(now);
        self.asked_us = Some(now);
        let latest = fx.read_committed()?.map(|(id, _)| id);
        let waiting = now.saturating_sub(since);
        // Nothing flows until the coordinator answers: say so loudly if it takes long.
        if waiting >= WAIT_WARNING_US * (self.warned + 1) {
            self.warned += 1;
            tracing::warn!(task = %self.task(), waiting_s = waiting / 1_000_000, "still waiting for the restore point");
        } else {
            tracing::debug!(task = %self.task(), ?latest, "asking the coordinator for the restore point");
        }
        let (task, request) = (self.task(), self.start);
        match &self.cannot {
            Some((id, restorable, reason)) => fx.send_coord(CoordInput::CannotRestore {
                task,
                id: *id,
                restorable: restorable.clone(),
                reason: reason.clone(),
                request,
            }),
            None => fx.send_coord(CoordInput::Consensus { task, latest, request }),
        }
        Ok(())
    }

    /// Whether the checkpoint under way holds anything back: a source (its output, until its
    /// trigger), a task with a closed input.
    fn holding(&self) -> bool {
        self.held || self.machine.setup().role == Role::Source
    }

    fn feed<P, E>(&mut self, port: &mut P, fx: &mut E, input: TaskInput) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        let actions = self.machine.handle(input);
        let r = self.apply(port, fx, actions);
        let machine = self.machine.aligning();
        if !machine {
            self.held = false;
        }
        let now = machine && self.holding();
        if now != self.aligning {
            self.aligning = now;
            fx.aligning(now);
        }
        r
    }

    fn apply<P, E>(&mut self, port: &mut P, fx: &mut E, actions: Vec<TaskAction>) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        let me = self.task();
        for a in actions {
            match a {
                TaskAction::Discarded(why) => tracing::debug!(task = %me, ?why, "discarded"),
                TaskAction::QueueSourceTrigger { id, savepoint, .. } => port.queue_source_trigger(id, savepoint),
                TaskAction::CloseInput(i) => {
                    let TaskState::Checkpointing(id) = self.machine.state() else { continue };
                    if port.close_input(i, id) == Hold::Closed {
                        self.held = true;
                    }
                }
                TaskAction::ReopenInput(i) => port.reopen_input(i),
                TaskAction::ReopenAllInputs => port.reopen_all_inputs(),
                TaskAction::Snapshot { id, trans, offset } => self.snapshot(port, fx, id, trans, offset)?,
                TaskAction::InjectTrigger { from } => {
                    tracing::info!(task = %me, %from, "barrier retrieved and injected")
                }
                TaskAction::Upload { id } => match self.captured.take() {
                    Some((captured, version)) => fx.upload(UploadRequest { id, version, captured }),
                    None => {
                        let reason = "no state was captured for it".to_string();
                        let e = CheckpointError::Upload { task: me, id, reason, retryable: true };
                        self.feed(port, fx, TaskInput::Uploaded { id, result: Err(e) })?;
                    }
                },
                TaskAction::SendReady { to, id, trans, .. } => {
                    fx.send_task(to, TaskInput::Ready { from: me, id, trans })
                }
                TaskAction::SendReadyRsp { to, id } => fx.send_task(to, TaskInput::ReadyRsp { from: me, id }),
                TaskAction::SendRetrieveTrigger { to, id, .. } => {
                    fx.send_task(to, TaskInput::RetrieveTrigger { from: me, id })
                }
                TaskAction::SendTriggerRsp { to, id, trans, code, trigger_seq } => {
                    fx.send_task(to, TaskInput::TriggerRsp { from: me, id, trans, code, trigger_seq, next_seq: None })
                }
                TaskAction::SendSourceRsp { id, trans, answer } => {
                    fx.send_coord(CoordInput::SourceRsp { task: me, id, trans, answer })
                }
                TaskAction::SendReport(mut report) => {
                    if let Some(c) = self.clock.filter(|c| c.id == report.id) {
                        report.stats.trigger_at_us = c.first_at_us;
                        report.stats.align_us = c.align_us;
                        report.stats.snapshot_us = c.snapshot_us;
                    }
                    report.stats.reported_at_us = fx.wall_us();
                    fx.send_coord(CoordInput::Report { task: me, report });
                }
                TaskAction::PersistCommitted { id, version, ts } => fx.persist_committed(id, version, ts)?,
                TaskAction::DeleteSnapshotsBefore(id) => fx.delete_snapshots_before(id),
                TaskAction::DropSnapshot(id) => fx.drop_snapshot(id),
            }
        }
        Ok(())
    }

    /// Copies the state (the synchronous part: the pipeline waits only for this) and forwards the
    /// barrier; writing the copy, the local snapshot and the upload run on the uploader pool.
    fn snapshot<P, E>(
        &mut self,
        port: &mut P,
        fx: &mut E,
        id: CheckpointId,
        trans: TransId,
        offset: Version,
    ) -> Result<(), CheckpointError>
    where
        P: TaskPort<Captured = C>,
        E: TaskEffects<C>,
    {
        let t0 = fx.mono_us();
        let result = port.capture(id).and_then(|c| {
            self.captured = Some((c, offset));
            port.forward_trigger(id, trans)
        });
        let t1 = fx.mono_us();
        let holding = self.holding();
        if let Some(c) = self.clock.as_mut().filter(|c| c.id == id) {
            c.align_us = t0.saturating_sub(c.first_us);
            c.snapshot_us = t1.saturating_sub(t0);
            // The pause is what held the task's inputs: a task that holds none while it waits for
            // its last trigger (a sink, an agg that cut its inputs) pauses for its snapshot only.
            let held = if holding { c.align_us } else { 0 };
            fx.paused(id, held + c.snapshot_us);
        }
        let dispatched = match result {
            Ok(d) => d,
            Err(e) => {
                self.captured = None;
                return self.feed(port, fx, TaskInput::SnapshotTaken { id, result: Err(e) });
            }
        };
        self.feed(port, fx, TaskInput::SnapshotTaken { id, result: Ok(()) })?;
        for (to, seq) in dispatched {
            self.feed(port, fx, TaskInput::TriggerDispatched { to, seq })?;
        }
        Ok(())
    }
}
