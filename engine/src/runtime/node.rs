//! [`Node`]: a node's network side, which the streams it runs share: the transport (peers and
//! clients, heartbeats) and the router that hands what arrives to the stream it names.
//!
//! A stream runs on a node from its attach to its detach ([`Engine::start_on`](super::Engine)
//! and the engine's end); the node outlives its streams, and streams start and stop under it
//! without touching one another's channels. What a peer sends for a stream before it attaches
//! here waits for it (`router/early.rs`).
//!
//! Invariants: a stream id attaches to a node once in the node's life, so no frame of an earlier
//! run of the stream can reach a later one (per-stream epochs, which would let a stream restart
//! under a running node, are not built: a stream restarts with its nodes, as `weir node` does);
//! the heartbeats carry the tasks of exactly the attached streams.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use weir_wire::transport::{Transport, TransportConfig, TransportSender};
use weir_wire::{NodeId, StreamId};

use super::board::TaskBoard;
use super::error::EngineError;
use super::router::{IngestToken, Router, StreamSide};

/// The attached streams' task boards, for heartbeats.
type Boards = Arc<Mutex<BTreeMap<StreamId, Vec<Arc<TaskBoard>>>>>;

/// A node's transport and router, shared by the streams it runs.
pub struct Node {
    cfg: TransportConfig,
    addr: Option<SocketAddr>,
    /// `None` once stopped.
    router: Mutex<Option<Router>>,
    sender: TransportSender,
    boards: Boards,
    /// Every stream that attached.
    ran: Mutex<std::collections::BTreeSet<StreamId>>,
    connected: super::router::Connected,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("node", &self.cfg.node).field("addr", &self.addr).finish()
    }
}

impl Node {
    /// Starts the transport of `cfg` and its router, with no stream (its heartbeats are set
    /// here: they carry the tasks of the streams that attach).
    pub fn start(cfg: TransportConfig) -> Result<Node, EngineError> {
        Self::start_with(cfg, false)
    }

    /// [`Node::start`]; `held`: the router takes nothing from the transport until the first
    /// stream attaches (a node started for one stream, which sees every event from the start).
    pub(crate) fn start_with(mut cfg: TransportConfig, held: bool) -> Result<Node, EngineError> {
        let boards = Boards::default();
        let b = boards.clone();
        cfg.heartbeat_tasks = Some(Arc::new(move || {
            let b = b.lock().unwrap_or_else(|e| e.into_inner());
            b.iter().flat_map(|(stream, tasks)| tasks.iter().map(|t| t.heartbeat(*stream))).collect()
        }));
        let transport = Transport::start(cfg.clone())?;
        let addr = transport.local_addr();
        let sender = transport.sender();
        let router = Router::start(cfg.node, transport, held)?;
        let connected = router.connected();
        Ok(Node { cfg, addr, router: Mutex::new(Some(router)), sender, boards, ran: Default::default(), connected })
    }

    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.cfg.node
    }

    /// The transport's listen address, when it listens.
    pub fn transport_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The nodes connected to this one now (peers and clients).
    pub fn connected(&self) -> Vec<NodeId> {
        self.connected.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect()
    }

    /// The transport's configuration (the streams on the node run at its incarnation).
    pub(crate) fn transport_config(&self) -> &TransportConfig {
        &self.cfg
    }

    /// The transport's sending side.
    pub(crate) fn sender(&self) -> &TransportSender {
        &self.sender
    }

    /// Where an attached stream's ingest writer acknowledges appends (`None` once stopped).
    pub(crate) fn ack_sender(&self) -> Option<crossbeam_channel::Sender<crate::ingest::Appended<IngestToken>>> {
        self.router.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(Router::ack_sender)
    }

    /// Takes `stream`'s one run on this node, before the stream opens anything of its own.
    pub(crate) fn reserve(&self, stream: StreamId) -> Result<(), EngineError> {
        if !self.ran.lock().unwrap_or_else(|e| e.into_inner()).insert(stream) {
            let node = self.cfg.node;
            return Err(EngineError::Config(format!(
                "stream {stream} already ran on node {node}: it restarts on a new node (stream epochs are not built)"
            )));
        }
        Ok(())
    }

    /// Gives `stream`'s run back: it failed to start before it attached, so nothing reached it
    /// (what peers sent it meanwhile waits for its next start).
    pub(crate) fn unreserve(&self, stream: StreamId) {
        self.ran.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
    }

    /// Makes `stream` (reserved) reachable from the network, its `tasks` in the heartbeats.
    pub(crate) fn attach(
        &self,
        stream: StreamId,
        side: StreamSide,
        tasks: Vec<Arc<TaskBoard>>,
    ) -> Result<(), EngineError> {
        let router = self.router.lock().unwrap_or_else(|e| e.into_inner());
        let Some(router) = router.as_ref() else {
            return Err(EngineError::Config(format!("node {} has stopped", self.cfg.node)));
        };
        self.boards.lock().unwrap_or_else(|e| e.into_inner()).insert(stream, tasks);
        router.attach(stream, side);
        Ok(())
    }

    /// Lets go of `stream`: nothing from the network reaches it once this returns.
    pub(crate) fn detach(&self, stream: StreamId) {
        if let Some(r) = self.router.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            r.detach(stream);
        }
        self.boards.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
    }

    /// Stops the node: the streams still attached fail (they have lost their network), then
    /// the router stops and the transport closes (what is queued is delivered first).
    pub fn stop(&self) {
        if let Some(r) = self.router.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            r.fail_all(format!("node {} stopped under the stream", self.cfg.node));
        }
        self.shut();
    }

    /// Stops the router and closes the transport.
    fn shut(&self) {
        let router = self.router.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(r) = router {
            r.stop();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shut();
    }
}

/// The node an engine's stream is attached to: detached when the engine ends (or its start
/// fails), and stopped then too when the engine started the node itself.
pub(super) struct NodeUse {
    pub(super) node: Arc<Node>,
    pub(super) stream: StreamId,
    /// The stream's run on the node is taken ([`Node::reserve`]).
    pub(super) reserved: bool,
    pub(super) attached: bool,
    pub(super) owned: bool,
}

impl NodeUse {
    pub(super) fn release(&mut self) {
        let (attached, reserved) = (std::mem::take(&mut self.attached), std::mem::take(&mut self.reserved));
        if std::mem::take(&mut self.owned) {
            // The stream stays attached until its node stops: requests for it (a stop, an
            // append) are answered as the stream's until the node no longer listens.
            self.node.shut();
        } else if attached {
            self.node.detach(self.stream);
        } else if reserved {
            self.node.unreserve(self.stream);
        }
    }
}

impl Drop for NodeUse {
    fn drop(&mut self) {
        self.release();
    }
}
