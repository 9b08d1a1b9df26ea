//! Before a node's tasks restore the commit record's point: can every one of them? A task whose
//! files of that checkpoint are damaged or missing both on the node and in the store cannot, and
//! then none of the node's tasks restores it: they ask the coordinator to take the whole stream
//! back, naming the older commits every task of the node can restore.
//!
//! Invariants: checking leaves each checkpoint it found whole as a local snapshot (downloaded and
//! verified where the local one did not match), so the restore that follows reads no store; a
//! store that cannot be read is an error, never "damaged" (which would send the stream back).

use std::path::Path;

use weir_wire::{CheckpointId, StreamId, TaskId};

use super::restore::locate;
use crate::backup::Store;
use crate::backup::commit_point::CommitBook;
use crate::backup::inspect::list_commits_in;
use crate::checkpoint::driver::RestorePoint;
use crate::checkpoint::{CheckpointError, CommitRecord, RecordKind};
use crate::runtime::EngineError;

/// Where each task's files of a checkpoint are, verified: its manifest and the directory.
pub(crate) type Located = std::collections::HashMap<TaskId, (crate::backup::Manifest, std::path::PathBuf)>;

/// What the node's tasks can restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NodePoint {
    /// Every task can restore the record's point: where each one's files are (so the restore
    /// does not read and check them a second time).
    Ready(Located),
    /// Some task cannot restore `id`.
    Damaged {
        /// The record's point.
        id: CheckpointId,
        /// The older commits every task of the node can restore, newest first.
        restorable: Vec<CheckpointId>,
        /// What was found.
        reason: String,
    },
}

/// Task `t`'s restore point in `record`.
pub(crate) fn point_of(record: &CommitRecord, t: TaskId) -> Option<RestorePoint> {
    record.restore_point().map(|id| RestorePoint {
        id,
        version: record.versions.get(&t).copied(),
        manifest_crc: record.manifests.get(&t).copied(),
    })
}

/// A task of this node cannot restore a commit: its files are damaged here and in the store.
/// Fatal for that commit (an older one may do).
#[derive(Debug, Clone, thiserror::Error)]
#[error("task {task}: {reason}")]
struct Unrestorable {
    task: TaskId,
    reason: String,
}

/// Where every task in `tasks` finds its files of `record`'s point, or what the first that
/// cannot found.
fn locate_all(
    store: &dyn Store,
    stream: StreamId,
    data: &Path,
    tasks: &[TaskId],
    record: &CommitRecord,
) -> Result<Result<Located, Unrestorable>, EngineError> {
    let mut found = Located::new();
    for t in tasks {
        let Some(point) = point_of(record, *t) else { return Ok(Ok(found)) };
        match locate(store, stream, *t, data, point) {
            Ok(at) => {
                found.insert(*t, at);
            }
            Err(CheckpointError::Damaged { reason, .. }) => return Ok(Err(Unrestorable { task: *t, reason })),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Ok(found))
}

/// Checks that the node's `tasks` can restore `record`'s point; if not, finds the older commits
/// they all can.
pub(crate) fn check_node(
    store: &dyn Store,
    stream: StreamId,
    data: &Path,
    tasks: &[TaskId],
    record: &CommitRecord,
    book: &dyn CommitBook,
) -> Result<NodePoint, EngineError> {
    let Some(id) = record.restore_point() else { return Ok(NodePoint::Ready(Located::new())) };
    let reason = match locate_all(store, stream, data, tasks, record)? {
        Ok(found) => return Ok(NodePoint::Ready(found)),
        Err(why) => why.to_string(),
    };
    tracing::warn!(stream = %stream, checkpoint = %id, %reason, "this node cannot restore the last commit; looking for older ones");
    let restorable = restorable_below(store, book, stream, data, tasks, record.id, id)?;
    Ok(NodePoint::Damaged { id, restorable, reason })
}

/// The restore points of the commit records older than record `below_record`, and below
/// checkpoint `below`, that every task in `tasks` can restore, newest first (never past a recorded
/// start from nothing: what is older belongs to an earlier life of the stream). Each is left whole
/// as a local snapshot. Only the commits `book` lists count.
pub(crate) fn restorable_below(
    store: &dyn Store,
    book: &dyn CommitBook,
    stream: StreamId,
    data: &Path,
    tasks: &[TaskId],
    below_record: CheckpointId,
    below: CheckpointId,
) -> Result<Vec<CheckpointId>, EngineError> {
    let listed = book.commits(store).map_err(|e| EngineError::Store(e.to_string()))?;
    let records = list_commits_in(store, stream, listed.as_deref()).map_err(|e| EngineError::Store(e.to_string()))?;
    let mut out = Vec::new();
    for r in records.iter().rev().filter(|r| r.id < below_record) {
        if r.kind == RecordKind::Fresh {
            break;
        }
        let Some(q) = r.restore_point().filter(|q| *q < below && !out.contains(q)) else { continue };
        match locate_all(store, stream, data, tasks, r)? {
            Ok(_) => out.push(q),
            Err(why) => {
                tracing::warn!(stream = %stream, checkpoint = %q, reason = %why, "this node cannot restore it either")
            }
        }
    }
    Ok(out)
}
