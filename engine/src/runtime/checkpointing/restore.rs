//! A task's files on its node and how they come back: where a task keeps its state store and
//! local snapshots, its meta record (the committed id), and restoring a checkpoint local-first.
//!
//! Invariants:
//! - The meta record is replaced atomically (temporary file, fsync, rename, fsync of the
//!   directory): a crash leaves the old record or the new one. A record that exists but cannot be
//!   read is an error naming the file, never "nothing committed" (which would make the consensus
//!   restore start every task from nothing).
//! - A local snapshot is used only when it matches the stored manifest file by file (size and
//!   CRC32C); otherwise the files are downloaded, verified, and take its place.
//! - Damage (a manifest or file missing or corrupt both locally and in the store) is told apart
//!   from a store that cannot be read: only damage makes the stream go back to an older commit.

use std::io::Write;
use std::path::{Path, PathBuf};

use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use crate::backup::{Manifest, Store, StoreError, download_files, fetch_manifest, local_snapshot_matches};
use crate::checkpoint::CheckpointError;
use crate::checkpoint::driver::RestorePoint;
use crate::state::TaskStore;

/// Where a task keeps its state and snapshots.
pub(crate) fn task_dir(data: &Path, t: TaskId) -> PathBuf {
    data.join("tasks").join(t.0.to_string())
}

/// The local snapshot of checkpoint `id` of task `t`.
pub(crate) fn snapshot_dir(data: &Path, t: TaskId, id: CheckpointId) -> PathBuf {
    task_dir(data, t).join("snapshots").join(format!("chk-{:020}", id.0))
}

fn meta_path(data: &Path, t: TaskId) -> PathBuf {
    task_dir(data, t).join("committed")
}

/// What task `t` last committed, from its meta record: what it brings to the consensus when
/// there is no commit record. `None` when it has no record.
pub(crate) fn read_committed(data: &Path, t: TaskId) -> Result<Option<(CheckpointId, Version)>, CheckpointError> {
    let path = meta_path(data, t);
    let err = |reason: String| CheckpointError::Meta { task: t, path: path.display().to_string(), reason };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    let mut parts = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten(), parts.next()) {
        (Some(id), Some(v), None) => Ok(Some((CheckpointId(id), Version(v)))),
        _ => Err(err(format!("not a committed-id record: {:?}", text.chars().take(40).collect::<String>()))),
    }
}

/// Records that task `t` committed `id` at offset `version`, atomically.
pub(crate) fn write_committed(
    data: &Path,
    t: TaskId,
    id: CheckpointId,
    version: Version,
) -> Result<(), CheckpointError> {
    let path = meta_path(data, t);
    let err =
        |e: std::io::Error| CheckpointError::Meta { task: t, path: path.display().to_string(), reason: e.to_string() };
    write_atomically(&path, format!("{} {}\n", id.0, version.0).as_bytes()).map_err(err)
}

/// Replaces the file at `path` with `bytes`: a crash leaves the old file or the new one.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// A task's empty state, for a start from nothing: older state and snapshots are dropped.
pub(crate) fn fresh_state(data: &Path, t: TaskId) -> Result<TaskStore, CheckpointError> {
    let db = db_dir(data, t);
    let _ = std::fs::remove_dir_all(&db);
    let _ = std::fs::remove_dir_all(task_dir(data, t).join("snapshots"));
    TaskStore::open(&db).map_err(|e| CheckpointError::Restore { task: t, id: None, reason: e.to_string() })
}

/// Where task `t`'s agg state store lives.
pub(crate) fn db_dir(data: &Path, t: TaskId) -> PathBuf {
    task_dir(data, t).join("db")
}

/// Finds checkpoint `point`'s files of task `t`, verified: the local snapshot when every file
/// matches the manifest, else downloaded from the store and checked, then put in the local
/// snapshot's place (so the restore that follows finds them there). Returns the manifest and the
/// directory. A manifest or file damaged or missing both locally and in the store is
/// [`CheckpointError::Damaged`]: this checkpoint cannot be restored, an older one may.
pub(crate) fn locate(
    store: &dyn Store,
    stream: StreamId,
    t: TaskId,
    data: &Path,
    point: RestorePoint,
) -> Result<(Manifest, PathBuf), CheckpointError> {
    let id = point.id;
    let failed = |e: StoreError| match e {
        StoreError::Corrupt { .. } | StoreError::TooLarge { .. } | StoreError::NotFound { .. } => {
            CheckpointError::Damaged { task: t, id, reason: e.to_string(), restorable: Vec::new() }
        }
        e => CheckpointError::Restore { task: t, id: Some(id), reason: e.to_string() },
    };
    let manifest = fetch_manifest(store, stream, t, id, point.manifest_crc).map_err(failed)?;
    let local = snapshot_dir(data, t, id);
    if local_snapshot_matches(&manifest, &local) {
        tracing::debug!(task = %t, checkpoint = %id, "the local snapshot matches its manifest");
        return Ok((manifest, local));
    }
    tracing::info!(task = %t, checkpoint = %id, files = manifest.files.len(), "downloading the snapshot");
    let dl = task_dir(data, t).join("restore-download");
    download_files(store, &manifest, &dl).map_err(failed)?;
    let io = |e: std::io::Error| CheckpointError::Restore { task: t, id: Some(id), reason: e.to_string() };
    if local.exists() {
        std::fs::remove_dir_all(&local).map_err(io)?;
    }
    std::fs::create_dir_all(local.parent().expect("snapshots folder")).map_err(io)?;
    std::fs::rename(&dl, &local).map_err(io)?;
    Ok((manifest, local))
}

/// Restores task `t` at `point`: [`locate`]s the checkpoint's files (unless `located` says where
/// they are, verified already), hands their directory to `open`, and returns the manifest (its
/// offset, and the files now in the store for the task's next upload).
pub(crate) fn restore_task(
    store: &dyn Store,
    stream: StreamId,
    t: TaskId,
    data: &Path,
    point: RestorePoint,
    located: Option<(Manifest, PathBuf)>,
    open: impl FnOnce(&Path, &Manifest) -> Result<(), OpenError>,
) -> Result<Manifest, CheckpointError> {
    let (manifest, dir) = match located {
        Some(at) => at,
        None => locate(store, stream, t, data, point)?,
    };
    open(&dir, &manifest).map_err(|e| CheckpointError::Restore {
        task: t,
        id: Some(point.id),
        reason: e.to_string(),
    })?;
    Ok(manifest)
}

/// Deletes task `t`'s local snapshots older than `id` (its last commit), but the `keep - 1`
/// newest of them: with the committed one, the last `keep` stay (a newer one in flight too).
pub(crate) fn delete_snapshots_before(data: &Path, t: TaskId, id: CheckpointId, keep: usize) {
    let Ok(entries) = std::fs::read_dir(task_dir(data, t).join("snapshots")) else { return };
    let mut older: Vec<(u64, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().strip_prefix("chk-")?.parse::<u64>().ok()?;
            (n < id.0).then(|| (n, e.path()))
        })
        .collect();
    older.sort_by_key(|o| std::cmp::Reverse(o.0));
    for (_, path) in older.into_iter().skip(keep.saturating_sub(1)) {
        let _ = std::fs::remove_dir_all(path);
    }
}

/// The oldest manifest format whose result store this Weir reads.
const RESULT_BLOCKS: u32 = 3;

/// Why a task could not open the files of the checkpoint it restores. Fatal for that
/// checkpoint: the same files fail the same way (the stream goes back to an older commit).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// The state files or a store in them could not be read or opened.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// An agg's snapshot does not restore.
    #[error(transparent)]
    Agg(#[from] super::agg_snapshot::AggSnapshotError),
    /// A sink's results are in a layout this Weir no longer reads.
    #[error(
        "written by an older Weir (manifest format {format}, {how}); this Weir (format {this}) keeps a sink's results \
         in blocks (format {RESULT_BLOCKS} on) and cannot restore this checkpoint's: start the stream afresh, or \
         finish it with the older Weir",
        this = crate::backup::MANIFEST_FORMAT
    )]
    SinkFormat { format: u32, how: &'static str },
}

/// Whether this Weir restores a sink's results from a manifest of `format`: `Err` names both
/// formats and what to do.
pub(crate) fn sink_format_readable(format: u32) -> Result<(), OpenError> {
    if format >= RESULT_BLOCKS {
        return Ok(());
    }
    let how = if format < 2 {
        "whose sinks kept their results on the node"
    } else {
        "whose result stores kept one entry per result"
    };
    Err(OpenError::SinkFormat { format, how })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_checkpoint_of_an_older_format_is_refused_naming_both_formats() {
        for old in [1, 2] {
            let e = sink_format_readable(old).unwrap_err().to_string();
            let this = format!("this Weir (format {})", crate::backup::MANIFEST_FORMAT);
            assert!(e.contains(&format!("manifest format {old}")) && e.contains(&this), "{e}");
        }
        assert!(sink_format_readable(3).is_ok(), "result blocks since format 3");
        assert!(sink_format_readable(crate::backup::MANIFEST_FORMAT).is_ok());
    }

    #[test]
    fn the_last_snapshots_stay_with_the_committed_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = TaskId(1);
        for n in [1, 2, 3, 4, 5, 6] {
            std::fs::create_dir_all(snapshot_dir(dir.path(), t, CheckpointId(n))).unwrap();
        }
        delete_snapshots_before(dir.path(), t, CheckpointId(5), 3);
        let mut left: Vec<String> = std::fs::read_dir(task_dir(dir.path(), t).join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let want: Vec<String> = [3, 4, 5, 6].map(|n| format!("chk-{n:020}")).into_iter().collect();
        assert_eq!(left, want, "three committed, and the one in flight");
        delete_snapshots_before(dir.path(), t, CheckpointId(6), 1);
        assert_eq!(std::fs::read_dir(task_dir(dir.path(), t).join("snapshots")).unwrap().count(), 1);
    }

    #[test]
    fn an_unreadable_committed_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = TaskId(3);
        assert_eq!(read_committed(dir.path(), t).unwrap(), None, "no record: nothing committed");
        write_committed(dir.path(), t, CheckpointId(7), Version(70)).unwrap();
        assert_eq!(read_committed(dir.path(), t).unwrap(), Some((CheckpointId(7), Version(70))));
        std::fs::write(meta_path(dir.path(), t), "7 7").unwrap();
        assert_eq!(read_committed(dir.path(), t).unwrap(), Some((CheckpointId(7), Version(7))));
        for garbage in ["", "7", "x 7", "7 7 7", "\u{0}\u{0}"] {
            std::fs::write(meta_path(dir.path(), t), garbage).unwrap();
            match read_committed(dir.path(), t) {
                Err(CheckpointError::Meta { task, path, .. }) => {
                    assert_eq!(task, t);
                    assert!(path.ends_with("tasks/3/committed"), "{path}");
                }
                other => panic!("{garbage:?} read as {other:?}"),
            }
        }
    }

    #[test]
    fn the_committed_record_is_replaced_through_a_synced_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = TaskId(1);
        write_committed(dir.path(), t, CheckpointId(1), Version(10)).unwrap();
        // A temporary file left by a crash mid-write does not change what is read.
        std::fs::write(meta_path(dir.path(), t).with_extension("tmp"), "99 99 garbage").unwrap();
        assert_eq!(read_committed(dir.path(), t).unwrap(), Some((CheckpointId(1), Version(10))));
        write_committed(dir.path(), t, CheckpointId(2), Version(20)).unwrap();
        assert_eq!(read_committed(dir.path(), t).unwrap(), Some((CheckpointId(2), Version(20))));
        let left: Vec<_> =
            std::fs::read_dir(task_dir(dir.path(), t)).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("committed")], "no temporary file stays behind");
    }
}
