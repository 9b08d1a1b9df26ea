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
