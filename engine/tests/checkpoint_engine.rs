//! The checkpoint protocol on the real engine: checkpoints commit while the stream runs, and an
//! engine stopped at a random point and started again on the same data directory restores the last
//! commit and ends with exactly the results of an uninterrupted run.

mod util;

use std::time::{Duration, Instant};

use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig};
use weir_engine::spec::Placement;
use weir_engine::state::NodeResults;
use weir_engine::wire::NodeId;

use util::ckpt::{
    committed_ids, committed_ids_now, config, spec, stop_both, transport, two_engines, two_engines_every,
    wait_for_commits, wait_restored,
};

#[test]
fn checkpoints_commit_while_the_stream_runs_and_results_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 100)).unwrap();
    wait_for_commits(&engine, 3);
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
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
    util::ckpt::restart_ends_exact(&spec, config(dir.path(), 80), dir.path());
}

/// Lets both engines finish the stream; returns the results of both nodes, in (key, start) order.
fn run_both_to_the_end(
    e1: Engine,
    e2: Engine,
    dirs: &[&std::path::Path],
    spec: &weir_engine::spec::StreamSpec,
) -> Vec<weir_engine::operator::window::WindowResult> {
    let (h1, h2) = (std::thread::spawn(move || e1.wait()), std::thread::spawn(move || e2.wait()));
    h1.join().unwrap().unwrap();
    h2.join().unwrap().unwrap();
    let mut got = Vec::new();
    for d in dirs {
        got.extend(NodeResults::open(d).unwrap().scan(spec.id).unwrap());
    }
    got.sort_by_key(|r| (r.key, r.start));
    got
}

/// A client of `e`'s transport.
fn client(e: &Engine) -> weir_engine::wire::transport::client::BlockingClient {
    let addr = e.transport_addr().expect("listening");
    weir_engine::wire::transport::client::BlockingClient::connect(
        addr,
        "ck-test",
        NodeId(900),
        b"checkpoint-test-secret",
        Duration::from_secs(10),
    )
    .unwrap()
}

#[test]
fn checkpoints_commit_across_two_engines_and_both_restore_from_them() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    // First run: node 1 coordinates; stop both engines mid-stream after a few commits.
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    wait_for_commits(&e1, 3);
    assert!(!e1.is_finished(), "the stream ended before the stop: make it longer");
    stop_both(e1, e2);
    // Second run: both restore the last commit and finish the stream.
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    assert_eq!(run_both_to_the_end(e1, e2, &[d1.path(), d2.path()], &spec), util::reference(&spec));
}

#[test]
fn heartbeats_tell_each_node_the_other_nodes_tasks_committed_ids() {
    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(1_000_000);
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    wait_for_commits(&e1, 2);
    let on_node_2: Vec<_> = e2.status().tasks.iter().map(|t| t.task).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let heard = e1.peer_tasks();
        let known: Vec<_> =
            heard.iter().filter(|(n, h)| *n == NodeId(2) && h.latest.is_some()).map(|(_, h)| h.task).collect();
        if known == on_node_2 {
            break;
        }
        assert!(Instant::now() < deadline, "node 1 heard {heard:?}, node 2 runs {on_node_2:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_both(e1, e2);
}

#[test]
fn status_responses_carry_task_state_and_per_task_checkpoint_statistics() {
    use weir_engine::wire::msg::{CheckpointOutcome, StatusReq, StatusRsp};

    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    wait_for_commits(&e1, 2);
    let ask = |e: &Engine, request: u64| -> StatusRsp {
        let mut c = client(e);
        c.send(&StatusReq { request, stream: None }).unwrap();
        c.recv().unwrap().to_owned::<StatusRsp>().unwrap()
    };
    let (s1, s2) = (ask(&e1, 7), ask(&e2, 8));
    stop_both(e1, e2);

    assert_eq!((s1.request, s1.node, s2.request, s2.node), (7, NodeId(1), 8, NodeId(2)));
    let topo = spec.topology();
    let mut tasks: Vec<_> = s1.tasks.iter().chain(&s2.tasks).map(|t| t.task).collect();
    tasks.sort();
    let mut want: Vec<_> = topo.tasks.iter().map(|t| t.id).collect();
    want.sort();
    assert_eq!(tasks, want, "every task is reported by the node it runs on");
    assert!(s1.tasks.iter().chain(&s2.tasks).all(|t| t.latest.is_some()), "every task has a committed checkpoint");
    assert!(s1.tasks.iter().chain(&s2.tasks).all(|t| t.rows_in + t.rows_out > 0), "every task moved rows");
    // The coordinator (node 1) lists the checkpoints, each with every task's figures, and the
    // stream's health.
    assert!(s2.checkpoints.is_empty() && s2.streams.is_empty());
    assert_eq!(s1.streams.len(), 1);
    let h = &s1.streams[0];
    assert!(h.stream == spec.id && h.healthy && h.committed >= 2 && h.consecutive_failures == 0, "{h:?}");
    let c = s1.checkpoints.iter().find(|c| c.outcome == CheckpointOutcome::Committed).expect("a committed checkpoint");
    assert!(c.duration_us > 0 && c.started_at_ms > 0);
    assert_eq!(c.tasks.len(), topo.tasks.len());
    for e in &c.tasks {
        let s = &e.stats;
        assert!(s.trigger_at_us > 0 && s.reported_at_us >= s.trigger_at_us, "{e:?}");
        assert!(s.upload_us > 0, "{e:?}");
    }
    let aggs: Vec<_> =
        topo.tasks.iter().filter(|t| matches!(t.kind, weir_engine::spec::TaskKind::Agg { .. })).map(|t| t.id).collect();
    for e in c.tasks.iter().filter(|e| aggs.contains(&e.task)) {
        assert!(e.stats.files == 1 && e.stats.upload_bytes > 0, "an agg stores its state file: {e:?}");
    }
    assert_eq!(c.upload_bytes, c.tasks.iter().map(|e| e.stats.upload_bytes).sum::<u64>());
}

#[test]
fn a_missing_commit_record_restores_the_consensus_of_the_tasks_latest_ids() {
    use weir_engine::wire::CheckpointId;
    use weir_engine::wire::msg::RestoreBasis;

    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    assert_eq!(wait_restored(&engine), (RestoreBasis::Fresh, None));
    wait_for_commits(&engine, 3);
    engine.stop();
    engine.wait().unwrap();
    // The coordinator's records are gone; the tasks still know what they committed.
    std::fs::remove_dir_all(dir.path().join("remote/7/checkpoints")).unwrap();
    let latest = committed_ids(&spec, &[dir.path()]);
    let min = *latest.iter().min().unwrap();
    assert!(min >= 1, "{latest:?}");
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    assert_eq!(wait_restored(&engine), (RestoreBasis::Consensus, Some(CheckpointId(min))));
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}

#[test]
fn a_recorded_start_from_nothing_sorts_above_older_commits_and_every_task_starts_over() {
    use weir_engine::backup::commit::{commit_key, encode_commit};
    use weir_engine::checkpoint::CommitRecord;
    use weir_engine::wire::msg::RestoreBasis;
    use weir_engine::wire::{CheckpointId, StreamId};

    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    wait_for_commits(&engine, 3);
    engine.stop();
    engine.wait().unwrap();
    // A consensus chose to start from nothing and recorded it, past the commits still there.
    let fresh = CommitRecord::fresh(CheckpointId(1_000), 0);
    let key = commit_key(StreamId(7), fresh.id);
    std::fs::write(dir.path().join("remote").join(&key), encode_commit(&fresh)).unwrap();
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    assert_eq!(wait_restored(&engine), (RestoreBasis::Fresh, None));
    wait_for_commits(&engine, 1);
    let ids: Vec<u64> = engine.checkpoints().unwrap().finished().iter().map(|c| c.checkpoint.0).collect();
    assert!(ids.iter().all(|id| *id > 1_000), "new checkpoints take ids past the record's: {ids:?}");
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}

#[test]
fn two_engines_without_a_commit_record_agree_on_the_consensus_and_end_with_exact_results() {
    use weir_engine::wire::CheckpointId;
    use weir_engine::wire::msg::RestoreBasis;

    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    assert_eq!(wait_restored(&e2), (RestoreBasis::Fresh, None), "node 2 waits for node 1's answer");
    wait_for_commits(&e1, 3);
    assert!(!e1.is_finished(), "the stream ended before the stop: make it longer");
    stop_both(e1, e2);
    // The commit records are gone; each node knows only what its own tasks committed.
    std::fs::remove_dir_all(remote.path().join("7/checkpoints")).unwrap();
    let latest = committed_ids(&spec, &[d1.path(), d2.path()]);
    let min = *latest.iter().min().unwrap();
    assert!(min >= 1, "{latest:?}");
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    let want = (RestoreBasis::Consensus, Some(CheckpointId(min)));
    assert_eq!(wait_restored(&e1), want);
    assert_eq!(wait_restored(&e2), want);
    assert_eq!(run_both_to_the_end(e1, e2, &[d1.path(), d2.path()], &spec), util::reference(&spec));
}

#[test]
fn a_manual_trigger_starts_a_checkpoint_from_the_engine_or_a_client_of_any_node() {
    use weir_engine::wire::msg::{CheckpointNowOutcome, CheckpointNowReq, CheckpointNowRsp};

    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    // An hour between checkpoints: every commit here is a manual one.
    let (e1, e2) = two_engines_every(&spec, d1.path(), d2.path(), remote.path(), 3_600_000);
    wait_restored(&e1);
    let committed = |e: &Engine| e.checkpoints().unwrap().totals().0;
    assert_eq!(committed(&e1), 0);
    e1.trigger_checkpoint().unwrap();
    wait_for_commits(&e1, 1);
    let err = e2.trigger_checkpoint().unwrap_err().to_string();
    assert!(err.contains("n1 coordinates"), "{err}");
    let ask = |e: &Engine, request: u64, stream| -> CheckpointNowRsp {
        let mut c = client(e);
        c.send(&CheckpointNowReq { request, stream }).unwrap();
        c.recv().unwrap().to_owned::<CheckpointNowRsp>().unwrap()
    };
    let r = ask(&e2, 1, spec.id);
    assert_eq!((r.request, r.node), (1, NodeId(2)));
    assert_eq!(r.outcome, CheckpointNowOutcome::NotCoordinator { coordinator: NodeId(1) });
    let r = ask(&e1, 2, weir_engine::wire::StreamId(99));
    assert!(matches!(r.outcome, CheckpointNowOutcome::Refused { .. }), "{r:?}");
    assert_eq!(ask(&e1, 3, spec.id).outcome, CheckpointNowOutcome::Accepted);
    wait_for_commits(&e1, 2);
    // Update-checkpoint-info reaches node 2's tasks over the network after the commit.
    let dirs = [d1.path(), d2.path()];
    let deadline = Instant::now() + Duration::from_secs(10);
    while committed_ids_now(&spec, &dirs).is_none_or(|ids| ids.iter().any(|id| *id != 2)) {
        assert!(Instant::now() < deadline, "the second commit did not reach every task in 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop_both(e1, e2);
}

#[test]
fn tasks_touch_no_data_until_the_coordinator_names_the_restore_point() {
    use weir_engine::wire::msg::TaskState;
    use weir_engine::wire::transport::PeerConfig;

    let (d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let placement = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2)]);
    // Node 1 (the coordinator) is not running: nothing listens where node 2 looks for it.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut c2 = EngineConfig::new(NodeId(2), d2.path());
    c2.pin_workers = false;
    c2.checkpoint = Some(CheckpointSettings::every(100, remote.path()));
    c2.transport = Some(transport(2, vec![PeerConfig { node: NodeId(1), addr: Some(gone) }]));
    let e2 = Engine::start(&spec, &placement, c2).unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    let status = e2.status();
    e2.stop();
    e2.wait().unwrap();
    assert!(!status.tasks.is_empty());
    assert!(
        status.tasks.iter().all(|t| t.rows_in + t.rows_out == 0),
        "data moved before the restore point: {status:?}"
    );
    assert!(status.tasks.iter().all(|t| t.state == TaskState::Uninit), "{status:?}");
}

#[test]
fn losing_a_node_fails_the_checkpoint_and_the_stream_is_reported_unhealthy() {
    use weir_engine::wire::msg::CheckpointOutcome;

    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let (e1, e2) = two_engines(&spec, d1.path(), d2.path(), remote.path());
    wait_for_commits(&e1, 2);
    // Node 2 goes away; node 1 (the coordinator) must not wait for its tasks: every checkpoint
    // from now on fails fast, naming the node, long before the 30 s checkpoint timeout.
    e2.stop();
    e2.wait().unwrap();
    let lost_at = Instant::now();
    let failed = loop {
        let f: Vec<_> = e1
            .checkpoints()
            .unwrap()
            .finished()
            .into_iter()
            .filter_map(|c| match c.outcome {
                CheckpointOutcome::Failed { reason } => Some(reason),
                _ => None,
            })
            .collect();
        // Three failures are tolerated (the default): the fourth makes the stream unhealthy.
        if f.len() >= 4 {
            break f;
        }
        assert!(lost_at.elapsed() < Duration::from_secs(10), "checkpoints did not fail after the node was lost: {f:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(failed.iter().all(|r| r.contains("n2")), "{failed:?}");
    assert!(lost_at.elapsed() < Duration::from_secs(5));
    assert!(!e1.checkpoints().unwrap().healthy(), "four failures in a row: unhealthy");
    let h = &e1.status().streams[0];
    assert!(!h.healthy && h.consecutive_failures >= 4 && h.committed >= 2, "{h:?}");
    assert!(e1.checkpoints().unwrap().totals().0 >= 2);
    let committed_before = e1.checkpoints().unwrap().totals().0;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(e1.checkpoints().unwrap().totals().0, committed_before, "nothing commits without node 2");
    e1.stop();
    let _ = e1.wait(); // node 1 may report the broken channel to node 2; either way it stops
}

#[test]
fn a_damaged_local_snapshot_is_downloaded_again_and_the_results_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    wait_for_commits(&engine, 2);
    engine.stop();
    engine.wait().unwrap();
    // Damage every state file of the aggs' local snapshots (new files: the store keeps its own).
    let mut damaged = 0;
    for t in spec.topology().tasks.iter().filter(|t| matches!(t.kind, weir_engine::spec::TaskKind::Agg { .. })) {
        let snaps = dir.path().join(format!("tasks/{}/snapshots", t.id.0));
        for chk in std::fs::read_dir(&snaps).unwrap() {
            for f in std::fs::read_dir(chk.unwrap().path()).unwrap() {
                util::ckpt::flip_a_byte(&f.unwrap().path());
                damaged += 1;
            }
        }
    }
    assert!(damaged >= 2, "the aggs keep their last committed snapshot locally");
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    assert!(matches!(engine.restored(), Some((weir_engine::wire::msg::RestoreBasis::Committed, Some(_)))));
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}

/// A store whose snapshot files (`<stream>/tasks/…`, manifests aside) cannot be read while its
/// gate is shut: a restore from it takes as long as the test wants.
#[derive(Debug)]
struct GatedStore {
    inner: weir_engine::backup::LocalDirStore,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl GatedStore {
    fn set(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.opened.notify_all();
    }
}

impl weir_engine::backup::Store for GatedStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), weir_engine::backup::StoreError> {
        self.inner.put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, weir_engine::backup::StoreError> {
        if key.contains("/tasks/") && !key.ends_with("MANIFEST.weir") {
            let open = self.open.lock().unwrap();
            drop(self.opened.wait_while(open, |o| !*o).unwrap());
        }
        self.inner.get(key)
    }
    fn size(&self, key: &str) -> Result<Option<u64>, weir_engine::backup::StoreError> {
        self.inner.size(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, weir_engine::backup::StoreError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), weir_engine::backup::StoreError> {
        self.inner.delete(key)
    }
}

#[test]
fn a_node_answers_status_while_its_tasks_restore_from_the_remote_store() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    use weir_engine::wire::msg::{StatusReq, StatusRsp};
    let (dir, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(2_000_000);
    let store = std::sync::Arc::new(GatedStore {
        inner: weir_engine::backup::LocalDirStore::new(remote.path()),
        open: std::sync::Mutex::new(true),
        opened: std::sync::Condvar::new(),
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = || {
        let mut cfg = config(dir.path(), 100);
        cfg.checkpoint.as_mut().unwrap().remote = weir_engine::runtime::Remote::Store(store.clone());
        let mut t = transport(1, Vec::new());
        t.listen = Some(addr);
        cfg.transport = Some(t);
        cfg
    };
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg()).unwrap();
    wait_for_commits(&engine, 1);
    engine.stop();
    engine.wait().unwrap();
    // Without its local files, the node must download every task's snapshot: held at the gate.
    std::fs::remove_dir_all(dir.path().join("tasks")).unwrap();
    store.set(false);
    let (spec2, cfg2) = (spec.clone(), cfg());
    let starting = std::thread::spawn(move || Engine::start(&spec2, &Placement::single(NodeId(1)), cfg2));
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        let asked = weir_engine::wire::transport::client::BlockingClient::connect(
            addr,
            "ck-test",
            NodeId(900),
            b"checkpoint-test-secret",
            Duration::from_secs(2),
        )
        .and_then(|mut c| {
            c.send(&StatusReq { request: 3, stream: None })?;
            c.recv()
        });
        match asked {
            Ok(f) => break Ok(f.to_owned::<StatusRsp>().unwrap()),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => break Err(e),
        }
    };
    let restoring = !starting.is_finished();
    store.set(true);
    let engine = starting.join().unwrap().unwrap();
    let answer = answer.unwrap_or_else(|e| panic!("the node did not answer status while its tasks restored: {e}"));
    assert!(restoring, "the engine had started before the answer: the test proves nothing");
    assert_eq!((answer.request, answer.node), (3, NodeId(1)));
    assert_eq!(answer.tasks.len(), spec.topology().tasks.len(), "{answer:?}");
    assert!(
        answer.tasks.iter().all(|t| t.state == weir_engine::wire::msg::TaskState::Uninit),
        "tasks wait while they restore: {answer:?}"
    );
    assert!(matches!(engine.restored(), Some((weir_engine::wire::msg::RestoreBasis::Committed, Some(_)))));
    engine.stop();
    engine.wait().unwrap();
}
