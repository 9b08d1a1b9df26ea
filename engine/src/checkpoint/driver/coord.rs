//! [`CoordDriver`]: runs the [`Coordinator`] through [`CoordEffects`]. The engine runs it on the
//! coordinator thread; the simulator runs the same code.
//!
//! Invariants:
//! - Store writes (`PersistIds`, `WriteCommit`) are started here and complete later as inputs
//!   (`IdsPersisted`/`IdsFailed`, `CommitDurable`/`CommitFailed`), so a store that does not answer
//!   never blocks the coordinator: its timers keep running, the checkpoint fails on time, and
//!   manual triggers and status requests are still served.
//! - Every finished checkpoint yields one [`CheckpointStats`], with its duration measured from the
//!   id reservation (when it needed one) to the commit or failure.

use std::collections::HashMap;

use weir_wire::msg::{CheckpointOutcome, CheckpointStats, RestoreBasis, TaskCheckpointEntry, TaskCheckpointStats};
use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use super::Clock;
use crate::checkpoint::{CommitRecord, CoordAction, CoordInput, Coordinator, IdRecord, TaskInput};

/// What the coordinator's driver does outside the machine.
pub trait CoordEffects: Clock {
    /// A protocol message to a task.
    fn send_task(&mut self, to: TaskId, input: TaskInput);
    /// The restore point for a starting task (`version`: its offset in the commit record, when
    /// the point is a commit).
    fn send_restore(
        &mut self,
        to: TaskId,
        id: Option<CheckpointId>,
        version: Option<Version>,
        basis: RestoreBasis,
        request: u64,
    );
    /// Starts writing the id record; its completion comes back as `IdsPersisted` or `IdsFailed`.
    fn persist_ids(&mut self, ids: IdRecord);
    /// Starts writing the commit record; its completion comes back as `CommitDurable` or
    /// `CommitFailed`.
    fn write_commit(&mut self, record: CommitRecord);
    /// A checkpoint ended.
    fn finished(&mut self, stats: CheckpointStats);
    /// No checkpoint could start: its ids could not be reserved (`reason`).
    fn not_started(&mut self, _reason: &str) {}
    /// The stream's health changed.
    fn health(&mut self, _healthy: bool, _consecutive_failures: u32) {}
    /// The stream cannot go on (`CoordAction::Halt`): stop it with `reason`.
    fn halt(&mut self, reason: String);
}

/// The coordinator's driver.
#[derive(Debug)]
pub struct CoordDriver {
    coord: Coordinator,
    stream: StreamId,
    /// When each checkpoint in flight started (monotonic µs).
    started: HashMap<CheckpointId, u64>,
    /// When the id reservation the next checkpoint waits for started.
    reserving_since: Option<u64>,
    /// The restore point logged last.
    announced: Option<Option<CheckpointId>>,
}

impl CoordDriver {
    /// A driver of `coord` (feed `Start` first).
    pub fn new(coord: Coordinator, stream: StreamId) -> Self {
        Self { coord, stream, started: HashMap::new(), reserving_since: None, announced: None }
    }

    /// The machine.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coord
    }

    /// Feeds `input` and carries out the actions.
    pub fn handle<E: CoordEffects>(&mut self, fx: &mut E, input: CoordInput) {
        let actions = self.coord.handle(input);
        for a in actions {
            self.apply(fx, a);
        }
    }

    fn apply<E: CoordEffects>(&mut self, fx: &mut E, a: CoordAction) {
        let stream = self.stream;
        match a {
            CoordAction::PersistIds(ids) => {
                // The checkpoint that needs these ids starts now: its duration includes the write.
                self.reserving_since.get_or_insert(fx.mono_us());
                fx.persist_ids(ids);
            }
            CoordAction::IdsNotDurable { reason } => {
                self.reserving_since = None;
                tracing::warn!(stream = %stream, %reason, "checkpoint ids could not be reserved: no checkpoint started");
                fx.not_started(&reason);
            }
            CoordAction::SendSourceReq { task, id, trans, kind, expire_at, .. } => {
                let t0 = self.reserving_since.take().unwrap_or_else(|| fx.mono_us());
                self.started.entry(id).or_insert(t0);
                fx.send_task(task, TaskInput::SourceReq { id, trans, kind, expire_at });
            }
            CoordAction::WriteCommit(record) => {
                // A record's own reservation (a restart's choice) is no checkpoint's start.
                self.reserving_since = None;
                fx.write_commit(record)
            }
            CoordAction::SendUpdate { task, id, trans, version, ts, .. } => {
                fx.send_task(task, TaskInput::Update { id, trans, version, ts })
            }
            CoordAction::SendReset { task, failed, trans, reason, .. } => {
                fx.send_task(task, TaskInput::Reset { failed, trans, reason })
            }
            CoordAction::SendRestore { task, id, version, basis, request, .. } => {
                if basis != RestoreBasis::Committed && self.announced != Some(id) {
                    self.announced = Some(id);
                    tracing::info!(stream = %stream, checkpoint = ?id, ?basis, "restore point chosen");
                }
                fx.send_restore(task, id, version, basis, request)
            }
            CoordAction::FallingBack { from, to: Some(to), reason } => tracing::warn!(
                stream = %stream, %from, %to, %reason,
                "checkpoint {from} cannot be restored; the whole stream goes back to checkpoint {to}"
            ),
            CoordAction::FallingBack { from, to: None, reason } => tracing::error!(
                stream = %stream, %from, %reason,
                "checkpoint {from} cannot be restored, and no older commit can"
            ),
            CoordAction::Halt { reason } => {
                tracing::error!(stream = %stream, %reason, "the stream halts");
                fx.halt(reason);
            }
            CoordAction::Finished { id, started_at, outcome, tasks, savepoint, .. } => {
                // Not started: it failed before asking any source (a node was down).
                let duration_us = self.started.remove(&id).map_or(0, |t0| fx.mono_us().saturating_sub(t0));
                let mut c = checkpoint_stats(stream, id, started_at, duration_us, &outcome, tasks);
                c.savepoint = savepoint;
                log_finished(&c);
                fx.finished(c);
            }
            CoordAction::Health { healthy, consecutive_failures } => {
                tracing::warn!(stream = %stream, healthy, consecutive_failures, "stream health changed");
                fx.health(healthy, consecutive_failures);
            }
            CoordAction::RejectedReport { task, reason } => tracing::warn!(%task, %reason, "report rejected"),
        }
    }
}

/// The statistics of a finished checkpoint.
fn checkpoint_stats(
    stream: StreamId,
    id: CheckpointId,
    started_at_ms: u64,
    duration_us: u64,
    outcome: &Result<(), crate::checkpoint::CheckpointFailure>,
    tasks: Vec<(TaskId, TaskCheckpointStats)>,
) -> CheckpointStats {
    CheckpointStats {
        stream,
        checkpoint: id,
        started_at_ms,
        duration_us,
        outcome: match outcome {
            Ok(()) => CheckpointOutcome::Committed,
            Err(reason) => CheckpointOutcome::Failed { reason: reason.to_string() },
        },
        upload_bytes: tasks.iter().map(|(_, s)| s.upload_bytes).sum(),
        max_align_us: tasks.iter().map(|(_, s)| s.align_us).max().unwrap_or(0),
        max_snapshot_us: tasks.iter().map(|(_, s)| s.snapshot_us).max().unwrap_or(0),
        tasks: tasks.into_iter().map(|(task, stats)| TaskCheckpointEntry { task, stats }).collect(),
        savepoint: false,
    }
}

fn log_finished(c: &CheckpointStats) {
    match &c.outcome {
        CheckpointOutcome::Committed => tracing::info!(
            stream = %c.stream,
            checkpoint = %c.checkpoint,
            us = c.duration_us,
            upload_bytes = c.upload_bytes,
            max_align_us = c.max_align_us,
            max_snapshot_us = c.max_snapshot_us,
            "checkpoint committed"
        ),
        CheckpointOutcome::Failed { reason } => {
            tracing::warn!(stream = %c.stream, checkpoint = %c.checkpoint, us = c.duration_us, %reason, "checkpoint failed")
        }
        CheckpointOutcome::InProgress => {}
    }
    for e in &c.tasks {
        let s = &e.stats;
        tracing::debug!(
            checkpoint = %c.checkpoint,
            task = %e.task,
            trigger_at_us = s.trigger_at_us,
            align_us = s.align_us,
            snapshot_us = s.snapshot_us,
            upload_us = s.upload_us,
            upload_bytes = s.upload_bytes,
            files = s.files,
            reported_at_us = s.reported_at_us,
            "task checkpoint statistics"
        );
    }
}
