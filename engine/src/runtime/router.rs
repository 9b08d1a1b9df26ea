//! The router: the receiving side of the transport for one engine. It runs on its own thread,
//! turns frames into channel messages for local tasks, returns credits to local senders, and
//! feeds `Ingest` frames to the ingest writer (acknowledging them once durable).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use crossbeam_utils::sync::Unparker;
use weir_wire::msg::{Credit, Data, EndOfStream, Ingest, IngestAck, IngestOutcome, Watermark, WindowResults};
use weir_wire::transport::{Event, Transport};
use weir_wire::{Frame, FrameEncoder, Kind, NodeId, Seq, StreamId, TaskId};

/// Bytes of producers' descriptions in one `ProducersRsp` page, about: a quarter of the frame
/// limit, whatever the ledgers hold.
const PRODUCERS_PAGE: usize = 4 << 20;

use super::channel::{Msg, Rows};
use super::shared::Shared;
use crate::ingest::{AppendRequest, Appended, IngestService};
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

/// The ingest writer, the acknowledgements it produces, and where each partition's source runs
/// (the node that takes its appends).
pub(crate) type IngestSide = (Arc<IngestService<IngestToken>>, Receiver<Appended<IngestToken>>, Vec<NodeId>);

struct InChannel {
    tx: Sender<Msg>,
    wake: Unparker,
    next: Seq,
}

pub(crate) struct Router {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Transport>>,
}

impl Router {
    pub(crate) fn start(
        transport: Transport,
        inputs: HashMap<(TaskId, TaskId), (Sender<Msg>, Unparker)>,
        credits: HashMap<(TaskId, TaskId), (Arc<AtomicU32>, Unparker)>,
        shared: Arc<Shared>,
        ingest: Option<IngestSide>,
        proto: ProtoSide,
        status: Arc<super::status::StatusBoard>,
    ) -> Result<Router, super::error::EngineError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let inputs = inputs.into_iter().map(|(k, (tx, wake))| (k, InChannel { tx, wake, next: Seq(0) })).collect();
        let thread = std::thread::Builder::new()
            .name("weir-router".into())
            .spawn(move || {
                let mut r =
                    Run { transport, inputs, credits, shared, ingest, encoder: FrameEncoder::new(), proto, status };
                r.run(&stop2);
                r.transport
            })
            .map_err(super::error::EngineError::Thread)?;
        Ok(Router { stop, thread: Some(thread) })
    }

    /// Stops the router; dropping the transport it returns delivers what is queued and closes.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take()
            && let Ok(transport) = t.join()
        {
            transport.shutdown();
        }
    }
}

struct Run {
    transport: Transport,
    inputs: HashMap<(TaskId, TaskId), InChannel>,
    credits: HashMap<(TaskId, TaskId), (Arc<AtomicU32>, Unparker)>,
    shared: Arc<Shared>,
    ingest: Option<IngestSide>,
    encoder: FrameEncoder,
    proto: ProtoSide,
    status: Arc<super::status::StatusBoard>,
}

impl Run {
    fn run(&mut self, stop: &AtomicBool) {
        let never = crossbeam_channel::never();
        while !stop.load(Ordering::Acquire) {
            let acks = self.ingest.as_ref().map_or(&never, |(_, a, _)| a).clone();
            crossbeam_channel::select! {
                recv(self.transport.events()) -> ev => match ev {
                    Ok(Event::Frame { from, frame }) => self.on_frame(from, frame),
                    Ok(Event::PeerDown { node, reason, orderly }) => {
                        if self.status.peers.contains(&node) {
                            tracing::warn!(peer = %node, %reason, orderly, "peer down");
                        } else {
                            tracing::debug!(client = %node, %reason, "client gone");
                        }
                        self.status.link(node, false, reason.clone());
                        // Not once the stream stops here: peers go as they stop, not always in order.
                        let stopping = self.shared.stop.load(Ordering::Acquire)
                            || self.status.stop_requested.load(Ordering::Acquire);
                        if self.status.failover
                            && !orderly
                            && !stopping
                            && self.status.peers.contains(&node)
                            && !self.status.finished()
                        {
                            // Frames to and from it are lost: the stream restarts from its last commit.
                            self.fail(format!("node {node} of the stream was lost ({reason})"));
                        }
                        // Its tasks cannot finish a checkpoint in flight: the coordinator fails it.
                        if let Some(inbox) = &self.proto.1 {
                            let _ = inbox.send(crate::checkpoint::CoordInput::NodeLost { node });
                        }
                    }
                    Ok(Event::PeerUp { node, .. }) => {
                        tracing::debug!(peer = %node, "peer up");
                        self.status.link(node, true, String::new());
                        if let Some(inbox) = &self.proto.1 {
                            let _ = inbox.send(crate::checkpoint::CoordInput::NodeUp { node });
                        }
                    }
                    Ok(Event::NewerIncarnation { node, incarnation }) => {
                        self.shared.newer_incarnation.fetch_max(incarnation, Ordering::AcqRel);
                        self.fail(format!("node {node} restarted the stream (incarnation {incarnation})"));
                    }
                    Ok(Event::Refused {
                        code: weir_wire::msg::CloseCode::Stale | weir_wire::msg::CloseCode::Restarting, ..
                    }) => {}
                    // The transport logs refusals (strangers' summed up): not again here.
                    Ok(Event::Refused { reason, .. }) => tracing::debug!(%reason, "connection refused"),
                    Ok(Event::Heartbeat { from, tasks }) => self.status.heard(from, tasks),
                    Err(_) => return,
                },
                recv(acks) -> a => if let Ok(a) = a { self.ack(a) },
                default(Duration::from_millis(50)) => {}
            }
        }
    }

    fn fail(&self, why: String) {
        self.shared.fail(why);
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
            Err(TrySendError::Disconnected(_)) => {} // the task finished or the engine stops
        }
    }

    fn on_frame(&mut self, node: NodeId, frame: Frame) {
        match frame.kind() {
            Kind::Data => {
                let Ok(d) = frame.access::<Data>() else { return };
                let (from, to, seq) = (d.from.get(), d.to.get(), d.seq.get());
                self.deliver(from, to, seq, Msg::Rows(Rows::Remote(frame)));
            }
            Kind::Watermark => {
                let Ok(w) = frame.access::<Watermark>() else { return };
                let m = Msg::Progress(w.watermark_ms.to_native());
                self.deliver(w.from.get(), w.to.get(), w.seq.get(), m);
            }
            Kind::WindowResults => {
                let Ok(w) = frame.access::<WindowResults>() else { return };
                let rs: Vec<WindowResult> = (0..w.key.len())
                    .map(|i| WindowResult {
                        key: w.key[i].to_native(),
                        start: w.start[i].to_native(),
                        count: w.count[i].to_native(),
                        sum: w.sum[i].to_native(),
                        min: w.min[i].to_native(),
                        max: w.max[i].to_native(),
                    })
                    .collect();
                self.deliver(w.from.get(), w.to.get(), w.seq.get(), Msg::Results(rs));
            }
            Kind::EndOfStream => {
                let Ok(e) = frame.access::<EndOfStream>() else { return };
                self.deliver(e.from.get(), e.to.get(), e.seq.get(), Msg::End);
            }
            Kind::CheckpointTrigger => {
                let Ok(t) = frame.access::<weir_wire::msg::CheckpointTrigger>() else { return };
                let m = Msg::Trigger { id: t.checkpoint.get(), trans: t.trans.get() };
                self.deliver(t.from.get(), t.to.get(), t.seq.get(), m);
            }
            Kind::Credit => {
                let Ok(c) = frame.access::<Credit>() else { return };
                match self.credits.get(&(c.from.get(), c.to.get())) {
                    Some((credits, wake)) => {
                        credits.fetch_add(c.credits.to_native(), Ordering::AcqRel);
                        wake.unpark();
                    }
                    None => tracing::warn!(from = %c.from.get(), to = %c.to.get(), "credit for unknown channel"),
                }
            }
            Kind::Ingest => self.on_ingest(node, &frame),
            Kind::Replicate | Kind::ReplicateAck => self.on_replication(node, &frame),
            Kind::CheckpointNowReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::CheckpointNowReq>() else { return };
                let outcome = self.status.trigger.answer(req.stream);
                let rsp = weir_wire::msg::CheckpointNowRsp { request: req.request, node: self.status.node, outcome };
                self.reply(node, &rsp, Duration::from_secs(1), "checkpoint-now response");
            }
            Kind::ResultsReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::ResultsReq>() else { return };
                // Read here, on the network thread: a page is at most 100,000 results (a few
                // milliseconds); a query service of its own is the way for heavier reads.
                self.reply(node, &self.status.results_page(&req), Duration::from_secs(5), "results page");
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
                self.reply(node, &self.status.response(req.request), Duration::from_secs(1), "status response");
            }
            other => match super::protocol_wire::decode(&frame) {
                Some(super::protocol_wire::Routed::ToTask(t, input)) => match self.proto.0.get(&t) {
                    Some(h) => {
                        h.try_send(super::control::Control::Protocol(input));
                    }
                    None => tracing::warn!(task = %t, %node, "protocol message for a task not on this node"),
                },
                Some(super::protocol_wire::Routed::ToCoord(input)) => match &self.proto.1 {
                    Some(inbox) => {
                        let _ = inbox.send(input);
                    }
                    None => tracing::warn!(%node, "report for a coordinator not on this node"),
                },
                Some(super::protocol_wire::Routed::Restore { task, checkpoint, version, basis, request }) => {
                    match self.proto.0.get(&task) {
                        Some(h) => {
                            h.try_send(super::control::Control::Restore { checkpoint, version, basis, request });
                        }
                        None => tracing::warn!(%task, %node, "restore point for a task not on this node"),
                    }
                }
                None => tracing::debug!(kind = ?other, %node, "frame not handled by the data plane"),
            },
        }
    }

    /// Sends `msg` to `to` (a client), logging what could not go: nobody else waits for it.
    fn reply<M: weir_wire::msg::Message>(&mut self, to: NodeId, msg: &M, timeout: Duration, what: &str) {
        match self.encoder.encode(msg) {
            Ok(f) => {
                if let Err(e) = self.transport.sender().send_timeout(to, f, timeout) {
                    tracing::warn!(client = %to, error = %e, "cannot deliver {what}");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot encode {what}"),
        }
    }

    /// A stop request from a client (sent on to every peer) or from a peer (not sent on).
    fn on_stop(&mut self, from: NodeId, req: weir_wire::msg::StopReq) {
        let stopping = req.stream == self.status.stream;
        let mut told = Vec::new();
        if stopping {
            tracing::info!(stream = %req.stream, %from, forwarded = req.forwarded, "stop requested");
            self.status.stop_requested.store(true, Ordering::Release);
            if !req.forwarded {
                let on = weir_wire::msg::StopReq { forwarded: true, ..req };
                for peer in &self.status.peers {
                    let sent = self.encoder.encode(&on).map_err(|e| e.to_string()).and_then(|f| {
                        self.transport
                            .sender()
                            .send_timeout(*peer, f, Duration::from_secs(1))
                            .map_err(|e| e.to_string())
                    });
                    match sent {
                        Ok(()) => told.push(*peer),
                        Err(e) => tracing::warn!(%peer, error = %e, "cannot send the stop request on"),
                    }
                }
            }
        }
        if req.forwarded {
            return; // a peer's request: nobody waits for an answer
        }
        let rsp = weir_wire::msg::StopRsp { request: req.request, node: self.status.node, stopping, peers: told };
        self.reply(from, &rsp, Duration::from_secs(1), "stop response");
    }

    /// A page of the ledgers of the node's ingest-log partitions that have producers, from
    /// `req.from` on, its descriptions about [`PRODUCERS_PAGE`] bytes at most.
    fn producers(&self, req: weir_wire::msg::ProducersReq) -> weir_wire::msg::ProducersRsp {
        use weir_wire::msg::{PartitionProducers, ProducerInfo, ProducersCursor, ProducersRsp};
        let mut rsp = ProducersRsp {
            request: req.request,
            node: self.status.node,
            partitions: Vec::new(),
            next: None,
            error: String::new(),
        };
        match &self.ingest {
            Some((svc, _, _)) if req.stream == self.status.stream => {
                let mut budget = PRODUCERS_PAGE;
                for p in req.from.partition..svc.partitions() {
                    let log = svc.log(p).expect("partition of the service");
                    let from = if p == req.from.partition { req.from.producer as usize } else { 0 };
                    let (page, rest) = log.producers_page(from, budget);
                    budget = budget.saturating_sub(page.iter().map(|r| r.description.len() + 64).sum());
                    let producers: Vec<ProducerInfo> = page
                        .into_iter()
                        .map(|r| ProducerInfo {
                            producer: r.producer,
                            description: r.description,
                            first: r.first,
                            rows: r.rows,
                            batches: r.batches,
                            ended: r.ended,
                        })
                        .collect();
                    if !producers.is_empty() {
                        rsp.partitions.push(PartitionProducers {
                            partition: p,
                            durable: log.durable_version(),
                            producers,
                        });
                    }
                    if let Some(i) = rest {
                        rsp.next = Some(ProducersCursor { partition: p, producer: i as u32 });
                        break;
                    }
                    if budget == 0 && p + 1 < svc.partitions() {
                        rsp.next = Some(ProducersCursor { partition: p + 1, producer: 0 });
                        break;
                    }
                }
            }
            _ => rsp.error = format!("stream {} is not an ingest-log stream of this node", req.stream),
        }
        rsp
    }

    fn on_ingest(&mut self, node: NodeId, frame: &Frame) {
        let Ok(req) = frame.to_owned::<Ingest>() else { return };
        let token = IngestToken { node, stream: req.stream, request: req.request };
        let Some((svc, _, owners)) = &self.ingest else {
            let reason = "this node has no ingest-log stream".to_string();
            let outcome = IngestOutcome::Rejected { reason, retryable: false };
            return self.send_ack(token, req.partition, outcome);
        };
        // Only the node its source runs on takes a partition's appends: anywhere else they would
        // go to a log nobody reads (or, on the node keeping its copy, make the copy differ).
        if let Some(owner) = owners.get(req.partition as usize)
            && *owner != self.status.node
        {
            let reason = format!("partition {} is on node {owner}, not on this one", req.partition);
            let outcome = IngestOutcome::NotHere { reason };
            return self.send_ack(token, req.partition, outcome);
        }
        let from = Some(crate::ingest::segment::ProducerSeq { producer: req.producer, seq: req.seq });
        let r = AppendRequest {
            partition: req.partition,
            batch: req.batch,
            from,
            watermark: req.idle_watermark_ms,
            describe: req.description,
            token,
        };
        if svc.requests().try_send(r).is_err() {
            let outcome = IngestOutcome::Rejected { reason: "ingest queue full".into(), retryable: true };
            self.send_ack(token, req.partition, outcome);
        }
    }

    /// Entries of a partition this node keeps a copy of, or a follower's answer: the ingest
    /// writer's. A full queue drops the message (the primary ships again after a silence).
    fn on_replication(&mut self, node: NodeId, frame: &Frame) {
        use crate::ingest::replication::ReplicaInput;
        let Some((svc, _, _)) = &self.ingest else { return };
        let input = match frame.kind() {
            Kind::Replicate => match frame.to_owned::<weir_wire::msg::Replicate>() {
                Ok(msg) if msg.stream == self.status.stream => ReplicaInput::Entries { from: node, msg },
                _ => return,
            },
            _ => match frame.to_owned::<weir_wire::msg::ReplicateAck>() {
                Ok(msg) if msg.stream == self.status.stream => ReplicaInput::Ack { from: node, msg },
                _ => return,
            },
        };
        if svc.replica_inputs().try_send(input).is_err() {
            tracing::debug!(%node, "ingest replication queue full: message dropped");
        }
    }

    fn ack(&mut self, a: Appended<IngestToken>) {
        if a.token.node == NodeId(0) {
            return; // the engine's own request (a source's idle marker)
        }
        let outcome = match a.result {
            // Durable here, but a node that may have lost its membership acknowledges nothing:
            // its partitions may be taken over (the producer sends again; appends are idempotent).
            Ok(Some(_)) if self.shared.tenure.as_ref().is_some_and(|t| !t.holds()) => IngestOutcome::Rejected {
                reason: format!("node {} holds no lease in etcd now: nothing is acknowledged", self.status.node),
                retryable: true,
            },
            Ok(Some((first, last))) => IngestOutcome::Durable { first, last, duplicate: a.duplicate },
            Ok(None) => match a.marker {
                Some(at) => IngestOutcome::Marked { at },
                None => IngestOutcome::Rejected { reason: "empty batch".into(), retryable: false },
            },
            Err(e) => IngestOutcome::Rejected { reason: e.to_string(), retryable: e.is_retryable() },
        };
        self.send_ack(a.token, a.partition, outcome);
    }

    fn send_ack(&mut self, t: IngestToken, partition: u32, outcome: IngestOutcome) {
        let ack = IngestAck { stream: t.stream, partition, request: t.request, outcome };
        self.reply(t.node, &ack, Duration::from_secs(1), "ingest ack");
    }
}
