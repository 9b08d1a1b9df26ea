//! A restore at other parallelism than the checkpoint's (`weir stream rescale`): each new agg
//! takes the window entries of the keys it owns from the old aggs' snapshots, each new sink the
//! results of the old sink of its index, and the sources restore their offsets with no replay.
//!
//! Invariants:
//! - Keys go to aggs by [`shuffle`], which cuts the key hash's range into equal contiguous
//!   parts: a new agg reads only the old aggs whose part overlaps its own (Flink's key groups,
//!   with the hash's range as the groups), and keeps the keys that are its own.
//! - Only a savepoint restores this way: an old agg whose manifest names a replay point is
//!   refused (the rows of its named windows would have to come again for keys now elsewhere).
//! - A new agg's progress per upstream is the largest of the old aggs' it reads: no window an
//!   old agg had emitted opens again for a late row (its result would replace the full one).
//!   Row counters are counted once, by the new agg where each old agg's part begins.
//! - New tasks have ids the stream never used (`StreamSpec::first_agg_task`): old and new
//!   tasks' files, column families and store keys cannot be mistaken for each other.

use std::ops::Range;
use std::path::{Path, PathBuf};

use weir_wire::TaskId;

use super::port::PortCtx;
use super::restore::task_dir;
use crate::backup::{Manifest, download_files, fetch_manifest};
use crate::checkpoint::driver::RestorePoint;
use crate::checkpoint::{CheckpointError, CommitRecord, Shape};
use crate::runtime::task::{AggTask, SinkTask};
use crate::spec::shuffle;
use crate::state::{TaskStore, scan_window_state};

/// The checkpoint a restore reads and the shape it was taken at, when that differs from the
/// stream's now.
#[derive(Clone, Debug)]
pub(crate) struct Rescale {
    /// The commit record of the checkpoint (its manifests' checksums).
    pub(crate) record: CommitRecord,
    /// The aggs and sinks it was taken with.
    pub(crate) old: Shape,
}

/// Whether restoring `point` is a rescale: its commit record is a savepoint's of another shape
/// than `now`. One that cannot be (new ids among the old ones, another number of sinks) is
/// refused, and the node's copies of the old aggs' and sinks' files go (no one's now: a node's
/// results are its sinks' stores, and an old one would answer twice).
pub(crate) fn of(c: &PortCtx, point: RestorePoint, now: Shape) -> Result<Option<Rescale>, CheckpointError> {
    let failed = |reason: String| CheckpointError::Restore { task: c.task, id: Some(point.id), reason };
    let record = crate::backup::commit::read_commit(c.store.as_ref(), c.stream, point.id)
        .map_err(|e| failed(format!("reading the commit record: {e}")))?;
    let Some(record) = record else { return Ok(None) };
    if record.shape.is_none()
        && matches!(record.kind, crate::checkpoint::RecordKind::Commit(_))
        && !record.manifests.contains_key(&c.task)
    {
        return Err(failed(format!(
            "checkpoint {} was taken with other tasks (none is {}) and is no savepoint: a stream restores at other \
             parallelism from a savepoint only (`weir stream pause` takes one)",
            point.id, c.task
        )));
    }
    let Some(old) = record.shape.filter(|s| *s != now) else { return Ok(None) };
    let ids = |s: Shape| s.agg_tasks().chain(s.sink_tasks()).collect::<std::collections::BTreeSet<_>>();
    if !record.savepoint {
        return Err(failed(format!("checkpoint {} is no savepoint: it cannot restore at other parallelism", point.id)));
    }
    if ids(old).intersection(&ids(now)).next().is_some() {
        return Err(failed(format!(
            "the stream's aggs and sinks now take task ids its checkpoint {} used (first_agg_task must be past {})",
            point.id,
            old.first_agg.0 + old.aggs + old.sinks - 1
        )));
    }
    if old.sinks != now.sinks {
        return Err(failed(format!(
            "checkpoint {} has {} sinks, the stream {}: a rescale of the sinks is not built",
            point.id, old.sinks, now.sinks
        )));
    }
    for t in ids(old) {
        let dir = task_dir(&c.data, t);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(task = %t, error = %e, "cannot remove an old task's files after a rescale");
        }
    }
    Ok(Some(Rescale { record, old }))
}

/// The old parts (of `old_n`) that overlap new part `j` of `new_n` (one more at each end at
/// most: the keys are filtered anyway).
pub(crate) fn overlapping(j: u32, new_n: u32, old_n: u32) -> Range<u32> {
    let (j, new_n, old_n) = (u64::from(j), u64::from(new_n.max(1)), u64::from(old_n));
    let lo = (j * old_n / new_n).saturating_sub(1);
    let hi = ((j + 1) * old_n / new_n + 1).min(old_n);
    lo as u32..hi as u32
}

/// Whether new part `j` of `new_n` counts old part `i` of `old_n`'s counters: the new part
/// holding the old part's first hash.
fn counts(i: u32, old_n: u32, j: u32, new_n: u32) -> bool {
    let first = (u64::from(i) << 32).div_ceil(u64::from(old_n.max(1)));
    ((first * u64::from(new_n)) >> 32) as u32 == j
}

/// Where a new task puts the old tasks' files while it reads them.
fn scratch(c: &PortCtx) -> PathBuf {
    task_dir(&c.data, c.task).join("rescale")
}

/// Task `old`'s manifest and files of the checkpoint, downloaded into `dir`.
fn fetch(c: &PortCtx, r: &Rescale, old: TaskId, dir: &Path) -> Result<Manifest, CheckpointError> {
    let id = r.record.id;
    let failed = |why: String| CheckpointError::Restore {
        task: c.task,
        id: Some(id),
        reason: format!("reading task {old} of the checkpoint (a rescale): {why}"),
    };
    let crc = r.record.manifests.get(&old).copied();
    let m = fetch_manifest(c.store.as_ref(), c.stream, old, id, crc).map_err(|e| failed(e.to_string()))?;
    download_files(c.store.as_ref(), &m, dir).map_err(|e| failed(e.to_string()))?;
    Ok(m)
}

/// Restores agg `a`, part `index` of `aggs`, from the old aggs' snapshots of `r`'s checkpoint.
pub(crate) fn restore_agg(
    a: &mut AggTask,
    c: &PortCtx,
    r: &Rescale,
    index: u32,
    aggs: u32,
) -> Result<(), CheckpointError> {
    let id = r.record.id;
    let failed = |reason: String| CheckpointError::Restore { task: c.task, id: Some(id), reason };
    let root = scratch(c);
    let _ = std::fs::remove_dir_all(&root);
    let ups = a.agg.progress().len();
    let mut progress: Vec<Option<i64>> = vec![None; ups];
    let (mut late, mut rows) = (0u64, 0u64);
    let mut windows = std::collections::BTreeSet::new();
    let mut entries = Vec::new();
    for i in overlapping(index, aggs, r.old.aggs) {
        let old = TaskId(r.old.first_agg.0 + i);
        let dir = root.join(old.0.to_string());
        let m = fetch(c, r, old, &dir)?;
        if m.replay.is_some() {
            return Err(failed(format!(
                "checkpoint {id} is no savepoint (agg {old} names windows whose rows its sources would send \
                 again): a stream restores at other parallelism from a savepoint only (`weir stream pause` takes one)"
            )));
        }
        if dir.join("CURRENT").is_file() {
            return Err(failed(format!(
                "agg {old} spilled window state to disk (`state_budget`): a rescale of spilled state is not built"
            )));
        }
        let store = TaskStore::open_from_state_files(&dir, &root.join(format!("db-{}", old.0)))
            .map_err(|e| failed(e.to_string()))?;
        let counted = counts(i, r.old.aggs, index, aggs);
        let mut bad = None;
        scan_window_state(
            &store,
            |meta, _| {
                if meta.progress.len() != ups {
                    bad = Some(format!("agg {old} had {} upstreams, this one {ups}", meta.progress.len()));
                    return Ok(());
                }
                for (p, q) in progress.iter_mut().zip(&meta.progress) {
                    *p = (*p).max(*q);
                }
                if counted {
                    (late, rows) = (late + meta.late_rows, rows + meta.rows);
                }
                windows.extend(meta.windows.iter().flatten().copied());
                Ok(())
            },
            |start, key, acc| {
                if shuffle(key, aggs as usize) == index as usize {
                    entries.push((start, key, acc));
                }
            },
        )
        .map_err(|e| failed(e.to_string()))?;
        if let Some(why) = bad {
            return Err(failed(why));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    tracing::info!(task = %c.task, checkpoint = %id, from = r.old.aggs, to = aggs, entries = entries.len(),
        "restoring the keys this agg owns from the old aggs (a rescale)");
    a.agg.restore(entries, &progress, late, rows).map_err(|e| failed(e.to_string()))?;
    a.agg.reopen(&windows.into_iter().collect::<Vec<_>>(), 0);
    a.agg.set_checkpoint(id.0);
    a.agg.write_all();
    a.agg.clear_spill();
    a.spill = None;
    a.replay.restore_full(id.0);
    a.agg.hold(false);
    Ok(())
}

/// Restores sink `s`, part `index`, from the old sink of that index (results go to sinks by
/// key hash too: the same index holds the same keys while the number of sinks stays).
pub(crate) fn restore_sink(s: &mut SinkTask, c: &PortCtx, r: &Rescale, index: u32) -> Result<(), CheckpointError> {
    let id = r.record.id;
    let failed = |reason: String| CheckpointError::Restore { task: c.task, id: Some(id), reason };
    let old = r.old.sink_tasks().nth(index as usize).ok_or_else(|| {
        failed(format!("the checkpoint has {} sinks: a rescale to more sinks is not built", r.old.sinks))
    })?;
    let dir = scratch(c).join(old.0.to_string());
    let m = fetch(c, r, old, &dir)?;
    super::restore::sink_format_readable(m.format).map_err(|e| failed(e.to_string()))?;
    s.store.restore_from(&dir).map_err(|e| failed(e.to_string()))?;
    let _ = std::fs::remove_dir_all(scratch(c));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_agg_reads_only_the_old_aggs_whose_keys_it_may_own() {
        for (old_n, new_n) in [(2u32, 5u32), (5, 1), (1, 5), (3, 7), (7, 3), (4, 4), (64, 3)] {
            let mut counted = vec![0u32; old_n as usize];
            for j in 0..new_n {
                let read = overlapping(j, new_n, old_n);
                assert!(read.len() as u32 <= old_n.div_ceil(new_n) + 2, "{old_n}->{new_n}: {read:?}");
                for (i, c) in counted.iter_mut().enumerate() {
                    if counts(i as u32, old_n, j, new_n) {
                        assert!(
                            read.contains(&(i as u32)),
                            "{old_n}->{new_n}: new {j} counts old {i} it does not read"
                        );
                        *c += 1;
                    }
                }
            }
            assert!(counted.iter().all(|c| *c == 1), "{old_n}->{new_n}: each old agg counted once: {counted:?}");
            // Every key's new agg reads its old agg.
            for key in 0..20_000u64 {
                let (i, j) = (shuffle(key, old_n as usize) as u32, shuffle(key, new_n as usize) as u32);
                assert!(overlapping(j, new_n, old_n).contains(&i), "key {key}: {old_n}->{new_n}");
            }
        }
    }
}
