//! Helpers of the `weir load` tests: the load as a child process, its JSON summary, what it
//! should have stored and computed, `weir verify` and `weir stop` of the ingest stream.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

use super::{Nodes, adjusted, example, exit_within, set, start, weir};

/// `examples/load-one-node.toml` under `dir`, checkpointing every 200 ms.
pub fn load_one_node(dir: &Path) -> PathBuf {
    load_one_node_with(dir, "full")
}

/// [`load_one_node`] whose aggs take `snapshots` (`full` or `replay`) checkpoints.
pub fn load_one_node_with(dir: &Path, snapshots: &str) -> PathBuf {
    adjusted(example("load-one-node.toml"), dir, |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["checkpoint", "snapshots"], snapshots);
    })
}

pub fn load(config: &Path, args: &[&str]) -> Child {
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
pub fn summary_of(child: Child, limit: Duration) -> (Option<i32>, Value, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out: Output = match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // Killed, so that what it printed tells why it did not end.
            let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
            let out = rx.recv().unwrap().unwrap();
            panic!(
                "weir load did not end within {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("no JSON summary ({e}): {err}"));
    (out.status.code(), json, err)
}

/// The load says every event was acknowledged once, in order.
pub fn assert_acknowledged(s: &Value, partitions: u64, per_partition: u64) {
    assert_eq!(s["ok"], true, "{s:#}");
    assert_eq!(s["events_acked"], partitions * per_partition, "{s:#}");
    let parts = s["partitions"].as_array().unwrap();
    assert_eq!(parts.len() as u64, partitions, "{s:#}");
    for p in parts {
        assert_eq!(p["events"], per_partition, "{s:#}");
        let (lo, hi) = (p["versions"][0].as_u64().unwrap(), p["versions"][1].as_u64().unwrap());
        assert!(hi - lo + 1 >= per_partition, "{s:#}");
    }
}

/// The load's generator, from its JSON summary.
pub fn generator_of(s: &Value) -> GeneratorSpec {
    GeneratorSpec {
        seed: s["seed"].as_u64().unwrap(),
        keys: s["keys"].as_u64().unwrap(),
        rows_per_ms: s["rows_per_ms"].as_u64().unwrap(),
        ts_start: s["ts_start"].as_i64().unwrap(),
        ..GeneratorSpec::default()
    }
}

/// Each partition's log on the stopped node under `data` holds exactly the rows the load meant
/// to send, in order, each once (whatever was sent again).
pub fn assert_logs_hold_each_row_once(data: &Path, s: &Value, partitions: u32, per_partition: u64) {
    for p in 0..partitions {
        assert_logs_hold_partition_once(data, s, p, per_partition);
    }
}

/// Partition `p`'s log on the stopped node under `data` holds exactly the rows the load meant to
/// send to it, in order, each once.
pub fn assert_logs_hold_partition_once(data: &Path, s: &Value, p: u32, per_partition: u64) {
    let g = generator_of(s);
    let dir = weir_engine::ingest::service::partition_dir(&data.join("ingest"), p);
    let log = weir_engine::ingest::IngestLog::open(&dir, Default::default()).unwrap();
    let mut r = log.reader(weir_engine::wire::Version(0)).unwrap();
    let mut got = weir_engine::wire::Batch::default();
    while r.read(1 << 20, &mut got).unwrap() > 0 {}
    let mut want = weir_engine::wire::Batch::default();
    weir_engine::operator::generator::Generator::new(g, p).fill(0, per_partition as usize, &mut want);
    assert_eq!(got.len(), want.len(), "partition {p}: rows in the log");
    assert!(got == want, "partition {p}: the log's rows differ from those sent");
}

/// `load-three-node.toml` with two copies of each partition's log, checkpoints every 200 ms
/// and a lost node's tasks moved after 2 s, its three nodes started: the config, their logs
/// and processes.
pub fn two_copies_on_three_nodes(dir: &Path) -> (PathBuf, Vec<PathBuf>, Nodes) {
    let config = adjusted(example("load-three-node.toml"), dir, |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "ingest", "replicas"], 2i64);
        set(t, &["restart", "move_after"], "2s");
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.join(format!("node-{n}.log"))).collect();
    let nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    (config, logs, nodes)
}

/// Waits until `weir query` finds `n` results (the node logs to `log`). Not the sink's counter:
/// it counts from the node's last start.
pub fn wait_for_results(config: &Path, n: usize, log: &Path) {
    let t0 = std::time::Instant::now();
    loop {
        let out = weir().args(["query", "--csv", "--config"]).arg(config).output().unwrap();
        let found = String::from_utf8_lossy(&out.stdout).lines().count().saturating_sub(1);
        if out.status.success() && found >= n {
            return;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            panic!("{found} of {n} results after 60 s\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The results on the stopped node under `data` are exactly `want`.
pub fn assert_results(data: &Path, want: &[WindowResult]) {
    let mut got = weir_engine::state::NodeResults::open(data).unwrap().scan(StreamId(2)).unwrap();
    got.sort_by_key(|r| (r.key, r.start));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the results differ from those of the rows sent");
}

/// The results of the rows `weir load` said it sent (its JSON summary), by (key, window).
pub fn expected(s: &Value, partitions: u32, per_partition: u64) -> Vec<WindowResult> {
    let g = generator_of(s);
    let mut spec = StreamSpec::generator(StreamId(2), partitions, 2, 1);
    spec.window = WindowSpec::tumbling(1000);
    spec.source = SourceKind::Generator { spec: g, limit: None, rate: None };
    weir_engine::reference::generator_results(&spec, &vec![per_partition; partitions as usize]).unwrap()
}

/// `weir verify` of the ingest stream: its exit code and what it printed.
pub fn verify_ingest(config: &Path) -> (Option<i32>, String) {
    let out = weir().args(["verify", "--stream", "2", "--config"]).arg(config).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

pub fn stop(config: &Path, node: &mut Child) {
    let out = weir().args(["stop", "--config"]).arg(config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exit_within(node, Duration::from_secs(30), "node").success());
}
