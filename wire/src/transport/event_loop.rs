//! The network thread: one mio loop over the listener, every connection and the waker.
//!
//! mio is edge-triggered: a readiness event is a hint that says "try now". Every handler therefore
//! works until the socket says `WouldBlock` (or until it deliberately pauses, and then it remembers
//! to come back), and every handler tolerates spurious events.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::handshake::{self, Side, Transcript};
use super::{Event, Shared, TransportConfig};
use crate::frame::{EncodedFrame, Frame, FrameDecoder, FrameEncoder, PROTOCOL_VERSION};
use crate::ids::NodeId;
use crate::msg::{Auth, Challenge, Close, CloseCode, Heartbeat, Hello, Kind, Message, NONCE_LEN};

pub(super) const LISTENER: Token = Token(0);
pub(super) const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// At most this many frames (or bytes) go into one vectored write.
const WRITE_BATCH_FRAMES: usize = 64;
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// How long a closing connection may take to deliver its `Close` frame.
const LINGER: Duration = Duration::from_millis(500);

#[derive(Debug)]
enum Phase {
    /// Dialer: TCP connect in progress.
    Connecting,
    /// Dialer: sent `Hello`, waiting for `Challenge`.
    AwaitChallenge { nonce: [u8; NONCE_LEN] },
    /// Acceptor: waiting for `Hello`.
    AwaitHello,
    /// Acceptor: sent `Challenge`, waiting for `Auth`.
    AwaitAuth { peer: NodeId, dialer_nonce: [u8; NONCE_LEN], acceptor_nonce: [u8; NONCE_LEN] },
    /// Authenticated; carries traffic.
    Established { peer: NodeId },
    /// Sent `Close`; delivering it, then dropping the socket.
    Closing { until: Instant },
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    phase: Phase,
    /// The node that dialed this connection (known once the handshake says).
    dialer: Option<NodeId>,
    /// For a connection we dialed: the peer we meant to reach.
    target: Option<NodeId>,
    decoder: FrameDecoder,
    /// Handshake, heartbeat and close frames, sent before more data is taken from the peer queue.
    control: VecDeque<EncodedFrame>,
    /// Frames being written; the first may be partly written (`written` bytes).
    out: VecDeque<EncodedFrame>,
    written: usize,
    started: Instant,
    last_recv: Instant,
    last_heartbeat: Instant,
    /// Reading stopped because the application is behind; resume when events drain.
    read_paused: bool,
}

#[derive(Debug)]
struct Peer {
    /// Listed in the configuration (kept for good); otherwise a node that dialed us, forgotten
    /// with its queue when its connection ends.
    configured: bool,
    addr: Option<SocketAddr>,
    rx: Receiver<EncodedFrame>,
    /// The established connection.
    conn: Option<Token>,
    /// A connection we are dialing.
    dialing: Option<Token>,
    next_dial: Instant,
    backoff: Duration,
}

pub(super) struct EventLoop {
    cfg: TransportConfig,
    poll: Poll,
    shared: Arc<Shared>,
    listener: Option<TcpListener>,
    conns: HashMap<Token, Conn>,
    peers: HashMap<NodeId, Peer>,
    events: Sender<Event>,
    /// Events the application has no room for yet; while non-empty, no connection is read.
    backlog: VecDeque<Event>,
    next_token: usize,
    encoder: FrameEncoder,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Why a connection ends.
struct Ending {
    code: CloseCode,
    reason: String,
    /// Send a `Close` frame to the peer first.
    notify: bool,
    /// Report as a handshake refusal (and by whom).
    refused: Option<bool>,
}

impl Ending {
    fn quiet(reason: impl Into<String>) -> Self {
        Ending { code: CloseCode::Shutdown, reason: reason.into(), notify: false, refused: None }
    }
    fn tell(code: CloseCode, reason: impl Into<String>) -> Self {
        Ending { code, reason: reason.into(), notify: true, refused: None }
    }
}

impl EventLoop {
    pub(super) fn new(
        cfg: TransportConfig,
        poll: Poll,
        mut listener: Option<TcpListener>,
        shared: Arc<Shared>,
        events: Sender<Event>,
        receivers: HashMap<NodeId, Receiver<EncodedFrame>>,
    ) -> io::Result<Self> {
        if let Some(l) = listener.as_mut() {
            poll.registry().register(l, LISTENER, Interest::READABLE)?;
        }
        let now = Instant::now();
        let peers = cfg
            .peers
            .iter()
            .map(|p| {
                let rx = receivers.get(&p.node).expect("queue per configured peer").clone();
                let peer = Peer {
                    configured: true,
                    addr: p.addr,
                    rx,
                    conn: None,
                    dialing: None,
                    next_dial: now,
                    backoff: cfg.reconnect_min,
                };
                (p.node, peer)
            })
            .collect();
        let encoder = FrameEncoder::new().max_frame(cfg.max_frame);
        Ok(Self {
            cfg,
            poll,
            shared,
            listener,
            conns: HashMap::new(),
            peers,
            events,
            backlog: VecDeque::new(),
            next_token: FIRST_CONN,
            encoder,
        })
    }

    pub(super) fn run(&mut self) {
        let node = self.cfg.node;
        tracing::debug!(%node, "network thread started");
        let mut events = Events::with_capacity(256);
        let tick = (self.cfg.heartbeat_interval / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let mut next_timers = Instant::now();
        loop {
            let timeout = if self.backlog.is_empty() { tick } else { Duration::from_millis(1) };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                tracing::error!(%node, error = %e, "poll failed; network thread stops");
                break;
            }
            if self.shared.shutdown.load(Ordering::Acquire) {
                break;
            }
            let mut woken = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => woken = true,
                    t => {
                        if ev.is_writable() {
                            self.on_writable(t);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(t);
                        }
                    }
                }
            }
            if woken {
                // Clear first: a send after this point wakes us again.
                self.shared.wake_pending.store(false, Ordering::Release);
                self.flush_established();
            }
            if !self.backlog.is_empty() {
                self.deliver_backlog();
            }
            let now = Instant::now();
            if now >= next_timers {
                self.timers(now);
                next_timers = now + tick;
            }
        }
        self.close_all();
        tracing::debug!(%node, "network thread stopped");
    }

    // -----------------------------------------------------------------------------------------
    // Accepting and dialing.

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else { return };
            match listener.accept() {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    self.add_conn(stream, addr, Phase::AwaitHello, None);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: log and let the next readiness hint retry.
                    tracing::warn!(node = %self.cfg.node, error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    fn add_conn(
        &mut self,
        mut stream: TcpStream,
        addr: SocketAddr,
        phase: Phase,
        target: Option<NodeId>,
    ) -> Option<Token> {
        let token = Token(self.next_token);
        self.next_token += 1;
        if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
            tracing::warn!(node = %self.cfg.node, %addr, error = %e, "cannot register connection");
            return None;
        }
        let now = Instant::now();
        let dialer = if target.is_some() { Some(self.cfg.node) } else { None };
        self.conns.insert(
            token,
            Conn {
                stream,
                addr,
                phase,
                dialer,
                target,
                decoder: FrameDecoder::new(self.cfg.max_frame),
                control: VecDeque::new(),
                out: VecDeque::new(),
                written: 0,
                started: now,
                last_recv: now,
                last_heartbeat: now,
                read_paused: false,
            },
        );
        Some(token)
    }

    fn dial(&mut self, node: NodeId, addr: SocketAddr) {
        match TcpStream::connect(addr) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let token = self.add_conn(stream, addr, Phase::Connecting, Some(node));
                if let Some(p) = self.peers.get_mut(&node) {
                    p.dialing = token;
                }
                tracing::debug!(node = %self.cfg.node, peer = %node, %addr, "dialing");
            }
            Err(e) => {
                tracing::debug!(node = %self.cfg.node, peer = %node, %addr, error = %e, "dial failed");
                self.schedule_redial(node);
            }
        }
    }

    fn schedule_redial(&mut self, node: NodeId) {
        let max = self.cfg.reconnect_max;
        if let Some(p) = self.peers.get_mut(&node) {
            p.dialing = None;
            // Up to +25% jitter so peers that lost each other together do not redial in lockstep.
            let jitter = handshake::nonce().map_or(0, |n| n[0] as u32) % 64;
            let delay = p.backoff + p.backoff * jitter / 256;
            p.next_dial = Instant::now() + delay;
            p.backoff = (p.backoff * 2).min(max);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Readiness.

    fn on_writable(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else { return };
        if matches!(conn.phase, Phase::Connecting) {
            if let Ok(Some(e)) | Err(e) = conn.stream.take_error() {
                let reason = format!("connect to {} failed: {e}", conn.addr);
                return self.end(token, Ending::quiet(reason));
            }
            match conn.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // spurious: not yet
                Err(e) => return self.end(token, Ending::quiet(format!("connect failed: {e}"))),
            }
            let nonce = match handshake::nonce() {
                Ok(n) => n,
                Err(e) => return self.end(token, Ending::quiet(format!("no randomness: {e}"))),
            };
            let hello = Hello {
                cluster: self.cfg.cluster.clone(),
                node: self.cfg.node,
                protocol_version: PROTOCOL_VERSION,
                nonce,
            };
            conn.phase = Phase::AwaitChallenge { nonce };
            self.queue_control(token, &hello);
        }
        self.flush(token);
    }

    fn on_readable(&mut self, token: Token) {
        loop {
            if !self.backlog.is_empty() {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.read_paused = true;
                }
                return;
            }
            let Some(conn) = self.conns.get_mut(&token) else { return };
            if matches!(conn.phase, Phase::Connecting) {
                return;
            }
            match conn.decoder.read_from(&mut conn.stream) {
                Ok(0) => {
                    let closing = matches!(conn.phase, Phase::Closing { .. });
                    let reason = if closing { "closed" } else { "peer closed the connection" };
                    return self.end(token, Ending::quiet(reason));
                }
                Ok(n) => {
                    conn.last_recv = Instant::now();
                    self.shared.stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    if matches!(conn.phase, Phase::Closing { .. }) {
                        // Discard: we only wait for the peer to read our Close and hang up.
                        conn.decoder = FrameDecoder::new(self.cfg.max_frame);
                        continue;
                    }
                    if !self.drain_frames(token) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.end(token, Ending::quiet(format!("read failed: {e}"))),
            }
        }
    }

    /// Handles every complete frame buffered on `token`. False if the connection ended or stopped
    /// being read.
    fn drain_frames(&mut self, token: Token) -> bool {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else { return false };
            if matches!(conn.phase, Phase::Closing { .. }) {
                return false;
            }
            match conn.decoder.next_frame() {
                Ok(Some(frame)) => {
                    if !self.on_frame(token, frame) {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(e) => {
                    self.shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    let code = match e {
                        crate::FrameError::UnsupportedVersion { .. } => CloseCode::VersionMismatch,
                        _ => CloseCode::BadFrame,
                    };
                    let established = matches!(conn.phase, Phase::Established { .. });
                    let mut ending = Ending::tell(code, format!("bad frame from {}: {e}", conn.addr));
                    if !established {
                        ending.refused = Some(false);
                    }
                    self.end(token, ending);
                    return false;
                }
            }
        }
    }

    /// One frame from `token`. False if the connection ended.
    fn on_frame(&mut self, token: Token, frame: Frame) -> bool {
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        // Close is understood in every phase.
        if frame.kind() == Kind::Close {
            let (code, message) = match frame.access::<Close>() {
                Ok(c) => (
                    rkyv::deserialize::<CloseCode, rkyv::rancor::Error>(&c.code).unwrap_or(CloseCode::BadFrame),
                    c.message.to_string(),
                ),
                Err(e) => (CloseCode::BadFrame, format!("unreadable close frame: {e}")),
            };
            let handshaking = !matches!(conn.phase, Phase::Established { .. });
            let ending = Ending {
                code: code.clone(),
                reason: format!("peer closed: {code:?}: {message}"),
                notify: false,
                refused: handshaking.then_some(true),
            };
            self.end(token, ending);
            return false;
        }
        match std::mem::replace(&mut conn.phase, Phase::Connecting) {
            Phase::Established { peer } => {
                conn.phase = Phase::Established { peer };
                if frame.kind() == Kind::Heartbeat {
                    return match frame.to_owned::<Heartbeat>() {
                        Ok(hb) => {
                            if !hb.tasks.is_empty() {
                                self.emit(Event::Heartbeat { from: peer, tasks: hb.tasks });
                            }
                            true
                        }
                        Err(e) => self.bad(token, e.to_string()),
                    };
                }
                if matches!(frame.kind(), Kind::Hello | Kind::Challenge | Kind::Auth) {
                    self.end(token, Ending::tell(CloseCode::ProtocolViolation, "handshake frame after the handshake"));
                    return false;
                }
                if let Err(e) = frame.message() {
                    return self.bad(token, e.to_string());
                }
                self.shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);
                self.emit(Event::Frame { from: peer, frame });
                true
            }
            Phase::AwaitHello => self.on_hello(token, &frame),
            Phase::AwaitChallenge { nonce } => self.on_challenge(token, &frame, nonce),
            Phase::AwaitAuth { peer, dialer_nonce, acceptor_nonce } => {
                self.on_auth(token, &frame, peer, dialer_nonce, acceptor_nonce)
            }
            other => {
                conn.phase = other;
                true
            }
        }
    }

    fn bad(&mut self, token: Token, reason: String) -> bool {
        self.shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
        let addr = self.conns.get(&token).map(|c| c.addr);
        self.end(token, Ending::tell(CloseCode::BadFrame, format!("bad frame from {addr:?}: {reason}")));
        false
    }

    fn refuse(&mut self, token: Token, code: CloseCode, reason: String) -> bool {
        self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
        let ending = Ending { code, reason, notify: true, refused: Some(false) };
        self.end(token, ending);
        false
    }

    fn on_hello(&mut self, token: Token, frame: &Frame) -> bool {
        let hello = match frame.to_owned::<Hello>() {
            Ok(h) => h,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Hello: {e}")),
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.dialer = Some(hello.node);
        }
        if hello.cluster != self.cfg.cluster {
            let reason = format!(
                "peer {} is in cluster {:?}, this node is in {:?}",
                hello.node, hello.cluster, self.cfg.cluster
            );
            return self.refuse(token, CloseCode::ClusterMismatch, reason);
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            let reason = format!(
                "peer {} speaks protocol {}, this node {}",
                hello.node, hello.protocol_version, PROTOCOL_VERSION
            );
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if hello.node == self.cfg.node {
            return self.refuse(
                token,
                CloseCode::ProtocolViolation,
                format!("peer claims this node's id {}", hello.node),
            );
        }
        let acceptor_nonce = match handshake::nonce() {
            Ok(n) => n,
            Err(e) => return self.refuse(token, CloseCode::Shutdown, format!("no randomness: {e}")),
        };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: hello.node,
            acceptor: self.cfg.node,
            dialer_nonce: &hello.nonce,
            acceptor_nonce: &acceptor_nonce,
        };
        let challenge = Challenge {
            cluster: self.cfg.cluster.clone(),
            node: self.cfg.node,
            protocol_version: PROTOCOL_VERSION,
            nonce: acceptor_nonce,
            proof: handshake::prove(&self.cfg.secret, Side::Acceptor, &t),
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.phase = Phase::AwaitAuth { peer: hello.node, dialer_nonce: hello.nonce, acceptor_nonce };
        }
        self.queue_control(token, &challenge);
        self.flush(token);
        true
    }

    fn on_challenge(&mut self, token: Token, frame: &Frame, dialer_nonce: [u8; NONCE_LEN]) -> bool {
        let ch = match frame.to_owned::<Challenge>() {
            Ok(c) => c,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Challenge: {e}")),
        };
        let target = self.conns.get(&token).and_then(|c| c.target);
        if ch.cluster != self.cfg.cluster {
            let reason =
                format!("peer {} is in cluster {:?}, this node is in {:?}", ch.node, ch.cluster, self.cfg.cluster);
            return self.refuse(token, CloseCode::ClusterMismatch, reason);
        }
        if ch.protocol_version != PROTOCOL_VERSION {
            let reason =
                format!("peer {} speaks protocol {}, this node {}", ch.node, ch.protocol_version, PROTOCOL_VERSION);
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if target.is_some_and(|t| t != ch.node) {
            let reason = format!("dialed {:?} but {} answered", target, ch.node);
            return self.refuse(token, CloseCode::ProtocolViolation, reason);
        }
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: self.cfg.node,
            acceptor: ch.node,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &ch.nonce,
        };
        if !handshake::verify(&self.cfg.secret, Side::Acceptor, &t, &ch.proof) {
            let reason = format!("peer {} could not prove the cluster secret", ch.node);
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        let auth = Auth { proof: handshake::prove(&self.cfg.secret, Side::Dialer, &t) };
        self.queue_control(token, &auth);
        self.established(token, ch.node)
    }

    fn on_auth(
        &mut self,
        token: Token,
        frame: &Frame,
        peer: NodeId,
        dialer_nonce: [u8; NONCE_LEN],
        acceptor_nonce: [u8; NONCE_LEN],
    ) -> bool {
        let auth = match frame.to_owned::<Auth>() {
            Ok(a) => a,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Auth: {e}")),
        };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: peer,
            acceptor: self.cfg.node,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &acceptor_nonce,
        };
        if !handshake::verify(&self.cfg.secret, Side::Dialer, &t, &auth.proof) {
            let reason = format!("peer {peer} could not prove the cluster secret");
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        self.established(token, peer)
    }

    /// The handshake on `token` completed with `peer`. False if this connection lost to another.
    fn established(&mut self, token: Token, peer: NodeId) -> bool {
        self.shared.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        let me = self.cfg.node;
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        conn.phase = Phase::Established { peer };
        if conn.dialer.is_none() {
            conn.dialer = Some(me);
        }
        let new_dialer = conn.dialer;
        let addr = conn.addr;
        if !self.peers.contains_key(&peer) {
            // A node we were not told about (a client, or a peer that dials us): give it a queue.
            let (tx, rx) = crossbeam_channel::bounded(self.cfg.send_queue);
            if let Ok(mut q) = self.shared.queues.write() {
                q.insert(peer, tx);
            }
            let now = Instant::now();
            let p = Peer {
                configured: false,
                addr: None,
                rx,
                conn: None,
                dialing: None,
                next_dial: now,
                backoff: self.cfg.reconnect_min,
            };
            self.peers.insert(peer, p);
        }
        let p = self.peers.get_mut(&peer).expect("peer inserted above");
        if p.dialing == Some(token) {
            p.dialing = None;
        }
        if let Some(old) = p.conn {
            let old_dialer = self.conns.get(&old).and_then(|c| c.dialer);
            // Same dialer: the newer connection wins (the old one is stale). Otherwise the
            // connection dialed by the lower node id wins, on both ends alike.
            let keep_new = old_dialer == new_dialer || new_dialer.map(|n| n.0) < old_dialer.map(|n| n.0);
            let (loser, winner) = if keep_new { (old, token) } else { (token, old) };
            self.peers.get_mut(&peer).expect("peer").conn = Some(winner);
            let ending = Ending::tell(CloseCode::Replaced, format!("another connection to {peer} replaces this one"));
            self.end(loser, ending);
            if !keep_new {
                return false;
            }
            tracing::debug!(node = %me, %peer, %addr, "connection replaced");
            self.flush(token);
            return true;
        }
        p.conn = Some(token);
        p.backoff = self.cfg.reconnect_min;
        tracing::info!(node = %me, %peer, %addr, "peer up");
        self.emit(Event::PeerUp { node: peer, addr });
        self.flush(token);
        true
    }

    // -----------------------------------------------------------------------------------------
    // Writing.

    fn queue_control<M: Message>(&mut self, token: Token, msg: &M) {
        match self.encoder.encode(msg) {
            Ok(f) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.control.push_back(f);
                }
            }
            Err(e) => tracing::error!(node = %self.cfg.node, error = %e, "cannot encode control frame"),
        }
    }

    fn flush_established(&mut self) {
        let tokens: Vec<Token> = self.peers.values().filter_map(|p| p.conn).collect();
        for t in tokens {
            self.flush(t);
        }
    }

    /// Writes queued frames on `token` until the socket would block or nothing is left.
    fn flush(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else { return };
        if matches!(conn.phase, Phase::Connecting) {
            return;
        }
        let rx = match conn.phase {
            Phase::Established { peer } => self.peers.get(&peer).filter(|p| p.conn == Some(token)).map(|p| &p.rx),
            _ => None,
        };
        let stats = &self.shared.stats;
        let result = loop {
            // Refill the write batch: control frames first, then the peer's data queue.
            let mut bytes: usize = conn.out.iter().map(EncodedFrame::len).sum();
            while conn.out.len() < WRITE_BATCH_FRAMES && bytes < WRITE_BATCH_BYTES {
                let next = match conn.control.pop_front() {
                    Some(f) => Some(f),
                    None => rx.and_then(|rx| rx.try_recv().ok()),
                };
                match next {
                    Some(f) => {
                        bytes += f.len();
                        conn.out.push_back(f);
                    }
                    None => break,
                }
            }
            if conn.out.is_empty() {
                break Ok(());
            }
            let mut slices = [IoSlice::new(&[]); WRITE_BATCH_FRAMES];
            let mut n = 0;
            for (i, f) in conn.out.iter().enumerate() {
                slices[i] = IoSlice::new(if i == 0 { &f.as_bytes()[conn.written..] } else { f.as_bytes() });
                n = i + 1;
            }
            match conn.stream.write_vectored(&slices[..n]) {
                Ok(0) => break Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")),
                Ok(mut w) => {
                    stats.bytes_out.fetch_add(w as u64, Ordering::Relaxed);
                    while w > 0 {
                        let rest = conn.out[0].len() - conn.written;
                        if w >= rest {
                            w -= rest;
                            conn.written = 0;
                            conn.out.pop_front();
                            stats.frames_out.fetch_add(1, Ordering::Relaxed);
                        } else {
                            conn.written += w;
                            w = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = result {
            let reason = format!("write failed: {e}");
            self.end(token, Ending::quiet(reason));
        }
    }

    // -----------------------------------------------------------------------------------------
    // Events to the application.

    fn emit(&mut self, ev: Event) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(ev);
            return;
        }
        match self.events.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(ev)) => self.backlog.push_back(ev),
            Err(TrySendError::Disconnected(_)) => {} // the application is gone; shutdown follows
        }
    }

    fn deliver_backlog(&mut self) {
        while let Some(ev) = self.backlog.pop_front() {
            match self.events.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    self.backlog.push_front(ev);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.backlog.clear();
                    break;
                }
            }
        }
        // Room again: resume the connections we stopped reading, frames already buffered first.
        let paused: Vec<Token> = self.conns.iter().filter(|(_, c)| c.read_paused).map(|(t, _)| *t).collect();
        for t in paused {
            if !self.backlog.is_empty() {
                return;
            }
            if let Some(c) = self.conns.get_mut(&t) {
                c.read_paused = false;
                c.last_recv = Instant::now();
            }
            if self.drain_frames(t) {
                self.on_readable(t);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Timers and endings.

    fn timers(&mut self, now: Instant) {
        let due: Vec<(NodeId, SocketAddr)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.conn.is_none() && p.dialing.is_none() && p.next_dial <= now)
            .filter_map(|(n, p)| p.addr.map(|a| (*n, a)))
            .collect();
        for (n, a) in due {
            self.dial(n, a);
        }
        let mut ends = Vec::new();
        let mut beats = Vec::new();
        for (t, c) in &self.conns {
            match c.phase {
                Phase::Established { .. } => {
                    // While we hold reading back, the peer's heartbeats sit unread in the socket:
                    // silence then is ours, not the peer's.
                    if !c.read_paused && now.duration_since(c.last_recv) > self.cfg.dead_after {
                        let silent = now.duration_since(c.last_recv);
                        let reason = format!("no frame from {} for {} ms", c.addr, silent.as_millis());
                        ends.push((*t, Ending::tell(CloseCode::Timeout, reason)));
                    } else if now.duration_since(c.last_heartbeat) >= self.cfg.heartbeat_interval {
                        beats.push(*t);
                    }
                }
                Phase::Closing { until } => {
                    if now >= until {
                        ends.push((*t, Ending::quiet("closed")));
                    }
                }
                _ => {
                    if now.duration_since(c.started) > self.cfg.handshake_timeout {
                        let reason = format!("handshake with {} not done in {:?}", c.addr, self.cfg.handshake_timeout);
                        ends.push((*t, Ending { code: CloseCode::Timeout, reason, notify: true, refused: None }));
                    }
                }
            }
        }
        for (t, e) in ends {
            self.end(t, e);
        }
        if !beats.is_empty() {
            let tasks = self.cfg.heartbeat_tasks.as_ref().map(|f| f()).unwrap_or_default();
            let hb = Heartbeat { node: self.cfg.node, sent_at_ms: now_ms(), tasks };
            for t in beats {
                if let Some(c) = self.conns.get_mut(&t) {
                    c.last_heartbeat = now;
                }
                self.queue_control(t, &hb);
                self.flush(t);
            }
        }
    }

    /// Ends connection `token`: tells the peer why (if asked), reports, and schedules a redial.
    fn end(&mut self, token: Token, ending: Ending) {
        let node = self.cfg.node;
        let Some(conn) = self.conns.get_mut(&token) else { return };
        if let Phase::Closing { .. } = conn.phase {
            // Already told the peer; now really drop it.
            let mut conn = self.conns.remove(&token).expect("present");
            let _ = self.poll.registry().deregister(&mut conn.stream);
            return;
        }
        let addr = conn.addr;
        let peer = match conn.phase {
            Phase::Established { peer } => Some(peer),
            Phase::AwaitAuth { peer, .. } => Some(peer),
            _ => conn.target.or(conn.dialer.filter(|d| *d != node)),
        };
        let was_established = matches!(conn.phase, Phase::Established { .. });
        if let Some(by_peer) = ending.refused {
            if by_peer {
                self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            tracing::warn!(%node, ?peer, %addr, code = ?ending.code, by_peer, reason = %ending.reason, "handshake refused");
            self.emit(Event::Refused {
                addr,
                node: peer,
                code: ending.code.clone(),
                by_peer,
                reason: ending.reason.clone(),
            });
        } else if matches!(ending.code, CloseCode::BadFrame | CloseCode::ProtocolViolation | CloseCode::Timeout) {
            tracing::warn!(%node, ?peer, %addr, code = ?ending.code, reason = %ending.reason, "closing connection");
        } else {
            tracing::debug!(%node, ?peer, %addr, reason = %ending.reason, "connection closed");
        }
        let conn = self.conns.get_mut(&token).expect("present");
        if ending.notify {
            // Drop unsent data (its queue keeps the rest), say why, and linger briefly so the peer
            // can read it before the socket goes.
            // A partly written frame must be finished first, or the peer could not parse the Close.
            let head = if conn.written > 0 { conn.out.pop_front() } else { None };
            conn.out.clear();
            match head {
                Some(h) => conn.out.push_back(h),
                None => conn.written = 0,
            }
            conn.control.clear();
            conn.phase = Phase::Closing { until: Instant::now() + LINGER };
            let close = Close { code: ending.code.clone(), message: ending.reason.clone() };
            self.queue_control(token, &close);
            self.flush(token);
            if let Some(c) = self.conns.get_mut(&token) {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
        } else {
            let mut conn = self.conns.remove(&token).expect("present");
            let _ = self.poll.registry().deregister(&mut conn.stream);
        }
        // Peer bookkeeping.
        let Some(peer) = peer else { return };
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if p.dialing == Some(token) {
            p.dialing = None;
            if p.conn.is_none() {
                self.schedule_redial(peer);
            }
        } else if p.conn == Some(token) {
            p.conn = None;
            let redial = p.addr.is_some();
            let forget = !redial && !p.configured;
            if was_established {
                tracing::info!(%node, %peer, reason = %ending.reason, "peer down");
                self.emit(Event::PeerDown { node: peer, reason: ending.reason });
            }
            if redial {
                self.schedule_redial(peer);
            } else if forget {
                // A client (or an unlisted node) went away: drop its queue so that many short-lived
                // clients do not accumulate. Senders holding the old queue see it closed and look
                // the node up again.
                self.peers.remove(&peer);
                if let Ok(mut q) = self.shared.queues.write() {
                    q.remove(&peer);
                }
            }
        }
    }

    fn close_all(&mut self) {
        // First deliver what is queued for connected peers (bounded in time), then say goodbye.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut events = Events::with_capacity(64);
        loop {
            self.flush_established();
            let queued = self.peers.values().filter(|p| p.conn.is_some()).any(|p| {
                !p.rx.is_empty() || p.conn.and_then(|t| self.conns.get(&t)).is_some_and(|c| !c.out.is_empty())
            });
            if !queued || Instant::now() >= deadline {
                break;
            }
            let _ = self.poll.poll(&mut events, Some(Duration::from_millis(5)));
        }
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for t in tokens {
            let handshaking = self.conns.get(&t).is_some_and(|c| !matches!(c.phase, Phase::Closing { .. }));
            if handshaking {
                self.end(t, Ending::tell(CloseCode::Shutdown, "node shutting down"));
            }
        }
        // Give Close frames a moment to leave; sockets close when dropped.
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline && self.conns.values().any(|c| !c.out.is_empty()) {
            let tokens: Vec<Token> = self.conns.keys().copied().collect();
            for t in tokens {
                self.flush(t);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.conns.clear();
    }
}
