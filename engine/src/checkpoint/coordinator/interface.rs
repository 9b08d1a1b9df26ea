//! What the coordinator takes ([`CoordInput`]) and returns ([`CoordAction`]), its settings, and
//! the records it keeps durable ([`CommitRecord`], [`IdRecord`]).

use std::collections::BTreeMap;

use weir_wire::msg::{RestoreBasis, TaskCheckpointStats, TriggerKind};
use weir_wire::{CheckpointId, NodeId, StreamId, TaskId, TransId, Version};

use crate::checkpoint::task::{Report, Role, SourceAnswer};

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
    /// How long a write of the id record or of a commit record may take before it counts as
    /// failed (ms): a store that does not answer fails the checkpoint instead of stalling it.
    pub store_timeout_ms: u64,
}

/// The coordinator's durable id record: the first checkpoint id and transaction id a restarted
/// coordinator may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRecord {
    /// First unreserved checkpoint id.
    pub next_id: CheckpointId,
    /// First unreserved transaction id.
    pub next_trans: TransId,
}

impl Default for IdRecord {
    fn default() -> Self {
        Self { next_id: CheckpointId(1), next_trans: TransId(1) }
    }
}

impl IdRecord {
    /// The record reserving everything either of the two reserves.
    pub fn max(self, other: IdRecord) -> IdRecord {
        IdRecord { next_id: self.next_id.max(other.next_id), next_trans: self.next_trans.max(other.next_trans) }
    }
}

/// What a commit record stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// The checkpoint committed under this transaction.
    Commit(TransId),
    /// The tasks' consensus chose this checkpoint (its own record was lost). Like
    /// [`RecordKind::Fresh`], the record takes an id of its own, past every id used: no key of
    /// the store is ever written twice, and the record sorts above every older one.
    Consensus(CheckpointId),
    /// The tasks' consensus chose to start from nothing. The record takes an id of its own,
    /// which names no state, so that it sorts above every older record: a restarted coordinator
    /// finds the choice and makes it again.
    Fresh,
    /// The stream went back to this older committed checkpoint, because a task could restore
    /// the newer one neither from its node nor from the store. Like [`RecordKind::Fresh`], the
    /// record takes an id of its own, so it sorts above the record it supersedes.
    Fallback(CheckpointId),
}

/// What a commit record holds: enough to restore every task.
#[derive(Clone, Debug, PartialEq)]
pub struct CommitRecord {
    /// Checkpoint (for every kind but [`RecordKind::Commit`], the id of the record, which
    /// names no state: [`CommitRecord::restore_point`] is the checkpoint).
    pub id: CheckpointId,
    /// Commit, consensus point or start from nothing.
    pub kind: RecordKind,
    /// Source offsets in it, by source task.
    pub versions: BTreeMap<TaskId, Version>,
    /// Manifest checksums by task: the commit names exactly what was uploaded.
    pub manifests: BTreeMap<TaskId, u32>,
    /// Commit time (ms).
    pub ts: u64,
    /// The aggs and sinks the commit covers (`None` in a record that names no state, or one
    /// written by an older Weir): a restore with other parallelism finds the old tasks by it.
    pub shape: Option<Shape>,
    /// Whether the checkpoint is a savepoint (every task wrote all its state).
    pub savepoint: bool,
}

/// The aggs and sinks of a stream at a commit: aggs `first_agg..+aggs`, sinks after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The first agg's id.
    pub first_agg: TaskId,
    /// Aggs.
    pub aggs: u32,
    /// Sinks.
    pub sinks: u32,
}

impl Shape {
    /// The agg tasks.
    pub fn agg_tasks(&self) -> impl Iterator<Item = TaskId> + use<> {
        let b = self.first_agg.0;
        (b..b + self.aggs).map(TaskId)
    }

    /// The sink tasks.
    pub fn sink_tasks(&self) -> impl Iterator<Item = TaskId> + use<> {
        let b = self.first_agg.0 + self.aggs;
        (b..b + self.sinks).map(TaskId)
    }
}

impl CommitRecord {
    /// A record of no state (its kind set by the caller).
    fn empty(id: CheckpointId, ts: u64) -> Self {
        CommitRecord {
            id,
            kind: RecordKind::Fresh,
            versions: BTreeMap::new(),
            manifests: BTreeMap::new(),
            ts,
            shape: None,
            savepoint: false,
        }
    }

    /// The record of the consensus's choice of checkpoint `to`, under id `id`, at `ts`: it names
    /// no offsets or manifest checksums (each task's manifest, checked by its own checksum, has
    /// them).
    pub fn consensus(id: CheckpointId, to: CheckpointId, ts: u64) -> Self {
        CommitRecord { id, kind: RecordKind::Consensus(to), ..Self::empty(id, ts) }
    }

    /// The record of the consensus's choice to start from nothing, under id `id`, at `ts`.
    pub fn fresh(id: CheckpointId, ts: u64) -> Self {
        CommitRecord { id, kind: RecordKind::Fresh, ..Self::empty(id, ts) }
    }

    /// The record of the stream's going back to checkpoint `to`, under id `id`, at `ts`: like a
    /// consensus record, it names no offsets or manifest checksums (each manifest has them).
    pub fn fallback(id: CheckpointId, to: CheckpointId, ts: u64) -> Self {
        CommitRecord { id, kind: RecordKind::Fallback(to), ..Self::empty(id, ts) }
    }

    /// The checkpoint every task restores (none: every task starts from nothing).
    pub fn restore_point(&self) -> Option<CheckpointId> {
        match self.kind {
            RecordKind::Fresh => None,
            RecordKind::Fallback(to) | RecordKind::Consensus(to) => Some(to),
            RecordKind::Commit(_) => Some(self.id),
        }
    }

    /// The checkpoint's transaction, when it is a checkpoint's own commit.
    pub fn trans(&self) -> Option<TransId> {
        match self.kind {
            RecordKind::Commit(t) => Some(t),
            RecordKind::Consensus(_) | RecordKind::Fresh | RecordKind::Fallback(_) => None,
        }
    }
}

/// Inputs of the coordinator.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordInput {
    /// Start (or restart) with what the durable meta holds.
    Start {
        /// Now (ms).
        now: u64,
        /// The persisted id record (the default when new).
        ids: IdRecord,
        /// The last commit record, if any.
        last_commit: Option<CommitRecord>,
    },
    /// Time passes.
    Tick {
        /// Now (ms).
        now: u64,
    },
    /// An operator asks for a checkpoint now; a `savepoint` is asked for again at each
    /// checkpoint until one commits.
    Trigger {
        /// Whether it must be a savepoint (`TriggerKind::Savepoint`).
        savepoint: bool,
    },
    /// The id record asked for by `PersistIds` is durable.
    IdsPersisted(IdRecord),
    /// Writing the id record failed (or did not answer): no checkpoint starts on it.
    IdsFailed {
        /// Why.
        reason: String,
    },
    /// A source answered its source request. Only a refusal matters here (a source that built
    /// its part reports); it ends the checkpoint at once.
    SourceRsp {
        /// Source task.
        task: TaskId,
        /// Checkpoint of the request.
        id: CheckpointId,
        /// Its transaction.
        trans: TransId,
        /// The answer.
        answer: SourceAnswer,
    },
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
    /// A starting task asks for its restore point, with what it has (which counts when there
    /// is no commit record).
    Consensus {
        /// Task.
        task: TaskId,
        /// Its latest local checkpoint, if any.
        latest: Option<CheckpointId>,
        /// The request, echoed in the answer: a task takes only the answer to its own request
        /// (an answer to an earlier incarnation of it may still be in flight).
        request: u64,
    },
    /// A starting task cannot restore the chosen point `id`: its files (or those of another
    /// task of its node) are damaged or missing both on the node and in the store. It asks
    /// for an older restore point, naming the older commits its node can restore.
    CannotRestore {
        /// Task.
        task: TaskId,
        /// The restore point it cannot restore.
        id: CheckpointId,
        /// The older committed checkpoints every task of its node can restore (checked);
        /// empty: none.
        restorable: Vec<CheckpointId>,
        /// What is wrong, for the log line.
        reason: String,
        /// The request, as for `Consensus`.
        request: u64,
    },
}

/// Ids (and transaction ids) reserved by one `PersistIds`.
pub const ID_BLOCK: u64 = 256;

/// Actions of the coordinator, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordAction {
    /// Write the id record durably; feed `IdsPersisted` (or `IdsFailed`). Every id and
    /// transaction below it is then reserved.
    PersistIds(IdRecord),
    /// Ids could not be reserved: no checkpoint started.
    IdsNotDurable {
        /// Why.
        reason: String,
    },
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
        /// Periodic or manual.
        kind: TriggerKind,
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
        /// Source offset to replay from, when the point is a commit record (a consensus point
        /// has none: the task's manifest says it).
        version: Option<Version>,
        /// Where it came from: the commit record, the consensus, a fallback, or nothing.
        basis: RestoreBasis,
        /// The request this answers.
        request: u64,
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
        outcome: Result<(), crate::checkpoint::CheckpointFailure>,
        /// Whether it was a savepoint.
        savepoint: bool,
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
    /// The stream goes back from checkpoint `from`, which a task cannot restore, to `to` (for
    /// the log: one line saying what was wrong).
    FallingBack {
        /// The restore point given up.
        from: CheckpointId,
        /// The older one chosen (none: there is none, and the stream halts).
        to: Option<CheckpointId>,
        /// What the tasks found, task by task.
        reason: String,
    },
    /// The stream cannot go on without a person or a restart of every node: no committed
    /// checkpoint every task can restore, or tasks that restored a damaged point already (on
    /// other nodes) and cannot go back with the others. The engine stops with `reason`.
    Halt {
        /// Why, and what to do.
        reason: String,
    },
    /// A report was refused.
    RejectedReport {
        /// Reporting task.
        task: TaskId,
        /// Why.
        reason: String,
    },
}
