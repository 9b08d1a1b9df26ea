//! The checkpoint protocol's messages.

use super::*;

archived! {
    /// Why the coordinator started a checkpoint.
    pub enum TriggerKind {
        /// The interval timer.
        Periodic,
        /// An operator asked for it.
        Manual,
        /// A savepoint: every task writes all its state and none names rows to replay, so it
        /// restores with other parallelism (`weir stream rescale`, a pause's final checkpoint).
        Savepoint,
    }
}

archived! {
    /// Coordinator → source task: start checkpoint `checkpoint`.
    pub struct CheckpointSourceReq {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// New checkpoint id.
        pub checkpoint: CheckpointId,
        /// Coordinator transaction.
        pub trans: TransId,
        /// Target source task.
        pub task: TaskId,
        /// Node the task runs on.
        pub node: NodeId,
        /// Why.
        pub kind: TriggerKind,
        /// Past this time (ms since the epoch) the request is stale and must not start anything.
        pub expire_at_ms: u64,
    }
}

archived! {
    /// What a source did with a [`CheckpointSourceReq`].
    pub enum SourceOutcome {
        /// The source built its part of the checkpoint at this ingest offset.
        Done {
            /// The source offset recorded at the trigger (checkpointVer).
            version: Version,
        },
        /// The task is not a source; nothing was done.
        NotSource,
        /// The id is at or below the task's last completed checkpoint; nothing was done.
        AlreadyCompleted {
            /// The task's last completed id.
            latest: CheckpointId,
        },
        /// The id is at or below the task's last failed checkpoint; nothing was done.
        AlreadyFailed {
            /// The task's last failed id.
            failed: CheckpointId,
        },
        /// The task is already checkpointing another id; nothing was done.
        Busy {
            /// The id in progress.
            active: CheckpointId,
        },
        /// The source failed to build its checkpoint.
        Failed {
            /// Why.
            reason: String,
        },
        /// The task has not restored yet (it waits for its restore point); nothing was done.
        NotRestored,
    }
}

archived! {
    /// Source task → coordinator: answer to a [`CheckpointSourceReq`].
    pub struct CheckpointSourceRsp {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Checkpoint id of the request.
        pub checkpoint: CheckpointId,
        /// Transaction of the request.
        pub trans: TransId,
        /// Answering task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// What happened.
        pub outcome: SourceOutcome,
    }
}

archived! {
    /// The barrier: in-band on a data channel, after every row of the checkpoint's cut.
    pub struct CheckpointTrigger {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// Coordinator transaction.
        pub trans: TransId,
        /// Upstream task that dispatched it.
        pub from: TaskId,
        /// Downstream task it is for.
        pub to: TaskId,
        /// Its sequence number on the channel.
        pub seq: Seq,
        /// Whether the checkpoint is a savepoint ([`TriggerKind::Savepoint`]).
        pub savepoint: bool,
    }
}

archived! {
    /// Downstream → upstream: my part of `checkpoint` is durable and all my downstreams are ready.
    pub struct CheckpointReady {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// Transaction.
        pub trans: TransId,
        /// The ready (downstream) task.
        pub downstream: TaskId,
        /// Its node.
        pub downstream_node: NodeId,
        /// The upstream task this is sent to.
        pub upstream: TaskId,
        /// Its node.
        pub upstream_node: NodeId,
    }
}

archived! {
    /// Upstream → downstream: confirms a [`CheckpointReady`], which stops its resending.
    pub struct CheckpointReadyRsp {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// The confirming (upstream) task.
        pub upstream: TaskId,
        /// The task whose ready message is confirmed.
        pub downstream: TaskId,
    }
}

archived! {
    /// Downstream → upstream: I have not received your trigger for `checkpoint`.
    pub struct RetrieveTriggerReq {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Checkpoint id the downstream is aligning for.
        pub checkpoint: CheckpointId,
        /// The upstream asked.
        pub upstream: TaskId,
        /// Its node.
        pub upstream_node: NodeId,
        /// The asking downstream.
        pub downstream: TaskId,
        /// Its node.
        pub downstream_node: NodeId,
    }
}

archived! {
    /// Upstream's answer to a [`RetrieveTriggerReq`].
    pub enum TriggerRspCode {
        /// The trigger was dispatched; the downstream may inject it once every frame before
        /// `trigger_seq` on the channel has arrived.
        Success,
        /// The upstream has not reached the trigger yet; ask again later.
        InProgress,
        /// The upstream is not checkpointing that id.
        Invalid,
    }
}

archived! {
    /// Upstream → downstream: answer to a [`RetrieveTriggerReq`].
    pub struct TriggerRsp {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// The upstream's active checkpoint id (or the asked id when it has none).
        pub checkpoint: CheckpointId,
        /// The upstream's transaction.
        pub trans: TransId,
        /// Answering upstream.
        pub upstream: TaskId,
        /// Asking downstream.
        pub downstream: TaskId,
        /// Outcome.
        pub code: TriggerRspCode,
        /// Sequence number the trigger had on the channel (meaningful on success).
        pub trigger_seq: Seq,
    }
}

archived! {
    /// Timing and size of one task's part of a checkpoint.
    #[derive(Default)]
    pub struct TaskCheckpointStats {
        /// When the first trigger reached the task (a source: when it reached its queued trigger),
        /// µs since the epoch.
        pub trigger_at_us: u64,
        /// Time from the first to the last trigger (µs): the alignment.
        pub align_us: u64,
        /// Synchronous state capture and barrier forwarding (µs); with the alignment, the pause
        /// the task's pipeline saw.
        pub snapshot_us: u64,
        /// Bytes uploaded for this checkpoint (new files only).
        pub upload_bytes: u64,
        /// Background work: state write, local RocksDB checkpoint and upload (µs).
        pub upload_us: u64,
        /// Files in the manifest.
        pub files: u32,
        /// When the task reported (its snapshot durable, its downstream ready), µs since the epoch.
        pub reported_at_us: u64,
    }
}

archived! {
    /// How a task's part of a checkpoint ended.
    pub enum ReportOutcome {
        /// Snapshot durable in the store.
        Done,
        /// The task failed its part.
        Failed {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// Task → coordinator: my part of `checkpoint` is done (or failed).
    pub struct CheckpointReport {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Reporting task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// Checkpoint id; a mismatch with the coordinator's is rejected.
        pub checkpoint: CheckpointId,
        /// Transaction; a mismatch is rejected.
        pub trans: TransId,
        /// Outcome.
        pub outcome: ReportOutcome,
        /// Source offset recorded (checkpointVer); zero for non-sources.
        pub version: Version,
        /// When the task took its snapshot (ms since the epoch).
        pub checkpoint_ts_ms: u64,
        /// CRC32C of the task's manifest as stored, so a commit names exactly what was uploaded.
        pub manifest_crc: u32,
        /// Timing and size.
        pub stats: TaskCheckpointStats,
    }
}

archived! {
    /// Coordinator → task: `checkpoint` is committed.
    pub struct UpdateCheckpointInfo {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// Committed id.
        pub checkpoint: CheckpointId,
        /// Transaction.
        pub trans: TransId,
        /// The task's source offset in that checkpoint.
        pub version: Version,
        /// Commit time (ms since the epoch).
        pub checkpoint_ts_ms: u64,
    }
}

archived! {
    /// Coordinator → task: checkpoint `failed` is abandoned; drop it and return to ready.
    pub struct TaskReset {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// The failed checkpoint.
        pub failed: CheckpointId,
        /// Its transaction.
        pub trans: TransId,
        /// Why it failed.
        pub reason: String,
    }
}

archived! {
    /// Task → coordinator on start: what I have, so a restore point can be agreed.
    pub struct ConsensusReq {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// Latest checkpoint the task has locally committed, if any; the restore point names
        /// the offset.
        pub latest: Option<CheckpointId>,
        /// The request (unique per start of the task), echoed by the [`Restore`] answering it.
        pub request: u64,
    }
}

archived! {
    /// Task → coordinator on start: I cannot restore the chosen point (its files are damaged or
    /// missing on my node and in the store); choose an older one.
    pub struct CannotRestoreReq {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// The restore point it cannot restore.
        pub checkpoint: CheckpointId,
        /// The older committed checkpoints every task of its node can restore (checked),
        /// newest first; empty: none.
        pub restorable: Vec<CheckpointId>,
        /// What is wrong.
        pub reason: String,
        /// The request (unique per start of the task), echoed by the [`Restore`] answering it.
        pub request: u64,
    }
}

archived! {
    /// Node → the other nodes of a stream: the stream's run at `epoch` failed here (its tasks
    /// here are gone), so theirs cannot go on: they end that run too and start the next.
    pub struct RunFailed {
        /// Stream.
        pub stream: StreamId,
        /// The run that failed.
        pub epoch: Epoch,
        /// Why, as the failing node says (for logs and status).
        pub reason: String,
    }
}

archived! {
    /// Where a restore point came from.
    pub enum RestoreBasis {
        /// The coordinator's durable commit record.
        Committed,
        /// The seed's consensus: the minimum of the tasks' latest ids.
        Consensus,
        /// Nothing committed yet: start empty from the beginning.
        Fresh,
        /// An older commit than the last: a task could not restore the last one.
        Fallback,
    }
}

archived! {
    /// Coordinator → task: restore this checkpoint before processing.
    pub struct Restore {
        /// Stream.
        pub stream: StreamId,
        /// The stream's run: a node takes it only into the run at this epoch.
        pub epoch: Epoch,
        /// Task.
        pub task: TaskId,
        /// Checkpoint to restore (none for a fresh start).
        pub checkpoint: Option<CheckpointId>,
        /// How it was chosen.
        pub basis: RestoreBasis,
        /// Source offset to replay from, when the commit record names it (none: the one in the
        /// task's manifest).
        pub version: Option<Version>,
        /// The [`ConsensusReq`] this answers.
        pub request: u64,
    }
}
