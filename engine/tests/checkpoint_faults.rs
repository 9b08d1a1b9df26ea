//! The checkpoint protocol on the real engine when things around it fail: a store that stops
//! answering, a task meta record that cannot be read, requests for a coordinator elsewhere.

mod util;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_engine::backup::{LocalDirStore, Store, StoreError};
use weir_engine::checkpoint::CheckpointError;
use weir_engine::runtime::{Engine, EngineError, Remote};
use weir_engine::spec::Placement;
use weir_engine::wire::NodeId;
use weir_engine::wire::msg::CheckpointOutcome;

use util::ckpt::{config, spec, spec_at, wait_for_commits};

/// A local-directory store whose commit-record writes hang while `hang` is set (as a store that
/// accepts the connection and never answers).
#[derive(Debug)]
struct HangingStore {
    inner: LocalDirStore,
    hang: AtomicBool,
}

impl HangingStore {
    fn new(root: &Path) -> Arc<Self> {
        Arc::new(Self { inner: LocalDirStore::new(root), hang: AtomicBool::new(false) })
    }
}

impl Store for HangingStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        while key.contains("/checkpoints/") && self.hang.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inner.put(key, bytes)
    }
    fn put_file(&self, key: &str, path: &Path) -> Result<(), StoreError> {
        self.inner.put_file(key, path)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.inner.size(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
}

#[test]
fn a_hung_store_fails_checkpoints_on_time_while_status_and_manual_triggers_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = HangingStore::new(&dir.path().join("remote"));
    let mut cfg = config(dir.path(), 100);
    let ck = cfg.checkpoint.as_mut().unwrap();
    ck.remote = Remote::Store(store.clone());
    ck.store_timeout_ms = 300;
    // About 20 s of stream: it must outlive the first commit, the hang and the commit after it
    // on a loaded machine (a finished stream takes no more checkpoints).
    let engine = Engine::start(&spec_at(1_000_000, 50_000), &Placement::single(NodeId(1)), cfg).unwrap();
    wait_for_commits(&engine, 1);
    store.hang.store(true, Ordering::Release);
    let log = engine.checkpoints().unwrap();
    let (committed, failed) = log.totals();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.totals().1 < failed + 2 {
        assert!(Instant::now() < deadline, "checkpoints on a hung store did not fail in 20 s");
        // The coordinator is not stuck behind the store: it takes manual triggers, and the node
        // answers status requests.
        let t0 = Instant::now();
        engine.trigger_checkpoint().unwrap();
        assert!(!engine.status().tasks.is_empty());
        assert!(t0.elapsed() < Duration::from_millis(500), "status and trigger took {:?}", t0.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(log.totals().0, committed, "nothing commits while the store hangs");
    let last = log.recent(1).pop().unwrap();
    assert!(
        matches!(&last.outcome, CheckpointOutcome::Failed { reason } if reason.contains("no answer within 300 ms")),
        "{:?}",
        last.outcome
    );
    // The store answers again: checkpoints commit again.
    store.hang.store(false, Ordering::Release);
    assert!(!engine.is_finished(), "the stream ended before the store answered again");
    wait_for_commits(&engine, committed + 1);
    engine.stop();
    engine.wait().unwrap();
}

#[test]
fn an_unreadable_meta_record_stops_the_task_with_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(10_000);
    // No commit record in the store, so the tasks bring their meta records to the consensus.
    let meta = dir.path().join("tasks/0/committed");
    std::fs::create_dir_all(meta.parent().unwrap()).unwrap();
    std::fs::write(&meta, "not a record").unwrap();
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 100)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !engine.is_finished() {
        assert!(Instant::now() < deadline, "the engine went on with an unreadable meta record");
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = engine.wait().unwrap_err();
    assert!(err.to_string().contains(&meta.display().to_string()), "{err}");
    assert!(!err.is_retryable(), "a damaged meta record needs a person: {err}");
    assert!(engine_results_empty(dir.path()), "no data moved without a restore point");
}

fn engine_results_empty(dir: &Path) -> bool {
    let store = weir_engine::state::NodeResults::open(dir).unwrap();
    store.scan(util::ckpt::spec(10_000).id).unwrap().is_empty()
}

#[test]
fn a_trigger_on_a_node_that_does_not_coordinate_says_where_the_coordinator_is() {
    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let (e1, e2) = util::ckpt::two_engines_every(&spec, d1.path(), d2.path(), remote.path(), 3_600_000);
    match e2.trigger_checkpoint() {
        Err(EngineError::Checkpoint(CheckpointError::NotCoordinator { coordinator, .. })) => {
            assert_eq!(coordinator, NodeId(1))
        }
        other => panic!("{other:?}"),
    }
    assert!(e1.trigger_checkpoint().is_ok());
    util::ckpt::stop_both(e1, e2);
}
