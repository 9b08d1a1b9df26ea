//! The incremental upload of a sink's result store, against any store.

use std::path::Path;

use weir_engine::backup::{Store, UploadIndex, download_files, fetch_manifest, upload_snapshot_indexed};
use weir_engine::operator::window::WindowResult;
use weir_engine::state::ResultStore;
use weir_engine::wire::{CheckpointId, StreamId, TaskId, Version};

fn results(from: u64, n: u64, count: u64) -> Vec<WindowResult> {
    (from..from + n).map(|key| WindowResult { key, start: 0, count, sum: 1.0, min: 0.0, max: 1.0 }).collect()
}

fn sst_objects(store: &dyn Store) -> Vec<String> {
    store.list("1/tasks/4/sst/").unwrap()
}

/// A sink's result store with 200,000 results is checkpointed into `store`; ten results more, and
/// the next checkpoint sends exactly one new SST object: the bytes sent are that file, the
/// checkpoint's small files and the manifest. The second checkpoint restores whole.
pub fn a_small_change_uploads_only_the_new_files(store: &dyn Store, dir: &Path) {
    let live = ResultStore::open(&dir.join("live")).unwrap();
    let (s, t) = (StreamId(1), TaskId(4));
    live.upsert(s, TaskId(2), &results(0, 200_000, 1)).unwrap();
    let index = std::sync::Mutex::new(UploadIndex::new());
    live.checkpoint(&dir.join("chk-1")).unwrap();
    let up1 = upload_snapshot_indexed(store, s, t, CheckpointId(1), Version(0), &dir.join("chk-1"), &index).unwrap();
    let after1 = sst_objects(store);
    assert!(!after1.is_empty() && index.lock().unwrap().len() == after1.len(), "{after1:?} {index:?}");
    // Ten results more: one small new SST file goes up, with the checkpoint's small files.
    live.upsert(s, TaskId(2), &results(1_000_000, 10, 1)).unwrap();
    let chk2 = dir.join("chk-2");
    live.checkpoint(&chk2).unwrap();
    let up2 = upload_snapshot_indexed(store, s, t, CheckpointId(2), Version(0), &chk2, &index).unwrap();
    let after2 = sst_objects(store);
    assert_eq!(after2.len(), after1.len() + 1, "exactly one new SST object: {after1:?} → {after2:?}");
    let new_sst = after2.iter().find(|k| !after1.contains(k)).unwrap();
    let small: u64 = std::fs::read_dir(&chk2)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".sst"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let manifest = fetch_manifest(store, s, t, CheckpointId(2), Some(up2.manifest_crc)).unwrap();
    let manifest_len = manifest.encode().len() as u64;
    assert_eq!(
        up2.bytes,
        store.size(new_sst).unwrap().unwrap() + small + manifest_len,
        "the new SST file, the small files and the manifest: nothing else"
    );
    assert!(up2.bytes * 20 < up1.bytes, "{} vs {}", up2.bytes, up1.bytes);
    // The second checkpoint names the first one's files, and restores whole.
    let dl = dir.join("dl");
    download_files(store, &manifest, &dl).unwrap();
    let back = ResultStore::open(&dir.join("back")).unwrap();
    back.restore_from(&dl).unwrap();
    assert_eq!(back.scan(s).unwrap().len(), 200_010);
}

/// A sink's flushed result files go to `store` ahead of its checkpoint, named by the task's ahead
/// record; the checkpoint then sends its last file and small files only, its manifest names the
/// files stored ahead, and it restores every result from `store`.
pub fn results_stored_ahead_make_a_checkpoint_that_restores(store: &dyn Store, dir: &Path) {
    use std::sync::{Arc, Mutex};
    use weir_engine::backup::ahead::{AheadWriter, Watched, ahead_record_key, decode_record};

    let live = Arc::new(ResultStore::open(&dir.join("live")).unwrap());
    let (s, t) = (StreamId(1), TaskId(4));
    for w in 0..3 {
        live.upsert(s, TaskId(2), &results(w * 100_000, 50_000, 1)).unwrap();
        live.flush().unwrap();
    }
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    let writer = AheadWriter { incarnation: 1 << 32, node: weir_engine::wire::NodeId(1) };
    let mut watched = Watched::new(t, writer, live.clone(), index.clone());
    let ahead = watched.pass(store, s, &|| {}).unwrap();
    assert!(ahead.files >= 3, "{ahead:?}");
    let record = ahead_record_key(s, t, writer);
    let named = decode_record(&record, &store.get(&record).unwrap()).unwrap();
    assert_eq!(named.len(), ahead.files as usize);
    for key in &named {
        assert!(store.size(key).unwrap().is_some(), "{key}");
    }
    live.upsert(s, TaskId(2), &results(1_000_000, 10, 1)).unwrap();
    let chk = dir.join("chk-1");
    live.checkpoint(&chk).unwrap();
    let up = upload_snapshot_indexed(store, s, t, CheckpointId(1), Version(0), &chk, &index).unwrap();
    assert!(up.bytes < ahead.bytes / 10, "sent {} bytes after {} stored ahead", up.bytes, ahead.bytes);
    let manifest = fetch_manifest(store, s, t, CheckpointId(1), Some(up.manifest_crc)).unwrap();
    assert!(named.iter().all(|k| manifest.files.iter().any(|f| &f.key == k)), "the manifest names them");
    let dl = dir.join("dl");
    download_files(store, &manifest, &dl).unwrap();
    let back = ResultStore::open(&dir.join("back")).unwrap();
    back.restore_from(&dl).unwrap();
    assert_eq!(back.scan(s).unwrap(), live.scan(s).unwrap());
    assert_eq!(back.scan(s).unwrap().len(), 150_010);
}
