//! Falling back to an older commit on the real engine: when a task's files of the last commit are
//! damaged both on the node and in the store, the whole stream goes back together to the newest
//! commit every task can restore, and the results end exact; with none, it halts and never starts
//! empty.

mod util;

use std::path::Path;

use weir_engine::backup::commit::last_commit;
use weir_engine::backup::inspect::list_commits;
use weir_engine::backup::{LocalDirStore, Store, fetch_manifest};
use weir_engine::runtime::Engine;
use weir_engine::spec::{Placement, StreamSpec, TaskKind};
use weir_engine::state::NodeResults;
use weir_engine::wire::msg::RestoreBasis;
use weir_engine::wire::{CheckpointId, NodeId};

use util::ckpt::{config, spec, wait_for_commits, wait_restored};

/// Flips one byte in the middle of the file at `p` (a new file: no hard link shares the damage).
fn flip_a_byte(p: &Path) {
    let mut bytes = std::fs::read(p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::remove_file(p).unwrap();
    std::fs::write(p, &bytes).unwrap();
}

/// Damages the state file of every agg in checkpoint `id`, in the local snapshot and in the store.
fn damage_everywhere(dir: &Path, spec: &StreamSpec, id: CheckpointId) -> usize {
    let store = LocalDirStore::new(dir.join("remote"));
    let mut damaged = 0;
    for t in spec.topology().tasks.iter().filter(|t| matches!(t.kind, TaskKind::Agg { .. })) {
        let m = fetch_manifest(&store, spec.id, t.id, id, None).unwrap();
        for f in m.files.iter().filter(|f| f.name.starts_with("state-")) {
            flip_a_byte(&dir.join("remote").join(&f.key));
            let local = dir.join(format!("tasks/{}/snapshots/chk-{:020}/{}", t.id.0, id.0, f.name));
            if local.exists() {
                flip_a_byte(&local);
            }
            damaged += 1;
        }
    }
    damaged
}

fn committed(dir: &Path, spec: &StreamSpec) -> Vec<CheckpointId> {
    let store = LocalDirStore::new(dir.join("remote"));
    list_commits(&store, spec.id).unwrap().iter().filter_map(|r| r.restore_point()).collect()
}

#[test]
fn a_checkpoint_damaged_on_the_node_and_in_the_store_takes_the_stream_back_to_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    wait_for_commits(&engine, 3);
    engine.stop();
    engine.wait().unwrap();
    let ids = committed(dir.path(), &spec);
    let (last, previous) = (ids[ids.len() - 1], ids[ids.len() - 2]);
    assert!(damage_everywhere(dir.path(), &spec, last) >= 2);
    // Keep every record, to find the fallback's among them afterwards.
    let mut cfg = config(dir.path(), 80);
    cfg.checkpoint.as_mut().unwrap().retain = 0;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    assert_eq!(wait_restored(&engine), (RestoreBasis::Fallback, Some(previous)));
    engine.wait().unwrap();
    assert_eq!(NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap(), util::reference(&spec));
    // The choice is recorded above the damaged commit: a later start does not try it again.
    let store = LocalDirStore::new(dir.path().join("remote"));
    let records = list_commits(&store, spec.id).unwrap();
    assert!(
        records.iter().any(|r| r.kind == weir_engine::checkpoint::RecordKind::Fallback(previous) && r.id > last),
        "{records:?}"
    );
    assert!(last_commit(&store as &dyn Store, spec.id).unwrap().unwrap().id > last);
    assert!(records.iter().filter(|r| r.id > last).all(|r| r.restore_point() != Some(last)), "{records:?}");
}

#[test]
fn with_every_retained_checkpoint_damaged_the_stream_halts_and_never_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(100_000);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    wait_for_commits(&engine, 2);
    engine.stop();
    engine.wait().unwrap();
    let before = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    for id in committed(dir.path(), &spec) {
        damage_everywhere(dir.path(), &spec, id);
    }
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config(dir.path(), 80)).unwrap();
    let err = engine.wait().unwrap_err().to_string();
    assert!(err.contains("does not start empty") && err.contains("corrupt"), "{err}");
    assert_eq!(NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap(), before, "nothing moved");
}
