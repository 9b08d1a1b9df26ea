//! The uploader pool: threads that turn the state a task captured at a barrier into a snapshot
//! directory (an agg's window state as files of its [`WindowChain`], with its spill store's
//! RocksDB checkpoint when it spills; a RocksDB checkpoint of a sink's result store; or nothing
//! but the offset), upload it with [`upload_snapshot_indexed`] (only the files the task's
//! [`UploadIndex`] does not hold yet), and hand the outcome to the job's completion. A task never
//! waits for it.
//!
//! Invariants: every job's completion runs exactly once, with the captured state handed back
//! (an agg's frozen windows are let go as soon as they are written, before the upload: rows for
//! shards a snapshot holds wait until it lets go); an agg's spill store is released as soon as
//! its checkpoint is taken (or the job fails); its chain changes only after a successful upload;
//! a storage error is a failed upload, never a panic.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use super::{ReplayPoint, Store, UploadIndex, upload_snapshot_indexed};
use crate::checkpoint::{CheckpointError, UploadDone};
use crate::operator::window::FrozenState;
use crate::state::{ResultStore, SpillSnapshot, StateError, WindowChain};

/// State copied at a barrier.
#[derive(Debug)]
pub enum Captured {
    /// An agg's open windows (the written ones' entries shared with the operator until it
    /// writes to them: dropping this once written lets the operator take them back without a
    /// copy), written on the task's chain of files (the chain is held for the job: one snapshot
    /// of a task at a time), its spill store, held since the barrier, when it spills, and the
    /// replay point its manifest carries when it names windows (`operator::window::replay`).
    Window(FrozenState, Arc<Mutex<WindowChain>>, Option<SpillSnapshot>, Option<ReplayPoint>),
    /// A source's state is its offset, which the manifest (and the commit record) carry, with
    /// its offsets at its recent checkpoints (where a replay of an agg's windows starts), and
    /// per output at those taken during a replay (where a resumed one starts).
    Offset(Vec<(CheckpointId, Version)>, Vec<(CheckpointId, Vec<u64>)>),
    /// A sink's result store, checkpointed by the uploader: it holds every result written before
    /// the barrier (and perhaps some after, which a replay from this checkpoint rewrites with the
    /// same values: results are upserts of deterministic values).
    Sink(Arc<ResultStore>),
}

/// What runs when an upload ends: its outcome, and the captured state back.
pub type Completion = Box<dyn FnOnce(Result<UploadDone, CheckpointError>, Captured) + Send>;

/// One snapshot to write and ship.
pub struct UploadJob {
    /// Task.
    pub task: TaskId,
    /// Checkpoint.
    pub id: CheckpointId,
    /// The source offset in it.
    pub version: Version,
    /// The local snapshot directory to write (replaced).
    pub dir: PathBuf,
    /// The state.
    pub captured: Captured,
    /// What the task's earlier uploads stored (an abandoned checkpoint's upload may still run
    /// beside the next one's: see [`UploadIndex`]).
    pub index: Arc<Mutex<UploadIndex>>,
    /// Runs once the upload ended.
    pub done: Completion,
}

impl std::fmt::Debug for UploadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadJob").field("task", &self.task).field("id", &self.id).finish_non_exhaustive()
    }
}

impl UploadJob {
    /// What starts as soon as the job is taken, before it waits for the tasks to align: a
    /// sink's store starts writing its memtable out, so the checkpoint finds the flush done or
    /// under way. A failure shows again, and fails the job, in [`ResultStore::checkpoint`].
    fn start(&self) {
        if let Captured::Sink(results) = &self.captured
            && let Err(e) = results.start_flush()
        {
            tracing::debug!(task = %self.task, checkpoint = %self.id, error = %e, "result store flush not started");
        }
    }

    fn run(&mut self, store: &dyn Store, stream: StreamId) -> Result<UploadDone, CheckpointError> {
        let t0 = Instant::now();
        let (task, id) = (self.task, self.id);
        let failed = |reason: String, retryable: bool| CheckpointError::Upload { task, id, reason, retryable };
        let state = |e: StateError| failed(e.to_string(), e.is_retryable());
        let io = |e: std::io::Error| failed(format!("{}: {e}", self.dir.display()), true);
        let _ = std::fs::remove_dir_all(&self.dir);
        let mut chain_write = None;
        let chain = match &self.captured {
            Captured::Window(_, chain, ..) => Some(chain.clone()),
            _ => None,
        };
        let mut chain = chain.as_ref().map(|c| c.lock().unwrap_or_else(|e| e.into_inner()));
        let mut head = crate::backup::ManifestHead::from(self.version);
        match &mut self.captured {
            Captured::Window(copy, _, spill, point) => {
                if let Some(spill) = spill.take() {
                    // First: the agg spills again once this is taken.
                    let info = spill.write_into(&self.dir).map_err(state)?;
                    tracing::debug!(task = %task, files = info.files, bytes = info.bytes, "spill store checkpointed");
                }
                let held = chain.as_ref().expect("locked above");
                let entries = copy.len();
                // The operator gets its shards back once they are encoded, before the file is
                // written and long before the upload (it copies any shard a snapshot holds
                // when the rows waiting for it grow too many, or at the next barrier).
                let w = held.write(copy, id, &self.dir).map_err(state)?;
                tracing::debug!(task = %task, entries, bytes = w.bytes, full = w.full, files = w.files.len(), write_us = t0.elapsed().as_micros() as u64, "state snapshot written");
                *copy = FrozenState::default();
                chain_write = Some(w);
                head.replay = point.take();
            }
            Captured::Offset(offsets, outputs) => {
                std::fs::create_dir_all(&self.dir).map_err(io)?;
                head.offsets = std::mem::take(offsets);
                head.outputs = std::mem::take(outputs);
            }
            Captured::Sink(results) => {
                let info = results.checkpoint(&self.dir).map_err(state)?;
                tracing::debug!(task = %task, files = info.files, bytes = info.bytes, write_us = t0.elapsed().as_micros() as u64, "result store checkpointed");
            }
        }
        let up = upload_snapshot_indexed(store, stream, task, id, head, &self.dir, &self.index)
            .map_err(|e| failed(e.to_string(), e.is_retryable()))?;
        if let (Some(chain), Some(w)) = (chain.as_mut(), chain_write) {
            chain.accept(w);
        }
        Ok(UploadDone {
            manifest_crc: up.manifest_crc,
            bytes: up.bytes,
            files: up.files,
            upload_us: t0.elapsed().as_micros() as u64,
        })
    }
}

/// The longest an upload waits for the engine's tasks to finish aligning.
const ALIGNMENT_WAIT: Duration = Duration::from_millis(20);

/// Waits (at most `ALIGNMENT_WAIT`) until no task of the engine is between a checkpoint's start
/// and its snapshot. The first task to snapshot would otherwise write its state file on a core
/// that another task is aligning or copying state on: milliseconds of pause on two cores, for
/// work that can as well start a millisecond later.
pub(super) fn wait_for_alignment(aligning: &AtomicUsize) {
    let t0 = Instant::now();
    while aligning.load(Ordering::Relaxed) > 0 && t0.elapsed() < ALIGNMENT_WAIT {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The pool's threads and its job queue.
#[derive(Debug)]
pub struct UploaderPool {
    jobs: Sender<UploadJob>,
    threads: Vec<JoinHandle<()>>,
    ahead: super::ahead::AheadUploader,
}

impl UploaderPool {
    /// Starts `n` threads shipping into `store`; each runs `init` first (its scheduling class)
    /// and holds its jobs while `aligning` is above zero, for at most 20 ms.
    pub fn start(
        n: usize,
        store: Arc<dyn Store>,
        stream: StreamId,
        aligning: Arc<AtomicUsize>,
        init: fn(),
    ) -> std::io::Result<Self> {
        let ahead = super::ahead::AheadUploader::start(store.clone(), stream, aligning.clone(), init)?;
        let (jobs, rx): (Sender<UploadJob>, Receiver<UploadJob>) = crossbeam_channel::unbounded();
        let threads = (0..n.max(1))
            .map(|i| {
                let (rx, store, aligning) = (rx.clone(), store.clone(), aligning.clone());
                std::thread::Builder::new()
                    .name(format!("weir-upload-{i}"))
                    .spawn(move || {
                        init();
                        for mut job in rx {
                            job.start();
                            wait_for_alignment(&aligning);
                            let result = job.run(store.as_ref(), stream);
                            match &result {
                                Ok(u) => tracing::debug!(task = %job.task, checkpoint = %job.id, us = u.upload_us, bytes = u.bytes, files = u.files, "snapshot uploaded"),
                                Err(e) => tracing::warn!(task = %job.task, checkpoint = %job.id, error = %e, "snapshot upload failed"),
                            }
                            (job.done)(result, job.captured);
                        }
                    })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Self { jobs, threads, ahead })
    }

    /// Stores `w`'s new SST files ahead of its checkpoints from now on (see [`super::ahead`]).
    pub fn store_ahead(&self, w: super::ahead::Watched) {
        self.ahead.watch(w);
    }

    /// The job queue (the pool ends once every sender is dropped and the queue is empty).
    pub fn jobs(&self) -> Sender<UploadJob> {
        self.jobs.clone()
    }

    /// Waits for the queued jobs; call once every other job sender is dropped.
    pub fn join(self) {
        // First: it would store files that no checkpoint will name.
        drop(self.ahead);
        drop(self.jobs);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use crossbeam_channel::bounded;
    use weir_wire::{CheckpointId, StreamId, TaskId, Version};

    use super::*;
    use crate::backup::LocalDirStore;
    use crate::backup::test_store::HookedStore;
    use crate::operator::window::{WindowAgg, WindowSpec};

    #[test]
    fn an_agg_gets_its_shards_back_once_its_state_is_written_not_once_it_is_uploaded() {
        let dir = tempfile::tempdir().unwrap();
        let (entered_tx, entered) = bounded(1);
        let (open, open_rx) = bounded::<()>(0);
        // Puts wait until the test lets them go.
        let store = HookedStore::new(LocalDirStore::new(dir.path().join("remote")), move |inner, key, bytes| {
            let _ = entered_tx.try_send(());
            let _ = open_rx.recv_timeout(Duration::from_secs(10));
            inner.put(key, bytes)
        });
        let pool = UploaderPool::start(1, Arc::new(store), StreamId(1), Arc::new(AtomicUsize::new(0)), || {}).unwrap();
        let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
        (0..10_000u64).for_each(|k| agg.add(1, k, 1.0));
        let frozen = agg.freeze();
        let probe = frozen.windows[0].1[0].clone();
        assert_eq!(Arc::strong_count(&probe), 3, "the agg, the snapshot and the probe");
        let (done_tx, done) = bounded(1);
        let job = UploadJob {
            task: TaskId(2),
            id: CheckpointId(1),
            version: Version(0),
            dir: dir.path().join("chk-1"),
            captured: Captured::Window(frozen, Default::default(), None, None),
            index: Arc::new(Mutex::new(UploadIndex::new())),
            done: Box::new(move |r, _| {
                let _ = done_tx.send(r.is_ok());
            }),
        };
        pool.jobs().send(job).unwrap();
        entered.recv_timeout(Duration::from_secs(10)).expect("the upload started");
        assert_eq!(Arc::strong_count(&probe), 2, "released while the upload is under way");
        drop(open);
        assert_eq!(done.recv_timeout(Duration::from_secs(10)), Ok(true));
        pool.join();
    }

    #[test]
    fn an_aggs_second_upload_sends_what_changed_since_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(LocalDirStore::new(dir.path().join("remote")));
        let pool = UploaderPool::start(1, store.clone(), StreamId(1), Arc::new(AtomicUsize::new(0)), || {}).unwrap();
        let mut agg = WindowAgg::new(WindowSpec::tumbling(3_600_000), 0, 1);
        (0..200_000u64).for_each(|k| agg.add(1, k, 1.0));
        let (chain, index) = (Arc::new(Mutex::new(WindowChain::new())), Arc::new(Mutex::new(UploadIndex::new())));
        let upload = |id: u64, captured: Captured| {
            let (tx, rx) = bounded(1);
            let job = UploadJob {
                task: TaskId(2),
                id: CheckpointId(id),
                version: Version(0),
                dir: dir.path().join(format!("chk-{id}")),
                captured,
                index: index.clone(),
                done: Box::new(move |r, _| {
                    let _ = tx.send(r);
                }),
            };
            pool.jobs().send(job).unwrap();
            rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap()
        };
        let first = upload(1, Captured::Window(agg.freeze(), chain.clone(), None, None));
        (0..2_000u64).for_each(|k| agg.add(2, k * 100, 1.0));
        let second = upload(2, Captured::Window(agg.freeze(), chain.clone(), None, None));
        assert!(second.bytes * 20 < first.bytes, "second upload {} bytes, first {}", second.bytes, first.bytes);
        assert_eq!(second.files, 2, "the first file and a delta");
        // The second checkpoint restores the whole state from the store alone.
        let m = crate::backup::download_snapshot(
            store.as_ref(),
            StreamId(1),
            TaskId(2),
            CheckpointId(2),
            Some(second.manifest_crc),
            &dir.path().join("dl"),
        )
        .unwrap();
        assert_eq!(m.files.len(), 2);
        let db = crate::state::TaskStore::open_from_snapshot(&dir.path().join("dl"), &dir.path().join("db")).unwrap();
        let mut back = WindowAgg::new(WindowSpec::tumbling(3_600_000), 0, 1);
        assert!(crate::state::load_window_state(&db, &mut back).unwrap());
        let (mut a, mut b): (Vec<_>, Vec<_>) = (agg.state().collect(), back.state().collect());
        a.sort_by_key(|e| e.1);
        b.sort_by_key(|e| e.1);
        assert!(a == b, "the restored state differs");
        pool.join();
    }
}
