//! `weir-e2e backup`: the remote store's figures against an S3 server (the one
//! `scripts/services` starts: `WEIR_TEST_S3_*`).
//!
//! - Trigger to commit of the benchmark job with checkpoints every second into `file://` and into
//!   `s3://`, runs alternating, and the bytes each checkpoint uploads next to the size of its state.
//! - Upload and restore throughput of one snapshot (16 files of 8 MiB) through Weir's S3 store,
//!   against boto3 doing the same puts and gets with as many threads on the same server in the
//!   same run (`scripts/s3-baseline.py`; `pip install boto3`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_engine::backup::inspect::checkpoint_info;
use weir_engine::backup::{LocalDirStore, S3Options, S3Store, Store, download_files, fetch_manifest, upload_snapshot};
use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig, Remote};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::msg::CheckpointOutcome;
use weir_engine::wire::{CheckpointId, NodeId, StreamId, TaskId, Version};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: `source scripts/services` first"))
}

pub(crate) fn s3(prefix: &str) -> Arc<S3Store> {
    let opts = S3Options {
        endpoint: Some(var("WEIR_TEST_S3_ENDPOINT")),
        access_key: Some(var("WEIR_TEST_S3_ACCESS_KEY")),
        secret_key: Some(var("WEIR_TEST_S3_SECRET_KEY")),
        ..S3Options::default()
    };
    Arc::new(S3Store::open(&var("WEIR_TEST_S3_BUCKET"), prefix, &opts).expect("the S3 store"))
}

pub(crate) fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("bench-{what}-{nanos}")
}

/// One run of the benchmark job checkpointing every second into `store` (`None`: a local
/// directory): commit times, bytes uploaded per checkpoint, and the size of the last one's state.
fn run(seconds: u64, store: Option<Arc<dyn Store>>) -> (Vec<Duration>, Vec<u64>, u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
    if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
        g.rows_per_ms = 10_000;
    }
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    let mut ck = CheckpointSettings::every(1000, dir.path().join("remote"));
    let reader: Arc<dyn Store> = match store {
        Some(s) => {
            ck.remote = Remote::Store(s.clone());
            s
        }
        None => Arc::new(LocalDirStore::new(dir.path().join("remote"))),
    };
    cfg.checkpoint = Some(ck);
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).expect("engine");
    std::thread::sleep(Duration::from_secs(seconds));
    let finished = engine.checkpoints().map(|l| l.finished()).unwrap_or_default();
    engine.stop();
    drop(engine.wait());
    let committed: Vec<_> = finished.iter().filter(|c| c.outcome == CheckpointOutcome::Committed).collect();
    let times = committed.iter().map(|c| Duration::from_micros(c.duration_us)).collect();
    let bytes = committed.iter().map(|c| c.tasks.iter().map(|t| t.stats.upload_bytes).sum()).collect();
    let state = committed
        .last()
        .and_then(|c| checkpoint_info(reader.as_ref(), spec.id, c.checkpoint).ok())
        .map_or(0, |i| i.bytes());
    (times, bytes, state)
}

fn median<T: Copy + Ord + Default>(v: &mut [T]) -> T {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Weir's upload and download of one snapshot directory through S3, MiB/s each.
fn weir_throughput(dir: &std::path::Path, mib: f64) -> (f64, f64) {
    let store = s3(&unique("throughput"));
    let (stream, task, id) = (StreamId(1), TaskId(0), CheckpointId(1));
    let t0 = Instant::now();
    let up = upload_snapshot(store.as_ref(), stream, task, id, Version(0), dir).expect("upload");
    let up_s = t0.elapsed().as_secs_f64();
    let m = fetch_manifest(store.as_ref(), stream, task, id, Some(up.manifest_crc)).expect("manifest");
    let into = tempfile::tempdir().expect("temp dir");
    let t0 = Instant::now();
    download_files(store.as_ref(), &m, &into.path().join("dl")).expect("download");
    (mib / up_s, mib / t0.elapsed().as_secs_f64())
}

/// boto3's, from `scripts/s3-baseline.py` (`None` when boto3 is not installed).
fn boto3_throughput(dir: &std::path::Path) -> Option<(f64, f64)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/s3-baseline.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(dir)
        .arg(var("WEIR_TEST_S3_BUCKET"))
        .arg(unique("boto3"))
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("boto3 baseline failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().filter_map(|w| w.parse::<f64>().ok());
    Some((it.next()?, it.next()?))
}

/// Runs the backup figures: `runs` alternating pairs of `seconds` each for the commit times.
pub fn backup(seconds: u64, runs: usize) {
    let (mut file_t, mut s3_t, mut file_b, mut s3_b, mut state) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..runs {
        let (t, b, _) = run(seconds, None);
        file_t.extend(t);
        file_b.extend(b);
        let (t, b, s) = run(seconds, Some(s3(&unique("commits"))));
        s3_t.extend(t);
        s3_b.extend(b);
        state = state.max(s);
    }
    let (mf, ms) = (median(&mut file_t), median(&mut s3_t));
    println!(
        "trigger to commit, checkpoints every 1 s, {runs} x {seconds} s each, alternating: file:// median {:.1} ms ({} commits), \
         s3:// median {:.1} ms ({} commits): {:.2}x",
        mf.as_secs_f64() * 1e3,
        file_t.len(),
        ms.as_secs_f64() * 1e3,
        s3_t.len(),
        ms.as_secs_f64() / mf.as_secs_f64().max(1e-9)
    );
    println!(
        "  bytes uploaded per checkpoint: median {:.1} KiB (file://), {:.1} KiB (s3://); the state of the last s3:// checkpoint: {:.1} KiB",
        median(&mut file_b) as f64 / 1024.0,
        median(&mut s3_b) as f64 / 1024.0,
        state as f64 / 1024.0
    );
    // Throughput: 16 files of 8 MiB of incompressible bytes.
    let dir = tempfile::tempdir().expect("temp dir");
    let snap = dir.path().join("snapshot");
    std::fs::create_dir_all(&snap).expect("dir");
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..16 {
        let bytes: Vec<u8> = (0..(8 << 20) / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        std::fs::write(snap.join(format!("data-{i:02}.sst")), bytes).expect("write");
    }
    let mib = 128.0;
    let (mut wu, mut wd, mut bu, mut bd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let (u, d) = weir_throughput(&snap, mib);
        wu.push(u);
        wd.push(d);
        if let Some((u, d)) = boto3_throughput(&snap) {
            bu.push(u);
            bd.push(d);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN) // NaN: boto3 did not run
    };
    let (wu, wd, bu, bd) = (med(&mut wu), med(&mut wd), med(&mut bu), med(&mut bd));
    println!(
        "one snapshot of 16 x 8 MiB, 8 requests at a time, median of 3 interleaved: upload weir {wu:.0} MiB/s, boto3 {bu:.0} MiB/s ({:.0} %); \
         restore weir {wd:.0} MiB/s, boto3 {bd:.0} MiB/s ({:.0} %)",
        100.0 * wu / bu,
        100.0 * wd / bd
    );
}
