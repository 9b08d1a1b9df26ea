//! [`Node`]: a node's network side, which the streams it runs share: the transport (peers and
//! clients, heartbeats) and the router that hands what arrives to the stream it names.
//!
//! A stream runs on a node from its attach to its detach ([`Engine::start_on`](super::Engine)
//! and the engine's end); the node outlives its streams, and streams start and stop under it
//! without touching one another's channels. What a peer sends for a stream before it attaches
//! here waits for it (`router/early.rs`).
//!
//! Invariants: one run of a stream at a time holds it on a node, and each run that attaches
//! takes a greater epoch than the runs before it, so no frame of an earlier run can reach a
//! later one (the router matches every peer frame's epoch): a stream restarts under a running
//! node, its other streams untouched, and the node's connections stay up (its transport's
//! incarnation is the process's, not a run's). The heartbeats carry the tasks of exactly the
//! attached runs, each with its run's epoch. Between runs a [`Standing`] answers clients for
//! the stream.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use weir_wire::transport::{Transport, TransportConfig, TransportSender};
use weir_wire::{Epoch, NodeId, StreamId};

use super::board::TaskBoard;
use super::error::EngineError;
use super::protocol_wire::Run;
use super::router::{
    CatalogCall, DESK_QUEUE, Desk, IngestToken, Links, NodeSide, Router, Seen, SharedLinks, Standing, Standings,
    StreamSide,
};

/// A stream's runs on a node.
#[derive(Default)]
struct Runs {
    /// The latest run that attached.
    attached: Option<Epoch>,
    /// A run holds the stream now (reserved, maybe attached).
    busy: bool,
}

/// The attached runs' epochs and task boards, for heartbeats.
type Boards = Arc<Mutex<BTreeMap<StreamId, (Epoch, Vec<Arc<TaskBoard>>)>>>;

/// A node's transport and router, shared by the streams it runs.
pub struct Node {
    cfg: TransportConfig,
    addr: Option<SocketAddr>,
    /// `None` once stopped.
    router: Mutex<Option<Router>>,
    sender: TransportSender,
    boards: Boards,
    /// Per stream: its runs here.
    ran: Mutex<BTreeMap<StreamId, Runs>>,
    connected: super::router::Connected,
    standings: Standings,
    seen: Seen,
    links: SharedLinks,
    replaced: Arc<std::sync::OnceLock<String>>,
    desk: Desk,
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
        Self::start_with(cfg, false, None)
    }

    /// [`Node::start`], saying `standing` of `stream` from the first connection on (until a
    /// run of it attaches, or [`Node::stand`] says otherwise).
    pub fn start_standing(cfg: TransportConfig, stream: StreamId, standing: Standing) -> Result<Node, EngineError> {
        Self::start_with(cfg, false, Some((stream, standing)))
    }

    /// [`Node::start`]; `held`: the router takes nothing from the transport until the first
    /// stream attaches (a node started for one stream, which sees every event from the start).
    pub(crate) fn start_with(
        mut cfg: TransportConfig,
        held: bool,
        standing: Option<(StreamId, Standing)>,
    ) -> Result<Node, EngineError> {
        let boards = Boards::default();
        let b = boards.clone();
        cfg.heartbeat_tasks = Some(Arc::new(move || {
            let b = b.lock().unwrap_or_else(|e| e.into_inner());
            b.iter().flat_map(|(stream, (epoch, tasks))| tasks.iter().map(|t| t.heartbeat(*stream, *epoch))).collect()
        }));
        let transport = Transport::start(cfg.clone())?;
        let addr = transport.local_addr();
        let sender = transport.sender();
        let members: Vec<NodeId> = cfg.peers.iter().map(|p| p.node).collect();
        let (standings, seen) = (Standings::default(), Seen::default());
        standings.lock().unwrap_or_else(|e| e.into_inner()).extend(standing);
        let links = Arc::new(Mutex::new(Links::new(&members)));
        let replaced = Arc::new(std::sync::OnceLock::new());
        let desk = Desk::default();
        let side = NodeSide {
            links: links.clone(),
            standings: standings.clone(),
            seen: seen.clone(),
            replaced: replaced.clone(),
            desk: desk.clone(),
        };
        let router = Router::start(cfg.node, transport, held, side)?;
        let connected = router.connected();
        Ok(Node {
            cfg,
            addr,
            router: Mutex::new(Some(router)),
            sender,
            boards,
            ran: Default::default(),
            connected,
            standings,
            seen,
            links,
            replaced,
            desk,
        })
    }

    /// Why this process must run nothing more, once a peer said a newer process of this node
    /// runs (the streams attached then failed).
    pub fn replaced(&self) -> Option<String> {
        self.replaced.get().cloned()
    }

    /// Says `standing` of `stream` while no run of it is attached here (`None`: nothing; a
    /// client then hears the stream does not run here).
    pub fn stand(&self, stream: StreamId, standing: Option<Standing>) {
        let mut s = self.standings.lock().unwrap_or_else(|e| e.into_inner());
        match standing {
            Some(st) => s.insert(stream, st),
            None => s.remove(&stream),
        };
    }

    /// From now on, the catalog requests clients send this node: the caller answers each with
    /// [`Node::answer`] (until then, and once the receiver is dropped, the node refuses them:
    /// it keeps no catalog).
    pub fn serve_catalog(&self) -> crossbeam_channel::Receiver<CatalogCall> {
        let (tx, rx) = crossbeam_channel::bounded(DESK_QUEUE);
        *self.desk.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Sends `rsp` to client `to` (waiting up to a second for room in its queue); an answer
    /// that cannot go is logged (the client times out and asks again).
    pub fn answer(&self, to: NodeId, rsp: &weir_wire::msg::CatalogRsp) {
        let sent = weir_wire::FrameEncoder::new().encode(rsp).map_err(|e| e.to_string()).and_then(|f| {
            self.sender.clone().send_timeout(to, f, std::time::Duration::from_secs(1)).map_err(|e| e.to_string())
        });
        if let Err(e) = sent {
            tracing::warn!(client = %to, error = %e, "cannot deliver a catalog answer");
        }
    }

    /// The newest run of `stream` some node was seen in (its frames or heartbeats here).
    pub fn newest_epoch(&self, stream: StreamId) -> Option<Epoch> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).copied()
    }

    /// Whether a run of `stream` is attached here now.
    pub fn attached(&self, stream: StreamId) -> bool {
        self.boards.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&stream)
    }

    /// What the node says of `stream` while no run of it is attached (`None`: nothing).
    pub fn standing_phase(&self, stream: StreamId) -> Option<super::StandingPhase> {
        self.standings.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).map(|s| s.phase)
    }

    /// The links to the other members now.
    pub fn links(&self) -> Vec<weir_wire::msg::PeerLink> {
        self.links.lock().unwrap_or_else(|e| e.into_inner()).all()
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

    /// The transport's configuration (its incarnation is the node's process's).
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

    /// Takes the run of `stream` at `epoch` on this node, before it opens anything of its own:
    /// refused while another run of the stream holds it, or if a run at `epoch` or later has
    /// attached here (what peers sent that run would reach this one).
    pub(crate) fn reserve(&self, stream: StreamId, epoch: Epoch) -> Result<(), EngineError> {
        let mut ran = self.ran.lock().unwrap_or_else(|e| e.into_inner());
        let runs = ran.entry(stream).or_default();
        let node = self.cfg.node;
        if runs.busy {
            return Err(EngineError::Config(format!("stream {stream} runs on node {node}: its run must end first")));
        }
        if let Some(last) = runs.attached.filter(|last| epoch <= *last) {
            return Err(EngineError::Config(format!(
                "stream {stream} ran at epoch {last} on node {node}: a new run takes a greater epoch than {last}, not {epoch}"
            )));
        }
        runs.busy = true;
        Ok(())
    }

    /// Gives `stream` back: its run has ended (detached, everything of it closed), or failed to
    /// start before it attached (what peers sent it meanwhile waits for its next start).
    pub(crate) fn unreserve(&self, stream: StreamId) {
        self.ran.lock().unwrap_or_else(|e| e.into_inner()).entry(stream).or_default().busy = false;
    }

    /// Makes `run` (reserved) reachable from the network, its `tasks` in the heartbeats.
    pub(crate) fn attach(&self, run: Run, side: StreamSide, tasks: Vec<Arc<TaskBoard>>) -> Result<(), EngineError> {
        let router = self.router.lock().unwrap_or_else(|e| e.into_inner());
        let Some(router) = router.as_ref() else {
            return Err(EngineError::Config(format!("node {} has stopped", self.cfg.node)));
        };
        self.ran.lock().unwrap_or_else(|e| e.into_inner()).entry(run.stream).or_default().attached = Some(run.epoch);
        self.boards.lock().unwrap_or_else(|e| e.into_inner()).insert(run.stream, (run.epoch, tasks));
        router.attach(run, side);
        Ok(())
    }

    /// Lets go of `stream`'s run: nothing from the network reaches it once this returns (the
    /// run still holds the stream here until [`Node::unreserve`]).
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
    /// Takes the run off the network: detached, or its own node stopped. The node takes
    /// another run of the stream only once this is dropped, which the engine does last, after
    /// the run's result stores and ingest logs have closed.
    pub(super) fn release(&mut self) {
        if std::mem::take(&mut self.owned) {
            // The stream stays attached until its node stops: requests for it (a stop, an
            // append) are answered as the stream's until the node no longer listens.
            self.node.shut();
        } else if std::mem::take(&mut self.attached) {
            self.node.detach(self.stream);
        }
    }
}

impl Drop for NodeUse {
    fn drop(&mut self) {
        self.release();
        if std::mem::take(&mut self.reserved) {
            self.node.unreserve(self.stream);
        }
    }
}
