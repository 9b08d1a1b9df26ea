//! The edge between the checkpoint state machines and the running engine: it feeds each task's
//! [`TaskMachine`] with what happens on the task (barriers, snapshots, uploads, messages from
//! peers, ticks) and carries out its actions on the task's worker thread; it runs the
//! [`Coordinator`] on a thread of its own, with the commit records in the store; it runs the
//! uploader pool; and it restores tasks from the last commit when the engine starts.
//!
//! Control messages between tasks and the coordinator travel through the tasks' control queues,
//! and to other nodes as the protocol's wire messages (`protocol_wire.rs`), which the receiving
//! router hands to the task's control queue or the coordinator's inbox. The coordinator runs on the
//! lowest node of the stream; every engine restores its own tasks from the shared store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_wire::msg::{CheckpointOutcome, CheckpointStats, RestoreBasis, TaskCheckpointEntry, TaskCheckpointStats};
use weir_wire::{CheckpointId, StreamId, TaskId, TransId, Version};

use super::task::{Control, ControlHandle, Task};
use crate::backup::{
    LocalDirStore, Store, StoreError, download_files, fetch_manifest, local_snapshot_matches, upload_snapshot,
};
use crate::checkpoint::{
    CommitRecord, CoordAction, CoordInput, Coordinator, TaskAction, TaskInput, TaskMachine, UploadDone,
};
use crate::state::{ResultStore, StateError, TaskStore, load_window_state};

/// Checkpoint settings of an engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Time between checkpoint starts (ms).
    pub interval_ms: u64,
    /// Minimum pause between the end of one checkpoint and the next start (ms).
    pub min_pause_ms: u64,
    /// A checkpoint running longer fails (ms).
    pub timeout_ms: u64,
    /// Time without an upstream's barrier before retrieving it (ms).
    pub trigger_timeout_ms: u64,
    /// Resend interval of unconfirmed ready messages (ms).
    pub ready_resend_ms: u64,
    /// Consecutive failures before the stream is reported unhealthy.
    pub tolerable_failures: u32,
    /// The remote store: a local directory (S3 and rsync come with the backup issue).
    pub remote_dir: PathBuf,
    /// Uploader threads.
    pub uploaders: usize,
    /// Restarting without a commit record: how long the coordinator waits for every task's
    /// consensus request before counting the silent ones as having nothing (ms).
    pub consensus_wait_ms: u64,
}

impl CheckpointSettings {
    /// Checkpoints every `interval_ms` into `remote_dir`.
    pub fn every(interval_ms: u64, remote_dir: impl Into<PathBuf>) -> Self {
        Self {
            interval_ms,
            min_pause_ms: interval_ms / 4,
            timeout_ms: 30_000,
            trigger_timeout_ms: 10_000,
            ready_resend_ms: 1_000,
            tolerable_failures: 3,
            remote_dir: remote_dir.into(),
            uploaders: 4,
            consensus_wait_ms: 10_000,
        }
    }
}

/// How many finished checkpoints (and task pauses) the statistics keep.
const HISTORY: usize = 4096;

/// Statistics of finished checkpoints, for status responses, logs and benchmarks. Written by the
/// coordinator thread (checkpoints) and the workers (pauses), once per checkpoint: never on the
/// per-row path.
#[derive(Debug, Default)]
pub struct CheckpointLog {
    finished: parking::Mutex<std::collections::VecDeque<CheckpointStats>>,
    pauses_us: parking::Mutex<std::collections::VecDeque<u64>>,
    /// Checkpoints committed and failed since the engine started.
    totals: parking::Mutex<(u64, u64)>,
    /// Consecutive failures past the tolerable number: the stream is unhealthy.
    unhealthy: std::sync::atomic::AtomicBool,
    /// Checkpoints failed since the last commit.
    consecutive_failures: std::sync::atomic::AtomicU32,
}

impl CheckpointLog {
    /// The last finished checkpoints (at most 4,096), oldest first.
    pub fn finished(&self) -> Vec<CheckpointStats> {
        self.finished.lock().iter().cloned().collect()
    }

    /// The last `n` finished checkpoints, oldest first.
    pub fn recent(&self, n: usize) -> Vec<CheckpointStats> {
        let f = self.finished.lock();
        f.iter().skip(f.len().saturating_sub(n)).cloned().collect()
    }

    /// Whether the stream is healthy: fewer consecutive failed checkpoints than tolerated.
    pub fn healthy(&self) -> bool {
        !self.unhealthy.load(Ordering::Relaxed)
    }

    /// Checkpoints failed since the last commit.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Checkpoints committed and failed since the engine started.
    pub fn totals(&self) -> (u64, u64) {
        *self.totals.lock()
    }

    /// Per task checkpoint: alignment plus synchronous snapshot (µs), the last 4,096.
    pub fn pauses_us(&self) -> Vec<u64> {
        self.pauses_us.lock().iter().copied().collect()
    }

    fn push_finished(&self, c: CheckpointStats) {
        {
            let mut t = self.totals.lock();
            match c.outcome {
                CheckpointOutcome::Committed => {
                    t.0 += 1;
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                }
                _ => {
                    t.1 += 1;
                    self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut f = self.finished.lock();
        if f.len() == HISTORY {
            f.pop_front();
        }
        f.push_back(c);
    }

    fn push_pause(&self, us: u64) {
        let mut p = self.pauses_us.lock();
        if p.len() == HISTORY {
            p.pop_front();
        }
        p.push_back(us);
    }
}

/// A tiny mutex wrapper for statistics (not on the data path).
pub mod parking {
    /// A mutex that ignores poisoning (statistics survive a panicking reader).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// Locks.
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

/// The statistics of a finished checkpoint, from the coordinator's `Finished` action.
fn checkpoint_stats(
    stream: StreamId,
    id: CheckpointId,
    started_at_ms: u64,
    duration: Duration,
    outcome: &Result<(), String>,
    tasks: Vec<(TaskId, TaskCheckpointStats)>,
) -> CheckpointStats {
    CheckpointStats {
        stream,
        checkpoint: id,
        started_at_ms,
        duration_us: duration.as_micros() as u64,
        outcome: match outcome {
            Ok(()) => CheckpointOutcome::Committed,
            Err(reason) => CheckpointOutcome::Failed { reason: reason.clone() },
        },
        upload_bytes: tasks.iter().map(|(_, s)| s.upload_bytes).sum(),
        max_align_us: tasks.iter().map(|(_, s)| s.align_us).max().unwrap_or(0),
        max_snapshot_us: tasks.iter().map(|(_, s)| s.snapshot_us).max().unwrap_or(0),
        tasks: tasks.into_iter().map(|(task, stats)| TaskCheckpointEntry { task, stats }).collect(),
    }
}

/// Keys in the store.
fn commit_key(stream: StreamId, id: CheckpointId) -> String {
    format!("{}/checkpoints/{:020}.commit", stream.0, id.0)
}

fn next_id_key(stream: StreamId) -> String {
    format!("{}/coordinator/next-id", stream.0)
}

/// Encodes a commit record (text, with a CRC line).
pub fn encode_commit(r: &CommitRecord) -> String {
    let mut s = format!("weir-commit 1\nid {}\ntrans {}\nts {}\n", r.id.0, r.trans.0, r.ts);
    for (t, v) in &r.versions {
        s.push_str(&format!("version {} {}\n", t.0, v.0));
    }
    for (t, c) in &r.manifests {
        s.push_str(&format!("manifest {} {c:08x}\n", t.0));
    }
    crate::backup::seal(s)
}

/// Decodes and checks a commit record.
pub fn decode_commit(key: &str, bytes: &[u8]) -> Result<CommitRecord, StoreError> {
    let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
    let body = crate::backup::unseal(key, bytes)?;
    let mut r = CommitRecord {
        id: CheckpointId(0),
        trans: TransId(0),
        versions: Default::default(),
        manifests: Default::default(),
        ts: 0,
    };
    for l in body.lines().skip(1) {
        let p: Vec<&str> = l.split(' ').collect();
        let n = |i: usize| p.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| bad("bad number"));
        match p[0] {
            "id" => r.id = CheckpointId(n(1)?),
            "trans" => r.trans = TransId(n(1)?),
            "ts" => r.ts = n(1)?,
            "version" => {
                r.versions.insert(TaskId(n(1)? as u32), Version(n(2)?));
            }
            "manifest" => {
                let crc = p.get(2).and_then(|c| u32::from_str_radix(c, 16).ok()).ok_or_else(|| bad("bad crc"))?;
                r.manifests.insert(TaskId(n(1)? as u32), crc);
            }
            _ => return Err(bad("unknown line")),
        }
    }
    Ok(r)
}

/// The last durable commit of `stream` in `store` (the highest id whose record verifies).
pub fn last_commit(store: &dyn Store, stream: StreamId) -> Result<Option<CommitRecord>, StoreError> {
    let keys = store.list(&format!("{}/checkpoints/", stream.0))?;
    for key in keys.iter().rev() {
        match decode_commit(key, &store.get(key)?) {
            Ok(r) => return Ok(Some(r)),
            // A damaged record is skipped, loudly: the previous one is still a valid restore point.
            Err(e) => tracing::error!(%key, error = %e, "skipping a damaged commit record"),
        }
    }
    Ok(None)
}

/// What task `t` last committed, from its meta file (`committed`, written at
/// update-checkpoint-info): what it brings to the consensus when there is no commit record.
fn local_committed(data: &Path, t: TaskId) -> (CheckpointId, Version) {
    let text = std::fs::read_to_string(task_dir(data, t).join("committed")).unwrap_or_default();
    let mut parts = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(id), Some(v)) => (CheckpointId(id), Version(v)),
        _ => (CheckpointId(0), Version(0)),
    }
}

/// A task's empty state, for a start from nothing: older state and snapshots are dropped.
fn fresh_state(data: &Path, t: TaskId) -> Result<TaskStore, String> {
    let db = task_dir(data, t).join("db");
    let _ = std::fs::remove_dir_all(&db);
    let _ = std::fs::remove_dir_all(task_dir(data, t).join("snapshots"));
    TaskStore::open(&db).map_err(|e| format!("{t}: {e}"))
}

/// Puts restored state into the task: a source's offset, an agg's windows.
fn install(task: &mut Task, state: &TaskStore, version: Version) -> Result<(), String> {
    match task {
        Task::Source(s) => {
            s.offset = version.0;
            if let super::task::Feed::Log(r) = &mut s.feed {
                *r = r.reopen_at(version);
            }
        }
        Task::Agg(a) => restore_agg(state, &mut a.agg)?,
        Task::Sink(_) => {}
    }
    Ok(())
}

/// Where a task keeps its state and snapshots.
pub(crate) fn task_dir(data: &Path, t: TaskId) -> PathBuf {
    data.join("tasks").join(t.0.to_string())
}

fn snapshot_dir(data: &Path, t: TaskId, id: CheckpointId) -> PathBuf {
    task_dir(data, t).join("snapshots").join(format!("chk-{:020}", id.0))
}

/// What one task restores: a checkpoint, with what the commit record says of the task when
/// there is one (a consensus point has no record: the manifest, checked by its own checksum,
/// says the offset).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestorePoint {
    pub(crate) id: CheckpointId,
    /// The task's offset in the commit record.
    pub(crate) version: Option<Version>,
    /// The checksum of the task's manifest in the commit record.
    pub(crate) manifest_crc: Option<u32>,
}

impl RestorePoint {
    /// Task `t`'s part of commit `record`.
    fn of(record: &CommitRecord, t: TaskId) -> Self {
        Self {
            id: record.id,
            version: record.versions.get(&t).copied(),
            manifest_crc: record.manifests.get(&t).copied(),
        }
    }
}

/// Restores task `t` at `point`: its state store and its offset. The local snapshot is used when
/// it matches the stored manifest file by file (size and CRC32C); otherwise the files are
/// downloaded and verified.
pub(crate) fn restore_task(
    store: &dyn Store,
    stream: StreamId,
    t: TaskId,
    data: &Path,
    point: RestorePoint,
) -> Result<(TaskStore, Version), String> {
    let id = point.id;
    let manifest = fetch_manifest(store, stream, t, id, point.manifest_crc).map_err(|e| format!("{t}: {e}"))?;
    let local = snapshot_dir(data, t, id);
    let dl = task_dir(data, t).join("restore-download");
    let src = if local_snapshot_matches(&manifest, &local) {
        tracing::info!(task = %t, checkpoint = %id, "restoring from the local snapshot");
        local
    } else {
        tracing::info!(task = %t, checkpoint = %id, files = manifest.files.len(), "downloading the snapshot");
        download_files(store, &manifest, &dl).map_err(|e| format!("{t}: {e}"))?;
        dl.clone()
    };
    let db = task_dir(data, t).join("db");
    let ts = TaskStore::open_from_snapshot(&src, &db).map_err(|e| format!("{t}: {e}"))?;
    let _ = std::fs::remove_dir_all(&dl);
    Ok((ts, point.version.unwrap_or(manifest.version)))
}

/// State copied at a barrier, written to the task's RocksDB store off the data path.
pub(crate) enum Captured {
    Window(crate::state::WindowStateCopy),
    Offset,
    Sink,
}

/// A job for the uploader pool: write the captured state as the snapshot's SST file, upload it.
pub(crate) struct UploadJob {
    pub(crate) task: TaskId,
    pub(crate) id: CheckpointId,
    pub(crate) version: Version,
    pub(crate) dir: PathBuf,
    pub(crate) captured: Captured,
    pub(crate) results: Arc<ResultStore>,
    pub(crate) reply: ControlHandle,
    /// Where the state copy's buffer goes back to once written, for the task's next copy.
    pub(crate) spare: Sender<StateEntries>,
}

/// The buffer of an agg's state copy.
pub(crate) type StateEntries = Vec<(i64, u64, crate::operator::window::Acc)>;

impl UploadJob {
    fn run(&self, store: &dyn Store, stream: StreamId) -> Result<UploadDone, String> {
        let t0 = Instant::now();
        let err = |e: StateError| format!("{}: {e}", self.task);
        let _ = std::fs::remove_dir_all(&self.dir);
        match &self.captured {
            Captured::Window(copy) => {
                std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
                // Named by checkpoint: SST names are keys in the store, shared by checkpoints.
                let sst = self.dir.join(format!("state-{:020}.sst", self.id.0));
                let bytes = crate::state::write_window_snapshot(copy, &sst).map_err(err)?;
                tracing::debug!(
                    task = %self.task,
                    entries = copy.entries.len(),
                    bytes,
                    write_us = t0.elapsed().as_micros() as u64,
                    "state snapshot written"
                );
            }
            // A source's whole state is its offset, which the manifest (and the commit record)
            // carry: its checkpoint has no files.
            Captured::Offset => std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?,
            // A sink's effect is the result store: make it durable up to the barrier.
            Captured::Sink => {
                self.results.sync().map_err(err)?;
                std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
            }
        }
        let up =
            upload_snapshot(store, stream, self.task, self.id, self.version, &self.dir).map_err(|e| e.to_string())?;
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
fn wait_for_alignment(aligning: &std::sync::atomic::AtomicUsize) {
    let t0 = Instant::now();
    while aligning.load(Ordering::Relaxed) > 0 && t0.elapsed() < ALIGNMENT_WAIT {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Starts `n` uploader threads.
pub(crate) fn start_uploaders(
    n: usize,
    store: Arc<dyn Store>,
    stream: StreamId,
    aligning: Arc<std::sync::atomic::AtomicUsize>,
) -> (Sender<UploadJob>, Vec<JoinHandle<()>>) {
    let (tx, rx): (Sender<UploadJob>, Receiver<UploadJob>) = crossbeam_channel::unbounded();
    let handles = (0..n.max(1))
        .map(|i| {
            let rx = rx.clone();
            let store = store.clone();
            let aligning = aligning.clone();
            std::thread::Builder::new()
                .name(format!("weir-upload-{i}"))
                .spawn(move || {
                    super::sched::background_thread();
                    for job in rx {
                        wait_for_alignment(&aligning);
                        let result = job.run(store.as_ref(), stream);
                        match &result {
                            Ok(u) => tracing::debug!(task = %job.task, checkpoint = %job.id, us = u.upload_us, bytes = u.bytes, files = u.files, "snapshot uploaded"),
                            Err(e) => tracing::warn!(task = %job.task, checkpoint = %job.id, error = %e, "snapshot upload failed"),
                        }
                        // Waits for room: a lost completion would stall the checkpoint until it times out.
                        job.reply.send_timeout(Control::Protocol(TaskInput::Uploaded { id: job.id, result }), Duration::from_secs(60));
                        if let Captured::Window(copy) = job.captured {
                            let _ = job.spare.try_send(copy.entries);
                        }
                    }
                })
                .expect("spawn uploader")
        })
        .collect();
    (tx, handles)
}

/// How often a task waiting for its restore point asks again.
const CONSENSUS_RETRY: Duration = Duration::from_millis(500);

/// Protocol messages to tasks (and the coordinator) on other nodes.
pub(crate) struct ProtoNet {
    sender: weir_wire::transport::TransportSender,
    enc: weir_wire::FrameEncoder,
    me: weir_wire::NodeId,
    stream: StreamId,
    node_of: Arc<HashMap<TaskId, weir_wire::NodeId>>,
}

impl ProtoNet {
    fn send_task(&mut self, to: TaskId, input: &TaskInput) {
        let Some(node) = self.node_of.get(&to).copied() else { return };
        if let Some(f) = super::protocol_wire::encode_task_input(&mut self.enc, self.stream, self.me, to, node, input) {
            // A full queue or a lost frame is a lost control message: the protocol resends or
            // times out, as it must anyway.
            let _ = self.sender.try_send(node, f);
        }
    }

    fn send_report(&mut self, coord: weir_wire::NodeId, task: TaskId, r: &crate::checkpoint::Report) {
        if let Some(f) = super::protocol_wire::encode_report(&mut self.enc, self.stream, task, self.me, r) {
            let _ = self.sender.try_send(coord, f);
        }
    }

    fn send_consensus(&mut self, coord: weir_wire::NodeId, task: TaskId, latest: (CheckpointId, Version)) {
        if let Some(f) = super::protocol_wire::encode_consensus(&mut self.enc, self.stream, task, self.me, latest) {
            let _ = self.sender.try_send(coord, f);
        }
    }

    fn send_restore(&mut self, task: TaskId, checkpoint: Option<CheckpointId>, version: Version, basis: RestoreBasis) {
        let Some(node) = self.node_of.get(&task).copied() else { return };
        if let Some(f) =
            super::protocol_wire::encode_restore(&mut self.enc, self.stream, task, checkpoint, version, basis)
        {
            let _ = self.sender.try_send(node, f);
        }
    }
}

/// Milliseconds since the epoch: every node's machines share this clock (expiry times cross nodes).
fn wall_ms() -> u64 {
    wall_us() / 1000
}

/// Microseconds since the epoch, for statistics.
fn wall_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The clock readings of a task's part of one checkpoint (the machine has no clock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskClock {
    id: CheckpointId,
    first: Instant,
    first_at_us: u64,
    align_us: u64,
    snapshot_us: u64,
}

impl TaskClock {
    fn start(id: CheckpointId) -> Self {
        Self { id, first: Instant::now(), first_at_us: wall_us(), align_us: 0, snapshot_us: 0 }
    }
}

/// A task's checkpoint side, owned by its worker.
pub(crate) struct TaskCkpt {
    pub(crate) machine: TaskMachine,
    pub(crate) data: PathBuf,
    pub(crate) results: Arc<ResultStore>,
    /// State copied at the barrier, waiting for the machine's `Upload`.
    pub(crate) captured: Option<(Captured, Version)>,
    pub(crate) peers: Arc<HashMap<TaskId, ControlHandle>>,
    pub(crate) coord: Sender<CoordInput>,
    /// The coordinator's node, and the network to reach it and tasks elsewhere.
    pub(crate) coord_node: weir_wire::NodeId,
    pub(crate) net: Option<ProtoNet>,
    pub(crate) uploads: Sender<UploadJob>,
    pub(crate) last_tick: Instant,
    pub(crate) log: Arc<CheckpointLog>,
    /// Clock readings of the newest checkpoint this task saw a barrier of.
    pub(crate) clock: Option<TaskClock>,
    /// Whether this task counts in `engine_aligning`.
    pub(crate) aligning: bool,
    /// Tasks of the engine between a checkpoint's start and their snapshot (workers do not yield
    /// the core to background threads while any is).
    pub(crate) engine_aligning: Arc<std::sync::atomic::AtomicUsize>,
    /// Where restores read from.
    pub(crate) store: Arc<dyn Store>,
    pub(crate) stream: StreamId,
    /// What the engine restored (set by the first task to restore).
    pub(crate) restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    /// While the task waits for its restore point: when it first and last asked the coordinator.
    pub(crate) waiting_since: Option<Instant>,
    pub(crate) asked: Option<Instant>,
    /// Warnings so far about waiting (one every 10 s).
    pub(crate) warned: u32,
    /// The last state copy's buffer, back from the uploader (one slot).
    pub(crate) spare: (Sender<StateEntries>, Receiver<StateEntries>),
}

impl Drop for TaskCkpt {
    fn drop(&mut self) {
        if self.aligning {
            self.engine_aligning.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl TaskCkpt {
    fn now_ms(&self) -> u64 {
        wall_ms()
    }

    fn send(&mut self, to: TaskId, input: TaskInput) {
        if let Some(h) = self.peers.get(&to) {
            h.try_send(Control::Protocol(input));
        } else if let Some(net) = self.net.as_mut() {
            net.send_task(to, &input);
        }
    }

    /// Feeds `input` and carries out the actions.
    pub(crate) fn feed(&mut self, task: &mut Task, input: TaskInput) -> Result<(), String> {
        let actions = self.machine.handle(input);
        let r = self.apply(task, actions);
        let now = self.machine.aligning();
        if now != self.aligning {
            self.aligning = now;
            if now {
                self.engine_aligning.fetch_add(1, Ordering::Relaxed);
            } else {
                self.engine_aligning.fetch_sub(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Whether the task still waits for its restore point (it must not touch data until then).
    pub(crate) fn uninit(&self) -> bool {
        self.machine.state() == crate::checkpoint::TaskState::Uninit
    }

    /// Asks the coordinator for the restore point, with what this task last committed (the
    /// seed's consensus request). Repeated until answered: the request, the answer, or the
    /// connection to the coordinator's node may not be there yet.
    fn ask_restore(&mut self) {
        if self.asked.is_some_and(|t| t.elapsed() < CONSENSUS_RETRY) {
            return;
        }
        let now = Instant::now();
        let waiting = self.waiting_since.get_or_insert(now).elapsed();
        self.asked = Some(now);
        let me = self.machine.setup().task;
        let latest = local_committed(&self.data, me);
        // Nothing flows until the coordinator answers: say so loudly if it takes long (its node
        // not started, or unreachable).
        if waiting >= Duration::from_secs(10 * (u64::from(self.warned) + 1)) {
            self.warned += 1;
            tracing::warn!(task = %me, coordinator = %self.coord_node, waiting_s = waiting.as_secs(), "still waiting for the restore point");
        } else {
            tracing::debug!(task = %me, latest = %latest.0, "asking the coordinator for the restore point");
        }
        let here = self.machine.setup().node;
        match self.net.as_mut() {
            Some(net) if self.coord_node != here => net.send_consensus(self.coord_node, me, latest),
            _ => {
                let _ = self.coord.send(CoordInput::Consensus { task: me, latest: latest.0 });
            }
        }
    }

    /// Restores `point` (nothing: a start from the beginning) into the task and makes it ready:
    /// the commit record's point before the workers start, or the coordinator's answer. A task
    /// restored already (the answer came twice, or it restored the commit record at start)
    /// ignores it. The coordinator's answer is restored on the worker (a download blocks it): its
    /// other tasks wait for their restore point too, since all of an engine's tasks start together.
    pub(crate) fn restore(
        &mut self,
        task: &mut Task,
        point: Option<RestorePoint>,
        basis: RestoreBasis,
    ) -> Result<(), String> {
        let me = self.machine.setup().task;
        let checkpoint = point.map(|p| p.id);
        if !self.uninit() {
            tracing::debug!(task = %me, ?checkpoint, "restore point for a task already restored: ignored");
            return Ok(());
        }
        let (state, version) = match point {
            Some(p) => restore_task(self.store.as_ref(), self.stream, me, &self.data, p)?,
            None => (fresh_state(&self.data, me)?, Version(0)),
        };
        install(task, &state, version)?;
        match checkpoint {
            Some(_) => tracing::info!(task = %me, ?checkpoint, ?basis, version = version.0, "restored"),
            None => tracing::debug!(task = %me, "starting from the beginning"),
        }
        self.restored.get_or_init(|| (basis, checkpoint));
        self.feed(task, TaskInput::Restored { id: checkpoint, version })
    }

    /// Ticks the machine (every 100 ms) and hands it what the task saw.
    pub(crate) fn before_poll(&mut self, task: &mut Task) -> Result<(), String> {
        if self.uninit() {
            self.ask_restore();
            return Ok(());
        }
        if self.last_tick.elapsed() >= Duration::from_millis(100) {
            self.last_tick = Instant::now();
            let now = self.now_ms();
            self.feed(task, TaskInput::Tick { now })?;
        }
        self.after_poll(task)
    }

    /// Barriers the task took, and a source that reached its queued trigger.
    pub(crate) fn after_poll(&mut self, task: &mut Task) -> Result<(), String> {
        let ended = match task {
            Task::Agg(a) => std::mem::take(&mut a.ended_inputs),
            Task::Sink(s) => std::mem::take(&mut s.ended_inputs),
            Task::Source(_) => Vec::new(),
        };
        for i in ended {
            let from = match task {
                Task::Agg(a) => a.inp.source_of(i),
                Task::Sink(s) => s.inp.source_of(i),
                Task::Source(_) => continue,
            };
            self.feed(task, TaskInput::UpstreamEnded { from })?;
        }
        let barriers = match task {
            Task::Agg(a) => std::mem::take(&mut a.barriers),
            Task::Sink(s) => std::mem::take(&mut s.barriers),
            Task::Source(s) => {
                if s.out.is_drained()
                    && let Some(id) = s.queued_trigger.take()
                {
                    let offset = Version(s.offset);
                    self.clock = Some(TaskClock::start(id));
                    self.feed(task, TaskInput::SourceReachedTrigger { id, offset })?;
                }
                Vec::new()
            }
        };
        for (i, id, trans) in barriers {
            let from = match task {
                Task::Agg(a) => a.inp.source_of(i),
                Task::Sink(s) => s.inp.source_of(i),
                Task::Source(_) => continue,
            };
            if self.clock.is_none_or(|c| c.id < id) {
                self.clock = Some(TaskClock::start(id));
            }
            self.feed(task, TaskInput::Trigger { from, id, trans })?;
        }
        Ok(())
    }

    fn apply(&mut self, task: &mut Task, actions: Vec<TaskAction>) -> Result<(), String> {
        let me = self.machine.setup().task;
        for a in actions {
            match a {
                TaskAction::Discarded(why) => tracing::debug!(task = %me, ?why, "discarded"),
                TaskAction::QueueSourceTrigger { id, .. } => {
                    if let Task::Source(s) = task {
                        s.queued_trigger = Some(id);
                    }
                }
                TaskAction::CloseInput(i) => inputs(task).map_or((), |inp| inp.close(i)),
                TaskAction::ReopenInput(i) => inputs(task).map_or((), |inp| inp.reopen(i)),
                TaskAction::ReopenAllInputs => inputs(task).map_or((), |inp| inp.reopen_all()),
                TaskAction::Snapshot { id, trans, offset } => {
                    let t0 = Instant::now();
                    let result = self.snapshot(task, id, trans, offset);
                    if let Some(c) = self.clock.as_mut().filter(|c| c.id == id) {
                        c.align_us = (t0 - c.first).as_micros() as u64;
                        c.snapshot_us = t0.elapsed().as_micros() as u64;
                        self.log.push_pause(c.align_us + c.snapshot_us);
                    }
                    let dispatched = match &result {
                        Ok(d) => d.clone(),
                        Err(_) => Vec::new(),
                    };
                    self.feed(task, TaskInput::SnapshotTaken { id, result: result.map(|_| ()) })?;
                    for (to, seq) in dispatched {
                        self.feed(task, TaskInput::TriggerDispatched { to, seq })?;
                    }
                }
                TaskAction::InjectTrigger { from } => {
                    tracing::info!(task = %me, %from, "barrier retrieved and injected")
                }
                TaskAction::Upload { id } => {
                    let reply = self.peers.get(&me).cloned().ok_or("no control queue")?;
                    let (captured, version) = self.captured.take().ok_or("upload without a captured state")?;
                    let dir = snapshot_dir(&self.data, me, id);
                    let job = UploadJob {
                        task: me,
                        id,
                        version,
                        dir,
                        captured,
                        results: self.results.clone(),
                        reply,
                        spare: self.spare.0.clone(),
                    };
                    let _ = self.uploads.send(job);
                }
                TaskAction::SendReady { to, id, .. } => self.send(to, TaskInput::Ready { from: me, id }),
                TaskAction::SendReadyRsp { to, id } => self.send(to, TaskInput::ReadyRsp { from: me, id }),
                TaskAction::SendRetrieveTrigger { to, id, .. } => {
                    self.send(to, TaskInput::RetrieveTrigger { from: me, id })
                }
                TaskAction::SendTriggerRsp { to, id, trans, code, trigger_seq } => {
                    // The receiver's runtime fills in how far its channel got.
                    self.send(
                        to,
                        TaskInput::TriggerRsp {
                            from: me,
                            id,
                            trans,
                            code,
                            trigger_seq,
                            next_seq: weir_wire::Seq(u64::MAX),
                        },
                    )
                }
                TaskAction::SendSourceRsp { .. } => {} // the report carries the same outcome
                TaskAction::SendReport(mut report) => {
                    if let Some(c) = self.clock.filter(|c| c.id == report.id) {
                        report.stats.trigger_at_us = c.first_at_us;
                        report.stats.align_us = c.align_us;
                        report.stats.snapshot_us = c.snapshot_us;
                    }
                    report.stats.reported_at_us = wall_us();
                    let here = self.machine.setup().node;
                    match self.net.as_mut() {
                        Some(net) if self.coord_node != here => net.send_report(self.coord_node, me, &report),
                        _ => {
                            let _ = self.coord.send(CoordInput::Report { task: me, report });
                        }
                    }
                }
                TaskAction::PersistCommitted { id, version, .. } => {
                    let meta = task_dir(&self.data, me).join("committed");
                    std::fs::write(&meta, format!("{} {}\n", id.0, version.0))
                        .map_err(|e| format!("{}: {e}", meta.display()))?;
                }
                TaskAction::DeleteSnapshotsBefore(id) => {
                    let root = task_dir(&self.data, me).join("snapshots");
                    if let Ok(entries) = std::fs::read_dir(&root) {
                        for e in entries.flatten() {
                            let name = e.file_name().to_string_lossy().to_string();
                            if let Some(n) = name.strip_prefix("chk-").and_then(|n| n.parse::<u64>().ok())
                                && n < id.0
                            {
                                let _ = std::fs::remove_dir_all(e.path());
                            }
                        }
                    }
                }
                TaskAction::DropSnapshot(id) => {
                    let _ = std::fs::remove_dir_all(snapshot_dir(&self.data, me, id));
                }
            }
        }
        Ok(())
    }

    /// Copies operator state (the synchronous part: the pipeline waits only for this) and
    /// forwards the barrier. Writing the copy to RocksDB, the RocksDB snapshot and the upload run
    /// on the uploader pool. Returns where the barrier went (downstream, its sequence number).
    fn snapshot(
        &mut self,
        task: &mut Task,
        id: CheckpointId,
        trans: TransId,
        offset: Version,
    ) -> Result<Vec<(TaskId, weir_wire::Seq)>, String> {
        let captured = match task {
            Task::Agg(a) => {
                let buf = self.spare.1.try_recv().unwrap_or_default();
                Captured::Window(crate::state::WindowStateCopy::reusing(&a.agg, buf))
            }
            Task::Source(_) => Captured::Offset,
            Task::Sink(_) => Captured::Sink,
        };
        self.captured = Some((captured, offset));
        let out = match task {
            Task::Source(s) => &mut s.out,
            Task::Agg(a) => &mut a.out,
            Task::Sink(_) => return Ok(Vec::new()),
        };
        let mut sent = Vec::new();
        for i in 0..out.len() {
            let seq = out.push(i, super::Msg::Trigger { id, trans });
            sent.push((out.target(i), seq));
        }
        out.flush().map_err(|e| e.to_string())?;
        Ok(sent)
    }

    /// Fills in a trigger response's channel position before the machine sees it.
    pub(crate) fn prepare(&self, task: &Task, input: TaskInput) -> TaskInput {
        if let TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, .. } = input {
            let inp = match task {
                Task::Agg(a) => Some(&a.inp),
                Task::Sink(s) => Some(&s.inp),
                Task::Source(_) => None,
            };
            let next_seq =
                inp.and_then(|i| i.index_of(from).map(|x| i.next_seq(x))).unwrap_or(weir_wire::Seq(u64::MAX));
            return TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, next_seq };
        }
        input
    }
}

fn inputs(task: &mut Task) -> Option<&mut super::Inputs> {
    match task {
        Task::Agg(a) => Some(&mut a.inp),
        Task::Sink(s) => Some(&mut s.inp),
        Task::Source(_) => None,
    }
}

/// The coordinator's manual trigger, as clients and the engine's owner reach it.
#[derive(Clone, Debug)]
pub(crate) struct ManualTrigger {
    pub(crate) stream: StreamId,
    pub(crate) node: weir_wire::NodeId,
    /// The stream's coordinator node (`None`: no checkpoints).
    pub(crate) coordinator: Option<weir_wire::NodeId>,
    /// Its inbox, when it runs here.
    pub(crate) inbox: Option<Sender<CoordInput>>,
}

impl ManualTrigger {
    /// The trigger of an engine without checkpoints (every request refused).
    pub(crate) fn off(stream: StreamId, node: weir_wire::NodeId) -> Self {
        Self { stream, node, coordinator: None, inbox: None }
    }

    /// Asks the coordinator to start a checkpoint of `stream` now.
    pub(crate) fn fire(&self, stream: StreamId) -> weir_wire::msg::CheckpointNowOutcome {
        use weir_wire::msg::CheckpointNowOutcome as O;
        if stream != self.stream {
            return O::Refused { reason: format!("stream {stream} does not run on node {}", self.node) };
        }
        match (&self.inbox, self.coordinator) {
            (_, None) => O::Refused { reason: format!("stream {stream} runs without checkpoints") },
            (Some(inbox), _) if inbox.send(CoordInput::Trigger).is_ok() => {
                tracing::info!(stream = %stream, "checkpoint requested");
                O::Accepted
            }
            (Some(_), _) => O::Refused { reason: "the coordinator has stopped".into() },
            (None, Some(coordinator)) => O::NotCoordinator { coordinator },
        }
    }
}

/// The checkpoint machinery of a running engine: the coordinator (on its node), the statistics,
/// the uploader threads.
pub(crate) struct Running {
    /// What the engine restored at start, once its tasks have restored.
    pub(crate) restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    pub(crate) coordinator: Option<CoordThread>,
    pub(crate) log: Arc<CheckpointLog>,
    pub(crate) uploaders: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops the coordinator and waits for the uploads in flight (call after the workers ended).
    pub(crate) fn stop(self) {
        if let Some(mut c) = self.coordinator {
            c.stop();
        }
        for u in self.uploaders {
            let _ = u.join();
        }
    }
}

/// The coordinator thread.
pub(crate) struct CoordThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CoordThread {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        mut coord: Coordinator,
        stream: StreamId,
        store: Arc<dyn Store>,
        inbox: Receiver<CoordInput>,
        peers: Arc<HashMap<TaskId, ControlHandle>>,
        last_commit: Option<CommitRecord>,
        next_id: CheckpointId,
        log: Arc<CheckpointLog>,
        mut net: Option<ProtoNet>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-coordinator".into())
            .spawn(move || {
                let now = wall_ms;
                let mut started: HashMap<CheckpointId, Instant> = HashMap::new();
                let mut send = |t: TaskId, c: Control| {
                    if let Some(h) = peers.get(&t) {
                        h.try_send(c);
                    } else if let Some(net) = net.as_mut() {
                        match c {
                            Control::Protocol(input) => net.send_task(t, &input),
                            Control::Restore { checkpoint, version, basis } => {
                                net.send_restore(t, checkpoint, version, basis)
                            }
                            _ => {}
                        }
                    }
                };
                // With a commit record every task restored it before the workers started; without
                // one the tasks wait, ask for the consensus, and restore what the answer says.
                let mut pending = coord.handle(CoordInput::Start { now: now(), next_id, last_commit });
                let mut reserving: Option<Instant> = None;
                let mut announced = None;
                while !stop2.load(Ordering::Acquire) {
                    while let Some(a) = (!pending.is_empty()).then(|| pending.remove(0)) {
                        match a {
                            CoordAction::PersistNextId(id) => {
                                // The checkpoint that needs the id starts now: its duration includes this write.
                                reserving = Some(Instant::now());
                                if let Err(e) = store.put(&next_id_key(stream), id.0.to_string().as_bytes()) {
                                    tracing::error!(error = %e, "cannot persist the next checkpoint id");
                                }
                            }
                            CoordAction::SendSourceReq { task, id, trans, expire_at, .. } => {
                                let t0 = reserving.take().unwrap_or_else(Instant::now);
                                started.entry(id).or_insert(t0);
                                send(task, Control::Protocol(TaskInput::SourceReq { id, trans, expire_at }));
                            }
                            CoordAction::WriteCommit(record) => {
                                let key = commit_key(stream, record.id);
                                let input = match store.put(&key, encode_commit(&record).as_bytes()) {
                                    Ok(()) => CoordInput::CommitDurable { id: record.id },
                                    Err(e) => CoordInput::CommitFailed { id: record.id, reason: e.to_string() },
                                };
                                pending.extend(coord.handle(input));
                            }
                            CoordAction::SendUpdate { task, id, version, ts, .. } => {
                                send(task, Control::Protocol(TaskInput::Update { id, version, ts }))
                            }
                            CoordAction::SendReset { task, failed, .. } => {
                                send(task, Control::Protocol(TaskInput::Reset { failed }))
                            }
                            CoordAction::SendRestore { task, id, version, committed, .. } => {
                                let basis = match (committed, id) {
                                    (true, _) => RestoreBasis::Committed,
                                    (false, Some(_)) => RestoreBasis::Consensus,
                                    (false, None) => RestoreBasis::Fresh,
                                };
                                if !committed && announced != Some(id) {
                                    announced = Some(id);
                                    tracing::info!(stream = %stream, checkpoint = ?id, ?basis, "restore point chosen");
                                }
                                send(task, Control::Restore { checkpoint: id, version, basis })
                            }
                            CoordAction::Finished { id, started_at, duration_ms, outcome, tasks } => {
                                let d = started.remove(&id).map_or(Duration::from_millis(duration_ms), |t| t.elapsed());
                                let c = checkpoint_stats(stream, id, started_at, d, &outcome, tasks);
                                match &outcome {
                                    Ok(()) => tracing::info!(
                                        stream = %stream,
                                        checkpoint = %id,
                                        us = d.as_micros() as u64,
                                        upload_bytes = c.upload_bytes,
                                        max_align_us = c.max_align_us,
                                        max_snapshot_us = c.max_snapshot_us,
                                        "checkpoint committed"
                                    ),
                                    Err(why) => tracing::warn!(stream = %stream, checkpoint = %id, us = d.as_micros() as u64, reason = %why, "checkpoint failed"),
                                }
                                for e in &c.tasks {
                                    let s = &e.stats;
                                    tracing::debug!(
                                        checkpoint = %id,
                                        task = %e.task,
                                        trigger_at_us = s.trigger_at_us,
                                        align_us = s.align_us,
                                        snapshot_us = s.snapshot_us,
                                        upload_us = s.upload_us,
                                        upload_bytes = s.upload_bytes,
                                        files = s.files,
                                        reported_at_us = s.reported_at_us,
                                        "task checkpoint statistics"
                                    );
                                }
                                log.push_finished(c);
                            }
                            CoordAction::Health { healthy, consecutive_failures } => {
                                log.unhealthy.store(!healthy, Ordering::Relaxed);
                                tracing::warn!(stream = %stream, healthy, consecutive_failures, "stream health changed")
                            }
                            CoordAction::RejectedReport { task, reason } => tracing::warn!(%task, %reason, "report rejected"),
                        }
                    }
                    let input = match inbox.recv_timeout(Duration::from_millis(20)) {
                        Ok(i) => i,
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => CoordInput::Tick { now: now() },
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                    };
                    pending.extend(coord.handle(input));
                    pending.extend(coord.handle(CoordInput::Tick { now: now() }));
                }
            })
            .expect("spawn coordinator");
        Self { stop, thread: Some(thread) }
    }

    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CoordThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The persisted next id of `stream` (1 when none).
pub(crate) fn read_next_id(store: &dyn Store, stream: StreamId) -> CheckpointId {
    store
        .get(&next_id_key(stream))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse().ok())
        .map_or(CheckpointId(1), CheckpointId)
}

/// Restores an agg's window state from its restored store.
pub(crate) fn restore_agg(state: &TaskStore, agg: &mut crate::operator::window::WindowAgg) -> Result<(), String> {
    load_window_state(state, agg).map(|_| ()).map_err(|e| e.to_string())
}

/// The local-directory store of the settings.
pub(crate) fn open_store(s: &CheckpointSettings) -> Arc<dyn Store> {
    Arc::new(LocalDirStore::new(&s.remote_dir))
}

/// What the engine needs to give every task its checkpoint side and start the coordinator.
pub(crate) struct Setup {
    aligning: Arc<std::sync::atomic::AtomicUsize>,
    stream: StreamId,
    data: PathBuf,
    store: Arc<dyn Store>,
    settings: CheckpointSettings,
    /// The last commit record, which every task restores before the workers start; without
    /// one, tasks start `Uninit` and restore the coordinator's consensus when it answers.
    last: Option<CommitRecord>,
    restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    next_id: CheckpointId,
    peers: Arc<HashMap<TaskId, ControlHandle>>,
    coord_tx: Sender<CoordInput>,
    coord_rx: Receiver<CoordInput>,
    uploads: Sender<UploadJob>,
    uploaders: Vec<JoinHandle<()>>,
    log: Arc<CheckpointLog>,
    topo: crate::spec::Topology,
    node: weir_wire::NodeId,
    node_of: Arc<HashMap<TaskId, weir_wire::NodeId>>,
    coord_node: weir_wire::NodeId,
    sender: Option<weir_wire::transport::TransportSender>,
}

impl Setup {
    pub(crate) fn new(
        spec: &crate::spec::StreamSpec,
        placement: &crate::spec::Placement,
        cfg: &super::EngineConfig,
        settings: &CheckpointSettings,
        peers: Arc<HashMap<TaskId, ControlHandle>>,
        sender: Option<weir_wire::transport::TransportSender>,
        aligning: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<Setup, super::EngineError> {
        let topo = spec.topology();
        let node_of: HashMap<TaskId, weir_wire::NodeId> =
            topo.tasks.iter().map(|t| (t.id, placement.node_of(t.id))).collect();
        // The coordinator runs on the lowest node of the stream; every engine reads the same store.
        let coord_node = node_of.values().min().copied().unwrap_or(cfg.node);
        let store = open_store(settings);
        let failed = |e: StoreError| super::EngineError::Failed(e.to_string());
        let restored = Arc::new(OnceLock::new());
        let last = last_commit(store.as_ref(), spec.id).map_err(failed)?;
        match &last {
            Some(r) => {
                tracing::info!(stream = %spec.id, checkpoint = %r.id, "restoring from the last commit");
                let _ = restored.set((RestoreBasis::Committed, Some(r.id)));
            }
            None => tracing::info!(
                stream = %spec.id,
                "no commit record: the tasks ask the coordinator where to start (the consensus of what they committed, or the beginning)"
            ),
        }
        let next_id = read_next_id(store.as_ref(), spec.id);
        let (coord_tx, coord_rx) = crossbeam_channel::unbounded();
        let (uploads, handles) = start_uploaders(settings.uploaders, store.clone(), spec.id, aligning.clone());
        Ok(Setup {
            aligning,
            stream: spec.id,
            data: cfg.data_dir.clone(),
            store,
            settings: settings.clone(),
            last,
            restored,
            next_id,
            peers,
            coord_tx,
            coord_rx,
            uploads,
            uploaders: handles,
            log: Arc::new(CheckpointLog::default()),
            topo,
            node: cfg.node,
            node_of: Arc::new(node_of),
            coord_node,
            sender,
        })
    }

    /// The checkpoint side of task `t`: restored from the last commit record, or (without one)
    /// `Uninit`, waiting for the coordinator's restore point.
    pub(crate) fn task(
        &self,
        t: &crate::spec::TaskDesc,
        task: &mut Task,
        results: Arc<ResultStore>,
    ) -> Result<TaskCkpt, String> {
        let role = match t.kind {
            crate::spec::TaskKind::Source { .. } => crate::checkpoint::Role::Source,
            crate::spec::TaskKind::Agg { .. } => crate::checkpoint::Role::Agg,
            crate::spec::TaskKind::Sink { .. } => crate::checkpoint::Role::Sink,
        };
        let setup = crate::checkpoint::TaskSetup {
            stream: self.stream,
            task: t.id,
            node: self.node,
            role,
            upstreams: t.upstreams.iter().map(|u| (*u, self.node_of[u])).collect(),
            downstreams: t.downstreams.iter().map(|d| (*d, self.node_of[d])).collect(),
            trigger_timeout_ms: self.settings.trigger_timeout_ms,
            ready_resend_ms: self.settings.ready_resend_ms,
        };
        let mut ck = TaskCkpt {
            machine: TaskMachine::new(setup),
            data: self.data.clone(),
            results,
            captured: None,
            peers: self.peers.clone(),
            coord: self.coord_tx.clone(),
            coord_node: self.coord_node,
            net: self.net(),
            uploads: self.uploads.clone(),
            last_tick: Instant::now(),
            log: self.log.clone(),
            clock: None,
            aligning: false,
            engine_aligning: self.aligning.clone(),
            store: self.store.clone(),
            stream: self.stream,
            restored: self.restored.clone(),
            waiting_since: None,
            asked: None,
            warned: 0,
            spare: crossbeam_channel::bounded(1),
        };
        if let Some(r) = &self.last {
            ck.restore(task, Some(RestorePoint::of(r, t.id)), RestoreBasis::Committed)?;
        }
        Ok(ck)
    }

    fn net(&self) -> Option<ProtoNet> {
        self.sender.clone().map(|sender| ProtoNet {
            sender,
            enc: weir_wire::FrameEncoder::new(),
            me: self.node,
            stream: self.stream,
            node_of: self.node_of.clone(),
        })
    }

    /// The manual trigger of this node.
    pub(crate) fn manual_trigger(&self) -> ManualTrigger {
        ManualTrigger {
            stream: self.stream,
            node: self.node,
            coordinator: Some(self.coord_node),
            inbox: self.coordinator_inbox(),
        }
    }

    /// Where reports go (the coordinator's inbox), when the coordinator runs here.
    pub(crate) fn coordinator_inbox(&self) -> Option<Sender<CoordInput>> {
        (self.coord_node == self.node).then(|| self.coord_tx.clone())
    }

    /// Starts the coordinator if it runs on this node; returns it with the statistics log and the
    /// uploader threads (which end once every task has dropped its job queue: join them after the
    /// workers).
    pub(crate) fn start_coordinator(self) -> Running {
        let cfg = crate::checkpoint::CoordinatorConfig {
            stream: self.stream,
            tasks: self
                .topo
                .tasks
                .iter()
                .map(|t| {
                    let role = match t.kind {
                        crate::spec::TaskKind::Source { .. } => crate::checkpoint::Role::Source,
                        crate::spec::TaskKind::Agg { .. } => crate::checkpoint::Role::Agg,
                        crate::spec::TaskKind::Sink { .. } => crate::checkpoint::Role::Sink,
                    };
                    (t.id, self.node_of[&t.id], role)
                })
                .collect(),
            interval_ms: self.settings.interval_ms,
            min_pause_ms: self.settings.min_pause_ms,
            timeout_ms: self.settings.timeout_ms,
            // Up to half an interval, so engines started together do not checkpoint in lockstep.
            first_delay_ms: (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as u64))
                % (self.settings.interval_ms / 2).max(1),
            tolerable_failures: self.settings.tolerable_failures,
            consensus_wait_ms: self.settings.consensus_wait_ms,
        };
        let log = self.log.clone();
        let net = self.net();
        let uploaders = self.uploaders;
        let restored = self.restored.clone();
        drop(self.uploads);
        if self.coord_node != self.node {
            return Running { restored, coordinator: None, log, uploaders };
        }
        let t = CoordThread::start(
            Coordinator::new(cfg),
            self.stream,
            self.store.clone(),
            self.coord_rx,
            self.peers.clone(),
            self.last,
            self.next_id,
            self.log,
            net,
        );
        Running { restored, coordinator: Some(t), log, uploaders }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_records_roundtrip_and_damage_is_refused() {
        let r = CommitRecord {
            id: CheckpointId(12),
            trans: TransId(5),
            versions: [(TaskId(0), Version(4096)), (TaskId(1), Version(77))].into_iter().collect(),
            manifests: [(TaskId(0), 0xdead_beef), (TaskId(2), 7)].into_iter().collect(),
            ts: 1_700_000_000_000,
        };
        let text = encode_commit(&r);
        assert_eq!(decode_commit("k", text.as_bytes()).unwrap(), r);
        let edited = text.replace("version 0 4096", "version 0 4097");
        assert!(matches!(decode_commit("k", edited.as_bytes()), Err(StoreError::Corrupt { .. })));
        assert!(decode_commit("k", &text.as_bytes()[..text.len() - 3]).is_err());
    }

    #[test]
    fn the_last_commit_skips_a_damaged_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        let rec = |id| CommitRecord {
            id: CheckpointId(id),
            trans: TransId(id),
            versions: Default::default(),
            manifests: Default::default(),
            ts: 0,
        };
        store.put(&commit_key(StreamId(1), CheckpointId(1)), encode_commit(&rec(1)).as_bytes()).unwrap();
        store.put(&commit_key(StreamId(1), CheckpointId(2)), encode_commit(&rec(2)).as_bytes()).unwrap();
        assert_eq!(last_commit(&store, StreamId(1)).unwrap().map(|r| r.id), Some(CheckpointId(2)));
        store.put(&commit_key(StreamId(1), CheckpointId(2)), b"garbage").unwrap();
        assert_eq!(last_commit(&store, StreamId(1)).unwrap().map(|r| r.id), Some(CheckpointId(1)));
        assert_eq!(last_commit(&store, StreamId(9)).unwrap(), None);
    }
}
