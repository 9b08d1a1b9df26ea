//! A node while it runs no engine: between two runs of its stream (the restart strategy's
//! delay), or idle (the cluster moved its tasks to the other nodes while it was away). It keeps
//! its address and answers clients: `weir status` sees it restarting, with its restarts and
//! their reasons, or idle; `weir stop` stops it.
//!
//! Restarting, it serves clients only and refuses its peers, which redial until its stream runs
//! again. Idle, it is a member at the placement's incarnation: the peers see it up, and a
//! peer at a newer incarnation (a newer placement, maybe one that gives it tasks) ends the wait.
//! An idle node has no channels, so no frame of it can go stale; a lower incarnation never makes
//! its peers restart (they refuse it and it hears theirs).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_engine::wire::msg::{
    Ingest, IngestAck, IngestOutcome, PeerLink, RestartInfo, StatusReq, StatusRsp, StopReq, StopRsp,
};
use weir_engine::wire::transport::{Event, Transport, TransportConfig};
use weir_engine::wire::{FrameEncoder, Kind, NodeId, StreamId};

/// Why the node runs no engine.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// The restart strategy's delay before the next run.
    Restarting(Duration),
    /// No task of the stream is placed on the node; it waits for a newer incarnation.
    Idle,
    /// The node holds no lease in etcd: it runs nothing until it holds one again.
    Fenced,
}

/// How a wait ended.
pub enum WaitEnd {
    /// Start the stream (at least at the incarnation a peer was seen at): the delay is over, or
    /// (idle) a peer runs a newer incarnation.
    Restart(Option<u64>),
    /// A signal or `weir stop` came first.
    Stopped(&'static str),
}

/// What the node tells of itself while it waits.
pub struct Standby<'a> {
    /// The stream.
    pub stream: StreamId,
    /// Its restarts so far.
    pub restarts: &'a [RestartInfo],
    /// Its links to its peers when its engine stopped.
    pub links: &'a [PeerLink],
    /// Its shape.
    pub info: &'a weir_engine::wire::msg::StreamInfo,
    /// Its membership in the control store (none without one).
    pub member: Option<&'a dyn weir_engine::cluster::MemberStatus>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Serves clients at `cfg`'s address (at `cfg.incarnation`) until `mode` says to restart,
/// `tick` (called every 20 ms or so) ends the wait, or a signal or a stop request comes. Without
/// the address (another process holds it) it only waits.
pub fn wait(
    mut cfg: TransportConfig,
    me: &Standby<'_>,
    mode: Mode,
    stop: &AtomicBool,
    tick: &mut dyn FnMut() -> Option<WaitEnd>,
) -> WaitEnd {
    let idle = matches!(mode, Mode::Idle);
    if !idle {
        cfg.clients_only = true;
        cfg.peers.clear();
    }
    let (node, incarnation) = (cfg.node, cfg.incarnation);
    let members: Vec<NodeId> = cfg.peers.iter().map(|p| p.node).collect();
    let until = match mode {
        Mode::Restarting(delay) => Some(Instant::now() + delay),
        Mode::Idle | Mode::Fenced => None,
    };
    let mut links: BTreeMap<NodeId, PeerLink> = me.links.iter().map(|l| (l.node, l.clone())).collect();
    if idle {
        for n in &members {
            links.entry(*n).or_insert(PeerLink { node: *n, up: false, since_ms: 0, reason: String::new() });
        }
    }
    let transport = match Transport::start(cfg) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cannot serve clients while the node runs no stream");
            None
        }
    };
    let mut enc = FrameEncoder::new();
    let mut newer = None;
    let started = Instant::now();
    let waited = loop {
        if stop.load(Ordering::Relaxed) {
            break WaitEnd::Stopped("signal");
        }
        let left = until.map_or(Duration::from_millis(20), |u| u.saturating_duration_since(Instant::now()));
        if left.is_zero() || (idle && newer.is_some()) {
            break WaitEnd::Restart(newer);
        }
        if let Some(w) = tick() {
            break w;
        }
        let Some(t) = &transport else {
            std::thread::sleep(left.min(Duration::from_millis(20)));
            continue;
        };
        let (from, frame) = match t.events().recv_timeout(left.min(Duration::from_millis(20))) {
            Ok(Event::Frame { from, frame }) => (from, frame),
            Ok(Event::NewerIncarnation { incarnation, .. }) => {
                newer = newer.max(Some(incarnation));
                continue;
            }
            Ok(Event::PeerUp { node, .. }) if members.contains(&node) => {
                links.insert(node, PeerLink { node, up: true, since_ms: now_ms(), reason: String::new() });
                continue;
            }
            Ok(Event::PeerDown { node, reason, .. }) if members.contains(&node) => {
                links.insert(node, PeerLink { node, up: false, since_ms: now_ms(), reason });
                continue;
            }
            _ => continue,
        };
        let answer = match frame.kind() {
            Kind::StatusReq => frame.to_owned::<StatusReq>().ok().and_then(|r| {
                enc.encode(&StatusRsp {
                    logs: Vec::new(),
                    request: r.request,
                    node,
                    uptime_ms: if idle { started.elapsed().as_millis() as u64 } else { 0 },
                    tasks: Vec::new(),
                    checkpoints: Vec::new(),
                    streams: Vec::new(),
                    incarnation: if idle { incarnation } else { me.restarts.last().map_or(0, |r| r.incarnation) },
                    restarts: me.restarts.to_vec(),
                    peers: links.values().cloned().collect(),
                    restarting: !idle,
                    idle,
                    stream: Some(me.info.clone()),
                    member: me.member.map(|m| m.member_info()),
                })
                .ok()
            }),
            // A load goes on once the stream runs again (or, idle, on the nodes that took its
            // partitions): sending again may succeed.
            Kind::Ingest => frame.to_owned::<Ingest>().ok().and_then(|r| {
                let outcome = match mode {
                    Mode::Idle => IngestOutcome::NotHere {
                        reason: format!(
                            "node {node} runs no task of the stream now (its tasks moved to the other nodes)"
                        ),
                    },
                    // Its tasks may have moved, or may run here again once it holds a lease.
                    Mode::Fenced => IngestOutcome::NotHere {
                        reason: format!("node {node} holds no lease in etcd: it runs nothing until it holds one"),
                    },
                    Mode::Restarting(_) => IngestOutcome::Rejected {
                        reason: format!("node {node} is restarting its stream"),
                        retryable: true,
                    },
                };
                enc.encode(&IngestAck { stream: r.stream, partition: r.partition, request: r.request, outcome }).ok()
            }),
            Kind::StopReq => match frame.to_owned::<StopReq>() {
                Ok(r) if r.stream == me.stream => {
                    let rsp = StopRsp { request: r.request, node, stopping: true, peers: Vec::new() };
                    if let Ok(f) = enc.encode(&rsp) {
                        let _ = t.sender().send_timeout(from, f, Duration::from_secs(1));
                    }
                    break WaitEnd::Stopped("weir stop");
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(f) = answer {
            let _ = t.sender().send_timeout(from, f, Duration::from_secs(1));
        }
    };
    if let Some(t) = transport {
        t.shutdown(); // delivers the last answers, then frees the address for the engine
    }
    waited
}
