//! The checkpoint protocol on the real engine: checkpoints commit while the stream runs, and an
//! engine stopped at a random point and started again on the same data directory restores the last
//! commit and ends with exactly the results of an uninterrupted run.

mod util;

use std::time::{Duration, Instant};

use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig};
use weir_engine::spec::{Placement, SourceKind};
use weir_engine::state::ResultStore;
use weir_engine::wire::NodeId;

fn config(dir: &std::path::Path, interval_ms: u64) -> EngineConfig {
    let mut cfg = EngineConfig::new(NodeId(1), dir);
    cfg.pin_workers = false;
    let mut ck = CheckpointSettings::every(interval_ms, dir.join("remote"));
    ck.min_pause_ms = 0;
    cfg.checkpoint = Some(ck);
    cfg
}

fn spec(rows: u64) -> weir_engine::spec::StreamSpec {
    let mut spec = util::bounded_spec(2, 2, 2, rows, WindowSpec::tumbling(100));
    if let SourceKind::Generator { rate, .. } = &mut spec.source {
        *rate = Some(rows / 2); // about two seconds per run: time for checkpoints
    }
    spec
}

#[test]
fn checkpoints_commit_while_the_stream_runs_and_results_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 100)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let committed = engine.checkpoints().unwrap().finished.lock().iter().filter(|c| c.2).count();
        if committed >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "fewer than 3 checkpoints committed in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    engine.wait().unwrap();
    let got = ResultStore::open(&dir.path().join("results")).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
    // Commit records and manifests are in the store.
    let commits = std::fs::read_dir(dir.path().join("remote/7/checkpoints")).unwrap().count();
    assert!(commits >= 3, "{commits} commit records");
}

#[test]
fn an_engine_stopped_midway_restores_the_last_commit_and_ends_with_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let mut seed = 0x2545_F491u64;
    for round in 0..3 {
        let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(300 + seed % 500));
        engine.stop(); // mid-stream, mid-checkpoint perhaps: nothing after the last commit is kept
        engine.wait().unwrap();
        let commits = std::fs::read_dir(dir.path().join("remote/7/checkpoints")).map_or(0, |d| d.count());
        assert!(commits > round, "round {round}: only {commits} commits so far");
    }
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    engine.wait().unwrap();
    let got = ResultStore::open(&dir.path().join("results")).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}
