//! `weir-e2e restore [keys]`: how long a window agg's checkpoint of `keys` keys (one open window
//! holding every key) takes to restore: from the node's own snapshot (its files checked against
//! the manifest, opened, loaded), and downloaded from a `file://` store and, when
//! `scripts/services` runs (`WEIR_TEST_S3_*`), from its S3 server.

use std::path::Path;
use std::time::{Duration, Instant};

use weir_engine::backup::{
    LocalDirStore, Manifest, Store, download_files, fetch_manifest, local_snapshot_matches, upload_snapshot,
};
use weir_engine::operator::window::{WindowAgg, WindowSpec};
use weir_engine::state::{TaskStore, load_window_state, write_window_snapshot};
use weir_engine::wire::{CheckpointId, StreamId, TaskId, Version};

const STREAM: StreamId = StreamId(1);
const TASK: TaskId = TaskId(2);

fn agg() -> WindowAgg {
    WindowAgg::new(WindowSpec::tumbling(1000), 0, 1)
}

/// Opens the snapshot in `dir` into a fresh store under `work` and loads it: the agg's part of
/// a restore once the files are there.
fn open_and_load(dir: &Path, work: &Path, want: usize) -> Duration {
    let t = Instant::now();
    let store = TaskStore::open_from_snapshot(dir, &work.join("db")).expect("open");
    let mut back = agg();
    assert!(load_window_state(&store, &mut back).expect("load"));
    assert_eq!(back.state_len(), want);
    t.elapsed()
}

/// Downloads the checkpoint from `store` into `work` and restores it: (download, open and load).
fn from_store(store: &dyn Store, manifest_crc: u32, work: &Path, want: usize) -> (Duration, Duration) {
    let t = Instant::now();
    let m: Manifest = fetch_manifest(store, STREAM, TASK, CheckpointId(1), Some(manifest_crc)).expect("manifest");
    let dl = work.join("dl");
    download_files(store, &m, &dl).expect("download");
    let download = t.elapsed();
    (download, open_and_load(&dl, work, want))
}

/// Prints the figures for `keys` keys.
#[allow(clippy::print_stdout)]
pub fn restore(keys: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut a = agg();
    let mut adder = a.batch();
    for k in 0..keys {
        adder.add(1, k, k as f64 / 7.0);
    }
    drop(adder);
    let snap = dir.path().join("chk-1");
    let t = Instant::now();
    let bytes = write_window_snapshot(&a.freeze(), &snap.join("state-00000000000000000001.sst")).expect("write");
    let write = t.elapsed();
    let want = a.state_len();
    drop(a);
    println!(
        "a window agg's checkpoint of {keys} keys: one SST file of {:.1} MiB, written in {:.0} ms",
        bytes as f64 / (1 << 20) as f64,
        write.as_secs_f64() * 1e3
    );

    let local_store = LocalDirStore::new(dir.path().join("remote"));
    let up = upload_snapshot(&local_store, STREAM, TASK, CheckpointId(1), Version(0), &snap).expect("upload");
    let t = Instant::now();
    let m = fetch_manifest(&local_store, STREAM, TASK, CheckpointId(1), Some(up.manifest_crc)).expect("manifest");
    assert!(local_snapshot_matches(&m, &snap));
    let check = t.elapsed();
    let load = open_and_load(&snap, &dir.path().join("local"), want);
    println!(
        "  from the node's snapshot: {:.0} ms (files checked {:.0} ms, opened and loaded {:.0} ms)",
        (check + load).as_secs_f64() * 1e3,
        check.as_secs_f64() * 1e3,
        load.as_secs_f64() * 1e3
    );
    let (dl, load) = from_store(&local_store, up.manifest_crc, &dir.path().join("file"), want);
    println!(
        "  from file://: {:.0} ms (downloaded {:.0} ms, opened and loaded {:.0} ms)",
        (dl + load).as_secs_f64() * 1e3,
        dl.as_secs_f64() * 1e3,
        load.as_secs_f64() * 1e3
    );
    if std::env::var("WEIR_TEST_S3_ENDPOINT").is_ok() {
        let s3 = crate::backup::s3(&crate::backup::unique("restore"));
        let up = upload_snapshot(s3.as_ref(), STREAM, TASK, CheckpointId(1), Version(0), &snap).expect("upload to S3");
        let (dl, load) = from_store(s3.as_ref(), up.manifest_crc, &dir.path().join("s3"), want);
        println!(
            "  from s3s-fs: {:.0} ms (downloaded {:.0} ms, opened and loaded {:.0} ms)",
            (dl + load).as_secs_f64() * 1e3,
            dl.as_secs_f64() * 1e3,
            load.as_secs_f64() * 1e3
        );
    } else {
        println!("  from S3: skipped (`source scripts/services` first)");
    }
}
