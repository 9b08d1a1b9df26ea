//! Several streams on the same nodes ([`Node`] and [`Engine::start_on`]): each stream's channels,
//! checkpoints and results are its own, one stops while the other runs, and a stream restarts
//! under running nodes at a greater epoch, fencing its earlier run.

mod util;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::operator::window::WindowResult;
use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig, EngineError, Node};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::state::NodeResults;
use weir_engine::wire::transport::PeerConfig;
use weir_engine::wire::{Epoch, NodeId, StreamId};

use util::ckpt::{spec_at, transport, wait_for_commits, wait_restored};

/// Nodes 1 and 2, connected, with no stream.
fn two_nodes() -> (Arc<Node>, Arc<Node>) {
    let n1 = Arc::new(Node::start(transport(1, vec![PeerConfig { node: NodeId(2), addr: None }])).unwrap());
    let peer = PeerConfig { node: NodeId(1), addr: n1.transport_addr() };
    let n2 = Arc::new(Node::start(transport(2, vec![peer])).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(n1.connected().contains(&NodeId(2)) && n2.connected().contains(&NodeId(1))) {
        assert!(Instant::now() < deadline, "nodes 1 and 2 did not connect in 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    (n1, n2)
}

/// `spec` as stream `id`, its generator seeded apart (so a mix-up of two streams' rows shows).
fn stream(id: u64, rows: u64, rate: u64) -> StreamSpec {
    let mut s = spec_at(rows, rate);
    s.id = StreamId(id);
    if let SourceKind::Generator { spec, .. } = &mut s.source {
        spec.seed = id;
    }
    s
}

/// The data directory of `spec` on node `n` under `root`.
fn dir(root: &Path, spec: &StreamSpec, n: u32) -> PathBuf {
    root.join(format!("s{}/node-{n}", spec.id.0))
}

/// Starts the run of `spec` at `epoch` on `node` (node `n`), spread over nodes 1 and 2,
/// checkpointing every 100 ms into `remote`.
fn run_on(
    node: &Arc<Node>,
    n: u32,
    spec: &StreamSpec,
    epoch: u64,
    root: &Path,
    remote: &Path,
) -> Result<Engine, EngineError> {
    run_with(node, n, spec, epoch, root, remote, |_| {})
}

/// [`run_on`], its config changed by `tweak` first.
fn run_with(
    node: &Arc<Node>,
    n: u32,
    spec: &StreamSpec,
    epoch: u64,
    root: &Path,
    remote: &Path,
    tweak: impl FnOnce(&mut EngineConfig),
) -> Result<Engine, EngineError> {
    let placement = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2)]);
    let mut cfg = EngineConfig::new(NodeId(n), dir(root, spec, n));
    cfg.pin_workers = false;
    cfg.epoch = Some(Epoch(epoch));
    let mut ck = CheckpointSettings::every(100, remote);
    ck.min_pause_ms = 0;
    cfg.checkpoint = Some(ck);
    tweak(&mut cfg);
    Engine::start_on(node, spec, &placement, cfg)
}

/// Starts `spec` (at epoch 0) on node 1, then on node 2 (both connected already).
fn start_both(nodes: &(Arc<Node>, Arc<Node>), spec: &StreamSpec, root: &Path, remote: &Path) -> (Engine, Engine) {
    start_apart(nodes, spec, 0, root, remote, |_| {})
}

/// [`start_both`] at `epoch`, `between` called between the starts.
fn start_apart(
    nodes: &(Arc<Node>, Arc<Node>),
    spec: &StreamSpec,
    epoch: u64,
    root: &Path,
    remote: &Path,
    between: impl FnOnce(&Engine),
) -> (Engine, Engine) {
    let e1 = run_on(&nodes.0, 1, spec, epoch, root, remote).unwrap();
    between(&e1);
    (e1, run_on(&nodes.1, 2, spec, epoch, root, remote).unwrap())
}

/// Waits (at most 30 s) until both engines have restored their tasks.
fn wait_both_restored(e1: &Engine, e2: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while e1.restored().is_none() || e2.restored().is_none() {
        assert!(Instant::now() < deadline, "the stream did not restore in 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts that `e`'s tasks restored a committed checkpoint (its commit record's).
fn restored_the_commit(e: &Engine) {
    let basis = weir_engine::wire::msg::RestoreBasis::Committed;
    assert!(matches!(e.restored(), Some((r, Some(_))) if r == basis), "{:?}", e.restored());
}

/// Both nodes' results of `spec`, in (key, start) order.
fn results(spec: &StreamSpec, root: &Path) -> Vec<WindowResult> {
    let mut got: Vec<WindowResult> =
        (1..=2).flat_map(|n| NodeResults::open(&dir(root, spec, n)).unwrap().scan(spec.id).unwrap()).collect();
    got.sort_by_key(|r| (r.key, r.start));
    got
}

/// Waits (at most a minute) until both engines have run `spec` to its end.
fn wait_both(e1: Engine, e2: Engine) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(e1.is_finished() && e2.is_finished()) {
        assert!(Instant::now() < deadline, "the stream did not end in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (h1, h2) = (std::thread::spawn(move || e1.wait()), std::thread::spawn(move || e2.wait()));
    h1.join().unwrap().unwrap();
    h2.join().unwrap().unwrap();
}

#[test]
fn two_streams_share_two_nodes_and_one_stopped_mid_stream_leaves_the_other_exact() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let nodes = two_nodes();
    // About 15 s of stream for `a` (stopped long before its end), 4 s for `b`.
    let (a, b) = (stream(11, 300_000, 20_000), stream(12, 200_000, 50_000));
    let (a1, a2) = start_both(&nodes, &a, root.path(), remote.path());
    let (b1, b2) = start_both(&nodes, &b, root.path(), remote.path());
    // One run of a stream at a time on a node, and a new run takes a greater epoch.
    let refused = |spec: &StreamSpec, epoch: u64, because: &str| match run_on(
        &nodes.0,
        1,
        spec,
        epoch,
        &root.path().join("again"),
        remote.path(),
    ) {
        Err(EngineError::Config(why)) => assert!(why.contains(because), "{why}"),
        other => panic!("a second run of stream {} on node 1 at epoch {epoch}: {other:?}", spec.id),
    };
    refused(&b, 1, "its run must end first");
    wait_for_commits(&a1, 2);
    wait_for_commits(&b1, 2);
    // Each node's status names the tasks of the streams it runs.
    let streams = |e: &Engine| e.status().tasks.iter().map(|t| t.stream).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(streams(&a2), [a.id].into());
    assert_eq!(streams(&b2), [b.id].into());
    // `a` stops mid-stream on both nodes; `b` goes on, and commits again.
    assert!(!a1.is_finished(), "stream a ended before its stop: make it longer");
    a1.stop();
    a2.stop();
    wait_both(a1, a2);
    let committed = b1.checkpoints().unwrap().totals().0;
    assert!(!b1.is_finished(), "stream b ended before a stopped: make it longer");
    wait_for_commits(&b1, committed + 2);
    refused(&a, 0, "a new run takes a greater epoch");
    wait_both(b1, b2);
    assert_eq!(results(&b, root.path()), util::reference(&b), "stream b");
    // `a` starts again on the same nodes at epoch 1 (its sources unpaced: the rate changes no
    // row): it restores its last commit and runs to its end. Node 1's tasks restore before node
    // 2 runs the stream: what they send it meanwhile (credit grants) waits for the run there.
    let a = stream(11, 300_000, 10_000_000);
    let (a1, a2) = start_apart(&nodes, &a, 1, root.path(), remote.path(), |a1| {
        wait_restored(a1);
        std::thread::sleep(Duration::from_millis(200));
    });
    wait_both_restored(&a1, &a2);
    restored_the_commit(&a1);
    wait_both(a1, a2);
    assert_eq!(results(&a, root.path()), util::reference(&a), "stream a");
}

/// Stream `d` stopped on node 1 alone and started again there at epoch 1: its earlier run on
/// node 2 hears of the later run and fails (nothing of either run reaches the other); started
/// again on node 2 at epoch 1 too, it restores the last commit on both and ends exact.
#[test]
fn a_stream_restarted_under_running_nodes_fences_its_earlier_run() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let nodes = two_nodes();
    let d = stream(14, 1_000_000, 50_000); // 20 s: it runs on through the restart
    let (d1, d2) = start_both(&nodes, &d, root.path(), remote.path());
    wait_for_commits(&d1, 2);
    d1.stop();
    let _ = d1.wait();
    let d = stream(14, 1_000_000, 10_000_000); // unpaced from here: the rate changes no row
    let d1 = run_on(&nodes.0, 1, &d, 1, root.path(), remote.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !d2.is_finished() {
        assert!(Instant::now() < deadline, "the earlier run on node 2 did not hear of the later run in 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = d2.wait().unwrap_err();
    assert!(err.to_string().contains("node n1 started a later run of the stream (epoch e1)"), "{err}");
    let d2 = run_on(&nodes.1, 2, &d, 1, root.path(), remote.path()).unwrap();
    wait_both_restored(&d1, &d2);
    restored_the_commit(&d2);
    wait_both(d1, d2);
    assert_eq!(results(&d, root.path()), util::reference(&d), "stream d");
}

#[test]
fn a_node_stopped_under_its_streams_fails_them_instead_of_leaving_them_waiting() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let nodes = two_nodes();
    let c = stream(13, 1_000_000, 50_000);
    let (c1, c2) = start_both(&nodes, &c, root.path(), remote.path());
    wait_for_commits(&c1, 1);
    nodes.1.stop();
    let err = c2.wait().unwrap_err();
    assert!(err.to_string().contains("node n2 stopped under the stream"), "{err}");
    c1.stop();
    let _ = c1.wait();
}

/// A run that fails on one node tells the run's other nodes, whose part fails too, though the
/// node goes in good order (a lost peer that said goodbye fails nothing) and the connection
/// between them gave no sign before it went.
#[test]
fn a_run_that_fails_on_one_node_fails_on_its_other_nodes_at_once() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let nodes = two_nodes();
    let c = stream(21, 1_000_000, 50_000);
    let failover = |cfg: &mut EngineConfig| cfg.failover = true;
    let c1 = run_with(&nodes.0, 1, &c, 0, root.path(), remote.path(), failover).unwrap();
    let c2 = run_with(&nodes.1, 2, &c, 0, root.path(), remote.path(), failover).unwrap();
    wait_for_commits(&c1, 1);
    nodes.1.stop();
    let err = c2.wait().unwrap_err();
    assert!(err.to_string().contains("node n2 stopped under the stream"), "{err}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(c1.wait()));
    let ended = rx.recv_timeout(Duration::from_secs(20)).expect("node 1's part of the run did not end in 20 s");
    let err = ended.unwrap_err().to_string();
    assert!(err.contains("the run failed on node n2: node n2 stopped under the stream"), "{err}");
}

/// A process of a node that a newer process replaced (one paused, say, while the node started
/// again) hears so from its peer as it redials, and the runs on it fail: it must run nothing
/// more.
#[test]
fn an_older_process_of_a_node_hears_it_was_replaced_and_its_runs_fail() {
    let (root, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut t1 = transport(1, vec![PeerConfig { node: NodeId(2), addr: None }]);
    t1.incarnation = 5;
    let n1 = Arc::new(Node::start(t1).unwrap());
    let peer = PeerConfig { node: NodeId(1), addr: n1.transport_addr() };
    let mut t2 = transport(2, vec![peer.clone()]);
    t2.incarnation = 5;
    let old = Arc::new(Node::start(t2).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(n1.connected().contains(&NodeId(2)) && old.connected().contains(&NodeId(1))) {
        assert!(Instant::now() < deadline, "nodes 1 and 2 did not connect in 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = stream(31, 1_000_000, 50_000);
    let (c1, c2) = start_both(&(n1.clone(), old.clone()), &c, root.path(), remote.path());
    wait_for_commits(&c1, 1);
    assert!(old.replaced().is_none());
    let mut t2 = transport(2, vec![peer]);
    t2.incarnation = 6;
    let new = Node::start(t2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while old.replaced().is_none() {
        assert!(Instant::now() < deadline, "the old process did not hear it was replaced in 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let why = old.replaced().unwrap();
    assert!(why.contains("was replaced by a newer process at 6"), "{why}");
    let err = c2.wait().unwrap_err().to_string();
    assert!(err.contains("a newer process of node n2 runs"), "{err}");
    assert!(new.replaced().is_none() && n1.replaced().is_none());
    c1.stop();
    let _ = c1.wait();
}
