//! `weir load` against real `weir node` processes on 127.0.0.1: every event acknowledged once,
//! across a node killed with `kill -9` and restarted, and the HdrHistogram log it writes.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

/// `examples/load-one-node.toml` under `dir`, checkpointing every 200 ms.
fn load_one_node(dir: &Path) -> PathBuf {
    adjusted(example("load-one-node.toml"), dir, |t| set(t, &["checkpoint", "interval"], "200ms"))
}

fn load(config: &Path, args: &[&str]) -> Child {
    weir()
        .args(["load", "--json", "--config"])
        .arg(config)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `weir load` to end by itself; its exit code and JSON summary.
fn summary_of(child: Child, limit: Duration) -> (Option<i32>, Value, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out: Output = rx.recv_timeout(limit).expect("weir load ended in time").unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("no JSON summary ({e}): {err}"));
    (out.status.code(), json, err)
}

/// Every partition's events were stored once each: versions `0..events`, nothing twice.
fn assert_stored_once(s: &Value, partitions: u64, per_partition: u64) {
    assert_eq!(s["ok"], true, "{s:#}");
    assert_eq!(s["events_acked"], partitions * per_partition, "{s:#}");
    let parts = s["partitions"].as_array().unwrap();
    assert_eq!(parts.len() as u64, partitions, "{s:#}");
    for p in parts {
        assert_eq!(p["events"], per_partition, "{s:#}");
        assert_eq!(p["versions"], serde_json::json!([0, per_partition - 1]), "{s:#}");
    }
}

/// The results of the windows the stream has closed on the node under `data`, against the
/// results of the rows `weir load` said it sent; returns how many were compared.
fn assert_fired_windows_exact(data: &Path, s: &Value, partitions: u32, per_partition: u64) -> usize {
    let g = GeneratorSpec {
        seed: s["seed"].as_u64().unwrap(),
        keys: s["keys"].as_u64().unwrap(),
        rows_per_ms: s["rows_per_ms"].as_u64().unwrap(),
        ts_start: s["ts_start"].as_i64().unwrap(),
        ..GeneratorSpec::default()
    };
    let mut spec = StreamSpec::generator(StreamId(2), partitions, 2, 1);
    spec.window = WindowSpec::tumbling(1000);
    spec.source = SourceKind::Generator { spec: g, limit: None, rate: None };
    let want = weir_engine::reference::generator_results(&spec, &vec![per_partition; partitions as usize]).unwrap();
    let got: Vec<WindowResult> = weir_engine::state::NodeResults::open(data).unwrap().scan(StreamId(2)).unwrap();
    // A window closes once every partition's rows passed its end.
    let last_ts = g.ts_start + ((per_partition - 1) / g.rows_per_ms) as i64;
    let closed: Vec<&WindowResult> = want.iter().filter(|r| r.start + 1000 <= last_ts).collect();
    let mut got_sorted = got.clone();
    got_sorted.sort_by_key(|r| (r.key, r.start));
    let want_by: std::collections::HashMap<(u64, i64), &WindowResult> =
        want.iter().map(|r| ((r.key, r.start), r)).collect();
    for r in &got_sorted {
        assert_eq!(Some(&r), want_by.get(&(r.key, r.start)), "a result differs from the rows sent");
    }
    for r in &closed {
        assert!(got_sorted.binary_search_by_key(&(r.key, r.start), |g| (g.key, g.start)).is_ok(), "missing {r:?}");
    }
    closed.len()
}

fn stop(config: &Path, node: &mut Child) {
    let out = weir().args(["stop", "--config"]).arg(config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exit_within(node, Duration::from_secs(30), "node").success());
}

#[test]
fn weir_load_into_one_node_acknowledges_every_event_once_and_the_results_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let log = dir.path().join("node-1.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    // 5 s of event time per partition at 20 rows per ms: 4 windows close.
    let args = ["--events", "200k", "--rows-per-ms", "20", "--keys", "1000", "--batch", "700"];
    let (code, s, err) = summary_of(load(&config, &args), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_stored_once(&s, 2, 100_000);
    assert_eq!(s["duplicates"], 0, "{s:#}");
    // The stream reads every row once: wait for the sources to have read them, then stop.
    let status_json = || {
        let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let t0 = std::time::Instant::now();
    loop {
        let st = status_json();
        let tasks = st["nodes"][0]["tasks"].as_array().cloned().unwrap_or_default();
        let read: Vec<u64> =
            tasks.iter().filter(|t| t["task"].as_u64() < Some(2)).map(|t| t["rows_out"].as_u64().unwrap()).collect();
        if read == [100_000, 100_000] {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "sources did not read the log: {st:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500)); // the windows that closed reach the sink
    stop(&config, &mut node.0[0]);
    let compared = assert_fired_windows_exact(&dir.path().join("data/node-1"), &s, 2, 100_000);
    assert!(compared >= 3 * 1000, "only {compared} window results closed");
}

#[test]
fn weir_load_survives_its_node_killed_with_sigkill_and_every_event_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let logs = [dir.path().join("node-1.log"), dir.path().join("node-1b.log")];
    let mut node = Nodes(vec![start(&config, 1, &logs[0], &[])]);
    let hdr = dir.path().join("load.hlog");
    let hdr_arg = hdr.display().to_string();
    let args = ["--events", "2M", "--rate", "500k", "--batch", "1000", "--timeout", "30s", "--hdr-log", &hdr_arg];
    let child = load(&config, &args);
    // Mid-load: kill -9, then start the node again on the same data.
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(800));
    node.0[0].kill().unwrap();
    node.0[0].wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    node.0[0] = start(&config, 1, &logs[1], &[]);
    let (code, s, err) = summary_of(child, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    // Batches in flight at the kill went again: those the log had stored are answered with their
    // first versions, so each partition still holds exactly its million events.
    assert_stored_once(&s, 2, 1_000_000);
    assert!(s["reconnects"].as_u64().unwrap() >= 1, "{s:#}");
    // The HdrHistogram interval log reads back with the crate's reader: an interval per second,
    // every acknowledged batch in it, and the outage as latency (open loop).
    let text = std::fs::read(&hdr).unwrap();
    let mut batches = 0;
    let mut worst = 0.0f64;
    let mut intervals = 0;
    let mut deserializer = hdrhistogram::serialization::Deserializer::new();
    for e in hdrhistogram::serialization::interval_log::IntervalLogIterator::new(&text) {
        if let hdrhistogram::serialization::interval_log::LogEntry::Interval(i) = e.unwrap() {
            intervals += 1;
            worst = worst.max(i.max());
            let bytes = base64_decode(i.encoded_histogram());
            let h: hdrhistogram::Histogram<u64> = deserializer.deserialize(&mut &bytes[..]).unwrap();
            batches += h.len();
        }
    }
    assert!(intervals >= 4, "{intervals} intervals");
    assert!(batches >= 2_000, "{batches} batches in the log (2,000 acknowledged at least)");
    assert!(worst >= 500_000.0, "the outage does not show: worst latency {worst} µs");
    stop(&config, &mut node.0[0]);
}

#[test]
fn weir_load_with_a_wrong_secret_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let mut node = Nodes(vec![start(&config, 1, &dir.path().join("node.log"), &[])]);
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = file["nodes"][0]["addr"].as_str().unwrap().to_string();
    let out = weir()
        .args(["load", "--node", &addr, "--cluster", "weir-load-one-node", "--stream", "2", "--partitions", "2"])
        .args(["--events", "1000", "--timeout", "5s"])
        .env("WEIR_CLUSTER_SECRET", "not-the-secret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refused this client") && err.contains("secret"), "{err}");
    stop(&config, &mut node.0[0]);
}

/// Base64 (the standard alphabet, with padding) of an interval log's histogram.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let bytes: Vec<u8> = s.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| acc | val(*c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
