//! A node between two runs of its stream (the restart strategy's delay): it keeps its address,
//! answers clients (`weir status` sees it restarting, with its restarts and their reasons;
//! `weir stop` stops it) and refuses its peers, which redial until its stream runs again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_engine::wire::msg::{PeerLink, RestartInfo, StatusReq, StatusRsp, StopReq, StopRsp};
use weir_engine::wire::transport::{Event, Transport, TransportConfig};
use weir_engine::wire::{FrameEncoder, Kind, StreamId};

/// How a wait between two runs ended.
pub enum Waited {
    /// The delay is over: start the stream (at least at the incarnation a peer was seen at).
    Restart(Option<u64>),
    /// A signal or `weir stop` came first.
    Stopped(&'static str),
}

/// Serves clients at `cfg`'s address for `delay` (unless a signal or a stop request comes
/// first). Without the address (another process holds it) it only waits.
pub fn wait(
    mut cfg: TransportConfig,
    stream: StreamId,
    restarts: &[RestartInfo],
    links: &[PeerLink],
    delay: Duration,
    stop: &AtomicBool,
) -> Waited {
    cfg.clients_only = true;
    cfg.peers.clear();
    let node = cfg.node;
    let until = Instant::now() + delay;
    let transport = match Transport::start(cfg) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cannot serve clients while the stream restarts");
            None
        }
    };
    let mut enc = FrameEncoder::new();
    let mut newer = None;
    let waited = loop {
        if stop.load(Ordering::Relaxed) {
            break Waited::Stopped("signal");
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Waited::Restart(newer);
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
            _ => continue,
        };
        let answer = match frame.kind() {
            Kind::StatusReq => frame.to_owned::<StatusReq>().ok().and_then(|r| {
                enc.encode(&StatusRsp {
                    request: r.request,
                    node,
                    uptime_ms: 0,
                    tasks: Vec::new(),
                    checkpoints: Vec::new(),
                    streams: Vec::new(),
                    incarnation: restarts.last().map_or(0, |r| r.incarnation),
                    restarts: restarts.to_vec(),
                    peers: links.to_vec(),
                    restarting: true,
                })
                .ok()
            }),
            Kind::StopReq => match frame.to_owned::<StopReq>() {
                Ok(r) if r.stream == stream => {
                    let rsp = StopRsp { request: r.request, node, stopping: true, peers: Vec::new() };
                    if let Ok(f) = enc.encode(&rsp) {
                        let _ = t.sender().send_timeout(from, f, Duration::from_secs(1));
                    }
                    break Waited::Stopped("weir stop");
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
