//! What the client commands (`weir status`, `stop`, `load`, `query`, `verify`) share: which cluster and nodes they
//! talk to, with which credential, and an authenticated request to one node.
//!
//! The credential is, first found: `WEIR_CREDENTIAL` or the file's `credential` (a client's own,
//! `NAME:KEY`, with the role the cluster's config gives that name), else the cluster secret (the
//! file's `cluster_secret` or `WEIR_CLUSTER_SECRET`: a member's rights).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use weir_engine::wire::msg::{
    CatalogRefusal, CatalogReq, CatalogRsp, CloseCode, Message, StatusReq, StatusRsp, StreamEntry,
};
use weir_engine::wire::role::MAX_MEMBER_ID;
use weir_engine::wire::transport::client::{BlockingClient, ClientError, Credential};
use weir_engine::wire::{Frame, NodeId, StreamId};

use crate::config::{ClusterFile, Secret};

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
    /// The cluster's name, without `--config` (the credential then comes from `WEIR_CREDENTIAL`
    /// or `WEIR_CLUSTER_SECRET`).
    #[arg(long, default_value = "weir")]
    pub cluster: String,
    /// Speak TLS, trusting this CA (PEM), without `--config` (with it: the file's `[tls]`).
    #[arg(long, env = "WEIR_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the nodes' certificates carry, with `--tls-ca`.
    #[arg(long, env = "WEIR_TLS_SERVER_NAME", default_value = "weir")]
    pub tls_server_name: String,
}

impl ClusterArgs {
    /// The cluster these name.
    pub fn target(&self) -> anyhow::Result<Target> {
        let mut t = target(self.config.as_deref(), &self.nodes, &self.cluster)?;
        if self.config.is_none()
            && let Some(ca) = &self.tls_ca
        {
            if matches!(t.cred, Credential::Secret(_)) {
                anyhow::bail!(
                    "--tls-ca with the cluster secret: a member presents a certificate under TLS; pass --config \
                     with the cluster's [tls], or a client credential (WEIR_CREDENTIAL)"
                );
            }
            t.tls = Some(weir_engine::wire::transport::tls::TlsConfig::client(ca, &self.tls_server_name)?);
        }
        Ok(t)
    }
}

/// The cluster a command talks to.
pub struct Target {
    pub cluster: String,
    pub cred: Credential,
    /// TLS to the nodes, when the cluster speaks it.
    pub tls: Option<weir_engine::wire::transport::tls::TlsConfig>,
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

/// From `--config` (name, credential, nodes) or the environment with `cluster` and `nodes`.
pub fn target(config: Option<&std::path::Path>, nodes: &[SocketAddr], cluster: &str) -> anyhow::Result<Target> {
    let file = match config {
        Some(path) => {
            let f = crate::config::load(path, std::env::vars())?;
            f.validate().with_context(|| format!("in {}", path.display()))?;
            Some(f)
        }
        None => None,
    };
    let env = |name| std::env::var(name).ok().filter(|s: &String| !s.is_empty());
    let (cluster, cred) = match &file {
        Some(f) => match &f.credential {
            Some(Secret(c)) => (f.cluster.clone(), parse_credential(c)?),
            None => (f.cluster.clone(), Credential::Secret(f.secret()?)),
        },
        None => match (env("WEIR_CREDENTIAL"), env("WEIR_CLUSTER_SECRET")) {
            (Some(c), _) => (cluster.to_string(), parse_credential(&c)?),
            (None, Some(s)) => (cluster.to_string(), Credential::Secret(s.into_bytes())),
            (None, None) => {
                anyhow::bail!("no credential: pass --config FILE, or set WEIR_CREDENTIAL (or WEIR_CLUSTER_SECRET)")
            }
        },
    };
    let nodes = match (&file, nodes.is_empty()) {
        (_, false) => nodes.to_vec(),
        (Some(f), true) => f.nodes.iter().map(|n| n.addr).collect(),
        (None, true) => anyhow::bail!("which nodes? pass --node ADDR or --config FILE"),
    };
    // Holding the secret, a tool is a member: under TLS it presents the file's certificate too.
    let tls = match (file.as_ref().and_then(|f| f.tls.as_ref()), &cred) {
        (None, _) => None,
        (Some(t), Credential::Secret(_)) if t.cert.is_some() => Some(t.member()?),
        (Some(_), Credential::Secret(_)) => {
            anyhow::bail!(
                "the cluster secret under [tls] needs the file's cert and key: a member presents a certificate"
            )
        }
        (Some(t), _) => Some(t.client()?),
    };
    Ok(Target { cluster, cred, tls, nodes, file })
}

fn parse_credential(s: &str) -> anyhow::Result<Credential> {
    Credential::parse(s).context("the client credential (WEIR_CREDENTIAL or the file's credential)")
}

/// An authenticated connection to `addr` with the target's credential.
pub fn connect(t: &Target, addr: SocketAddr, timeout: Duration) -> Result<BlockingClient, ClientError> {
    BlockingClient::connect_with(addr, &t.cluster, client_id(), &t.cred, t.tls.as_ref(), timeout)
}

/// What a refusal means for the user.
pub fn refusal_hint(code: &CloseCode) -> &'static str {
    match code {
        CloseCode::Forbidden => "the credential's role may not do this",
        CloseCode::Busy => "the node serves as many clients as it may: try again later",
        _ => "is the credential, the cluster secret or the cluster name wrong?",
    }
}

/// Why a request got no answer: the node refused this client (fatal: the secret or the cluster
/// name is wrong), or it could not be reached (it may be down).
pub enum Failure {
    Refused(anyhow::Error),
    Unreachable(String),
}

/// Sends `req` to `addr` and returns the answer's frame.
pub fn request<Q: Message>(t: &Target, addr: SocketAddr, req: &Q, timeout: Duration) -> Result<Frame, Failure> {
    let mut c = connected(t, addr, timeout)?;
    c.send(req).and_then(|()| c.recv()).map_err(|e| failure(addr, e))
}

/// An authenticated connection to `addr`, or why there is none.
pub fn connected(t: &Target, addr: SocketAddr, timeout: Duration) -> Result<BlockingClient, Failure> {
    connect(t, addr, timeout).map_err(|e| failure(addr, e))
}

/// What `e` from `addr` means: a refusal of this client (fatal), or no answer.
pub fn failure(addr: SocketAddr, e: ClientError) -> Failure {
    match &e {
        ClientError::Closed {
            code: code @ (CloseCode::AuthFailed | CloseCode::Forbidden | CloseCode::ClusterMismatch),
            message,
            ..
        } => Failure::Refused(anyhow::anyhow!("{addr} refused this client: {message} ({})", refusal_hint(code))),
        ClientError::Handshake { reason, .. } => Failure::Refused(anyhow::anyhow!(
            "{addr} refused this client: {reason} ({})",
            refusal_hint(&CloseCode::AuthFailed)
        )),
        _ => Failure::Unreachable(e.to_string()),
    }
}

/// `addr`'s status of `stream` (`None`: its first stream's, with every stream's tasks):
/// `Ok(Err(why))` when it cannot be reached.
pub fn status_of(
    t: &Target,
    addr: SocketAddr,
    stream: Option<StreamId>,
    timeout: Duration,
) -> anyhow::Result<Result<StatusRsp, String>> {
    match request(t, addr, &StatusReq { request: 1, stream }, timeout) {
        Ok(f) => Ok(f.to_owned::<StatusRsp>().map_err(|e| format!("{addr} answered, not with a status: {e}"))),
        Err(Failure::Refused(e)) => Err(e),
        Err(Failure::Unreachable(why)) => Ok(Err(why)),
    }
}

/// A stream as a command names it (`--stream`): its id, or its name in the stream catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamRef {
    Id(u64),
    Name(String),
}

/// `--stream`'s parser: digits are an id, anything else a name.
pub fn parse_stream_ref(s: &str) -> Result<StreamRef, String> {
    if let Ok(id) = s.parse() {
        return Ok(StreamRef::Id(id));
    }
    if weir_engine::wire::msg::valid_stream_name(s) {
        return Ok(StreamRef::Name(s.into()));
    }
    Err(format!("{s:?} is neither a stream id nor a stream name (letters, digits, '-', '_', starting with a letter)"))
}

/// The catalog entry of `r`, as the first node of the target that answers has it: `None` for
/// an id the catalog does not list, or when no node keeps a catalog (an error for a name).
pub fn catalog_entry(t: &Target, r: &StreamRef, timeout: Duration) -> anyhow::Result<Option<StreamEntry>> {
    let mut why = Vec::new();
    for addr in &t.nodes {
        match request(t, *addr, &CatalogReq { request: 1, name: String::new() }, timeout) {
            Ok(f) => {
                let rsp = f.to_owned::<CatalogRsp>().with_context(|| format!("{addr} answered, not with a catalog"))?;
                let named = |e: &StreamEntry| match r {
                    StreamRef::Id(id) => e.id.0 == *id,
                    StreamRef::Name(n) => e.name == *n,
                };
                // A name dropped and created again: the stream kept, not the one dropping.
                let kept = rsp.streams.iter().position(|e| named(e) && e.state.is_kept());
                let found = kept.or_else(|| rsp.streams.iter().position(named)).map(|i| rsp.streams[i].clone());
                return match (found, r, rsp.refused) {
                    (Some(e), _, _) => Ok(Some(e)),
                    // Unavailable here (etcd, a node stopping): another node may answer.
                    (None, _, Some(CatalogRefusal::Unavailable { reason })) => {
                        why.push(format!("{addr}: {reason}"));
                        continue;
                    }
                    (None, StreamRef::Id(_), _) => Ok(None),
                    (None, StreamRef::Name(n), Some(CatalogRefusal::Invalid { reason })) => {
                        anyhow::bail!("cannot look stream {n} up: {reason}")
                    }
                    (None, StreamRef::Name(n), None) => {
                        anyhow::bail!("no stream named {n} (`weir stream list` shows them)")
                    }
                };
            }
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Unreachable(e)) => why.push(format!("{addr}: {e}")),
        }
    }
    match r {
        StreamRef::Id(id) => {
            tracing::warn!(
                stream = id,
                "the stream catalog could not be read ({}); taking the id as it is",
                why.join("; ")
            );
            Ok(None)
        }
        StreamRef::Name(n) => anyhow::bail!("cannot look stream {n} up: no node answered ({})", why.join("; ")),
    }
}

/// The id `r` names and its catalog entry, from one lookup (`None`: an id the catalog does
/// not list, or no node keeps a catalog).
pub fn resolve(t: &Target, r: &StreamRef, timeout: Duration) -> anyhow::Result<(u64, Option<StreamEntry>)> {
    let entry = catalog_entry(t, r, timeout)?;
    match (r, entry) {
        (_, Some(e)) => Ok((e.id.0, Some(e))),
        (StreamRef::Id(id), None) => Ok((*id, None)),
        (StreamRef::Name(n), None) => anyhow::bail!("no stream named {n}"),
    }
}

/// The id `r` names: an id as it is, a name looked up in the catalog.
pub fn stream_id(t: &Target, r: &StreamRef, timeout: Duration) -> anyhow::Result<u64> {
    match r {
        StreamRef::Id(id) => Ok(*id),
        StreamRef::Name(n) => Ok(catalog_entry(t, r, timeout)?.with_context(|| format!("no stream named {n}"))?.id.0),
    }
}
