//! `weir stream pause` and `resume` of an ingest stream under a load: three real `weir node`
//! processes on the test etcd, fed by `weir load`.

mod util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::load::{assert_acknowledged, expected, load, summary_of, verify_ingest, wait_for_results};
use util::{Nodes, adjusted, example, line_in_any, scrape, set, start, weir};

fn stream(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = weir().arg("stream").args(args).arg("--config").arg(config).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

fn status(config: &Path) -> Value {
    let out = weir().args(["status", "--json", "--config"]).arg(config).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Node `n`'s address.
fn addr(config: &Path, n: usize) -> String {
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    file["nodes"][n - 1]["addr"].as_str().unwrap().to_string()
}

/// The `weir query` results readable now.
fn results(config: &Path) -> usize {
    let out = weir().args(["query", "--csv", "--config"]).arg(config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().count().saturating_sub(1)
}

/// Rows node `n` acknowledged into its ingest logs (its metrics).
fn acked(config: &Path, n: u64) -> f64 {
    let text = scrape(config, n);
    text.lines()
        .filter(|l| l.starts_with("weir_ingest_rows_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The worker threads of process `pid`.
fn workers(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("weir-worker"))
        .count()
}

#[test]
fn a_stream_paused_for_ten_seconds_under_load_takes_every_append_and_resumes_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        adjusted(example("load-three-node.toml"), dir.path(), |t| set(t, &["checkpoint", "interval"], "200ms"));
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let log_refs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    line_in_any(&log_refs, "checkpoint committed", Duration::from_secs(60));

    // 1,800,000 events at 50,000 a second: about 36 s, outlasting the pause by far.
    let args = ["--events", "1800k", "--rate", "50k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    let loading = load(&config, &args);
    std::thread::sleep(Duration::from_secs(3));
    // Asked of node 2, which does not coordinate the stream's checkpoints (node 1 does).
    let (code, text) = stream(&config, &["pause", "ingest", "--node", &addr(&config, 2)]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("stream ingest (id 2) paused"), "{text}");

    // Every node pauses: no worker runs, results stand still, appends are still acknowledged.
    let t0 = Instant::now();
    loop {
        let s = status(&config);
        let nodes_paused = s["nodes"].as_array().map_or(0, |n| n.iter().filter(|n| n["paused"] == true).count());
        if nodes_paused == 3 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "not every node paused: {s:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let paused_at = Instant::now();
    // Each paused task says so, and names the commit it restores when the stream resumes.
    let s = status(&config);
    for n in s["nodes"].as_array().unwrap() {
        for t in n["tasks"].as_array().unwrap() {
            assert_eq!(t["state"], "paused", "{n:#}");
            assert!(t["latest_committed"].as_u64().is_some(), "{n:#}");
        }
    }
    let (rows, acks) = (results(&config), [1, 2, 3].map(|n| acked(&config, n)));
    for (i, c) in nodes.0.iter().enumerate() {
        assert_eq!(workers(c.id()), 0, "node {}: a paused stream frees its workers", i + 1);
    }
    std::thread::sleep(Duration::from_secs(10).saturating_sub(paused_at.elapsed()));
    assert_eq!(results(&config), rows, "a paused stream writes no result");
    for (i, before) in acks.iter().enumerate() {
        let after = acked(&config, i as u64 + 1);
        assert!(after > *before, "node {}: no append acknowledged while paused ({before} then {after})", i + 1);
    }
    let (code, text) = stream(&config, &["list"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ingest") && l.contains("paused")), "{text}");

    let (code, text) = stream(&config, &["resume", "ingest", "--node", &addr(&config, 3)]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("stream ingest (id 2) resumed"), "{text}");
    let (code, s, err) = summary_of(loading, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 3, 600_000);
    // Every acknowledged event is in the results once, the paused ones included.
    wait_for_results(&config, expected(&s, 3, 600_000).len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("(per partition: 600000, 600000, 600000), from 3 nodes"), "{text}");
    // A pause is no failure: no node lists a restart (but for a lease etcd let lapse).
    let s = status(&config);
    for n in s["nodes"].as_array().unwrap() {
        assert_eq!(util::failures(n), 0, "{n:#}");
        assert_eq!(n["paused"], false, "{n:#}");
    }
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Whether every node of `config` runs its stream paused (`true`), or runs its tasks (`false`).
fn all_paused(config: &Path, paused: bool) -> bool {
    let s = status(config);
    let task = if paused { "paused" } else { "running" };
    s["nodes"].as_array().is_some_and(|n| {
        !n.is_empty()
            && n.iter().all(|n| {
                let tasks = n["tasks"].as_array().map_or(&[][..], Vec::as_slice);
                n["paused"] == paused && !tasks.is_empty() && tasks.iter().all(|t| t["state"] == task)
            })
    })
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn pauses_resumed_at_once_a_stop_and_a_restart_while_paused_lose_nothing_and_count_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = util::load::load_one_node(dir.path());
    let log = dir.path().join("node.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    util::line_in(&log, "checkpoint committed", Duration::from_secs(60));
    let args = ["--events", "600k", "--rate", "60k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    let loading = load(&config, &args);
    std::thread::sleep(Duration::from_secs(1));
    // Paused and resumed at once, three times: each answered once in effect.
    for _ in 0..3 {
        let (code, text) = stream(&config, &["pause", "ingest"]);
        assert_eq!(code, Some(0), "{text}");
        let (code, text) = stream(&config, &["resume", "ingest"]);
        assert_eq!(code, Some(0), "{text}");
    }
    let (code, s, err) = summary_of(loading, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 2, 300_000);
    wait_for_results(&config, expected(&s, 2, 300_000).len(), &log);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    let s = status(&config);
    assert_eq!(s["nodes"][0]["restarts"].as_array().map(Vec::len), Some(0), "a switch is no failure: {s:#}");

    // Stopped while paused (nothing to checkpoint), started again: it comes back paused, its
    // results still readable; resumed, it goes on.
    let (code, text) = stream(&config, &["pause", "ingest"]);
    assert_eq!(code, Some(0), "{text}");
    let out = weir().args(["stop", "--checkpoint", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("is paused: nothing to checkpoint"), "{said}");
    assert!(util::exit_within(&mut node.0[0], Duration::from_secs(30), "the node after weir stop").success());
    let _again = Nodes(vec![start(&config, 1, &dir.path().join("again.log"), &[])]);
    wait_until("the node comes back paused", Duration::from_secs(30), || all_paused(&config, true));
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "a paused stream's results stay readable: {text}");
    let (code, text) = stream(&config, &["resume", "ingest"]);
    assert_eq!(code, Some(0), "{text}");
    wait_until("the node runs the stream again", Duration::from_secs(30), || all_paused(&config, false));
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
