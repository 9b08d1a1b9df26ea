//! A created stream's results as `weir query` serves them, against the reference, and its commits.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_engine::backup::commit::last_commit;
use weir_engine::spec::StreamSpec;
use weir_engine::wire::{CheckpointId, StreamId};

use super::weir;

/// `weir query --stream NAME --json`: the results of stream `name`, as the nodes serve them.
pub fn query(config: &Path, name: &str) -> Vec<(u64, i64, u64, f64, f64, f64)> {
    let out = weir().args(["query", "--json", "--stream", name, "--config"]).arg(config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let f = |k: &str| v[k].as_f64().unwrap();
            (
                v["key"].as_u64().unwrap(),
                v["start_ms"].as_i64().unwrap(),
                v["count"].as_u64().unwrap(),
                f("sum"),
                f("min"),
                f("max"),
            )
        })
        .collect()
}

/// Waits until the nodes serve every result of bounded stream `spec` (named `name`), and
/// checks they are the reference's; returns them.
pub fn results_match(config: &Path, name: &str, spec: &StreamSpec) -> Vec<(u64, i64, u64, f64, f64, f64)> {
    let want: Vec<(u64, i64, u64, f64, f64, f64)> = weir_engine::reference::bounded_results(spec)
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.start, r.count, r.sum, r.min, r.max))
        .collect();
    assert!(want.len() > 1000, "{} results", want.len());
    let t0 = Instant::now();
    loop {
        let mut got = query(config, name);
        if got.len() == want.len() {
            got.sort_by_key(|r| (r.0, r.1));
            assert!(got == want, "stream {name}'s results differ from the reference");
            return want;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "stream {name} did not finish: {} results", got.len());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The newest commit of `stream` in the `file://` store of a test's directory `dir`.
pub fn committed(dir: &Path, stream: u64) -> Option<CheckpointId> {
    let store = weir_engine::backup::LocalDirStore::new(dir.join("remote"));
    last_commit(&store, StreamId(stream)).unwrap().map(|r| r.id)
}

/// Waits until `stream` commits a checkpoint after `after`.
pub fn commits_after(dir: &Path, stream: u64, after: Option<CheckpointId>, limit: Duration) {
    let t0 = Instant::now();
    while committed(dir, stream) <= after {
        assert!(t0.elapsed() < limit, "stream {stream} committed nothing after {after:?} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
