//! Several streams on three `weir node` processes (etcd): a node killed with `kill -9` while it
//! runs tasks of three streams, and ten streams committing side by side for two minutes.

mod util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::created::{commits_after, committed, results_match};
use util::load::*;
use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::WindowSpec;
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

/// `weir stream create` of a generator stream `name` (3 partitions, aggs and sinks, 1 s windows,
/// 1,000 keys at `rate` rows/s per partition, `events` each when bounded): its id, and the
/// stream it describes.
fn create(config: &Path, dir: &Path, name: &str, seed: u64, rate: u64, events: Option<u64>) -> (u64, StreamSpec) {
    let path = dir.join(format!("{name}.toml"));
    let rows_per_ms = rate.div_ceil(1000);
    let bound = events.map_or(String::new(), |e| format!("events = {e}\n"));
    let text = format!(
        "[stream]\nname = \"{name}\"\npartitions = 3\naggs = 3\nsinks = 3\nwindow = \"1s\"\n\
         [stream.generator]\nseed = {seed}\nkeys = 1000\nrows_per_ms = {rows_per_ms}\nrate = {rate}\n{bound}"
    );
    std::fs::write(&path, text).unwrap();
    let out = weir().args(["stream", "create", "--file"]).arg(&path).arg("--config").arg(config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    // "stream NAME (id N) created and running"
    let id: u64 = said.split("(id ").nth(1).and_then(|r| r.split(')').next()).and_then(|n| n.parse().ok()).unwrap();
    let mut spec = StreamSpec::generator(StreamId(id), 3, 3, 3);
    spec.window = WindowSpec::tumbling(1000);
    spec.source = SourceKind::Generator {
        spec: GeneratorSpec { seed, keys: 1000, rows_per_ms, ..GeneratorSpec::default() },
        limit: events,
        rate: Some(rate),
    };
    (id, spec)
}

/// Every node's log, for a failed assertion's message.
fn logs_text(logs: &[PathBuf]) -> String {
    logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_node_running_tasks_of_three_streams_killed_for_good_each_stream_moves_on_its_own_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (config, logs, mut nodes) = two_copies_on_three_nodes(dir.path());
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(60));
    // Beside the file's ingest stream (id 2), two bounded generator streams of about 10 s, each
    // with a source, an agg and a sink on every node.
    let (a, spec_a) = create(&config, dir.path(), "gen-a", 1, 15_000, Some(150_000));
    let (b, spec_b) = create(&config, dir.path(), "gen-b", 2, 15_000, Some(150_000));
    let args = ["--events", "900k", "--rate", "90k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    let loading = load(&config, &args);
    for s in [2, a, b] {
        commits_after(dir.path(), s, None, Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_secs(1));
    let before: Vec<_> = [2, a, b].iter().map(|s| committed(dir.path(), *s)).collect();
    nodes.0[2].kill().unwrap();
    nodes.0[2].wait().unwrap();

    // The load loses no acknowledged row (two copies of each partition's log), and each stream
    // commits again without node 3 and gives exactly the results of a run without the kill.
    let (code, s, err) = summary_of(loading, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text(&logs));
    assert_acknowledged(&s, 3, 300_000);
    for (s, before) in [2, a, b].into_iter().zip(before) {
        commits_after(dir.path(), s, before, Duration::from_secs(60));
    }
    wait_for_results(&config, expected(&s, 3, 300_000).len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}\n{}", logs_text(&logs));
    assert!(text.contains("match the 900000 rows of 1 load(s)") && text.contains("from 2 nodes"), "{text}");
    results_match(&config, "gen-a", &spec_a);
    results_match(&config, "gen-b", &spec_b);

    // Each stream moved node 3's tasks on its own: node 3 down, every task on nodes 1 and 2.
    for s in [2, a, b] {
        let out =
            weir().args(["status", "--json", "--stream", &s.to_string(), "--config"]).arg(&config).output().unwrap();
        let status: Value = serde_json::from_slice(&out.stdout).unwrap();
        let nodes = status["nodes"].as_array().unwrap();
        let up: Vec<u64> = nodes.iter().filter(|n| n["up"] == true).filter_map(|n| n["node"].as_u64()).collect();
        assert_eq!(up, [1, 2], "{status:#}");
        let tasks: usize = nodes.iter().map(|n| n["tasks"].as_array().map_or(0, Vec::len)).sum();
        assert_eq!(tasks, 9, "stream {s}: its 9 tasks run on nodes 1 and 2: {status:#}");
    }
}

#[test]
fn ten_streams_on_three_nodes_each_commit_every_interval_for_two_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("three-node.toml"), dir.path(), |t| {
        set(t, &["stream", "generator", "rate"], 5_000);
        set(t, &["stream", "generator", "rows_per_ms"], 5);
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let _nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(60));
    // The file's stream (id 1) and nine created ones, each with a task of every level on each
    // node: 30 streams' runs on this machine, each checkpointing every second.
    let mut ids = vec![1];
    for i in 2..=10 {
        ids.push(create(&config, dir.path(), &format!("s{i}"), i, 5_000, None).0);
    }
    for s in &ids {
        commits_after(dir.path(), *s, None, Duration::from_secs(30));
    }

    // Each stream's newest commit, watched for two minutes: when it changed, the longest time
    // it stood still, and how many times it changed.
    let interval = Duration::from_secs(1);
    let run = Duration::from_secs(120);
    let t0 = Instant::now();
    let mut watched: Vec<_> = ids.iter().map(|s| (committed(dir.path(), *s), t0, Duration::ZERO, 0u32)).collect();
    while t0.elapsed() < run {
        std::thread::sleep(Duration::from_millis(100));
        for (s, (last, at, longest, changes)) in ids.iter().zip(&mut watched) {
            let now = committed(dir.path(), *s);
            if now != *last {
                *longest = (*longest).max(at.elapsed());
                (*last, *at, *changes) = (now, Instant::now(), *changes + 1);
            }
        }
    }
    let report: Vec<String> = ids
        .iter()
        .zip(&watched)
        .map(|(s, (_, at, longest, changes))| {
            format!("stream {s}: {changes} commits, longest without {:?}", (*longest).max(at.elapsed()))
        })
        .collect();
    let report = report.join("\n");
    for (_, at, longest, changes) in &watched {
        // Every interval has its commit (the next interval starts as the last one commits, so
        // a little less than one a second), and none is two intervals late, whatever else runs
        // on this machine (an idle one: 118 each, none more than 1.3 s apart).
        assert!(*changes as u128 >= run.as_millis() / interval.as_millis() * 9 / 10, "{report}");
        assert!((*longest).max(at.elapsed()) < 3 * interval, "{report}");
    }
    // And no stream restarted.
    for s in &ids {
        let out =
            weir().args(["status", "--json", "--stream", &s.to_string(), "--config"]).arg(&config).output().unwrap();
        let status: Value = serde_json::from_slice(&out.stdout).unwrap();
        for n in status["nodes"].as_array().unwrap() {
            assert_eq!(failures(n), 0, "stream {s} restarted: {n:#}\n{report}");
        }
    }
}
