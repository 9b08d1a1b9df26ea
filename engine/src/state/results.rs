//! The node's result store: window results upserted by (stream, key, window start), so a replay
//! after recovery rewrites the same values (exactly-once effect). `weir query` reads it.

use std::path::{Path, PathBuf};

use weir_wire::StreamId;

use super::{StateError, db_err, io_err};
use crate::operator::window::WindowResult;

/// The result store. Safe to share between sink tasks (RocksDB synchronises its writers).
pub struct ResultStore {
    db: rocksdb::DB,
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

impl ResultStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<ResultStore, StateError> {
        std::fs::create_dir_all(path).map_err(io_err(path))?;
        let db = rocksdb::DB::open(&super::options(), path).map_err(db_err(path))?;
        Ok(ResultStore { db, path: path.to_path_buf() })
    }

    /// Writes `results` of `stream`, replacing earlier values of the same (key, window start).
    pub fn upsert(&self, stream: StreamId, results: &[WindowResult]) -> Result<(), StateError> {
        let mut b = rocksdb::WriteBatch::default();
        for r in results {
            b.put(key(stream, r.key, r.start), value(r));
        }
        self.db.write(b).map_err(db_err(&self.path))
    }

    /// One result.
    pub fn get(&self, stream: StreamId, k: u64, start: i64) -> Result<Option<WindowResult>, StateError> {
        let kb = key(stream, k, start);
        match self.db.get(kb).map_err(db_err(&self.path))? {
            Some(v) => decode(&self.path, &kb, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Every result of `stream`, ordered by (key, window start).
    pub fn scan(&self, stream: StreamId) -> Result<Vec<WindowResult>, StateError> {
        let mut out = Vec::new();
        let prefix = stream.0.to_be_bytes();
        let mut ro = rocksdb::ReadOptions::default();
        if let Some(next) = stream.0.checked_add(1) {
            ro.set_iterate_upper_bound(next.to_be_bytes().to_vec());
        }
        let it = self.db.iterator_opt(rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward), ro);
        for item in it {
            let (k, v) = item.map_err(db_err(&self.path))?;
            out.push(decode(&self.path, &k, &v)?);
        }
        Ok(out)
    }

    /// Makes every write so far durable (WAL sync).
    pub fn sync(&self) -> Result<(), StateError> {
        self.db.flush_wal(true).map_err(db_err(&self.path))
    }
}
