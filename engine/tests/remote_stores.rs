//! The remote stores against real servers on 127.0.0.1 (started by `scripts/services`): the
//! local directory, S3 on `s3s-fs` (which checks request signatures) and an rsync daemon whose
//! module needs a user and password. Each backend keeps the same contract; wrong credentials and
//! unreachable servers give clear errors; a stream checkpoints into each and restores from it
//! alone after its node lost every local snapshot.

mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::backup::{RsyncStore, S3Options, S3Store, Store, StoreError};
use weir_engine::runtime::{Engine, Remote};
use weir_engine::spec::Placement;
use weir_engine::state::NodeResults;
use weir_engine::wire::NodeId;
use weir_engine::wire::msg::RestoreBasis;

use util::ckpt::{config, spec_at, wait_for_commits, wait_restored};
use util::services;

/// What every store must do, whatever its backend.
fn keeps_the_contract(store: &dyn Store, tmp: &std::path::Path) {
    assert!(matches!(store.get("a/none"), Err(StoreError::NotFound { .. })), "{store:?}");
    assert_eq!(store.size("a/none").unwrap(), None);
    assert!(store.list("a/").unwrap().is_empty());
    store.put("a/b/one", b"first").unwrap();
    store.put("a/b/one", b"second, longer").unwrap();
    assert_eq!(store.get("a/b/one").unwrap(), b"second, longer", "the last put wins, whole");
    assert_eq!(store.size("a/b/one").unwrap(), Some(14));
    let file = tmp.join("f");
    std::fs::write(&file, vec![7u8; 100_000]).unwrap();
    store.put_file("a/bc/two", &file).unwrap();
    store.put("z/three", b"3").unwrap();
    assert_eq!(store.get("a/bc/two").unwrap(), vec![7u8; 100_000]);
    assert_eq!(store.list("a/").unwrap(), vec!["a/b/one", "a/bc/two"]);
    assert_eq!(store.list("a/b").unwrap(), vec!["a/b/one", "a/bc/two"], "prefixes are strings, not folders");
    assert_eq!(store.list("a/b/").unwrap(), vec!["a/b/one"]);
    assert_eq!(store.list("a/bc/t").unwrap(), vec!["a/bc/two"]);
    assert_eq!(store.list("").unwrap(), vec!["a/b/one", "a/bc/two", "z/three"]);
    store.delete("a/b/one").unwrap();
    store.delete("a/b/one").unwrap(); // gone already: no error
    assert_eq!(store.list("a/").unwrap(), vec!["a/bc/two"]);
    assert_eq!(store.get("z/three").unwrap(), b"3", "a delete touches nothing else");
}

#[test]
fn the_local_directory_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = weir_engine::backup::LocalDirStore::new(&root);
    keeps_the_contract(&store, dir.path());
    // A folder a delete emptied goes (listings walk folders: kept, every checkpoint ever taken
    // would slow them), its parents while they empty too, never the root; it comes back for a put.
    assert!(!root.join("a/b").exists() && root.join("a/bc").is_dir());
    store.delete("a/bc/two").unwrap();
    store.delete("z/three").unwrap();
    assert!(!root.join("a").exists() && !root.join("z").exists() && root.is_dir());
    store.put("a/b/one", b"again").unwrap();
    assert_eq!(store.list("a/").unwrap(), vec!["a/b/one"]);
    // An empty folder left behind goes as a listing walks past it; a linked folder is walked
    // into, never taken for an object.
    std::fs::create_dir_all(root.join("a/x/y")).unwrap();
    std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
    std::fs::write(dir.path().join("elsewhere/f"), b"f").unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("a/link")).unwrap();
    assert_eq!(store.list("a/").unwrap(), vec!["a/b/one", "a/link/f"]);
    assert!(!root.join("a/x/y").exists() && root.join("a/link").exists());
}

#[test]
fn the_s3_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    keeps_the_contract(&*services::s3(&services::unique("contract")), dir.path());
}

#[test]
fn the_rsync_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = services::unique("contract");
    let store = services::rsync(&prefix);
    keeps_the_contract(&*store, dir.path());
    // Folders the deletes emptied go on the daemon too, their parents while they empty, and
    // a folder that still holds an object stays.
    let module = std::path::Path::new(&std::env::var("WEIR_SERVICES_DIR").unwrap()).join("rsync/checkpoints");
    let root = module.join(&prefix);
    assert!(!root.join("a/b").exists() && root.join("a/bc").is_dir(), "{}", root.display());
    store.put("c/d/e/one", b"1").unwrap();
    store.put("c/d/two", b"2").unwrap();
    store.delete_many(&["c/d/e/one".to_string()]).unwrap();
    assert!(!root.join("c/d/e").exists() && root.join("c/d").is_dir());
    store.delete_many(&["c/d/two".to_string(), "a/bc/two".to_string(), "z/three".to_string()]).unwrap();
    assert!(!root.join("c").exists() && !root.join("a").exists() && !root.join("z").exists());
    assert!(store.list("").unwrap().is_empty());
    // Gone with its folders already (another node's purge, say): nothing to do, no error.
    store.delete("c/d/e/one").unwrap();
    assert!(!root.join("c").exists());
}

#[test]
fn a_large_file_goes_to_s3_in_parts_and_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = services::s3(&services::unique("multipart"));
    let file = dir.path().join("big");
    let len = weir_engine::backup::S3_MULTIPART_THRESHOLD as usize + 3_000_001;
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    store.put_file("sst/big", &file).unwrap();
    assert_eq!(store.size("sst/big").unwrap(), Some(len as u64));
    assert!(store.get("sst/big").unwrap() == bytes, "the parts join in order");
}

#[test]
fn wrong_s3_credentials_are_refused_with_an_error_naming_the_store() {
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").expect("run with scripts/test");
    let opts = S3Options { secret_key: Some("not-the-secret".into()), retries: Some(0), ..services::s3_options() };
    let store = S3Store::open(&bucket, "denied", &opts).unwrap();
    let err = store.put("k", b"v").unwrap_err();
    assert!(matches!(err, StoreError::Denied { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains(&format!("s3://{bucket}/denied")), "{err}");
}

#[test]
fn a_wrong_rsync_password_is_refused_with_an_error_naming_the_store() {
    let opts = weir_engine::backup::RsyncOptions { password: Some("wrong".into()), ..services::rsync_options() };
    let url = services::rsync_url("denied");
    let store = RsyncStore::open(&url, &opts).unwrap();
    let err = store.put("k", b"v").unwrap_err();
    assert!(matches!(err, StoreError::Denied { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains(url.split('@').nth(1).unwrap()), "{err}");
}

#[test]
fn an_unreachable_store_fails_within_its_timeout_and_says_retrying_may_help() {
    // A port that hangs up on every connection (held for the test: a port bound and closed
    // again could go to another test's server meanwhile, which answers).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => drop(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        unreachable_stores_fail_and_say_retrying_may_help(port);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

#[test]
fn an_https_s3_endpoint_is_spoken_to_in_tls() {
    // The S3 client is built without a TLS provider of its own and takes the process default:
    // an `https://` endpoint must get a TLS ClientHello (record type 22, version 3.x), not a
    // panic for want of a provider nor plain HTTP.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = [0u8; 3];
        std::io::Read::read_exact(&mut conn, &mut head).unwrap();
        head
    });
    let s3 = S3Store::open(
        "b",
        "p",
        &S3Options {
            endpoint: Some(format!("https://127.0.0.1:{port}")),
            access_key: Some("k".into()),
            secret_key: Some("s".into()),
            timeout: Some(Duration::from_secs(2)),
            retries: Some(0),
            ..S3Options::default()
        },
    )
    .unwrap();
    let err = s3.put("k", b"v").unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(server.join().unwrap(), [22, 3, 1], "a TLS handshake record");
}

fn unreachable_stores_fail_and_say_retrying_may_help(port: u16) {
    let s3 = S3Store::open(
        "b",
        "p",
        &S3Options {
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            access_key: Some("k".into()),
            secret_key: Some("s".into()),
            timeout: Some(Duration::from_secs(2)),
            retries: Some(1),
            ..S3Options::default()
        },
    )
    .unwrap();
    let rsync = RsyncStore::open(
        &format!("rsync://127.0.0.1:{port}/m"),
        &weir_engine::backup::RsyncOptions { timeout: Some(Duration::from_secs(2)), ..Default::default() },
    )
    .unwrap();
    for store in [&s3 as &dyn Store, &rsync] {
        let t0 = Instant::now();
        let err = store.put("k", b"v").unwrap_err();
        assert!(err.is_retryable(), "{store:?}: {err:?}");
        assert!(t0.elapsed() < Duration::from_secs(20), "{store:?} took {:?}", t0.elapsed());
    }
}

/// Checkpoints a stream into `store`, deletes the node's whole data directory (every task's state,
/// snapshots and committed record, the sinks' results), starts again: every task restores from the
/// store alone, its results included, and the results end exact.
fn restores_from_the_store_alone(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    // About six seconds of stream: a remote store over a loaded machine commits well within it.
    let spec = spec_at(100_000, 17_000);
    let with_store = |d: &std::path::Path| {
        let mut cfg = config(d, 80);
        cfg.checkpoint.as_mut().unwrap().remote = Remote::Store(store.clone());
        cfg
    };
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), with_store(dir.path())).unwrap();
    // Commits after the first results: the sinks' snapshots hold some.
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.stats().results_written.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "no results in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Two: the first may have passed the sinks before they wrote.
    wait_for_commits(&engine, engine.checkpoints().unwrap().totals().0 + 2);
    engine.stop();
    engine.wait().unwrap();
    // The results written before the last commit are in the store, as the sinks' SST files: the
    // windows they hold are not computed again after the restore, so the exact results at the
    // end show they came back.
    let last = weir_engine::backup::commit::last_commit(store.as_ref(), spec.id).unwrap().unwrap();
    let sinks =
        spec.topology().tasks.into_iter().filter(|t| matches!(t.kind, weir_engine::spec::TaskKind::Sink { .. }));
    let shipped = sinks
        .map(|t| weir_engine::backup::fetch_manifest(store.as_ref(), spec.id, t.id, last.id, None).unwrap())
        .filter(|m| m.files.iter().any(|f| f.key.contains("/sst/")))
        .count();
    assert!(shipped > 0, "the sinks ship their results");
    std::fs::remove_dir_all(dir.path()).unwrap();
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), with_store(dir.path())).unwrap();
    let (basis, id) = wait_restored(&engine);
    assert_eq!(basis, RestoreBasis::Committed);
    assert!(id.is_some(), "{id:?}");
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}

#[test]
fn a_stream_restores_from_s3_alone_results_included_after_its_data_directory_is_gone() {
    restores_from_the_store_alone(services::s3(&services::unique("restore")));
}

#[test]
fn a_stream_restores_from_rsync_alone_results_included_after_its_data_directory_is_gone() {
    restores_from_the_store_alone(services::rsync(&services::unique("restore")));
}

#[test]
fn retention_keeps_the_last_commits_and_every_file_they_name_while_checkpoints_run() {
    use weir_engine::backup::commit::decode_commit;
    use weir_engine::backup::fetch_manifest;

    let store = services::s3(&services::unique("retention"));
    let dir = tempfile::tempdir().unwrap();
    let spec = spec_at(100_000, 17_000); // about six seconds: time for commits on a loaded machine
    let mut cfg = config(dir.path(), 50);
    let ck = cfg.checkpoint.as_mut().unwrap();
    ck.remote = Remote::Store(store.clone());
    ck.retain = 2;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    wait_for_commits(&engine, 4);
    engine.wait().unwrap();
    let records = store.list("7/checkpoints/").unwrap();
    // The engine's stop waits for the last pass: exactly the two newest are left.
    assert_eq!(records.len(), 2, "{records:?}");
    let ids: Vec<u64> =
        records.iter().map(|k| decode_commit(k, &store.get(k).unwrap()).expect("a kept record decodes").id.0).collect();
    let oldest = *ids.first().unwrap();
    assert!(oldest >= 3, "old commits are collected: {ids:?}");
    for key in store.list("7/tasks/").unwrap() {
        if let Some(id) = key.split('/').nth(3).and_then(|p| p.strip_prefix("chk-")) {
            assert!(id.parse::<u64>().unwrap() >= oldest, "{key} outlived its commit");
        }
    }
    // Every kept commit restores: each task's manifest and every file it names are there, whole.
    for k in &records {
        let r = decode_commit(k, &store.get(k).unwrap()).unwrap();
        for t in spec.topology().tasks {
            let m = fetch_manifest(&*store, spec.id, t.id, r.id, r.manifests.get(&t.id).copied()).unwrap();
            for f in m.files {
                assert_eq!(store.size(&f.key).unwrap(), Some(f.size), "{} names {}", r.id, f.key);
            }
        }
    }
    // The last commit restores after the node's data directory is gone.
    std::fs::remove_dir_all(dir.path()).unwrap();
    let mut cfg = config(dir.path(), 50);
    cfg.checkpoint.as_mut().unwrap().remote = Remote::Store(store.clone());
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    assert_eq!(wait_restored(&engine).0, RestoreBasis::Committed);
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec));
}

#[test]
fn an_s3_outage_fails_checkpoints_but_not_the_stream_and_the_next_one_commits_once_it_is_back() {
    use weir_engine::wire::msg::CheckpointOutcome;

    let mut s3 = services::OwnS3::start();
    let store = s3.store("outage");
    let dir = tempfile::tempdir().unwrap();
    let spec = spec_at(100_000, 10_000); // about ten seconds of stream
    let mut cfg = config(dir.path(), 100);
    let ck = cfg.checkpoint.as_mut().unwrap();
    ck.remote = Remote::Store(store.clone());
    ck.timeout_ms = 3_000;
    ck.store_timeout_ms = 3_000;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    wait_for_commits(&engine, 1);
    s3.kill();
    // Checkpoints fail while the server is gone; the stream goes on.
    let log = engine.checkpoints().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.totals().1 == 0 {
        assert!(Instant::now() < deadline, "no checkpoint failed while the store was down");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rows = engine.stats().rows_aggregated.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        engine.is_finished() || engine.stats().rows_aggregated.load(std::sync::atomic::Ordering::Relaxed) > rows,
        "processing stopped with the store"
    );
    let committed_before = log.totals().0;
    s3.resume();
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.totals().0 == committed_before && !engine.is_finished() {
        assert!(Instant::now() < deadline, "no commit after the store came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(log.totals().0 > committed_before, "the stream ended before the store came back: make it longer");
    let failed = log.finished().iter().filter(|c| matches!(c.outcome, CheckpointOutcome::Failed { .. })).count();
    assert!(failed >= 1);
    engine.wait().unwrap();
    let got = NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap();
    assert_eq!(got, util::reference(&spec), "the results end as without the outage");
}

#[test]
fn an_upload_limit_paces_puts_to_its_rate_and_leaves_reads_alone() {
    let store = weir_engine::backup::Throttled::new(services::s3(&services::unique("limit")), 4 << 20);
    let chunk = vec![3u8; 512 << 10];
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (store, chunk) = (&store, &chunk);
            s.spawn(move || {
                for i in 0..2 {
                    store.put(&format!("k{t}-{i}"), chunk).unwrap();
                }
            });
        }
    });
    // 4 MiB at 4 MiB/s: the first put starts at once, the last 3.5 MiB later.
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(850), "8 x 512 KiB went up in {took:?}");
    let t0 = Instant::now();
    for t in 0..4 {
        assert_eq!(store.get(&format!("k{t}-1")).unwrap().len(), 512 << 10);
    }
    assert!(t0.elapsed() < took, "reads are not paced");
}

#[test]
fn after_a_small_change_a_sinks_next_checkpoint_uploads_only_its_new_files_to_s3() {
    let dir = tempfile::tempdir().unwrap();
    let store = services::s3(&services::unique("incremental"));
    util::uploads::a_small_change_uploads_only_the_new_files(store.as_ref(), dir.path());
}

#[test]
fn results_stored_ahead_in_s3_make_a_checkpoint_that_restores() {
    let dir = tempfile::tempdir().unwrap();
    let store = services::s3(&services::unique("ahead"));
    util::uploads::results_stored_ahead_make_a_checkpoint_that_restores(store.as_ref(), dir.path());
}

#[test]
fn results_stored_ahead_in_rsync_make_a_checkpoint_that_restores() {
    let dir = tempfile::tempdir().unwrap();
    let store = services::rsync(&services::unique("ahead"));
    util::uploads::results_stored_ahead_make_a_checkpoint_that_restores(store.as_ref(), dir.path());
}
