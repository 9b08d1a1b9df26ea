//! The stream catalog's changes and where it is kept: the streams a cluster runs, each with its
//! name, id, spec and state ([`weir_wire::msg::Catalog`]).
//!
//! The changes are pure ([`create`], [`drop_stream`], [`set_paused`], [`forget`]); a [`CatalogStore`] keeps the
//! catalog, on the control store ([`ControlCatalog`]: one key, each write compared with the
//! revision it was read at, so concurrent changes from several nodes are linearized and none
//! is lost) or, for a node alone, in a file of its data directory ([`FileCatalog`]).
//! [`change`] reads, changes and writes until a write lands on the catalog it read.
//!
//! Invariants: names are unique ([`valid_stream_name`]); ids are assigned from `next_id` and
//! never reused, so a dropped name created again is a new stream whose data cannot meet the
//! old one's; at most [`MAX_STREAMS`] streams, each spec at most [`MAX_SPEC_TEXT`] bytes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weir_wire::StreamId;
use weir_wire::msg::{Catalog, MAX_SPEC_TEXT, MAX_STREAMS, StreamEntry, StreamState, valid_stream_name};

use crate::control::{Compare, ControlError, ControlStore, Op};

/// Why a catalog change or read failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The change cannot be made to this catalog (a taken or unknown name, a full catalog, a
    /// bad spec): fatal for the request.
    #[error("{reason}")]
    Invalid { reason: String },
    /// The store did not answer, or kept changing under the change: retryable (read the
    /// catalog before trying again: the change may have landed).
    #[error("the stream catalog is unavailable: {reason} (retryable)")]
    Unavailable { reason: String },
    /// The stored catalog does not decode: fatal until an operator repairs it.
    #[error("the stream catalog at {at} is damaged: {source}")]
    Damaged {
        at: String,
        #[source]
        source: weir_wire::msg::CatalogDecodeError,
    },
}

impl CatalogError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CatalogError::Unavailable { .. })
    }
}

impl From<ControlError> for CatalogError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Unavailable { .. } => CatalogError::Unavailable { reason: e.to_string() },
            ControlError::Refused { .. } => CatalogError::Invalid { reason: e.to_string() },
        }
    }
}

fn invalid(reason: String) -> CatalogError {
    CatalogError::Invalid { reason }
}

/// `c` with stream `name` added, running, from `spec` (a `[stream]` table's text; the caller
/// has parsed and validated it), created at `now_ms`; its id is the catalog's next.
pub fn create(c: &Catalog, name: &str, spec: &str, now_ms: u64) -> Result<(Catalog, StreamEntry), CatalogError> {
    if !valid_stream_name(name) {
        return Err(invalid(format!(
            "{name:?} is not a stream name: 1 to 64 letters, digits, '-' or '_', starting with a letter"
        )));
    }
    // A dropping stream's name is free: the new stream has another id.
    if let Some(s) = c.streams.iter().find(|s| s.name == name && s.state.is_kept()) {
        let how = if s.state == StreamState::Running { "runs" } else { "is paused" };
        return Err(invalid(format!("a stream named {name} (id {}) already exists: it {how}", s.id)));
    }
    if c.streams.len() >= MAX_STREAMS {
        return Err(invalid(format!("the catalog holds {MAX_STREAMS} streams, as many as it may; drop one first")));
    }
    if spec.len() > MAX_SPEC_TEXT {
        return Err(invalid(format!("the spec of {name} is {} bytes (at most {MAX_SPEC_TEXT})", spec.len())));
    }
    let entry = StreamEntry {
        id: StreamId(c.next_id),
        name: name.into(),
        state: StreamState::Running,
        spec: spec.into(),
        created_ms: now_ms,
    };
    let mut next = c.clone();
    next.next_id += 1;
    next.streams.push(entry.clone());
    Ok((next, entry))
}

/// The entry of stream `name` in `c`: the one kept, else the newest dropping.
fn named<'a>(c: &'a mut Catalog, name: &str) -> Result<&'a mut StreamEntry, CatalogError> {
    let at = c.streams.iter().position(|s| s.name == name && s.state.is_kept());
    let at = at.or_else(|| c.streams.iter().rposition(|s| s.name == name));
    match at {
        Some(i) => Ok(&mut c.streams[i]),
        None => Err(invalid(format!("no stream named {name} (`weir stream list` shows them)"))),
    }
}

/// `c` with stream `name` dropping since `now_ms`; dropping one already dropping changes
/// nothing (the first drop's time stays).
pub fn drop_stream(c: &Catalog, name: &str, now_ms: u64) -> Result<(Catalog, StreamEntry), CatalogError> {
    let mut next = c.clone();
    let s = named(&mut next, name)?;
    if s.state.is_kept() {
        s.state = StreamState::Dropping { since_ms: now_ms };
    }
    let entry = s.clone();
    Ok((next, entry))
}

/// `c` with stream `name` paused since `now_ms` (`pause`) or running again; pausing a paused
/// stream, or resuming a running one, changes nothing. A dropping stream can do neither.
pub fn set_paused(c: &Catalog, name: &str, pause: bool, now_ms: u64) -> Result<(Catalog, StreamEntry), CatalogError> {
    let mut next = c.clone();
    let s = named(&mut next, name)?;
    match (s.state, pause) {
        (StreamState::Dropping { .. }, _) => {
            let what = if pause { "pause" } else { "resume" };
            return Err(invalid(format!("stream {name} is being dropped: it cannot {what}")));
        }
        (StreamState::Running, true) => s.state = StreamState::Paused { since_ms: now_ms },
        (StreamState::Paused { .. }, false) => s.state = StreamState::Running,
        _ => {}
    }
    let entry = s.clone();
    Ok((next, entry))
}

/// `c` with the paused stream `name`'s spec text `from` replaced by `spec` (a rescale: the stream
/// resumes from its savepoint with the new spec's parallelism). A stream running or dropping
/// cannot (a running one would restart at once, from a checkpoint that may be no savepoint).
pub fn set_spec(c: &Catalog, name: &str, from: &str, spec: &str) -> Result<(Catalog, StreamEntry), CatalogError> {
    if spec.len() > weir_wire::msg::MAX_SPEC_TEXT {
        return Err(invalid(format!("the new spec of {} bytes is longer than a catalog keeps", spec.len())));
    }
    let mut next = c.clone();
    let s = named(&mut next, name)?;
    if s.spec != from {
        return Err(CatalogError::Unavailable { reason: format!("stream {name}'s spec changed meanwhile: try again") });
    }
    match s.state {
        StreamState::Paused { .. } => s.spec = spec.to_string(),
        StreamState::Running => {
            return Err(invalid(format!("stream {name} runs: pause it first (`weir stream rescale` does)")));
        }
        StreamState::Dropping { .. } => return Err(invalid(format!("stream {name} is being dropped"))),
    }
    let entry = s.clone();
    Ok((next, entry))
}

/// `c` without the dropping stream `id` (its nodes have removed its data); `None` when there
/// is nothing to remove (it is gone already, or runs: a name created again has another id).
pub fn forget(c: &Catalog, id: StreamId) -> Option<Catalog> {
    let at = c.streams.iter().position(|s| s.id == id && matches!(s.state, StreamState::Dropping { .. }))?;
    let mut next = c.clone();
    next.streams.remove(at);
    Some(next)
}

/// The catalog before any stream was created: ids start at 1; lineage 0 (none yet).
pub fn empty() -> Catalog {
    Catalog { lineage: 0, next_id: 1, streams: Vec::new() }
}

/// The first catalog of a cluster whose config file names a stream (`name`, `id`, `spec`): that
/// stream, running, in a catalog of lineage `lineage` (random, not 0). Only for a catalog never
/// written (revision 0): once written, a dropped file stream stays dropped.
pub fn seed(lineage: u64, name: &str, id: StreamId, spec: &str, now_ms: u64) -> Result<Catalog, CatalogError> {
    let first = Catalog { lineage, next_id: id.0, streams: Vec::new() };
    let (mut c, _) = create(&first, name, spec, now_ms)?;
    c.next_id = c.next_id.max(1);
    Ok(c)
}

/// Keys of the control store a list takes at most (each answer bounded; the removal lists again
/// until none is left), and so deletes in one transaction: below etcd's default limit of 128
/// operations per transaction.
const KEYS_PER_LIST: usize = 100;

/// Deletes every key of the dropped stream `stream` from the control store (its placement,
/// in-sync sets, checkpoint ids and commit point): how many there were. Safe to call again
/// after an error, or from several nodes at once.
pub fn remove_stream_keys(
    store: &dyn ControlStore,
    keys: &crate::cluster::Keys,
    stream: StreamId,
) -> Result<usize, CatalogError> {
    let prefix = keys.stream_prefix(stream);
    let mut removed = 0;
    loop {
        let listed = store.list(&prefix, KEYS_PER_LIST)?;
        if listed.is_empty() {
            return Ok(removed);
        }
        removed += listed.len();
        let ops: Vec<Op> = listed.into_iter().map(|(k, _)| Op::Delete(k)).collect();
        store.txn(&[], &ops)?;
    }
}

/// Where the catalog is kept.
pub trait CatalogStore: Send + Sync {
    /// The catalog and the revision it was read at (the empty catalog at revision 0 when none
    /// was ever written; a written one is at 1 or more).
    fn read(&self) -> Result<(Catalog, i64), CatalogError>;
    /// Writes `next` if the catalog is still at revision `read`: `false` when it changed since
    /// (nothing was written).
    fn write(&self, read: i64, next: &Catalog) -> Result<bool, CatalogError>;
}

/// Tries of [`change`] before it says the catalog kept changing under it.
const TRIES: usize = 8;

/// Applies `f` to the stored catalog until a write lands on the catalog `f` saw: the
/// changed catalog and what `f` returned with it. `f` returning `Ok(None)` changes nothing.
pub fn change<T>(
    store: &dyn CatalogStore,
    mut f: impl FnMut(&Catalog) -> Result<Option<(Catalog, T)>, CatalogError>,
) -> Result<Option<(Catalog, T)>, CatalogError> {
    for _ in 0..TRIES {
        let (c, rev) = store.read()?;
        let Some((next, out)) = f(&c)? else { return Ok(None) };
        if store.write(rev, &next)? {
            return Ok(Some((next, out)));
        }
    }
    Err(CatalogError::Unavailable { reason: format!("it changed under each of {TRIES} tries") })
}

/// The catalog under one key of the control store (etcd in a cluster).
pub struct ControlCatalog {
    store: Arc<dyn ControlStore>,
    key: String,
}

impl ControlCatalog {
    /// The catalog of the cluster whose keys are `keys`.
    pub fn new(store: Arc<dyn ControlStore>, keys: &super::Keys) -> Self {
        ControlCatalog { store, key: keys.catalog() }
    }
}

impl CatalogStore for ControlCatalog {
    fn read(&self) -> Result<(Catalog, i64), CatalogError> {
        match self.store.get(&self.key)? {
            None => Ok((empty(), 0)),
            Some(e) => {
                let c = Catalog::decode(&e.value)
                    .map_err(|source| CatalogError::Damaged { at: self.key.clone(), source })?;
                Ok((c, e.mod_revision))
            }
        }
    }

    fn write(&self, read: i64, next: &Catalog) -> Result<bool, CatalogError> {
        let put = Op::Put { key: self.key.clone(), value: next.encode(), lease: None };
        Ok(self.store.txn(&[Compare::ModRevision(self.key.clone(), read)], &[put])?.succeeded)
    }
}

/// The catalog of a node alone, in a file of its data directory: written whole to a temporary
/// file, synced and renamed over the last, so a crash leaves the old or the new catalog. Its
/// revision counts the writes this process made, from 1 if the file existed as it first read
/// it (one process owns a data directory).
pub struct FileCatalog {
    path: PathBuf,
    /// `None` until the first read.
    rev: Mutex<Option<i64>>,
}

impl FileCatalog {
    /// The catalog in `<data_dir>/catalog`.
    pub fn new(data_dir: &Path) -> Self {
        FileCatalog { path: data_dir.join("catalog"), rev: Mutex::new(None) }
    }

    fn unavailable(&self, what: &str, e: std::io::Error) -> CatalogError {
        CatalogError::Unavailable { reason: format!("{what} {}: {e}", self.path.display()) }
    }
}

impl CatalogStore for FileCatalog {
    fn read(&self) -> Result<(Catalog, i64), CatalogError> {
        let mut rev = self.rev.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded before it is read: the largest catalog there can be, and some.
        let limit = (MAX_STREAMS * (MAX_SPEC_TEXT + 1024) + 4096) as u64;
        let meta = std::fs::metadata(&self.path);
        let rev = *rev.get_or_insert(i64::from(meta.is_ok()));
        match meta {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((empty(), rev)),
            Err(e) => return Err(self.unavailable("reading", e)),
            Ok(m) if m.len() > limit => {
                let at = self.path.display().to_string();
                return Err(CatalogError::Damaged { at, source: weir_wire::msg::CatalogDecodeError::Format });
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(&self.path).map_err(|e| self.unavailable("reading", e))?;
        let c = Catalog::decode(&bytes)
            .map_err(|source| CatalogError::Damaged { at: self.path.display().to_string(), source })?;
        Ok((c, rev))
    }

    fn write(&self, read: i64, next: &Catalog) -> Result<bool, CatalogError> {
        use std::io::Write;
        let mut rev = self.rev.lock().unwrap_or_else(|e| e.into_inner());
        if rev.is_none_or(|r| r != read) {
            return Ok(false);
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        crate::private_fs::private_dir_all(dir).map_err(|e| self.unavailable("creating the directory of", e))?;
        let tmp = self.path.with_extension("new");
        let _ = std::fs::remove_file(&tmp);
        let mut f = crate::private_fs::create_new_private(&tmp).map_err(|e| self.unavailable("writing", e))?;
        f.write_all(&next.encode()).and_then(|()| f.sync_all()).map_err(|e| self.unavailable("writing", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.unavailable("replacing", e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.unavailable("syncing the directory of", e))?;
        *rev = Some(read + 1);
        Ok(true)
    }
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
