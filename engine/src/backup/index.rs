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
        Self { files, ahead: HashMap::new() }
    }

    /// The index after `manifest` (of this task's files) is stored: its SST files, and the files
    /// stored ahead that it does not name (flushed after its checkpoint was taken).
    pub(crate) fn accept(&mut self, manifest: &Manifest) {
        let mut next = Self::from_manifest(manifest);
        next.ahead = std::mem::take(&mut self.ahead);
        next.ahead.retain(|name, _| !next.files.contains_key(name));
        *self = next;
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
