//! An agg's spill store in its own RocksDB instance ([`SpillDb`]), and its snapshots.
//!
//! ```text
//! key                                                   value
//! b'p' start:i64 order:u64 run:u32 (big-endian; start   key:u64 count:u64 sum_fx:i128 min:f64 max:f64
//!      with its sign bit flipped so keys sort by time)   (little-endian, 48 bytes)
//! b'r' run:u32                                          (empty: run `run` was written)
//! ```
//!
//! A run is written as one SST file and ingested (sorted already: no memtable, no compaction
//! ahead of it); a fired window's partials go with a range deletion. A snapshot is a RocksDB
//! checkpoint of the store taken by the uploader; the store is *held* from the barrier until
//! then ([`SpillSnapshot`]), so the checkpoint holds exactly the runs written before the barrier
//! (the agg writes no run and drops no window while held).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{StateError, TaskStore, db_err, io_err};
use crate::operator::window::{Acc, RunWriter, SpillError, SpillStore};

const PARTIAL: u8 = b'p';
const RUN: u8 = b'r';

fn flip(start: i64) -> [u8; 8] {
    ((start as u64) ^ (1 << 63)).to_be_bytes()
}

fn partial_key(start: i64, order: u64, run: u32) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = PARTIAL;
    k[1..9].copy_from_slice(&flip(start));
    k[9..17].copy_from_slice(&order.to_be_bytes());
    k[17..21].copy_from_slice(&run.to_be_bytes());
    k
}

/// The first key after every partial of window `start`.
fn after_window(start: i64) -> Vec<u8> {
    match start.checked_add(1) {
        Some(next) => [&[PARTIAL][..], &flip(next)].concat(),
        None => vec![PARTIAL + 1],
    }
}

/// One agg task's spill store.
#[derive(Debug)]
pub struct SpillDb {
    store: TaskStore,
    held: AtomicBool,
}

impl SpillDb {
    /// A new, empty store in a fresh directory under `root` (older ones there are removed: an
    /// upload of an earlier incarnation may still hold its store open, so the name is new).
    pub fn fresh(root: &Path) -> Result<Arc<SpillDb>, StateError> {
        Self::open_in(root, None)
    }

    /// The store of a snapshot directory `snapshot` (the RocksDB checkpoint among its files;
    /// none: an empty store), copied into a fresh directory under `root`.
    pub fn restore(snapshot: &Path, root: &Path) -> Result<Arc<SpillDb>, StateError> {
        Self::open_in(root, Some(snapshot))
    }

    fn open_in(root: &Path, snapshot: Option<&Path>) -> Result<Arc<SpillDb>, StateError> {
        if let Ok(old) = std::fs::read_dir(root) {
            for e in old.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = root.join(format!("{nanos}"));
        if let Some(snap) = snapshot.filter(|s| s.join("CURRENT").is_file()) {
            std::fs::create_dir_all(&path).map_err(io_err(&path))?;
            for e in std::fs::read_dir(snap).map_err(io_err(snap))? {
                let from = e.map_err(io_err(snap))?.path();
                let name = from.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                if name.starts_with("state-") {
                    continue; // the agg's window files beside the checkpoint
                }
                let to = path.join(&name);
                if !(name.ends_with(".sst") && std::fs::hard_link(&from, &to).is_ok()) {
                    std::fs::copy(&from, &to).map_err(io_err(&from))?;
                }
            }
        }
        Ok(Arc::new(SpillDb { store: TaskStore::open(&path)?, held: AtomicBool::new(false) }))
    }

    /// Holds the store for a snapshot: no run is written or window dropped until the returned
    /// guard has taken its checkpoint or is dropped.
    pub fn hold(self: &Arc<Self>) -> SpillSnapshot {
        self.held.store(true, Ordering::Release);
        SpillSnapshot { db: self.clone() }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        self.store.path()
    }
}

/// A held [`SpillDb`], for the snapshot of a barrier; dropping it lets the agg spill again.
#[derive(Debug)]
pub struct SpillSnapshot {
    db: Arc<SpillDb>,
}

impl SpillSnapshot {
    /// Writes the store's RocksDB checkpoint into `dir` (created if need be; its files sit
    /// beside the agg's window files), then lets the agg go on.
    pub fn write_into(self, dir: &Path) -> Result<super::SnapshotInfo, StateError> {
        let tmp: PathBuf = dir.with_extension("spill-tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        let info = super::checkpoint_db(&self.db.store.db, self.db.path(), &tmp)?;
        drop(self); // released: the checkpoint holds what was spilled before the barrier
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        for e in std::fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let from = e.map_err(io_err(&tmp))?.path();
            let to = dir.join(from.file_name().expect("a file name"));
            std::fs::rename(&from, &to).map_err(io_err(&from))?;
        }
        std::fs::remove_dir(&tmp).map_err(io_err(&tmp))?;
        Ok(info)
    }
}

impl Drop for SpillSnapshot {
    fn drop(&mut self) {
        self.db.held.store(false, Ordering::Release);
    }
}

/// Options of the runs' SST writer (it borrows them for its life).
static RUN_OPTIONS: std::sync::LazyLock<rocksdb::Options> = std::sync::LazyLock::new(rocksdb::Options::default);

/// [`SpillDb`] as the agg's [`SpillStore`].
#[derive(Debug)]
pub struct RocksSpill(pub Arc<SpillDb>);

fn spill_err(path: &Path) -> impl Fn(StateError) -> SpillError + '_ {
    move |e| SpillError { path: path.display().to_string(), retryable: e.is_retryable(), reason: e.to_string() }
}

struct RocksRun<'a> {
    db: &'a SpillDb,
    run: u32,
    path: PathBuf,
    writer: rocksdb::SstFileWriter<'static>,
}

impl RunWriter for RocksRun<'_> {
    fn put(&mut self, start: i64, order: u64, key: u64, acc: &Acc) -> Result<(), SpillError> {
        let mut v = [0u8; 48];
        v[0..8].copy_from_slice(&key.to_le_bytes());
        v[8..16].copy_from_slice(&acc.count.to_le_bytes());
        v[16..32].copy_from_slice(&acc.sum_fx.to_le_bytes());
        v[32..40].copy_from_slice(&acc.min.to_le_bytes());
        v[40..48].copy_from_slice(&acc.max.to_le_bytes());
        self.writer
            .put(partial_key(start, order, self.run), v)
            .map_err(|e| spill_err(&self.path)(db_err(&self.path)(e)))
    }

    fn finish(mut self: Box<Self>) -> Result<(), SpillError> {
        let err = |e| spill_err(&self.path)(db_err(&self.path)(e));
        let mut marker = [RUN, 0, 0, 0, 0];
        marker[1..5].copy_from_slice(&self.run.to_be_bytes());
        self.writer.put(marker, []).map_err(err)?;
        self.writer.finish().map_err(err)?;
        let mut io = rocksdb::IngestExternalFileOptions::default();
        io.set_move_files(true);
        self.db.store.db.ingest_external_file_opts(&io, vec![&self.path]).map_err(err)
    }
}

impl SpillStore for RocksSpill {
    fn begin_run(&mut self, run: u32) -> Result<Box<dyn RunWriter + '_>, SpillError> {
        let db = &*self.0;
        let path = db.path().with_extension("run.sst");
        let writer = rocksdb::SstFileWriter::create(&RUN_OPTIONS);
        writer.open(&path).map_err(|e| spill_err(&path)(db_err(&path)(e)))?;
        Ok(Box::new(RocksRun { db, run, path, writer }))
    }

    fn read(&self, start: i64, lo: u64, hi: u64, f: &mut dyn FnMut(u64, u64, Acc)) -> Result<(), SpillError> {
        let path = self.0.path();
        let corrupt = |reason: String| SpillError { path: path.display().to_string(), reason, retryable: false };
        let from = partial_key(start, lo, 0);
        let mut upper = partial_key(start, hi, u32::MAX).to_vec();
        upper.push(0);
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(upper);
        let it = self.0.store.db.iterator_opt(rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward), ro);
        for item in it {
            let (k, v) = item.map_err(|e| spill_err(path)(db_err(path)(e)))?;
            if k.len() != 21 || v.len() != 48 {
                return Err(corrupt(format!("a partial of {}+{} bytes", k.len(), v.len())));
            }
            let order = u64::from_be_bytes(k[9..17].try_into().expect("8"));
            let acc = Acc {
                count: u64::from_le_bytes(v[8..16].try_into().expect("8")),
                sum_fx: i128::from_le_bytes(v[16..32].try_into().expect("16")),
                min: f64::from_le_bytes(v[32..40].try_into().expect("8")),
                max: f64::from_le_bytes(v[40..48].try_into().expect("8")),
            };
            f(order, u64::from_le_bytes(v[0..8].try_into().expect("8")), acc);
        }
        Ok(())
    }

    fn drop_window(&mut self, start: i64) -> Result<(), SpillError> {
        let path = self.0.path();
        let from = [&[PARTIAL][..], &flip(start)].concat();
        let to = after_window(start);
        let mut b = rocksdb::WriteBatch::default();
        b.delete_range(&from, &to);
        self.0.store.write(b).map_err(spill_err(path))?;
        // Files wholly inside the range go at once (the deletion covers the rest until
        // compaction).
        self.0.store.db.delete_file_in_range(&from, &to).map_err(|e| spill_err(path)(db_err(path)(e)))
    }

    fn held(&self) -> bool {
        self.0.held.load(Ordering::Acquire)
    }

    fn next_run(&self) -> u32 {
        let mut it = self.0.store.db.iterator(rocksdb::IteratorMode::From(&[RUN + 1], rocksdb::Direction::Reverse));
        match it.next() {
            Some(Ok((k, _))) if k.len() == 5 && k[0] == RUN => u32::from_be_bytes(k[1..5].try_into().expect("4")) + 1,
            _ => 0,
        }
    }

    fn windows(&self) -> Result<Vec<i64>, SpillError> {
        let path = self.0.path();
        let mut out = Vec::new();
        let mut from = vec![PARTIAL];
        loop {
            let mut it = self.0.store.db.iterator(rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward));
            match it.next() {
                Some(Ok((k, _))) if k.len() == 21 && k[0] == PARTIAL => {
                    let start = (u64::from_be_bytes(k[1..9].try_into().expect("8")) ^ (1 << 63)) as i64;
                    out.push(start);
                    from = after_window(start);
                }
                Some(Err(e)) => return Err(spill_err(path)(db_err(path)(e))),
                _ => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::window::{WindowAgg, WindowResult, WindowSpec};
    use crate::state::{TaskStore, load_window_state, write_window_snapshot};

    /// Rows over 100,000 keys in 100 ms windows, a batch at a time, with progress and sliced
    /// emission after each; returns the results of batches `from..to`.
    fn feed(agg: &mut WindowAgg, from: u64, to: u64, out: &mut Vec<WindowResult>) {
        for b in from..to {
            let mut adder = agg.batch();
            for i in 0..5_000u64 {
                let o = b * 5_000 + i;
                let h = o.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
                adder.add((o / 400) as i64 - (h % 7) as i64, h % 100_000, (h % 1000) as f64 / 4.0);
            }
            drop(adder);
            agg.maybe_spill().unwrap();
            agg.observe(0, (b * 5_000 + 4_999) as i64 / 400);
            agg.emit_fired(3_000, |r| out.push(r)).unwrap();
        }
    }

    #[test]
    fn a_spilling_agg_snapshotted_while_held_restores_to_the_results_of_one_that_never_spilled() {
        let dir = tempfile::tempdir().unwrap();
        let spec = WindowSpec::tumbling(100);
        let mut want = Vec::new();
        let mut straight = WindowAgg::new(spec, 10, 1);
        feed(&mut straight, 0, 120, &mut want);
        straight.advance(0, i64::MAX, |r| want.push(r)).unwrap();

        let db = SpillDb::fresh(&dir.path().join("spill-a")).unwrap();
        let mut agg = WindowAgg::new(spec, 10, 1);
        agg.set_spill(Box::new(RocksSpill(db.clone())), 2 << 20).unwrap();
        let mut got = Vec::new();
        feed(&mut agg, 0, 60, &mut got);
        assert!(agg.spills().unwrap() >= 3, "{:?} spills", agg.spills());
        // The barrier: the store is held until its checkpoint is taken, and the agg goes on.
        let snap = db.hold();
        let frozen = agg.freeze();
        let emitted = got.len();
        let spills = agg.spills();
        feed(&mut agg, 60, 70, &mut Vec::new());
        assert_eq!(agg.spills(), spills, "no run is written while the store is held");
        let chk = dir.path().join("chk");
        snap.write_into(&chk).unwrap();
        write_window_snapshot(&frozen, &chk.join("state-00000000000000000001.sst")).unwrap();
        feed(&mut agg, 70, 80, &mut Vec::new()); // spills again, after the checkpoint
        drop((agg, db));

        let state = TaskStore::open_from_state_files(&chk, &dir.path().join("db")).unwrap();
        let mut back = WindowAgg::new(spec, 10, 1);
        assert!(load_window_state(&state, &mut back).unwrap());
        let db = SpillDb::restore(&chk, &dir.path().join("spill-b")).unwrap();
        back.set_spill(Box::new(RocksSpill(db)), 2 << 20).unwrap();
        got.truncate(emitted);
        feed(&mut back, 60, 120, &mut got);
        back.advance(0, i64::MAX, |r| got.push(r)).unwrap();
        let key = |r: &WindowResult| (r.start, r.key);
        got.sort_by_key(key);
        want.sort_by_key(key);
        assert!(want.len() > 100_000);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "results differ from the run that never spilled");
    }

    #[test]
    fn a_fired_windows_partials_are_dropped_and_runs_number_on_after_a_restore() {
        let dir = tempfile::tempdir().unwrap();
        let db = SpillDb::fresh(&dir.path().join("s")).unwrap();
        let mut s = RocksSpill(db.clone());
        let a = Acc { count: 1, sum_fx: 1, min: 1.0, max: 1.0 };
        for run in 0..3 {
            let mut w = s.begin_run(run).unwrap();
            for start in [-100i64, 0, 100] {
                w.put(start, 5, 7, &a).unwrap();
            }
            w.finish().unwrap();
        }
        assert_eq!((s.next_run(), s.windows().unwrap()), (3, vec![-100, 0, 100]));
        let mut seen = Vec::new();
        s.read(0, 0, u64::MAX, &mut |o, k, acc| seen.push((o, k, acc.count))).unwrap();
        assert_eq!(seen, vec![(5, 7, 1); 3], "one partial per run, in order");
        s.drop_window(0).unwrap();
        assert_eq!(s.windows().unwrap(), vec![-100, 100]);
        let chk = dir.path().join("chk");
        db.hold().write_into(&chk).unwrap();
        assert!(!s.held(), "released once the checkpoint is taken");
        let back = RocksSpill(SpillDb::restore(&chk, &dir.path().join("t")).unwrap());
        assert_eq!((back.next_run(), back.windows().unwrap()), (3, vec![-100, 100]));
    }
}
