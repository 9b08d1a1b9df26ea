//! The transport: authenticated, framed TCP links between nodes over one mio event loop.
//!
//! One thread per node (the *network thread*) owns every listener and connection. Application
//! threads talk to it through lock-free channels: they push [`EncodedFrame`]s into a bounded queue
//! per peer ([`TransportSender`]) and receive [`Event`]s from one bounded channel
//! ([`Transport::events`]). A `mio::Waker` wakes the loop; an atomic flag coalesces wakes so a burst
//! of sends costs one wake-up, not one system call per frame.
//!
//! Invariants:
//! - Memory is bounded: a peer's send queue holds at most `send_queue` frames, and a full queue
//!   hands the frame back (`SendError::Full`); when the application falls behind on events, the
//!   loop stops reading (TCP flow control pushes back on the peer) instead of buffering.
//! - No frame reaches the application before the handshake proved the cluster secret (or a
//!   client's key), none before its payload validated, and none of a kind the sender's role may
//!   not send ([`Role::allows`]); a connection that sends a bad frame is closed with a reason,
//!   and only that connection.
//! - Before its proof, a connection changes no state and holds little: frames are bounded to the
//!   handshake's size, handshaking connections are capped in number (in all and per address) and
//!   in time, and what the peer said is cut and escaped before it is logged.
//! - Frames on one connection arrive in the order they were queued. Frames queued while a peer is
//!   disconnected wait in its queue; frames lost with a broken connection are not resent here:
//!   channels above detect the gap by sequence number.
//! - At most one established connection per peer: when two exist, the one dialed by the lower
//!   node id wins, and between two from the same dialer the newer wins (the peer restarted).

pub mod client;
mod client_io;
mod event_loop;
mod handshake;
pub mod tls;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::frame::{DEFAULT_MAX_FRAME, EncodedFrame, Frame};
use crate::ids::NodeId;
use crate::msg::CloseCode;
use crate::role::Role;

/// A peer this node knows of at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's node id.
    pub node: NodeId,
    /// Where to dial it; `None` when the peer dials us. Configure one side of each pair to dial.
    pub addr: Option<SocketAddr>,
}

/// Transport settings. `TransportConfig::new` gives the defaults.
#[derive(Clone)]
pub struct TransportConfig {
    /// Cluster name; peers of another cluster are refused.
    pub cluster: String,
    /// This node.
    pub node: NodeId,
    /// Shared cluster secret proven in the handshake (never sent).
    pub secret: Vec<u8>,
    /// Address to accept connections on (`127.0.0.1:0` picks a free port).
    pub listen: Option<SocketAddr>,
    /// Known peers.
    pub peers: Vec<PeerConfig>,
    /// Largest accepted payload (default 16 MiB).
    pub max_frame: usize,
    /// Frames queued per peer before `send` answers `Full` (default 1024).
    pub send_queue: usize,
    /// Events buffered for the application before the loop stops reading (default 4096).
    pub event_queue: usize,
    /// How often a heartbeat is sent on each connection (default 1 s).
    pub heartbeat_interval: Duration,
    /// A connection silent this long is closed as dead (default 5 s).
    pub dead_after: Duration,
    /// A handshake not finished in this time is abandoned (default 5 s).
    pub handshake_timeout: Duration,
    /// First reconnect delay; doubles per failure (default 50 ms).
    pub reconnect_min: Duration,
    /// Largest reconnect delay (default 5 s).
    pub reconnect_max: Duration,
    /// This process's incarnation (default 0, as a client): a node that restarts takes a greater
    /// one. A member seen here at an incarnation below the newest it proved is an older process
    /// that was replaced, and is refused ([`crate::msg::CloseCode::Stale`]); a member that
    /// proves a greater one replaces its connection (reported as [`Event::PeerDown`], then
    /// [`Event::PeerUp`]).
    pub incarnation: u64,
    /// What every heartbeat says of this node's tasks (the seed's heartbeat content: latest,
    /// active and failed checkpoint per task); `None` sends plain heartbeats.
    pub heartbeat_tasks: Option<HeartbeatTasks>,
    /// Client credentials this node accepts: name -> role (each proves
    /// [`client_key`](crate::role::client_key) of its name and role).
    pub clients: HashMap<String, Role>,
    /// Accepted connections still in their handshake, at most (default 256); more are closed at
    /// once.
    pub max_handshaking: usize,
    /// Of those, at most this many from one IP address (an IPv6 /64 counts as one; default 64).
    pub max_handshaking_per_addr: usize,
    /// Established client connections (client credentials), at most (default 1024); more are
    /// refused with [`CloseCode::Busy`].
    pub max_clients: usize,
    /// New connections accepted from one address (or IPv6 /64) in a second, at most (default
    /// 256): each may cost a TLS handshake before it proves anything; members redial far less
    /// often. More are closed at once.
    pub max_accepts_per_addr_per_sec: u32,
    /// TLS 1.3 on every link ([`tls::TlsConfig::member`]); `None` (the default): plain TCP.
    pub tls: Option<tls::TlsConfig>,
    /// How long [`Transport::shutdown_delivering`] waits for the peers it names (default 2 s).
    pub shutdown_drain: Duration,
}

/// Reads this node's task summaries when a heartbeat goes out (called on the transport's thread:
/// it must not block).
pub type HeartbeatTasks = std::sync::Arc<dyn Fn() -> Vec<crate::msg::TaskHeartbeat> + Send + Sync>;

impl std::fmt::Debug for TransportConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportConfig")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("secret", &"<redacted>")
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("max_frame", &self.max_frame)
            .field("send_queue", &self.send_queue)
            .field("event_queue", &self.event_queue)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("dead_after", &self.dead_after)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("incarnation", &self.incarnation)
            .field("heartbeat_tasks", &self.heartbeat_tasks.is_some())
            .field("clients", &self.clients)
            .field("max_handshaking", &self.max_handshaking)
            .field("max_handshaking_per_addr", &self.max_handshaking_per_addr)
            .field("max_clients", &self.max_clients)
            .field("max_accepts_per_addr_per_sec", &self.max_accepts_per_addr_per_sec)
            .field("tls", &self.tls)
            .field("shutdown_drain", &self.shutdown_drain)
            .finish()
    }
}

impl TransportConfig {
    /// Defaults for `node` of `cluster`, proving `secret`.
    pub fn new(cluster: impl Into<String>, node: NodeId, secret: impl Into<Vec<u8>>) -> Self {
        Self {
            cluster: cluster.into(),
            node,
            secret: secret.into(),
            listen: None,
            peers: Vec::new(),
            max_frame: DEFAULT_MAX_FRAME,
            send_queue: 1024,
            event_queue: 4096,
            heartbeat_interval: Duration::from_secs(1),
            dead_after: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(5),
            incarnation: 0,
            heartbeat_tasks: None,
            clients: HashMap::new(),
            max_handshaking: 256,
            max_handshaking_per_addr: 64,
            max_clients: 1024,
            max_accepts_per_addr_per_sec: 256,
            tls: None,
            shutdown_drain: Duration::from_secs(2),
        }
    }

    /// Checks the settings; every error names the field.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |field: &'static str, reason: &str| Err(TransportError::Config { field, reason: reason.to_string() });
        if self.cluster.is_empty() || self.cluster.len() > crate::msg::MAX_CLUSTER_NAME {
            return bad("cluster", "must be 1 to 128 bytes");
        }
        if !Role::Member.fits(self.node) || self.node.0 > crate::role::MAX_MEMBER_ID {
            return bad("node", "a member's id is 1 to 2^31 - 1");
        }
        if self.secret.len() < 16 {
            return bad("secret", "must be at least 16 bytes");
        }
        if self.max_frame < 1024 || self.max_frame > u32::MAX as usize {
            return bad("max_frame", "must be between 1 KiB and 4 GiB");
        }
        if self.tls.as_ref().is_some_and(|t| t.server.is_none()) {
            return bad("tls", "a node's TLS needs its certificate and key (TlsConfig::member)");
        }
        if self.max_handshaking == 0 || self.max_handshaking_per_addr == 0 || self.max_accepts_per_addr_per_sec == 0 {
            return bad("max_handshaking", "must allow at least one connection");
        }
        if self.clients.keys().any(|n| !crate::role::valid_client_name(n)) {
            return bad("clients", "a client name is not 1 to 64 letters, digits, '-', '_' or '.'");
        }
        if self.clients.values().any(|r| *r == Role::Member) {
            return bad("clients", "a client's role is read, ingest or admin");
        }
        if self.send_queue == 0 || self.event_queue == 0 {
            return bad("send_queue", "queues must hold at least one frame");
        }
        if self.heartbeat_interval.is_zero() || self.dead_after <= self.heartbeat_interval {
            return bad("dead_after", "must be longer than heartbeat_interval, which must be > 0");
        }
        if self.reconnect_min.is_zero() || self.reconnect_max < self.reconnect_min {
            return bad("reconnect_max", "need 0 < reconnect_min <= reconnect_max");
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.peers {
            if p.node == self.node {
                return bad("peers", "a node cannot be its own peer");
            }
            if !seen.insert(p.node) {
                return bad("peers", "a peer is listed twice");
            }
        }
        Ok(())
    }
}

/// What the network thread tells the application.
#[derive(Debug)]
pub enum Event {
    /// A peer completed the handshake; frames can flow.
    PeerUp {
        /// The peer.
        node: NodeId,
        /// Its address.
        addr: SocketAddr,
    },
    /// A peer's connection ended; frames for it wait in its queue until it reconnects.
    PeerDown {
        /// The peer.
        node: NodeId,
        /// Why.
        reason: String,
        /// The peer said goodbye (`Close(Shutdown)`: it stopped on purpose) rather than
        /// vanishing (a crash, a reset, silence, a bad frame).
        orderly: bool,
    },
    /// A validated frame from an authenticated peer.
    Frame {
        /// Sender.
        from: NodeId,
        /// The frame; its payload validated already, and validates again on access.
        frame: Frame,
    },
    /// A connection was refused during the handshake, by us or by the peer.
    Refused {
        /// The other end.
        addr: SocketAddr,
        /// Its node id, if it said.
        node: Option<NodeId>,
        /// The reason code.
        code: CloseCode,
        /// Whether the peer refused us (otherwise we refused the peer).
        by_peer: bool,
        /// Detail.
        reason: String,
    },
    /// A peer's heartbeat said what its tasks' checkpoints are (only heartbeats that carry task
    /// summaries become events).
    Heartbeat {
        /// The peer.
        from: NodeId,
        /// Its tasks.
        tasks: Vec<crate::msg::TaskHeartbeat>,
    },
}

/// Errors starting the transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A setting is wrong; fix the configuration (fatal).
    #[error("invalid transport config `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The operating system refused (e.g. the listen address is in use).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl TransportError {
    /// Whether trying again later may succeed (an address in use may be freed; a config won't fix
    /// itself).
    pub fn is_retryable(&self) -> bool {
        matches!(self, TransportError::Io { .. })
    }
}

/// Why a frame was not queued. Every variant hands the frame back.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The peer's queue is full: back off and retry (retryable).
    #[error("send queue to the peer is full")]
    Full(EncodedFrame),
    /// No queue for this node: it is not configured and has never connected (fatal).
    #[error("unknown peer")]
    UnknownPeer(EncodedFrame),
    /// The transport is shut down (fatal).
    #[error("transport is shut down")]
    Closed(EncodedFrame),
}

impl SendError {
    /// The frame that was not sent.
    pub fn into_frame(self) -> EncodedFrame {
        match self {
            SendError::Full(f) | SendError::UnknownPeer(f) | SendError::Closed(f) => f,
        }
    }

    /// Whether retrying the same send may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SendError::Full(_))
    }
}

/// Counters kept by the network thread (relaxed atomics; read them for monitoring).
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Frames delivered to the application.
    pub frames_in: AtomicU64,
    /// Frames written to sockets (handshake and heartbeats included).
    pub frames_out: AtomicU64,
    /// Payload and header bytes read.
    pub bytes_in: AtomicU64,
    /// Bytes written.
    pub bytes_out: AtomicU64,
    /// Connections closed because of a bad frame.
    pub bad_frames: AtomicU64,
    /// Handshakes completed.
    pub handshakes: AtomicU64,
    /// Connections refused in the handshake (either side).
    pub refused: AtomicU64,
    /// Accepted connections closed at once: too many were handshaking.
    pub over_cap: AtomicU64,
    /// Frames refused because the sender's role may not send their kind.
    pub forbidden: AtomicU64,
    /// Accepted connections that ended without proving a key (one that closed before sending a
    /// byte, a port check, is not counted).
    pub strangers: AtomicU64,
}

impl TransportStats {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

pub(crate) struct Shared {
    waker: mio::Waker,
    wake_pending: AtomicBool,
    shutdown: AtomicBool,
    /// Peers whose queued frames are worth waiting for at shutdown, connected or not.
    deliver_to: std::sync::Mutex<Vec<NodeId>>,
    queues: RwLock<HashMap<NodeId, Sender<EncodedFrame>>>,
    stats: TransportStats,
}

impl Shared {
    fn wake(&self) {
        // Coalesce: only the first send after the loop cleared the flag pays for the syscall.
        if !self.wake_pending.swap(true, Ordering::AcqRel)
            && let Err(e) = self.waker.wake()
        {
            tracing::error!(error = %e, "cannot wake the network thread");
        }
    }
}

/// A running transport. Dropping it delivers what is queued for connected peers (for up to a
/// second), closes every connection (with a `Shutdown` reason) and joins the network thread.
pub struct Transport {
    shared: Arc<Shared>,
    events: Receiver<Event>,
    local_addr: Option<SocketAddr>,
    node: NodeId,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").field("node", &self.node).field("local_addr", &self.local_addr).finish()
    }
}

impl Transport {
    /// Validates `cfg`, binds the listener and starts the network thread.
    pub fn start(cfg: TransportConfig) -> Result<Transport, TransportError> {
        cfg.validate()?;
        let io_err = |context| move |source| TransportError::Io { context, source };
        let poll = mio::Poll::new().map_err(io_err("creating the poller"))?;
        let waker = mio::Waker::new(poll.registry(), event_loop::WAKER).map_err(io_err("creating the waker"))?;
        let listener = match cfg.listen {
            Some(addr) => Some(mio::net::TcpListener::bind(addr).map_err(io_err("binding the listen address"))?),
            None => None,
        };
        let local_addr = match &listener {
            Some(l) => Some(l.local_addr().map_err(io_err("reading the listen address"))?),
            None => None,
        };
        let mut queues = HashMap::new();
        let mut receivers = HashMap::new();
        for p in &cfg.peers {
            let (tx, rx) = crossbeam_channel::bounded(cfg.send_queue);
            queues.insert(p.node, tx);
            receivers.insert(p.node, rx);
        }
        let shared = Arc::new(Shared {
            waker,
            wake_pending: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            deliver_to: Default::default(),
            queues: RwLock::new(queues),
            stats: TransportStats::default(),
        });
        let (events_tx, events) = crossbeam_channel::bounded(cfg.event_queue);
        let node = cfg.node;
        let mut el = event_loop::EventLoop::new(cfg, poll, listener, shared.clone(), events_tx, receivers)
            .map_err(io_err("registering the listener"))?;
        let thread = std::thread::Builder::new()
            .name(format!("weir-net-{node}"))
            .spawn(move || el.run())
            .map_err(io_err("spawning the network thread"))?;
        Ok(Transport { shared, events, local_addr, node, thread: Some(thread) })
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The bound listen address (with the port the OS picked).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// A handle to queue frames; clone one per sending thread.
    pub fn sender(&self) -> TransportSender {
        TransportSender { shared: self.shared.clone(), cache: HashMap::new() }
    }

    /// Events from the network thread.
    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// Counters.
    pub fn stats(&self) -> &TransportStats {
        &self.shared.stats
    }

    /// Closes every connection and stops the network thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// [`Transport::shutdown`], first delivering what is queued for `peers` even when they are
    /// not connected now (a configured one is dialed at once, whatever its backoff, or awaited
    /// if it dials us), for up to [`TransportConfig::shutdown_drain`]: what a node sends just
    /// before it exits (a stop passed on) reaches a peer that has only just started. Peers not
    /// named get what is queued for them only if connected, as on drop.
    pub fn shutdown_delivering(mut self, peers: &[NodeId]) {
        *self.shared.deliver_to.lock().unwrap_or_else(|e| e.into_inner()) = peers.to_vec();
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        if let Err(e) = self.shared.waker.wake() {
            tracing::error!(error = %e, "cannot wake the network thread for shutdown");
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!(node = %self.node, "network thread panicked");
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Queues frames for peers. Cheap to clone; keep one per thread (it caches queue handles so the
/// hot path takes no lock).
pub struct TransportSender {
    shared: Arc<Shared>,
    cache: HashMap<NodeId, Sender<EncodedFrame>>,
}

impl std::fmt::Debug for TransportSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportSender").field("cached_peers", &self.cache.len()).finish()
    }
}

impl Clone for TransportSender {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone(), cache: HashMap::new() }
    }
}

impl TransportSender {
    fn queue(&mut self, to: NodeId) -> Option<&Sender<EncodedFrame>> {
        if !self.cache.contains_key(&to) {
            let tx = self.shared.queues.read().ok()?.get(&to)?.clone();
            self.cache.insert(to, tx);
        }
        self.cache.get(&to)
    }

    /// Queues `frame` for `to` without blocking. `UnknownPeer` if `to` is neither configured nor
    /// connected (a client that disconnected is forgotten).
    pub fn try_send(&mut self, to: NodeId, frame: EncodedFrame) -> Result<(), SendError> {
        if self.shared.shutdown.load(Ordering::Acquire) {
            return Err(SendError::Closed(frame));
        }
        let mut frame = frame;
        for attempt in 0..2 {
            let Some(tx) = self.queue(to) else { return Err(SendError::UnknownPeer(frame)) };
            match tx.try_send(frame) {
                Ok(()) => {
                    self.shared.wake();
                    return Ok(());
                }
                Err(crossbeam_channel::TrySendError::Full(f)) => {
                    // Make sure the loop is draining: it sleeps only after emptying every queue.
                    self.shared.wake();
                    return Err(SendError::Full(f));
                }
                Err(crossbeam_channel::TrySendError::Disconnected(f)) => {
                    // The peer's queue was dropped (an unlisted node disconnected); it may have a
                    // new one if it came back.
                    self.cache.remove(&to);
                    if attempt == 1 || self.shared.shutdown.load(Ordering::Acquire) {
                        return Err(SendError::Closed(f));
                    }
                    frame = f;
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// Queues `frame` for `to`, waiting up to `timeout` for room. `Full` after the timeout.
    pub fn send_timeout(&mut self, to: NodeId, frame: EncodedFrame, timeout: Duration) -> Result<(), SendError> {
        let frame = match self.try_send(to, frame) {
            Err(SendError::Full(f)) => f,
            other => return other,
        };
        let shared = self.shared.clone();
        let Some(tx) = self.queue(to) else { return Err(SendError::UnknownPeer(frame)) };
        match tx.send_timeout(frame, timeout) {
            Ok(()) => {
                shared.wake();
                Ok(())
            }
            Err(crossbeam_channel::SendTimeoutError::Timeout(f)) => Err(SendError::Full(f)),
            Err(crossbeam_channel::SendTimeoutError::Disconnected(f)) => Err(SendError::Closed(f)),
        }
    }
}
