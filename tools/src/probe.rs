//! Whether this node reaches the other nodes: a thread connects to each one's transport port
//! once a second (a TCP handshake is proof enough of a path, and a node between two runs of
//! its stream still listens there). The transport's own links say less: a link to a node that
//! was lost a moment ago is redialed with a backoff, so it can be down while the path is whole.
//!
//! Invariant: a link is reported up only after two handshakes in a row (a path that flaps does
//! not end a node's withholding), and down since the first failed one.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_engine::wire::NodeId;
use weir_engine::wire::msg::PeerLink;

use crate::config::ClusterFile;

/// The links as the probes found them, and how many handshakes in a row each one made.
type Found = BTreeMap<NodeId, (PeerLink, u32)>;

/// The probing thread; dropping it stops it.
pub struct Prober {
    found: Arc<Mutex<Found>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Prober {
    /// Probes the nodes of `file` other than `me`.
    pub fn start(file: &ClusterFile, me: NodeId) -> std::io::Result<Self> {
        let addrs: Vec<(NodeId, SocketAddr)> =
            file.nodes.iter().filter(|n| n.id != me.0).map(|n| (NodeId(n.id), n.addr)).collect();
        let found: Arc<Mutex<Found>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (found.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("weir-probe".into()).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                for (node, addr) in &addrs {
                    let ok = TcpStream::connect_timeout(addr, Duration::from_millis(300)).is_ok();
                    let mut found = f.lock().unwrap_or_else(|e| e.into_inner());
                    let (link, streak) = found.entry(*node).or_insert_with(|| {
                        (PeerLink { node: *node, up: false, since_ms: now_ms(), reason: String::new() }, 0)
                    });
                    *streak = if ok { *streak + 1 } else { 0 };
                    let up = *streak >= 2;
                    if up != link.up {
                        (link.up, link.since_ms) = (up, now_ms());
                    }
                    link.reason = if ok { String::new() } else { format!("no connection to {addr}") };
                }
                while !s.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(1) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })?;
        Ok(Self { found, stop, thread: Some(thread) })
    }

    /// The links as the last probes found them (none before the first).
    pub fn links(&self) -> Vec<PeerLink> {
        self.view().links()
    }

    /// What the probes find, readable after this is dropped (for status).
    pub fn view(&self) -> ProbeView {
        ProbeView(self.found.clone())
    }
}

/// What a [`Prober`] finds, shared.
#[derive(Clone)]
pub struct ProbeView(Arc<Mutex<Found>>);

impl ProbeView {
    /// The links as the last probes found them (none before the first).
    pub fn links(&self) -> Vec<PeerLink> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).values().map(|(l, _)| l.clone()).collect()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
