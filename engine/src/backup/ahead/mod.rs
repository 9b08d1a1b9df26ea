//! Uploads ahead of the barrier: a thread that stores a sink's new SST files while results
//! arrive, so that a checkpoint finds most of them in the task's [`UploadIndex`] and sends only
//! what was flushed since.
//!
//! A window over millions of keys reaches its sink as one burst of results: at 4,000,000 keys,
//! about 160 MB that RocksDB flushes into SST files. Copied after the barrier, they would make its
//! commit wait for the burst's bytes twice (flush, then upload). Here the files go up as soon as RocksDB has flushed them (it never changes an SST file afterwards), and
//! the checkpoint after the burst uploads its last memtable's file and little else.
//!
//! Invariants:
//! - A file is stored, then the task's ahead record (`<stream>/ahead/<task>/<incarnation>-<node>.weir`:
//!   the keys of the files stored ahead, one record per run and node) names it, then the index knows it (as ahead): a checkpoint skips
//!   only files that a record names, so retention keeps them (it reads the records before it
//!   lists the store) until a stored manifest names them.
//! - A checkpoint's upload and this thread run side by side: the upload locks the index only to
//!   copy it and claim the files it stores, and to take its manifest in; the thread tries the
//!   lock to list and before each file, skips claimed files, copies without the lock and takes
//!   it to record the copy (a file claimed while it is copied goes up twice, under the same key
//!   with the same bytes; only the first to finish records it). So a long upload does not leave
//!   the files flushed meanwhile to the next checkpoint.
//! - While a checkpoint's upload is in flight, the record forgets no file that is no longer live:
//!   the upload's copy of the index may name it in its manifest.
//! - The files are read under the [`LiveSsts`] source's guard: a restore, which replaces them,
//!   waits until the pass ends.
//! - Storing ahead is an optimisation: a failure is logged, and the checkpoint stores the file.

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use weir_wire::{StreamId, TaskId};

mod record;

pub use record::{AheadWriter, ahead_record_key, decode_record, encode_record, record_incarnation};

use super::index::sst_key;
use super::snapshot::{file_crc, task_prefix};
use super::{ManifestEntry, Store, StoreError, UploadIndex, with_retries};

/// How often the thread looks for new files. A flush of a 32 MiB memtable takes longer than
/// this; looking costs a few microseconds per sink.
const POLL: Duration = Duration::from_millis(20);

/// An SST file that RocksDB has finished writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSst {
    /// Its name in the database directory (`000123.sst`), as a checkpoint of it names it.
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
}

/// What files a task has to store ahead (a sink's result store).
pub trait LiveSsts: Send + Sync {
    /// Calls `f` with the finished SST files; they stay in place until `f` returns.
    fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError>;

    /// A number that changes whenever the set of files may have (none: unknown). A pass is
    /// skipped while it stays what the last complete pass saw: listing is linear in the files.
    fn version(&self) -> Option<u64> {
        None
    }
}

impl LiveSsts for crate::state::ResultStore {
    fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError> {
        crate::state::ResultStore::with_live_ssts(self, |dir, files| {
            let files: Vec<LiveSst> = files
                .iter()
                .map(|(name, size)| LiveSst { name: name.clone(), path: dir.join(name), size: *size })
                .collect();
            f(&files)
        })
    }

    fn version(&self) -> Option<u64> {
        crate::state::ResultStore::files_version(self).ok()
    }
}

/// What one pass stored for one task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AheadPass {
    /// Files stored.
    pub files: u32,
    /// Their bytes.
    pub bytes: u64,
}

/// One task's files and what is known of them.
pub struct Watched {
    task: TaskId,
    writer: AheadWriter,
    live: Arc<dyn LiveSsts>,
    index: Arc<Mutex<UploadIndex>>,
    /// The keys the task's ahead record names (as last written by this thread).
    recorded: Vec<String>,
    /// The files' version at the last complete pass.
    seen: Option<u64>,
}

impl Watched {
    /// Task `task`'s files from `live`, known to its uploads by `index`, recorded as `writer`.
    pub fn new(task: TaskId, writer: AheadWriter, live: Arc<dyn LiveSsts>, index: Arc<Mutex<UploadIndex>>) -> Self {
        Self { task, writer, live, index, recorded: Vec::new(), seen: None }
    }

    /// Stores the finished files the index does not know and no checkpoint's upload claims, and
    /// keeps the ahead record up to date (a file is recorded under the index's lock); calls
    /// `before_each` before reading a file. Stops early, with what it stored, when it finds the
    /// index locked (an upload beginning or ending).
    pub fn pass(
        &mut self,
        store: &dyn Store,
        stream: StreamId,
        before_each: &dyn Fn(),
    ) -> Result<AheadPass, StoreError> {
        let version = self.live.version();
        if version.is_some() && version == self.seen {
            return Ok(AheadPass::default());
        }
        let (task, index, recorded) = (self.task, &self.index, &mut self.recorded);
        let record_key = ahead_record_key(stream, task, self.writer);
        let mut out = AheadPass::default();
        let mut result = Ok(false);
        let listed = self.live.with_live_ssts(&mut |files| {
            result = (|| {
                // One look at the index for every file (a result store has thousands).
                let new: Vec<&LiveSst> = match try_lock(index) {
                    // Locked (an upload beginning or ending): looked at again in 20 ms.
                    None => return Ok(false),
                    Some(idx) => files.iter().filter(|f| idx.to_store_ahead(&f.name, f.size)).collect(),
                };
                for f in new {
                    // An upload that began since the listing stores it itself.
                    if try_lock(index).is_some_and(|idx| !idx.to_store_ahead(&f.name, f.size)) {
                        continue;
                    }
                    before_each();
                    let crc = match file_crc(&f.path) {
                        Ok(c) => c,
                        // Compacted away since the listing: never to be named.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(unavailable(&f.path, e)),
                    };
                    let key = sst_key(&task_prefix(stream, task), &f.name, crc);
                    // Without the lock: a checkpoint that starts meanwhile does not wait for the
                    // copy (it may store the same file too: the same bytes under the same key).
                    with_retries(|| store.put_file(&key, &f.path))?;
                    let mut idx = index.lock().unwrap_or_else(|e| e.into_inner());
                    if idx.get(&f.name, f.size).is_some() {
                        continue; // a manifest names it already
                    }
                    let mut keys = idx.ahead_keys();
                    keys.push(key.clone());
                    keys.sort();
                    with_retries(|| store.put(&record_key, encode_record(&keys).as_bytes()))?;
                    *recorded = keys;
                    idx.insert_ahead(ManifestEntry { name: f.name.clone(), key, size: f.size, crc });
                    out.files += 1;
                    out.bytes += f.size;
                }
                // Files no longer live are never named: the record lets them go, unless an
                // upload in flight may name them still (and the record of files a manifest
                // names now lets them go too).
                let Some(mut idx) = try_lock(index) else { return Ok(false) };
                let uploading = idx.uploading();
                if !uploading {
                    let live: std::collections::HashSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
                    idx.retain_ahead(|name| live.contains(name));
                }
                let keys = idx.ahead_keys();
                if keys != *recorded {
                    with_retries(|| store.put(&record_key, encode_record(&keys).as_bytes()))?;
                    *recorded = keys;
                }
                Ok(!uploading)
            })();
        });
        listed.map_err(|e| StoreError::Unavailable {
            op: "list",
            key: format!("task {task}"),
            reason: e.to_string(),
        })?;
        if result? {
            self.seen = version;
        }
        Ok(out)
    }
}

fn unavailable(path: &std::path::Path, e: std::io::Error) -> StoreError {
    StoreError::Unavailable { op: "read", key: path.display().to_string(), reason: e.to_string() }
}

/// The lock, unless someone holds it (a poisoned lock is taken: the index stays consistent, each
/// change to it is one call).
fn try_lock(m: &Mutex<UploadIndex>) -> Option<std::sync::MutexGuard<'_, UploadIndex>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The thread that stores the watched tasks' files ahead; it ends when dropped.
#[derive(Debug)]
pub struct AheadUploader {
    watch: Option<Sender<Watched>>,
    thread: Option<JoinHandle<()>>,
}

impl AheadUploader {
    /// Starts the thread (which runs `init` first), storing into `store`; it holds each file
    /// while `aligning` is above zero, for at most 20 ms, as the uploaders do.
    pub fn start(
        store: Arc<dyn Store>,
        stream: StreamId,
        aligning: Arc<AtomicUsize>,
        init: fn(),
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new().name("weir-upload-ahead".into()).spawn(move || {
            init();
            run(rx, store.as_ref(), stream, &aligning);
        })?;
        Ok(Self { watch: Some(tx), thread: Some(thread) })
    }

    /// Watches `w`'s files from now on.
    pub fn watch(&self, w: Watched) {
        if let Some(tx) = &self.watch {
            let _ = tx.send(w);
        }
    }
}

impl Drop for AheadUploader {
    fn drop(&mut self) {
        drop(self.watch.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(rx: Receiver<Watched>, store: &dyn Store, stream: StreamId, aligning: &AtomicUsize) {
    let mut watched: Vec<Watched> = Vec::new();
    let before_each = || super::uploader::wait_for_alignment(aligning);
    loop {
        match rx.recv_timeout(POLL) {
            Ok(w) => watched.push(w),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        for w in &mut watched {
            match w.pass(store, stream, &before_each) {
                Ok(p) if p.files > 0 => {
                    tracing::debug!(task = %w.task, files = p.files, bytes = p.bytes, "stored ahead of the checkpoint")
                }
                Ok(_) => {}
                // The checkpoint stores what this could not.
                Err(e) => tracing::debug!(task = %w.task, error = %e, "cannot store ahead"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
