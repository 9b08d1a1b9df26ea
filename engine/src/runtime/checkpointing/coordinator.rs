//! The coordinator on the engine: a thread that runs the [`CoordDriver`] with [`EngineCoordFx`]
//! (control queues and the transport to the tasks, a store thread for its records), and the
//! manual trigger that clients and the engine's owner reach it by.
//!
//! Invariants:
//! - The coordinator thread never waits for the store: its writes run on the store thread,
//!   whose answers come back through the inbox, so a store that hangs fails the checkpoint on
//!   time while ticks, reports, manual triggers and status requests go on.
//! - Stopping waits for the store thread at most the store timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use weir_wire::msg::{CheckpointNowOutcome, CheckpointStats, RestoreBasis};
use weir_wire::{CheckpointId, NodeId, StreamId, TaskId, Version};

use super::net::ProtoNet;
use super::port::EngineClock;
use super::stats::CheckpointLog;
use crate::backup::Store;
use crate::backup::commit::CommitWrite;
use crate::backup::commit_point::{CommitBook, PointError};
use crate::backup::retention::{CollectOptions, Collector};
use crate::checkpoint::driver::{Clock, CoordDriver, CoordEffects};
use crate::checkpoint::{CheckpointError, CommitRecord, CoordInput, Coordinator, IdRecord, TaskInput};
use crate::runtime::control::{Control, ControlHandle};

/// A write of the coordinator's, for the store thread.
enum StoreJob {
    Ids(IdRecord),
    Commit(CommitRecord),
}

/// The coordinator's effects on the engine.
struct EngineCoordFx {
    clock: EngineClock,
    peers: Arc<HashMap<TaskId, ControlHandle>>,
    net: Option<ProtoNet>,
    store_jobs: Sender<StoreJob>,
    log: Arc<CheckpointLog>,
    halt: Halt,
}

/// Stops the engine with a reason (the coordinator's `Halt`).
pub(crate) type Halt = Arc<dyn Fn(String) + Send + Sync>;

impl Clock for EngineCoordFx {
    fn wall_us(&self) -> u64 {
        self.clock.wall_us()
    }

    fn mono_us(&self) -> u64 {
        self.clock.mono_us()
    }
}

impl CoordEffects for EngineCoordFx {
    fn halt(&mut self, reason: String) {
        (self.halt)(reason)
    }

    fn send_task(&mut self, to: TaskId, input: TaskInput) {
        if let Some(h) = self.peers.get(&to) {
            h.try_send(Control::Protocol(input));
        } else if let Some(net) = self.net.as_mut() {
            net.send_task(to, &input);
        }
    }

    fn send_restore(
        &mut self,
        to: TaskId,
        id: Option<CheckpointId>,
        version: Option<Version>,
        basis: RestoreBasis,
        request: u64,
    ) {
        if let Some(h) = self.peers.get(&to) {
            h.try_send(Control::Restore { checkpoint: id, version, basis, request });
        } else if let Some(net) = self.net.as_mut() {
            net.send_restore(to, id, version, basis, request);
        }
    }

    fn persist_ids(&mut self, ids: IdRecord) {
        let _ = self.store_jobs.send(StoreJob::Ids(ids));
    }

    fn write_commit(&mut self, record: CommitRecord) {
        let _ = self.store_jobs.send(StoreJob::Commit(record));
    }

    fn finished(&mut self, stats: CheckpointStats) {
        self.log.push_finished(stats);
    }

    fn not_started(&mut self, reason: &str) {
        self.log.push_not_started(reason);
    }

    fn health(&mut self, healthy: bool, _consecutive_failures: u32) {
        self.log.unhealthy.store(!healthy, Ordering::Relaxed);
    }
}

/// What the store thread writes with.
struct StoreSide {
    store: Arc<dyn Store>,
    book: Arc<dyn CommitBook>,
    stream: StreamId,
    /// Ends the run when the book says this coordinator is fenced.
    halt: Halt,
    /// The coordinator stopped: queued writes are not made (a later run of the stream may be
    /// writing already, and an id record written after its own would take its ids back).
    stopped: Arc<AtomicBool>,
}

/// Whether a book's refusal ends the coordinator's run (a newer coordinator or placement
/// stands, or the book cannot be read): not the store's errors, which fail one checkpoint.
fn ends_run(e: &PointError) -> bool {
    !matches!(e, PointError::Store(_)) && !e.is_retryable()
}

/// Runs the coordinator's store writes one after another; each answer goes to the inbox. After
/// each durable commit it asks the collector for a pass (`collect`: at most one waits). A write
/// the book refuses for good halts the run, and nothing more is written.
fn store_thread(side: StoreSide, jobs: Receiver<StoreJob>, inbox: Sender<CoordInput>, collect: Option<Sender<()>>) {
    let StoreSide { store, book, stream, halt, stopped } = side;
    let mut refused: Option<String> = None;
    for job in jobs {
        if stopped.load(Ordering::Acquire) {
            break;
        }
        let answer = match job {
            StoreJob::Ids(_) if refused.is_some() => {
                CoordInput::IdsFailed { reason: refused.clone().unwrap_or_default() }
            }
            StoreJob::Commit(r) if refused.is_some() => {
                CoordInput::CommitFailed { id: r.id, reason: refused.clone().unwrap_or_default() }
            }
            StoreJob::Ids(ids) => match book.reserve(store.as_ref(), &ids) {
                Ok(()) => CoordInput::IdsPersisted(ids),
                Err(e) => {
                    tracing::error!(stream = %stream, error = %e, "cannot reserve checkpoint ids");
                    if ends_run(&e) {
                        let why = format!("checkpoint ids not reserved: {e}");
                        halt(why.clone());
                        refused = Some(why);
                    }
                    CoordInput::IdsFailed { reason: e.to_string() }
                }
            },
            StoreJob::Commit(record) => match book.commit(store.as_ref(), &record) {
                CommitWrite::Durable => {
                    if let Some(c) = &collect {
                        let _ = c.try_send(());
                    }
                    CoordInput::CommitDurable { id: record.id }
                }
                CommitWrite::Failed(reason) => {
                    tracing::warn!(stream = %stream, checkpoint = %record.id, %reason, "cannot write the commit record");
                    CoordInput::CommitFailed { id: record.id, reason }
                }
                CommitWrite::Refused(reason) => {
                    tracing::error!(stream = %stream, checkpoint = %record.id, %reason, "commit refused: this coordinator is fenced");
                    let why = format!("checkpoint {} not committed: {reason}", record.id);
                    halt(why.clone());
                    refused = Some(why);
                    CoordInput::CommitFailed { id: record.id, reason }
                }
            },
        };
        if inbox.send(answer).is_err() {
            return;
        }
    }
}

/// Collects the stream's garbage in the store, one pass per request, as `base` says (the
/// commits the book lists are read at each pass).
/// It runs beside checkpoints and never holds one up (`backup::retention` says why that is safe).
/// After a pass it writes the floors of the ingest partitions in `logs` (`backup::floor`), so
/// the nodes delete what no kept checkpoint reads.
fn collector_thread(
    store: Arc<dyn Store>,
    book: Arc<dyn CommitBook>,
    stream: StreamId,
    base: CollectOptions,
    logs: BTreeMap<TaskId, u32>,
    requests: Receiver<()>,
) {
    let mut collector = Collector::new();
    let mut written = BTreeMap::new();
    for () in requests {
        let opts = CollectOptions { listed: book.listed(), ..base.clone() };
        match collector.collect_with(store.as_ref(), stream, opts) {
            Ok(c) => {
                tracing::debug!(
                    stream = %stream,
                    kept = ?c.kept,
                    commits_deleted = c.commits_deleted,
                    objects_deleted = c.objects_deleted,
                    pending = c.pending,
                    "retention pass"
                );
                let floors: BTreeMap<u32, Version> = c
                    .floors
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(t, v)| logs.get(&t).map(|p| (*p, v)))
                    .collect();
                if !floors.is_empty() && floors != written {
                    match crate::backup::floor::write_floors(store.as_ref(), stream, &floors) {
                        Ok(()) => written = floors,
                        Err(e) => tracing::warn!(stream = %stream, error = %e, "cannot write the ingest log floors"),
                    }
                }
            }
            // Garbage stays until the next pass; nothing a commit names was touched.
            Err(e) => tracing::warn!(stream = %stream, error = %e, "retention pass failed"),
        }
    }
}

/// What the coordinator thread starts from.
pub(crate) struct CoordStart {
    pub(crate) coordinator: Coordinator,
    pub(crate) stream: StreamId,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) inbox: (Sender<CoordInput>, Receiver<CoordInput>),
    pub(crate) peers: Arc<HashMap<TaskId, ControlHandle>>,
    pub(crate) last_commit: Option<CommitRecord>,
    pub(crate) ids: IdRecord,
    pub(crate) book: Arc<dyn CommitBook>,
    pub(crate) log: Arc<CheckpointLog>,
    pub(crate) net: Option<ProtoNet>,
    pub(crate) store_timeout: Duration,
    /// Commits kept in the store (0: all, no collection).
    pub(crate) retain: usize,
    /// The partition of each source task reading an ingest log: retention writes their floors.
    pub(crate) log_partitions: BTreeMap<TaskId, u32>,
    /// The run's incarnation: retention deletes older runs' records of files stored ahead.
    pub(crate) incarnation: u64,
    /// How the stream halts.
    pub(crate) halt: Halt,
}

/// The coordinator thread and its store thread.
pub(crate) struct CoordThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    store_done: Receiver<()>,
    store_timeout: Duration,
}

impl CoordThread {
    pub(crate) fn start(s: CoordStart) -> Result<Self, std::io::Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
        let (done_tx, store_done) = crossbeam_channel::bounded(1);
        let (stream, inbox_tx) = (s.stream, s.inbox.0.clone());
        let side = StoreSide {
            store: s.store.clone(),
            book: s.book.clone(),
            stream,
            halt: s.halt.clone(),
            stopped: stop.clone(),
        };
        let (collect, collector) = if s.retain > 0 {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let (store, book, logs) = (s.store.clone(), s.book.clone(), s.log_partitions);
            // Older runs' records of files stored ahead go; this run's stay.
            let base = CollectOptions {
                keep: s.retain,
                dry_run: false,
                stopped: false,
                listed: None,
                ahead_runs_below: s.incarnation,
            };
            let t = std::thread::Builder::new()
                .name("weir-retention".into())
                .spawn(move || collector_thread(store, book, stream, base, logs, rx))?;
            (Some(tx), Some(t))
        } else {
            (None, None)
        };
        std::thread::Builder::new().name("weir-coord-store".into()).spawn(move || {
            store_thread(side, jobs_rx, inbox_tx, collect);
            // The last pass asked for runs to its end: a stopped engine leaves its store tidy.
            if let Some(t) = collector {
                let _ = t.join();
            }
            let _ = done_tx.send(());
        })?;
        let stop2 = stop.clone();
        let inbox = s.inbox.1;
        let thread = std::thread::Builder::new().name("weir-coordinator".into()).spawn(move || {
            let mut fx = EngineCoordFx {
                clock: EngineClock::new(),
                peers: s.peers,
                net: s.net,
                store_jobs: jobs_tx,
                log: s.log,
                halt: s.halt,
            };
            let mut driver = CoordDriver::new(s.coordinator, s.stream);
            // With a commit record every task restored it before the workers started; without
            // one the tasks wait, ask for the consensus, and restore what the answer says.
            let start = CoordInput::Start { now: fx.now_ms(), ids: s.ids, last_commit: s.last_commit };
            driver.handle(&mut fx, start);
            while !stop2.load(Ordering::Acquire) {
                match inbox.recv_timeout(Duration::from_millis(20)) {
                    Ok(input) => driver.handle(&mut fx, input),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                }
                let now = fx.now_ms();
                driver.handle(&mut fx, CoordInput::Tick { now });
            }
        })?;
        Ok(Self { stop, thread: Some(thread), store_done, store_timeout: s.store_timeout })
    }

    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            // The coordinator dropped the job queue: the store thread ends after the write in
            // flight (it makes none of those queued) and the retention pass asked for, unless
            // the store hangs.
            if self.store_done.recv_timeout(self.store_timeout).is_err() {
                tracing::warn!("the coordinator's store write did not finish; not waiting for it");
            }
        }
    }
}

impl Drop for CoordThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The coordinator's manual trigger, as clients and the engine's owner reach it.
#[derive(Clone, Debug)]
pub(crate) struct ManualTrigger {
    pub(crate) stream: StreamId,
    pub(crate) node: NodeId,
    /// The stream's coordinator node (`None`: no checkpoints).
    pub(crate) coordinator: Option<NodeId>,
    /// Its inbox, when it runs here.
    pub(crate) inbox: Option<Sender<CoordInput>>,
}

impl ManualTrigger {
    /// The trigger of an engine without checkpoints (every request refused).
    pub(crate) fn off(stream: StreamId, node: NodeId) -> Self {
        Self { stream, node, coordinator: None, inbox: None }
    }

    /// Asks the coordinator to start a checkpoint of `stream` now (it waits for the one in
    /// flight and the minimum pause); a `savepoint` is asked for until one commits.
    pub(crate) fn fire(&self, stream: StreamId, savepoint: bool) -> Result<(), CheckpointError> {
        if stream != self.stream {
            let reason = format!("does not run on node {}", self.node);
            return Err(CheckpointError::Unavailable { stream, reason });
        }
        match (&self.inbox, self.coordinator) {
            (_, None) => Err(CheckpointError::Unavailable { stream, reason: "runs without checkpoints".into() }),
            (Some(inbox), _) if inbox.send(CoordInput::Trigger { savepoint }).is_ok() => {
                tracing::info!(stream = %stream, savepoint, "checkpoint requested");
                Ok(())
            }
            (Some(_), _) => Err(CheckpointError::Unavailable { stream, reason: "the coordinator has stopped".into() }),
            (None, Some(coordinator)) => Err(CheckpointError::NotCoordinator { stream, coordinator }),
        }
    }

    /// The answer to a client's `CheckpointNowReq`.
    pub(crate) fn answer(&self, stream: StreamId) -> CheckpointNowOutcome {
        match self.fire(stream, false) {
            Ok(()) => CheckpointNowOutcome::Accepted,
            Err(CheckpointError::NotCoordinator { coordinator, .. }) => {
                CheckpointNowOutcome::NotCoordinator { coordinator }
            }
            Err(e) => CheckpointNowOutcome::Refused { reason: e.to_string() },
        }
    }
}
