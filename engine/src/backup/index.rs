//! What a task's uploads have stored: [`UploadIndex`], the SST files of its last uploaded (or
//! restored) snapshot with their keys, sizes and checksums, so the next upload sends only files
//! that are new, without reading the others again or asking the store about each.
//!
//! Invariants:
//! - SST files are stored under content keys (`sst/<stem>-<crc32c>.sst`): a file number that
//!   RocksDB hands out again after a restore to an older checkpoint names a new key, and never
//!   overwrites a file that a retained checkpoint names.
//! - An entry is valid for one incarnation of the task's files, in which a local SST name is
//!   never reused: it is recorded only after the manifest naming it is stored, and the index is
//!   replaced by the restored manifest's files whenever the task restores.
//! - It survives restarts as that manifest: a task that restores a checkpoint starts with the
//!   manifest's SST files, checked against one listing of the store ([`UploadIndex::check`]), so a
//!   file deleted from the store meanwhile is sent again.
//! - Files stored ahead of a checkpoint (see [`super::ahead`]) are known apart, as `ahead`, from
//!   when the task's ahead record names them until a stored manifest does: the record keeps
//!   retention off them meanwhile. A restore or a fresh start drops them with the rest.
//! - A checkpoint's upload holds the index only to copy what it knows and to claim the files it
//!   will store ([`UploadIndex::begin_upload`]), then to take its manifest in: files stored ahead
//!   skip what it claimed, and while an upload is in flight no entry stored ahead is forgotten
//!   for its file no longer being live (the upload's copy may name it in the manifest it
//!   stores). Uploads take their manifests in by checkpoint: an earlier one that ends last
//!   leaves the index as it is.

use std::collections::HashMap;

use weir_wire::{StreamId, TaskId};

use super::snapshot::task_prefix;
use super::{Manifest, ManifestEntry, Store, StoreError};

/// The store key of SST file `name` with checksum `crc`, of the task whose key prefix is `prefix`.
pub(crate) fn sst_key(prefix: &str, name: &str, crc: u32) -> String {
    let stem = name.strip_suffix(".sst").unwrap_or(name);
    format!("{prefix}/sst/{stem}-{crc:08x}.sst")
}

/// SST files known to be in the store: local name → entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadIndex {
    files: HashMap<String, ManifestEntry>,
    /// Stored ahead of a checkpoint, named by the task's ahead record, by no manifest yet.
    ahead: HashMap<String, ManifestEntry>,
    /// Files the checkpoint uploads in flight store (local name → uploads storing it).
    claimed: HashMap<String, usize>,
    /// Checkpoint uploads in flight.
    uploading: usize,
    /// The checkpoint whose manifest `files` are: an upload of an earlier one (abandoned, and
    /// finished late) does not replace them.
    of: Option<weir_wire::CheckpointId>,
}

impl UploadIndex {
    /// An index that knows nothing (every SST file goes up).
    pub fn new() -> Self {
        Self::default()
    }

    /// The SST files `manifest` names (what is stored once its checkpoint is).
    pub fn from_manifest(manifest: &Manifest) -> Self {
        let files =
            manifest.files.iter().filter(|f| f.name.ends_with(".sst")).map(|f| (f.name.clone(), f.clone())).collect();
        Self { files, of: Some(manifest.id), ..Self::default() }
    }

    /// The index after `manifest` (of this task's files) is stored: its SST files, and the files
    /// stored ahead that it does not name (flushed after its checkpoint was taken). A manifest
    /// of a checkpoint before the one the index holds changes nothing: the later one names every
    /// file of it that is still live.
    pub(crate) fn accept(&mut self, manifest: &Manifest) {
        if self.of.is_some_and(|of| manifest.id < of) {
            return;
        }
        let next = Self::from_manifest(manifest);
        (self.files, self.of) = (next.files, next.of);
        self.ahead.retain(|name, _| !self.files.contains_key(name));
    }

    /// A checkpoint's upload begins, storing `names` (the local SST files it does not know):
    /// they are claimed until [`Self::end_upload`] with the same names.
    pub(crate) fn begin_upload(&mut self, names: &[String]) {
        self.uploading += 1;
        names.iter().for_each(|n| *self.claimed.entry(n.clone()).or_default() += 1);
    }

    /// The upload that [`Self::begin_upload`] began with `names` has ended (stored or failed).
    pub(crate) fn end_upload(&mut self, names: &[String]) {
        debug_assert!(self.uploading > 0, "an upload ends that did not begin");
        self.uploading -= 1;
        for n in names {
            if let Some(c) = self.claimed.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    self.claimed.remove(n);
                }
            }
        }
    }

    /// Whether local file `name` of `size` bytes is for the upload-ahead thread to store: not
    /// known, and no upload in flight stores it.
    pub(crate) fn to_store_ahead(&self, name: &str, size: u64) -> bool {
        self.get(name, size).is_none() && !self.is_claimed(name)
    }

    /// Whether a checkpoint's upload in flight stores local file `name`.
    pub(crate) fn is_claimed(&self, name: &str) -> bool {
        self.claimed.contains_key(name)
    }

    /// Whether a checkpoint's upload is in flight.
    pub(crate) fn uploading(&self) -> bool {
        self.uploading > 0
    }

    /// The stored entry of local file `name` of `size` bytes, if known.
    pub(crate) fn get(&self, name: &str, size: u64) -> Option<&ManifestEntry> {
        self.files.get(name).or_else(|| self.ahead.get(name)).filter(|e| e.size == size)
    }

    /// Records a file stored ahead (once the task's ahead record names it).
    pub(crate) fn insert_ahead(&mut self, entry: ManifestEntry) {
        self.ahead.insert(entry.name.clone(), entry);
    }

    /// Forgets the files stored ahead that `keep` refuses (no longer live: never to be named).
    pub(crate) fn retain_ahead(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.ahead.retain(|name, _| keep(name));
    }

    /// The store keys of the files stored ahead, sorted (what the ahead record must name).
    pub(crate) fn ahead_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.ahead.values().map(|e| e.key.clone()).collect();
        keys.sort();
        keys
    }

    /// Files known (named by a manifest, or stored ahead).
    pub fn len(&self) -> usize {
        self.files.len() + self.ahead.len()
    }

    /// Whether no file is known.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.ahead.is_empty()
    }

    /// Keeps only the entries whose keys the store lists under the task's `sst/` folder (one
    /// listing); returns how many were dropped.
    pub fn check(&mut self, store: &dyn Store, stream: StreamId, task: TaskId) -> Result<usize, StoreError> {
        if self.is_empty() {
            return Ok(0);
        }
        let listed: std::collections::HashSet<String> =
            store.list(&format!("{}/sst/", task_prefix(stream, task)))?.into_iter().collect();
        let before = self.len();
        self.files.retain(|_, e| listed.contains(&e.key));
        self.ahead.retain(|_, e| listed.contains(&e.key));
        Ok(before - self.len())
    }
}

#[cfg(test)]
mod tests {
    use weir_wire::{CheckpointId, Version};

    use super::*;

    fn entry(name: &str) -> ManifestEntry {
        ManifestEntry { name: name.into(), key: format!("1/tasks/4/sst/{name}"), size: 10, crc: 1 }
    }

    fn manifest(id: u64, names: &[&str]) -> Manifest {
        Manifest {
            format: super::super::MANIFEST_FORMAT,
            id: CheckpointId(id),
            version: Version(0),
            files: names.iter().map(|n| entry(n)).collect(),
            offsets: Vec::new(),
            outputs: Vec::new(),
            replay: None,
        }
    }

    #[test]
    fn an_earlier_checkpoints_upload_that_ends_last_leaves_the_index_as_the_later_one_made_it() {
        let mut idx = UploadIndex::new();
        idx.insert_ahead(entry("000009.sst"));
        idx.accept(&manifest(2, &["000007.sst", "000008.sst"]));
        idx.accept(&manifest(1, &["000006.sst", "000009.sst"]));
        assert!(idx.get("000008.sst", 10).is_some() && idx.get("000006.sst", 10).is_none());
        assert_eq!(idx.ahead_keys(), ["1/tasks/4/sst/000009.sst"], "still stored ahead, as far as it knows");
        idx.accept(&manifest(3, &["000009.sst"]));
        assert!(idx.get("000007.sst", 10).is_none() && idx.ahead_keys().is_empty());
    }

    #[test]
    fn a_file_two_uploads_claim_stays_claimed_until_both_end() {
        let mut idx = UploadIndex::new();
        let (a, b) = (vec!["000007.sst".to_string()], vec!["000007.sst".to_string(), "000008.sst".to_string()]);
        idx.begin_upload(&a);
        idx.begin_upload(&b);
        idx.end_upload(&a);
        assert!(idx.uploading() && idx.is_claimed("000007.sst") && idx.is_claimed("000008.sst"));
        idx.end_upload(&b);
        assert!(!idx.uploading() && !idx.is_claimed("000007.sst") && !idx.is_claimed("000008.sst"));
    }
}
