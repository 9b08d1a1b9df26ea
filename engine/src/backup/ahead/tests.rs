//! The upload-ahead passes and thread, against real result stores and directories.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_wire::{CheckpointId, NodeId, StreamId, TaskId, Version};

use super::*;
use crate::backup::{LocalDirStore, download_snapshot, fetch_manifest, upload_snapshot_indexed};
use crate::operator::window::WindowResult;
use crate::state::ResultStore;

const S: StreamId = StreamId(1);
const T: TaskId = TaskId(4);
const W: AheadWriter = AheadWriter { incarnation: 7, node: NodeId(2) };

/// The `.sst` files of a directory, as finished files.
struct Dir(PathBuf);

impl LiveSsts for Dir {
    fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError> {
        let mut files: Vec<LiveSst> = std::fs::read_dir(&self.0)
            .map_err(crate::state::io_err(&self.0))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "sst"))
            .map(|path| LiveSst {
                name: path.file_name().unwrap().to_string_lossy().into(),
                size: std::fs::metadata(&path).unwrap().len(),
                path,
            })
            .collect();
        files.sort_by(|a, b| a.name.cmp(&b.name));
        f(&files);
        Ok(())
    }
}

fn record(store: &dyn Store) -> Vec<String> {
    let key = ahead_record_key(S, T, W);
    decode_record(&key, &store.get(&key).unwrap()).unwrap()
}

fn results(start: i64, n: u64) -> Vec<WindowResult> {
    (0..n).map(|k| WindowResult { key: k, start, count: k + 1, sum: k as f64, min: 0.5, max: k as f64 * 2.0 }).collect()
}

fn bytes_of(dir: &Path, sst: bool) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sst") == sst)
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn files_stored_ahead_are_recorded_and_the_next_checkpoint_sends_only_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let remote = LocalDirStore::new(dir.path().join("remote"));
    let results_store = Arc::new(ResultStore::open(&dir.path().join("results")).unwrap());
    for start in [0, 1000, 2000] {
        results_store.upsert(S, TaskId(2), &results(start, 20_000)).unwrap();
        results_store.flush().unwrap();
    }
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    let mut w = Watched::new(T, W, results_store.clone(), index.clone());
    let ahead = w.pass(&remote, S, &|| {}).unwrap();
    assert!(ahead.files >= 3 && ahead.bytes > 0, "{ahead:?}");
    let named = record(&remote);
    assert_eq!(named.len(), ahead.files as usize);
    for key in &named {
        assert!(remote.size(key).unwrap().is_some(), "{key} is stored");
    }
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass::default(), "nothing new");

    // One more window, then a checkpoint: only its file and the small files go up.
    results_store.upsert(S, TaskId(2), &results(3000, 20_000)).unwrap();
    let chk = dir.path().join("chk-1");
    results_store.checkpoint(&chk).unwrap();
    let up = upload_snapshot_indexed(&remote, S, T, CheckpointId(1), Version(9), &chk, &index).unwrap();
    let expected = bytes_of(&chk, true) - ahead.bytes + bytes_of(&chk, false);
    assert!(up.bytes >= expected && up.bytes < expected + 4096, "sent {} bytes, new files {expected}", up.bytes);
    let manifest = fetch_manifest(&remote, S, T, CheckpointId(1), Some(up.manifest_crc)).unwrap();
    assert!(named.iter().all(|k| manifest.files.iter().any(|f| &f.key == k)), "the manifest names them");
    w.pass(&remote, S, &|| {}).unwrap();
    assert_eq!(record(&remote), Vec::<String>::new(), "a manifest names them now: the record lets go");

    // The checkpoint restores every result.
    let dl = dir.path().join("dl");
    download_snapshot(&remote, S, T, CheckpointId(1), Some(up.manifest_crc), &dl).unwrap();
    let back = ResultStore::open(&dir.path().join("back")).unwrap();
    back.restore_from(&dl).unwrap();
    assert_eq!(back.scan(S).unwrap(), results_store.scan(S).unwrap());
    assert_eq!(back.scan(S).unwrap().len(), 80_000);
}

#[test]
fn a_file_gone_before_a_manifest_names_it_leaves_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
    std::fs::create_dir_all(&db).unwrap();
    std::fs::write(db.join("000007.sst"), vec![7u8; 1000]).unwrap();
    std::fs::write(db.join("000008.sst"), vec![8u8; 2000]).unwrap();
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    let mut w = Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone());
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass { files: 2, bytes: 3000 });
    assert_eq!(record(&remote).len(), 2);
    std::fs::remove_file(db.join("000007.sst")).unwrap(); // compacted away
    w.pass(&remote, S, &|| {}).unwrap();
    let left = record(&remote);
    assert!(left.len() == 1 && left[0].contains("/sst/000008-"), "{left:?}");
    assert!(index.lock().unwrap().get("000007.sst", 1000).is_none());
    assert!(index.lock().unwrap().get("000008.sst", 2000).is_some());
}

#[test]
fn a_checkpoint_holding_the_index_is_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
    std::fs::create_dir_all(&db).unwrap();
    std::fs::write(db.join("000007.sst"), vec![7u8; 1000]).unwrap();
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    let mut w = Watched::new(T, W, Arc::new(Dir(db)), index.clone());
    let held = index.lock().unwrap();
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap(), AheadPass::default());
    assert!(remote.list("1/").unwrap().is_empty(), "nothing stored while a checkpoint uploads");
    drop(held);
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
}

#[test]
fn files_flushed_while_a_checkpoint_uploads_are_stored_ahead_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let (db, chk) = (dir.path().join("db"), dir.path().join("chk-1"));
    std::fs::create_dir_all(&db).unwrap();
    std::fs::create_dir_all(&chk).unwrap();
    // 6 is stored ahead; the checkpoint holds 6 and 7, and its upload of 7 is held.
    for (n, b) in [(6, 600), (7, 700)] {
        std::fs::write(db.join(format!("00000{n}.sst")), vec![n as u8; b]).unwrap();
        std::fs::write(chk.join(format!("00000{n}.sst")), vec![n as u8; b]).unwrap();
    }
    std::fs::write(chk.join("CURRENT"), b"MANIFEST-000001\n").unwrap();
    let (release, held) = crossbeam_channel::bounded::<()>(0);
    let remote = Arc::new(crate::backup::test_store::HookedStore::new(
        LocalDirStore::new(dir.path().join("remote")),
        move |inner, key, bytes| {
            if key.contains("/sst/000007-") {
                // Until the test lets go (drops the sender); bounded, so that a pass that
                // stored 7 too fails the test instead of hanging it.
                let _ = held.recv_timeout(Duration::from_secs(5));
            }
            inner.put(key, bytes)
        },
    ));
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    std::fs::remove_file(db.join("000007.sst")).unwrap();
    let mut w = Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone());
    assert_eq!(w.pass(remote.as_ref(), S, &|| {}).unwrap().files, 1);
    std::fs::write(db.join("000007.sst"), vec![7u8; 700]).unwrap();
    let upload = {
        let (remote, index, chk) = (remote.clone(), index.clone(), chk.clone());
        std::thread::spawn(move || {
            upload_snapshot_indexed(remote.as_ref(), S, T, CheckpointId(1), Version(9), &chk, &index)
        })
    };
    let t0 = Instant::now();
    while !index.lock().unwrap().uploading() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the upload did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Flushed after the checkpoint: stored while the upload is held; 7 is the upload's, and 6,
    // compacted away meanwhile, stays recorded (the upload's manifest names it).
    std::fs::write(db.join("000008.sst"), vec![8u8; 800]).unwrap();
    std::fs::remove_file(db.join("000006.sst")).unwrap();
    assert_eq!(w.pass(remote.as_ref(), S, &|| {}).unwrap(), AheadPass { files: 1, bytes: 800 });
    let during = record(remote.as_ref());
    assert_eq!(during.len(), 2, "{during:?}");
    assert!(during.iter().any(|k| k.contains("/sst/000006-")) && during.iter().any(|k| k.contains("/sst/000008-")));
    drop(release);
    let up = upload.join().unwrap().unwrap();
    let manifest = fetch_manifest(remote.as_ref(), S, T, CheckpointId(1), Some(up.manifest_crc)).unwrap();
    let named: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(named, ["000006.sst", "000007.sst", "CURRENT"]);
    w.pass(remote.as_ref(), S, &|| {}).unwrap();
    let after = record(remote.as_ref());
    assert!(after.len() == 1 && after[0].contains("/sst/000008-"), "{after:?}");
    let idx = index.lock().unwrap();
    assert!(idx.get("000008.sst", 800).is_some() && !idx.uploading() && !idx.is_claimed("000007.sst"));
}

/// [`Dir`] with a version the test sets, counting its listings.
struct Versioned(Dir, AtomicU64, AtomicUsize);

impl LiveSsts for Versioned {
    fn with_live_ssts(&self, f: &mut dyn FnMut(&[LiveSst])) -> Result<(), crate::state::StateError> {
        self.2.fetch_add(1, Ordering::Relaxed);
        self.0.with_live_ssts(f)
    }

    fn version(&self) -> Option<u64> {
        Some(self.1.load(Ordering::Relaxed))
    }
}

#[test]
fn files_are_listed_again_only_once_their_version_moved_or_a_pass_was_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let (db, remote) = (dir.path().join("db"), LocalDirStore::new(dir.path().join("remote")));
    std::fs::create_dir_all(&db).unwrap();
    std::fs::write(db.join("000007.sst"), vec![7u8; 100]).unwrap();
    let live = Arc::new(Versioned(Dir(db.clone()), AtomicU64::new(1), AtomicUsize::new(0)));
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    let mut w = Watched::new(T, W, live.clone(), index.clone());
    let listings = || live.2.load(Ordering::Relaxed);
    // Cut short by a checkpoint's upload: the version is not taken as seen.
    let held = index.lock().unwrap();
    w.pass(&remote, S, &|| {}).unwrap();
    drop(held);
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
    assert_eq!(listings(), 2);
    std::fs::write(db.join("000008.sst"), vec![8u8; 100]).unwrap();
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 0, "the same version: not listed");
    assert_eq!(listings(), 2);
    live.1.store(2, Ordering::Relaxed);
    assert_eq!(w.pass(&remote, S, &|| {}).unwrap().files, 1);
    assert_eq!(listings(), 3);
}

#[test]
fn the_thread_stores_a_watched_tasks_files_until_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    std::fs::create_dir_all(&db).unwrap();
    let remote: Arc<dyn Store> = Arc::new(LocalDirStore::new(dir.path().join("remote")));
    let ahead = AheadUploader::start(remote.clone(), S, Arc::new(AtomicUsize::new(0)), || {}).unwrap();
    let index = Arc::new(Mutex::new(UploadIndex::new()));
    ahead.watch(Watched::new(T, W, Arc::new(Dir(db.clone())), index.clone()));
    std::fs::write(db.join("000009.sst"), vec![9u8; 4096]).unwrap();
    let t0 = Instant::now();
    while index.lock().unwrap().get("000009.sst", 4096).is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "not stored ahead");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ahead);
    assert_eq!(record(remote.as_ref()).len(), 1);
}
