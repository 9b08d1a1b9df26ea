//! Retention: keeps the last K committed checkpoints in the store and collects everything else —
//! older commit records, their checkpoint folders, shared SST files no kept checkpoint names, and
//! the leftovers of failed checkpoints.
//!
//! Collection runs beside checkpoints (it never holds one up), so it must never delete what a
//! checkpoint in flight, or a commit it has not seen yet, needs. The rules:
//! - Kept: the K newest commit records that decode, and every checkpoint folder whose id is one
//!   of theirs, one they restore (a fallback record's older checkpoint), or above the newest of
//!   them (in flight, or committed after the listing).
//! - An SST file is kept when a manifest in a kept folder names it. One no manifest names is
//!   deleted only when the previous pass found it unnamed too ([`Collector`] remembers): an upload
//!   in flight stores its files before its manifest, and a checkpoint lasts less than the time
//!   between two passes that both see it unnamed (passes run after commits; one checkpoint is in
//!   flight at a time, so its files are named by its manifest by the next commit, or garbage).
//! - An SST file stored ahead of a checkpoint (`super::ahead`) is named by its task's ahead
//!   record until a stored manifest names it; the records are read before the listing.
//! - A file an upload skipped (already stored) is in the task's upload index: named by an ahead
//!   record (above), by the manifest of the task's latest checkpoint uploaded (a folder above the newest
//!   commit, kept, or a commit since), or by that of the checkpoint it restored (a restore point
//!   is a kept commit, or the one a kept fallback record goes back to).

use std::collections::{BTreeMap, BTreeSet};

use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use super::commit::{Point, decode_commit, is_listed};
use super::floor::Needs;
use super::{Manifest, Store, StoreError};

/// How a pass runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectOptions {
    /// Commits kept (at least one).
    pub keep: usize,
    /// Delete nothing: only say what would go.
    pub dry_run: bool,
    /// The stream is not running (no checkpoint in flight): an SST file no kept checkpoint
    /// names is garbage now, not only at the next pass.
    pub stopped: bool,
    /// The commits a control store lists (`commit_point`; `None`: every record counts): a
    /// record counts only as listed; records above the newest are neither counted nor deleted
    /// (in flight), others it does not list go as damaged ones do.
    pub listed: Option<Vec<Point>>,
    /// The running stream's incarnation: ahead records of older runs go (a run relies only on
    /// its own; an old run's, rewritten by a node that was paused, goes again at a later pass).
    /// 0: none goes.
    pub ahead_runs_below: u64,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Every key deleted (or, in a dry run, to delete), commit records first.
    pub deleted: Vec<String>,
    /// The commits kept, oldest first.
    pub kept: Vec<CheckpointId>,
    /// Commit records deleted.
    pub commits_deleted: usize,
    /// Other objects deleted (checkpoint folders' files, SST files).
    pub objects_deleted: usize,
    /// Unnamed SST files seen for the first time, deleted by the next pass if still unnamed.
    pub pending: usize,
    /// The lowest source offset a restore of any kept point reads, by task (`super::floor`);
    /// `None` when the pass could not read every kept manifest.
    pub floors: Option<BTreeMap<TaskId, Version>>,
}

/// Collects one stream's garbage, pass after pass.
#[derive(Debug, Default)]
pub struct Collector {
    /// SST keys the last pass found unnamed.
    unnamed: BTreeSet<String>,
}

/// `<stream>/tasks/<task>/chk-<id>/…` → id.
fn chk_id(key: &str) -> Option<CheckpointId> {
    let part = key.split('/').nth(3)?;
    part.strip_prefix("chk-")?.parse().ok().map(CheckpointId)
}

/// `<stream>/tasks/<task>/…` → task.
fn task_of(key: &str) -> Option<TaskId> {
    key.split('/').nth(2)?.parse().ok().map(TaskId)
}

fn is_sst(key: &str) -> bool {
    key.split('/').nth(3) == Some("sst")
}

impl Collector {
    /// A collector that has seen nothing (its first pass deletes no unnamed SST file).
    pub fn new() -> Self {
        Self::default()
    }

    /// One pass over `stream`, keeping the `keep` newest commits (at least one), beside a
    /// running stream.
    pub fn collect(&mut self, store: &dyn Store, stream: StreamId, keep: usize) -> Result<Collected, StoreError> {
        self.collect_with(
            store,
            stream,
            CollectOptions { keep, dry_run: false, stopped: false, listed: None, ahead_runs_below: 0 },
        )
    }

    /// One pass with `opts`.
    pub fn collect_with(
        &mut self,
        store: &dyn Store,
        stream: StreamId,
        opts: CollectOptions,
    ) -> Result<Collected, StoreError> {
        let keep = opts.keep.max(1);
        let mut out = Collected::default();
        let records = store.list(&format!("{}/checkpoints/", stream.0))?;
        // Newest first; a record that does not decode neither counts nor is kept once older
        // than the newest kept one.
        let mut good: Vec<(CheckpointId, String)> = Vec::new();
        // The checkpoint each record restores (a fallback record's is an older one).
        let mut points: BTreeMap<CheckpointId, CheckpointId> = BTreeMap::new();
        let mut damaged = Vec::new();
        let mut needs = Needs::new();
        // Records older than the `keep`th good one go whatever they hold: not read (a pass
        // after a burst of commits would otherwise read every one of them).
        let mut older = Vec::new();
        for key in records.iter().rev() {
            let newest = opts.listed.as_ref().map(|l| l.last().map_or(CheckpointId(0), |p| p.id));
            if newest.is_some_and(|n| decode_id(key).is_none_or(|id| id > n)) {
                continue; // no commit (yet): whatever it names stays, as a checkpoint in flight's
            }
            if good.len() == keep {
                older.push(key.clone());
                continue;
            }
            let bytes = store.get_at_most(key, super::MAX_RECORD);
            if let (Some(l), Ok(b)) = (&opts.listed, &bytes)
                && !is_listed(l, key, b)
            {
                damaged.push(key.clone()); // never committed, or not as committed
                continue;
            }
            match bytes.map(|b| decode_commit(key, &b)) {
                Ok(Ok(r)) => {
                    match r.restore_point() {
                        Some(p) => {
                            points.insert(r.id, p);
                            needs.point(p, &r.versions);
                        }
                        None => needs.fresh(),
                    }
                    good.push((r.id, key.clone()))
                }
                Ok(Err(_)) | Err(StoreError::TooLarge { .. }) => damaged.push(key.clone()),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if good.is_empty() {
            return Ok(out); // nothing committed: nothing is garbage yet
        }
        let kept: BTreeSet<CheckpointId> = good.iter().take(keep).map(|(id, _)| *id).collect();
        let newest = *kept.last().expect("one at least");
        let oldest = *kept.first().expect("one at least");
        // A kept fallback record keeps the checkpoint it goes back to.
        let restored: BTreeSet<CheckpointId> = kept.iter().filter_map(|id| points.get(id).copied()).collect();
        let is_kept = |id: CheckpointId| kept.contains(&id) || restored.contains(&id) || id > newest;
        // The files stored ahead of a manifest, read before the listing: a file the listing
        // finds that a record no longer names is named by a manifest the listing finds too (a
        // record lets a file go only after a stored manifest names it). A stopped stream's
        // records name nothing that any checkpoint will.
        let mut named = BTreeSet::new();
        let (old_runs, records_ahead): (Vec<String>, Vec<String>) = store
            .list(&format!("{}/ahead/", stream.0))?
            .into_iter()
            .partition(|k| super::ahead::record_incarnation(k) < opts.ahead_runs_below);
        for key in &records_ahead {
            if opts.stopped {
                break;
            }
            match store.get_at_most(key, super::MAX_RECORD) {
                Ok(bytes) => match super::ahead::decode_record(key, &bytes) {
                    Ok(keys) => named.extend(keys),
                    // A damaged record names nothing we can read: keep every SST this pass.
                    Err(_) => return Ok(Collected { kept: kept.into_iter().collect(), ..out }),
                },
                Err(StoreError::TooLarge { .. }) => return Ok(Collected { kept: kept.into_iter().collect(), ..out }),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Every object of the stream's tasks, and which SST files the kept folders' manifests name.
        let objects = store.list(&format!("{}/tasks/", stream.0))?;
        for key in objects.iter().filter(|k| k.ends_with("/MANIFEST.weir")) {
            let Some(id) = chk_id(key).filter(|id| is_kept(*id)) else { continue };
            match store.get_at_most(key, super::MAX_RECORD) {
                Ok(bytes) => match Manifest::decode(key, &bytes) {
                    Ok(m) => {
                        named.extend(m.files.iter().map(|f| f.key.clone()));
                        if let Some(task) = task_of(key) {
                            needs.manifest(id, task, m);
                        }
                    }
                    // A damaged manifest names nothing we can read: keep every SST this pass.
                    Err(_) => return Ok(Collected { kept: kept.into_iter().collect(), ..out }),
                },
                Err(StoreError::TooLarge { .. }) => return Ok(Collected { kept: kept.into_iter().collect(), ..out }),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut unnamed = BTreeSet::new();
        let mut delete: BTreeMap<String, bool> = BTreeMap::new(); // key → is a commit record
        for key in &objects {
            if is_sst(key) {
                if !named.contains(key) {
                    if opts.stopped || self.unnamed.contains(key) {
                        delete.insert(key.clone(), false);
                    } else {
                        unnamed.insert(key.clone());
                    }
                }
            } else if let Some(id) = chk_id(key)
                && !is_kept(id)
            {
                delete.insert(key.clone(), false);
            }
        }
        for (id, key) in &good {
            if !kept.contains(id) {
                delete.insert(key.clone(), true);
            }
        }
        delete.extend(older.into_iter().map(|k| (k, true)));
        if opts.stopped {
            delete.extend(records_ahead.into_iter().map(|k| (k, false)));
        }
        delete.extend(old_runs.into_iter().map(|k| (k, false)));
        for key in damaged {
            if decode_id(&key).is_some_and(|id| id < oldest) {
                delete.insert(key, true);
            }
        }
        // Commit records first: a checkpoint whose record is gone is no restore point, so
        // deleting its files afterwards can never leave a commit that names missing files.
        let (records, files): (Vec<_>, Vec<_>) = delete.into_iter().partition(|(_, is_record)| *is_record);
        let records: Vec<String> = records.into_iter().map(|(k, _)| k).collect();
        let files: Vec<String> = files.into_iter().map(|(k, _)| k).collect();
        if !opts.dry_run {
            store.delete_many(&records)?;
            store.delete_many(&files)?;
        }
        out.commits_deleted = records.len();
        out.objects_deleted = files.len();
        out.deleted = records.into_iter().chain(files).collect();
        out.pending = unnamed.len();
        if !opts.dry_run {
            self.unnamed = unnamed;
        }
        out.kept = kept.into_iter().collect();
        out.floors = Some(needs.floors());
        Ok(out)
    }
}

/// The id in a commit record's key (`<stream>/checkpoints/<id>.commit`).
fn decode_id(key: &str) -> Option<CheckpointId> {
    key.rsplit('/').next()?.strip_suffix(".commit")?.parse().ok().map(CheckpointId)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::commit::{commit_key, encode_commit};
    use crate::backup::{LocalDirStore, ManifestEntry, ahead};
    use crate::checkpoint::CommitRecord;
    use weir_wire::Version;

    const S: StreamId = StreamId(1);

    /// Checkpoint `id` of task 0 naming `ssts`, with its commit record when `committed`.
    fn checkpoint(store: &dyn Store, id: u64, ssts: &[&str], committed: bool) {
        let files = ssts
            .iter()
            .map(|s| {
                let key = format!("1/tasks/0/sst/{s}");
                store.put(&key, s.as_bytes()).unwrap();
                ManifestEntry { name: s.to_string(), key, size: s.len() as u64, crc: 0 }
            })
            .collect();
        store.put(&format!("1/tasks/0/chk-{id}/OPTIONS"), b"o").unwrap();
        let m = Manifest {
            format: crate::backup::MANIFEST_FORMAT,
            id: CheckpointId(id),
            version: Version(id),
            files,
            offsets: Vec::new(),
            outputs: Vec::new(),
            replay: None,
        };
        store.put(&format!("1/tasks/0/chk-{id}/MANIFEST.weir"), m.encode().as_bytes()).unwrap();
        if committed {
            let r = CommitRecord::consensus(CheckpointId(id), CheckpointId(id), 0);
            store.put(&commit_key(S, CheckpointId(id)), encode_commit(&r).as_bytes()).unwrap();
        }
    }

    fn keys(store: &dyn Store) -> Vec<String> {
        store.list("1/").unwrap()
    }

    #[test]
    fn the_last_commits_and_what_they_name_are_kept_and_the_rest_collected() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        checkpoint(&store, 1, &["a.sst", "b.sst"], true);
        checkpoint(&store, 2, &["b.sst", "c.sst"], false); // failed: leftovers
        checkpoint(&store, 3, &["b.sst", "d.sst"], true);
        checkpoint(&store, 4, &["d.sst", "e.sst"], true);
        let mut c = Collector::new();
        let first = c.collect(&store, S, 2).unwrap();
        assert_eq!(first.kept, vec![CheckpointId(3), CheckpointId(4)]);
        assert_eq!(first.commits_deleted, 1);
        // Task 0's offset is its checkpoint's id: the oldest kept point reads from 3.
        assert_eq!(first.floors, Some([(TaskId(0), Version(3))].into()));
        let k = keys(&store);
        assert!(!k.iter().any(|k| k.contains("chk-1/") || k.contains("chk-2/")), "{k:?}");
        assert!(!k.contains(&commit_key(S, CheckpointId(1))));
        // a and c are named by nothing kept, but only a second pass deletes them.
        assert!(k.contains(&"1/tasks/0/sst/a.sst".to_string()) && first.pending == 2, "{first:?}");
        let second = c.collect(&store, S, 2).unwrap();
        assert_eq!(second.objects_deleted, 2, "{second:?}");
        let k = keys(&store);
        for sst in ["b", "d", "e"] {
            assert!(k.contains(&format!("1/tasks/0/sst/{sst}.sst")), "{sst} is named by a kept checkpoint");
        }
        assert!(!k.iter().any(|k| k.ends_with("a.sst") || k.ends_with("c.sst")), "{k:?}");
    }

    #[test]
    fn a_checkpoint_in_flight_loses_nothing_to_a_pass_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        checkpoint(&store, 1, &["a.sst"], true);
        let mut c = Collector::new();
        // Checkpoint 2 has stored its new file but not its manifest yet when two passes run.
        store.put("1/tasks/0/sst/new.sst", b"n").unwrap();
        c.collect(&store, S, 1).unwrap();
        checkpoint(&store, 2, &["a.sst", "new.sst"], false); // manifest written; no commit seen yet
        let pass = c.collect(&store, S, 1).unwrap();
        assert_eq!(pass.floors, Some([(TaskId(0), Version(1))].into()), "a checkpoint in flight sets no floor");
        let k = keys(&store);
        assert!(k.contains(&"1/tasks/0/sst/new.sst".to_string()), "{k:?}");
        assert!(k.iter().any(|k| k.contains("chk-2/MANIFEST.weir")), "a folder above the newest commit stays");
        // It commits: the next pass keeps it and collects 1.
        let r = CommitRecord::consensus(CheckpointId(2), CheckpointId(2), 0);
        store.put(&commit_key(S, CheckpointId(2)), encode_commit(&r).as_bytes()).unwrap();
        let done = c.collect(&store, S, 1).unwrap();
        assert_eq!(done.kept, vec![CheckpointId(2)]);
        assert!(!keys(&store).iter().any(|k| k.contains("chk-1/")));
    }

    #[test]
    fn a_dry_run_deletes_nothing_and_a_stopped_stream_loses_unnamed_files_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        checkpoint(&store, 1, &["a.sst"], true);
        checkpoint(&store, 2, &["b.sst"], true);
        let before = keys(&store);
        let mut c = Collector::new();
        let dry = CollectOptions { keep: 1, dry_run: true, stopped: true, listed: None, ahead_runs_below: 0 };
        let would = c.collect_with(&store, S, dry.clone()).unwrap();
        assert_eq!(keys(&store), before, "a dry run deletes nothing");
        assert!(would.deleted.contains(&"1/tasks/0/sst/a.sst".to_string()), "{would:?}");
        assert_eq!(would.deleted[0], commit_key(S, CheckpointId(1)), "records first");
        let done = c.collect_with(&store, S, CollectOptions { dry_run: false, ..dry }).unwrap();
        assert_eq!(done.deleted, would.deleted);
        assert!(!keys(&store).iter().any(|k| k.ends_with("a.sst") || k.contains("chk-1/")));
    }

    #[test]
    fn a_kept_fallback_record_keeps_the_checkpoint_it_goes_back_to() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        checkpoint(&store, 1, &["a.sst"], true);
        checkpoint(&store, 2, &["b.sst"], true);
        checkpoint(&store, 3, &["c.sst"], true); // damaged: the stream went back to 2
        let r = CommitRecord::fallback(CheckpointId(4), CheckpointId(2), 0);
        store.put(&commit_key(S, r.id), encode_commit(&r).as_bytes()).unwrap();
        let mut c = Collector::new();
        let done = c
            .collect_with(
                &store,
                S,
                CollectOptions { keep: 1, dry_run: false, stopped: true, listed: None, ahead_runs_below: 0 },
            )
            .unwrap();
        assert_eq!(done.kept, vec![CheckpointId(4)]);
        let k = keys(&store);
        assert!(k.iter().any(|k| k.contains("chk-2/MANIFEST.weir")), "{k:?}");
        assert!(k.contains(&"1/tasks/0/sst/b.sst".to_string()), "{k:?}");
        assert!(!k.iter().any(|k| k.contains("chk-1/") || k.contains("chk-3/") || k.ends_with("c.sst")), "{k:?}");
    }

    const OLD_RUN: ahead::AheadWriter = ahead::AheadWriter { incarnation: 5, node: weir_wire::NodeId(1) };

    /// A store with checkpoint 1 committed and `ahead.sst` stored ahead by `OLD_RUN`; with its
    /// record's key.
    fn stored_ahead(dir: &std::path::Path) -> (LocalDirStore, String) {
        let store = LocalDirStore::new(dir);
        checkpoint(&store, 1, &["a.sst"], true);
        let record = ahead::ahead_record_key(S, weir_wire::TaskId(0), OLD_RUN);
        store.put("1/tasks/0/sst/ahead.sst", b"x").unwrap();
        store.put(&record, ahead::encode_record(&["1/tasks/0/sst/ahead.sst".into()]).as_bytes()).unwrap();
        (store, record)
    }

    #[test]
    fn files_stored_ahead_stay_while_their_record_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let (store, record) = stored_ahead(dir.path());
        let mut c = Collector::new();
        for _ in 0..3 {
            let p = c.collect(&store, S, 1).unwrap();
            assert_eq!(p.pending, 0, "named: {p:?}");
        }
        assert!(keys(&store).contains(&"1/tasks/0/sst/ahead.sst".to_string()));
        // The record lets it go (never named, or named by a manifest since): two passes collect it.
        store.put(&record, ahead::encode_record(&[]).as_bytes()).unwrap();
        assert_eq!(c.collect(&store, S, 1).unwrap().pending, 1);
        c.collect(&store, S, 1).unwrap();
        assert!(!keys(&store).contains(&"1/tasks/0/sst/ahead.sst".to_string()));
        // A damaged record: nothing unnamed is collected.
        store.put("1/tasks/0/sst/more.sst", b"y").unwrap();
        store.put(&record, b"weir ahead 1\nkey 1/tasks/0/sst/more.sst\ncrc 00000000\n").unwrap();
        for _ in 0..3 {
            c.collect(&store, S, 1).unwrap();
        }
        assert!(keys(&store).contains(&"1/tasks/0/sst/more.sst".to_string()));
    }

    #[test]
    fn a_record_of_an_older_run_goes_with_its_files_and_a_newer_runs_record_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        // Task 0's old node was paused while the task moved: its record names ahead.sst; the
        // new node, at a newer incarnation, stored next.sst ahead.
        let (store, old) = stored_ahead(dir.path());
        let new_run = ahead::AheadWriter { incarnation: 6, node: weir_wire::NodeId(2) };
        let new = ahead::ahead_record_key(S, weir_wire::TaskId(0), new_run);
        store.put("1/tasks/0/sst/next.sst", b"z").unwrap();
        store.put(&new, ahead::encode_record(&["1/tasks/0/sst/next.sst".into()]).as_bytes()).unwrap();
        let running = CollectOptions { keep: 1, dry_run: false, stopped: false, listed: None, ahead_runs_below: 6 };
        let mut c = Collector::new();
        let first = c.collect_with(&store, S, running.clone()).unwrap();
        assert!(first.deleted.contains(&old) && !first.deleted.contains(&new), "{first:?}");
        assert_eq!(first.pending, 1, "ahead.sst, named by no record now: {first:?}");
        // The paused node wakes and writes its record again: it goes again.
        store.put(&old, ahead::encode_record(&["1/tasks/0/sst/ahead.sst".into()]).as_bytes()).unwrap();
        c.collect_with(&store, S, running.clone()).unwrap();
        c.collect_with(&store, S, running).unwrap();
        let k = keys(&store);
        assert!(!k.contains(&old) && !k.contains(&"1/tasks/0/sst/ahead.sst".to_string()), "{k:?}");
        assert!(k.contains(&new) && k.contains(&"1/tasks/0/sst/next.sst".to_string()), "{k:?}");
    }

    #[test]
    fn a_stopped_stream_collects_files_stored_ahead_and_their_record() {
        let dir = tempfile::tempdir().unwrap();
        let (store, record) = stored_ahead(dir.path());
        let stopped = CollectOptions { keep: 1, dry_run: false, stopped: true, listed: None, ahead_runs_below: 0 };
        let done = Collector::new().collect_with(&store, S, stopped).unwrap();
        assert!(done.deleted.contains(&record), "{done:?}");
        let k = keys(&store);
        assert!(!k.iter().any(|k| k.ends_with("ahead.sst") || k.contains("/ahead/")), "{k:?}");
        assert!(k.contains(&"1/tasks/0/sst/a.sst".to_string()));
    }

    #[test]
    fn without_a_commit_nothing_is_collected() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        checkpoint(&store, 1, &["a.sst"], false);
        let mut c = Collector::new();
        c.collect(&store, S, 3).unwrap();
        c.collect(&store, S, 3).unwrap();
        assert_eq!(keys(&store).len(), 3);
    }
}
