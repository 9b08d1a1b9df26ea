//! Window state past the memory budget spills to each agg's RocksDB: a stream whose state
//! spills all the time, stopped midway and restored again and again, ends with exactly the
//! results of the reference, and its checkpoints carry the spill stores.

mod util;

use std::time::Duration;

use weir_engine::runtime::Engine;
use weir_engine::spec::{Placement, SourceKind, TaskKind};
use weir_engine::wire::NodeId;

use util::ckpt::{config, spec};

#[test]
fn a_stream_whose_state_spills_ends_with_exact_results_across_stops_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(100_000);
    if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
        g.keys = 20_000; // every window's tables pass the budget many times over
    }
    let with_budget = || {
        let mut cfg = config(dir.path(), 80);
        cfg.state_budget = Some(512 << 10);
        cfg
    };
    let mut seed = 0x9E37_79B9u64;
    for _ in 0..2 {
        let engine = Engine::start(&spec, &Placement::single(NodeId(1)), with_budget()).unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(400 + seed % 400));
        engine.stop();
        engine.wait().unwrap();
    }
    // The aggs' snapshots hold their spill stores (a RocksDB checkpoint beside the window files).
    let aggs: Vec<_> =
        spec.topology().tasks.iter().filter(|t| matches!(t.kind, TaskKind::Agg { .. })).map(|t| t.id).collect();
    let with_spill = aggs
        .iter()
        .flat_map(|t| std::fs::read_dir(dir.path().join(format!("tasks/{}/snapshots", t.0))).into_iter().flatten())
        .flatten()
        .filter(|s| {
            // A spill store with runs in it: SST files beside the window files.
            let files =
                std::fs::read_dir(s.path()).unwrap().flatten().map(|f| f.file_name().to_string_lossy().into_owned());
            s.path().join("CURRENT").is_file()
                && files.filter(|n| n.ends_with(".sst") && !n.starts_with("state-")).count() > 0
        })
        .count();
    assert!(with_spill > 0, "no agg snapshot holds spilled state");
    util::ckpt::restart_ends_exact(&spec, with_budget(), dir.path());
}
