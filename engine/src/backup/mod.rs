//! Remote backup of task snapshots: the store interface, the local-directory store (the embedded
//! default), and upload and restore of snapshot directories in the layout of the design:
//!
//! ```text
//! <stream>/tasks/<task>/sst/<file>          immutable SST files, uploaded once, shared by checkpoints
//! <stream>/tasks/<task>/chk-<id>/<file>     the small files of one checkpoint
//! <stream>/tasks/<task>/chk-<id>/MANIFEST.weir   every file with size and CRC32C, and the offset
//! <stream>/checkpoints/<id>.commit          the commit record, written last
//! ```
//!
//! Invariants: a manifest is written only after every file it names is stored; a commit record only
//! after every manifest it names; nothing is read back without checking size and checksum.
//!
//! Backends, chosen by URL ([`open_store`]): `file://` ([`LocalDirStore`], the embedded
//! default), `s3://bucket/prefix` ([`S3Store`], any S3-compatible server) and
//! `rsync://[user@]host[:port]/module/prefix` ([`RsyncStore`], an rsync daemon).
//!
//! - [`commit`]: the coordinator's records (commit records, the id record).
//! - [`uploader`]: the uploader pool that writes and ships snapshots off the data path.
//! - [`retention`]: keeps the last K commits and collects the rest.
//! - [`inspect`]: the committed checkpoints and their verification, for `weir checkpoints`.

pub mod commit;
pub mod inspect;
mod local;
pub mod retention;
mod rsync;
mod s3;
mod snapshot;
pub mod uploader;
mod url;

pub use local::LocalDirStore;
pub use rsync::{RsyncOptions, RsyncStore};
pub use s3::{MULTIPART_THRESHOLD as S3_MULTIPART_THRESHOLD, S3Options, S3Store};
pub use snapshot::{
    Manifest, ManifestEntry, UploadSummary, download_files, download_snapshot, fetch_manifest, local_snapshot_matches,
    upload_snapshot,
};
pub use url::{StoreOptions, open_store};

/// Appends a line `crc <CRC32C of everything before it>` to `text`: the stored text records
/// (manifests, commit records) carry their own checksum.
pub(crate) fn seal(mut text: String) -> String {
    let crc = crc32c::crc32c(text.as_bytes());
    text.push_str(&format!("crc {crc:08x}\n"));
    text
}

/// Checks a record sealed by [`seal`] and returns its body (without the checksum line).
pub(crate) fn unseal<'a>(key: &str, bytes: &'a [u8]) -> Result<&'a str, StoreError> {
    let bad = |reason: &str| StoreError::Corrupt { key: key.into(), reason: reason.into() };
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
    let at = text.rfind("crc ").ok_or_else(|| bad("no checksum line"))?;
    let (body, tail) = text.split_at(at);
    let want = u32::from_str_radix(tail[4..].trim(), 16).map_err(|_| bad("bad checksum line"))?;
    if crc32c::crc32c(body.as_bytes()) != want {
        return Err(bad("checksum mismatch"));
    }
    Ok(body)
}

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused the operation (retryable).
    #[error("store {op} {key}: {reason}")]
    Unavailable {
        /// Operation.
        op: &'static str,
        /// Object key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The object does not exist.
    #[error("no object {key} in the store")]
    NotFound {
        /// Object key.
        key: String,
    },
    /// Stored bytes do not match their manifest or record (fatal for that checkpoint).
    #[error("corrupt object {key}: {reason}")]
    Corrupt {
        /// Object key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The store refused the credentials or the permission (fatal: retrying cannot help).
    #[error("store {store} refused {op} {key}: {reason} (check the credentials)")]
    Denied {
        /// The store's URL.
        store: String,
        /// Operation.
        op: &'static str,
        /// Object key.
        key: String,
        /// What the store said.
        reason: String,
    },
    /// The store's URL or options are wrong (fatal).
    #[error("store {store}: {reason}")]
    Config {
        /// The store's URL, as given.
        store: String,
        /// What is wrong.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

/// An object store: whole objects by key, `/`-separated.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Stores `bytes` under `key` atomically (readers see the old object or the new one).
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// Stores the file at `path` under `key` atomically. The caller never modifies the file
    /// afterwards, so a store may share it rather than copy it.
    fn put_file(&self, key: &str, path: &std::path::Path) -> Result<(), StoreError> {
        let bytes = std::fs::read(path).map_err(|e| StoreError::Unavailable {
            op: "read",
            key: path.display().to_string(),
            reason: e.to_string(),
        })?;
        self.put(key, &bytes)
    }
    /// The object under `key`.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Size of the object under `key`, if it exists.
    fn size(&self, key: &str) -> Result<Option<u64>, StoreError>;
    /// Keys that start with `prefix`, sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// Deletes `key` (no error if it does not exist).
    fn delete(&self, key: &str) -> Result<(), StoreError>;
}
