//! The coordinator (the seed's mnode role) as a pure state machine: it schedules checkpoints,
//! allocates ids, collects reports, commits, fails and resets, and chooses the restore point.
//! Like the task machine it takes inputs and returns actions; the caller executes the actions in
//! order, and must make `PersistNextId` durable before executing anything after it.
//!
//! Invariants:
//! - Ids only grow, and are persisted before use, so a restarted coordinator never reuses one.
//!   They are reserved in blocks of [`ID_BLOCK`] (`PersistNextId` names the first id past the
//!   block), so a checkpoint normally starts without a write to the store; a restart skips the
//!   rest of the block.
//! - At most one checkpoint is in flight.
//! - Nothing commits without a successful report from every task of the stream, each matching
//!   the checkpoint's id and transaction; the commit record is written durably (`WriteCommit`,
//!   confirmed by `CommitDurable`) before any task hears of the commit.
//! - A failed checkpoint resets every task; the next one goes ahead after the pause.

use std::collections::{BTreeMap, BTreeSet};

use weir_wire::msg::TaskCheckpointStats;
use weir_wire::{CheckpointId, NodeId, StreamId, TaskId, TransId, Version};

use super::task::{Report, Role};

/// Scheduling and failure settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Stream.
    pub stream: StreamId,
    /// Every task of the stream with its node and role.
    pub tasks: Vec<(TaskId, NodeId, Role)>,
    /// Time between checkpoint starts (ms); 0 disables periodic checkpoints.
    pub interval_ms: u64,
    /// Minimum time from the end of one checkpoint to the start of the next (ms).
    pub min_pause_ms: u64,
    /// A checkpoint running longer fails (ms).
    pub timeout_ms: u64,
    /// Extra delay before the first checkpoint after start (ms), so nodes started together do not
    /// checkpoint in lockstep; the caller picks it at random.
    pub first_delay_ms: u64,
    /// Consecutive failures tolerated before the stream is reported unhealthy.
    pub tolerable_failures: u32,
    /// How long to wait for every task's consensus request on a restart without a commit record.
    pub consensus_wait_ms: u64,
}

/// What a commit record holds: enough to restore every task.
#[derive(Clone, Debug, PartialEq)]
pub struct CommitRecord {
    /// Checkpoint.
    pub id: CheckpointId,
    /// Transaction.
    pub trans: TransId,
    /// Source offsets in it, by source task.
    pub versions: BTreeMap<TaskId, Version>,
    /// Manifest checksums by task: the commit names exactly what was uploaded.
    pub manifests: BTreeMap<TaskId, u32>,
    /// Commit time (ms).
    pub ts: u64,
}

/// Inputs of the coordinator.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordInput {
    /// Start (or restart) with what the durable meta holds.
    Start {
        /// Now (ms).
        now: u64,
        /// Next id to allocate, as persisted (1 when new).
        next_id: CheckpointId,
        /// The last commit record, if any.
        last_commit: Option<CommitRecord>,
    },
    /// Time passes.
    Tick {
        /// Now (ms).
        now: u64,
    },
    /// An operator asks for a checkpoint now.
    Trigger,
    /// A task reported.
    Report {
        /// Reporting task.
        task: TaskId,
        /// The report.
        report: Report,
    },
    /// The commit record of `id` is durable.
    CommitDurable {
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Writing the commit record of `id` failed.
    CommitFailed {
        /// Checkpoint.
        id: CheckpointId,
        /// Why.
        reason: String,
    },
    /// A node was lost (its tasks cannot finish the checkpoint, nor any later one until it is
    /// back).
    NodeLost {
        /// The node.
        node: NodeId,
    },
    /// A lost node is reachable again.
    NodeUp {
        /// The node.
        node: NodeId,
    },
    /// A restarting task says what it has (used when there is no commit record).
    Consensus {
        /// Task.
        task: TaskId,
        /// Its latest local checkpoint.
        latest: CheckpointId,
    },
}

/// Ids reserved by one `PersistNextId`.
pub const ID_BLOCK: u64 = 256;

/// Actions of the coordinator, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordAction {
    /// Make this the first id a restarted coordinator may use, durably, before anything that
    /// follows: every id below it is reserved.
    PersistNextId(CheckpointId),
    /// Ask source `task` to start checkpoint `id`.
    SendSourceReq {
        /// Source task.
        task: TaskId,
        /// Its node.
        node: NodeId,
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
        /// Expiry (ms).
        expire_at: u64,
    },
    /// Write the commit record durably (remote store and meta); feed `CommitDurable`.
    WriteCommit(CommitRecord),
    /// Tell `task` that `id` committed.
    SendUpdate {
        /// Task.
        task: TaskId,
        /// Its node.
        node: NodeId,
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
        /// The task's source offset in it.
        version: Version,
        /// Commit time.
        ts: u64,
    },
    /// Tell `task` that `failed` is abandoned.
    SendReset {
        /// Task.
        task: TaskId,
        /// Its node.
        node: NodeId,
        /// Failed checkpoint.
        failed: CheckpointId,
        /// Its transaction.
        trans: TransId,
        /// Why.
        reason: String,
    },
    /// Tell `task` which checkpoint to restore.
    SendRestore {
        /// Task.
        task: TaskId,
        /// Its node.
        node: NodeId,
        /// Checkpoint (none: start empty).
        id: Option<CheckpointId>,
        /// Source offset to replay from.
        version: Version,
        /// Whether it came from the commit record (else the consensus).
        committed: bool,
    },
    /// A checkpoint ended (for statistics and logs).
    Finished {
        /// Checkpoint.
        id: CheckpointId,
        /// When it started (the coordinator's clock, ms).
        started_at: u64,
        /// Start to end (ms).
        duration_ms: u64,
        /// `Ok` if committed, else why it failed.
        outcome: Result<(), String>,
        /// The statistics of every task that reported, in task order.
        tasks: Vec<(TaskId, TaskCheckpointStats)>,
    },
    /// The stream's health changed (unhealthy past the tolerable failures).
    Health {
        /// Whether healthy.
        healthy: bool,
        /// Consecutive failures.
        consecutive_failures: u32,
    },
    /// A report was refused.
    RejectedReport {
        /// Reporting task.
        task: TaskId,
        /// Why.
        reason: String,
    },
}

#[derive(Clone, Debug)]
struct Flight {
    id: CheckpointId,
    trans: TransId,
    started: u64,
    reports: BTreeMap<TaskId, Report>,
    /// The record being written, once every report is in.
    committing: Option<CommitRecord>,
}

impl Flight {
    /// The `Finished` action of this checkpoint, ending at `now`, with every report's statistics.
    fn finished(self, now: u64, outcome: Result<(), String>) -> CoordAction {
        CoordAction::Finished {
            id: self.id,
            started_at: self.started,
            duration_ms: now - self.started,
            outcome,
            tasks: self.reports.into_iter().map(|(t, r)| (t, r.stats)).collect(),
        }
    }
}

#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for `Start`.
    Down,
    /// Restarting without a commit record: collecting consensus until `deadline`.
    Consensus { deadline: u64, latest: BTreeMap<TaskId, CheckpointId> },
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
    /// Ids below this are reserved durably.
    reserved: CheckpointId,
    next_trans: TransId,
    flight: Option<Flight>,
    /// When the last checkpoint started / ended.
    last_start: Option<u64>,
    last_end: Option<u64>,
    earliest_first: u64,
    manual: bool,
    last_commit: Option<CommitRecord>,
    consecutive_failures: u32,
    healthy: bool,
    /// Nodes of the stream known to be down: a checkpoint due meanwhile fails at once instead of
    /// waiting for its timeout.
    down: BTreeSet<NodeId>,
    /// The restore point chosen at start (checkpoint, whether committed), once chosen: a task that
    /// asks again (its answer was lost, or it came after the wait) gets the same one.
    restore_point: Option<(Option<CheckpointId>, bool)>,
}

impl Coordinator {
    /// A coordinator waiting for `Start`.
    pub fn new(cfg: CoordinatorConfig) -> Self {
        Self {
            cfg,
            phase: Phase::Down,
            now: 0,
            next_id: CheckpointId(1),
            reserved: CheckpointId(1),
            next_trans: TransId(1),
            flight: None,
            last_start: None,
            last_end: None,
            earliest_first: 0,
            manual: false,
            last_commit: None,
            consecutive_failures: 0,
            healthy: true,
            down: BTreeSet::new(),
            restore_point: None,
        }
    }

    /// Every task of the stream.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.cfg.tasks.iter().map(|(t, _, _)| *t).collect()
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

    fn restore_all(&mut self, id: Option<CheckpointId>, committed: bool) -> Vec<CoordAction> {
        self.restore_point = Some((id, committed));
        let tasks: Vec<TaskId> = self.tasks();
        tasks.into_iter().filter_map(|t| self.restore_one(t)).collect()
    }

    /// The `SendRestore` of task `t` for the chosen restore point (none before it is chosen).
    fn restore_one(&self, task: TaskId) -> Option<CoordAction> {
        let (id, committed) = self.restore_point?;
        // A consensus point has no record: the task takes the offset from its own manifest.
        let version = self
            .last_commit
            .as_ref()
            .filter(|c| Some(c.id) == id)
            .and_then(|c| c.versions.get(&task).copied())
            .unwrap_or(Version(0));
        Some(CoordAction::SendRestore { task, node: self.node_of(task), id, version, committed })
    }

    /// Handles one input.
    pub fn handle(&mut self, input: CoordInput) -> Vec<CoordAction> {
        match input {
            CoordInput::Start { now, next_id, last_commit } => {
                self.now = now;
                // Never below a committed id, whatever the meta says.
                self.next_id = next_id.max(last_commit.as_ref().map_or(CheckpointId(1), |c| c.id.next()));
                self.reserved = self.next_id;
                self.flight = None;
                self.earliest_first = now + self.cfg.first_delay_ms;
                self.last_commit = last_commit.clone();
                match last_commit {
                    Some(c) => {
                        self.phase = Phase::Running;
                        self.restore_all(Some(c.id), true)
                    }
                    None => {
                        self.phase =
                            Phase::Consensus { deadline: now + self.cfg.consensus_wait_ms, latest: BTreeMap::new() };
                        Vec::new()
                    }
                }
            }
            CoordInput::Consensus { task, latest } => {
                if !self.cfg.tasks.iter().any(|(t, _, _)| *t == task) {
                    return Vec::new();
                }
                let done = match &mut self.phase {
                    Phase::Consensus { latest: l, .. } => {
                        l.insert(task, latest);
                        l.len() == self.cfg.tasks.len()
                    }
                    // Chosen already: the task asks again, and gets the same answer.
                    _ => return self.restore_one(task).into_iter().collect(),
                };
                if done { self.finish_consensus() } else { Vec::new() }
            }
            CoordInput::Tick { now } => self.tick(now),
            CoordInput::Trigger => {
                self.manual = true;
                self.tick(self.now)
            }
            CoordInput::Report { task, report } => self.report(task, report),
            CoordInput::CommitDurable { id } => self.commit_durable(id),
            CoordInput::CommitFailed { id, reason } => {
                if self.flight.as_ref().is_some_and(|f| f.id == id && f.committing.is_some()) {
                    return self.fail(format!("writing the commit record failed: {reason}"));
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
                        return self.fail(format!("node {node} was lost"));
                    }
                }
                Vec::new()
            }
        }
    }

    fn finish_consensus(&mut self) -> Vec<CoordAction> {
        let Phase::Consensus { latest, .. } = std::mem::replace(&mut self.phase, Phase::Running) else {
            return Vec::new();
        };
        // The seed's rule: the minimum of what every task has; a task that did not answer counts
        // as having nothing.
        let all = self.cfg.tasks.iter().map(|(t, _, _)| latest.get(t).copied().unwrap_or(CheckpointId(0)));
        let min = all.min().unwrap_or(CheckpointId(0));
        let id = (min > CheckpointId(0)).then_some(min);
        self.next_id = self.next_id.max(min.next());
        self.restore_all(id, false)
    }

    fn tick(&mut self, now: u64) -> Vec<CoordAction> {
        self.now = self.now.max(now);
        let now = self.now;
        match &self.phase {
            Phase::Down => return Vec::new(),
            Phase::Consensus { deadline, .. } => {
                if now >= *deadline {
                    return self.finish_consensus();
                }
                return Vec::new();
            }
            Phase::Running => {}
        }
        if let Some(f) = &self.flight {
            if f.committing.is_none() && now.saturating_sub(f.started) >= self.cfg.timeout_ms {
                let why = format!("timed out after {} ms", now - f.started);
                return self.fail(why);
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
        self.manual = false;
        self.start(now)
    }

    fn start(&mut self, now: u64) -> Vec<CoordAction> {
        let id = self.next_id;
        let trans = self.next_trans;
        self.next_id = id.next();
        self.next_trans = TransId(trans.0 + 1);
        self.last_start = Some(now);
        self.flight = Some(Flight { id, trans, started: now, reports: BTreeMap::new(), committing: None });
        let mut out = Vec::new();
        if id >= self.reserved {
            self.reserved = CheckpointId(id.0 + ID_BLOCK);
            out.push(CoordAction::PersistNextId(self.reserved));
        }
        if let Some(n) = self.down.first() {
            let why = format!("node {n} is down");
            out.extend(self.fail(why));
            return out;
        }
        let expire_at = now + self.cfg.timeout_ms;
        for (task, node, role) in &self.cfg.tasks {
            if *role == Role::Source {
                out.push(CoordAction::SendSourceReq { task: *task, node: *node, id, trans, expire_at });
            }
        }
        out
    }

    fn report(&mut self, task: TaskId, report: Report) -> Vec<CoordAction> {
        let reject = |reason: String| vec![CoordAction::RejectedReport { task, reason }];
        let Some(f) = self.flight.as_mut() else {
            return reject(format!("no checkpoint in flight (report for {})", report.id));
        };
        if report.id != f.id || report.trans != f.trans {
            return reject(format!(
                "report for {} {} does not match the checkpoint in flight {} {}",
                report.id, report.trans, f.id, f.trans
            ));
        }
        if !self.cfg.tasks.iter().any(|(t, _, _)| *t == task) {
            return reject(format!("{task} is not a task of stream {}", self.cfg.stream));
        }
        if let Err(why) = &report.outcome {
            let why = format!("{task} failed: {why}");
            return self.fail(why);
        }
        if f.committing.is_some() || f.reports.contains_key(&task) {
            return Vec::new(); // a resent report
        }
        f.reports.insert(task, report);
        if f.reports.len() < self.cfg.tasks.len() {
            return Vec::new();
        }
        let sources: BTreeSet<TaskId> =
            self.cfg.tasks.iter().filter(|(_, _, r)| *r == Role::Source).map(|(t, _, _)| *t).collect();
        let record = CommitRecord {
            id: f.id,
            trans: f.trans,
            versions: f
                .reports
                .iter()
                .filter(|(t, _)| sources.contains(t))
                .map(|(t, r)| (*t, r.outcome.clone().unwrap_or(Version(0))))
                .collect(),
            manifests: f.reports.iter().map(|(t, r)| (*t, r.manifest_crc)).collect(),
            ts: self.now,
        };
        f.committing = Some(record.clone());
        vec![CoordAction::WriteCommit(record)]
    }

    fn commit_durable(&mut self, id: CheckpointId) -> Vec<CoordAction> {
        let Some(mut f) = self.flight.take_if(|f| f.id == id && f.committing.is_some()) else { return Vec::new() };
        let record = f.committing.take().expect("checked above");
        let (trans, ts, versions) = (record.trans, record.ts, record.versions.clone());
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

    fn fail(&mut self, why: String) -> Vec<CoordAction> {
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
                reason: why.clone(),
            })
            .collect();
        out.push(f.finished(self.now, Err(why)));
        let healthy = self.consecutive_failures <= self.cfg.tolerable_failures;
        if healthy != self.healthy || !healthy {
            self.healthy = healthy;
            out.push(CoordAction::Health { healthy, consecutive_failures: self.consecutive_failures });
        }
        out
    }

    /// The node of `task` (for callers routing messages).
    pub fn task_node(&self, task: TaskId) -> NodeId {
        self.node_of(task)
    }
}
