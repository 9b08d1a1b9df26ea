//! Ingest log retention across three `weir node` processes keeping two copies of each log: the
//! logs are deleted below what the kept checkpoints read (`retain = 3`), on the primary's node and
//! the follower's, so they stay bounded however long the load runs; a node killed with `kill -9`
//! mid-load restores from what is left, and every acknowledged row is in the results once.
//!
//! `WEIR_LOG_RETENTION_SOAK=SECONDS` runs the load that long instead (five minutes: `300`).

mod util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use util::load::*;
use util::*;
use weir_engine::ingest::segment::segment_path;
use weir_engine::ingest::service::partition_dir;
use weir_engine::wire::Version;

/// Partition `p`'s log directory on node `n`.
fn log_dir(dir: &Path, n: u32, p: u32) -> PathBuf {
    partition_dir(&dir.join(format!("data/node-{n}/ingest")), p)
}

/// Bytes of the segments in a log directory.
fn segment_bytes(log: &Path) -> u64 {
    std::fs::read_dir(log)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn ingest_logs_stay_bounded_on_both_copies_and_a_node_killed_mid_load_restores_from_what_is_left() {
    let secs: u64 = std::env::var("WEIR_LOG_RETENTION_SOAK").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["checkpoint", "retain"], 3i64);
        set(t, &["stream", "ingest", "replicas"], 2i64);
        set(t, &["stream", "ingest", "segment"], "1M");
        // Windows of several segments: a restore replays rows from well below its offset, so
        // a floor at the offset would delete rows it needs.
        set(t, &["stream", "window"], "4s");
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let duration = format!("{secs}s");
    let args = ["--duration", &duration, "--rate", "150k", "--keys", "1000", "--timeout", "60s"];
    let child = load(&config, &args);
    let logs_text =
        || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    // Partition 1's log lives on node 2 (its source) and node 3 (the copy). Both lose their
    // first segment while the load runs.
    let truncated = |n: u32| {
        let log = log_dir(dir.path(), n, 1);
        segment_bytes(&log) > 0 && !segment_path(&log, Version(0)).exists()
    };
    let t0 = Instant::now();
    while !truncated(2) || !truncated(3) {
        assert!(t0.elapsed() < Duration::from_secs(secs), "no copy of partition 1 truncated\n{}", logs_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Node 2 is killed and comes back: its source restores from the log that is left (a floor
    // above what the commit reads would stop it, loudly).
    nodes.0[1].kill().unwrap();
    nodes.0[1].wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    nodes.0[1] = start(&config, 2, &logs[1], &[]);
    let (code, s, err) = summary_of(child, Duration::from_secs(secs + 120));
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text());
    let acked = s["events_acked"].as_u64().unwrap();
    assert!(acked > secs * 100_000, "{s:#}");
    let text = verify_until_ended(&config, Duration::from_secs(90));
    assert!(text.contains(&format!("match the {acked} rows")), "{text}");
    // What every log would hold without retention: a partition's rows and its entries' headers.
    let whole = acked / 3 * weir_engine::ingest::segment::ROW_BYTES as u64;
    for n in 1..=3u32 {
        for p in 0..3u32 {
            let log = log_dir(dir.path(), n, p);
            let held = segment_bytes(&log);
            // A node holds the logs of its source's partition and of the copy it keeps.
            if held == 0 {
                continue;
            }
            assert!(!segment_path(&log, Version(0)).exists(), "node {n} partition {p}: never truncated");
            assert!(held < whole / 3 && held < 16 << 20, "node {n} partition {p}: {held} bytes of {whole}");
        }
    }
    // Status says the same: each partition's log on its source's node and its copy, both
    // begun past version 0, the copy in sync.
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let logs: Vec<&serde_json::Value> =
        status["nodes"].as_array().unwrap().iter().flat_map(|n| n["logs"].as_array().unwrap()).collect();
    assert_eq!(logs.len(), 6, "{status:#}");
    for l in &logs {
        assert!(l["first"].as_u64().unwrap() > 0 && l["bytes"].as_u64().unwrap() < 16 << 20, "{status:#}");
        if l["source"] == true {
            assert!(l["follower"].as_u64().is_some() && l["readable"] == l["end"], "{status:#}");
        }
    }
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(", in sync").count(), 3, "{text}");
    // And the metrics: node 1's logs (partition 0's, partition 2's copy), its copy not behind.
    // The metrics are a snapshot the node takes twice a second, so they may trail status a little.
    let ingest = |m: &str| m.lines().filter(|l| l.starts_with("weir_ingest_")).collect::<Vec<_>>().join("\n");
    let t0 = Instant::now();
    let metrics = loop {
        let m = scrape(&config, 1);
        if m.lines().any(|l| l.starts_with("weir_ingest_copy_behind_versions{stream=\"2\",partition=\"0\"} 0")) {
            break m;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "copy of partition 0 behind:\n{}\n{status:#}", ingest(&m));
        std::thread::sleep(Duration::from_millis(200));
    };
    let logs: Vec<&str> = metrics.lines().filter(|l| l.starts_with("weir_ingest_log_bytes{")).collect();
    assert_eq!(logs.len(), 2, "{}", ingest(&metrics));
    for l in logs {
        let bytes: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(bytes > 0.0 && bytes < f64::from(16 << 20), "{l}");
    }
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
}
