//! The router: the receiving side of a node's transport, shared by the streams the node runs. It
//! runs on its own thread and hands each frame to the stream the frame names: channel messages
//! to that stream's local tasks, credits to its local senders, protocol messages to its tasks'
//! control queues and its coordinator, and client requests (ingest, results, stop, checkpoint
//! now) to its services; it acknowledges ingest appends once they are durable.
//!
//! Invariants: a stream's queues and services are reachable from here exactly while it is
//! attached ([`Router::attach`] to [`Router::detach`], which returns once the router has let go
//! of them). A frame for a stream that is not attached here is dropped (a request gets an answer
//! saying so); a frame for a channel its attached stream does not have fails that stream alone,
//! as a gap in a channel's sequence numbers does. Events of the transport itself (a peer lost, a
//! peer at a newer incarnation) reach every attached stream.

mod clients;
mod early;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use crossbeam_utils::sync::Unparker;
use weir_wire::msg::{Credit, Data, EndOfStream, TaskHeartbeat, Watermark, WindowResults};
use weir_wire::transport::{Event, Transport};
use weir_wire::{Frame, FrameEncoder, Kind, NodeId, Seq, StreamId, TaskId};

use super::channel::{Msg, Rows};
use super::shared::Shared;
use crate::ingest::{Appended, IngestService};
use crate::operator::window::WindowResult;

/// Who to acknowledge an ingest request to (node 0: nobody, the engine's own request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestToken {
    /// Client node.
    pub node: NodeId,
    /// Stream.
    pub stream: StreamId,
    /// Client's request id.
    pub request: u64,
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

struct InChannel {
    tx: Sender<Msg>,
    wake: Unparker,
    next: Seq,
}

/// An attached stream, as the router thread holds it.
struct Attached {
    inputs: HashMap<(TaskId, TaskId), InChannel>,
    credits: HashMap<(TaskId, TaskId), (Arc<AtomicU32>, Unparker)>,
    shared: Arc<Shared>,
    ingest: Option<IngestSide>,
    proto: ProtoSide,
    status: Arc<super::status::StatusBoard>,
}

impl From<StreamSide> for Attached {
    fn from(s: StreamSide) -> Self {
        let inputs = s.inputs.into_iter().map(|(k, (tx, wake))| (k, InChannel { tx, wake, next: Seq(0) })).collect();
        Attached { inputs, credits: s.credits, shared: s.shared, ingest: s.ingest, proto: s.proto, status: s.status }
    }
}

impl Attached {
    fn fail(&self, why: String) {
        self.shared.fail(why);
    }

    /// Whether `node` runs tasks of the stream (only those speak for its channels and its
    /// protocol: another member of the cluster has no say in a stream it does not run).
    fn heeds(&self, node: NodeId, what: &str) -> bool {
        let peer = self.status.peers.contains(&node);
        if !peer {
            tracing::warn!(stream = %self.status.stream, %node, "{what} from a node that does not run the stream dropped");
        }
        peer
    }

    /// Checks the channel's sequence number and hands `msg` to its task.
    fn deliver(&mut self, from: TaskId, to: TaskId, seq: Seq, msg: Msg) {
        let Some(ch) = self.inputs.get_mut(&(from, to)) else {
            return self.fail(format!("frame for unknown channel {from} -> {to}"));
        };
        if seq != ch.next {
            // A gap means frames were lost (a broken connection): results would be wrong.
            let why = format!("channel {from} -> {to}: expected {}, got {seq}: data lost", ch.next);
            return self.fail(why);
        }
        ch.next = seq.next();
        match ch.tx.try_send(msg) {
            Ok(()) => ch.wake.unpark(),
            Err(TrySendError::Full(_)) => self.fail(format!("channel {from} -> {to} overran its credits")),
            Err(TrySendError::Disconnected(_)) => {} // the task finished or the stream stops
        }
    }

    /// Node `node` of the transport went away (`orderly`: it said goodbye).
    fn peer_down(&self, node: NodeId, reason: &str, orderly: bool) {
        self.status.link(node, false, reason.to_string());
        // Not once the stream stops here: peers go as they stop, not always in order.
        let stopping = self.shared.stop.load(Ordering::Acquire) || self.status.stop_requested.load(Ordering::Acquire);
        let peer = self.status.peers.contains(&node);
        if self.status.failover && !orderly && !stopping && peer && !self.status.finished() {
            // Frames to and from it are lost: the stream restarts from its last commit.
            self.fail(format!("node {node} of the stream was lost ({reason})"));
        }
        // Its tasks cannot finish a checkpoint in flight: the coordinator fails it.
        if let Some(inbox) = &self.proto.1 {
            let _ = inbox.send(crate::checkpoint::CoordInput::NodeLost { node });
        }
    }

    fn newer_incarnation(&self, node: NodeId, incarnation: u64) {
        self.shared.newer_incarnation.fetch_max(incarnation, Ordering::AcqRel);
        self.fail(format!("node {node} restarted the stream (incarnation {incarnation})"));
    }

    fn peer_up(&self, node: NodeId) {
        self.status.link(node, true, String::new());
        if let Some(inbox) = &self.proto.1 {
            let _ = inbox.send(crate::checkpoint::CoordInput::NodeUp { node });
        }
    }
}

enum Cmd {
    Attach(StreamId, Box<StreamSide>),
    /// Detaches the stream and hands it back (what it holds is dropped off the router thread).
    Detach(StreamId, Sender<Option<Attached>>),
    /// Fails every attached stream (its node stops under it), then answers.
    FailAll(String, Sender<()>),
}

/// The router thread of a node, and the way streams attach to it.
/// The nodes connected to this one now.
pub(crate) type Connected = Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>;

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
    pub(crate) fn start(node: NodeId, transport: Transport, held: bool) -> Result<Router, super::error::EngineError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (cmds, cmd_rx) = crossbeam_channel::unbounded();
        let (acks, ack_rx) = crossbeam_channel::unbounded();
        let up = Connected::default();
        let up2 = up.clone();
        let thread = std::thread::Builder::new()
            .name("weir-router".into())
            .spawn(move || {
                let mut r = Run {
                    transport,
                    node,
                    streams: BTreeMap::new(),
                    up: up2,
                    early: Default::default(),
                    newer: None,
                    deliver_at_exit: Vec::new(),
                    cmds: cmd_rx,
                    acks: ack_rx,
                    encoder: FrameEncoder::new(),
                };
                if !held || r.first_attach(&stop2) {
                    r.run(&stop2);
                }
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

    /// Makes `stream`'s queues and services reachable from the network (see the module's
    /// invariants); the caller attaches a stream once.
    pub(crate) fn attach(&self, stream: StreamId, side: StreamSide) {
        let _ = self.cmds.send(Cmd::Attach(stream, Box::new(side)));
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

struct Run {
    transport: Transport,
    node: NodeId,
    streams: BTreeMap<StreamId, Attached>,
    /// The nodes connected now (peers and clients), for a stream that attaches later.
    up: Connected,
    /// Peers' frames for streams that have not attached yet.
    early: early::Early,
    /// The newest incarnation a peer was seen at, for streams that attach later.
    newer: Option<(NodeId, u64)>,
    /// Peers this node passed a client's stop on to: their queues are delivered at shutdown.
    deliver_at_exit: Vec<NodeId>,
    cmds: Receiver<Cmd>,
    acks: Receiver<Appended<IngestToken>>,
    encoder: FrameEncoder,
}

impl Run {
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
            Cmd::Attach(stream, side) => {
                let s = Attached::from(*side);
                // The links that came up before it attached.
                let up = self.up.lock().unwrap_or_else(|e| e.into_inner()).clone();
                up.iter().filter(|n| s.status.peers.contains(n)).for_each(|n| s.peer_up(*n));
                if let Some((node, incarnation)) = self.newer {
                    s.newer_incarnation(node, incarnation);
                }
                match self.early.take(stream, std::time::Instant::now()) {
                    Ok(frames) => {
                        self.streams.insert(stream, s);
                        frames.into_iter().for_each(|(from, frame)| self.on_frame(from, frame));
                    }
                    Err(()) => {
                        s.fail(format!(
                            "frames its peers sent it before it started on node {} were dropped (too many, or \
                             it started more than {} s after them)",
                            self.node,
                            early::MAX_WAIT.as_secs()
                        ));
                        self.streams.insert(stream, s);
                    }
                }
            }
            Cmd::Detach(stream, done) => {
                let s = self.streams.remove(&stream);
                self.early.gone(stream);
                let _ = done.send(s);
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
                self.streams.values().for_each(|s| s.peer_down(node, &reason, orderly));
            }
            Event::PeerUp { node, .. } => {
                tracing::debug!(peer = %node, "peer up");
                self.up.lock().unwrap_or_else(|e| e.into_inner()).insert(node);
                self.streams.values().for_each(|s| s.peer_up(node));
            }
            Event::NewerIncarnation { node, incarnation } => {
                // The incarnation is the node's: every stream here restarts at the newer one, and
                // so does a stream that attaches later.
                if self.newer.is_none_or(|(_, i)| i < incarnation) {
                    self.newer = Some((node, incarnation));
                }
                self.streams.values().for_each(|s| s.newer_incarnation(node, incarnation));
            }
            Event::Refused {
                code: weir_wire::msg::CloseCode::Stale | weir_wire::msg::CloseCode::Restarting, ..
            } => {}
            // The transport logs refusals (strangers' summed up): not again here.
            Event::Refused { reason, .. } => tracing::debug!(%reason, "connection refused"),
            Event::Heartbeat { from, tasks } => self.heard(from, &tasks),
        }
    }

    /// A peer's heartbeat: each attached stream takes its own tasks' summaries.
    fn heard(&self, from: NodeId, tasks: &[TaskHeartbeat]) {
        self.streams.values().for_each(|s| s.status.heard(from, tasks));
    }

    /// Hands a channel message to `stream`'s task, or keeps the frame it came in until the
    /// stream attaches (`frame` makes the message).
    fn deliver(&mut self, node: NodeId, stream: StreamId, from: TaskId, to: TaskId, seq: Seq, frame: Frame) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return self.early.hold(stream, node, frame, std::time::Instant::now());
        };
        if !s.heeds(node, "channel frame") {
            return;
        }
        let msg = match frame.kind() {
            Kind::Data => Msg::Rows(Rows::Remote(frame)),
            Kind::Watermark => match frame.access::<Watermark>() {
                Ok(w) => Msg::Progress(w.watermark_ms.to_native()),
                Err(_) => return,
            },
            Kind::WindowResults => match frame.access::<WindowResults>() {
                Ok(w) => Msg::Results(
                    (0..w.key.len())
                        .map(|i| WindowResult {
                            key: w.key[i].to_native(),
                            start: w.start[i].to_native(),
                            count: w.count[i].to_native(),
                            sum: w.sum[i].to_native(),
                            min: w.min[i].to_native(),
                            max: w.max[i].to_native(),
                        })
                        .collect(),
                ),
                Err(_) => return,
            },
            Kind::EndOfStream => Msg::End,
            Kind::CheckpointTrigger => match frame.access::<weir_wire::msg::CheckpointTrigger>() {
                Ok(t) => Msg::Trigger { id: t.checkpoint.get(), trans: t.trans.get() },
                Err(_) => return,
            },
            _ => return,
        };
        s.deliver(from, to, seq, msg);
    }

    fn on_frame(&mut self, node: NodeId, frame: Frame) {
        // Channel messages: the channel's address read (validated) once here, the message made
        // in `deliver` (validated again only for the small kinds).
        let channel = match frame.kind() {
            Kind::Data => frame.access::<Data>().ok().map(|m| (m.stream.get(), m.from.get(), m.to.get(), m.seq.get())),
            Kind::Watermark => {
                frame.access::<Watermark>().ok().map(|m| (m.stream.get(), m.from.get(), m.to.get(), m.seq.get()))
            }
            Kind::WindowResults => {
                frame.access::<WindowResults>().ok().map(|m| (m.stream.get(), m.from.get(), m.to.get(), m.seq.get()))
            }
            Kind::EndOfStream => {
                frame.access::<EndOfStream>().ok().map(|m| (m.stream.get(), m.from.get(), m.to.get(), m.seq.get()))
            }
            Kind::CheckpointTrigger => frame
                .access::<weir_wire::msg::CheckpointTrigger>()
                .ok()
                .map(|m| (m.stream.get(), m.from.get(), m.to.get(), m.seq.get())),
            _ => None,
        };
        if let Some((stream, from, to, seq)) = channel {
            return self.deliver(node, stream, from, to, seq, frame);
        }
        match frame.kind() {
            Kind::Data | Kind::Watermark | Kind::WindowResults | Kind::EndOfStream | Kind::CheckpointTrigger => {
                // Not a valid archive of its kind: the transport checked the frame, so a peer
                // sent it malformed; nothing of it is used.
                tracing::warn!(%node, kind = ?frame.kind(), "malformed channel frame dropped");
            }
            Kind::Credit => {
                let Ok(c) = frame.access::<Credit>() else { return };
                let (stream, from, to, n) = (c.stream.get(), c.from.get(), c.to.get(), c.credits.to_native());
                let Some(s) = self.streams.get(&stream) else {
                    return self.early.hold(stream, node, frame, std::time::Instant::now());
                };
                if !s.heeds(node, "credit") {
                    return;
                }
                match s.credits.get(&(from, to)) {
                    Some((credits, wake)) => {
                        credits.fetch_add(n, Ordering::AcqRel);
                        wake.unpark();
                    }
                    None => tracing::warn!(%stream, %from, %to, "credit for unknown channel"),
                }
            }
            Kind::Ingest => self.on_ingest(node, &frame),
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
                self.on_status(node, req.request);
            }
            other => match super::protocol_wire::decode(&frame) {
                Some((stream, _)) if !self.streams.contains_key(&stream) => {
                    self.early.hold(stream, node, frame, std::time::Instant::now())
                }
                Some((stream, routed)) => self.on_protocol(node, stream, routed),
                None => tracing::debug!(kind = ?other, %node, "frame not handled by the data plane"),
            },
        }
    }

    /// A checkpoint protocol message from `node` for `stream`'s tasks or coordinator.
    fn on_protocol(&self, node: NodeId, stream: StreamId, routed: super::protocol_wire::Routed) {
        use super::control::Control;
        use super::protocol_wire::Routed;
        let Some(s) = self.streams.get(&stream).filter(|s| s.heeds(node, "protocol message")) else { return };
        match routed {
            Routed::ToTask(t, input) => match s.proto.0.get(&t) {
                Some(h) => {
                    h.try_send(Control::Protocol(input));
                }
                None => tracing::warn!(%stream, task = %t, %node, "protocol message for a task not on this node"),
            },
            Routed::ToCoord(input) => match &s.proto.1 {
                Some(inbox) => {
                    let _ = inbox.send(input);
                }
                None => tracing::warn!(%stream, %node, "report for a coordinator not on this node"),
            },
            Routed::Restore { task, checkpoint, version, basis, request } => match s.proto.0.get(&task) {
                Some(h) => {
                    h.try_send(Control::Restore { checkpoint, version, basis, request });
                }
                None => tracing::warn!(%stream, %task, %node, "restore point for a task not on this node"),
            },
        }
    }

    /// Why a request for `stream` gets no answer of the stream's.
    fn not_here(&self, stream: StreamId) -> String {
        format!("stream {stream} does not run on node {}", self.node)
    }
}
