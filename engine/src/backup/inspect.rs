//! Reading a store's checkpoints for people (`weir checkpoints`): the committed checkpoints with
//! what each task's manifest names, and a verification of every file against its manifest.

use weir_wire::{CheckpointId, StreamId, TaskId};

use super::commit::decode_commit;
use super::snapshot::manifest_key;
use super::{Manifest, Store, StoreError, fetch_manifest};
use crate::checkpoint::{CommitRecord, RecordKind};

/// One committed checkpoint and its tasks' manifests.
#[derive(Debug)]
pub struct CheckpointInfo {
    /// The commit record.
    pub record: CommitRecord,
    /// Each task's manifest (or why it cannot be read), by task.
    pub tasks: Vec<(TaskId, Result<Manifest, StoreError>)>,
}

impl CheckpointInfo {
    /// Bytes of every file the checkpoint names (shared files counted once per task naming them).
    pub fn bytes(&self) -> u64 {
        self.manifests().flat_map(|m| m.files.iter()).map(|f| f.size).sum()
    }

    /// Files the checkpoint names.
    pub fn files(&self) -> usize {
        self.manifests().map(|m| m.files.len()).sum()
    }

    fn manifests(&self) -> impl Iterator<Item = &Manifest> {
        self.tasks.iter().filter_map(|(_, m)| m.as_ref().ok())
    }
}

/// The committed checkpoints of `stream`, oldest first (records that do not decode are skipped).
pub fn list_commits(store: &dyn Store, stream: StreamId) -> Result<Vec<CommitRecord>, StoreError> {
    list_commits_in(store, stream, None)
}

/// The committed checkpoints of `stream` a control store lists (`None`: every record in the
/// store), oldest first: a record counts only as the one listed under its id.
pub fn list_commits_in(
    store: &dyn Store,
    stream: StreamId,
    listed: Option<&[super::commit::Point]>,
) -> Result<Vec<CommitRecord>, StoreError> {
    let mut out = Vec::new();
    for key in store.list(&format!("{}/checkpoints/", stream.0))? {
        match store.get_at_most(&key, super::MAX_RECORD) {
            Ok(b) if listed.is_some_and(|l| !super::commit::is_listed(l, &key, &b)) => {}
            Ok(b) => match decode_commit(&key, &b) {
                Ok(r) => out.push(r),
                Err(e) => tracing::warn!(%key, error = %e, "skipping a damaged commit record"),
            },
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The tasks whose manifest a record names: the record's own list, or (a consensus or fallback
/// point, whose record lists none) every task with a manifest of its checkpoint in the store.
fn tasks_of(store: &dyn Store, stream: StreamId, r: &CommitRecord) -> Result<Vec<(TaskId, Option<u32>)>, StoreError> {
    match r.kind {
        RecordKind::Commit(_) => Ok(r.manifests.iter().map(|(t, c)| (*t, Some(*c))).collect()),
        RecordKind::Fresh => Ok(Vec::new()),
        RecordKind::Consensus(_) | RecordKind::Fallback(_) => {
            let mut tasks = Vec::new();
            for key in store.list(&format!("{}/tasks/", stream.0))? {
                let mut parts = key.split('/');
                let (Some(_), Some(_), Some(t), Some(chk), Some("MANIFEST.weir")) =
                    (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                if chk == format!("chk-{}", r.restore_point().unwrap_or(r.id).0)
                    && let Ok(t) = t.parse()
                {
                    tasks.push((TaskId(t), None));
                }
            }
            Ok(tasks)
        }
    }
}

/// Checkpoint `id` of `stream`: its record and its tasks' manifests.
pub fn checkpoint_info(store: &dyn Store, stream: StreamId, id: CheckpointId) -> Result<CheckpointInfo, StoreError> {
    let key = super::commit::commit_key(stream, id);
    let record = decode_commit(&key, &store.get_at_most(&key, super::MAX_RECORD)?)?;
    // A fallback record's manifests are those of the checkpoint it goes back to.
    let point = record.restore_point().unwrap_or(id);
    let tasks = tasks_of(store, stream, &record)?
        .into_iter()
        .map(|(t, crc)| (t, fetch_manifest(store, stream, t, point, crc)))
        .collect();
    Ok(CheckpointInfo { record, tasks })
}

/// One problem [`verify_checkpoint`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The object.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What [`verify_checkpoint`] read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Files read and checked.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Everything that does not match (empty: the checkpoint restores).
    pub damage: Vec<Damage>,
}

/// Reads every file of checkpoint `id` and checks it against its manifest (size and CRC32C),
/// and each manifest against the commit record. A store that cannot be read is an error; damage
/// is a finding.
pub fn verify_checkpoint(store: &dyn Store, stream: StreamId, id: CheckpointId) -> Result<Verified, StoreError> {
    let info = checkpoint_info(store, stream, id)?;
    let point = info.record.restore_point().unwrap_or(id);
    let mut v = Verified::default();
    for (t, m) in info.tasks {
        let m = match m {
            Ok(m) => m,
            Err(e @ (StoreError::Corrupt { .. } | StoreError::TooLarge { .. } | StoreError::NotFound { .. })) => {
                v.damage.push(Damage { key: manifest_key(stream, t, point), reason: e.to_string() });
                continue;
            }
            Err(e) => return Err(e),
        };
        for f in &m.files {
            match store.get_at_most(&f.key, f.size) {
                Ok(bytes) if bytes.len() as u64 != f.size => v.damage.push(Damage {
                    key: f.key.clone(),
                    reason: format!("{} bytes, the manifest says {}", bytes.len(), f.size),
                }),
                Ok(bytes) if crc32c::crc32c(&bytes) != f.crc => {
                    v.damage.push(Damage { key: f.key.clone(), reason: "checksum differs from the manifest".into() })
                }
                Ok(bytes) => {
                    v.files += 1;
                    v.bytes += bytes.len() as u64;
                }
                Err(StoreError::NotFound { .. }) => {
                    v.damage.push(Damage { key: f.key.clone(), reason: "missing".into() })
                }
                Err(e @ StoreError::TooLarge { .. }) => {
                    v.damage.push(Damage { key: f.key.clone(), reason: e.to_string() })
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(v)
}
