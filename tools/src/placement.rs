//! A node's view of the cluster's control: its membership (on etcd when the file has a
//! `[control]` table), where the stream's placement is read and written, and the watch that
//! moves a lost node's tasks. The decisions are the engine's (`weir_engine::cluster`); this
//! module opens what they run on and feeds them the node's links and clock.
//!
//! The elected leader decides moves, for nodes whose membership (lease) has been gone longer
//! than `restart.move_after`, and a node that cannot renew its lease stops acting as a member.
//! A node alone (a file of one node, without `[control]`) is always a member and moves nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use weir_engine::backup::commit_point::{CommitBook, StoreCommits};
use weir_engine::cluster::{
    Agent, ControlBook, ControlCommits, ControlInSync, Fence, Keys, Member, MemberStatus, Moved, Mover, PlacementBook,
    Versioned,
};
use weir_engine::control::{ControlStore, EtcdControl};
use weir_engine::spec::{Placement, StreamSpec};
use weir_engine::wire::NodeId;
use weir_engine::wire::msg::PeerLink;

use crate::config::ClusterFile;

/// What a node holds as a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// A node alone, without etcd: it is a member for as long as it runs.
    Always,
    /// This lease in etcd: a new lease is a new membership (the old one ended, and the
    /// others may have moved its tasks).
    Lease(weir_engine::control::LeaseId),
}

/// The node's cluster control.
pub struct Control {
    me: NodeId,
    nodes: Vec<NodeId>,
    /// Membership on etcd, if the file has `[control]`.
    agent: Option<Arc<Agent>>,
    book: Option<Arc<dyn PlacementBook>>,
    /// What status says of the membership.
    status: Option<Arc<NodeMember>>,
    /// The control store and the cluster's keys in it, with etcd.
    etcd: Option<(Arc<dyn ControlStore>, Keys)>,
    /// The lease's TTL (zero without etcd).
    lease: Duration,
    /// Whether this node reaches most of the other members by its probes now (true until the
    /// probes say otherwise): only then may it write a late copy out of an in-sync set.
    may_leave: Arc<std::sync::atomic::AtomicBool>,
}

/// A node's membership for status: the agent's view, the placement version last read, the
/// placement writes etcd refused.
struct NodeMember {
    agent: Arc<Agent>,
    book: Arc<ControlBook>,
    placement: AtomicU32,
    /// The probes of the other nodes, once they run.
    probes: std::sync::OnceLock<crate::probe::ProbeView>,
    /// The stream's in-sync sets as etcd holds them, once read.
    in_sync: std::sync::OnceLock<weir_engine::cluster::InSyncView>,
}

impl std::fmt::Debug for NodeMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeMember").field("placement", &self.placement).finish()
    }
}

impl MemberStatus for NodeMember {
    fn member_info(&self) -> weir_engine::wire::msg::MemberInfo {
        let mut info =
            self.agent.view().info(Instant::now(), self.placement.load(Ordering::Relaxed), self.book.refused());
        info.withheld = self.agent.withholding();
        if let Some(p) = self.probes.get() {
            info.unreachable = p.links().into_iter().filter(|l| !l.up).map(|l| l.node).collect();
        }
        if let Some(v) = self.in_sync.get() {
            info.in_sync = v.entries();
            info.in_sync_age_ms = v.age().map_or(0, |a| a.as_millis() as u64);
        }
        info
    }
}

impl Control {
    /// Opens the file's control for node `me`: joins etcd's membership (`[control]`; a file of
    /// several nodes has one, `ClusterFile::validate`), or none for a node alone.
    pub fn open(file: &ClusterFile, me: NodeId) -> anyhow::Result<Self> {
        let nodes: Vec<NodeId> = file.nodes.iter().map(|n| NodeId(n.id)).collect();
        let Some(c) = &file.control else {
            return Ok(Self {
                me,
                nodes,
                agent: None,
                book: None,
                status: None,
                etcd: None,
                lease: Duration::ZERO,
                may_leave: Arc::new(true.into()),
            });
        };
        let etcd = EtcdControl::connect(&c.etcd, c.timeout)
            .with_context(|| format!("node {}: cannot reach etcd at {} (control.etcd)", me.0, c.etcd.join(",")))?;
        Self::on(file, me, Arc::new(etcd))
    }

    /// The file's control for node `me` on the control store `etcd` (the file's `[control]`).
    pub fn on(file: &ClusterFile, me: NodeId, etcd: Arc<dyn ControlStore>) -> anyhow::Result<Self> {
        let nodes: Vec<NodeId> = file.nodes.iter().map(|n| NodeId(n.id)).collect();
        let c = file.control.as_ref().context("no [control] table")?;
        let keys = Keys::new(&file.cluster);
        let member = Member::new(keys.clone(), me, &nodes, c.lease);
        let agent = Arc::new(Agent::start(etcd.clone(), member, c.lease).context("starting the membership thread")?);
        // The first round, so that a healthy start does not go through the wait for a lease.
        let t0 = Instant::now();
        while agent.view().stepped.is_none() && t0.elapsed() < c.lease {
            std::thread::sleep(Duration::from_millis(10));
        }
        let book = Arc::new(ControlBook::new(etcd.clone(), keys.clone()));
        let status = Arc::new(NodeMember {
            agent: agent.clone(),
            book: book.clone(),
            placement: AtomicU32::new(0),
            probes: std::sync::OnceLock::new(),
            in_sync: std::sync::OnceLock::new(),
        });
        let book = Some(book as Arc<dyn PlacementBook>);
        let lease = c.lease;
        Ok(Self {
            me,
            nodes,
            agent: Some(agent),
            book,
            status: Some(status),
            etcd: Some((etcd, keys)),
            lease,
            may_leave: Arc::new(true.into()),
        })
    }

    /// Where a run under `held`, at the placement read as `read`, keeps the stream's checkpoint
    /// ids and commit point: with etcd, its key, written only while the run's lease and
    /// placement stand (`None` without etcd: the remote store alone).
    pub fn commit_book(&self, spec: &StreamSpec, held: Membership, read: &Versioned) -> Option<Arc<dyn CommitBook>> {
        let (etcd, keys, fence) = self.fenced(spec, held, read)?;
        Some(Arc::new(ControlCommits::new(etcd, keys, spec.id, fence)))
    }

    /// Where a run under `held`, at the placement read as `read`, writes the in-sync sets of the
    /// partitions whose primary it is (`None` without etcd).
    pub fn in_sync(&self, spec: &StreamSpec, held: Membership, read: &Versioned) -> Option<Arc<ControlInSync>> {
        let (etcd, keys, fence) = self.fenced(spec, held, read)?;
        Some(Arc::new(ControlInSync::new(etcd, keys, spec.id, self.me, fence)))
    }

    /// The store, the keys and the fence of this node's run under `held` at the placement read
    /// as `read` (`None` without etcd).
    fn fenced(
        &self,
        spec: &StreamSpec,
        held: Membership,
        read: &Versioned,
    ) -> Option<(Arc<dyn ControlStore>, &Keys, Fence)> {
        let (etcd, keys) = self.etcd.as_ref()?;
        let Membership::Lease(lease) = held else { return None };
        Some((etcd.clone(), keys, Fence::new(keys, spec.id, self.me, lease, read.revision)))
    }

    /// What the node holds as a member now (`None`: nothing; it must not act as one).
    pub fn membership(&self) -> Option<Membership> {
        match &self.agent {
            None => Some(Membership::Always),
            Some(a) => a.holding(Instant::now()).map(Membership::Lease),
        }
    }

    /// Whether the node may act as a member now.
    pub fn holds(&self) -> bool {
        self.membership().is_some()
    }

    /// The hold of membership `held`, for an engine run under it (which acknowledges nothing
    /// without it): `None` without etcd, `Some(None)` when the node no longer holds `held`.
    pub fn tenure_for(&self, held: Membership) -> Option<Option<Arc<weir_engine::cluster::Tenure>>> {
        match (held, &self.agent) {
            (Membership::Lease(lease), Some(agent)) => Some(agent.tenure_for(lease)),
            _ => None,
        }
    }

    /// Gives up the node's membership while it reaches etcd but is on the smaller side of a
    /// split of the members (`links`, the probes', down for `after` or longer, and at least
    /// the lease and a third: a node that died keeps its member key that long), so that it
    /// runs nothing and the leader moves its tasks; takes it again once it is not
    /// (`weir_engine::cluster::reach`). Nothing without etcd, or with `after` zero.
    pub fn check_reach(&self, links: &[PeerLink], now_ms: u64, after: Duration) {
        let Some(agent) = self.agent.as_ref().filter(|_| !after.is_zero()) else { return };
        let present = agent.view().present;
        // Cut off by the probes as they are now (no waiting): no late copy is written out.
        let isolated = weir_engine::cluster::reach::cut_off(self.me, &present, links, now_ms, Duration::ZERO);
        self.may_leave.store(!isolated, std::sync::atomic::Ordering::Release);
        let after = after.max(self.lease + self.lease / 3);
        let cut = weir_engine::cluster::reach::cut_off(self.me, &present, links, now_ms, after);
        if cut != agent.withholding() {
            let gone = weir_engine::cluster::reach::unreachable(&present, links, now_ms, after);
            let gone: Vec<String> = gone.iter().map(|n| n.0.to_string()).collect();
            if cut {
                tracing::warn!(
                    node = self.me.0, unreachable = %gone.join(","),
                    "this node reaches etcd but not most of the other members: it gives up its membership, so that its tasks move"
                );
            } else {
                tracing::info!(node = self.me.0, "this node reaches the other members again: it takes a membership");
            }
            agent.withhold(cut);
        }
    }

    /// Whether this node may write a late copy out of an in-sync set now ([`Self::check_reach`]).
    pub fn may_leave(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.may_leave.clone()
    }

    /// Status shows what `probes` find.
    pub fn show_probes(&self, probes: crate::probe::ProbeView) {
        if let Some(s) = &self.status {
            let _ = s.probes.set(probes);
        }
    }

    /// Status shows stream `stream`'s in-sync sets as etcd holds them, read once a second by a
    /// thread of their own (nothing without etcd).
    pub fn show_in_sync(&self, stream: weir_engine::wire::StreamId) -> anyhow::Result<()> {
        if let (Some(s), Some((etcd, keys))) = (&self.status, &self.etcd) {
            let view = weir_engine::cluster::InSyncView::start(etcd.clone(), keys, stream, Duration::from_secs(1))
                .context("starting the thread that reads the in-sync sets")?;
            let _ = s.in_sync.set(view);
        }
        Ok(())
    }

    /// Whether the node gave up its membership ([`Self::check_reach`]).
    pub fn withholding(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.withholding())
    }

    /// The control store and the cluster's keys in it (`None` without etcd).
    pub fn store_and_keys(&self) -> Option<(Arc<dyn ControlStore>, Keys)> {
        self.etcd.clone()
    }

    /// The stream catalog in etcd (`None` without etcd: a node alone keeps its own).
    pub fn catalog(&self) -> Option<weir_engine::cluster::catalog::ControlCatalog> {
        self.etcd.as_ref().map(|(store, keys)| weir_engine::cluster::catalog::ControlCatalog::new(store.clone(), keys))
    }

    /// What status says of the node's membership (`None` without etcd).
    pub fn member_status(&self) -> Option<Arc<dyn MemberStatus>> {
        self.status.clone().map(|s| s as Arc<dyn MemberStatus>)
    }

    /// Why the node cannot go on at all: etcd refused it from the start (not an etcd, no
    /// permission), or its membership thread died. Refusals after a first round that succeeded
    /// are taken as passing (a lease that ended between two calls, say): the rounds go on.
    pub fn fatal(&self) -> Option<String> {
        let v = self.agent.as_ref()?.view();
        if v.dead {
            return Some(format!("node {}: its membership thread ended", self.me.0));
        }
        v.error.filter(|e| !e.is_retryable() && v.rounds == 0).map(|e| format!("node {}: {e}", self.me.0))
    }

    /// Why the node does not hold its membership (the last error talking to etcd).
    pub fn why_not(&self) -> String {
        if self.withholding() {
            return format!("node {} gave up its membership: it reaches too few of the other members", self.me.0);
        }
        let err = self.agent.as_ref().and_then(|a| a.view().error);
        match err {
            Some(e) => format!("node {} holds no lease in etcd: {e}", self.me.0),
            None => format!("node {} holds no lease in etcd yet", self.me.0),
        }
    }

    /// The placement the stream runs at now: the newest version (a move of a lost node's
    /// tasks), else the file's (version 0).
    pub fn current_placement(&self, spec: &StreamSpec, file: &Placement) -> anyhow::Result<(Versioned, Placement)> {
        let none = Versioned { record: None, revision: 0 };
        let Some(book) = &self.book else { return Ok((none, file.clone())) };
        let read = book.latest(spec.id).with_context(|| format!("reading stream {}'s placement", spec.id.0))?;
        if let Some(s) = &self.status {
            s.placement.store(read.version(), Ordering::Relaxed);
        }
        let Some(r) = &read.record else { return Ok((read, file.clone())) };
        let topology = spec.topology();
        let p = match r.placement(&topology) {
            Ok(p) => p,
            // A record of the stream before a rescale: its sources stay where it put them (their
            // partitions' logs are there), the new aggs and sinks go as the file places them.
            Err(e) if r.tasks.keys().any(|t| topology.task(*t).is_none()) => {
                tracing::info!(stream = spec.id.0, record = r.version, reason = %e, "a placement of the stream before its rescale: its sources stay, the rest is placed anew");
                let mut p = file.clone();
                for t in topology.tasks.iter().filter(|t| matches!(t.kind, weir_engine::spec::TaskKind::Source { .. }))
                {
                    if let Some(n) = r.tasks.get(&t.id) {
                        p.assign(t.id, *n);
                    }
                }
                p
            }
            Err(e) => anyhow::bail!("stream {}: {e}", spec.id.0),
        };
        if let Some(n) = p.nodes(&topology).into_iter().find(|n| !self.nodes.contains(n)) {
            anyhow::bail!(
                "stream {}: placement version {} puts tasks on node {}, which the config file does not list \
                 (stop the cluster and delete the key {} in etcd to start from the file's placement)",
                spec.id.0,
                r.version,
                n.0,
                self.etcd.as_ref().map_or(String::new(), |(_, k)| k.placement(spec.id))
            );
        }
        Ok((read, p))
    }

    /// The watch that moves lost nodes' tasks for the run at `placement` (read as `read`), or
    /// `None` when nothing can move (a node alone, or `move_after` is zero).
    pub fn watch(
        &self,
        spec: &StreamSpec,
        placement: &Placement,
        read: Versioned,
        file: &ClusterFile,
    ) -> Option<Watch<'_>> {
        let book = self.book.as_deref()?;
        let after = file.restart.move_after;
        if after.is_zero() {
            return None;
        }
        let ingest = &file.stream.ingest;
        let mut mover = Mover::new(spec, placement, read, ingest.replicas);
        if let Some((etcd, keys)) = self.etcd.as_ref().filter(|_| ingest.replicas >= 2) {
            mover = mover.with_in_sync(ControlInSync::reader(etcd.clone(), keys, spec.id));
        }
        Some(Watch { control: self, book, mover, after, checked: None })
    }
}

/// Checks, a few times a second, whether a lost node's tasks should move, and stores the move.
pub struct Watch<'a> {
    control: &'a Control,
    book: &'a dyn PlacementBook,
    mover: Mover,
    after: Duration,
    checked: Option<Instant>,
}

impl Watch<'_> {
    /// One check (at most every 200 ms): the move stored, if this node leads and decided one.
    pub fn check(&mut self) -> Option<Moved> {
        let now = Instant::now();
        if self.checked.is_some_and(|t| now.duration_since(t) < Duration::from_millis(200)) {
            return None;
        }
        self.checked = Some(now);
        let c = self.control;
        let view = c.agent.as_ref()?.view();
        if !view.leads(now) {
            return None;
        }
        let lost = view.absent.overdue(self.after, now);
        let to: Vec<NodeId> = c.nodes.iter().copied().filter(|n| !view.absent.is_absent(*n)).collect();
        self.mover.check(self.book, &lost, &to, view.fence.as_ref())
    }
}

/// Where a client reads stream `stream`'s last commit: the control store's key when the file
/// has a `[control]` table (etcd names the commit; records above it are none), else the remote
/// store's records.
pub fn commit_reader(file: &ClusterFile, stream: weir_engine::wire::StreamId) -> anyhow::Result<Arc<dyn CommitBook>> {
    let Some(c) = &file.control else { return Ok(Arc::new(StoreCommits::new(stream))) };
    let etcd = EtcdControl::connect(&c.etcd, c.timeout)
        .with_context(|| format!("cannot reach etcd at {} (control.etcd)", c.etcd.join(",")))?;
    Ok(Arc::new(ControlCommits::reader(Arc::new(etcd), &Keys::new(&file.cluster), stream)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::cluster::PlacementRecord;
    use weir_engine::control::MemControl;
    use weir_engine::wire::StreamId;

    fn file(nodes: &[u32]) -> ClusterFile {
        let mut text = String::from(
            "cluster = \"c\"\n[stream]\nid = 1\npartitions = 3\naggs = 3\nsinks = 3\n\
             [control]\netcd = [\"http://127.0.0.1:1\"]\n",
        );
        for n in nodes {
            text.push_str(&format!("[[nodes]]\nid = {n}\naddr = \"127.0.0.1:{}\"\n", 7100 + n));
        }
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn the_newest_placement_version_wins_and_one_naming_an_unlisted_node_is_refused() {
        let etcd: Arc<dyn ControlStore> = Arc::new(MemControl::new());
        let spec = StreamSpec::generator(StreamId(1), 3, 3, 3);
        let t = spec.topology();
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        let three = Control::on(&file(&[1, 2, 3]), n1, etcd.clone()).unwrap();
        let spread = Placement::spread(&t, &[n1, n2, n3]);
        let (v, p) = three.current_placement(&spec, &spread).unwrap();
        assert_eq!((v.version(), p), (0, spread.clone()), "no version stored: the file's placement");
        let moved = spread.moved(&t, &[n3], &[n1, n2]);
        let record = PlacementRecord::new(1, &t, &moved, vec![n3], "node 3 lost");
        let value = weir_engine::cluster::record::encode_placement(&record).into_bytes();
        let put = weir_engine::control::Op::Put { key: Keys::new("c").placement(spec.id), value, lease: None };
        etcd.txn(&[], &[put]).unwrap();
        let (v, p) = three.current_placement(&spec, &spread).unwrap();
        assert_eq!((v.version(), p.tasks_of(&t)), (1, moved.tasks_of(&t)));
        // The file no longer lists node 2, which the stored version gives tasks.
        let two = Control::on(&file(&[1, 3]), n1, etcd).unwrap();
        let e = two.current_placement(&spec, &spread).unwrap_err().to_string();
        assert!(e.contains("puts tasks on node 2") && e.contains("delete the key /weir/c/streams/1/placement"), "{e}");
    }
}
