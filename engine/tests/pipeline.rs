//! The engine end to end: generator → window aggregation → sink into the RocksDB result store, on
//! one engine, on two engines connected over 127.0.0.1, and with a slow sink.

mod util;

use std::time::Duration;

use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{Engine, EngineConfig};
use weir_engine::spec::{Placement, SourceKind};
use weir_engine::wire::transport::{PeerConfig, TransportConfig};
use weir_engine::wire::{NodeId, StreamId};

fn run_single(
    spec: &weir_engine::spec::StreamSpec,
    workers: usize,
) -> Vec<weir_engine::operator::window::WindowResult> {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.workers = workers;
    cfg.pin_workers = false;
    let engine = Engine::start(spec, &Placement::single(NodeId(1)), cfg).unwrap();
    // A bounded stream ends by itself: every task finishes once its inputs ended.
    engine.wait().unwrap();
    weir_engine::state::ResultStore::open(&dir.path().join("results")).unwrap().scan(spec.id).unwrap()
}

#[test]
fn tumbling_windows_on_one_engine_equal_the_reference() {
    let spec = util::bounded_spec(3, 2, 2, 40_000, WindowSpec::tumbling(100));
    let got = run_single(&spec, 2);
    let want = util::reference(&spec);
    assert!(want.len() > 5_000, "{} results", want.len());
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
}

#[test]
fn hopping_windows_on_one_engine_equal_the_reference() {
    let spec = util::bounded_spec(2, 3, 1, 20_000, WindowSpec::hopping(200, 50));
    let got = run_single(&spec, 1);
    assert_eq!(got, util::reference(&spec));
}

fn transport(node: u32, peers: Vec<PeerConfig>) -> TransportConfig {
    let mut t = TransportConfig::new("engine-test", NodeId(node), b"engine-test-secret-0123".to_vec());
    t.listen = Some("127.0.0.1:0".parse().unwrap());
    t.peers = peers;
    t
}

#[test]
fn stream_split_over_two_engines_gives_the_same_results_as_one() {
    let spec = util::bounded_spec(2, 2, 2, 30_000, WindowSpec::tumbling(100));
    let topo = spec.topology();
    let placement = Placement::spread(&topo, &[NodeId(1), NodeId(2)]);
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c1 = EngineConfig::new(NodeId(1), d1.path());
    c1.pin_workers = false;
    c1.queue_capacity = 8; // small credit windows: flow control is exercised
    c1.transport = Some(transport(1, vec![PeerConfig { node: NodeId(2), addr: None }]));
    let e1 = Engine::start(&spec, &placement, c1).unwrap();
    let mut c2 = EngineConfig::new(NodeId(2), d2.path());
    c2.pin_workers = false;
    c2.queue_capacity = 8;
    c2.transport = Some(transport(2, vec![PeerConfig { node: NodeId(1), addr: e1.transport_addr() }]));
    let e2 = Engine::start(&spec, &placement, c2).unwrap();
    let (h1, h2) = (std::thread::spawn(move || e1.wait()), std::thread::spawn(move || e2.wait()));
    h1.join().unwrap().unwrap();
    h2.join().unwrap().unwrap();
    let mut got = weir_engine::state::ResultStore::open(&d1.path().join("results")).unwrap().scan(spec.id).unwrap();
    got.extend(weir_engine::state::ResultStore::open(&d2.path().join("results")).unwrap().scan(spec.id).unwrap());
    got.sort_by_key(|r| (r.key, r.start));
    assert_eq!(got, util::reference(&spec));
    assert_eq!(got, run_single(&spec, 2));
}

#[test]
fn slow_sink_pushes_back_and_memory_stays_bounded() {
    let mut spec = util::bounded_spec(2, 2, 1, u64::MAX, WindowSpec::tumbling(1));
    if let SourceKind::Generator { limit, .. } = &mut spec.source {
        *limit = None;
    }
    spec.id = StreamId(9);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.pin_workers = false;
    cfg.queue_capacity = 16;
    cfg.sink_throttle = Some(Duration::from_millis(20));
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    let rows = || engine.stats().rows_in.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let (rows_a, rss_a) = (rows(), util::rss_bytes());
    std::thread::sleep(Duration::from_millis(1500));
    let (rows_b, rss_b) = (rows(), util::rss_bytes());
    engine.stop();
    // The sink writes one result batch per 20 ms; sources must have been held back to its pace
    // (unthrottled they generate tens of millions of rows per second).
    assert!(rows_b < 2_000_000, "sources ran ahead of a slow sink: {rows_b} rows");
    assert!(rows_b > rows_a, "the pipeline stalled: {rows_a} -> {rows_b}");
    assert!(rss_b < rss_a + (64 << 20), "memory grew from {rss_a} to {rss_b} bytes");
    engine.wait().unwrap();
}
