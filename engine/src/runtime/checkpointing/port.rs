//! The engine's side of a task's [`TaskDriver`]: [`EnginePort`] (the running task as a
//! [`TaskPort`]) and [`EngineTaskFx`] (control queues, the transport, the uploader pool, the meta
//! record, the clock as [`TaskEffects`]). [`TaskCheckpointing`] holds the three for one task,
//! owned by the task's worker: no lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use weir_wire::msg::RestoreBasis;
use weir_wire::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

use super::agg_snapshot;
use super::net::ProtoNet;
use super::rescale;
use super::restore::{self, snapshot_dir};
use super::stats::CheckpointLog;
use crate::backup::uploader::{Captured, UploadJob};
use crate::backup::{Store, UploadIndex};
use crate::checkpoint::driver::{Clock, Hold, RestorePoint, Signal, TaskDriver, TaskEffects, TaskPort, UploadRequest};
use crate::checkpoint::{CheckpointError, CoordInput, Shape, TaskInput};
use crate::runtime::control::{Control, ControlHandle};
use crate::runtime::replay::SourceReplay;
use crate::runtime::task::{Feed, Task};
use crate::state::WindowChain;

/// What the port needs besides the task.
pub(crate) struct PortCtx {
    pub(crate) task: TaskId,
    pub(crate) stream: StreamId,
    pub(crate) data: PathBuf,
    pub(crate) store: Arc<dyn Store>,
    /// Which commits there are (for going back to an older one).
    pub(crate) book: Arc<dyn crate::backup::commit_point::CommitBook>,
    /// What the task's uploads stored (shared with its upload jobs).
    pub(crate) index: Arc<Mutex<UploadIndex>>,
    /// An agg's chain of state files (shared with its upload jobs; unused by other tasks).
    pub(crate) chain: Arc<Mutex<WindowChain>>,
    /// The files of the checkpoint the node checked before the start, verified already (taken by
    /// the restore of that checkpoint).
    pub(crate) located: std::cell::RefCell<Option<(CheckpointId, crate::backup::Manifest, PathBuf)>>,
    /// The stream's aggs and sinks now: a checkpoint of another shape restores as a rescale.
    pub(crate) shape: Option<Shape>,
}

/// A running task as the driver sees it.
pub(crate) struct EnginePort<'a> {
    pub(crate) task: &'a mut Task,
    pub(crate) ctx: &'a PortCtx,
}

impl TaskPort for EnginePort<'_> {
    type Captured = Captured;

    fn close_input(&mut self, i: usize, id: CheckpointId) -> Hold {
        if let Task::Agg(a) = self.task {
            // A replay snapshot at the cuts needs no alignment (`runtime/unaligned.rs`); the
            // choice holds for the whole checkpoint: every input cut, or every input held.
            let held = (0..a.inp.len()).any(|j| a.inp.is_closed(j));
            if a.cuts.any() || (!held && agg_snapshot::cuts_allowed(a, id)) {
                a.cuts.cut(i, a.replay.taken()[i]);
                return Hold::Cut;
            }
        }
        if let Some(inp) = self.task.inputs() {
            inp.close(i)
        }
        Hold::Closed
    }

    fn reopen_input(&mut self, i: usize) {
        if let Task::Agg(a) = self.task {
            a.cuts.release(&mut a.agg, Some(i));
        }
        if let Some(inp) = self.task.inputs() {
            inp.reopen(i)
        }
    }

    fn reopen_all_inputs(&mut self) {
        if let Task::Agg(a) = self.task {
            a.cuts.release(&mut a.agg, None);
        }
        if let Some(inp) = self.task.inputs() {
            inp.reopen_all()
        }
    }

    fn queue_source_trigger(&mut self, id: CheckpointId, savepoint: bool) {
        if let Task::Source(s) = self.task {
            s.queued_trigger = Some(id);
            s.savepoint = savepoint.then_some(id);
        }
    }

    fn capture(&mut self, id: CheckpointId) -> Result<Captured, CheckpointError> {
        let task = self.ctx.task;
        let snap = |e: agg_snapshot::AggSnapshotError| CheckpointError::Snapshot { task, id, reason: e.to_string() };
        Ok(match self.task {
            // Inputs taken on past their barriers: the snapshot at the cuts.
            Task::Agg(a) if a.cuts.any() => agg_snapshot::capture_at_cuts(a, id, &self.ctx.chain).map_err(snap)?,
            Task::Agg(a) => agg_snapshot::capture(a, id, &self.ctx.chain).map_err(snap)?,
            Task::Source(s) => {
                s.replay.checkpoint(id, s.offset, s.out.len());
                Captured::Offset(s.replay.history.iter().copied().collect(), s.replay.outputs.iter().cloned().collect())
            }
            // The store's memtable is switched by the uploader as it takes the job
            // (`UploadJob::start`), not here: RocksDB's switch takes its mutex and wakes its
            // flush threads, and a worker that did it would now and then be off its core for
            // milliseconds inside the pause.
            Task::Sink(s) => Captured::Sink(s.store.clone()),
        })
    }

    fn forward_trigger(&mut self, id: CheckpointId, trans: TransId) -> Result<Vec<(TaskId, Seq)>, CheckpointError> {
        let savepoint = self.task.savepoint() == Some(id);
        let Some(out) = self.task.outputs() else { return Ok(Vec::new()) };
        let mut sent = Vec::with_capacity(out.len());
        for i in 0..out.len() {
            let seq = out.push(i, crate::runtime::Msg::Trigger { id, trans, savepoint });
            sent.push((out.target(i), seq));
        }
        out.flush().map_err(|e| CheckpointError::Snapshot { task: self.ctx.task, id, reason: e.to_string() })?;
        Ok(sent)
    }

    fn next_seq(&self, from: TaskId) -> Option<Seq> {
        let inp = match &*self.task {
            Task::Agg(a) => &a.inp,
            Task::Sink(s) => &s.inp,
            Task::Source(_) => return None,
        };
        inp.index_of(from).map(|i| inp.next_seq(i))
    }

    fn restore(&mut self, point: Option<RestorePoint>) -> Result<Version, CheckpointError> {
        let c = self.ctx;
        let failed = |reason: String| CheckpointError::Restore { task: c.task, id: point.map(|p| p.id), reason };
        if let Task::Agg(a) = self.task {
            a.cuts.clear(); // the state they cut is replaced
        }
        let Some(p) = point else {
            // A start from nothing: no state, no results, nothing known to be stored.
            let state = restore::fresh_state(&c.data, c.task)?;
            *c.index.lock().unwrap_or_else(|e| e.into_inner()) = UploadIndex::new();
            c.chain.lock().unwrap_or_else(|e| e.into_inner()).clear();
            match self.task {
                Task::Source(s) => {
                    s.offset = 0;
                    s.replay = Default::default();
                    if let Feed::Log(f) = &mut s.feed {
                        log_holds_from(f, Version(0), "a start from nothing").map_err(|e| failed(e.to_string()))?;
                        f.reader = f.reader.reopen_at(Version(0));
                    }
                }
                Task::Agg(a) => {
                    // Nothing, whatever the operator held before (a stream gone back to nothing).
                    let ups = vec![None; a.agg.progress().len()];
                    a.agg.restore(std::iter::empty(), &ups, 0, 0).map_err(|e| failed(e.to_string()))?;
                    crate::state::load_window_state(&state, &mut a.agg).map_err(|e| failed(e.to_string()))?;
                    a.agg.set_checkpoint(0);
                    a.agg.hold(false);
                    a.replay.restore_fresh();
                    a.agg.clear_spill();
                    a.spill = None;
                    if a.spill_budget.is_some() {
                        let db = crate::state::SpillDb::fresh(&a.spill_root).map_err(|e| failed(e.to_string()))?;
                        agg_snapshot::open_spill(a, db).map_err(|e| failed(e.to_string()))?;
                    }
                }
                Task::Sink(s) => s.store.clear().map_err(|e| failed(e.to_string()))?,
            }
            return Ok(Version(0));
        };
        let pre = c.located.borrow_mut().take().filter(|(id, ..)| *id == p.id).map(|(_, m, dir)| (m, dir));
        let rescale = match c.shape {
            Some(now) => rescale::of(c, p, now)?.map(|r| (r, now)),
            None => None,
        };
        if let Some((r, now)) = &rescale {
            let fresh = match self.task {
                Task::Agg(a) => Some(rescale::restore_agg(a, c, r, c.task.0 - now.first_agg.0, now.aggs)),
                Task::Sink(s) => Some(rescale::restore_sink(s, c, r, c.task.0 - now.first_agg.0 - now.aggs)),
                Task::Source(_) => None,
            };
            if let Some(done) = fresh {
                done?;
                // Its files are the old tasks' (under their keys): every file goes up again.
                *c.index.lock().unwrap_or_else(|e| e.into_inner()) = UploadIndex::new();
                c.chain.lock().unwrap_or_else(|e| e.into_inner()).clear();
                return Ok(Version(0));
            }
        }
        let restored = match self.task {
            Task::Source(_) => {
                restore::restore_task(c.store.as_ref(), c.stream, c.task, &c.data, p, pre, |_, _| Ok(()))
            }
            Task::Agg(a) => restore::restore_task(c.store.as_ref(), c.stream, c.task, &c.data, p, pre, |src, m| {
                agg_snapshot::restore(a, p.id, src, m, &restore::db_dir(&c.data, c.task))?;
                // The next snapshot adds to the restored files.
                let written = a.agg.written_windows();
                c.chain.lock().unwrap_or_else(|e| e.into_inner()).restored(src, m.format, &written).map_err(Into::into)
            }),
            Task::Sink(s) => restore::restore_task(c.store.as_ref(), c.stream, c.task, &c.data, p, pre, |src, m| {
                restore::sink_format_readable(m.format)?;
                // Known before the store opens: its files are the manifest's, in the store
                // already, and the upload-ahead thread must not send them all again (checked
                // against the store below).
                *c.index.lock().unwrap_or_else(|e| e.into_inner()) = UploadIndex::from_manifest(m);
                s.store.restore_from(src).map_err(Into::into)
            }),
        };
        let manifest = match restored {
            Ok(m) => m,
            // Damaged here and in the store: which older commits can this task restore instead?
            Err(CheckpointError::Damaged { task, id, reason, .. }) => {
                let restorable = super::verify::restorable_below(
                    c.store.as_ref(),
                    c.book.as_ref(),
                    c.stream,
                    &c.data,
                    &[task],
                    CheckpointId(u64::MAX),
                    id,
                )
                .map_err(|e| failed(format!("{reason}; looking for older commits: {e}")))?;
                return Err(CheckpointError::Damaged { task, id, reason, restorable });
            }
            Err(e) => return Err(e),
        };
        let version = p.version.unwrap_or(manifest.version);
        if let Task::Source(s) = self.task {
            // Each downstream agg that took a replay snapshot gets its windows' rows again.
            s.replay = SourceReplay {
                history: manifest.offsets.iter().copied().collect(),
                outputs: manifest.outputs.iter().cloned().collect(),
                ..Default::default()
            };
            let mut from = Vec::with_capacity(s.out.len());
            // Rescaled: the aggs restore a savepoint, which names nothing to replay.
            let replays = if rescale.is_some() { 0 } else { s.out.len() };
            from.resize(s.out.len() - replays, version.0);
            for j in 0..replays {
                let agg = s.out.target(j);
                let m = crate::backup::fetch_manifest(c.store.as_ref(), c.stream, agg, p.id, None)
                    .map_err(|e| failed(format!("the manifest of downstream task {agg}: {e}")))?;
                from.push(
                    match &m.replay {
                        Some(r) if r.resume => s.replay.output_offset_at(r.from, j, s.out.len()),
                        Some(r) => s.replay.offset_at(r.from),
                        None => Ok(version.0),
                    }
                    .map_err(|e| failed(e.to_string()))?,
                );
            }
            let start = s.replay.start(from, version.0);
            if start < version.0 {
                tracing::info!(task = %c.task, checkpoint = %p.id, from = start, to = version.0, "replaying rows for the downstream windows");
            }
            s.offset = start;
            if let Feed::Log(f) = &mut s.feed {
                // The checkpoint read the partition up to `version`: a copy of its log that holds
                // less lost rows the results already count (its disk, or the only copy with its
                // node). Read on, the source would wait for versions that may come from new
                // appends and take them as the lost rows: wrong results, and no error.
                let held = f.log.durable_version();
                if held < version {
                    let holds = match held.0 {
                        0 => "holds no rows".to_string(),
                        v => format!("holds versions below {v} only"),
                    };
                    return Err(failed(format!(
                        "partition {}'s log on this node {holds}, and the checkpoint read it up to {}: the rows \
                         between are not on this node (its copy of the log was lost, or the partition's only copy is \
                         on a node that is gone); the stream stops rather than skip them",
                        f.partition, version.0
                    )));
                }
                log_holds_from(f, Version(start), &format!("checkpoint {}", p.id))
                    .map_err(|e| failed(e.to_string()))?;
                f.reader = f.reader.reopen_at(Version(start));
            }
        }
        // What the checkpoint's manifest names is in the store (unless deleted since: checked).
        let mut index = UploadIndex::from_manifest(&manifest);
        match index.check(c.store.as_ref(), c.stream, c.task) {
            Ok(0) => {}
            Ok(gone) => {
                tracing::warn!(task = %c.task, checkpoint = %p.id, gone, "files of the restored checkpoint are gone from the store: they go up again")
            }
            Err(e) => {
                tracing::warn!(task = %c.task, error = %e, "cannot list the store: the next upload sends every file");
                index = UploadIndex::new();
            }
        }
        *c.index.lock().unwrap_or_else(|e| e.into_inner()) = index;
        Ok(version)
    }
}

/// Milliseconds and microseconds of the engine's clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EngineClock {
    base: Instant,
}

impl EngineClock {
    pub(crate) fn new() -> Self {
        Self { base: Instant::now() }
    }
}

impl Clock for EngineClock {
    fn wall_us(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
    }

    fn mono_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }
}

/// A task's effects on the engine.
pub(crate) struct EngineTaskFx {
    pub(crate) task: TaskId,
    pub(crate) node: NodeId,
    pub(crate) clock: EngineClock,
    pub(crate) data: PathBuf,
    /// Control queues of this node's tasks (this task's own included: upload completions).
    pub(crate) peers: Arc<HashMap<TaskId, ControlHandle>>,
    /// The coordinator's inbox (when it runs here) and its node.
    pub(crate) coord: Sender<CoordInput>,
    pub(crate) coord_node: NodeId,
    pub(crate) net: Option<ProtoNet>,
    pub(crate) uploads: Sender<UploadJob>,
    pub(crate) log: Arc<CheckpointLog>,
    /// Tasks of the engine between a checkpoint's start and their snapshot (workers do not yield
    /// the core to background threads while any is).
    pub(crate) engine_aligning: Arc<AtomicUsize>,
    /// What the engine restored (set by the first task to restore).
    pub(crate) restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    /// Committed snapshots kept on the node (the store's retention count, at least one).
    pub(crate) keep_local: usize,
    /// What the task's uploads stored.
    pub(crate) index: Arc<Mutex<UploadIndex>>,
}

impl Clock for EngineTaskFx {
    fn wall_us(&self) -> u64 {
        self.clock.wall_us()
    }

    fn mono_us(&self) -> u64 {
        self.clock.mono_us()
    }
}

impl TaskEffects<Captured> for EngineTaskFx {
    fn send_task(&mut self, to: TaskId, input: TaskInput) {
        if let Some(h) = self.peers.get(&to) {
            h.try_send(Control::Protocol(input));
        } else if let Some(net) = self.net.as_mut() {
            net.send_task(to, &input);
        }
    }

    fn send_coord(&mut self, input: CoordInput) {
        match self.net.as_mut() {
            Some(net) if self.coord_node != self.node => net.send_coord(self.coord_node, &input),
            _ => {
                let _ = self.coord.send(input);
            }
        }
    }

    fn upload(&mut self, job: UploadRequest<Captured>) {
        let Some(reply) = self.peers.get(&self.task).cloned() else {
            // Every local task has a control queue: this is a bug, and the checkpoint times out.
            tracing::error!(task = %self.task, checkpoint = %job.id, "no control queue for the upload's completion");
            return;
        };
        let id = job.id;
        let done = Box::new(move |result, captured: Captured| {
            // Waits for room: a lost completion would stall the checkpoint until it times out.
            reply.send_timeout(Control::Protocol(TaskInput::Uploaded { id, result }), Duration::from_secs(60));
            // Dropped here, on the uploader thread: the operator takes its shards back.
            drop(captured);
        });
        let job = UploadJob {
            task: self.task,
            id,
            version: job.version,
            dir: snapshot_dir(&self.data, self.task, id),
            captured: job.captured,
            index: self.index.clone(),
            done,
        };
        if let Err(e) = self.uploads.send(job) {
            // The pool is gone (the engine stops): the checkpoint fails here.
            let reason = "the uploader pool has stopped".to_string();
            let result = Err(CheckpointError::Upload { task: self.task, id, reason, retryable: true });
            (e.0.done)(result, e.0.captured);
        }
    }

    fn read_committed(&mut self) -> Result<Option<(CheckpointId, Version)>, CheckpointError> {
        restore::read_committed(&self.data, self.task)
    }

    fn persist_committed(&mut self, id: CheckpointId, version: Version, _ts: u64) -> Result<(), CheckpointError> {
        restore::write_committed(&self.data, self.task, id, version)
    }

    fn delete_snapshots_before(&mut self, id: CheckpointId) {
        restore::delete_snapshots_before(&self.data, self.task, id, self.keep_local)
    }

    fn drop_snapshot(&mut self, id: CheckpointId) {
        let _ = std::fs::remove_dir_all(snapshot_dir(&self.data, self.task, id));
    }

    fn paused(&mut self, _id: CheckpointId, pause_us: u64) {
        self.log.push_pause(pause_us);
    }

    fn aligning(&mut self, on: bool) {
        if on {
            self.engine_aligning.fetch_add(1, Ordering::Relaxed);
        } else {
            self.engine_aligning.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn restored(&mut self, basis: RestoreBasis, id: Option<CheckpointId>) {
        self.restored.get_or_init(|| (basis, id));
    }
}

/// A task's checkpoint side, owned by its worker.
pub(crate) struct TaskCheckpointing {
    pub(crate) driver: TaskDriver<Captured>,
    pub(crate) fx: EngineTaskFx,
    pub(crate) ctx: PortCtx,
}

impl TaskCheckpointing {
    /// A protocol message or completion.
    pub(crate) fn handle(&mut self, task: &mut Task, input: TaskInput) -> Result<(), CheckpointError> {
        self.driver.handle(&mut EnginePort { task, ctx: &self.ctx }, &mut self.fx, input)
    }

    /// What the task's poll saw.
    pub(crate) fn signal(&mut self, task: &mut Task, s: Signal) -> Result<(), CheckpointError> {
        self.driver.signal(&mut EnginePort { task, ctx: &self.ctx }, &mut self.fx, s)
    }

    /// Before the task's data work; `false` while it waits for its restore point.
    pub(crate) fn poll(&mut self, task: &mut Task) -> Result<bool, CheckpointError> {
        self.driver.poll(&mut EnginePort { task, ctx: &self.ctx }, &mut self.fx)
    }

    /// Restores `point` (the commit record's, or the coordinator's answer).
    pub(crate) fn restore(
        &mut self,
        task: &mut Task,
        point: Option<RestorePoint>,
        basis: RestoreBasis,
        request: Option<u64>,
    ) -> Result<(), CheckpointError> {
        self.driver.restore(&mut EnginePort { task, ctx: &self.ctx }, &mut self.fx, point, basis, request)
    }
}

impl Drop for TaskCheckpointing {
    fn drop(&mut self) {
        if self.driver.aligning() {
            self.fx.engine_aligning.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Why a restored source cannot read its partition's log from where its restore starts.
#[derive(Debug, thiserror::Error)]
enum LogStart {
    /// The log's directory could not be read (fatal for this restore).
    #[error("partition {partition}'s log: {source}")]
    Unreadable { partition: u32, source: crate::ingest::LogError },
    /// Retention deleted the rows the restore needs (fatal: they are gone).
    #[error(
        "partition {partition}'s log on this node begins at version {first} (deleted below what the kept \
         checkpoints read), and {what} reads it from {from}: the rows between are gone; the stream stops rather \
         than skip them"
    )]
    Deleted { partition: u32, first: Version, from: Version, what: String },
}

/// Whether partition `f`'s log on this node still holds version `from` on: retention deletes a
/// log below what the kept checkpoints read, so a restore of another (`what`: a commit deleted by
/// hand, a store from elsewhere, a start from nothing) would find a gap, and says so.
fn log_holds_from(f: &crate::runtime::log_feed::LogFeed, from: Version, what: &str) -> Result<(), LogStart> {
    let partition = f.partition;
    let first = f.log.extent().map_err(|source| LogStart::Unreadable { partition, source })?.0;
    match first.filter(|first| *first > from) {
        Some(first) => Err(LogStart::Deleted { partition, first, from, what: what.to_string() }),
        None => Ok(()),
    }
}
