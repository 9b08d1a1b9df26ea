//! Remote backup of task snapshots: the store interface, the local-directory store (the embedded
//! default), and upload and restore of snapshot directories in the layout of the design:
//!
//! ```text
//! <stream>/tasks/<task>/sst/<file>-<crc>.sst immutable SST files, uploaded once, shared by checkpoints
//! <stream>/tasks/<task>/chk-<id>/<file>     the small files of one checkpoint
//! <stream>/tasks/<task>/chk-<id>/MANIFEST.weir   every file with size and CRC32C, and the offset
//! <stream>/checkpoints/<id>.commit          the commit record, written last
//! <stream>/ahead/<task>/<incarnation>-<node>.weir  SST files a sink stored ahead of its next manifest
//! ```
//!
//! Invariants: a manifest is written only after every file it names is stored; a commit record only
//! after every manifest it names; nothing is read back without checking size and checksum.
//!
//! Backends, chosen by URL ([`open_store`]): `file://` ([`LocalDirStore`], the embedded
//! default), `s3://bucket/prefix` ([`S3Store`], any S3-compatible server) and
//! `rsync://[user@]host[:port]/module/prefix` ([`RsyncStore`], an rsync daemon).
//!
//! - [`ahead`]: stores a sink's new SST files while results arrive, ahead of the checkpoint.
//! - [`commit`]: the coordinator's records (commit records, the id record).
//! - [`commit_point`]: where the last commit and the ids reserved are kept (the store, or a
//!   control store).
//! - [`uploader`]: the uploader pool that writes and ships snapshots off the data path.
//! - [`retention`]: keeps the last K commits and collects the rest.
//! - [`inspect`]: the committed checkpoints and their verification, for `weir checkpoints`.

pub mod ahead;
pub mod commit;
pub mod commit_point;
pub mod floor;
mod index;
pub mod inspect;
mod local;
pub mod purge;
pub mod retention;
mod rsync;
mod s3;
mod snapshot;
#[cfg(test)]
pub(crate) mod test_store;
mod throttle;
pub mod uploader;
mod url;

pub use index::UploadIndex;
pub use local::LocalDirStore;
pub use rsync::{RsyncOptions, RsyncStore};
pub use s3::{MULTIPART_THRESHOLD as S3_MULTIPART_THRESHOLD, S3Options, S3Store};
pub use snapshot::{
    MANIFEST_FORMAT, Manifest, ManifestEntry, ManifestHead, ReplayPoint, UploadSummary, download_files,
    download_snapshot, fetch_manifest, local_snapshot_matches, manifest_key, task_prefix, upload_snapshot,
    upload_snapshot_indexed,
};
pub use throttle::Throttled;
pub use url::{StoreOptions, open_store};

/// The error of a failed local write at `path` (a download's file, a restore's directory):
/// retryable, as the store's own unavailability is.
pub(crate) fn write_failed(path: &std::path::Path) -> impl Fn(std::io::Error) -> StoreError + Copy + '_ {
    move |e| StoreError::Unavailable { op: "write", key: path.display().to_string(), reason: e.to_string() }
}

/// Largest record read whole from a store: manifests, commit, id, placement and upload-ahead
/// records (a manifest of 100,000 files is about 10 MiB).
pub const MAX_RECORD: u64 = 64 << 20;

/// Longest file name a record may name.
pub const MAX_NAME: usize = 255;

/// Checks that `name`, read from the record at `key`, is one plain path component: not empty,
/// at most [`MAX_NAME`] bytes, no `/`, `\` or NUL, not `.` or `..`. Restores join such names to
/// their own directory only.
pub fn check_name(key: &str, name: &str) -> Result<(), StoreError> {
    let bad = name.is_empty()
        || name.len() > MAX_NAME
        || name == "."
        || name == ".."
        || name.contains(['/', '\\', '\0'])
        || name.chars().any(char::is_control);
    if bad {
        let shown: String = name.chars().take(64).flat_map(char::escape_debug).collect();
        return Err(StoreError::Corrupt {
            key: key.into(),
            reason: format!("names \"{shown}\", not a plain file name"),
        });
    }
    Ok(())
}

/// Checks that `k`, a store key read from the record at `key`, has only plain parts (no empty,
/// `.` or `..` part, no `\\` or NUL) and is at most 1,024 bytes.
pub fn check_key(key: &str, k: &str) -> Result<(), StoreError> {
    if k.len() > 1024 || k.split('/').any(|p| p.is_empty() || p == "." || p == ".." || p.contains(['\\', '\0'])) {
        let shown: String = k.chars().take(64).flat_map(char::escape_debug).collect();
        return Err(StoreError::Corrupt { key: key.into(), reason: format!("names key \"{shown}\", not a plain key") });
    }
    Ok(())
}

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

/// Attempts of a retryable store call (the first and two retries).
const ATTEMPTS: u32 = 3;

/// Runs `op`, again after an exponential backoff with jitter (50 ms, then 100 ms, each ±50 %)
/// while it fails with a retryable error, at most [`ATTEMPTS`] times in all. The S3 client also
/// retries each request; these retries cover every backend, and whole-file puts.
pub(crate) fn with_retries<T>(mut op: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    let mut attempt = 1;
    loop {
        match op() {
            Err(e) if e.is_retryable() && attempt < ATTEMPTS => {
                let base = 50u64 << (attempt - 1);
                // Jitter without a generator: the clock's nanoseconds are noise enough here.
                let nanos =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
                let ms = base / 2 + u64::from(nanos) % base.max(1);
                tracing::debug!(error = %e, attempt, backoff_ms = ms, "retrying a store call");
                std::thread::sleep(std::time::Duration::from_millis(ms));
                attempt += 1;
            }
            r => return r,
        }
    }
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
    /// The object is larger than what is read of it into memory (fatal for that checkpoint:
    /// whoever wrote it is not this Weir).
    #[error("object {key} holds {size} bytes, more than the {max} read of it")]
    TooLarge {
        /// Object key.
        key: String,
        /// Its size (or at least this much).
        size: u64,
        /// The most read.
        max: u64,
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
    /// The object under `key`, whatever its size: callers use [`Store::get_at_most`].
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// The object under `key`, refused ([`StoreError::TooLarge`]) when it holds more than `max`
    /// bytes. Stores that can bound the read itself do; this default asks the size first and
    /// checks what came.
    fn get_at_most(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        if let Some(size) = self.size(key)?
            && size > max
        {
            return Err(StoreError::TooLarge { key: key.into(), size, max });
        }
        let bytes = self.get(key)?;
        if bytes.len() as u64 > max {
            return Err(StoreError::TooLarge { key: key.into(), size: bytes.len() as u64, max });
        }
        Ok(bytes)
    }
    /// Writes the object under `key` to a new private file at `dest` (see
    /// [`crate::private_fs::create_new_private`]) and returns its length, refused
    /// ([`StoreError::TooLarge`]) past `max` bytes: a file is never held in memory whole. Stores
    /// that can stream do; this default reads it with [`Store::get_at_most`].
    fn get_to_file(&self, key: &str, max: u64, dest: &std::path::Path) -> Result<u64, StoreError> {
        let bytes = self.get_at_most(key, max)?;
        crate::private_fs::write_new_private(dest, &bytes).map_err(write_failed(dest))?;
        Ok(bytes.len() as u64)
    }
    /// Size of the object under `key`, if it exists.
    fn size(&self, key: &str) -> Result<Option<u64>, StoreError>;
    /// Keys that start with `prefix`, sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// Deletes `key` (no error if it does not exist).
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Deletes every key of `keys` (none an error for not existing), in batches where the store
    /// has them (S3's bulk delete: a thousand keys a request). After an error some may be gone.
    fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        keys.iter().try_for_each(|k| self.delete(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> StoreError {
        StoreError::Unavailable { op: "put", key: "k".into(), reason: "reset by peer".into() }
    }

    #[test]
    fn retryable_errors_are_retried_a_bounded_number_of_times_and_fatal_ones_never() {
        let mut calls = 0;
        let ok = with_retries(|| {
            calls += 1;
            if calls < 3 { Err(unavailable()) } else { Ok(calls) }
        });
        assert_eq!(ok.unwrap(), 3, "two failures, then success");
        let mut calls = 0;
        let gave_up: Result<(), _> = with_retries(|| {
            calls += 1;
            Err(unavailable())
        });
        assert!(gave_up.unwrap_err().is_retryable());
        assert_eq!(calls, ATTEMPTS, "then the error");
        let mut calls = 0;
        let fatal: Result<(), _> = with_retries(|| {
            calls += 1;
            Err(StoreError::Denied { store: "s3://b".into(), op: "put", key: "k".into(), reason: "403".into() })
        });
        assert!(fatal.is_err());
        assert_eq!(calls, 1, "credentials refused: no retry");
    }
}
