//! The runtime: pinned worker threads that poll the node's tasks, the queues between tasks, and
//! the router that connects them to tasks on other nodes.
//!
//! - Each local task belongs to exactly one worker (round robin); its state needs no lock.
//! - Each task has one bounded input queue per upstream, so one upstream's input can be held back
//!   (checkpoint alignment) while the others flow.
//! - Workers park when none of their tasks can make progress and are woken by whoever gives them
//!   work (a producer pushing into an empty queue, a consumer freeing a full one, the router).
//! - The router thread owns the receiving end of the transport: it checks each remote channel's
//!   sequence numbers, hands frames to the destination task's queue (credits guarantee room), and
//!   returns credits to local senders.

mod alignment;
mod batch_pool;
mod board;
mod budget;
mod build;
mod channel;
mod checkpointing;
mod config;
mod control;
mod error;
mod lifecycle;
mod log_feed;
mod log_floors;
mod node;
mod plan;
mod protocol_wire;
mod queries;
mod replay;
mod replication;
mod router;
mod shared;
mod status;
mod task;
mod unaligned;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_utils::sync::{Parker, Unparker};
use weir_wire::{FrameEncoder, TaskId};

pub use channel::{ChannelError, Inputs, Msg, Outputs, Rows};
use channel::{Input, Link, Net, Output};
pub use checkpointing::{CheckpointLog, CheckpointSettings, Remote};
pub use config::{EngineConfig, InSync};
pub use control::Control;
use control::ControlHandle;
pub use error::EngineError;
pub use node::Node;
use node::NodeUse;
pub use router::{CatalogCall, IngestToken, Standing, StandingPhase};
pub use shared::EngineStats;
use shared::Shared;
pub use task::{Poll, Polled, TaskError};
use worker::Cell;

use crate::ingest::IngestService;
use crate::spec::{Placement, SourceKind, StreamSpec, TaskKind};
use crate::state::{NodeResults, ResultStore, result_store_dir};

/// A running engine.
pub struct Engine {
    shared: Arc<Shared>,
    stats: Arc<EngineStats>,
    results: NodeResults,
    workers: Vec<JoinHandle<Result<(), TaskError>>>,
    /// Before `ingest`: its thread holds the service and stops first.
    log_floors: Option<log_floors::FloorWatch>,
    ingest: Option<Arc<IngestService<IngestToken>>>,
    ingest_acks: Option<crossbeam_channel::Receiver<crate::ingest::Appended<router::IngestToken>>>,
    controls: HashMap<TaskId, ControlHandle>,
    coordinator: Option<checkpointing::Running>,
    status: Arc<status::StatusBoard>,
    /// Each worker's kernel thread id, once it runs (0 until then, or where there is none).
    worker_tids: Arc<[AtomicU32]>,
    /// The node the stream runs on, while attached to it (see [`Node`]). Last: it drops after
    /// everything else of the run, and only then may the node start another run of the stream.
    node: Option<NodeUse>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("workers", &self.workers.len()).finish()
    }
}

impl Engine {
    /// Starts this node's share of `spec`, on a node of its own when `cfg` has a transport (the
    /// engine's end stops it).
    pub fn start(spec: &StreamSpec, placement: &Placement, cfg: EngineConfig) -> Result<Engine, EngineError> {
        spec.validate()?;
        let node = match &cfg.transport {
            Some(tc) => Some(Arc::new(Node::start_with(tc.clone(), true, None)?)),
            None => None,
        };
        Self::launch(spec, placement, cfg, node, true)
    }

    /// Starts this node's share of `spec` on `node`, beside the other streams it runs: the
    /// node's transport carries its channels, status and clients (`cfg.transport` must be
    /// unset), and the engine's end detaches the stream and leaves the node running. Each
    /// stream on a node needs a data directory of its own.
    pub fn start_on(
        node: &Arc<Node>,
        spec: &StreamSpec,
        placement: &Placement,
        mut cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        if cfg.transport.is_some() {
            return Err(EngineError::Config("a stream on a shared node uses the node's transport".into()));
        }
        if cfg.node != node.id() {
            return Err(EngineError::Config(format!("stream for node {} on node {}", cfg.node, node.id())));
        }
        cfg.transport = Some(node.transport_config().clone());
        Self::launch(spec, placement, cfg, Some(node.clone()), false)
    }

    fn launch(
        spec: &StreamSpec,
        placement: &Placement,
        cfg: EngineConfig,
        node: Option<Arc<Node>>,
        owned: bool,
    ) -> Result<Engine, EngineError> {
        let epoch = cfg.run_epoch();
        let mut node = node.map(|node| NodeUse { node, stream: spec.id, reserved: false, attached: false, owned });
        if let Some(n) = node.as_mut() {
            n.node.reserve(spec.id, epoch)?;
            n.reserved = true;
        }
        spec.validate()?;
        if cfg.workers == 0 || cfg.queue_capacity < 2 || cfg.remote_credits < 2 {
            return Err(EngineError::Config("workers must be >= 1, queue_capacity and remote_credits >= 2".into()));
        }
        // Private to this node's user, whatever the umask: everything below lives in it.
        crate::private_fs::private_dir_all(&cfg.data_dir)
            .map_err(|source| EngineError::DataDir { path: cfg.data_dir.clone(), source })?;
        let topo = spec.topology();
        let me = cfg.node;
        let plan = plan::Plan::of(&topo, placement, me, cfg.workers, spec.partitions);
        let local = &plan.local;
        if local.is_empty() {
            return Err(EngineError::Config(format!("no task of stream {} is placed on node {me}", spec.id)));
        }
        let paused_at = if cfg.paused { checkpointing::last_commit(spec, &cfg) } else { None };
        let board_of = |t: TaskId| match cfg.paused {
            true => board::TaskBoard::paused(t, paused_at),
            false => board::TaskBoard::new(t, cfg.checkpoint.is_some()),
        };
        let boards: HashMap<TaskId, Arc<board::TaskBoard>> = local.iter().map(|t| (t.id, board_of(t.id))).collect();
        // A node always has its transport running: besides remote channels it serves clients
        // (`weir load` ingest, status). Its heartbeats carry the local tasks' checkpoint summary.
        if node.is_none() && plan.needs_net() {
            return Err(EngineError::Config("tasks on other nodes need a transport config".into()));
        }

        // Workers and their wake-up handles.
        let parkers: Vec<Parker> = (0..cfg.workers).map(|_| Parker::new()).collect();
        let unparkers: Vec<Unparker> = parkers.iter().map(|p| p.unparker().clone()).collect();
        let worker_of = &plan.worker_of;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            aligning: Arc::new(AtomicUsize::new(0)),
            failure: OnceLock::new(),
            unparkers: unparkers.clone(),
            newer_epoch: Default::default(),
            tenure: cfg.tenure.clone(),
        });
        let stats = Arc::new(EngineStats::default());
        // One result store per local sink: its share of the results is part of its checkpoints.
        let mut sink_stores = Vec::new();
        for t in local {
            if matches!(t.kind, TaskKind::Sink { .. }) {
                sink_stores.push((t.id, Arc::new(ResultStore::open(&result_store_dir(&cfg.data_dir, t.id))?)));
            }
        }
        let results = NodeResults::new(sink_stores.iter().map(|(_, s)| s.clone()).collect());

        // Channels: one queue per edge into a local task; credits per edge out to a remote task.
        let mut rx_of = HashMap::new();
        let mut tx_of = HashMap::new();
        let mut router_in = HashMap::new();
        let mut router_credits = HashMap::new();
        for &((from, to), kind) in &plan.edges {
            match kind {
                plan::EdgeKind::Local | plan::EdgeKind::FromNetwork { .. } => {
                    let local_from = kind == plan::EdgeKind::Local;
                    let room = if local_from { cfg.queue_capacity } else { cfg.remote_credits };
                    let (tx, rx) = crossbeam_channel::bounded(room);
                    rx_of.insert((from, to), rx);
                    if local_from {
                        tx_of.insert((from, to), Edge::Local(tx));
                    } else {
                        router_in.insert((from, to), (tx, unparkers[worker_of[&to]].clone()));
                    }
                }
                plan::EdgeKind::ToNetwork { .. } => {
                    // No credit until the receiving task grants its window (its node's
                    // `remote_credits`): the receiver alone decides how much it can hold.
                    let credits = Arc::new(AtomicU32::new(0));
                    router_credits.insert((from, to), (credits.clone(), unparkers[worker_of[&from]].clone()));
                    tx_of.insert((from, to), Edge::Remote(credits));
                }
            }
        }
        // With a node, its router acknowledges appends to their clients; without one, whoever
        // appends locally reads the acknowledgements from `Engine::ingest_acks`.
        let (ack_tx, ingest_acks) = match node.as_ref().and_then(|n| n.node.ack_sender()) {
            Some(tx) => (tx, None),
            None => {
                let (tx, rx) = crossbeam_channel::unbounded();
                (tx, Some(rx))
            }
        };
        let sender = node.as_ref().map(|n| n.node.sender().clone());
        let ingest = match spec.source {
            SourceKind::IngestLog => Some(Arc::new(IngestService::start_replicated(
                &cfg.data_dir.join("ingest"),
                spec.partitions,
                cfg.log,
                cfg.sync,
                ack_tx,
                cfg.ingest_observer.clone(),
                replication::of(spec, &topo, placement, me, &cfg, sender.as_ref()),
            )?)),
            SourceKind::Generator { .. } => None,
        };
        let log_floors = match (&ingest, &cfg.checkpoint) {
            (Some(svc), Some(ck)) => Some(
                log_floors::FloorWatch::start(ck.open_store(), spec.id, svc.clone()).map_err(EngineError::Thread)?,
            ),
            _ => None,
        };

        let run = protocol_wire::Run { stream: spec.id, epoch };
        let net =
            |s: &weir_wire::transport::TransportSender| Net { sender: s.clone(), encoder: FrameEncoder::new(), run };
        let mut per_worker: Vec<Vec<Cell>> = (0..cfg.workers).map(|_| Vec::new()).collect();
        // Control queues first: the checkpoint side of every task needs its peers' queues.
        let mut control_rx = HashMap::new();
        let mut controls = HashMap::new();
        let attention: Vec<Arc<AtomicBool>> = (0..cfg.workers).map(|_| Arc::new(AtomicBool::new(false))).collect();
        for t in local {
            // Room for protocol traffic (ready messages, acknowledgements) of a few checkpoints.
            let (tx, rx) = crossbeam_channel::bounded(1024);
            let w = worker_of[&t.id];
            controls.insert(t.id, ControlHandle::new(tx, unparkers[w].clone(), attention[w].clone()));
            control_rx.insert(t.id, rx);
        }
        let peers = Arc::new(controls.clone());
        // A paused run takes no checkpoint: its tasks do not run.
        let hub = cfg.checkpoint.as_ref().filter(|_| !cfg.paused).map(|_| checkpointing::Hub::new(spec, placement, me));
        let coord_inbox = hub.as_ref().and_then(checkpointing::Hub::coordinator_inbox);
        let trigger = hub
            .as_ref()
            .map_or(checkpointing::coordinator::ManualTrigger::off(spec.id, me), checkpointing::Hub::manual_trigger);
        let status = Arc::new(status::StatusBoard {
            node: me,
            stream: spec.id,
            info: spec.info(),
            started: std::time::Instant::now(),
            tasks: local.iter().map(|t| boards[&t.id].clone()).collect(),
            checkpoints: hub.as_ref().map(checkpointing::Hub::log),
            coordinates: coord_inbox.is_some(),
            interval_ms: cfg.checkpoint.as_ref().map_or(0, |c| c.interval_ms),
            trigger,
            peer_tasks: Default::default(),
            peers: plan.peers.clone(),
            stop_requested: cfg.stop_requested.clone(),
            results: results.clone(),
            // The node's incarnation of the stream: this run's epoch.
            incarnation: epoch.0,
            restarts: cfg.restarts.clone(),
            failover: cfg.failover,
            paused: cfg.paused,
            links: std::sync::Mutex::new(cfg.links.iter().map(|l| (l.node, l.clone())).collect()),
            member: cfg.member_status.clone(),
            logs: ingest
                .as_deref()
                .map_or_else(Vec::new, |i| status::PartitionLog::all(i, &topo, placement, me, cfg.ingest_replicas)),
        });

        // The stream attaches to its node before the tasks restore (seconds from a remote store,
        // for a large state): the node answers status meanwhile (its tasks `waiting`), and what
        // peers send waits in the tasks' queues and the coordinator's inbox.
        if let Some(n) = node.as_mut() {
            let side = router::StreamSide {
                inputs: router_in,
                credits: router_credits,
                shared: shared.clone(),
                ingest: ingest.clone().map(|s| (s, plan.owners.clone())),
                proto: (peers.clone(), coord_inbox),
                status: status.clone(),
            };
            // A paused run's tasks are in its heartbeats too (nothing published): they tell its
            // peers of the run, so that a run of theirs with tasks ends and pauses as well.
            n.node.attach(run, side, local.iter().map(|t| boards[&t.id].clone()).collect())?;
            n.attached = true;
        }
        let ingest_acks = ingest.as_ref().and(ingest_acks);
        if cfg.paused {
            tracing::info!(node = %me, stream = %spec.id, "stream paused: its partitions take appends, its tasks do not run");
            return Ok(Engine {
                shared,
                stats,
                results,
                workers: Vec::new(),
                node,
                log_floors,
                ingest,
                ingest_acks,
                controls: HashMap::new(),
                coordinator: None,
                status,
                worker_tids: Arc::from([]),
            });
        }
        // Locating the restore point reads (and, without local files, downloads) every local
        // task's snapshot: after the router, so status is served meanwhile.
        let ckpt = match (&cfg.checkpoint, hub) {
            (Some(settings), Some(hub)) => Some(checkpointing::Setup::new(
                spec,
                placement,
                &cfg,
                settings,
                peers.clone(),
                sender.clone(),
                shared.aligning.clone(),
                hub,
            )?),
            _ => None,
        };
        let aggs_here = local.iter().filter(|t| matches!(t.kind, TaskKind::Agg { .. })).count();
        for t in local {
            let outs: Vec<Output> = t
                .downstreams
                .iter()
                .map(|d| {
                    let link = match tx_of.remove(&(t.id, *d)).expect("edge") {
                        Edge::Local(tx) => Link::Local { tx, wake: unparkers[worker_of[d]].clone() },
                        Edge::Remote(credits) => Link::Remote {
                            node: placement.node_of(*d),
                            credits,
                            seq: Default::default(),
                            encoded: None,
                        },
                    };
                    Output::new(*d, link)
                })
                .collect();
            let remote_out = outs.iter().any(|o| matches!(o.link, Link::Remote { .. }));
            let out = Outputs::new(t.id, outs, sender.as_ref().filter(|_| remote_out).map(net));
            let ins: Vec<Input> = t
                .upstreams
                .iter()
                .map(|u| {
                    let local_up = placement.node_of(*u) == me;
                    Input {
                        from: *u,
                        rx: rx_of.remove(&(*u, t.id)).expect("edge"),
                        wake_upstream: local_up.then(|| unparkers[worker_of[u]].clone()),
                        // The whole window is owed to the sender from the start: the first
                        // grant (sent, and retried, by the task's polls) opens the channel.
                        remote: (!local_up).then(|| (placement.node_of(*u), cfg.remote_credits as u32)),
                        ended: false,
                        closed: false,
                        paused: false,
                        received: 0,
                    }
                })
                .collect();
            let remote_in = ins.iter().any(|i| i.remote.is_some());
            let inp = Inputs::new(t.id, ins, cfg.remote_credits, sender.as_ref().filter(|_| remote_in).map(net));
            let parts = build::Parts {
                spec,
                cfg: &cfg,
                ingest: ingest.as_ref(),
                stats: &stats,
                board: &boards[&t.id],
                sink_store: sink_stores.iter().find(|(id, _)| *id == t.id).map(|(_, s)| s.clone()),
                aggs_here,
            };
            let mut task = build::task(t, &parts, inp, out);
            let ck = match &ckpt {
                Some(setup) => Some(Box::new(setup.task(t, &mut task)?)),
                None => None,
            };
            let control = control_rx.remove(&t.id).expect("control queue");
            let board = boards[&t.id].clone();
            per_worker[worker_of[&t.id]].push(Cell { task, control, paused: false, ckpt: ck, board });
        }
        let halt_shared = shared.clone();
        let halt: checkpointing::coordinator::Halt = Arc::new(move |why| halt_shared.fail(why));
        let coordinator = ckpt.map(|c| c.start_coordinator(halt)).transpose()?;
        let cores = if cfg.pin_workers { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
        let worker_tids: Arc<[AtomicU32]> = (0..cfg.workers).map(|_| AtomicU32::new(0)).collect();
        let mut workers = Vec::new();
        for (i, ((tasks, parker), attention)) in per_worker.into_iter().zip(parkers).zip(attention).enumerate() {
            let shared = shared.clone();
            let tids = worker_tids.clone();
            let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
            let h = std::thread::Builder::new()
                .name(format!("weir-worker-{i}"))
                .spawn(move || {
                    tids[i].store(current_tid().unwrap_or(0), Ordering::Relaxed);
                    if let Some(c) = core
                        && !core_affinity::set_for_current(c)
                    {
                        tracing::warn!(worker = i, core = c.id, "could not pin worker");
                    }
                    let _panic = worker::PanicGuard { worker: i, shared: &shared };
                    let r = worker::run(tasks, parker, &attention, &shared);
                    if let Err(e) = &r {
                        // A task the protocol cannot keep going stops the engine: its other
                        // tasks would only wait for it.
                        shared.fail(format!("worker {i}: {e}"));
                    }
                    r
                })
                .map_err(EngineError::Thread)?;
            workers.push(h);
        }
        tracing::info!(node = %me, stream = %spec.id, tasks = local.len(), workers = cfg.workers, "engine started");
        Ok(Engine {
            shared,
            stats,
            results,
            workers,
            node,
            log_floors,
            ingest,
            ingest_acks,
            controls,
            coordinator,
            status,
            worker_tids,
        })
    }
}

enum Edge {
    Local(crossbeam_channel::Sender<Msg>),
    Remote(Arc<AtomicU32>),
}

/// The calling thread's kernel id, from `/proc/thread-self` (a link to `<pid>/task/<tid>`).
fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}
