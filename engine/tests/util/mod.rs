//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

pub mod ckpt;
pub mod services;
pub mod uploads;

use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

/// A bounded generator stream whose disorder stays below the watermark delay (no late rows), so
/// its results do not depend on how upstreams interleave.
pub fn bounded_spec(partitions: u32, aggs: u32, sinks: u32, rows: u64, window: WindowSpec) -> StreamSpec {
    let mut s = StreamSpec::generator(StreamId(7), partitions, aggs, sinks);
    s.source = SourceKind::Generator {
        spec: GeneratorSpec {
            seed: 7,
            keys: 300,
            rows_per_ms: 20,
            out_of_order: 0.1,
            max_disorder_ms: 30,
            ..GeneratorSpec::default()
        },
        limit: Some(rows),
        rate: None,
    };
    s.batch_rows = 1000;
    s.window = window;
    s.watermark_delay_ms = 50;
    s
}

/// What the stream must produce, computed row by row without the engine.
pub fn reference(spec: &StreamSpec) -> Vec<WindowResult> {
    weir_engine::reference::bounded_results(spec).expect("bounded generator")
}

/// Resident set size of this process in bytes.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// One engine running `spec` in `dir` with a transport on 127.0.0.1 (its config adjusted by
/// `tune`), and a client connected to it with the cluster secret (ingest-only engines have no
/// remote channel; the transport still serves clients).
pub fn ingest_engine(
    spec: &StreamSpec,
    dir: &std::path::Path,
    tune: impl FnOnce(&mut weir_engine::runtime::EngineConfig),
) -> (weir_engine::runtime::Engine, weir_engine::wire::transport::client::BlockingClient) {
    use weir_engine::wire::NodeId;
    let mut cfg = weir_engine::runtime::EngineConfig::new(NodeId(1), dir);
    cfg.pin_workers = false;
    let mut t = weir_engine::wire::transport::TransportConfig::new(
        "engine-test",
        NodeId(1),
        b"engine-test-secret-0123".to_vec(),
    );
    t.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.transport = Some(t);
    tune(&mut cfg);
    let placement = weir_engine::spec::Placement::single(NodeId(1));
    let engine = weir_engine::runtime::Engine::start(spec, &placement, cfg).unwrap();
    let addr = engine.transport_addr().expect("listening");
    let client = weir_engine::wire::transport::client::BlockingClient::connect(
        addr,
        "engine-test",
        NodeId(900),
        b"engine-test-secret-0123",
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    (engine, client)
}
