//! The router's answers to clients and its ingest side: stop, status, producers, ingest appends
//! and their acknowledgements, and replication between the copies of a partition's log.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_wire::msg::{Ingest, IngestAck, IngestOutcome, StatusRsp};
use weir_wire::{Frame, Kind, NodeId, StreamId};

use super::{IngestToken, Routing};
use crate::ingest::{AppendRequest, Appended};

/// Bytes of producers' descriptions in one `ProducersRsp` page, about: a quarter of the frame
/// limit, whatever the ledgers hold.
const PRODUCERS_PAGE: usize = 4 << 20;

impl Routing {
    /// Sends `msg` to `to` (a client), logging what could not go: nobody else waits for it.
    pub(super) fn reply<M: weir_wire::msg::Message>(&mut self, to: NodeId, msg: &M, timeout: Duration, what: &str) {
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
    pub(super) fn on_stop(&mut self, from: NodeId, req: weir_wire::msg::StopReq) {
        let peers = self.streams.get(&req.stream).map(|s| (s.status.clone(), s.status.peers.clone()));
        let mut stopping = peers.is_some();
        if !stopping && let Some(s) = self.standings.lock().unwrap_or_else(|e| e.into_inner()).get(&req.stream) {
            // Between runs: the node stops; its peers hear of it from the client as well.
            tracing::info!(stream = %req.stream, %from, forwarded = req.forwarded, "stop requested");
            s.stop();
            stopping = true;
        }
        let mut told = Vec::new();
        if let Some((status, peers)) = peers {
            tracing::info!(stream = %req.stream, %from, forwarded = req.forwarded, "stop requested");
            status.stop_requested.store(true, Ordering::Release);
            if !req.forwarded {
                let on = weir_wire::msg::StopReq { forwarded: true, ..req };
                for peer in &peers {
                    let sent = self.encoder.encode(&on).map_err(|e| e.to_string()).and_then(|f| {
                        self.transport
                            .sender()
                            .send_timeout(*peer, f, Duration::from_secs(1))
                            .map_err(|e| e.to_string())
                    });
                    match sent {
                        Ok(()) => {
                            told.push(*peer);
                            // Delivered even if the node stops before the peer connects.
                            if !self.deliver_at_exit.contains(peer) {
                                self.deliver_at_exit.push(*peer);
                            }
                        }
                        Err(e) => tracing::warn!(%peer, error = %e, "cannot send the stop request on"),
                    }
                }
            }
        }
        if req.forwarded {
            return; // a peer's request: nobody waits for an answer
        }
        let rsp = weir_wire::msg::StopRsp { request: req.request, node: self.node, stopping, peers: told };
        self.reply(from, &rsp, Duration::from_secs(1), "stop response");
    }

    /// A page of the ledgers of the node's ingest-log partitions that have producers, from
    /// `req.from` on, its descriptions about [`PRODUCERS_PAGE`] bytes at most.
    pub(super) fn producers(&self, req: weir_wire::msg::ProducersReq) -> weir_wire::msg::ProducersRsp {
        use weir_wire::msg::{PartitionProducers, ProducerInfo, ProducersCursor, ProducersRsp};
        let mut rsp = ProducersRsp {
            request: req.request,
            node: self.node,
            partitions: Vec::new(),
            next: None,
            error: String::new(),
        };
        match self.streams.get(&req.stream).and_then(|s| s.ingest.as_ref()) {
            Some((svc, _)) => {
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

    pub(super) fn on_ingest(&mut self, node: NodeId, frame: &Frame) {
        let Ok(req) = frame.to_owned::<Ingest>() else { return };
        let epoch = self.streams.get(&req.stream).map_or(weir_wire::Epoch(0), |s| s.epoch);
        let token = IngestToken { node, stream: req.stream, request: req.request, epoch };
        let Some(s) = self.streams.get(&req.stream) else {
            let standing =
                self.standings.lock().unwrap_or_else(|e| e.into_inner()).get(&req.stream).map(|s| s.ingest(self.node));
            // Retryable: the stream may start here (on a node shared by streams).
            let outcome = standing.unwrap_or_else(|| IngestOutcome::Rejected {
                reason: format!("stream {} does not run on node {} now", req.stream, self.node),
                retryable: true,
            });
            return self.send_ack(token, req.partition, outcome);
        };
        let Some((svc, owners)) = s.ingest.as_ref() else {
            let reason = format!("stream {} is not an ingest-log stream", req.stream);
            let outcome = IngestOutcome::Rejected { reason, retryable: false };
            return self.send_ack(token, req.partition, outcome);
        };
        // Only the node its source runs on takes a partition's appends: anywhere else they would
        // go to a log nobody reads (or, on the node keeping its copy, make the copy differ).
        if let Some(owner) = owners.get(req.partition as usize)
            && *owner != self.node
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
    pub(super) fn on_replication(&mut self, node: NodeId, frame: &Frame) {
        use crate::ingest::replication::ReplicaInput;
        let (stream, input) = match frame.kind() {
            Kind::Replicate => match frame.to_owned::<weir_wire::msg::Replicate>() {
                Ok(msg) => (msg.stream, ReplicaInput::Entries { from: node, msg }),
                _ => return,
            },
            _ => match frame.to_owned::<weir_wire::msg::ReplicateAck>() {
                Ok(msg) => (msg.stream, ReplicaInput::Ack { from: node, msg }),
                _ => return,
            },
        };
        let Some((svc, _)) = self.streams.get(&stream).and_then(|s| s.ingest.as_ref()) else { return };
        if svc.replica_inputs().try_send(input).is_err() {
            tracing::debug!(%node, "ingest replication queue full: message dropped");
        }
    }

    pub(super) fn ack(&mut self, a: Appended<IngestToken>) {
        if a.token.node == NodeId(0) {
            return; // the engine's own request (a source's idle marker)
        }
        let outcome = match a.result {
            // Durable here, but a node that may have lost its membership acknowledges nothing:
            // its partitions may be taken over (the producer sends again; appends are idempotent).
            // Only while the run that took it is attached: a later run may have moved the
            // partition to a log elsewhere.
            Ok(Some(_)) if self.streams.get(&a.token.stream).is_none_or(|s| s.epoch != a.token.epoch) => {
                IngestOutcome::Rejected {
                    reason: format!(
                        "the run of stream {} that took it ended on node {}: nothing is acknowledged",
                        a.token.stream, self.node
                    ),
                    retryable: true,
                }
            }
            Ok(Some(_)) if !self.holds_tenure(a.token.stream) => IngestOutcome::Rejected {
                reason: format!("node {} holds no lease in etcd now: nothing is acknowledged", self.node),
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

    /// Whether this node may acknowledge `stream`'s appends: it runs the stream and, in a
    /// cluster, still holds its membership (else the partitions may be taken over; the producer
    /// sends again, and appends are idempotent).
    fn holds_tenure(&self, stream: StreamId) -> bool {
        self.streams.get(&stream).is_some_and(|s| s.shared.tenure.as_ref().is_none_or(|t| t.holds()))
    }

    /// A status request: the status of the stream `wanted` (attached, or what the node says of
    /// it between runs, or an idle node's); without one, the first attached stream's, with every
    /// attached stream's tasks and health, and when none is attached what the node says of the
    /// first stream it stands by for.
    pub(super) fn on_status(&mut self, from: NodeId, request: u64, wanted: Option<StreamId>) {
        // The stream asked about, else the lowest this node runs (with every stream's tasks),
        // else the lowest it stands for; what the node says of it between runs, if it stands.
        let (stream, standing) = {
            let standings = self.standings.lock().unwrap_or_else(|e| e.into_inner());
            let stream = wanted.or(self.streams.keys().next().or(standings.keys().next()).copied());
            (stream, stream.and_then(|s| standings.get(&s).cloned()))
        };
        let rsp = match stream.and_then(|s| self.streams.get(&s)) {
            Some(one) => {
                let mut rsp = one.status.response(request);
                if wanted.is_none() {
                    for s in self.streams.values().filter(|s| Some(s.status.stream) != stream) {
                        let more = s.status.response(request);
                        rsp.tasks.extend(more.tasks);
                        rsp.streams.extend(more.streams);
                    }
                }
                rsp
            }
            None if let Some(s) = standing => {
                let links = self.links.lock().unwrap_or_else(|e| e.into_inner()).all();
                s.status(request, self.node, links)
            }
            None => StatusRsp {
                request,
                node: self.node,
                uptime_ms: 0,
                tasks: Vec::new(),
                checkpoints: Vec::new(),
                streams: Vec::new(),
                incarnation: 0,
                restarts: Vec::new(),
                peers: Vec::new(),
                restarting: false,
                idle: true,
                paused: false,
                stream: None,
                member: None,
                logs: Vec::new(),
            },
        };
        self.reply(from, &rsp, Duration::from_secs(1), "status response");
    }
}
