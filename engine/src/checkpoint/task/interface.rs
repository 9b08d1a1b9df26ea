//! What the task machine takes ([`TaskInput`]) and returns ([`TaskAction`]), and the types they
//! carry.

use weir_wire::msg::{TaskCheckpointStats, TriggerKind, TriggerRspCode};
use weir_wire::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

use crate::checkpoint::CheckpointError;

/// A task's role in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads a partition; answers the coordinator's source request.
    Source,
    /// Aligns triggers from its upstreams and forwards them.
    Agg,
    /// Aligns triggers; has no downstream.
    Sink,
}

/// Static description of a task for the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSetup {
    /// Stream.
    pub stream: StreamId,
    /// This task.
    pub task: TaskId,
    /// Its node.
    pub node: NodeId,
    /// Its role.
    pub role: Role,
    /// Upstream tasks in input order, with their nodes.
    pub upstreams: Vec<(TaskId, NodeId)>,
    /// Downstream tasks in output order, with their nodes.
    pub downstreams: Vec<(TaskId, NodeId)>,
    /// Time without an upstream's trigger before retrieving it (ms).
    pub trigger_timeout_ms: u64,
    /// Interval for resending unconfirmed ready messages (ms).
    pub ready_resend_ms: u64,
    /// Whether an input is held (closed) from its trigger until every input's trigger arrived:
    /// aligned barriers, so the snapshot is exactly the cut. A task whose writes are idempotent
    /// upserts of deterministic values (a sink's result store) need not: taken once the last
    /// trigger arrived, its snapshot holds everything before each trigger and perhaps some
    /// results after one, which a replay from the checkpoint writes again with the same values;
    /// and a newer trigger on an input still means the older checkpoint is over (one checkpoint
    /// is in flight at a time, and it cannot commit without this task). It then never blocks
    /// an upstream that is ahead. With `true` the machine still only asks: the port may cut
    /// the input instead of closing it ([`Hold::Cut`](crate::checkpoint::driver::Hold)).
    pub hold_inputs: bool,
}

/// Lifecycle state of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Not restored yet.
    Uninit,
    /// Processing; no checkpoint in progress.
    Ready,
    /// Taking part in checkpoint `id`.
    Checkpointing(CheckpointId),
    /// Stopped for good.
    Stopped,
}

/// Why a trigger or request was not acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Older than the last completed checkpoint.
    Expired,
    /// At or below the last failed checkpoint.
    Failed,
    /// The task is checkpointing another id.
    Invalid,
    /// This upstream's trigger (or every trigger) is already in.
    Duplicate,
    /// A source request past its expiry time.
    Stale,
    /// The message does not fit the task (a trigger at a source, an unknown peer).
    Misdirected,
}

/// What a source did with a source request (mirrors `msg::SourceOutcome`).
#[derive(Clone, Debug, PartialEq)]
pub enum SourceAnswer {
    /// Built: the offset recorded at the trigger.
    Done(Version),
    /// The task is not a source.
    NotSource,
    /// At or below the last completed id.
    AlreadyCompleted(CheckpointId),
    /// At or below the last failed id.
    AlreadyFailed(CheckpointId),
    /// Checkpointing another id.
    Busy(CheckpointId),
    /// Failed.
    Failed(String),
    /// Not restored yet: it cannot take part in any checkpoint before its restore point.
    NotRestored,
}

/// What the task reports to the coordinator.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Checkpoint.
    pub id: CheckpointId,
    /// Transaction.
    pub trans: TransId,
    /// `Ok(version)` (the source offset; zero for other roles) or why it failed.
    pub outcome: Result<Version, crate::checkpoint::TaskFailure>,
    /// CRC32C of the uploaded manifest (zero on failure).
    pub manifest_crc: u32,
    /// Timing and size. The machine fills in what it knows (the upload's figures); the runtime
    /// adds the clock readings (trigger, alignment, snapshot, report times) before sending.
    pub stats: TaskCheckpointStats,
}

/// A snapshot made durable in the store, as the runtime's uploader saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadDone {
    /// CRC32C of the stored manifest.
    pub manifest_crc: u32,
    /// Bytes sent (files the store did not hold yet, and the manifest).
    pub bytes: u64,
    /// Files in the manifest.
    pub files: u32,
    /// State write, local checkpoint and upload (µs).
    pub upload_us: u64,
}

/// Inputs of the task machine.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskInput {
    /// The coordinator asks this source to start checkpoint `id`.
    SourceReq {
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
        /// Periodic or manual.
        kind: TriggerKind,
        /// Past this time the request is stale.
        expire_at: u64,
    },
    /// A source reached the trigger it queued behind its data: `offset` rows were emitted before it.
    SourceReachedTrigger {
        /// Checkpoint.
        id: CheckpointId,
        /// Rows emitted before the trigger (checkpointVer).
        offset: Version,
    },
    /// A trigger arrived in-band from upstream `from`, as frame `seq` on that channel.
    Trigger {
        /// Upstream.
        from: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
    },
    /// The snapshot asked for by `Snapshot` was taken (flushed and hard-linked), or failed.
    SnapshotTaken {
        /// Checkpoint.
        id: CheckpointId,
        /// Error, if any.
        result: Result<(), CheckpointError>,
    },
    /// The trigger went out on the channel to `to` (it is in the queue or on the wire).
    TriggerDispatched {
        /// Downstream.
        to: TaskId,
        /// Its sequence number on that channel.
        seq: Seq,
    },
    /// The upload of snapshot `id` is durable in the store, or failed.
    Uploaded {
        /// Checkpoint.
        id: CheckpointId,
        /// What was stored, or why not.
        result: Result<UploadDone, CheckpointError>,
    },
    /// Upstream `from` ended its stream: it will send no trigger again.
    UpstreamEnded {
        /// Upstream.
        from: TaskId,
    },
    /// Downstream `from` is ready for `id`.
    Ready {
        /// Downstream.
        from: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// Its transaction.
        trans: TransId,
    },
    /// Upstream `from` confirmed our ready message for `id`.
    ReadyRsp {
        /// Upstream.
        from: TaskId,
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Downstream `from` has not received our trigger for `id`.
    RetrieveTrigger {
        /// Downstream.
        from: TaskId,
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Upstream `from` answered our retrieve request. `next_seq` is the next sequence number this
    /// task expects on that channel, filled in by the driver on arrival (`None`: not known).
    TriggerRsp {
        /// Upstream.
        from: TaskId,
        /// The upstream's checkpoint id.
        id: CheckpointId,
        /// Its transaction.
        trans: TransId,
        /// Outcome.
        code: TriggerRspCode,
        /// The trigger's sequence number on the channel.
        trigger_seq: Seq,
        /// The next sequence number expected on the channel here.
        next_seq: Option<Seq>,
    },
    /// Checkpoint `id` is committed.
    Update {
        /// Checkpoint.
        id: CheckpointId,
        /// Its transaction.
        trans: TransId,
        /// Source offset in it (sources).
        version: Version,
        /// Commit time.
        ts: u64,
    },
    /// The coordinator abandoned checkpoint `failed`.
    Reset {
        /// The failed checkpoint.
        failed: CheckpointId,
        /// Its transaction.
        trans: TransId,
        /// Why it failed.
        reason: String,
    },
    /// The task starts from checkpoint `id` (or from nothing).
    Restored {
        /// Restored checkpoint.
        id: Option<CheckpointId>,
        /// Its source offset.
        version: Version,
    },
    /// Time passes (ms).
    Tick {
        /// Now.
        now: u64,
    },
}

/// Actions for the runtime, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskAction {
    /// Nothing was done with the input, and why.
    Discarded(Discard),
    /// A source: put a trigger behind the data it holds; feed `SourceReachedTrigger` on reaching it.
    QueueSourceTrigger {
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
        /// A savepoint (every task writes all its state).
        savepoint: bool,
    },
    /// Hold back the input of upstream `i`.
    CloseInput(usize),
    /// Take input `i` again.
    ReopenInput(usize),
    /// Take every input again.
    ReopenAllInputs,
    /// Flush operator state and take the local snapshot for `id` (synchronously; feed
    /// `SnapshotTaken`), then forward the trigger on every output.
    Snapshot {
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction, for the forwarded trigger.
        trans: TransId,
        /// Source offset (sources).
        offset: Version,
    },
    /// Treat upstream `from`'s trigger as arrived (retrieved): the runtime skips it if it comes.
    InjectTrigger {
        /// Upstream.
        from: TaskId,
    },
    /// Upload snapshot `id` in the background; feed `Uploaded`.
    Upload {
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Send checkpoint-ready to upstream `to`.
    SendReady {
        /// Upstream.
        to: TaskId,
        /// Its node.
        node: NodeId,
        /// Checkpoint.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
    },
    /// Confirm downstream `to`'s ready message.
    SendReadyRsp {
        /// Downstream.
        to: TaskId,
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Ask upstream `to` for its trigger.
    SendRetrieveTrigger {
        /// Upstream.
        to: TaskId,
        /// Its node.
        node: NodeId,
        /// Checkpoint.
        id: CheckpointId,
    },
    /// Answer downstream `to`'s retrieve request.
    SendTriggerRsp {
        /// Downstream.
        to: TaskId,
        /// Our active (or asked) id.
        id: CheckpointId,
        /// Our transaction.
        trans: TransId,
        /// Outcome.
        code: TriggerRspCode,
        /// The trigger's sequence number on that channel.
        trigger_seq: Seq,
    },
    /// Answer the coordinator's source request.
    SendSourceRsp {
        /// Checkpoint asked for.
        id: CheckpointId,
        /// Transaction.
        trans: TransId,
        /// Answer.
        answer: SourceAnswer,
    },
    /// Report to the coordinator.
    SendReport(Report),
    /// Persist the committed id, version and time in the node's meta store.
    PersistCommitted {
        /// Checkpoint.
        id: CheckpointId,
        /// Version.
        version: Version,
        /// Time.
        ts: u64,
    },
    /// Delete local snapshots older than `id` (the new retained one).
    DeleteSnapshotsBefore(CheckpointId),
    /// Drop the (failed) snapshot `id`.
    DropSnapshot(CheckpointId),
}
