//! Falling back to an older commit on the real engine: when a task's files of the last commit are
//! damaged both on the node and in the store, the whole stream goes back together to the newest
//! commit every task can restore, and the results end exact; with none, it halts and never starts
//! empty.

mod util;

use std::path::Path;
use std::sync::Arc;

use weir_engine::backup::commit::last_commit;
use weir_engine::backup::inspect::list_commits;
use weir_engine::backup::{LocalDirStore, Store, fetch_manifest};
use weir_engine::runtime::{Engine, Remote};
use weir_engine::spec::{Placement, StreamSpec, TaskKind};
use weir_engine::state::{NodeResults, state_file_name};
use weir_engine::wire::msg::RestoreBasis;
use weir_engine::wire::{CheckpointId, NodeId};

use util::ckpt::{commit_then_stop, config, flip_a_byte, spec, wait_for_commits, wait_restored};

fn flipped(mut bytes: Vec<u8>) -> Vec<u8> {
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    bytes
}

/// Damages the state file every agg wrote for checkpoint `id` (not the files of its chain that
/// older checkpoints share), in the local snapshot and in `store`.
fn damage_everywhere(store: &dyn Store, dir: &Path, spec: &StreamSpec, id: CheckpointId) -> usize {
    let mut damaged = 0;
    for t in spec.topology().tasks.iter().filter(|t| matches!(t.kind, TaskKind::Agg { .. })) {
        let m = fetch_manifest(store, spec.id, t.id, id, None).unwrap();
        for f in m.files.iter().filter(|f| f.name == state_file_name(id)) {
            store.put(&f.key, &flipped(store.get(&f.key).unwrap())).unwrap();
            let local = dir.join(format!("tasks/{}/snapshots/chk-{:020}/{}", t.id.0, id.0, f.name));
            if local.exists() {
                flip_a_byte(&local);
            }
            damaged += 1;
        }
    }
    damaged
}

fn committed(store: &dyn Store, spec: &StreamSpec) -> Vec<CheckpointId> {
    list_commits(store, spec.id).unwrap().iter().filter_map(|r| r.restore_point()).collect()
}

fn with_store(dir: &Path, store: &Arc<dyn Store>) -> weir_engine::runtime::EngineConfig {
    let mut cfg = config(dir, 80);
    cfg.checkpoint.as_mut().unwrap().remote = Remote::Store(store.clone());
    cfg
}

/// Three commits into `store`; the last one's agg state damaged on the node and in the store; a
/// restart goes back to the one before, records it, and ends with exact results.
fn falls_back_to_the_previous_checkpoint(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    commit_then_stop(&spec, with_store(dir.path(), &store), 3);
    let ids = committed(store.as_ref(), &spec);
    let (last, previous) = (ids[ids.len() - 1], ids[ids.len() - 2]);
    assert!(damage_everywhere(store.as_ref(), dir.path(), &spec, last) >= 2);
    // Keep every record, to find the fallback's among them afterwards.
    let mut cfg = with_store(dir.path(), &store);
    cfg.checkpoint.as_mut().unwrap().retain = 0;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    assert_eq!(wait_restored(&engine), (RestoreBasis::Fallback, Some(previous)));
    engine.wait().unwrap();
    assert_eq!(NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap(), util::reference(&spec));
    // The choice is recorded above the damaged commit: a later start does not try it again.
    let records = list_commits(store.as_ref(), spec.id).unwrap();
    assert!(
        records.iter().any(|r| r.kind == weir_engine::checkpoint::RecordKind::Fallback(previous) && r.id > last),
        "{records:?}"
    );
    assert!(last_commit(store.as_ref(), spec.id).unwrap().unwrap().id > last);
    assert!(records.iter().filter(|r| r.id > last).all(|r| r.restore_point() != Some(last)), "{records:?}");
}

#[test]
fn a_checkpoint_damaged_on_the_node_and_in_the_store_takes_the_stream_back_to_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    falls_back_to_the_previous_checkpoint(Arc::new(LocalDirStore::new(dir.path())));
}

#[test]
fn a_checkpoint_damaged_on_the_node_and_in_s3_takes_the_stream_back_to_the_previous_one() {
    falls_back_to_the_previous_checkpoint(util::services::s3(&util::services::unique("fallback")));
}

#[test]
fn with_every_retained_checkpoint_damaged_the_stream_halts_and_never_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    commit_then_stop(&spec, config(dir.path(), 80), 2);
    let before = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    for id in committed(&store, &spec) {
        damage_everywhere(&store, dir.path(), &spec, id);
    }
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    let err = engine.wait().unwrap_err().to_string();
    assert!(err.contains("does not start empty") && err.contains("corrupt"), "{err}");
    assert_eq!(NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap(), before, "nothing moved");
}

#[test]
fn a_node_that_cannot_go_back_alone_halts_the_stream_and_both_nodes_restarted_go_back_together() {
    use weir_engine::spec::Placement;
    use weir_engine::wire::NodeId;

    let (d1, d2, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = spec(100_000);
    let quick = |ck: &mut weir_engine::runtime::CheckpointSettings| {
        ck.consensus_wait_ms = 1_000;
        ck.retain = 0;
    };
    let (e1, e2) = util::ckpt::two_engines_with(&spec, d1.path(), d2.path(), remote.path(), quick);
    wait_for_commits(&e1, 3);
    util::ckpt::stop_both(e1, e2);
    let store = LocalDirStore::new(remote.path());
    let ids = committed(&store, &spec);
    let (last, previous) = (ids[ids.len() - 1], ids[ids.len() - 2]);
    // Node 2's aggs lose the last checkpoint (in its snapshots and in the store); node 1's do not.
    let placement = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2)]);
    let mut damaged = 0;
    for t in spec.topology().tasks.iter().filter(|t| matches!(t.kind, TaskKind::Agg { .. })) {
        if placement.node_of(t.id) != NodeId(2) {
            continue;
        }
        let m = fetch_manifest(&store, spec.id, t.id, last, None).unwrap();
        for f in m.files.iter().filter(|f| f.name == state_file_name(last)) {
            store.put(&f.key, &flipped(store.get(&f.key).unwrap())).unwrap();
            let local = d2.path().join(format!("tasks/{}/snapshots/chk-{:020}/{}", t.id.0, last.0, f.name));
            if local.exists() {
                flip_a_byte(&local);
            }
            damaged += 1;
        }
    }
    assert!(damaged >= 1, "node 2 holds an agg");
    // Node 1 restores the last commit and runs; node 2 cannot and asks to go back. Node 1's tasks
    // cannot go back with it, so the stream halts, with the fallback recorded.
    let (e1, e2) = util::ckpt::two_engines_with(&spec, d1.path(), d2.path(), remote.path(), quick);
    let err = e1.wait().unwrap_err().to_string();
    assert!(err.contains("restart every node") && err.contains(&previous.to_string()), "{err}");
    assert_eq!(e2.restored(), None, "node 2 never restored");
    e2.stop();
    let _ = e2.wait();
    let record = last_commit(&store as &dyn Store, spec.id).unwrap().unwrap();
    assert_eq!(record.restore_point(), Some(previous), "{record:?}");
    // Both restarted: both go back to it, and the results end exact.
    let (e1, e2) = util::ckpt::two_engines_with(&spec, d1.path(), d2.path(), remote.path(), quick);
    assert_eq!(wait_restored(&e1), (RestoreBasis::Fallback, Some(previous)));
    let (h1, h2) = (std::thread::spawn(move || e1.wait()), std::thread::spawn(move || e2.wait()));
    h1.join().unwrap().unwrap();
    h2.join().unwrap().unwrap();
    let mut got = NodeResults::open(d1.path()).unwrap().scan(spec.id).unwrap();
    got.extend(NodeResults::open(d2.path()).unwrap().scan(spec.id).unwrap());
    got.sort_by_key(|r| (r.key, r.start));
    assert_eq!(got, util::reference(&spec));
}
