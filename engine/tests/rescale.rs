//! A stream restored from a savepoint at other parallelism (more aggs, then fewer) gives the
//! results of a run that never stopped.

mod util;

use std::time::{Duration, Instant};

use util::ckpt;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::runtime::Engine;
use weir_engine::spec::{Placement, StreamSpec};
use weir_engine::wire::NodeId;
use weir_engine::wire::msg::{CheckpointOutcome, RestoreBasis};

/// Checkpoints every 100 ms, replay snapshots on (as `weir node` takes them): only a savepoint
/// writes every window.
fn config(dir: &std::path::Path) -> weir_engine::runtime::EngineConfig {
    let mut cfg = ckpt::config(dir, 100);
    cfg.checkpoint.as_mut().expect("checkpoints").replay = true;
    cfg
}

/// `spec` with `aggs` aggs and `sinks` sinks, numbered past every task id it used.
fn rescaled(spec: &StreamSpec, aggs: u32) -> StreamSpec {
    let mut s = spec.clone();
    s.first_agg_task = Some(spec.agg_base() + spec.agg_parallelism + spec.sink_parallelism);
    s.agg_parallelism = aggs;
    s
}

/// Runs `spec` until a savepoint taken after `commits` commits has committed, then stops.
fn savepoint_then_stop(spec: &StreamSpec, dir: &std::path::Path, commits: u64) {
    let engine = Engine::start(spec, &Placement::single(NodeId(1)), config(dir)).unwrap();
    ckpt::wait_for_commits(&engine, commits);
    engine.take_savepoint().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !engine.status().checkpoints.iter().any(|c| c.savepoint && c.outcome == CheckpointOutcome::Committed) {
        assert!(Instant::now() < deadline, "no savepoint committed in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!engine.status().tasks.iter().all(|t| t.rows_in == 0), "the stream ran");
    engine.stop();
    engine.wait().unwrap();
}

fn sorted(mut r: Vec<WindowResult>) -> Vec<WindowResult> {
    r.sort_by_key(|r| (r.start, r.key));
    r
}

#[test]
fn a_savepoint_restored_with_five_aggs_then_one_gives_the_results_of_a_run_that_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ckpt::spec_at(40_000, 8_000);
    // Hopping windows: several open per key at every savepoint.
    spec.window = WindowSpec::hopping(400, 100);
    savepoint_then_stop(&spec, dir.path(), 2);
    let five = rescaled(&spec, 5);
    let engine = Engine::start(&five, &Placement::single(NodeId(1)), config(dir.path())).unwrap();
    assert!(matches!(engine.restored(), Some((RestoreBasis::Committed, Some(_)))), "{:?}", engine.restored());
    engine.stop();
    engine.wait().unwrap();
    savepoint_then_stop(&five, dir.path(), 1);
    let one = rescaled(&five, 1);
    let engine = Engine::start(&one, &Placement::single(NodeId(1)), config(dir.path())).unwrap();
    engine.wait().unwrap();
    let got = weir_engine::state::NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    let want = util::reference(&spec);
    assert_eq!(got.len(), want.len(), "every window of every key once");
    assert!(sorted(got) == sorted(want), "results differ from the reference");
}

#[test]
fn a_checkpoint_that_names_windows_to_replay_is_refused_at_other_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ckpt::spec_at(40_000, 8_000);
    spec.window = WindowSpec::hopping(400, 100);
    ckpt::commit_then_stop(&spec, config(dir.path()), 2);
    let five = rescaled(&spec, 5);
    let err = match Engine::start(&five, &Placement::single(NodeId(1)), config(dir.path())) {
        Ok(engine) => engine.wait().expect_err("the restore fails").to_string(),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no savepoint"), "{err}");
}
