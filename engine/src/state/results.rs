//! Result stores: each sink task writes its window results into a RocksDB instance of its own
//! (`tasks/<sink>/results`), in blocks keyed by (stream, window start, upstream, first key)
//! (layout and reasons in [`super::result_blocks`]), each upstream's in a column family of its
//! own (why in [`super::result_merge`]), so a replay after recovery rewrites the same
//! blocks with the same values (exactly-once effect). [`NodeResults`] reads every sink's store of
//! a node; `weir query` reads them.
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

use weir_wire::{StreamId, TaskId};

use super::result_blocks as blocks;
use super::result_merge as cfs;
use super::{SnapshotInfo, StateError, db_err, io_err};
use crate::operator::window::{WindowResult, order_of};

/// One sink's result store. Its sink writes; readers (queries, the engine's status) read beside
/// it; a restore replaces its content under a write lock.
pub struct ResultStore {
    db: RwLock<Option<rocksdb::DB>>,
    /// The upstreams' column families the store has (see [`super::result_merge`]).
    cfs: RwLock<Vec<String>>,
    path: PathBuf,
}

impl std::fmt::Debug for ResultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultStore").field("path", &self.path).finish()
    }
}

fn options() -> rocksdb::Options {
    let mut o = super::options();
    // Small memtables: a window's burst of results (160 MB at 4,000,000 keys) is flushed while it
    // arrives, and each file stored ahead of the checkpoint (`backup::ahead`); a checkpoint then
    // waits for the last memtables' flush and upload only. Commit p50 at 4,000,000 keys
    // (`weir-e2e keys`): 64 MiB 0.3-0.8 s, 16 MiB 170-210 ms, 8 MiB 105-160 ms (with two
    // memtables per column family).
    o.set_write_buffer_size(8 << 20);
    // Room for a burst while the flushes catch up: with two memtables per column family RocksDB
    // stopped the sink's writes about 20 times in 8 s at 4,000,000 keys (an agg held behind it
    // cannot take its barrier); and a flush thread per column family (RocksDB gives a quarter
    // of its background jobs to flushes, so two jobs made one). Commit p50 in three alternating
    // pairs: 80-92 ms against 126-223.
    o.set_max_write_buffer_number(6);
    o.set_max_background_jobs(8);
    // One memtable per upstream's column family: together they stay within what one took.
    o.set_db_write_buffer_size(128 << 20);
    // f64 aggregates hardly compress (LZ4 saved 45 % on them at a third of a core per 100 MB/s,
    // more than the whole sink): stored as they are.
    o.set_compression_type(rocksdb::DBCompressionType::None);
    o
}

/// The store's database options: [`options`], with flushes and compactions written past the
/// page cache where the file system allows it (see [`crate::direct_io`]: every result is
/// written once and, until a query or a restore, not read again). Reads stay buffered.
fn db_options(path: &Path) -> rocksdb::Options {
    let mut o = options();
    o.set_use_direct_io_for_flush_and_compaction(crate::direct_io::supported(path));
    o
}

fn corrupt(path: &Path, reason: String) -> StateError {
    StateError::Corrupt { path: path.to_path_buf(), reason }
}

/// Opens the store at `path` with every column family it has; returns the upstreams' ones.
fn open_db(path: &Path) -> Result<(rocksdb::DB, Vec<String>), StateError> {
    let mut names = rocksdb::DB::list_cf(&options(), path).unwrap_or_default();
    if !names.iter().any(|n| n == rocksdb::DEFAULT_COLUMN_FAMILY_NAME) {
        names.push(rocksdb::DEFAULT_COLUMN_FAMILY_NAME.into());
    }
    // Each column family with the store's options: `open_cf` would give them RocksDB's defaults
    // (64 MiB memtables, two of them, Snappy), and a restored sink stalled on its writes,
    // compressed every result and uploaded 40 MB files at each commit.
    let cfs = names.iter().map(|n| rocksdb::ColumnFamilyDescriptor::new(n, options()));
    let db = rocksdb::DB::open_cf_descriptors(&db_options(path), path, cfs).map_err(db_err(path))?;
    names.retain(|n| n != rocksdb::DEFAULT_COLUMN_FAMILY_NAME);
    names.sort();
    Ok((db, names))
}

impl ResultStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<ResultStore, StateError> {
        std::fs::create_dir_all(path).map_err(io_err(path))?;
        let (db, cfs) = open_db(path)?;
        Ok(ResultStore { db: RwLock::new(Some(db)), cfs: RwLock::new(cfs), path: path.to_path_buf() })
    }

    fn cf_names(&self) -> Vec<String> {
        self.cfs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Creates the column family `name` unless it exists.
    fn ensure_cf(&self, name: &str) -> Result<(), StateError> {
        if self.cfs.read().unwrap_or_else(|e| e.into_inner()).iter().any(|n| n == name) {
            return Ok(());
        }
        let mut g = self.db.write().unwrap_or_else(|e| e.into_inner());
        let db = g.as_mut().ok_or_else(|| StateError::Corrupt {
            path: self.path.clone(),
            reason: "the store is closed: a restore failed midway".into(),
        })?;
        if db.cf_handle(name).is_none() {
            db.create_cf(name, &options()).map_err(db_err(&self.path))?;
        }
        let mut names = self.cfs.write().unwrap_or_else(|e| e.into_inner());
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
            names.sort();
        }
        Ok(())
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

    /// Writes `results` of `stream` from `upstream`. A message from an agg (one window's results
    /// in the agg's order, as `result_chunks` cuts them) is one block, which a replay rewrites
    /// whole; anything else is sorted and cut into blocks per window first. A write replaces the
    /// blocks it writes again (same stream, window, upstream and first key), not single results
    /// inside other blocks.
    pub fn upsert(&self, stream: StreamId, upstream: TaskId, results: &[WindowResult]) -> Result<(), StateError> {
        self.write(stream, upstream, results, false).map(|_| ())
    }

    /// [`Self::upsert`], unless RocksDB would hold the write back (its flushes are behind the
    /// writes): then `Ok(false)` at once, nothing written, and the caller tries again later. A
    /// sink's worker runs other tasks meanwhile instead of sleeping in RocksDB.
    pub fn try_upsert(&self, stream: StreamId, upstream: TaskId, results: &[WindowResult]) -> Result<bool, StateError> {
        self.write(stream, upstream, results, true)
    }

    fn write(
        &self,
        stream: StreamId,
        upstream: TaskId,
        results: &[WindowResult],
        no_wait: bool,
    ) -> Result<bool, StateError> {
        let Some(first) = results.first() else { return Ok(true) };
        // One name per message: the column family is found by it twice.
        let name = cfs::cf_name(upstream);
        self.ensure_cf(&name)?;
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let cf = db.cf_handle(&name).expect("created above");
        let mut b = rocksdb::WriteBatch::default();
        let mut v = Vec::new();
        let mut put = |rs: &[WindowResult]| {
            v.clear();
            blocks::encode(rs, &mut v);
            b.put_cf(cf, blocks::block_key(stream, rs[0].start, upstream, order_of(rs[0].key)), &v);
        };
        if blocks::is_block(results) {
            debug_assert!(results.iter().all(|r| r.start == first.start));
            put(results);
        } else {
            blocks::sorted_windows(results).iter().for_each(|w| put(w));
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        wo.set_no_slowdown(no_wait);
        match db.write_opt(b, &wo) {
            Ok(()) => Ok(true),
            Err(e) if no_wait && e.kind() == rocksdb::ErrorKind::Incomplete => Ok(false),
            Err(e) => Err(db_err(&self.path)(e)),
        }
    }

    /// The result of `key` in `stream`'s window `start`: one seek per upstream that wrote to the
    /// window.
    pub fn get(&self, stream: StreamId, key: u64, start: i64) -> Result<Option<WindowResult>, StateError> {
        let prefix = blocks::window_prefix(stream, start);
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        for cf in cfs::handles(db, &self.cf_names()) {
            if let Some(r) = self.get_in(db.raw_iterator_cf(cf), &prefix, stream, key, start)? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// [`Self::get`] in one column family.
    fn get_in(
        &self,
        mut it: rocksdb::DBRawIterator<'_>,
        prefix: &[u8; 16],
        stream: StreamId,
        key: u64,
        start: i64,
    ) -> Result<Option<WindowResult>, StateError> {
        let mut upstream = 0u32;
        loop {
            // The next upstream with blocks in this window…
            let mut from = [0u8; 20];
            from[..16].copy_from_slice(prefix);
            from[16..].copy_from_slice(&upstream.to_be_bytes());
            it.seek(from);
            let Some(k) = it.key().filter(|k| k.starts_with(prefix)) else { break };
            let (_, _, up) =
                blocks::parse_key(k).ok_or_else(|| corrupt(&self.path, format!("result key of {} bytes", k.len())))?;
            // …and its block whose first key is the last at or before `key`.
            let at = blocks::block_key(stream, start, up, order_of(key));
            it.seek_for_prev(at);
            if let (Some(k), Some(v)) = (it.key(), it.value())
                && k.starts_with(&at[..20])
            {
                blocks::check(k, v).map_err(|e| corrupt(&self.path, e.to_string()))?;
                if let Some(r) = blocks::find(v, start, key) {
                    return Ok(Some(r));
                }
            }
            let Some(next) = up.0.checked_add(1) else { break };
            upstream = next;
        }
        it.status().map_err(db_err(&self.path))?;
        Ok(None)
    }

    /// Every result of `stream`, ordered by (window start, upstream, [`order_of`] key).
    pub fn scan(&self, stream: StreamId) -> Result<Vec<WindowResult>, StateError> {
        let mut out = Vec::new();
        self.for_each(stream, |r| {
            out.push(r);
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with every result of `stream`, in (window start, upstream, [`order_of`] key)
    /// order.
    pub fn for_each(
        &self,
        stream: StreamId,
        mut f: impl FnMut(WindowResult) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let prefix = stream.0.to_be_bytes();
        let upper = stream.0.checked_add(1).map(|n| n.to_be_bytes().to_vec());
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let mut it = cfs::Merged::new(db, &cfs::handles(db, &self.cf_names()), &prefix, upper);
        while let Some((k, v)) = it.next_block().map_err(db_err(&self.path))? {
            blocks::check(&k, &v).map_err(|e| corrupt(&self.path, e.to_string()))?;
            let (_, start, _) = blocks::parse_key(&k).expect("checked length");
            for r in blocks::decode(&v, start) {
                f(r)?;
            }
        }
        Ok(())
    }

    /// A page of `stream`'s results: whole blocks after the block key `after` (empty: from the
    /// first) until at least `max` results; with the last block's key when more may follow.
    pub fn page(
        &self,
        stream: StreamId,
        after: &[u8],
        max: usize,
    ) -> Result<(Vec<WindowResult>, Option<Vec<u8>>), StateError> {
        let prefix = stream.0.to_be_bytes();
        let upper = stream.0.checked_add(1).map(|n| n.to_be_bytes().to_vec());
        let from: &[u8] = if after.is_empty() { &prefix } else { after };
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let mut it = cfs::Merged::new(db, &cfs::handles(db, &self.cf_names()), from, upper);
        let mut out = Vec::new();
        while let Some((k, v)) = it.next_block().map_err(db_err(&self.path))? {
            if !after.is_empty() && &k[..] <= after {
                continue; // the block the last page ended with
            }
            blocks::check(&k, &v).map_err(|e| corrupt(&self.path, e.to_string()))?;
            let (_, start, _) = blocks::parse_key(&k).expect("checked length");
            out.extend(blocks::decode(&v, start));
            if out.len() >= max {
                return Ok((out, Some(k.to_vec())));
            }
        }
        Ok((out, None))
    }

    /// Writes the memtable to SST files: everything written so far is on disk.
    pub fn flush(&self) -> Result<(), StateError> {
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        for cf in cfs::handles(db, &self.cf_names()) {
            db.flush_cf(cf).map_err(db_err(&self.path))?;
        }
        Ok(())
    }

    /// Starts writing the memtable to an SST file in the background and returns at once (a
    /// memtable switch): called by the uploader as it takes a sink's checkpoint, so that the
    /// checkpoint finds the flush done or under way instead of starting it.
    ///
    /// Not while an earlier flush is still writing: RocksDB would wait for it before switching
    /// (a flush that would stall writes waits), seconds when the disk is behind at millions of
    /// keys. The uploader's checkpoint flushes what is left anyway.
    pub fn start_flush(&self) -> Result<(), StateError> {
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(false);
        for cf in cfs::handles(db, &self.cf_names()) {
            let pending =
                db.property_int_value_cf(cf, "rocksdb.num-immutable-mem-table").map_err(db_err(&self.path))?;
            if pending.unwrap_or(0) == 0 {
                db.flush_cf_opt(cf, &fo).map_err(db_err(&self.path))?;
            }
        }
        Ok(())
    }

    /// A number that changes whenever the store's set of SST files may have (a flush, a
    /// compaction, a new column family): the sum of the column families' version numbers.
    pub fn files_version(&self) -> Result<u64, StateError> {
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let mut v = 0u64;
        for cf in cfs::handles(db, &self.cf_names()) {
            let n = db.property_int_value_cf(cf, "rocksdb.current-super-version-number").map_err(db_err(&self.path))?;
            v = v.wrapping_add(n.unwrap_or(0)).wrapping_add(1);
        }
        Ok(v)
    }

    /// Calls `f` with the store's finished SST files (name, size), of every column family,
    /// sorted by name; they stay as they are until `f` returns (a restore waits for it).
    pub fn with_live_ssts<R>(&self, f: impl FnOnce(&Path, &[(String, u64)]) -> R) -> Result<R, StateError> {
        let g = self.db()?;
        let db = g.as_ref().expect("open");
        let mut files: Vec<(String, u64)> = db
            .live_files()
            .map_err(db_err(&self.path))?
            .into_iter()
            .map(|f| (f.name.trim_start_matches('/').to_string(), f.size as u64))
            .collect();
        files.sort();
        Ok(f(&self.path, &files))
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
        let (db, names) = open_db(&self.path)?;
        *g = Some(db);
        *self.cfs.write().unwrap_or_else(|e| e.into_inner()) = names;
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
        let (db, names) = open_db(&self.path)?;
        *g = Some(db);
        *self.cfs.write().unwrap_or_else(|e| e.into_inner()) = names;
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

    /// The first `n` results of `stream` in (key, window start) order, read in one pass that
    /// holds `n` of them at a time (a summary's sample of millions of results).
    pub fn first(&self, stream: StreamId, n: usize) -> Result<Vec<WindowResult>, StateError> {
        let mut heap: std::collections::BinaryHeap<(u64, i64, [u64; 4])> = Default::default();
        for s in &self.stores {
            s.for_each(stream, |r| {
                heap.push((r.key, r.start, [r.count, r.sum.to_bits(), r.min.to_bits(), r.max.to_bits()]));
                if heap.len() > n {
                    heap.pop(); // the largest goes
                }
                Ok(())
            })?;
        }
        let mut out: Vec<WindowResult> = heap
            .into_iter()
            .map(|(key, start, [count, sum, min, max])| WindowResult {
                key,
                start,
                count,
                sum: f64::from_bits(sum),
                min: f64::from_bits(min),
                max: f64::from_bits(max),
            })
            .collect();
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

#[cfg(test)]
mod tests;
