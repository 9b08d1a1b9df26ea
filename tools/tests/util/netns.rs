//! Network namespaces for partition tests (needs root and `ip`, from iproute2): each node in
//! its own namespace, linked by a veth pair to one bridge in the test's namespace, where the
//! test's etcd members and clients live. Cutting a node takes its link down: it can reach no
//! other node and no etcd member, and none can reach it, until the link is up again. Cutting
//! nodes from each other alone drops their packets to each other silently (a false hardware
//! address: this needs no firewall or traffic-control module). Everything is removed when the
//! [`Net`] is dropped.

use std::process::Command;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("`ip` runs (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A bridge and the namespaces of the nodes on it.
pub struct Net {
    tag: String,
    subnet: String,
    nodes: Vec<u32>,
}

impl Net {
    /// A bridge for nodes `nodes`, on a /24 of 10.x.y.0 of its own; the test's side is `.1`.
    pub fn new(nodes: &[u32]) -> Net {
        let pid = std::process::id();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let tag = format!("{:05}", (pid ^ nanos) % 100_000);
        let subnet = format!("10.{}.{}", 100 + (pid % 100), (nanos / 1000) % 250 + 1);
        let net = Net { tag, subnet, nodes: Vec::new() };
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}.1/24", net.subnet), "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        let mut net = net;
        for n in nodes {
            net.add(*n);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("wb{}", self.tag)
    }

    fn ns(&self, node: u32) -> String {
        format!("wn{}-{node}", self.tag)
    }

    fn host_end(&self, node: u32) -> String {
        format!("wv{}{node}h", self.tag)
    }

    fn inner_end(&self, node: u32) -> String {
        format!("wv{}{node}n", self.tag)
    }

    fn add(&mut self, node: u32) {
        let (ns, host, inner) = (self.ns(node), self.host_end(node), self.inner_end(node));
        ip(&["netns", "add", &ns]);
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner]);
        ip(&["link", "set", &inner, "netns", &ns]);
        ip(&["link", "set", &host, "master", &self.bridge()]);
        ip(&["link", "set", &host, "up"]);
        ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{}/24", self.addr(node)), "dev", &inner]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", &inner, "up"]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        self.nodes.push(node);
    }

    /// The test's address on the bridge (etcd members and clients listen and dial from it).
    pub fn host(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// Node `node`'s address.
    pub fn addr(&self, node: u32) -> String {
        format!("{}.{}", self.subnet, 10 + node)
    }

    /// A command run in node `node`'s namespace.
    pub fn command(&self, node: u32, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(node)]).arg(program);
        c
    }

    /// Cuts node `node` off from everything on the bridge.
    pub fn cut(&self, node: u32) {
        ip(&["link", "set", &self.host_end(node), "down"]);
    }

    /// Links node `node` again.
    pub fn heal(&self, node: u32) {
        ip(&["link", "set", &self.host_end(node), "up"]);
    }

    /// Cuts node `node` off from the other nodes alone: the etcd members and clients on the
    /// bridge still reach it. Packets are dropped silently, as on a lost link: no error and no
    /// reset, so TCP retransmits until it times out.
    pub fn cut_peers(&self, node: u32) {
        self.peer_routes(node, "add");
    }

    /// Undoes [`Self::cut_peers`].
    pub fn heal_peers(&self, node: u32) {
        self.peer_routes(node, "del");
    }

    fn peer_routes(&self, node: u32, op: &str) {
        let others: Vec<u32> = self.nodes.iter().copied().filter(|n| *n != node).collect();
        self.routes(&[node], &others, op);
    }

    /// Splits the nodes into `a` and `b`, which no longer reach each other; the etcd members
    /// and clients on the bridge still reach all.
    pub fn split(&self, a: &[u32], b: &[u32]) {
        self.routes(a, b, "add");
    }

    /// Undoes [`Self::split`].
    pub fn heal_split(&self, a: &[u32], b: &[u32]) {
        self.routes(a, b, "del");
    }

    /// Each node of `a` and each of `b` send each other's packets to a hardware address no
    /// interface has (the bridge floods them and every node drops them: none is theirs); `del`
    /// forgets that, so the real one is asked for.
    fn routes(&self, a: &[u32], b: &[u32], op: &str) {
        for (x, y) in a.iter().flat_map(|x| b.iter().map(move |y| (*x, *y))) {
            for (from, to) in [(x, y), (y, x)] {
                let (ns, dev, to) = (self.ns(from), self.inner_end(from), self.addr(to));
                match op {
                    "add" => ip(&[
                        "netns",
                        "exec",
                        &ns,
                        "ip",
                        "neigh",
                        "replace",
                        &to,
                        "lladdr",
                        "02:00:00:00:00:01",
                        "dev",
                        &dev,
                        "nud",
                        "permanent",
                    ]),
                    _ => ip(&["netns", "exec", &ns, "ip", "neigh", "del", &to, "dev", &dev]),
                }
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.nodes {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(*n)]).output();
            let _ = Command::new("ip").args(["link", "del", &self.host_end(*n)]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge()]).output();
    }
}
