//! [`CheckpointError`]: what can go wrong around the protocol machines (snapshots, uploads, the
//! task's meta record, restores, the coordinator's records), with the task, checkpoint and object
//! it concerns, and whether retrying can help.
//!
//! The machines themselves never fail: a failed snapshot or upload is an input to them and ends
//! that checkpoint. An error returned from a driver is one the protocol cannot absorb (a task
//! that cannot read its own meta record, a restore that finds no valid state): it stops the task.

use weir_wire::{CheckpointId, NodeId, StreamId, TaskId};

/// Errors of checkpointing, restoring and coordinating.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The remote store failed an operation on `key`.
    #[error("store {op} {key}: {reason}")]
    Store {
        /// Operation.
        op: &'static str,
        /// Object key.
        key: String,
        /// Why.
        reason: String,
        /// Whether the same operation may succeed later (an unreachable store), or not (a
        /// corrupt object).
        retryable: bool,
    },
    /// A store call did not answer in time; its outcome is unknown.
    #[error("store {op} {key}: no answer within {ms} ms")]
    Timeout {
        /// Operation.
        op: &'static str,
        /// Object key.
        key: String,
        /// The limit.
        ms: u64,
    },
    /// A task's local meta record (its committed id) could not be read or written.
    #[error("task {task}: meta record {path}: {reason}")]
    Meta {
        /// Task.
        task: TaskId,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Capturing state or forwarding the barrier failed.
    #[error("task {task}: snapshot of checkpoint {id} failed: {reason}")]
    Snapshot {
        /// Task.
        task: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// Why.
        reason: String,
    },
    /// Writing or shipping a snapshot failed.
    #[error("task {task}: upload of checkpoint {id} failed: {reason}")]
    Upload {
        /// Task.
        task: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// Why.
        reason: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// A task could not restore its state.
    #[error("task {task}: {} failed: {reason}", restoring(.id))]
    Restore {
        /// Task.
        task: TaskId,
        /// Checkpoint (none: a start from nothing).
        id: Option<CheckpointId>,
        /// Why.
        reason: String,
    },
    /// A checkpoint's files of a task (or its manifest) are damaged or missing both on the node
    /// and in the store: that checkpoint cannot be restored, an older one may.
    #[error("task {task}: checkpoint {id} cannot be restored: {reason}")]
    Damaged {
        /// Task.
        task: TaskId,
        /// Checkpoint.
        id: CheckpointId,
        /// What is damaged or missing.
        reason: String,
        /// The older commits the task can restore, newest first, when it looked (a restore
        /// the coordinator asked for); empty otherwise.
        restorable: Vec<CheckpointId>,
    },
    /// The request needs the stream's coordinator, which runs elsewhere.
    #[error("node {coordinator} coordinates stream {stream}, not this node")]
    NotCoordinator {
        /// Stream.
        stream: StreamId,
        /// Where its coordinator runs.
        coordinator: NodeId,
    },
    /// The stream runs without checkpoints, or the coordinator has stopped.
    #[error("stream {stream}: {reason}")]
    Unavailable {
        /// Stream.
        stream: StreamId,
        /// Why.
        reason: String,
    },
}

impl CheckpointError {
    /// Whether retrying (the next checkpoint, a restart) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CheckpointError::Store { retryable, .. } | CheckpointError::Upload { retryable, .. } => *retryable,
            CheckpointError::Timeout { .. }
            | CheckpointError::Snapshot { .. }
            | CheckpointError::Unavailable { .. } => true,
            CheckpointError::Meta { .. }
            | CheckpointError::Restore { .. }
            | CheckpointError::Damaged { .. }
            | CheckpointError::NotCoordinator { .. } => false,
        }
    }

    /// A store error on `op`.
    pub fn store(op: &'static str, e: &crate::backup::StoreError) -> Self {
        use crate::backup::StoreError as S;
        let key = match e {
            S::Unavailable { key, .. }
            | S::NotFound { key }
            | S::Corrupt { key, .. }
            | S::TooLarge { key, .. }
            | S::Denied { key, .. } => key.clone(),
            S::Config { store, .. } => store.clone(),
        };
        CheckpointError::Store { op, key, reason: e.to_string(), retryable: e.is_retryable() }
    }
}

/// What a restore did, for its error: the checkpoint it restored, or a start from nothing.
fn restoring(id: &Option<CheckpointId>) -> String {
    match id {
        Some(id) => format!("restoring checkpoint {id}"),
        None => "starting from nothing".into(),
    }
}
