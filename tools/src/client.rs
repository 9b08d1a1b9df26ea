//! What the client commands (`weir status`, `weir stop`) share: which cluster and nodes they
//! talk to, with which secret, and an authenticated request to one node.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use weir_engine::wire::msg::{CloseCode, Message, StatusReq, StatusRsp};
use weir_engine::wire::transport::client::{BlockingClient, ClientError};
use weir_engine::wire::{Frame, NodeId};

use crate::config::ClusterFile;

/// The highest node id a member may have; clients present ids above it.
pub const MAX_MEMBER_ID: u32 = (1 << 31) - 1;

/// The node id a client presents: random above every member's, so that two clients of one node
/// (`weir load` and `weir status` side by side) never take each other's connection.
pub fn client_id() -> NodeId {
    let mut b = [0u8; 4];
    let r = getrandom::fill(&mut b).map_or(std::process::id(), |()| u32::from_le_bytes(b));
    NodeId(MAX_MEMBER_ID + 1 + (r & MAX_MEMBER_ID))
}

/// Which cluster and nodes a client command talks to.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// A node of the cluster (repeat for more); default: the nodes of `--config`.
    #[arg(long = "node", value_name = "ADDR")]
    pub nodes: Vec<SocketAddr>,
    /// The cluster's config file: its name, secret, nodes and stream.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The cluster's name, without `--config` (the secret then comes from `WEIR_CLUSTER_SECRET`).
    #[arg(long, default_value = "weir")]
    pub cluster: String,
}

impl ClusterArgs {
    /// The cluster these name.
    pub fn target(&self) -> anyhow::Result<Target> {
        target(self.config.as_deref(), &self.nodes, &self.cluster)
    }
}

/// The cluster a command talks to.
pub struct Target {
    pub cluster: String,
    pub secret: Vec<u8>,
    /// The nodes to ask (`--node`, else every node of the file).
    pub nodes: Vec<SocketAddr>,
    pub file: Option<ClusterFile>,
}

impl Target {
    /// The node id of each address of the file (none without `--config`).
    pub fn node_ids(&self) -> std::collections::HashMap<SocketAddr, u32> {
        self.file.iter().flat_map(|f| f.nodes.iter().map(|n| (n.addr, n.id))).collect()
    }
}

/// From `--config` (name, secret, nodes) or `WEIR_CLUSTER_SECRET` with `cluster` and `nodes`.
pub fn target(config: Option<&std::path::Path>, nodes: &[SocketAddr], cluster: &str) -> anyhow::Result<Target> {
    let file = match config {
        Some(path) => {
            let f = crate::config::load(path, std::env::vars())?;
            f.validate().with_context(|| format!("in {}", path.display()))?;
            Some(f)
        }
        None => None,
    };
    let (cluster, secret) = match &file {
        Some(f) => (f.cluster.clone(), f.secret()?),
        None => match std::env::var("WEIR_CLUSTER_SECRET") {
            Ok(s) if !s.is_empty() => (cluster.to_string(), s.into_bytes()),
            _ => anyhow::bail!("no cluster secret: pass --config FILE or set WEIR_CLUSTER_SECRET"),
        },
    };
    let nodes = match (&file, nodes.is_empty()) {
        (_, false) => nodes.to_vec(),
        (Some(f), true) => f.nodes.iter().map(|n| n.addr).collect(),
        (None, true) => anyhow::bail!("which nodes? pass --node ADDR or --config FILE"),
    };
    Ok(Target { cluster, secret, nodes, file })
}

/// Why a request got no answer: the node refused this client (fatal: the secret or the cluster
/// name is wrong), or it could not be reached (it may be down).
pub enum Failure {
    Refused(anyhow::Error),
    Unreachable(String),
}

/// Sends `req` to `addr` and returns the answer's frame.
pub fn request<Q: Message>(t: &Target, addr: SocketAddr, req: &Q, timeout: Duration) -> Result<Frame, Failure> {
    let result = BlockingClient::connect(addr, &t.cluster, client_id(), &t.secret, timeout).and_then(|mut c| {
        c.send(req)?;
        c.recv()
    });
    result.map_err(|e| match &e {
        ClientError::Closed { code: CloseCode::AuthFailed, message, .. }
        | ClientError::Handshake { reason: message, .. } => Failure::Refused(anyhow::anyhow!(
            "{addr} refused this client: {message} (is the cluster secret or name wrong?)"
        )),
        _ => Failure::Unreachable(e.to_string()),
    })
}

/// `addr`'s status: `Ok(None)` when it cannot be reached.
pub fn status(t: &Target, addr: SocketAddr, timeout: Duration) -> anyhow::Result<Result<StatusRsp, String>> {
    match request(t, addr, &StatusReq { request: 1 }, timeout) {
        Ok(f) => Ok(f.to_owned::<StatusRsp>().map_err(|e| format!("{addr} answered, not with a status: {e}"))),
        Err(Failure::Refused(e)) => Err(e),
        Err(Failure::Unreachable(why)) => Ok(Err(why)),
    }
}
