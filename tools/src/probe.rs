//! How a node that gave up its membership (cut off from the other members while it reaches
//! etcd, `weir_engine::cluster::reach`) learns that it reaches them again: it connects to their
//! transport ports, at most once a second. A TCP handshake is proof enough of a path; its own
//! transport serves clients only meanwhile, and the others no longer dial a node without tasks.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use weir_engine::wire::NodeId;
use weir_engine::wire::msg::PeerLink;

use crate::config::ClusterFile;

/// The links to the other nodes as the last probes found them.
pub struct Probe {
    addrs: BTreeMap<NodeId, SocketAddr>,
    links: BTreeMap<NodeId, PeerLink>,
    last: Option<Instant>,
}

impl Probe {
    /// Probes of the nodes of `file` other than `me`, starting from `links` (the engine's last).
    pub fn new(file: &ClusterFile, me: NodeId, links: &[PeerLink]) -> Self {
        let addrs = file.nodes.iter().filter(|n| n.id != me.0).map(|n| (NodeId(n.id), n.addr)).collect();
        let links = links.iter().map(|l| (l.node, l.clone())).collect();
        Self { addrs, links, last: None }
    }

    /// The links, probing every node again if the last probes are a second old. A link that
    /// stays down keeps the time it went down.
    pub fn links(&mut self, now_ms: u64) -> Vec<PeerLink> {
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.last = Some(Instant::now());
            for (node, addr) in &self.addrs {
                let up = TcpStream::connect_timeout(addr, Duration::from_millis(300)).is_ok();
                let was = self.links.get(node);
                let since_ms = match was {
                    Some(l) if l.up == up && l.since_ms > 0 => l.since_ms,
                    _ => now_ms,
                };
                let reason = if up { String::new() } else { format!("no connection to {addr}") };
                self.links.insert(*node, PeerLink { node: *node, up, since_ms, reason });
            }
        }
        self.links.values().cloned().collect()
    }
}
