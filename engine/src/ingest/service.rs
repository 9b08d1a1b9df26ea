//! The node's ingest writer: one thread that appends to every partition log of the node and
//! acknowledges each append only once it is durable under the [`SyncPolicy`].
//!
//! Requests arrive on a bounded channel (a full channel pushes back on the network thread), and
//! acknowledgements leave on the caller's channel in append order per partition.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_wire::{Batch, Version};

use super::handle::LogHandle;
use super::log::{AppendOutcome, IngestLog, LogConfig, LogError};
use super::replication::{ReplicaInput, Replication, Replicator};
use super::segment::ProducerSeq;

/// Requests appended between two syncs at most (on top of the first one waited for).
const MAX_GROUP: usize = 512;

/// When appended rows become durable (and are acknowledged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fdatasync` before acknowledging; appends that arrive together share one sync.
    EveryAppend,
    /// `fdatasync` at most once per interval; acknowledgements wait for it.
    GroupCommit(Duration),
    /// Acknowledge once written to the OS: survives a killed process, not a power loss.
    None,
}

/// A request to append `batch` to `partition`; `token` comes back with the acknowledgement.
#[derive(Debug)]
pub struct AppendRequest<T> {
    /// Partition.
    pub partition: u32,
    /// Rows.
    pub batch: Batch,
    /// The producer and its sequence number on the partition (idempotent: a batch sent again
    /// is acknowledged with its original versions and not stored twice); `None` appends as is.
    pub from: Option<ProducerSeq>,
    /// After the rows, a watermark marker with this watermark ([`IngestLog::append_marker`]).
    pub watermark: Option<i64>,
    /// With a producer's first batch (sequence number 0): what it says of itself, kept in the
    /// partition's ledger ([`IngestLog::describe`]).
    pub describe: Option<Vec<u8>>,
    /// Caller's identification of the request.
    pub token: T,
}

/// Why an append was not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendFailure {
    /// The node keeps no such partition (fatal for the request: the client's stream shape is
    /// not the node's).
    #[error("no partition {partition} on this node ({partitions} partitions)")]
    NoPartition {
        /// The partition asked for.
        partition: u32,
        /// The partitions the node keeps.
        partitions: usize,
    },
    /// The log refused the append ([`crate::ingest::LogError`], as text: a gap, a damaged
    /// segment, the disk).
    #[error("{reason}")]
    Refused {
        /// Why.
        reason: String,
        /// Whether sending it again may succeed.
        retryable: bool,
    },
    /// The rows were written but their sync failed: they may be lost (retryable: sent again,
    /// an append is idempotent).
    #[error("not durable: {reason}")]
    NotDurable {
        /// Why the sync failed.
        reason: String,
    },
}

impl AppendFailure {
    /// Whether sending the append again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            AppendFailure::NoPartition { .. } => false,
            AppendFailure::Refused { retryable, .. } => *retryable,
            AppendFailure::NotDurable { .. } => true,
        }
    }
}

/// The outcome of an append, sent once durable (or failed).
#[derive(Debug)]
pub struct Appended<T> {
    /// The request's token.
    pub token: T,
    /// Partition.
    pub partition: u32,
    /// First and last version of the rows (`None` for an empty batch), or why it failed.
    pub result: Result<Option<(Version, Version)>, AppendFailure>,
    /// The rows were stored before: the request was a batch sent again.
    pub duplicate: bool,
    /// The version of the watermark marker appended after the rows.
    pub marker: Option<Version>,
}

/// What the writer tells of its appends (a node's metrics). Called on the writer thread, once per
/// request: it must be cheap (an atomic add, a histogram bucket).
pub trait IngestObserver: Send + Sync + std::fmt::Debug {
    /// An append acknowledged as durable: its rows (0 for a marker alone), the time from the
    /// writer taking the request to the acknowledgement (the group commit's wait and the sync),
    /// and whether it was a batch sent again.
    fn acknowledged(&self, rows: u64, latency: Duration, duplicate: bool);
    /// An append refused; `retryable` when sending it again may succeed.
    fn refused(&self, retryable: bool);
}

/// The running writer.
#[derive(Debug)]
pub struct IngestService<T> {
    requests: Sender<AppendRequest<T>>,
    replica_inputs: Sender<ReplicaInput>,
    handles: Vec<LogHandle>,
    /// Per partition: the writer deletes the log's segments wholly below this version.
    floors: Arc<[AtomicU64]>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> IngestService<T> {
    /// Opens the logs of `partitions` partitions under `dir` (one directory each) and starts the
    /// writer. Acknowledgements go to `acks`.
    pub fn start(
        dir: &Path,
        partitions: u32,
        cfg: LogConfig,
        policy: SyncPolicy,
        acks: Sender<Appended<T>>,
    ) -> Result<Self, LogError> {
        Self::start_observed(dir, partitions, cfg, policy, acks, None)
    }

    /// As [`Self::start`], telling `observer` of every acknowledgement and refusal.
    pub fn start_observed(
        dir: &Path,
        partitions: u32,
        cfg: LogConfig,
        policy: SyncPolicy,
        acks: Sender<Appended<T>>,
        observer: Option<Arc<dyn IngestObserver>>,
    ) -> Result<Self, LogError> {
        Self::start_replicated(dir, partitions, cfg, policy, acks, observer, None)
    }

    /// As [`Self::start_observed`], shipping each partition that `replication` names to its
    /// follower and acknowledging its appends once the follower has them
    /// ([`super::replication`]). Every writer keeps the copies its peers ship to it
    /// ([`Self::replica_inputs`]).
    pub fn start_replicated(
        dir: &Path,
        partitions: u32,
        cfg: LogConfig,
        policy: SyncPolicy,
        acks: Sender<Appended<T>>,
        observer: Option<Arc<dyn IngestObserver>>,
        replication: Option<Replication>,
    ) -> Result<Self, LogError> {
        let mut logs = Vec::new();
        for p in 0..partitions {
            logs.push(IngestLog::open(&partition_dir(dir, p), cfg)?);
        }
        let mut replicator = Replicator::new(replication);
        // Before any reader exists: sources of replicated partitions read only what the
        // follower holds too.
        replicator.start(&mut logs);
        let handles = logs.iter().map(IngestLog::handle).collect();
        let (requests, rx) = crossbeam_channel::bounded(1024);
        // Bounded too: a primary whose copies cannot be written fast enough waits for answers.
        let (replica_inputs, replica_rx) = crossbeam_channel::bounded(256);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let floors: Arc<[AtomicU64]> = (0..partitions).map(|_| AtomicU64::new(0)).collect();
        let floors2 = floors.clone();
        let thread = std::thread::Builder::new()
            .name("weir-ingest".into())
            .spawn(move || {
                let io = Io { rx, replica_rx, acks, observer: observer.as_deref(), floors: &floors2 };
                writer(logs, policy, io, replicator, &stop2)
            })
            .map_err(|source| LogError::Io { path: dir.to_path_buf(), source })?;
        Ok(Self { requests, replica_inputs, handles, floors, stop, thread: Some(thread) })
    }

    /// Where replication messages from peers go (entries to keep, followers' answers).
    pub fn replica_inputs(&self) -> &Sender<ReplicaInput> {
        &self.replica_inputs
    }

    /// Where requests go (bounded: a full queue means the disk is behind).
    pub fn requests(&self) -> &Sender<AppendRequest<T>> {
        &self.requests
    }

    /// Partitions the writer holds.
    pub fn partitions(&self) -> u32 {
        self.handles.len() as u32
    }

    /// Read access to partition `p`'s log.
    pub fn log(&self, p: u32) -> Option<&LogHandle> {
        self.handles.get(p as usize)
    }

    /// No reader will need partition `p`'s versions below `floor` again (every checkpoint a
    /// restore can start from reads above it: `backup::floor`): the writer deletes the log's
    /// segments wholly below it, soon. A lower floor than one given before changes nothing.
    pub fn truncate_below(&self, p: u32, floor: Version) {
        if let Some(f) = self.floors.get(p as usize) {
            f.fetch_max(floor.0, Ordering::AcqRel);
        }
    }
}

impl<T> Drop for IngestService<T> {
    fn drop(&mut self) {
        // The writer appends what is queued, syncs, acknowledges, and exits.
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Directory of partition `p`'s log under `dir`.
pub fn partition_dir(dir: &Path, p: u32) -> PathBuf {
    dir.join(format!("p{p:05}"))
}

/// The writer's channels.
struct Io<'a, T> {
    rx: Receiver<AppendRequest<T>>,
    replica_rx: Receiver<ReplicaInput>,
    acks: Sender<Appended<T>>,
    observer: Option<&'a dyn IngestObserver>,
    floors: &'a [AtomicU64],
}

impl<T> Io<'_, T> {
    /// Sends an acknowledgement (or refusal) to its caller, telling the observer.
    fn release(&self, a: Appended<T>, taken: Instant) {
        if let Some(o) = self.observer {
            match &a.result {
                Ok(v) => {
                    let rows = v.map_or(0, |(f, l)| l.0 - f.0 + 1);
                    o.acknowledged(rows, taken.elapsed(), a.duplicate);
                }
                Err(e) => o.refused(e.is_retryable()),
            }
        }
        let _ = self.acks.send(a);
    }
}

fn writer<T>(mut logs: Vec<IngestLog>, policy: SyncPolicy, io: Io<'_, T>, mut rep: Replicator<T>, stop: &AtomicBool) {
    // Each pending acknowledgement with the time its request was taken.
    let mut pending: Vec<(Appended<T>, Instant)> = Vec::new();
    let mut dirty = vec![false; logs.len()];
    let mut last_sync = Instant::now();
    let mut truncate_failed: Vec<Option<Instant>> = vec![None; logs.len()];
    let mut open = true;
    while open || !pending.is_empty() {
        if stop.load(Ordering::Acquire) {
            open = false;
        }
        // Appends wait for the next sync, and so do copies kept for other nodes.
        let waiting = !pending.is_empty() || rep.owes();
        let mut wait = match policy {
            SyncPolicy::GroupCommit(d) if waiting => d.saturating_sub(last_sync.elapsed()),
            _ if waiting => Duration::ZERO,
            _ => Duration::from_millis(100),
        };
        if rep.busy() {
            wait = wait.min(Duration::from_millis(20));
        }
        // Take what is there (waiting at most until the next sync is due).
        let first = if open {
            crossbeam_channel::select! {
                recv(io.rx) -> r => match r {
                    Ok(r) => Some(r),
                    Err(_) => {
                        open = false;
                        None
                    }
                },
                recv(io.replica_rx) -> r => {
                    if let Ok(input) = r {
                        for (a, taken) in rep.input(input, &mut logs) {
                            io.release(a, taken);
                        }
                    }
                    None
                },
                default(wait) => None,
            }
        } else {
            None
        };
        for input in std::iter::from_fn(|| io.replica_rx.try_recv().ok()).take(MAX_GROUP) {
            for (a, taken) in rep.input(input, &mut logs) {
                io.release(a, taken);
            }
        }
        // Bounded, so a producer faster than the disk cannot postpone the sync forever.
        let drained = std::iter::from_fn(|| io.rx.try_recv().ok()).take(MAX_GROUP);
        for req in first.into_iter().chain(drained) {
            let taken = Instant::now();
            let p = req.partition as usize;
            let Some(log) = logs.get_mut(p) else {
                let result = Err(AppendFailure::NoPartition { partition: req.partition, partitions: dirty.len() });
                let a = Appended { token: req.token, partition: req.partition, result, duplicate: false, marker: None };
                io.release(a, taken);
                continue;
            };
            let appended = match req.from {
                // A producer's description comes with its first batch and is stored before it.
                Some(from) if from.seq == 0 && req.describe.is_some() => {
                    let d = req.describe.as_deref().unwrap_or_default();
                    log.describe(from.producer, d).and_then(|()| log.append_from(from, &req.batch))
                }
                Some(from) => log.append_from(from, &req.batch),
                None => log.append(&req.batch).map(AppendOutcome::New),
            };
            let appended = appended.and_then(|o| match (req.watermark, req.from) {
                // A producer's marker ends its load: its ledger record says so.
                (Some(w), Some(from)) => {
                    log.append_marker(w).and_then(|at| log.end_load(from.producer, w).map(|()| (o, Some(at))))
                }
                (Some(w), None) => log.append_marker(w).map(|at| (o, Some(at))),
                (None, _) => Ok((o, None)),
            });
            match appended {
                Ok((o, marker)) => {
                    // A batch sent again is acknowledged with the others at the next sync: its
                    // original may be in this very group, not yet durable.
                    dirty[p] |= matches!(o, AppendOutcome::New(Some(_))) || marker.is_some();
                    let a = Appended {
                        token: req.token,
                        partition: req.partition,
                        result: Ok(o.versions()),
                        duplicate: matches!(o, AppendOutcome::Duplicate(..)),
                        marker,
                    };
                    pending.push((a, taken));
                }
                Err(e) => {
                    if matches!(e, LogError::Io { .. } | LogError::Corrupt { .. }) {
                        tracing::error!(partition = req.partition, error = %e, "ingest append failed");
                    } else {
                        tracing::debug!(partition = req.partition, error = %e, "ingest append refused");
                    }
                    let a = Appended {
                        token: req.token,
                        partition: req.partition,
                        result: Err(AppendFailure::Refused { reason: e.to_string(), retryable: e.is_retryable() }),
                        duplicate: false,
                        marker: None,
                    };
                    io.release(a, taken);
                }
            }
        }
        let due = match policy {
            SyncPolicy::GroupCommit(d) => last_sync.elapsed() >= d || !open,
            _ => true,
        };
        // Copies kept for other nodes sync with the node's own appends, at its group commit (a
        // sync per message received would take the writer's time from its own appends).
        if due && (rep.owes() || !pending.is_empty()) {
            rep.sync_copies(&mut logs);
            if !pending.is_empty() {
                sync_and_acknowledge(&mut logs, policy, &mut dirty, &mut pending, &io, &mut rep);
            }
            last_sync = Instant::now();
        }
        for (a, taken) in rep.pump(&mut logs) {
            io.release(a, taken);
        }
        truncate(&mut logs, io.floors, &mut truncate_failed);
    }
    for log in &mut logs {
        let _ = log.sync();
    }
    // What is still held or queued is answered, not dropped: its producer sends it again (to
    // the stream's next run, or wherever its partition went), on a connection that may stay.
    for (a, taken) in rep.abandon() {
        io.release(a, taken);
    }
    for req in io.rx.try_iter() {
        let reason = "the stream stopped on this node before the append".to_string();
        let result = Err(AppendFailure::Refused { reason, retryable: true });
        let a = Appended { token: req.token, partition: req.partition, result, duplicate: false, marker: None };
        io.release(a, Instant::now());
    }
}

/// Deletes the segments wholly below each partition's floor (nothing to delete costs no
/// system call: a copy that catches up is truncated once its segments pass the floor). After a
/// failure the partition waits a while before the next try.
fn truncate(logs: &mut [IngestLog], floors: &[AtomicU64], failed: &mut [Option<Instant>]) {
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    for (p, log) in logs.iter_mut().enumerate() {
        let floor = floors.get(p).map_or(0, |f| f.load(Ordering::Acquire));
        if floor == 0 || failed[p].is_some_and(|t| t.elapsed() < RETRY_AFTER) {
            continue;
        }
        let before = log.first_version();
        match log.truncate_below(Version(floor)) {
            Ok(first) => {
                failed[p] = None;
                if first > before {
                    tracing::debug!(partition = p, from = %before, to = %first, "ingest log truncated");
                }
            }
            Err(e) => {
                failed[p] = Some(Instant::now());
                tracing::warn!(partition = p, error = %e, "cannot truncate the ingest log");
            }
        }
    }
}

/// Makes the pending appends durable, then acknowledges them (those of a replicated partition
/// once its follower has them too). A failed sync fails every pending append of that
/// partition: the client must resend, and nothing unsynced is ever reported durable.
fn sync_and_acknowledge<T>(
    logs: &mut [IngestLog],
    policy: SyncPolicy,
    dirty: &mut [bool],
    pending: &mut Vec<(Appended<T>, Instant)>,
    io: &Io<'_, T>,
    rep: &mut Replicator<T>,
) {
    let mut failed: Vec<Option<String>> = vec![None; logs.len()];
    for (p, log) in logs.iter_mut().enumerate() {
        if !dirty[p] {
            continue;
        }
        let r = match policy {
            SyncPolicy::None => Ok(log.publish_unsynced()),
            _ => log.sync(),
        };
        if let Err(e) = r {
            tracing::error!(partition = p, error = %e, "ingest sync failed");
            failed[p] = Some(e.to_string());
        }
        dirty[p] = false;
    }
    for (mut a, taken) in pending.drain(..) {
        if let Some(e) = &failed[a.partition as usize] {
            a.result = Err(AppendFailure::NotDurable { reason: e.clone() });
        }
        if let Some((a, taken)) = rep.hold(a, taken) {
            io.release(a, taken);
        }
    }
}
