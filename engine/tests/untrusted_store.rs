//! The store is untrusted input: whoever can write the bucket can reseal every record (CRC32C is
//! not a MAC), so a restore checks names, sizes and shapes itself. Each test forges what a
//! hostile writer could and checks that the restore refuses it with a clear error and writes
//! nothing outside its own directory.

use std::path::Path;

use weir_engine::backup::commit::{commit_key, decode_commit, encode_commit};
use weir_engine::backup::*;
use weir_engine::checkpoint::CommitRecord;
use weir_engine::wire::{CheckpointId, StreamId, TaskId, Version};

const STREAM: StreamId = StreamId(1);
const TASK: TaskId = TaskId(2);
const CHK: CheckpointId = CheckpointId(1);

/// A store with one honest checkpoint of two small files; its manifest.
fn honest(root: &Path) -> (LocalDirStore, Manifest) {
    let store = LocalDirStore::new(root.join("remote"));
    let snap = root.join("snap");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("CURRENT"), b"MANIFEST-000001\n").unwrap();
    std::fs::write(snap.join("OPTIONS-000002"), vec![7u8; 300]).unwrap();
    upload_snapshot(&store, STREAM, TASK, CHK, Version(0), &snap).unwrap();
    let m = fetch_manifest(&store, STREAM, TASK, CHK, None).unwrap();
    (store, m)
}

/// Stores `m` as the checkpoint's manifest, sealed as an attacker would; returns its CRC (what a
/// forged commit record would name).
fn forge(store: &LocalDirStore, m: &Manifest) -> u32 {
    let text = m.encode();
    let key = format!("{}/tasks/{}/chk-{}/MANIFEST.weir", STREAM.0, TASK.0, CHK.0);
    store.put(&key, text.as_bytes()).unwrap();
    crc32c::crc32c(text.as_bytes())
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_forged_manifest_naming_a_path_outside_is_refused_and_nothing_is_written_outside() {
    let root = tempfile::tempdir().unwrap();
    let (store, honest_m) = honest(root.path());
    let outside_abs = root.path().join("escape-abs");
    let names = [
        "../../escape".to_string(),
        "../escape".to_string(),
        outside_abs.display().to_string(),
        "a/b".to_string(),
        "..".to_string(),
        String::new(),
        "x".repeat(300),
        "new\nline".to_string(),
    ];
    let restore = root.path().join("node/tasks/2/restore");
    for name in &names {
        let mut m = honest_m.clone();
        m.files[0].name = name.clone();
        let crc = forge(&store, &m);
        let before = files_under(root.path());
        let err = download_snapshot(&store, STREAM, TASK, CHK, Some(crc), &restore).unwrap_err();
        match &err {
            // A name with a newline breaks its line: refused as a bad line instead.
            StoreError::Corrupt { reason, .. } => {
                assert!(reason.contains("not a plain file name") || name.contains('\n'), "{name:?}: {err}")
            }
            other => panic!("{name:?}: expected a corrupt manifest, got {other}"),
        }
        assert!(!err.is_retryable());
        // Bypassing the manifest's parser (a bug upstream) still writes nothing.
        let err = download_files(&store, &m, &restore).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{name:?}: {err}");
        assert_eq!(files_under(root.path()), before, "{name:?}: something was written");
        assert!(!outside_abs.exists() && !root.path().join("escape").exists());
    }
    // A store key that climbs out of the store is refused as well.
    let mut m = honest_m.clone();
    m.files[0].key = "../../../etc/passwd".into();
    let crc = forge(&store, &m);
    let err = download_snapshot(&store, STREAM, TASK, CHK, Some(crc), &restore).unwrap_err();
    assert!(err.to_string().contains("not a plain key"), "{err}");
    // The honest manifest still restores.
    let crc = forge(&store, &honest_m);
    download_snapshot(&store, STREAM, TASK, CHK, Some(crc), &restore).unwrap();
    assert_eq!(std::fs::read(restore.join("OPTIONS-000002")).unwrap(), vec![7u8; 300]);
}

#[test]
fn an_object_larger_than_its_manifest_says_is_refused_before_it_is_read() {
    let root = tempfile::tempdir().unwrap();
    let (store, m) = honest(root.path());
    let big = m.files.iter().find(|f| f.name == "OPTIONS-000002").unwrap();
    store.put(&big.key, &vec![1u8; 1 << 20]).unwrap();
    let err = download_snapshot(&store, STREAM, TASK, CHK, None, &root.path().join("restore")).unwrap_err();
    match err {
        StoreError::TooLarge { size, max, .. } => assert_eq!((size, max), (1 << 20, 300)),
        other => panic!("expected TooLarge, got {other}"),
    }
    // Records are bounded too.
    let key = commit_key(STREAM, CHK);
    store.put(&key, &vec![b'x'; 4096]).unwrap();
    assert!(matches!(store.get_at_most(&key, 1024), Err(StoreError::TooLarge { size: 4096, max: 1024, .. })));
}

#[test]
fn a_truncated_or_reshaped_commit_record_is_refused() {
    let mut r = CommitRecord::consensus(CheckpointId(4), CheckpointId(3), 10);
    r.manifests.insert(TASK, 0xdead_beef);
    let text = encode_commit(&r);
    assert_eq!(decode_commit("k", text.as_bytes()).unwrap().id, CheckpointId(4));
    for cut in [0, 1, text.len() / 2, text.len() - 3] {
        let err = decode_commit("k", &text.as_bytes()[..cut]).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "cut at {cut}: {err}");
    }
}

#[cfg(unix)]
#[test]
fn a_restore_directory_that_is_a_link_is_replaced_not_followed() {
    let root = tempfile::tempdir().unwrap();
    let (store, _) = honest(root.path());
    let target = root.path().join("elsewhere");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), b"mine").unwrap();
    let restore = root.path().join("restore");
    std::os::unix::fs::symlink(&target, &restore).unwrap();
    download_snapshot(&store, STREAM, TASK, CHK, None, &restore).unwrap();
    assert!(!std::fs::symlink_metadata(&restore).unwrap().file_type().is_symlink());
    assert_eq!(files_under(&target), vec![target.join("keep").display().to_string()]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&restore).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn store_options_never_print_their_secrets() {
    let s3 = S3Options { secret_key: Some("s3-secret-value".into()), ..S3Options::default() };
    let rsync = RsyncOptions { password: Some("rsync-password-value".into()), ..RsyncOptions::default() };
    let shown = format!("{s3:?} {rsync:?} {:?}", StoreOptions { s3: s3.clone(), rsync: rsync.clone() });
    assert!(!shown.contains("s3-secret-value") && !shown.contains("rsync-password-value"), "{shown}");
}
