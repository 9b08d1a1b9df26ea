//! Snapshot upload and restore through the local-directory store, with verification.

mod util;

use weir_engine::backup::*;
use weir_engine::operator::window::WindowResult;
use weir_engine::operator::window::{WindowAgg, WindowSpec};
use weir_engine::state::{ResultStore, TaskStore, load_window_state, save_window_state};
use weir_engine::wire::{CheckpointId, StreamId, TaskId, Version};

fn agg_with(rows: i64) -> WindowAgg {
    let mut a = WindowAgg::new(WindowSpec::tumbling(100), 0, 1);
    for i in 0..rows {
        a.add(i, (i % 97) as u64, i as f64);
    }
    a
}

#[test]
fn uploaded_snapshot_restores_the_same_state_and_sst_files_go_up_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let live = TaskStore::open(&dir.path().join("live")).unwrap();
    let mut agg = agg_with(50_000);
    save_window_state(&live, &mut agg).unwrap();
    live.snapshot(&dir.path().join("chk-1")).unwrap();
    let up1 = upload_snapshot(&store, StreamId(1), TaskId(3), CheckpointId(1), Version(0), &dir.path().join("chk-1"))
        .unwrap();
    let (crc1, sent1) = (up1.manifest_crc, up1.bytes);
    assert!(sent1 > 0 && up1.files >= 3, "{up1:?}");
    // A second checkpoint with the same SST files sends only the small files.
    live.snapshot(&dir.path().join("chk-2")).unwrap();
    let sent2 = upload_snapshot(&store, StreamId(1), TaskId(3), CheckpointId(2), Version(0), &dir.path().join("chk-2"))
        .unwrap()
        .bytes;
    assert!(sent2 < sent1, "incremental upload sent {sent2} bytes, the first {sent1}");

    let m =
        download_snapshot(&store, StreamId(1), TaskId(3), CheckpointId(1), Some(crc1), &dir.path().join("dl")).unwrap();
    assert_eq!(m.id, CheckpointId(1));
    let restored = TaskStore::open_from_snapshot(&dir.path().join("dl"), &dir.path().join("restored")).unwrap();
    let mut back = WindowAgg::new(WindowSpec::tumbling(100), 0, 1);
    assert!(load_window_state(&restored, &mut back).unwrap());
    let mut a: Vec<_> = agg.state().collect();
    let mut b: Vec<_> = back.state().collect();
    a.sort_by_key(|e| (e.0, e.1));
    b.sort_by_key(|e| (e.0, e.1));
    assert_eq!(a, b);
}

#[test]
fn damaged_objects_are_refused_on_download() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let live = TaskStore::open(&dir.path().join("live")).unwrap();
    save_window_state(&live, &mut agg_with(1000)).unwrap();
    live.snapshot(&dir.path().join("chk-1")).unwrap();
    let crc = upload_snapshot(&store, StreamId(1), TaskId(0), CheckpointId(1), Version(7), &dir.path().join("chk-1"))
        .unwrap()
        .manifest_crc;
    // A manifest that is not the one the commit names.
    let err = download_snapshot(&store, StreamId(1), TaskId(0), CheckpointId(1), Some(crc ^ 1), &dir.path().join("x"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }) && !err.is_retryable(), "{err}");
    // A stored file flipped.
    let key = store.list("1/tasks/0/").unwrap().into_iter().find(|k| k.ends_with(".sst")).expect("an sst file");
    let mut bytes = store.get(&key).unwrap();
    bytes[10] ^= 0xFF;
    store.put(&key, &bytes).unwrap();
    let err = download_snapshot(&store, StreamId(1), TaskId(0), CheckpointId(1), Some(crc), &dir.path().join("y"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { key: k, .. } if k == key));
    // A missing checkpoint.
    let err =
        download_snapshot(&store, StreamId(1), TaskId(0), CheckpointId(9), None, &dir.path().join("z")).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }));
}

#[test]
fn manifest_checksum_detects_edits() {
    let m = Manifest {
        format: MANIFEST_FORMAT,
        id: CheckpointId(4),
        version: Version(99),
        files: vec![ManifestEntry { name: "CURRENT".into(), key: "1/tasks/0/chk-4/CURRENT".into(), size: 16, crc: 7 }],
        offsets: Vec::new(),
        outputs: Vec::new(),
        replay: None,
    };
    let text = m.encode();
    assert_eq!(Manifest::decode("k", text.as_bytes()).unwrap(), m);
    let edited = text.replace("version 99", "version 98");
    assert!(Manifest::decode("k", edited.as_bytes()).is_err());
}

#[test]
fn a_manifests_offsets_and_replay_point_roundtrip() {
    use weir_engine::backup::ReplayPoint;
    let source = Manifest {
        format: MANIFEST_FORMAT,
        id: CheckpointId(9),
        version: Version(900),
        files: Vec::new(),
        offsets: vec![(CheckpointId(7), Version(700)), (CheckpointId(9), Version(900))],
        outputs: vec![(CheckpointId(9), vec![750, 900, 0])],
        replay: None,
    };
    let agg = Manifest {
        version: Version(0),
        offsets: Vec::new(),
        outputs: Vec::new(),
        replay: Some(ReplayPoint {
            from: CheckpointId(7),
            taken: vec![(10, 20), (0, 5)],
            written: vec![-60_000, 0],
            partial: vec![60_000],
            resume: false,
        }),
        ..source.clone()
    };
    let resumed = Manifest {
        replay: Some(ReplayPoint { from: CheckpointId(9), taken: vec![(12, 20)], resume: true, ..Default::default() }),
        ..agg.clone()
    };
    for m in [source, agg, resumed] {
        assert_eq!(Manifest::decode("k", m.encode().as_bytes()).unwrap(), m);
    }
}

#[test]
fn a_manifest_of_format_5_reads_without_offsets_or_replay_point() {
    // As Weir wrote it before replay checkpoints (format 5): no offset or replay lines.
    let m = Manifest {
        format: 5,
        id: CheckpointId(3),
        version: Version(30),
        files: Vec::new(),
        offsets: Vec::new(),
        outputs: Vec::new(),
        replay: None,
    };
    let read = Manifest::decode("k", m.encode().as_bytes()).unwrap();
    assert_eq!((read.format, read.version, read.offsets.len(), read.replay), (5, Version(30), 0, None));
}

/// Seals `body` the way stored records are (a trailing CRC32C line).
fn sealed(body: &str) -> String {
    format!("{body}crc {:08x}\n", crc32c::crc32c(body.as_bytes()))
}

#[test]
fn a_manifest_of_an_older_format_reads_and_one_of_a_newer_is_refused_naming_both() {
    let old = sealed("weir-manifest 1\nid 4\nversion 9\nfile 16 1/tasks/0/chk-4/CURRENT 00000007 CURRENT\n");
    let m = Manifest::decode("k", old.as_bytes()).unwrap();
    assert_eq!((m.format, m.id, m.version, m.files.len()), (1, CheckpointId(4), Version(9), 1));
    let newer = sealed(&format!("weir-manifest {}\nid 4\nversion 9\n", MANIFEST_FORMAT + 1));
    let err = Manifest::decode("k", newer.as_bytes()).unwrap_err().to_string();
    assert!(
        err.contains(&format!("format {}", MANIFEST_FORMAT + 1)) && err.contains(&format!("1 to {MANIFEST_FORMAT}")),
        "{err}"
    );
}

#[test]
fn local_store_keys_list_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path());
    store.put("s/a/1", b"one").unwrap();
    store.put("s/a/2", b"two").unwrap();
    store.put("s/b/1", b"three").unwrap();
    assert_eq!(store.list("s/a/").unwrap(), vec!["s/a/1".to_string(), "s/a/2".to_string()]);
    assert_eq!(store.get("s/b/1").unwrap(), b"three");
    assert_eq!(store.size("s/a/2").unwrap(), Some(3));
    store.delete("s/a/1").unwrap();
    store.delete("s/a/1").unwrap();
    assert!(matches!(store.get("s/a/1"), Err(StoreError::NotFound { .. })));
    assert!(store.put("../escape", b"x").is_err());
}

#[test]
fn a_local_snapshot_is_used_only_when_every_file_matches_the_manifest() {
    use weir_engine::state::write_window_snapshot;
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let mut agg = agg_with(5_000);
    let local = dir.path().join("chk-1");
    let sst = local.join("state-00000000000000000001.sst");
    write_window_snapshot(&agg.freeze(), &sst).unwrap();
    let up = upload_snapshot(&store, StreamId(1), TaskId(2), CheckpointId(1), Version(0), &local).unwrap();
    let m = fetch_manifest(&store, StreamId(1), TaskId(2), CheckpointId(1), Some(up.manifest_crc)).unwrap();
    assert_eq!(m.files.len(), 1);
    assert!(local_snapshot_matches(&m, &local));
    // The snapshot opens into a store that holds the same state.
    let restored = TaskStore::open_from_snapshot(&local, &dir.path().join("db")).unwrap();
    let mut back = WindowAgg::new(WindowSpec::tumbling(100), 0, 1);
    assert!(load_window_state(&restored, &mut back).unwrap());
    let (mut a, mut b): (Vec<_>, Vec<_>) = (agg.state().collect(), back.state().collect());
    a.sort_by_key(|e| (e.0, e.1));
    b.sort_by_key(|e| (e.0, e.1));
    assert_eq!(a, b);
    // A damaged file (a new file, not the store's hard link), an extra file, a missing directory.
    let mut bytes = std::fs::read(&sst).unwrap();
    bytes[100] ^= 1;
    std::fs::remove_file(&sst).unwrap();
    std::fs::write(&sst, &bytes).unwrap();
    assert!(!local_snapshot_matches(&m, &local));
    download_files(&store, &m, &local).unwrap();
    assert!(local_snapshot_matches(&m, &local), "the download replaces the damaged snapshot");
    std::fs::write(local.join("extra.sst"), b"x").unwrap();
    assert!(!local_snapshot_matches(&m, &local));
    assert!(!local_snapshot_matches(&m, &dir.path().join("nothing-here")));
}

#[test]
fn a_damaged_byte_in_the_local_store_leaves_the_local_snapshot_intact() {
    // The file:// store copies: it shares no bytes with the node's snapshot (a hard link did).
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let live = TaskStore::open(&dir.path().join("live")).unwrap();
    save_window_state(&live, &mut agg_with(20_000)).unwrap();
    let local = dir.path().join("chk-1");
    live.snapshot(&local).unwrap();
    let up = upload_snapshot(&store, StreamId(1), TaskId(2), CheckpointId(1), Version(0), &local).unwrap();
    let m = fetch_manifest(&store, StreamId(1), TaskId(2), CheckpointId(1), Some(up.manifest_crc)).unwrap();
    let sst = m.files.iter().find(|f| f.name.ends_with(".sst")).expect("an SST file");
    let stored = dir.path().join("remote").join(&sst.key);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[10] ^= 0xff;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&stored)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(&bytes)
        })
        .unwrap();
    assert!(local_snapshot_matches(&m, &local), "the local snapshot is untouched");
    let err = download_files(&store, &m, &dir.path().join("dl")).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

fn results(from: u64, n: u64, count: u64) -> Vec<WindowResult> {
    (from..from + n).map(|key| WindowResult { key, start: 0, count, sum: 1.0, min: 0.0, max: 1.0 }).collect()
}

fn sst_objects(store: &dyn Store) -> Vec<String> {
    store.list("1/tasks/4/sst/").unwrap()
}

#[test]
fn after_a_small_change_a_sinks_next_checkpoint_uploads_only_its_new_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    util::uploads::a_small_change_uploads_only_the_new_files(&store, dir.path());
}

#[test]
fn a_file_number_reused_after_a_restore_never_overwrites_a_stored_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let live = ResultStore::open(&dir.path().join("live")).unwrap();
    let (s, t) = (StreamId(1), TaskId(4));
    let index = std::sync::Mutex::new(UploadIndex::new());
    live.upsert(s, TaskId(2), &results(0, 1000, 1)).unwrap();
    live.checkpoint(&dir.path().join("chk-1")).unwrap();
    upload_snapshot_indexed(&store, s, t, CheckpointId(1), Version(0), &dir.path().join("chk-1"), &index).unwrap();
    let index1 = index.lock().unwrap().clone();
    live.upsert(s, TaskId(2), &results(0, 1000, 2)).unwrap();
    live.checkpoint(&dir.path().join("chk-2")).unwrap();
    let up2 =
        upload_snapshot_indexed(&store, s, t, CheckpointId(2), Version(0), &dir.path().join("chk-2"), &index).unwrap();
    // Back to checkpoint 1 (as a fallback would): RocksDB hands out checkpoint 2's file numbers
    // again, for other bytes.
    live.restore_from(&dir.path().join("chk-1")).unwrap();
    let index = std::sync::Mutex::new(index1);
    live.upsert(s, TaskId(2), &results(0, 1000, 3)).unwrap();
    live.checkpoint(&dir.path().join("chk-3")).unwrap();
    let names = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sst"))
            .collect();
        v.sort();
        v
    };
    assert!(names("chk-3").iter().any(|n| names("chk-2").contains(n)), "a file name is reused: {:?}", names("chk-3"));
    upload_snapshot_indexed(&store, s, t, CheckpointId(3), Version(0), &dir.path().join("chk-3"), &index).unwrap();
    // Checkpoint 2's files are intact: every one still matches its manifest.
    let m2 = fetch_manifest(&store, s, t, CheckpointId(2), Some(up2.manifest_crc)).unwrap();
    download_files(&store, &m2, &dir.path().join("dl2")).unwrap();
    let back = ResultStore::open(&dir.path().join("back")).unwrap();
    back.restore_from(&dir.path().join("dl2")).unwrap();
    assert!(back.scan(s).unwrap().iter().all(|r| r.count == 2));
    let m3 = fetch_manifest(&store, s, t, CheckpointId(3), None).unwrap();
    download_files(&store, &m3, &dir.path().join("dl3")).unwrap();
    back.restore_from(&dir.path().join("dl3")).unwrap();
    assert!(back.scan(s).unwrap().iter().all(|r| r.count == 3));
}

#[test]
fn files_gone_from_the_store_drop_out_of_the_upload_index_and_go_up_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path().join("remote"));
    let live = ResultStore::open(&dir.path().join("live")).unwrap();
    let (s, t) = (StreamId(1), TaskId(4));
    live.upsert(s, TaskId(2), &results(0, 1000, 1)).unwrap();
    live.checkpoint(&dir.path().join("chk-1")).unwrap();
    let up = upload_snapshot(&store, s, t, CheckpointId(1), Version(0), &dir.path().join("chk-1")).unwrap();
    // What a restart rebuilds: the restored manifest's files, checked against the store.
    let m = fetch_manifest(&store, s, t, CheckpointId(1), Some(up.manifest_crc)).unwrap();
    let mut index = UploadIndex::from_manifest(&m);
    assert_eq!(index.check(&store, s, t).unwrap(), 0);
    let ssts = sst_objects(&store);
    store.delete(&ssts[0]).unwrap();
    assert_eq!(index.check(&store, s, t).unwrap(), 1, "the deleted file is no longer known");
    live.checkpoint(&dir.path().join("chk-2")).unwrap();
    let index = std::sync::Mutex::new(index);
    upload_snapshot_indexed(&store, s, t, CheckpointId(2), Version(0), &dir.path().join("chk-2"), &index).unwrap();
    assert_eq!(sst_objects(&store), ssts, "sent again under the same key");
}
