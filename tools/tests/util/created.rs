//! A created stream's results as `weir query` serves them, against the reference.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_engine::spec::StreamSpec;

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

/// Waits until the nodes serve every result of bounded stream `spec` (named `meters`), and
/// checks they are the reference's; returns them.
pub fn results_match(config: &Path, spec: &StreamSpec) -> Vec<(u64, i64, u64, f64, f64, f64)> {
    let want: Vec<(u64, i64, u64, f64, f64, f64)> = weir_engine::reference::bounded_results(spec)
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.start, r.count, r.sum, r.min, r.max))
        .collect();
    assert!(want.len() > 1000, "{} results", want.len());
    let t0 = Instant::now();
    loop {
        let mut got = query(config, "meters");
        if got.len() == want.len() {
            got.sort_by_key(|r| (r.0, r.1));
            assert!(got == want, "the created stream's results differ from the reference");
            return want;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the created stream did not finish: {} results", got.len());
        std::thread::sleep(Duration::from_millis(300));
    }
}
