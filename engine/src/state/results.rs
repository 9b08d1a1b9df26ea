//! Result stores: each sink task upserts its window results into a RocksDB instance of its own
//! (`tasks/<sink>/results`), by (stream, key, window start), so a replay after recovery rewrites
//! the same values (exactly-once effect). [`NodeResults`] reads every sink's store of a node;
//! `weir query` reads them.
//!
//! Invariants:
//! - A sink's results are part of its checkpoints: [`ResultStore::checkpoint`] takes a RocksDB
//!   checkpoint (a flush, hard links to the SST files, copies of the small files), which the
//!   uploader ships like any snapshot, and [`ResultStore::restore_from`] puts one back. Any node
//!   can therefore restore any sink's share of the results.
//! - Writes skip the write-ahead log. Checkpoints and replay make results durable: a crash loses
//!   at most what the memtable held, and a restart restores the sink's last committed checkpoint
//!   over it and replays from there. A clean close flushes the memtable (RocksDB does so when
//!   writes skipped the log), so a stopped engine's results are all on disk.

use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard};

use weir_wire::StreamId;

use super::{SnapshotInfo, StateError, db_err, io_err};
use crate::operator::window::WindowResult;

/// One sink's result store. Its sink writes; readers (queries, the engine's status) read beside
/// it; a restore replaces its content under a write lock.
pub struct ResultStore {
    db: RwLock<Option<rocksdb::DB>>,
    path: PathBuf,
}

impl std::fmt::Debug for ResultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultStore").field("path", &self.path).finish()
    }
}

fn key(stream: StreamId, key: u64, start: i64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[0..8].copy_from_slice(&stream.0.to_be_bytes());
    k[8..16].copy_from_slice(&key.to_be_bytes());
    k[16..24].copy_from_slice(&((start as u64) ^ (1 << 63)).to_be_bytes());
    k
}

fn value(r: &WindowResult) -> [u8; 32] {
    let mut v = [0u8; 32];
    v[0..8].copy_from_slice(&r.count.to_le_bytes());
    v[8..16].copy_from_slice(&r.sum.to_le_bytes());
    v[16..24].copy_from_slice(&r.min.to_le_bytes());
    v[24..32].copy_from_slice(&r.max.to_le_bytes());
    v
}

fn decode(path: &Path, k: &[u8], v: &[u8]) -> Result<WindowResult, StateError> {
    if k.len() != 24 || v.len() != 32 {
        let reason = format!("result entry of {}+{} bytes", k.len(), v.len());
        return Err(StateError::Corrupt { path: path.to_path_buf(), reason });
    }
    let f = |b: &[u8], i: usize| <[u8; 8]>::try_from(&b[i..i + 8]).expect("8 bytes");
    Ok(WindowResult {
        key: u64::from_be_bytes(f(k, 8)),
        start: (u64::from_be_bytes(f(k, 16)) ^ (1 << 63)) as i64,
        count: u64::from_le_bytes(f(v, 0)),
        sum: f64::from_le_bytes(f(v, 8)),
        min: f64::from_le_bytes(f(v, 16)),
        max: f64::from_le_bytes(f(v, 24)),
    })
}

fn options() -> rocksdb::Options {
    let mut o = super::options();
    // Results are written once per window and read by key ranges: larger memtables mean fewer,
    // larger L0 files per checkpoint interval.
    o.set_write_buffer_size(64 << 20);
    o
}

impl ResultStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<ResultStore, StateError> {
        std::fs::create_dir_all(path).map_err(io_err(path))?;
        let db = rocksdb::DB::open(&options(), path).map_err(db_err(path))?;
        Ok(ResultStore { db: RwLock::new(Some(db)), path: path.to_path_buf() })
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn db(&self) -> Result<RwLockReadGuard<'_, Option<rocksdb::DB>>, StateError> {
        let g = self.db.read().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let reason = "the store is closed: a restore failed midway".to_string();
            return Err(StateError::Corrupt { path: self.path.clone(), reason });
        }
        Ok(g)
    }

    /// Writes `results` of `stream`, replacing earlier values of the same (key, window start).
    pub fn upsert(&self, stream: StreamId, results: &[WindowResult]) -> Result<(), StateError> {
        let mut b = rocksdb::WriteBatch::default();
        for r in results {
            b.put(key(stream, r.key, r.start), value(r));
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        let g = self.db()?;
        g.as_ref().expect("open").write_opt(b, &wo).map_err(db_err(&self.path))
    }

    /// One result.
    pub fn get(&self, stream: StreamId, k: u64, start: i64) -> Result<Option<WindowResult>, StateError> {
        let kb = key(stream, k, start);
        let g = self.db()?;
        match g.as_ref().expect("open").get(kb).map_err(db_err(&self.path))? {
            Some(v) => decode(&self.path, &kb, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Every result of `stream`, ordered by (key, window start).
    pub fn scan(&self, stream: StreamId) -> Result<Vec<WindowResult>, StateError> {
        let mut out = Vec::new();
        self.for_each(stream, |r| {
            out.push(r);
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with every result of `stream`, in (key, window start) order.
    pub fn for_each(
        &self,
        stream: StreamId,
        mut f: impl FnMut(WindowResult) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let prefix = stream.0.to_be_bytes();
        let mut ro = rocksdb::ReadOptions::default();
        if let Some(next) = stream.0.checked_add(1) {
            ro.set_iterate_upper_bound(next.to_be_bytes().to_vec());
        }
        let g = self.db()?;
        let it = g
            .as_ref()
            .expect("open")
            .iterator_opt(rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward), ro);
        for item in it {
            let (k, v) = item.map_err(db_err(&self.path))?;
            f(decode(&self.path, &k, &v)?)?;
        }
        Ok(())
    }

    /// Writes the memtable to SST files: everything written so far is on disk.
    pub fn flush(&self) -> Result<(), StateError> {
        let g = self.db()?;
        g.as_ref().expect("open").flush().map_err(db_err(&self.path))
    }

    /// Starts writing the memtable to an SST file in the background and returns at once (a
    /// memtable switch): called at the barrier, so that the checkpoint that follows finds the
    /// flush done or under way instead of starting it.
    pub fn start_flush(&self) -> Result<(), StateError> {
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(false);
        let g = self.db()?;
        g.as_ref().expect("open").flush_opt(&fo).map_err(db_err(&self.path))
    }

    /// Takes a RocksDB checkpoint into `dir` (which must not exist): the memtable flushed, hard
    /// links to the SST files, copies of the small files. It holds every write made before the
    /// call (and possibly some made during it, which a replay rewrites with the same values).
    pub fn checkpoint(&self, dir: &Path) -> Result<SnapshotInfo, StateError> {
        let g = self.db()?;
        super::checkpoint_db(g.as_ref().expect("open"), &self.path, dir)
    }

    /// Replaces the store's content with the checkpoint in `snapshot` (which stays as it is).
    pub fn restore_from(&self, snapshot: &Path) -> Result<(), StateError> {
        let mut g = self.db.write().unwrap_or_else(|e| e.into_inner());
        // Closed first: RocksDB holds the directory's lock and files.
        drop(g.take());
        super::copy_checkpoint(snapshot, &self.path)?;
        *g = Some(rocksdb::DB::open(&options(), &self.path).map_err(db_err(&self.path))?);
        Ok(())
    }

    /// Drops every result (a start from nothing).
    pub fn clear(&self) -> Result<(), StateError> {
        let mut g = self.db.write().unwrap_or_else(|e| e.into_inner());
        drop(g.take());
        if self.path.exists() {
            std::fs::remove_dir_all(&self.path).map_err(io_err(&self.path))?;
        }
        std::fs::create_dir_all(&self.path).map_err(io_err(&self.path))?;
        *g = Some(rocksdb::DB::open(&options(), &self.path).map_err(db_err(&self.path))?);
        Ok(())
    }
}

/// Where sink `task` of a node with data directory `data` keeps its results.
pub fn result_store_dir(data: &Path, task: weir_wire::TaskId) -> PathBuf {
    data.join("tasks").join(task.0.to_string()).join("results")
}

/// The result stores of one node's sinks, read together.
#[derive(Debug, Default, Clone)]
pub struct NodeResults {
    stores: Vec<std::sync::Arc<ResultStore>>,
}

impl NodeResults {
    /// The node's sinks' stores.
    pub fn new(stores: Vec<std::sync::Arc<ResultStore>>) -> Self {
        Self { stores }
    }

    /// Opens every sink's result store under the data directory `data` (of an engine that is
    /// not running: RocksDB allows one process per store).
    pub fn open(data: &Path) -> Result<NodeResults, StateError> {
        let tasks = data.join("tasks");
        let mut stores = Vec::new();
        let entries = match std::fs::read_dir(&tasks) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NodeResults::default()),
            Err(e) => return Err(StateError::Io { path: tasks, source: e }),
        };
        let mut dirs: Vec<PathBuf> =
            entries.flatten().map(|e| e.path().join("results")).filter(|p| p.join("CURRENT").is_file()).collect();
        dirs.sort();
        for d in dirs {
            stores.push(std::sync::Arc::new(ResultStore::open(&d)?));
        }
        Ok(NodeResults { stores })
    }

    /// Every result of `stream` on the node, ordered by (key, window start). Each key belongs to
    /// one sink, so the stores' results never overlap.
    pub fn scan(&self, stream: StreamId) -> Result<Vec<WindowResult>, StateError> {
        let mut out = Vec::new();
        for s in &self.stores {
            s.for_each(stream, |r| {
                out.push(r);
                Ok(())
            })?;
        }
        out.sort_unstable_by_key(|r| (r.key, r.start));
        Ok(out)
    }

    /// One result, from whichever sink holds it.
    pub fn get(&self, stream: StreamId, k: u64, start: i64) -> Result<Option<WindowResult>, StateError> {
        for s in &self.stores {
            if let Some(r) = s.get(stream, k, start)? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// The stores, one per local sink.
    pub fn stores(&self) -> &[std::sync::Arc<ResultStore>] {
        &self.stores
    }
}
