//! The network thread: one mio loop over the listener, every connection and the waker.
//!
//! mio is edge-triggered: a readiness event is a hint that says "try now". Every handler therefore
//! works until the socket says `WouldBlock` (or until it deliberately pauses, and then it remembers
//! to come back), and every handler tolerates spurious events.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

mod connections;
mod handshake;
mod timers;
mod write;

use super::handshake::{self as proof, Side, Transcript};
use super::{Event, Shared, TransportConfig};
use crate::frame::{EncodedFrame, Frame, FrameDecoder, FrameEncoder, HANDSHAKE_MAX_FRAME, PROTOCOL_VERSION};
use crate::ids::NodeId;
use crate::msg::{Auth, Challenge, Close, CloseCode, Heartbeat, Hello, Kind, Message, NONCE_LEN, Welcome};
use crate::role::Role;

pub(super) const LISTENER: Token = Token(0);
pub(super) const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// At most this many frames (or bytes) go into one vectored write.
const WRITE_BATCH_FRAMES: usize = 64;
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// How long a closing connection may take to deliver its `Close` frame.
const LINGER: Duration = Duration::from_millis(500);
/// Reads from one connection per readiness event before the others get their turn (the rest is
/// read on the loop's next pass).
const READS_PER_TURN: usize = 32;
/// Bytes a closing connection may still send; past them it is dropped at once.
const DISCARD_MAX: usize = 64 << 10;

#[derive(Debug)]
enum Phase {
    /// Dialer: TCP connect in progress.
    Connecting,
    /// Dialer: sent `Hello`, waiting for `Challenge`.
    AwaitChallenge { nonce: [u8; NONCE_LEN] },
    /// Acceptor: waiting for `Hello`.
    AwaitHello,
    /// Acceptor: sent `Challenge`, waiting for `Auth`.
    AwaitAuth(Box<Awaiting>),
    /// Dialer: sent `Auth`, waiting for `Welcome` (or a refusal).
    AwaitWelcome { peer: NodeId, incarnation: u64 },
    /// Authenticated; carries what `role` may send.
    Established { peer: NodeId, role: Role },
    /// Sent `Close`; delivering it, then dropping the socket.
    Closing { until: Instant },
}

/// Plaintext through a connection's TLS, for the decoder.
struct TlsReader<'a> {
    tls: &'a mut rustls::Connection,
    sock: &'a mut TcpStream,
}

impl io::Read for TlsReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        super::tls::read(self.tls, self.sock, buf)
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("addr", &self.addr)
            .field("phase", &self.phase)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// What an acceptor remembers of a `Hello` until the dialer's `Auth` proves it.
#[derive(Debug)]
pub(super) struct Awaiting {
    peer: NodeId,
    client: String,
    /// The role and key its `Hello` named; `None`: no such client (the handshake fails at
    /// `Auth`).
    keyed: Option<(Role, Vec<u8>)>,
    dialer_incarnation: u64,
    dialer_nonce: [u8; NONCE_LEN],
    acceptor_nonce: [u8; NONCE_LEN],
}

/// At most this many characters of a string a peer sent go into a log line or a reason.
const UNTRUSTED_CHARS: usize = 96;

/// `s` cut to a few dozen characters and escaped (no control characters, no newlines), for logs
/// and reasons that quote what a peer said.
pub(crate) fn untrusted(s: &str) -> String {
    let mut out: String = s.chars().take(UNTRUSTED_CHARS).flat_map(char::escape_debug).collect();
    if s.chars().nth(UNTRUSTED_CHARS).is_some() {
        out.push_str("...");
    }
    format!("\"{out}\"")
}

struct Conn {
    stream: TcpStream,
    /// TLS over `stream`, when the transport speaks it.
    tls: Option<Box<rustls::Connection>>,
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
    /// Accepted and not yet authenticated: counted against the handshake caps.
    counted: bool,
    /// An established client: counted against `max_clients`.
    client_slot: bool,
    /// Bytes read and thrown away since it began closing.
    discarded: usize,
    /// The peer sent a byte: one that closes before it does only checked the port (a health
    /// checker, another node's probe), and is not counted as a refused stranger.
    heard: bool,
    /// The peer closed without sending a byte.
    port_check: bool,
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
    /// The newest incarnation (process) the node proved in a handshake: an older one is a
    /// process that has been replaced, and is refused.
    incarnation: u64,
    /// Its last connection ended with a goodbye (`Close(Shutdown)`), so its loss was not
    /// reported as one (a new process of it is).
    left_in_order: bool,
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
    /// Accepted connections not yet authenticated, in all and per address.
    handshaking: usize,
    handshaking_by_ip: HashMap<IpAddr, usize>,
    /// Established client connections.
    clients: usize,
    /// Per address group: when its current second of accepts began, and how many so far.
    accepts: HashMap<IpAddr, (Instant, u32)>,
    /// Connections whose turn to read ended with bytes left: read again on the next pass.
    again: Vec<Token>,
    /// Refusals of unauthenticated connections not yet reported in a log line (one a few seconds).
    quiet_refusals: u64,
    /// Shutting down: peers whose queued frames are awaited even while not connected.
    deliver_to: Vec<NodeId>,
    last_refusal_log: Instant,
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
    /// The peer closed with `Close(Shutdown)`: it stopped on purpose.
    orderly: bool,
}

impl Ending {
    fn quiet(reason: impl Into<String>) -> Self {
        Ending { code: CloseCode::Shutdown, reason: reason.into(), notify: false, refused: None, orderly: false }
    }
    fn tell(code: CloseCode, reason: impl Into<String>) -> Self {
        Ending { code, reason: reason.into(), notify: true, refused: None, orderly: false }
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
                    incarnation: 0,
                    left_in_order: false,
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
            handshaking: 0,
            handshaking_by_ip: HashMap::new(),
            clients: 0,
            accepts: HashMap::new(),
            again: Vec::new(),
            quiet_refusals: 0,
            deliver_to: Vec::new(),
            last_refusal_log: now,
        })
    }

    pub(super) fn run(&mut self) {
        let node = self.cfg.node;
        tracing::debug!(%node, "network thread started");
        let mut events = Events::with_capacity(256);
        let tick = (self.cfg.heartbeat_interval / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let mut next_timers = Instant::now();
        // Set once the application shuts the transport down: until then, queued frames still go.
        let mut drain_until: Option<Instant> = None;
        loop {
            let mut timeout = match (self.backlog.is_empty(), self.again.is_empty()) {
                (true, true) => tick,
                (true, false) => Duration::ZERO,
                (false, _) => Duration::from_millis(1),
            };
            if drain_until.is_some() {
                timeout = timeout.min(Duration::from_millis(5));
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                tracing::error!(%node, error = %e, "poll failed; network thread stops");
                break;
            }
            if self.shared.shutdown.load(Ordering::Acquire) {
                let now = Instant::now();
                let until = *drain_until.get_or_insert_with(|| {
                    next_timers = now;
                    now + self.drain_for(now)
                });
                self.flush_established();
                if now >= until || !self.queued() {
                    break;
                }
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
            for t in std::mem::take(&mut self.again) {
                self.on_readable(t);
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
            let nonce = match proof::nonce() {
                Ok(n) => n,
                Err(e) => return self.end(token, Ending::quiet(format!("no randomness: {e}"))),
            };
            let hello = Hello {
                cluster: self.cfg.cluster.clone(),
                node: self.cfg.node,
                protocol_version: PROTOCOL_VERSION,
                incarnation: self.cfg.incarnation,
                nonce,
                client: String::new(),
            };
            conn.phase = Phase::AwaitChallenge { nonce };
            self.queue_control(token, &hello);
        }
        self.flush(token);
    }

    fn on_readable(&mut self, token: Token) {
        for _ in 0..READS_PER_TURN {
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
            if matches!(conn.phase, Phase::Closing { .. }) {
                // Discard: we only wait for the peer to read our Close and hang up.
                let mut sink = [0u8; 4096];
                match io::Read::read(&mut conn.stream, &mut sink) {
                    Ok(0) => return self.end(token, Ending::quiet("closed")),
                    Ok(n) => {
                        conn.discarded += n;
                        if conn.discarded > DISCARD_MAX {
                            return self.drop_conn(token);
                        }
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return self.end(token, Ending::quiet(format!("read failed: {e}"))),
                }
            }
            let got = match conn.tls.as_deref_mut() {
                None => conn.decoder.read_from(&mut conn.stream),
                Some(tls) => conn.decoder.read_from(&mut TlsReader { tls, sock: &mut conn.stream }),
            };
            match got {
                Ok(0) => {
                    conn.port_check = !conn.heard;
                    return self.end(token, Ending::quiet("peer closed the connection"));
                }
                Ok(n) => {
                    conn.heard = true;
                    conn.last_recv = Instant::now();
                    self.shared.stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    if !self.drain_frames(token) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::InvalidData && conn.tls.is_some() && conn.target.is_some() => {
                    // A peer we dial that does not speak our TLS (plain, another CA): say so.
                    let (node, addr) = (self.cfg.node, conn.addr);
                    tracing::warn!(%node, %addr, error = %e, "TLS with the peer failed");
                    return self.end(token, Ending::quiet(format!("TLS failed: {e}")));
                }
                Err(e) => return self.end(token, Ending::quiet(format!("read failed: {e}"))),
            }
        }
        // Its turn is over with bytes maybe left (mio will not say so again): the next pass.
        if !self.again.contains(&token) {
            self.again.push(token);
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
                    untrusted(&c.message),
                ),
                Err(e) => (CloseCode::BadFrame, format!("unreadable close frame: {e}")),
            };
            let handshaking = !matches!(conn.phase, Phase::Established { .. });
            // Stale on an established connection: a newer process of this node replaced it.
            let refused = handshaking || code == CloseCode::Stale;
            let ending = Ending {
                orderly: code == CloseCode::Shutdown,
                code: code.clone(),
                reason: format!("peer closed: {code:?}: {message}"),
                notify: false,
                refused: refused.then_some(true),
            };
            self.end(token, ending);
            return false;
        }
        match std::mem::replace(&mut conn.phase, Phase::Connecting) {
            Phase::Established { peer, role } => {
                conn.phase = Phase::Established { peer, role };
                if frame.kind() == Kind::Heartbeat {
                    return match frame.to_owned::<Heartbeat>() {
                        Ok(hb) => {
                            // Only a member speaks for tasks: a client's summaries are ignored.
                            if !hb.tasks.is_empty() && role == Role::Member {
                                self.emit(Event::Heartbeat { from: peer, tasks: hb.tasks });
                            }
                            true
                        }
                        Err(e) => self.bad(token, e.to_string()),
                    };
                }
                if matches!(frame.kind(), Kind::Hello | Kind::Challenge | Kind::Auth | Kind::Welcome) {
                    self.end(token, Ending::tell(CloseCode::ProtocolViolation, "handshake frame after the handshake"));
                    return false;
                }
                if !role.allows(frame.kind()) {
                    self.shared.stats.forbidden.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("a {role} client may not send {}", frame.kind().name());
                    self.end(token, Ending::tell(CloseCode::Forbidden, reason));
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
            Phase::AwaitAuth(a) => self.on_auth(token, &frame, *a),
            Phase::AwaitWelcome { peer, incarnation } => self.on_welcome(token, &frame, peer, incarnation),
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
        let ending = Ending { code, reason, notify: true, refused: Some(false), orderly: false };
        self.end(token, ending);
        false
    }
}
