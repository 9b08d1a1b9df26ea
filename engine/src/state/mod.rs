//! State on disk: one RocksDB instance per task ([`TaskStore`]), its snapshots, and each sink's
//! result store ([`ResultStore`]) that the sink upserts into.
//!
//! A snapshot directory holds either a RocksDB checkpoint (`TaskStore::snapshot`: hard links,
//! for a store whose live state is in RocksDB) or SST files written with RocksDB's `SstFileWriter`
//! ([`write_sst`]: sorted, block-checksummed, synced), which is how the operators here snapshot
//! the state they keep in memory: one sequential file and one fsync, instead of an ingest, a
//! MANIFEST update and a checkpoint (measured 10–20 ms per checkpoint under load, almost all
//! fsyncs). Both kinds open with [`TaskStore::open_from_snapshot`].
//!
//! Invariants:
//! - Between checkpoints, operator state lives in memory; a task's store is written when it is
//!   restored, or by the task's own flush.
//! - A snapshot directory, once created, is never modified; opening from it copies (hard-links
//!   where possible) into a fresh directory, so the snapshot stays valid for the next restore.

mod result_blocks;
mod result_merge;
mod results;
mod spill_store;
mod window_chain;
mod window_state;

use std::fs;
use std::path::{Path, PathBuf};

pub use results::{NodeResults, ResultStore, result_store_dir};

/// The `after` of a results page (`ResultsReq`, [`ResultStore::page`]) that starts at the first
/// block of `stream`'s window `start`: blocks sort by (stream, window start), so a client that
/// watches new windows reads from there instead of from the beginning.
pub fn page_from_window(stream: weir_wire::StreamId, start: i64) -> Vec<u8> {
    result_blocks::window_prefix(stream, start).to_vec()
}
pub use spill_store::{RocksSpill, SpillDb, SpillSnapshot};
pub use window_chain::{ChainFile, ChainWrite, MAX_FILES, MAX_READ_FACTOR, WindowChain, state_file_name};
pub(crate) use window_state::scan_window_state;
pub use window_state::{
    load_window_state, save_frozen_state, save_window_state, write_window_snapshot, write_window_snapshot_with,
};

/// Errors of the state stores.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// RocksDB refused (I/O, disk full, a lock held by another process): retryable.
    #[error("rocksdb at {path}: {source}")]
    Db {
        /// Database directory.
        path: PathBuf,
        /// RocksDB's error.
        #[source]
        source: rocksdb::Error,
    },
    /// File system error around the database (snapshot copy, directory creation): retryable.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Stored bytes do not decode: the store is damaged or from another version (fatal).
    #[error("corrupt state in {path}: {reason}")]
    Corrupt {
        /// Database directory.
        path: PathBuf,
        /// What did not decode.
        reason: String,
    },
}

impl StateError {
    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, StateError::Corrupt { .. })
    }
}

pub(crate) fn db_err(path: &Path) -> impl FnOnce(rocksdb::Error) -> StateError + '_ {
    move |source| StateError::Db { path: path.to_path_buf(), source }
}

/// RocksDB's corruption answers are damaged bytes (fatal); the rest may pass (retryable).
fn db_or_corrupt(path: &Path) -> impl FnOnce(rocksdb::Error) -> StateError + '_ {
    move |source| match source.kind() {
        rocksdb::ErrorKind::Corruption | rocksdb::ErrorKind::InvalidArgument => {
            StateError::Corrupt { path: path.to_path_buf(), reason: source.to_string() }
        }
        _ => StateError::Db { path: path.to_path_buf(), source },
    }
}

/// Writes `kvs` (keys strictly ascending) as one SST file at `path`, synced to disk, LZ4
/// compressed; returns its size. A `path` that exists is replaced.
pub fn write_sst<'a>(path: &Path, kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Result<u64, StateError> {
    write_sst_with(path, kvs, true)
}

/// [`write_sst`], compressed with LZ4 or not. Not, where the data does not shrink: RocksDB keeps
/// a block raw when LZ4 takes off too little, but it has tried, which cost half the write of a
/// state file of random `f64` aggregates (criterion `checkpoint/write_state_file_1m_keys_on_tmpfs`,
/// docs/benchmarks.md).
pub fn write_sst_with<'a>(
    path: &Path,
    kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    lz4: bool,
) -> Result<u64, StateError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let mut o = rocksdb::Options::default();
    o.set_compression_type(if lz4 { rocksdb::DBCompressionType::Lz4 } else { rocksdb::DBCompressionType::None });
    let mut w = rocksdb::SstFileWriter::create(&o);
    w.open(path).map_err(db_err(path))?;
    for (k, v) in kvs {
        w.put(k, v).map_err(db_err(path))?;
    }
    // `finish` writes the footer and fsyncs the file.
    w.finish().map_err(db_err(path))?;
    Ok(fs::metadata(path).map_err(io_err(path))?.len())
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io { path: path.to_path_buf(), source }
}

fn options() -> rocksdb::Options {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Operator state is rewritten whole at each checkpoint; a small memtable keeps flushes short.
    o.set_write_buffer_size(16 << 20);
    o.set_max_write_buffer_number(2);
    o.set_max_background_jobs(2);
    // Memory stays bounded as data grows: index and filter blocks live in a fixed-size cache
    // instead of one resident copy per SST file.
    let mut t = rocksdb::BlockBasedOptions::default();
    t.set_block_cache(&rocksdb::Cache::new_lru_cache(32 << 20));
    t.set_cache_index_and_filter_blocks(true);
    t.set_pin_l0_filter_and_index_blocks_in_cache(true);
    o.set_block_based_table_factory(&t);
    o
}

/// Size of a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Files in the snapshot directory.
    pub files: u32,
    /// Their total size in bytes.
    pub bytes: u64,
}

/// One task's RocksDB instance.
pub struct TaskStore {
    db: rocksdb::DB,
    path: PathBuf,
}

impl std::fmt::Debug for TaskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStore").field("path", &self.path).finish()
    }
}

impl TaskStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<TaskStore, StateError> {
        fs::create_dir_all(path).map_err(io_err(path))?;
        let db = rocksdb::DB::open(&options(), path).map_err(db_err(path))?;
        Ok(TaskStore { db, path: path.to_path_buf() })
    }

    /// Replaces whatever is at `path` with the content of `snapshot` and opens it: a copy of a
    /// RocksDB checkpoint, or a fresh store with the SST files of an SST snapshot ingested (copied:
    /// the snapshot stays as it is). An empty directory is the snapshot of an empty store.
    pub fn open_from_snapshot(snapshot: &Path, path: &Path) -> Result<TaskStore, StateError> {
        if path.exists() {
            fs::remove_dir_all(path).map_err(io_err(path))?;
        }
        if !snapshot.join("CURRENT").is_file() {
            let mut ssts = Vec::new();
            for entry in fs::read_dir(snapshot).map_err(io_err(snapshot))? {
                let p = entry.map_err(io_err(snapshot))?.path();
                if p.extension().is_none_or(|e| e != "sst") {
                    let reason = format!("{} is neither a RocksDB checkpoint nor SST files", snapshot.display());
                    return Err(StateError::Corrupt { path: snapshot.to_path_buf(), reason });
                }
                ssts.push(p);
            }
            ssts.sort();
            let store = Self::open(path)?;
            // One file at a time: the files of a chain overlap in key range (each gets its own
            // sequence number; their keys differ).
            for sst in ssts {
                store.db.ingest_external_file(vec![sst]).map_err(db_or_corrupt(snapshot))?;
            }
            return Ok(store);
        }
        copy_checkpoint(snapshot, path)?;
        Self::open(path)
    }

    /// A fresh store at `path` (replaced) with the agg window files of `snapshot` ingested
    /// (`state-*.sst`; a spill store's checkpoint beside them is left alone).
    pub fn open_from_state_files(snapshot: &Path, path: &Path) -> Result<TaskStore, StateError> {
        if path.exists() {
            fs::remove_dir_all(path).map_err(io_err(path))?;
        }
        let mut ssts = Vec::new();
        for entry in fs::read_dir(snapshot).map_err(io_err(snapshot))? {
            let p = entry.map_err(io_err(snapshot))?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with("state-") && name.ends_with(".sst") {
                ssts.push(p);
            }
        }
        ssts.sort();
        let store = Self::open(path)?;
        for sst in ssts {
            store.db.ingest_external_file(vec![sst]).map_err(db_or_corrupt(snapshot))?;
        }
        Ok(store)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `batch` atomically. State writes skip the WAL: they only matter once a snapshot
    /// (which flushes the memtable) captured them.
    pub fn write(&self, batch: rocksdb::WriteBatch) -> Result<(), StateError> {
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        self.db.write_opt(batch, &wo).map_err(db_err(&self.path))
    }

    /// Replaces the whole content of the store with `kvs` (keys strictly ascending): written as
    /// one SST file and ingested, after dropping the previous files. Nothing passes through the
    /// memtable, so a snapshot right after needs no flush: it is hard links only.
    pub fn replace_all<'a>(&self, kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Result<(), StateError> {
        let sst = self.path.with_extension("ingest.sst");
        let opts = options();
        let mut w = rocksdb::SstFileWriter::create(&opts);
        w.open(&sst).map_err(db_err(&sst))?;
        let mut any = false;
        for (k, v) in kvs {
            w.put(k, v).map_err(db_err(&sst))?;
            any = true;
        }
        // Drop every file of the previous state (our keys all lie in 0x00..0xFF).
        self.db.delete_file_in_range(&[0u8][..], &[0xFFu8; 32][..]).map_err(db_err(&self.path))?;
        if !any {
            let _ = std::fs::remove_file(&sst);
            return Ok(());
        }
        w.finish().map_err(db_err(&sst))?;
        let mut io = rocksdb::IngestExternalFileOptions::default();
        io.set_move_files(true);
        self.db.ingest_external_file_opts(&io, vec![&sst]).map_err(db_err(&self.path))
    }

    /// Reads one key.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get(key).map_err(db_err(&self.path))
    }

    /// Calls `f` for every key with `prefix`, in key order.
    pub fn scan_prefix(
        &self,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let mut ro = rocksdb::ReadOptions::default();
        let mut upper = prefix.to_vec();
        // The smallest key greater than every key with this prefix (prefixes here never end in 0xFF).
        if let Some(last) = upper.last_mut() {
            *last += 1;
        }
        ro.set_iterate_upper_bound(upper);
        let it = self.db.iterator_opt(rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward), ro);
        for item in it {
            let (k, v) = item.map_err(db_err(&self.path))?;
            f(&k, &v)?;
        }
        Ok(())
    }

    /// Flushes the memtable to SST files.
    pub fn flush(&self) -> Result<(), StateError> {
        self.db.flush().map_err(db_err(&self.path))
    }

    /// Takes a local snapshot into `dir` (which must not exist): hard links to the SST files plus
    /// copies of the small metadata files. Consistent with every write made before the call.
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotInfo, StateError> {
        checkpoint_db(&self.db, &self.path, dir)
    }
}

/// Copies the RocksDB checkpoint in `snapshot` to `path` (replaced): SST files are immutable, so
/// they are shared (hard links, copies across file systems); the rest RocksDB may rewrite, so it
/// is copied. The snapshot stays valid.
pub(crate) fn copy_checkpoint(snapshot: &Path, path: &Path) -> Result<(), StateError> {
    if path.exists() {
        fs::remove_dir_all(path).map_err(io_err(path))?;
    }
    fs::create_dir_all(path).map_err(io_err(path))?;
    for entry in fs::read_dir(snapshot).map_err(io_err(snapshot))? {
        let from = entry.map_err(io_err(snapshot))?.path();
        let to = path.join(from.file_name().expect("file name"));
        let is_sst = from.extension().is_some_and(|e| e == "sst");
        if !(is_sst && fs::hard_link(&from, &to).is_ok()) {
            fs::copy(&from, &to).map_err(io_err(&from))?;
        }
    }
    Ok(())
}

/// Takes a RocksDB checkpoint of `db` (at `path`) into `dir`, which must not exist.
pub(crate) fn checkpoint_db(db: &rocksdb::DB, path: &Path, dir: &Path) -> Result<SnapshotInfo, StateError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let cp = rocksdb::checkpoint::Checkpoint::new(db).map_err(db_err(path))?;
    cp.create_checkpoint(dir).map_err(db_err(dir))?;
    let mut info = SnapshotInfo::default();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let meta = entry.map_err(io_err(dir))?.metadata().map_err(io_err(dir))?;
        info.files += 1;
        info.bytes += meta.len();
    }
    Ok(info)
}
