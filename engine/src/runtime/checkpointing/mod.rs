//! The checkpoint protocol on the engine: the effects of [`crate::checkpoint::driver`] made real.
//!
//! - [`settings`]: [`CheckpointSettings`], the remote store.
//! - [`port`]: a task's [`TaskDriver`](crate::checkpoint::driver::TaskDriver) on its worker
//!   ([`TaskCheckpointing`]): the task as the port, the queues, transport, uploader pool and meta
//!   record as its effects.
//! - [`coordinator`]: the coordinator thread with its store thread, and the manual trigger.
//! - [`agg_snapshot`]: what an agg's snapshot writes and names, and its restore.
//! - [`restore`]: a task's files on its node (state, local snapshots, meta record) and restoring.
//! - [`net`]: protocol messages to other nodes.
//! - [`stats`]: [`CheckpointLog`], the statistics of finished checkpoints.
//!
//! Messages between tasks and the coordinator travel through the tasks' control queues, and to
//! other nodes as the protocol's wire messages (`protocol_wire.rs`), which the receiving router
//! hands to the task's control queue or the coordinator's inbox. The coordinator runs on the
//! lowest node of the stream; every engine restores its own tasks from the shared store. This
//! module only sets them up ([`Setup`]) and stops them ([`Running`]).

pub(crate) mod agg_snapshot;
pub(crate) mod coordinator;
mod net;
pub(crate) mod port;
pub(crate) mod rescale;
pub(crate) mod restore;
mod settings;
mod stats;
mod verify;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use weir_wire::msg::RestoreBasis;
use weir_wire::{CheckpointId, NodeId, StreamId, TaskId};

pub use settings::{CheckpointSettings, Remote};
pub use stats::CheckpointLog;

use self::coordinator::{CoordStart, CoordThread, ManualTrigger};
use self::net::ProtoNet;
use self::port::{EngineClock, EngineTaskFx, PortCtx, TaskCheckpointing};
use self::verify::NodePoint;
use super::config::EngineConfig;
use super::control::ControlHandle;
use super::error::EngineError;
use super::task::Task;
use crate::backup::Store;
use crate::backup::commit_point::{Begin, CommitBook, StoreCommits};
use crate::backup::uploader::UploaderPool;
use crate::checkpoint::driver::TaskDriver;
use crate::checkpoint::{
    CheckpointError, CommitRecord, CoordInput, Coordinator, IdRecord, Role, TaskMachine, TaskSetup,
};
use crate::spec::{Placement, StreamSpec, TaskDesc, TaskKind, Topology};

fn role(k: &TaskKind) -> Role {
    match k {
        TaskKind::Source { .. } => Role::Source,
        TaskKind::Agg { .. } => Role::Agg,
        TaskKind::Sink { .. } => Role::Sink,
    }
}

/// How a record's restore point came about, as a restore reports it.
fn basis_of(r: &CommitRecord) -> RestoreBasis {
    match r.kind {
        crate::checkpoint::RecordKind::Fallback(_) => RestoreBasis::Fallback,
        _ => RestoreBasis::Committed,
    }
}

/// A number that tells this start of task `t` from every other (the consensus request's id).
fn start_token(t: TaskId) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    now ^ (u64::from(std::process::id()) << 32) ^ u64::from(t.0).rotate_left(48)
}

/// The aggs and sinks of `topo` (`None` without aggs).
fn shape_of(topo: &Topology) -> Option<crate::checkpoint::Shape> {
    let of = |f: fn(&TaskKind) -> bool| topo.tasks.iter().filter(move |t| f(&t.kind)).map(|t| t.id);
    let first_agg = of(|k| matches!(k, TaskKind::Agg { .. })).min()?;
    let aggs = of(|k| matches!(k, TaskKind::Agg { .. })).count() as u32;
    let sinks = of(|k| matches!(k, TaskKind::Sink { .. })).count() as u32;
    Some(crate::checkpoint::Shape { first_agg, aggs, sinks })
}

/// What the engine needs to give every task its checkpoint side and start the coordinator.
pub(crate) struct Setup {
    aligning: Arc<AtomicUsize>,
    stream: StreamId,
    data: PathBuf,
    store: Arc<dyn Store>,
    settings: CheckpointSettings,
    /// The last commit record, which every task restores before the workers start; without
    /// one, tasks start `Uninit` and restore the coordinator's consensus when it answers.
    last: Option<CommitRecord>,
    /// Whether this node's tasks can restore the last record's point; when not, they start
    /// `Uninit` and ask the coordinator to take the stream back.
    node_point: NodePoint,
    restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    ids: IdRecord,
    /// Where ids are reserved and commits made.
    book: Arc<dyn CommitBook>,
    peers: Arc<HashMap<TaskId, ControlHandle>>,
    coord_tx: Sender<CoordInput>,
    coord_rx: Receiver<CoordInput>,
    uploaders: UploaderPool,
    log: Arc<CheckpointLog>,
    topo: Topology,
    /// The partition of each source task reading an ingest log (none for a generator stream).
    log_partitions: BTreeMap<TaskId, u32>,
    node: NodeId,
    /// The run's number, its epoch ([`EngineConfig::run_epoch`]: the transport's incarnation
    /// unless set): whose records of files stored ahead the sinks write, and below which
    /// retention deletes them.
    incarnation: u64,
    /// The stream's run: what its protocol messages carry.
    epoch: weir_wire::Epoch,
    node_of: Arc<HashMap<TaskId, NodeId>>,
    coord_node: NodeId,
    sender: Option<weir_wire::transport::TransportSender>,
}

/// What the node's network side needs of checkpointing before the tasks restore (which reads
/// the store, seconds for a large state): the coordinator's inbox, where reports wait until the
/// coordinator starts, and the statistics log status reads.
pub(crate) struct Hub {
    stream: StreamId,
    node: NodeId,
    coord_node: NodeId,
    coord_tx: Sender<CoordInput>,
    coord_rx: Receiver<CoordInput>,
    log: Arc<CheckpointLog>,
}

impl Hub {
    pub(crate) fn new(spec: &StreamSpec, placement: &Placement, node: NodeId) -> Hub {
        // The coordinator runs on the lowest node of the stream; every engine reads the same store.
        let coord_node = spec.topology().tasks.iter().map(|t| placement.node_of(t.id)).min().unwrap_or(node);
        let (coord_tx, coord_rx) = crossbeam_channel::unbounded();
        Hub { stream: spec.id, node, coord_node, coord_tx, coord_rx, log: Arc::new(CheckpointLog::default()) }
    }

    /// The checkpoint statistics this node collects (the coordinator's node fills them).
    pub(crate) fn log(&self) -> Arc<CheckpointLog> {
        self.log.clone()
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
}

impl Setup {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        spec: &StreamSpec,
        placement: &Placement,
        cfg: &EngineConfig,
        settings: &CheckpointSettings,
        peers: Arc<HashMap<TaskId, ControlHandle>>,
        sender: Option<weir_wire::transport::TransportSender>,
        aligning: Arc<AtomicUsize>,
        hub: Hub,
    ) -> Result<Setup, EngineError> {
        let topo = spec.topology();
        let node_of: HashMap<TaskId, NodeId> = topo.tasks.iter().map(|t| (t.id, placement.node_of(t.id))).collect();
        let log_partitions = match spec.source {
            crate::spec::SourceKind::IngestLog => topo
                .tasks
                .iter()
                .filter_map(|t| match t.kind {
                    crate::spec::TaskKind::Source { partition } => Some((t.id, partition)),
                    _ => None,
                })
                .collect(),
            crate::spec::SourceKind::Generator { .. } => BTreeMap::new(),
        };
        let coord_node = hub.coord_node;
        let store = settings.open_store();
        let restored = Arc::new(OnceLock::new());
        let book: Arc<dyn CommitBook> = cfg.commits.clone().unwrap_or_else(|| Arc::new(StoreCommits::new(spec.id)));
        let begin = if coord_node == cfg.node {
            // Only the coordinator reserves ids; a record it cannot read must stop it rather
            // than start again at 1.
            book.begin(store.as_ref())?
        } else if cfg.failover {
            // The coordinator's answer is the point: it reads the record once its own old
            // engine has stopped, so every node of a restart restores the same commit.
            tracing::info!(stream = %spec.id, coordinator = %coord_node, "the tasks take their restore point from the coordinator");
            Begin { ids: IdRecord::default(), last: None }
        } else {
            let last = book.last(store.as_ref()).map_err(|e| EngineError::Store(e.to_string()))?;
            Begin { ids: IdRecord::default(), last }
        };
        let Begin { ids, last } = begin;
        let local: Vec<TaskId> = topo.tasks.iter().map(|t| t.id).filter(|t| node_of[t] == cfg.node).collect();
        let node_point = match &last {
            // A commit of another shape restores as a rescale: only the tasks it names (the
            // sources) have files of their own in it.
            Some(r) => {
                let named: Vec<TaskId> = match r.shape {
                    // A savepoint of another shape: its old tasks' files go as the new ones
                    // restore (`rescale.rs`).
                    Some(s) if Some(s) != shape_of(&topo) => {
                        local.iter().copied().filter(|t| r.manifests.contains_key(t)).collect()
                    }
                    _ => {
                        let commit = matches!(r.kind, crate::checkpoint::RecordKind::Commit(_));
                        if let Some(t) = local.iter().find(|t| commit && !r.manifests.contains_key(t)) {
                            return Err(EngineError::Checkpoint(CheckpointError::Restore {
                                task: *t,
                                id: r.restore_point(),
                                reason: format!(
                                    "checkpoint {} was taken with other tasks (none is {t}) and is no savepoint: a \
                                     stream restores at other parallelism from a savepoint only (`weir stream pause` \
                                     takes one)",
                                    r.id
                                ),
                            }));
                        }
                        local
                    }
                };
                verify::check_node(store.as_ref(), spec.id, &cfg.data_dir, &named, r, book.as_ref())?
            }
            None => NodePoint::Ready(Default::default()),
        };
        match &last {
            Some(r) if matches!(node_point, NodePoint::Damaged { .. }) => tracing::warn!(
                stream = %spec.id,
                record = %r.id,
                "the tasks wait for the coordinator to choose an older checkpoint"
            ),
            Some(r) => match r.restore_point() {
                Some(id) => {
                    tracing::info!(stream = %spec.id, checkpoint = %id, kind = ?r.kind, "restoring from the last commit");
                    let _ = restored.set((basis_of(r), Some(id)));
                }
                None => {
                    tracing::info!(stream = %spec.id, record = %r.id, "the last record says start from nothing");
                    let _ = restored.set((RestoreBasis::Fresh, None));
                }
            },
            None if cfg.failover && coord_node != cfg.node => {}
            None => tracing::info!(
                stream = %spec.id,
                "no commit record: the tasks ask the coordinator where to start (the consensus of what they committed, or the beginning)"
            ),
        }
        let Hub { coord_tx, coord_rx, log, .. } = hub;
        let uploaders = UploaderPool::start(
            settings.uploaders,
            store.clone(),
            spec.id,
            aligning.clone(),
            crate::sys::background_thread,
        )
        .map_err(EngineError::Thread)?;
        Ok(Setup {
            aligning,
            stream: spec.id,
            data: cfg.data_dir.clone(),
            store,
            settings: settings.clone(),
            last,
            node_point,
            restored,
            ids,
            book,
            peers,
            coord_tx,
            coord_rx,
            uploaders,
            log,
            topo,
            log_partitions,
            node: cfg.node,
            incarnation: cfg.run_epoch().0,
            epoch: cfg.run_epoch(),
            node_of: Arc::new(node_of),
            coord_node,
            sender,
        })
    }

    /// The checkpoint side of task `t`: restored from the last commit record, or (without one)
    /// `Uninit`, waiting for the coordinator's restore point.
    pub(crate) fn task(&self, t: &TaskDesc, task: &mut Task) -> Result<TaskCheckpointing, EngineError> {
        let setup = TaskSetup {
            stream: self.stream,
            task: t.id,
            node: self.node,
            role: role(&t.kind),
            upstreams: t.upstreams.iter().map(|u| (*u, self.node_of[u])).collect(),
            downstreams: t.downstreams.iter().map(|d| (*d, self.node_of[d])).collect(),
            trigger_timeout_ms: self.settings.trigger_timeout_ms,
            ready_resend_ms: self.settings.ready_resend_ms,
            // A sink's result store takes upserts of deterministic values: it need not hold an
            // upstream back while it waits for the others' triggers.
            hold_inputs: !matches!(t.kind, TaskKind::Sink { .. }),
        };
        let index = Arc::new(std::sync::Mutex::new(crate::backup::UploadIndex::new()));
        if let Task::Sink(s) = &*task {
            let live: Arc<dyn crate::backup::ahead::LiveSsts> = s.store.clone();
            let writer = crate::backup::ahead::AheadWriter { incarnation: self.incarnation, node: self.node };
            self.uploaders.store_ahead(crate::backup::ahead::Watched::new(t.id, writer, live, index.clone()));
        }
        let mut ck = TaskCheckpointing {
            driver: TaskDriver::new(TaskMachine::new(setup), start_token(t.id)),
            fx: EngineTaskFx {
                task: t.id,
                node: self.node,
                clock: EngineClock::new(),
                data: self.data.clone(),
                peers: self.peers.clone(),
                coord: self.coord_tx.clone(),
                coord_node: self.coord_node,
                net: self.net(),
                uploads: self.uploaders.jobs(),
                log: self.log.clone(),
                engine_aligning: self.aligning.clone(),
                restored: self.restored.clone(),
                keep_local: self.settings.retain.max(1),
                index: index.clone(),
            },
            ctx: PortCtx {
                task: t.id,
                stream: self.stream,
                data: self.data.clone(),
                store: self.store.clone(),
                book: self.book.clone(),
                index,
                chain: Default::default(),
                located: std::cell::RefCell::new(match &self.node_point {
                    NodePoint::Ready(found) => found.get(&t.id).cloned().map(|(m, dir)| (m.id, m, dir)),
                    NodePoint::Damaged { .. } => None,
                }),
                shape: shape_of(&self.topo),
            },
        };
        if let NodePoint::Damaged { id, restorable, reason } = &self.node_point {
            ck.driver.cannot_restore(*id, restorable.clone(), reason.clone());
            return Ok(ck);
        }
        if let Some(r) = self.last.as_ref() {
            match verify::point_of(r, t.id) {
                Some(point) => ck.restore(task, Some(point), basis_of(r), None)?,
                // The consensus chose to start from nothing, and recorded it.
                None => ck.restore(task, None, RestoreBasis::Fresh, None)?,
            }
        }
        Ok(ck)
    }

    fn net(&self) -> Option<ProtoNet> {
        self.sender.clone().map(|sender| ProtoNet {
            sender,
            enc: weir_wire::FrameEncoder::new(),
            me: self.node,
            run: super::protocol_wire::Run { stream: self.stream, epoch: self.epoch },
            node_of: self.node_of.clone(),
        })
    }

    /// Starts the coordinator if it runs on this node; returns it with the statistics log and the
    /// uploader pool (which ends once every task has dropped its job queue: join it after the
    /// workers).
    pub(crate) fn start_coordinator(self, halt: coordinator::Halt) -> Result<Running, EngineError> {
        let cfg = crate::checkpoint::CoordinatorConfig {
            stream: self.stream,
            tasks: self.topo.tasks.iter().map(|t| (t.id, self.node_of[&t.id], role(&t.kind))).collect(),
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
            store_timeout_ms: self.settings.store_timeout_ms,
        };
        let (log, restored, uploaders) = (self.log.clone(), self.restored.clone(), self.uploaders);
        if self.coord_node != self.node {
            return Ok(Running { restored, coordinator: None, log, uploaders });
        }
        let net = self.sender.clone().map(|sender| ProtoNet {
            sender,
            enc: weir_wire::FrameEncoder::new(),
            me: self.node,
            run: super::protocol_wire::Run { stream: self.stream, epoch: self.epoch },
            node_of: self.node_of.clone(),
        });
        let t = CoordThread::start(CoordStart {
            coordinator: Coordinator::new(cfg),
            stream: self.stream,
            store: self.store,
            inbox: (self.coord_tx, self.coord_rx),
            peers: self.peers,
            last_commit: self.last,
            ids: self.ids,
            book: self.book,
            log: self.log,
            net,
            store_timeout: Duration::from_millis(self.settings.store_timeout_ms),
            retain: self.settings.retain,
            log_partitions: self.log_partitions,
            incarnation: self.incarnation,
            halt,
        })
        .map_err(EngineError::Thread)?;
        Ok(Running { restored, coordinator: Some(t), log, uploaders })
    }
}

/// The checkpoint machinery of a running engine: the coordinator (on its node), the statistics,
/// the uploader pool.
pub(crate) struct Running {
    /// What the engine restored at start, once its tasks have restored.
    pub(crate) restored: Arc<OnceLock<(RestoreBasis, Option<CheckpointId>)>>,
    pub(crate) coordinator: Option<CoordThread>,
    pub(crate) log: Arc<CheckpointLog>,
    pub(crate) uploaders: UploaderPool,
}

impl Running {
    /// Stops the coordinator and waits for the uploads in flight (call after the workers ended).
    pub(crate) fn stop(self) {
        if let Some(mut c) = self.coordinator {
            c.stop();
        }
        self.uploaders.join();
    }
}

/// The stream's last commit, for a paused run's status (its tasks restore it when the stream
/// resumes); `None` without checkpoints, without a commit, or when the store does not answer.
pub(crate) fn last_commit(
    spec: &crate::spec::StreamSpec,
    cfg: &super::EngineConfig,
) -> Option<weir_wire::CheckpointId> {
    let settings = cfg.checkpoint.as_ref()?;
    let book: Arc<dyn CommitBook> = cfg.commits.clone().unwrap_or_else(|| Arc::new(StoreCommits::new(spec.id)));
    match book.last(settings.open_store().as_ref()) {
        Ok(last) => last.map(|r| r.id),
        Err(e) => {
            tracing::warn!(stream = %spec.id, error = %e, "the paused stream's last commit is unknown");
            None
        }
    }
}
