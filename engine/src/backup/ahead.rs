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
use weir_wire::{NodeId, StreamId, TaskId};

use super::index::sst_key;
use super::snapshot::{file_crc, task_prefix};
use super::{ManifestEntry, Store, StoreError, UploadIndex, seal, unseal, with_retries};

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

/// Who writes an ahead record: one run of the stream (its epoch, which is its nodes'
/// incarnation unless the run sets one) on one node. Each writer
/// has a key of its own, so a run that lost its task without knowing it (paused while the task
/// moved) cannot overwrite the record of the task's new node, which would let retention delete
/// files that node's checkpoints skip as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AheadWriter {
    /// The run's epoch (every node of a run has the same; a newer run a higher one).
    pub incarnation: u64,
    /// The node.
    pub node: NodeId,
}

/// The key of task `task`'s ahead record written by `writer`.
pub fn ahead_record_key(stream: StreamId, task: TaskId, writer: AheadWriter) -> String {
    format!("{}/ahead/{}/{}-{}.weir", stream.0, task.0, writer.incarnation, writer.node.0)
}

/// The incarnation of the run that wrote the ahead record at `key` (0 for a key not of that
/// shape: a record of one key per task, which no running Weir writes).
pub fn record_incarnation(key: &str) -> u64 {
    key.rsplit('/').next().and_then(|f| f.split_once('-')).and_then(|(i, _)| i.parse().ok()).unwrap_or(0)
}

const RECORD_HEAD: &str = "weir ahead 1\n";

/// An ahead record naming `keys`.
pub fn encode_record(keys: &[String]) -> String {
    let mut text = String::from(RECORD_HEAD);
    for k in keys {
        text.push_str("key ");
        text.push_str(k);
        text.push('\n');
    }
    seal(text)
}

/// The keys an ahead record names.
pub fn decode_record(key: &str, bytes: &[u8]) -> Result<Vec<String>, StoreError> {
    let body = unseal(key, bytes)?;
    let bad = |reason: &str| StoreError::Corrupt { key: key.into(), reason: reason.into() };
    let rest = body.strip_prefix(RECORD_HEAD).ok_or_else(|| bad("not an ahead record of format 1"))?;
    rest.lines()
        .map(|l| {
            let k = l.strip_prefix("key ").ok_or_else(|| bad("bad line"))?;
            super::check_key(key, k)?;
            Ok(k.to_string())
        })
        .collect()
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
                    Some(idx) => files
                        .iter()
                        .filter(|f| idx.get(&f.name, f.size).is_none() && !idx.is_claimed(&f.name))
                        .collect(),
                };
                for f in new {
                    // An upload that began since the listing stores it itself.
                    if try_lock(index).is_some_and(|idx| idx.is_claimed(&f.name) || idx.get(&f.name, f.size).is_some())
                    {
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
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use weir_wire::{CheckpointId, StreamId, TaskId, Version};

    use super::*;
    use crate::backup::{LocalDirStore, download_snapshot, fetch_manifest, upload_snapshot_indexed};
    use crate::operator::window::WindowResult;
    use crate::state::ResultStore;

    const S: StreamId = StreamId(1);
    const T: TaskId = TaskId(4);
    const W: AheadWriter = AheadWriter { incarnation: 7, node: NodeId(2) };

    /// The `.sst` files of a directory, as finished files.
    struct Dir(PathBuf);

    impl LiveSsts for Dir {
        fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError> {
            let mut files: Vec<LiveSst> = std::fs::read_dir(&self.0)
                .map_err(crate::state::io_err(&self.0))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sst"))
                .map(|path| LiveSst {
                    name: path.file_name().unwrap().to_string_lossy().into(),
                    size: std::fs::metadata(&path).unwrap().len(),
                    path,
                })
                .collect();
            files.sort_by(|a, b| a.name.cmp(&b.name));
            f(&files);
            Ok(())
        }
    }

    fn record(store: &dyn Store) -> Vec<String> {
        let key = ahead_record_key(S, T, W);
        decode_record(&key, &store.get(&key).unwrap()).unwrap()
    }

    fn results(start: i64, n: u64) -> Vec<WindowResult> {
        (0..n)
            .map(|k| WindowResult { key: k, start, count: k + 1, sum: k as f64, min: 0.5, max: k as f64 * 2.0 })
            .collect()
    }

    fn bytes_of(dir: &Path, sst: bool) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "sst") == sst)
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn files_stored_ahead_are_recorded_and_the_next_checkpoint_sends_only_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let remote = LocalDirStore::new(dir.path().join("remote"));
        let results_store = Arc::new(ResultStore::open(&dir.path().join("results")).unwrap());
        for start in [0, 1000, 2000] {
            results_store.upsert(S, TaskId(2), &results(start, 20_000)).unwrap();
            results_store.flush().unwrap();
        }
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        let mut w = Watched::new(T, W, results_store.clone(), index.clone());
        let ahead = w.pass(&remote, S, &|| {}).unwrap();
        assert!(ahead.files >= 3 && ahead.bytes > 0, "{ahead:?}");
        let named = record(&remote);
        assert_eq!(named.len(), ahead.files as usize);
        for key in &named {
            assert!(remote.size(key).unwrap().is_some(), "{key} is stored");
        }
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass::default(), "nothing new");

        // One more window, then a checkpoint: only its file and the small files go up.
        results_store.upsert(S, TaskId(2), &results(3000, 20_000)).unwrap();
        let chk = dir.path().join("chk-1");
        results_store.checkpoint(&chk).unwrap();
        let up = upload_snapshot_indexed(&remote, S, T, CheckpointId(1), Version(9), &chk, &index).unwrap();
        let expected = bytes_of(&chk, true) - ahead.bytes + bytes_of(&chk, false);
        assert!(up.bytes >= expected && up.bytes < expected + 4096, "sent {} bytes, new files {expected}", up.bytes);
        let manifest = fetch_manifest(&remote, S, T, CheckpointId(1), Some(up.manifest_crc)).unwrap();
        assert!(named.iter().all(|k| manifest.files.iter().any(|f| &f.key == k)), "the manifest names them");
        w.pass(&remote, S, &|| {}).unwrap();
        assert_eq!(record(&remote), Vec::<String>::new(), "a manifest names them now: the record lets go");

        // The checkpoint restores every result.
        let dl = dir.path().join("dl");
        download_snapshot(&remote, S, T, CheckpointId(1), Some(up.manifest_crc), &dl).unwrap();
        let back = ResultStore::open(&dir.path().join("back")).unwrap();
        back.restore_from(&dl).unwrap();
        assert_eq!(back.scan(S).unwrap(), results_store.scan(S).unwrap());
        assert_eq!(back.scan(S).unwrap().len(), 80_000);
    }

    #[test]
    fn a_file_gone_before_a_manifest_names_it_leaves_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(db.join("000007.sst"), vec![7u8; 1000]).unwrap();
        std::fs::write(db.join("000008.sst"), vec![8u8; 2000]).unwrap();
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        let mut w = Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone());
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass { files: 2, bytes: 3000 });
        assert_eq!(record(&remote).len(), 2);
        std::fs::remove_file(db.join("000007.sst")).unwrap(); // compacted away
        w.pass(&remote, S, &|| {}).unwrap();
        let left = record(&remote);
        assert!(left.len() == 1 && left[0].contains("/sst/000008-"), "{left:?}");
        assert!(index.lock().unwrap().get("000007.sst", 1000).is_none());
        assert!(index.lock().unwrap().get("000008.sst", 2000).is_some());
    }

    #[test]
    fn a_checkpoint_holding_the_index_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(db.join("000007.sst"), vec![7u8; 1000]).unwrap();
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        let mut w = Watched::new(T, W, Arc::new(Dir(db)), index.clone());
        let held = index.lock().unwrap();
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass::default());
        assert!(remote.list("1/").unwrap().is_empty(), "nothing stored while a checkpoint uploads");
        drop(held);
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
    }

    #[test]
    fn files_flushed_while_a_checkpoint_uploads_are_stored_ahead_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let (db, chk) = (dir.path().join("db"), dir.path().join("chk-1"));
        std::fs::create_dir_all(&db).unwrap();
        std::fs::create_dir_all(&chk).unwrap();
        // 6 is stored ahead; the checkpoint holds 6 and 7, and its upload of 7 is held.
        for (n, b) in [(6, 600), (7, 700)] {
            std::fs::write(db.join(format!("00000{n}.sst")), vec![n as u8; b]).unwrap();
            std::fs::write(chk.join(format!("00000{n}.sst")), vec![n as u8; b]).unwrap();
        }
        std::fs::write(chk.join("CURRENT"), b"MANIFEST-000001\n").unwrap();
        let (release, held) = crossbeam_channel::bounded::<()>(0);
        let remote = Arc::new(crate::backup::test_store::HookedStore::new(
            LocalDirStore::new(dir.path().join("remote")),
            move |inner, key, bytes| {
                if key.contains("/sst/000007-") {
                    // Until the test lets go (drops the sender); bounded, so that a pass that
                    // stored 7 too fails the test instead of hanging it.
                    let _ = held.recv_timeout(Duration::from_secs(5));
                }
                inner.put(key, bytes)
            },
        ));
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        std::fs::remove_file(db.join("000007.sst")).unwrap();
        let mut w = Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone());
        assert_eq!(w.pass(remote.as_ref(), S, &|| {}).unwrap().files, 1);
        std::fs::write(db.join("000007.sst"), vec![7u8; 700]).unwrap();
        let upload = {
            let (remote, index, chk) = (remote.clone(), index.clone(), chk.clone());
            std::thread::spawn(move || {
                upload_snapshot_indexed(remote.as_ref(), S, T, CheckpointId(1), Version(9), &chk, &index)
            })
        };
        let t0 = Instant::now();
        while !index.lock().unwrap().uploading() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the upload did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Flushed after the checkpoint: stored while the upload is held; 7 is the upload's, and 6,
        // compacted away meanwhile, stays recorded (the upload's manifest names it).
        std::fs::write(db.join("000008.sst"), vec![8u8; 800]).unwrap();
        std::fs::remove_file(db.join("000006.sst")).unwrap();
        assert_eq!(w.pass(remote.as_ref(), S, &|| {}).unwrap(), AheadPass { files: 1, bytes: 800 });
        let during = record(remote.as_ref());
        assert_eq!(during.len(), 2, "{during:?}");
        assert!(during.iter().any(|k| k.contains("/sst/000006-")) && during.iter().any(|k| k.contains("/sst/000008-")));
        drop(release);
        let up = upload.join().unwrap().unwrap();
        let manifest = fetch_manifest(remote.as_ref(), S, T, CheckpointId(1), Some(up.manifest_crc)).unwrap();
        let named: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(named, ["000006.sst", "000007.sst", "CURRENT"]);
        w.pass(remote.as_ref(), S, &|| {}).unwrap();
        let after = record(remote.as_ref());
        assert!(after.len() == 1 && after[0].contains("/sst/000008-"), "{after:?}");
        let idx = index.lock().unwrap();
        assert!(idx.get("000008.sst", 800).is_some() && !idx.uploading() && !idx.is_claimed("000007.sst"));
    }

    /// [`Dir`] with a version the test sets, counting its listings.
    struct Versioned(Dir, AtomicU64, AtomicUsize);

    impl LiveSsts for Versioned {
        fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError> {
            self.2.fetch_add(1, Ordering::Relaxed);
            self.0.with_live_ssts(f)
        }

        fn version(&self) -> Option<u64> {
            Some(self.1.load(Ordering::Relaxed))
        }
    }

    #[test]
    fn files_are_listed_again_only_once_their_version_moved_or_a_pass_was_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(db.join("000007.sst"), vec![7u8; 100]).unwrap();
        let live = Arc::new(Versioned(Dir(db.clone()), AtomicU64::new(1), AtomicUsize::new(0)));
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        let mut w = Watched::new(T, W, live.clone(), index.clone());
        let listings = || live.2.load(Ordering::Relaxed);
        // Cut short by a checkpoint's upload: the version is not taken as seen.
        let held = index.lock().unwrap();
        w.pass(&remote, S, &|| {}).unwrap();
        drop(held);
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
        assert_eq!(listings(), 2);
        std::fs::write(db.join("000008.sst"), vec![8u8; 100]).unwrap();
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 0, "the same version: not listed");
        assert_eq!(listings(), 2);
        live.1.store(2, Ordering::Relaxed);
        assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
        assert_eq!(listings(), 3);
    }

    #[test]
    fn the_thread_stores_a_watched_tasks_files_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::create_dir_all(&db).unwrap();
        let remote: Arc<dyn Store> = Arc::new(LocalDirStore::new(dir.path().join("remote")));
        let ahead = AheadUploader::start(remote.clone(), S, Arc::new(AtomicUsize::new(0)), || {}).unwrap();
        let index = Arc::new(Mutex::new(UploadIndex::new()));
        ahead.watch(Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone()));
        std::fs::write(db.join("000009.sst"), vec![9u8; 4096]).unwrap();
        let t0 = Instant::now();
        while index.lock().unwrap().get("000009.sst", 4096).is_none() {
            assert!(t0.elapsed() < Duration::from_secs(20), "not stored ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(ahead);
        assert_eq!(record(remote.as_ref()).len(), 1);
    }

    #[test]
    fn each_run_and_node_writes_a_record_of_its_own_whose_key_names_its_incarnation() {
        let old = AheadWriter { incarnation: 3 << 32, node: NodeId(1) };
        let new = AheadWriter { incarnation: (4 << 32) + 1, node: NodeId(2) };
        let (a, b) = (ahead_record_key(S, T, old), ahead_record_key(S, T, new));
        assert_ne!(a, b, "a paused old owner's record is not the new owner's");
        assert!(a.starts_with("1/ahead/4/") && b.starts_with("1/ahead/4/"), "{a} {b}");
        assert_eq!(record_incarnation(&a), 3 << 32);
        assert_eq!(record_incarnation(&b), (4 << 32) + 1);
        assert_eq!(record_incarnation("1/ahead/4.weir"), 0, "one key per task: the oldest");
    }

    #[test]
    fn an_ahead_record_reads_back_and_a_damaged_one_is_refused() {
        let keys = vec!["1/tasks/4/sst/000001-0000abcd.sst".to_string(), "1/tasks/4/sst/2-1.sst".to_string()];
        let text = encode_record(&keys);
        assert_eq!(decode_record("k", text.as_bytes()).unwrap(), keys);
        assert_eq!(decode_record("k", encode_record(&[]).as_bytes()).unwrap(), Vec::<String>::new());
        let damaged = text.replace("abcd", "abce");
        assert!(matches!(decode_record("k", damaged.as_bytes()), Err(StoreError::Corrupt { .. })));
        let other = super::seal("weir ahead 2\n".into());
        let e = decode_record("k", other.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("format 1"), "{e}");
    }
}
