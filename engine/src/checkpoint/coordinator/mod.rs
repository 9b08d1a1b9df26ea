//! The coordinator (the seed's mnode role) as a pure state machine: it schedules checkpoints,
//! allocates ids, collects reports, commits, fails and resets, and chooses the restore point.
//! Like the task machine it takes inputs and returns actions; the caller executes the actions in
//! order; the completions of its writes (`PersistIds`, `WriteCommit`) come back as inputs.
//!
//! Invariants:
//! - Ids and transaction ids only grow, and are reserved durably before use, so a restarted
//!   coordinator never reuses either. They are reserved in blocks of [`ID_BLOCK`] (`PersistIds`
//!   names the first id and transaction past the block); a checkpoint that needs a new block
//!   starts only once `IdsPersisted` confirms it, and does not start when the write fails or does
//!   not answer. A restart skips the rest of the block.
//! - At most one checkpoint is in flight.
//! - Nothing commits without a successful report from every task of the stream, each matching
//!   the checkpoint's id and transaction; the commit record is written durably (`WriteCommit`,
//!   confirmed by `CommitDurable`) before any task hears of the commit.
//! - A failed checkpoint resets every task; the next one goes ahead after the pause.
//!
//! The restore point at start (the record's, or the consensus) is in `restart.rs`; going back to
//! an older commit when a task cannot restore it, in `fallback.rs`.

mod fallback;
mod interface;
mod reserve;
mod restart;

use std::collections::{BTreeMap, BTreeSet};

pub use interface::*;
use weir_wire::msg::{RestoreBasis, TriggerKind};
use weir_wire::{CheckpointId, NodeId, TaskId, TransId, Version};

use super::CheckpointFailure;
use super::task::{Report, Role, SourceAnswer};

#[derive(Clone, Debug)]
struct Flight {
    id: CheckpointId,
    trans: TransId,
    started: u64,
    savepoint: bool,
    reports: BTreeMap<TaskId, Report>,
    /// The record being written, once every report is in, and since when.
    committing: Option<CommitRecord>,
    committing_since: u64,
}

impl Flight {
    /// The `Finished` action of this checkpoint, ending at `now`, with every report's statistics.
    fn finished(self, now: u64, outcome: Result<(), CheckpointFailure>) -> CoordAction {
        CoordAction::Finished {
            id: self.id,
            started_at: self.started,
            duration_ms: now - self.started,
            outcome,
            savepoint: self.savepoint,
            tasks: self.reports.into_iter().map(|(t, r)| (t, r.stats)).collect(),
        }
    }
}

#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for `Start`.
    Down,
    /// Restarting without a commit record: collecting consensus until `deadline`, and the
    /// requests to answer.
    Consensus { deadline: u64, latest: BTreeMap<TaskId, Option<CheckpointId>>, asking: BTreeMap<TaskId, u64> },
    /// The consensus chose `record`'s checkpoint; its commit record is written before any task
    /// hears of it, so a coordinator that restarts meanwhile chooses the same point (tasks
    /// restored already do not ask again). Written again from `retry_at` until it is durable.
    /// A fallback record is written the same way; with `halt`, the stream halts once it is
    /// durable instead of answering (some tasks cannot go back with the others). The record's
    /// id is reserved durably first (`reserved`): a write of an earlier coordinator that lands
    /// late cannot be under the same key, nor can a later coordinator choose that id again.
    Recording {
        record: CommitRecord,
        retry_at: u64,
        asking: BTreeMap<TaskId, u64>,
        halt: Option<String>,
        reserved: bool,
    },
    /// A task cannot restore the chosen point `from`: collecting, until every task asked or
    /// `deadline`, the older commits each task's node can restore (none: a task that asks
    /// without finding damage, whose node checked nothing older), and the requests.
    FallingBack {
        from: CheckpointId,
        deadline: u64,
        can: BTreeMap<TaskId, Option<BTreeSet<CheckpointId>>>,
        asking: BTreeMap<TaskId, u64>,
        reasons: BTreeMap<TaskId, String>,
    },
    /// Halted: nothing more happens until a restart.
    Halted,
    /// Running.
    Running,
}

/// The coordinator of one stream.
#[derive(Clone, Debug)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    phase: Phase,
    now: u64,
    next_id: CheckpointId,
    next_trans: TransId,
    /// Ids and transactions below these are reserved durably.
    reserved: IdRecord,
    /// The highest id record a `PersistIds` asked for ([`Self::persist`]).
    asked: IdRecord,
    /// Since when a `PersistIds` is waiting for its answer (no checkpoint starts meanwhile).
    reserving: Option<u64>,
    /// A commit whose write did not answer in time: it may still become visible, so a late
    /// `CommitDurable` makes it the last commit.
    unknown: Option<CommitRecord>,
    flight: Option<Flight>,
    /// When the last checkpoint started / ended.
    last_start: Option<u64>,
    last_end: Option<u64>,
    earliest_first: u64,
    manual: bool,
    /// A savepoint is asked for: every checkpoint is one until one commits.
    savepoint: bool,
    last_commit: Option<CommitRecord>,
    consecutive_failures: u32,
    healthy: bool,
    /// Nodes of the stream known to be down: a checkpoint due meanwhile fails at once instead of
    /// waiting for its timeout.
    down: BTreeSet<NodeId>,
    /// The restore point chosen at start (checkpoint, whether committed), once chosen: a task that
    /// asks again (its answer was lost, or it came after the wait) gets the same one.
    restore_point: Option<(Option<CheckpointId>, RestoreBasis)>,
    /// Started with neither a commit record nor a reserved id: no checkpoint ever began.
    new_stream: bool,
}

impl Coordinator {
    /// A coordinator waiting for `Start`.
    pub fn new(cfg: CoordinatorConfig) -> Self {
        Self {
            cfg,
            phase: Phase::Down,
            now: 0,
            next_id: CheckpointId(1),
            next_trans: TransId(1),
            reserved: IdRecord::default(),
            asked: IdRecord::default(),
            reserving: None,
            unknown: None,
            flight: None,
            last_start: None,
            last_end: None,
            earliest_first: 0,
            manual: false,
            savepoint: false,
            last_commit: None,
            consecutive_failures: 0,
            healthy: true,
            down: BTreeSet::new(),
            restore_point: None,
            new_stream: false,
        }
    }

    /// The last commit.
    pub fn last_commit(&self) -> Option<&CommitRecord> {
        self.last_commit.as_ref()
    }

    /// The checkpoint in flight.
    pub fn in_flight(&self) -> Option<CheckpointId> {
        self.flight.as_ref().map(|f| f.id)
    }

    /// Whether the stream is within its tolerable failures.
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    fn node_of(&self, t: TaskId) -> NodeId {
        self.cfg.tasks.iter().find(|(id, _, _)| *id == t).map_or(NodeId(0), |(_, n, _)| *n)
    }

    /// Handles one input.
    pub fn handle(&mut self, input: CoordInput) -> Vec<CoordAction> {
        match input {
            CoordInput::Start { now, ids, last_commit } => self.restart(now, ids, last_commit),
            CoordInput::Consensus { task, latest, request } => self.consensus(task, latest, request),
            CoordInput::CannotRestore { task, id, restorable, reason, request } => {
                self.cannot_restore(task, id, restorable, reason, request)
            }
            CoordInput::Tick { now } => self.tick(now),
            CoordInput::Trigger { savepoint } => {
                self.manual = true;
                self.savepoint |= savepoint;
                self.tick(self.now)
            }
            CoordInput::Report { task, report } => self.report(task, report),
            CoordInput::IdsPersisted(r) => self.ids_persisted(r),
            CoordInput::IdsFailed { reason } => {
                if let Phase::Recording { retry_at, reserved: false, .. } = &mut self.phase {
                    // The record's reservation is tried again shortly, as its write is.
                    *retry_at = (*retry_at).min(self.now + 100);
                }
                if self.reserving.take().is_none() || !matches!(self.phase, Phase::Running) {
                    return Vec::new();
                }
                self.ids_failed(reason)
            }
            CoordInput::SourceRsp { task, id, trans, answer } => {
                let refused = !matches!(answer, SourceAnswer::Done(_));
                if refused
                    && self.flight.as_ref().is_some_and(|f| f.id == id && f.trans == trans && f.committing.is_none())
                {
                    return self.fail(CheckpointFailure::SourceRefused { task, id, answer: format!("{answer:?}") });
                }
                Vec::new()
            }
            CoordInput::CommitDurable { id } => {
                if matches!(&self.phase, Phase::Recording { record, .. } if record.id == id) {
                    return self.consensus_recorded();
                }
                if let Some(r) = self.unknown.take_if(|r| r.id == id) {
                    // A commit given up as unknown turned out durable: it is a restore point.
                    if self.last_commit.as_ref().is_none_or(|c| c.id < id) {
                        self.last_commit = Some(r);
                    }
                    return Vec::new();
                }
                self.commit_durable(id)
            }
            CoordInput::CommitFailed { id, reason } => {
                if let Phase::Recording { record, retry_at, .. } = &mut self.phase
                    && record.id == id
                {
                    // Tried again shortly (the tick writes it once more).
                    *retry_at = (*retry_at).min(self.now + 100);
                    let _ = reason;
                    return Vec::new();
                }
                if self.flight.as_ref().is_some_and(|f| f.id == id && f.committing.is_some()) {
                    return self.fail(CheckpointFailure::CommitWrite { reason });
                }
                Vec::new()
            }
            CoordInput::NodeUp { node } => {
                self.down.remove(&node);
                Vec::new()
            }
            CoordInput::NodeLost { node } => {
                if !self.cfg.tasks.iter().any(|(_, n, _)| *n == node) {
                    return Vec::new(); // a client, not a member of this stream
                }
                self.down.insert(node);
                if self.flight.is_some() {
                    // A commit already being written stands: every report is in.
                    if self.flight.as_ref().is_none_or(|f| f.committing.is_none()) {
                        return self.fail(CheckpointFailure::NodeLost { node });
                    }
                }
                Vec::new()
            }
        }
    }

    fn tick(&mut self, now: u64) -> Vec<CoordAction> {
        self.now = self.now.max(now);
        let now = self.now;
        match &self.phase {
            Phase::Down | Phase::Halted => return Vec::new(),
            Phase::FallingBack { deadline, .. } => {
                if now >= *deadline {
                    return self.finish_fallback();
                }
                return Vec::new();
            }
            Phase::Consensus { deadline, .. } => {
                if now >= *deadline {
                    return self.finish_consensus();
                }
                return Vec::new();
            }
            Phase::Recording { retry_at, .. } => {
                if now < *retry_at {
                    return Vec::new();
                }
                if let Phase::Recording { retry_at, .. } = &mut self.phase {
                    *retry_at = now + self.cfg.store_timeout_ms;
                }
                return self.write_record();
            }
            Phase::Running => {}
        }
        if let Some(f) = &self.flight {
            if f.committing.is_none() && now.saturating_sub(f.started) >= self.cfg.timeout_ms {
                return self.fail(CheckpointFailure::TimedOut { after_ms: now - f.started });
            }
            if f.committing.is_some() && now.saturating_sub(f.committing_since) >= self.cfg.store_timeout_ms {
                // The record may still appear: it stays a possible restore point, and the tasks
                // keep every snapshot it names (a reset deletes none).
                self.unknown = f.committing.clone();
                return self.fail(CheckpointFailure::CommitUnanswered { after_ms: self.cfg.store_timeout_ms });
            }
            return Vec::new();
        }
        if let Some(since) = self.reserving {
            if now.saturating_sub(since) >= self.cfg.store_timeout_ms {
                self.reserving = None;
                return self.ids_failed(format!("no answer within {} ms", self.cfg.store_timeout_ms));
            }
            return Vec::new();
        }
        let paused = self.last_end.is_none_or(|e| now >= e + self.cfg.min_pause_ms);
        let due = self.manual
            || (self.cfg.interval_ms > 0
                && now >= self.earliest_first
                && self.last_start.is_none_or(|s| now >= s + self.cfg.interval_ms));
        if !(paused && due) {
            return Vec::new();
        }
        if !self.ids_reserved() {
            // Reserve first; the checkpoint starts when the record is durable.
            self.reserving = Some(now);
            let next = IdRecord {
                next_id: CheckpointId(self.next_id.0 + ID_BLOCK),
                next_trans: TransId(self.next_trans.0 + ID_BLOCK),
            };
            return vec![self.persist(next)];
        }
        self.start(now)
    }

    /// No checkpoint could start: it counts as a failure for the stream's health, and the next
    /// attempt waits for the minimum pause.
    fn ids_failed(&mut self, reason: String) -> Vec<CoordAction> {
        self.last_end = Some(self.now);
        self.consecutive_failures += 1;
        let mut out = vec![CoordAction::IdsNotDurable { reason }];
        out.extend(self.health_after_failure());
        out
    }

    fn health_after_failure(&mut self) -> Option<CoordAction> {
        let healthy = self.consecutive_failures <= self.cfg.tolerable_failures;
        if healthy != self.healthy || !healthy {
            self.healthy = healthy;
            return Some(CoordAction::Health { healthy, consecutive_failures: self.consecutive_failures });
        }
        None
    }

    fn start(&mut self, now: u64) -> Vec<CoordAction> {
        debug_assert!(self.ids_reserved());
        let kind = match (std::mem::take(&mut self.manual), self.savepoint) {
            (_, true) => TriggerKind::Savepoint,
            (true, false) => TriggerKind::Manual,
            (false, false) => TriggerKind::Periodic,
        };
        let savepoint = self.savepoint;
        let id = self.next_id;
        let trans = self.next_trans;
        self.next_id = id.next();
        self.next_trans = TransId(trans.0 + 1);
        self.last_start = Some(now);
        self.flight = Some(Flight {
            id,
            trans,
            started: now,
            savepoint,
            reports: BTreeMap::new(),
            committing: None,
            committing_since: 0,
        });
        let mut out = Vec::new();
        if let Some(n) = self.down.first() {
            out.extend(self.fail(CheckpointFailure::NodeDown { node: *n }));
            return out;
        }
        let expire_at = now + self.cfg.timeout_ms;
        for (task, node, role) in &self.cfg.tasks {
            if *role == Role::Source {
                out.push(CoordAction::SendSourceReq {
                    task: *task,
                    node: *node,
                    id,
                    trans,
                    kind: kind.clone(),
                    expire_at,
                });
            }
        }
        out
    }

    fn report(&mut self, task: TaskId, report: Report) -> Vec<CoordAction> {
        let reject = |reason: String| vec![CoordAction::RejectedReport { task, reason }];
        if !self.cfg.tasks.iter().any(|(t, _, _)| *t == task) {
            return reject(format!("{task} is not a task of stream {}", self.cfg.stream));
        }
        if self.flight.as_ref().is_none_or(|f| report.id != f.id || report.trans != f.trans) {
            let mut out = reject(match &self.flight {
                Some(f) => format!(
                    "report for {} {} does not match the checkpoint in flight {} {}",
                    report.id, report.trans, f.id, f.trans
                ),
                None => format!("no checkpoint in flight (report for {})", report.id),
            });
            out.extend(self.settle(task, &report));
            return out;
        }
        let Some(f) = self.flight.as_mut() else { return Vec::new() };
        if let Err(failure) = &report.outcome {
            return self.fail(CheckpointFailure::Task { task, failure: failure.clone() });
        }
        if f.committing.is_some() || f.reports.contains_key(&task) {
            return Vec::new(); // a resent report
        }
        f.reports.insert(task, report);
        if f.reports.len() < self.cfg.tasks.len() {
            return Vec::new();
        }
        let shape = self.shape();
        let Some(f) = self.flight.as_mut() else { return Vec::new() };
        let sources: BTreeSet<TaskId> =
            self.cfg.tasks.iter().filter(|(_, _, r)| *r == Role::Source).map(|(t, _, _)| *t).collect();
        let record = CommitRecord {
            id: f.id,
            kind: RecordKind::Commit(f.trans),
            versions: f
                .reports
                .iter()
                .filter(|(t, _)| sources.contains(t))
                .map(|(t, r)| (*t, r.outcome.clone().unwrap_or(Version(0))))
                .collect(),
            manifests: f.reports.iter().map(|(t, r)| (*t, r.manifest_crc)).collect(),
            ts: self.now,
            // Only a savepoint restores at other parallelism: other commits stay in the format an
            // older Weir reads.
            shape: shape.filter(|_| f.savepoint),
            savepoint: f.savepoint,
        };
        f.committing = Some(record.clone());
        f.committing_since = self.now;
        vec![CoordAction::WriteCommit(record)]
    }

    /// The aggs and sinks of the stream (`None` without aggs: a stream of another shape).
    fn shape(&self) -> Option<Shape> {
        let of = |role: Role| self.cfg.tasks.iter().filter(move |(_, _, r)| *r == role).map(|(t, _, _)| *t);
        let first_agg = of(Role::Agg).min()?;
        Some(Shape { first_agg, aggs: of(Role::Agg).count() as u32, sinks: of(Role::Sink).count() as u32 })
    }

    /// A task still reports a checkpoint that ended here: its update or reset was lost (it
    /// resends its report until one arrives). Tell it again how the checkpoint ended, so it does
    /// not stay in it until the next checkpoint's barrier reaches it.
    fn settle(&self, task: TaskId, report: &Report) -> Option<CoordAction> {
        if report.id >= self.next_id || self.flight.as_ref().is_some_and(|f| f.id == report.id) {
            return None; // not allocated here (a report from before a restart), or still running
        }
        let node = self.node_of(task);
        // The report's checkpoint committed, and under which transaction: a consensus point
        // committed too (every task had it), but its record has none of its own.
        let committed = self.last_commit.as_ref().and_then(|c| {
            let trans = match c.kind {
                RecordKind::Commit(t) if c.id == report.id => t,
                RecordKind::Consensus(to) if to == report.id => report.trans,
                _ => return None,
            };
            Some((c, trans))
        });
        match committed {
            Some((c, trans)) => Some(CoordAction::SendUpdate {
                task,
                node,
                id: report.id,
                trans,
                version: c.versions.get(&task).copied().unwrap_or(Version(0)),
                ts: c.ts,
            }),
            _ => Some(CoordAction::SendReset {
                task,
                node,
                failed: report.id,
                trans: report.trans,
                reason: "the checkpoint ended without this task's report".into(),
            }),
        }
    }

    fn commit_durable(&mut self, id: CheckpointId) -> Vec<CoordAction> {
        let Some(mut f) = self.flight.take_if(|f| f.id == id && f.committing.is_some()) else { return Vec::new() };
        let record = f.committing.take().expect("checked above");
        let (trans, ts, versions) = (f.trans, record.ts, record.versions.clone());
        self.savepoint &= !f.savepoint;
        self.last_commit = Some(record);
        self.last_end = Some(self.now);
        let mut out: Vec<CoordAction> = self
            .cfg
            .tasks
            .iter()
            .map(|(task, node, _)| CoordAction::SendUpdate {
                task: *task,
                node: *node,
                id,
                trans,
                version: versions.get(task).copied().unwrap_or(Version(0)),
                ts,
            })
            .collect();
        out.push(f.finished(self.now, Ok(())));
        if self.consecutive_failures > 0 || !self.healthy {
            self.consecutive_failures = 0;
            self.healthy = true;
            out.push(CoordAction::Health { healthy: true, consecutive_failures: 0 });
        }
        out
    }

    fn fail(&mut self, why: CheckpointFailure) -> Vec<CoordAction> {
        let Some(f) = self.flight.take() else { return Vec::new() };
        self.last_end = Some(self.now);
        self.consecutive_failures += 1;
        let mut out: Vec<CoordAction> = self
            .cfg
            .tasks
            .iter()
            .map(|(task, node, _)| CoordAction::SendReset {
                task: *task,
                node: *node,
                failed: f.id,
                trans: f.trans,
                reason: why.to_string(),
            })
            .collect();
        out.push(f.finished(self.now, Err(why)));
        out.extend(self.health_after_failure());
        out
    }
}
