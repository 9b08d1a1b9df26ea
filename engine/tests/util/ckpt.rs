//! Helpers of the checkpoint tests on the real engine.

use std::time::{Duration, Instant};

use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig};
use weir_engine::spec::{Placement, SourceKind};
use weir_engine::wire::NodeId;

pub fn config(dir: &std::path::Path, interval_ms: u64) -> EngineConfig {
    let mut cfg = EngineConfig::new(NodeId(1), dir);
    cfg.pin_workers = false;
    let mut ck = CheckpointSettings::every(interval_ms, dir.join("remote"));
    ck.min_pause_ms = 0;
    cfg.checkpoint = Some(ck);
    cfg
}

/// Starts `spec` on one node with `cfg` over a data directory that holds commits: the engine
/// restores the last one, runs the bounded stream to its end, and the results equal the
/// reference.
pub fn restart_ends_exact(spec: &weir_engine::spec::StreamSpec, cfg: EngineConfig, dir: &std::path::Path) {
    let engine = Engine::start(spec, &Placement::single(NodeId(1)), cfg).unwrap();
    assert!(
        matches!(engine.restored(), Some((weir_engine::wire::msg::RestoreBasis::Committed, Some(_)))),
        "{:?}",
        engine.restored()
    );
    engine.wait().unwrap();
    let got = weir_engine::state::NodeResults::open(dir).unwrap().scan(spec.id).unwrap();
    let want = super::reference(spec);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "results differ from the reference");
}

/// Starts `spec` on one node with `cfg`, lets `n` checkpoints commit, and stops it.
pub fn commit_then_stop(spec: &weir_engine::spec::StreamSpec, cfg: EngineConfig, n: u64) {
    let engine = Engine::start(spec, &Placement::single(NodeId(1)), cfg).unwrap();
    wait_for_commits(&engine, n);
    engine.stop();
    engine.wait().unwrap();
}

/// Writes the file at `p` anew with one byte in its middle flipped (a new file: no hard link
/// shares the damage).
pub fn flip_a_byte(p: &std::path::Path) {
    let mut bytes = std::fs::read(p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::remove_file(p).unwrap();
    std::fs::write(p, &bytes).unwrap();
}

/// Waits (at most 30 s) until `engine`'s coordinator has committed `n` checkpoints.
pub fn wait_for_commits(engine: &Engine, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.checkpoints().unwrap().totals().0 < n {
        assert!(Instant::now() < deadline, "fewer than {n} checkpoints committed in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most 30 s) until `engine`'s tasks know their restore point; returns it.
pub fn wait_restored(
    engine: &Engine,
) -> (weir_engine::wire::msg::RestoreBasis, Option<weir_engine::wire::CheckpointId>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(r) = engine.restored() {
            return r;
        }
        assert!(Instant::now() < deadline, "no restore point in 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The latest checkpoint id each task committed, from the tasks' meta files under `dirs` (each
/// task's file is on its own node).
pub fn committed_ids(spec: &weir_engine::spec::StreamSpec, dirs: &[&std::path::Path]) -> Vec<u64> {
    committed_ids_now(spec, dirs).expect("every task committed")
}

/// The same, `None` while some task has no meta file yet.
pub fn committed_ids_now(spec: &weir_engine::spec::StreamSpec, dirs: &[&std::path::Path]) -> Option<Vec<u64>> {
    spec.topology()
        .tasks
        .iter()
        .map(|t| {
            let meta = dirs
                .iter()
                .find_map(|d| std::fs::read_to_string(d.join(format!("tasks/{}/committed", t.id.0))).ok())?;
            meta.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

pub fn spec(rows: u64) -> weir_engine::spec::StreamSpec {
    let mut spec = super::bounded_spec(2, 2, 2, rows, WindowSpec::tumbling(100));
    if let SourceKind::Generator { rate, .. } = &mut spec.source {
        *rate = Some(rows / 2); // about two seconds per run: time for checkpoints
    }
    spec
}

/// [`spec`] with its sources paced to `rate` rows per second each (`rows / rate` seconds of
/// stream: time for commits into a remote store on a loaded machine).
pub fn spec_at(rows: u64, rate: u64) -> weir_engine::spec::StreamSpec {
    let mut s = spec(rows);
    if let SourceKind::Generator { rate: r, .. } = &mut s.source {
        *r = Some(rate);
    }
    s
}

pub fn transport(
    node: u32,
    peers: Vec<weir_engine::wire::transport::PeerConfig>,
) -> weir_engine::wire::transport::TransportConfig {
    let mut t =
        weir_engine::wire::transport::TransportConfig::new("ck-test", NodeId(node), b"checkpoint-test-secret".to_vec());
    t.listen = Some("127.0.0.1:0".parse().unwrap());
    t.peers = peers;
    t
}

/// Starts the two engines of a stream spread over nodes 1 and 2, sharing one store, with
/// checkpoints every 100 ms.
pub fn two_engines(
    spec: &weir_engine::spec::StreamSpec,
    d1: &std::path::Path,
    d2: &std::path::Path,
    remote: &std::path::Path,
) -> (Engine, Engine) {
    two_engines_every(spec, d1, d2, remote, 100)
}

pub fn two_engines_every(
    spec: &weir_engine::spec::StreamSpec,
    d1: &std::path::Path,
    d2: &std::path::Path,
    remote: &std::path::Path,
    interval_ms: u64,
) -> (Engine, Engine) {
    two_engines_with(spec, d1, d2, remote, |ck| ck.interval_ms = interval_ms)
}

/// Two engines of `spec` spread over nodes 1 and 2, checkpointing every 100 ms into `remote`,
/// with `tune` applied to both engines' checkpoint settings.
pub fn two_engines_with(
    spec: &weir_engine::spec::StreamSpec,
    d1: &std::path::Path,
    d2: &std::path::Path,
    remote: &std::path::Path,
    tune: impl Fn(&mut CheckpointSettings),
) -> (Engine, Engine) {
    use weir_engine::wire::transport::PeerConfig;
    let placement = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2)]);
    let settings = |_| {
        let mut ck = CheckpointSettings::every(100, remote);
        ck.min_pause_ms = 0;
        tune(&mut ck);
        ck
    };
    let mut c1 = EngineConfig::new(NodeId(1), d1);
    c1.pin_workers = false;
    c1.checkpoint = Some(settings(1));
    c1.transport = Some(transport(1, vec![PeerConfig { node: NodeId(2), addr: None }]));
    let e1 = Engine::start(spec, &placement, c1).unwrap();
    let mut c2 = EngineConfig::new(NodeId(2), d2);
    c2.pin_workers = false;
    c2.checkpoint = Some(settings(2));
    c2.transport = Some(transport(2, vec![PeerConfig { node: NodeId(1), addr: e1.transport_addr() }]));
    let e2 = Engine::start(spec, &placement, c2).unwrap();
    (e1, e2)
}

/// Stops both engines mid-stream.
pub fn stop_both(e1: Engine, e2: Engine) {
    e1.stop();
    e2.stop();
    e1.wait().unwrap();
    e2.wait().unwrap();
}
