//! The router: the receiving side of a node's transport, shared by the streams the node runs. It
//! runs on its own thread and hands each frame to the stream the frame names: channel messages
//! to that stream's local tasks, credits to its local senders, protocol messages to its tasks'
//! control queues and its coordinator, and client requests (ingest, results, stop, checkpoint
//! now) to its services; it acknowledges ingest appends once they are durable.
//!
//! Invariants: a stream's queues and services are reachable from here exactly while one run of
//! it is attached ([`Router::attach`] to [`Router::detach`], which returns once the router has
//! let go of them). A peer's frame reaches only the run its epoch names: one of an earlier run is
//! dropped, one of a run not attached yet waits for it (`early.rs`), and one of a later run
//! also fails the earlier run still attached (its peers have restarted the stream). A client's
//! request for a stream that is not attached here gets an answer saying so; a frame for a
//! channel the attached run does not have fails that stream alone, as a gap in a channel's
//! sequence numbers does. A peer's loss (its connection, or its process replaced by a newer
//! one) reaches every attached stream. A run ends when one of its nodes says its part failed
//! ([`weir_wire::msg::RunFailed`], sent as soon as the run fails there) or runs a later one (its
//! frames or heartbeats): the node restarts the stream at the next epoch, or at that later one.

mod attached;
mod catalog;
mod clients;
mod early;
mod peers;
mod standing;

pub use catalog::CatalogCall;
pub(crate) use catalog::{DESK_QUEUE, Desk};
pub(crate) use standing::{Links, SharedLinks, Standings};
pub use standing::{Standing, StandingPhase};

use attached::Attached;
use peers::run;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use crossbeam_utils::sync::Unparker;
use weir_wire::msg::{Credit, Data, EndOfStream, Watermark, WindowResults};
use weir_wire::transport::{Event, Transport};
use weir_wire::{Epoch, Frame, FrameEncoder, Kind, NodeId, StreamId, TaskId};

use super::channel::Msg;
use super::protocol_wire::Run;
use super::shared::Shared;
use crate::ingest::{Appended, IngestService};

/// Who to acknowledge an ingest request to (node 0: nobody, the engine's own request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestToken {
    /// Client node.
    pub node: NodeId,
    /// Stream.
    pub stream: StreamId,
    /// Client's request id.
    pub request: u64,
    /// The run of the stream that took the request: only that run acknowledges it.
    pub epoch: Epoch,
}

/// Local tasks' control queues and, on the coordinator's node, its inbox.
pub(crate) type ProtoSide =
    (Arc<HashMap<TaskId, super::control::ControlHandle>>, Option<Sender<crate::checkpoint::CoordInput>>);

/// A stream's ingest writer (it acknowledges into [`Router::ack_sender`]) and where each
/// partition's source runs (the node that takes its appends).
pub(crate) type IngestSide = (Arc<IngestService<IngestToken>>, Vec<NodeId>);

/// What the router reaches of one stream on this node.
pub(crate) struct StreamSide {
    /// The queue into a local task of each channel from another node, and its worker.
    pub(crate) inputs: HashMap<(TaskId, TaskId), (Sender<Msg>, Unparker)>,
    /// The credits of each channel from a local task to another node, and the sender's worker.
    pub(crate) credits: HashMap<(TaskId, TaskId), (Arc<AtomicU32>, Unparker)>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) ingest: Option<IngestSide>,
    pub(crate) proto: ProtoSide,
    pub(crate) status: Arc<super::status::StatusBoard>,
}

enum Cmd {
    Attach(Run, Box<StreamSide>),
    /// Detaches the stream and hands it back (what it holds is dropped off the router thread).
    Detach(StreamId, Sender<Option<Attached>>),
    /// Fails every attached stream (its node stops under it), then answers.
    FailAll(String, Sender<()>),
}

/// The nodes connected to this one now.
pub(crate) type Connected = Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>;

/// Per stream, the newest run some node was seen in (by its frames or heartbeats).
pub(crate) type Seen = Arc<std::sync::Mutex<BTreeMap<StreamId, Epoch>>>;

/// What a node shares with its router besides the transport.
pub(crate) struct NodeSide {
    /// The other members of the cluster (the links status shows).
    pub(crate) links: SharedLinks,
    pub(crate) standings: Standings,
    pub(crate) seen: Seen,
    /// Why a newer process of this node replaced this one, once a peer said so.
    pub(crate) replaced: Arc<std::sync::OnceLock<String>>,
    /// Where catalog requests go.
    pub(crate) desk: Desk,
}

/// The router thread of a node, and the way streams attach to it.
pub(crate) struct Router {
    stop: Arc<AtomicBool>,
    up: Connected,
    cmds: Sender<Cmd>,
    acks: Sender<Appended<IngestToken>>,
    /// The router thread; it hands back the transport and the peers told of a stop.
    thread: Option<JoinHandle<(Transport, Vec<NodeId>)>>,
}

impl Router {
    /// Starts the router of node `node` on `transport`, with no stream attached. `held`: it
    /// takes nothing from the transport until the first stream attaches (a node started for
    /// one stream: the stream sees every event from the transport's start, as peers come up).
    pub(crate) fn start(
        node: NodeId,
        transport: Transport,
        held: bool,
        side: NodeSide,
    ) -> Result<Router, super::error::EngineError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (cmds, cmd_rx) = crossbeam_channel::unbounded();
        let (acks, ack_rx) = crossbeam_channel::unbounded();
        let up = Connected::default();
        let up2 = up.clone();
        let thread = std::thread::Builder::new()
            .name("weir-router".into())
            .spawn(move || {
                let mut r = Routing {
                    transport,
                    node,
                    streams: BTreeMap::new(),
                    up: up2,
                    early: Default::default(),
                    links: side.links,
                    standings: side.standings,
                    seen: side.seen,
                    replaced: side.replaced,
                    desk: side.desk,
                    deliver_at_exit: Vec::new(),
                    cmds: cmd_rx,
                    acks: ack_rx,
                    encoder: FrameEncoder::new(),
                };
                if !held || r.first_attach(&stop2) {
                    r.run(&stop2);
                }
                r.tell_failed();
                (r.transport, r.deliver_at_exit)
            })
            .map_err(super::error::EngineError::Thread)?;
        Ok(Router { stop, up, cmds, acks, thread: Some(thread) })
    }

    /// The nodes connected to this one now (peers and clients).
    pub(crate) fn connected(&self) -> Connected {
        self.up.clone()
    }

    /// Where the ingest writers of attached streams put their acknowledgements.
    pub(crate) fn ack_sender(&self) -> Sender<Appended<IngestToken>> {
        self.acks.clone()
    }

    /// Makes the queues and services of `run` reachable from the network (see the module's
    /// invariants); the caller attaches a run once, after the stream's earlier run detached.
    pub(crate) fn attach(&self, run: Run, side: StreamSide) {
        let _ = self.cmds.send(Cmd::Attach(run, Box::new(side)));
    }

    /// Lets go of `stream`'s queues and services: once this returns, nothing from the network
    /// reaches them (a router that has stopped holds none).
    pub(crate) fn detach(&self, stream: StreamId) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.cmds.send(Cmd::Detach(stream, tx)).is_ok() {
            // Disconnected once the router thread is gone: it dropped every stream then. The
            // stream's services (an ingest writer's final sync) end here, not on the router.
            drop(rx.recv());
        }
    }

    /// Fails every attached stream with `why` (their node stops under them).
    pub(crate) fn fail_all(&self, why: String) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.cmds.send(Cmd::FailAll(why, tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Stops the router, then the transport: what is queued goes first, to peers told of a
    /// stop even if they are not connected yet (one that has only just started).
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take()
            && let Ok((transport, told)) = t.join()
        {
            transport.shutdown_delivering(&told);
        }
    }
}

struct Routing {
    transport: Transport,
    node: NodeId,
    streams: BTreeMap<StreamId, Attached>,
    /// The nodes connected now (peers and clients), for a stream that attaches later.
    up: Connected,
    /// Peers' frames for streams that have not attached yet.
    early: early::Early,
    /// The links to the other members.
    links: SharedLinks,
    /// What the node says of streams with no run attached.
    standings: Standings,
    /// Per stream, the newest run some node was seen in.
    seen: Seen,
    replaced: Arc<std::sync::OnceLock<String>>,
    desk: Desk,
    /// Peers this node passed a client's stop on to: their queues are delivered at shutdown.
    deliver_at_exit: Vec<NodeId>,
    cmds: Receiver<Cmd>,
    acks: Receiver<Appended<IngestToken>>,
    encoder: FrameEncoder,
}

impl Routing {
    /// Waits for the first stream to attach; `false` when the router stops first.
    fn first_attach(&mut self, stop: &AtomicBool) -> bool {
        while !stop.load(Ordering::Acquire) {
            match self.cmds.recv_timeout(Duration::from_millis(50)) {
                Ok(c) => {
                    let attached = matches!(c, Cmd::Attach(..));
                    self.command(c);
                    if attached {
                        return true;
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return false,
            }
        }
        false
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Attach(run, side) => {
                let stream = run.stream;
                let mut s = Attached::new(run.epoch, *side);
                // The links that came up before it attached.
                let up = self.up.lock().unwrap_or_else(|e| e.into_inner()).clone();
                up.iter().filter(|n| s.status.peers.contains(n)).for_each(|n| s.peer_up(*n));
                if let Some(later) = self.early.newer(stream, run.epoch, |n| s.status.peers.contains(&n)) {
                    s.supersede(later, format!("a later run of the stream (epoch {later}) started on its other nodes"));
                }
                if self.replaced.get().is_some() {
                    s.fail(format!("a newer process of node {} runs", self.node));
                }
                let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).copied();
                if let Some(later) = seen.filter(|e| *e > run.epoch) {
                    s.supersede(later, format!("a later run of the stream (epoch {later}) runs on other nodes"));
                }
                match self.early.take(run, std::time::Instant::now()) {
                    Ok(frames) => {
                        self.streams.insert(stream, s);
                        frames.into_iter().for_each(|(from, frame)| self.on_frame(from, frame));
                    }
                    Err(()) => {
                        s.fail(format!(
                            "before it started on node {}, another of its nodes said the run failed, or frames \
                             its peers sent it were dropped (too many, or it started more than {} s after them)",
                            self.node,
                            early::MAX_WAIT.as_secs()
                        ));
                        self.streams.insert(stream, s);
                    }
                }
            }
            Cmd::Detach(stream, done) => {
                self.tell_failed();
                let _ = done.send(self.streams.remove(&stream));
            }
            Cmd::FailAll(why, done) => {
                self.streams.values().for_each(|s| s.fail(why.clone()));
                let _ = done.send(());
            }
        }
    }

    fn run(&mut self, stop: &AtomicBool) {
        let (events, cmds, acks) = (self.transport.events().clone(), self.cmds.clone(), self.acks.clone());
        while !stop.load(Ordering::Acquire) {
            crossbeam_channel::select! {
                recv(events) -> ev => match ev {
                    Ok(ev) => self.on_event(ev),
                    Err(_) => return,
                },
                recv(cmds) -> c => if let Ok(c) = c { self.command(c) },
                recv(acks) -> a => if let Ok(a) = a { self.ack(a) },
                default(Duration::from_millis(50)) => {}
            }
            self.tell_failed();
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Frame { from, frame } => self.on_frame(from, frame),
            Event::PeerDown { node, reason, orderly } => {
                if self.streams.values().any(|s| s.status.peers.contains(&node)) {
                    tracing::warn!(peer = %node, %reason, orderly, "peer down");
                } else {
                    tracing::debug!(client = %node, %reason, "client gone");
                }
                self.up.lock().unwrap_or_else(|e| e.into_inner()).remove(&node);
                self.links.lock().unwrap_or_else(|e| e.into_inner()).set(node, false, &reason);
                self.streams.values().for_each(|s| s.peer_down(node, &reason, orderly));
            }
            Event::PeerUp { node, .. } => {
                tracing::debug!(peer = %node, "peer up");
                self.up.lock().unwrap_or_else(|e| e.into_inner()).insert(node);
                self.links.lock().unwrap_or_else(|e| e.into_inner()).set(node, true, "");
                self.streams.values().for_each(|s| s.peer_up(node));
            }
            Event::Refused { code: weir_wire::msg::CloseCode::Stale, by_peer: true, reason, .. } => {
                // A peer knows a newer process of this node: this one was replaced (it was paused,
                // say, while the node started again) and must run nothing more.
                if self.replaced.set(reason.clone()).is_ok() {
                    tracing::error!(%reason, "a newer process of this node runs: this one stops");
                }
                let why = format!("a newer process of node {} runs", self.node);
                self.streams.values().for_each(|s| s.fail(why.clone()));
            }
            Event::Refused { code: weir_wire::msg::CloseCode::Stale, .. } => {}
            // The transport logs refusals (strangers' summed up): not again here.
            Event::Refused { reason, .. } => tracing::debug!(%reason, "connection refused"),
            Event::Heartbeat { from, tasks } => self.heard(from, &tasks),
        }
    }

    fn on_frame(&mut self, node: NodeId, frame: Frame) {
        // Channel messages: the channel's address read (validated) once here, the message made
        // in `deliver` (validated again only for the small kinds).
        let channel = match frame.kind() {
            Kind::Data => {
                frame.access::<Data>().ok().map(|m| (run(&m.stream, &m.epoch), m.from.get(), m.to.get(), m.seq.get()))
            }
            Kind::Watermark => frame
                .access::<Watermark>()
                .ok()
                .map(|m| (run(&m.stream, &m.epoch), m.from.get(), m.to.get(), m.seq.get())),
            Kind::WindowResults => frame
                .access::<WindowResults>()
                .ok()
                .map(|m| (run(&m.stream, &m.epoch), m.from.get(), m.to.get(), m.seq.get())),
            Kind::EndOfStream => frame
                .access::<EndOfStream>()
                .ok()
                .map(|m| (run(&m.stream, &m.epoch), m.from.get(), m.to.get(), m.seq.get())),
            Kind::CheckpointTrigger => frame
                .access::<weir_wire::msg::CheckpointTrigger>()
                .ok()
                .map(|m| (run(&m.stream, &m.epoch), m.from.get(), m.to.get(), m.seq.get())),
            _ => None,
        };
        if let Some((run, from, to, seq)) = channel {
            return self.deliver(node, run, from, to, seq, frame);
        }
        match frame.kind() {
            Kind::Data | Kind::Watermark | Kind::WindowResults | Kind::EndOfStream | Kind::CheckpointTrigger => {
                // Not a valid archive of its kind: the transport checked the frame, so a peer
                // sent it malformed; nothing of it is used.
                tracing::warn!(%node, kind = ?frame.kind(), "malformed channel frame dropped");
            }
            Kind::Credit => {
                let Ok(c) = frame.access::<Credit>() else { return };
                let (run, from, to, n) = (run(&c.stream, &c.epoch), c.from.get(), c.to.get(), c.credits.to_native());
                if self.admit(node, run, frame, "credit").is_none() {
                    return;
                }
                let Some(s) = self.streams.get(&run.stream) else { return };
                let stream = run.stream;
                match s.credits.get(&(from, to)) {
                    Some((credits, wake)) => {
                        credits.fetch_add(n, Ordering::AcqRel);
                        wake.unpark();
                    }
                    None => tracing::warn!(%stream, %from, %to, "credit for unknown channel"),
                }
            }
            Kind::Ingest => self.on_ingest(node, &frame),
            Kind::RunFailed => self.on_run_failed(node, &frame),
            Kind::Replicate | Kind::ReplicateAck => self.on_replication(node, &frame),
            Kind::CheckpointNowReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::CheckpointNowReq>() else { return };
                let outcome = match self.streams.get(&req.stream) {
                    Some(s) => s.status.trigger.answer(req.stream),
                    None => weir_wire::msg::CheckpointNowOutcome::Refused { reason: self.not_here(req.stream) },
                };
                let rsp = weir_wire::msg::CheckpointNowRsp { request: req.request, node: self.node, outcome };
                self.reply(node, &rsp, Duration::from_secs(1), "checkpoint-now response");
            }
            Kind::ResultsReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::ResultsReq>() else { return };
                // Read here, on the network thread: a page is at most 100,000 results (a few
                // milliseconds); a query service of its own is the way for heavier reads.
                let rsp = match self.streams.get(&req.stream) {
                    Some(s) => s.status.results_page(&req),
                    None => weir_wire::msg::ResultsRsp {
                        request: req.request,
                        node: self.node,
                        stores: 0,
                        results: Vec::new(),
                        next: None,
                        error: self.not_here(req.stream),
                    },
                };
                self.reply(node, &rsp, Duration::from_secs(5), "results page");
            }
            Kind::ProducersReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::ProducersReq>() else { return };
                let rsp = self.producers(req);
                self.reply(node, &rsp, Duration::from_secs(5), "producers response");
            }
            Kind::StopReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::StopReq>() else { return };
                self.on_stop(node, req);
            }
            Kind::StatusReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::StatusReq>() else { return };
                self.on_status(node, req.request, req.stream);
            }
            Kind::CatalogReq | Kind::CatalogChangeReq => self.on_catalog(node, &frame),
            other => match super::protocol_wire::decode(&frame) {
                Some((run, routed)) => {
                    if self.admit(node, run, frame, "protocol message").is_some() {
                        self.on_protocol(node, run.stream, routed);
                    }
                }
                None => tracing::debug!(kind = ?other, %node, "frame not handled by the data plane"),
            },
        }
    }

    /// Why a request for `stream` gets no answer of the stream's.
    fn not_here(&self, stream: StreamId) -> String {
        format!("stream {stream} does not run on node {}", self.node)
    }
}
