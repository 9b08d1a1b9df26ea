//! `weir load` against real `weir node` processes on 127.0.0.1: every event acknowledged once,
//! across a node killed with `kill -9` and restarted, the HdrHistogram log it writes, and the
//! results read back with `weir query`.

mod util;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use util::load::*;
use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::WindowResult;
use weir_engine::wire::StreamId;

#[test]
fn weir_load_into_one_node_acknowledges_every_event_once_and_every_window_closes_exact() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let log = dir.path().join("node-1.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    // 1 s of event time per partition at 100 rows per ms: one or two windows of 1,000 keys.
    let args = ["--events", "200k", "--rows-per-ms", "100", "--keys", "1000", "--batch", "700"];
    let (code, s, err) = summary_of(load(&config, &args), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 2, 100_000);
    assert_eq!(s["duplicates"], 0, "{s:#}");
    // The load marked its partitions at its end (a marker past the last window of its rows):
    // every window closes.
    let want = expected(&s, 2, 100_000);
    wait_for_results(&config, want.len(), &log);
    // `weir query` reads them back over the network: all of them as CSV, one key's as JSON
    // lines, a time range.
    let query = |args: &[&str]| {
        let out = weir().args(["query", "--config"]).arg(&config).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let csv = query(&["--csv"]);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("key,start_ms,count,sum,min,max,avg"));
    let mut rows: Vec<(u64, i64, u64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    rows.sort();
    let want_rows: Vec<(u64, i64, u64)> = want.iter().map(|r| (r.key, r.start, r.count)).collect();
    assert_eq!(rows, want_rows);
    let key7: Vec<Value> = query(&["--key", "7", "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let want7: Vec<&WindowResult> = want.iter().filter(|r| r.key == 7).collect();
    assert_eq!(key7.len(), want7.len());
    for (g, w) in key7.iter().zip(&want7) {
        assert_eq!(
            (g["start_ms"].as_i64(), g["count"].as_u64(), g["sum"].as_f64()),
            (Some(w.start), Some(w.count), Some(w.sum))
        );
    }
    let first = want.iter().map(|r| r.start).min().unwrap();
    let in_first = query(&["--csv", "--from", &first.to_string(), "--to", &(first + 1000).to_string()]);
    assert_eq!(in_first.lines().count() - 1, want.iter().filter(|r| r.start == first).count());
    // `weir verify` needs no more than the stream: the load's parameters are in the ledgers.
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("all {} window results match the 200000 rows of 1 load(s)", want.len())), "{text}");
    stop(&config, &mut node.0[0]);
    let data = dir.path().join("data/node-1");
    assert_logs_hold_each_row_once(&data, &s, 2, 100_000);
    assert_results(&data, &want);
}

#[test]
fn weir_load_survives_its_node_killed_with_sigkill_and_every_event_is_stored_once() {
    load_survives_sigkill("full");
}

#[test]
fn weir_load_survives_its_node_killed_with_sigkill_with_replay_snapshots() {
    load_survives_sigkill("replay");
}

/// The node of a `weir load` is killed mid-load and started again, its aggs taking `snapshots`
/// checkpoints: every event is acknowledged and stored once, every window is exact.
fn load_survives_sigkill(snapshots: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node_with(dir.path(), snapshots);
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
    assert_acknowledged(&s, 2, 1_000_000);
    assert!(s["reconnects"].as_u64().unwrap() >= 1, "{s:#}");
    // The HdrHistogram interval log reads back with the crate's reader: an interval per second,
    // every acknowledged event in it, and the outage as latency (open loop).
    let text = std::fs::read(&hdr).unwrap();
    let mut events = 0;
    let mut worst = 0.0f64;
    let mut intervals = 0;
    let mut deserializer = hdrhistogram::serialization::Deserializer::new();
    for e in hdrhistogram::serialization::interval_log::IntervalLogIterator::new(&text) {
        if let hdrhistogram::serialization::interval_log::LogEntry::Interval(i) = e.unwrap() {
            intervals += 1;
            worst = worst.max(i.max());
            let bytes =
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, i.encoded_histogram()).unwrap();
            let h: hdrhistogram::Histogram<u64> = deserializer.deserialize(&mut &bytes[..]).unwrap();
            events += h.len();
        }
    }
    assert!(intervals >= 4, "{intervals} intervals");
    assert_eq!(events, 2_000_000, "every acknowledged event in the log, once");
    assert!(worst >= 500_000.0, "the outage does not show: worst latency {worst} µs");
    // Batches in flight at the kill went again: those the log had stored were answered with
    // their first versions, so each log holds its million rows once, and the results of every
    // window are those of the rows sent, as without the kill.
    let want = expected(&s, 2, 1_000_000);
    wait_for_results(&config, want.len(), &logs[1]);
    if snapshots == "replay" {
        let log = std::fs::read_to_string(&logs[1]).unwrap();
        assert!(log.contains("replaying rows for the downstream windows"), "the restarted node did not replay: {log}");
    }
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("match the 2000000 rows of 1 load(s)"), "{text}");
    stop(&config, &mut node.0[0]);
    let data = dir.path().join("data/node-1");
    assert_logs_hold_each_row_once(&data, &s, 2, 1_000_000);
    assert_results(&data, &want);
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

#[test]
fn weir_load_into_three_nodes_stores_each_partition_on_its_node_once_and_every_window_closes_exact() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        adjusted(example("load-three-node.toml"), dir.path(), |t| set(t, &["checkpoint", "interval"], "200ms"));
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let args = ["--events", "300k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "30s", "--measure-results"];
    let (code, s, err) = summary_of(load(&config, &args), Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 3, 100_000);
    // Every event's window became readable on the nodes, after the event's ack.
    let e2r = &s["event_to_result_ms"];
    assert_eq!(e2r["events"], 300_000, "{s:#}");
    let (p50, max) = (e2r["p50"].as_f64().unwrap(), e2r["max"].as_f64().unwrap());
    assert!(0.0 < p50 && p50 <= max && max < 60_000.0, "{s:#}");
    assert_eq!(s["nodes"].as_array().unwrap().len(), 3, "one connection per node: {s:#}");
    let mut spec_want = expected(&s, 3, 100_000);
    spec_want.sort_by_key(|r| (r.key, r.start));
    wait_for_results(&config, spec_want.len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("(per partition: 100000, 100000, 100000), from 3 nodes"), "{text}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
    // Partition p's source runs on node p + 1 ("spread"): its log is there, holding every row once.
    let data: Vec<PathBuf> = (1..=3).map(|n| dir.path().join("data").join(format!("node-{n}"))).collect();
    let g = generator_of(&s);
    for p in 0..3u32 {
        let dir = weir_engine::ingest::service::partition_dir(&data[p as usize].join("ingest"), p);
        let log = weir_engine::ingest::IngestLog::open(&dir, Default::default()).unwrap();
        let mut r = log.reader(weir_engine::wire::Version(0)).unwrap();
        let mut got = weir_engine::wire::Batch::default();
        while r.read(1 << 20, &mut got).unwrap() > 0 {}
        let mut want = weir_engine::wire::Batch::default();
        weir_engine::operator::generator::Generator::new(g, p).fill(0, 100_000, &mut want);
        assert!(got == want, "partition {p} on node {}: the log's rows differ from those sent", p + 1);
    }
    let mut got = Vec::new();
    for d in &data {
        got.extend(weir_engine::state::NodeResults::open(d).unwrap().scan(StreamId(2)).unwrap());
    }
    got.sort_by_key(|r| (r.key, r.start));
    assert_eq!(got.len(), spec_want.len());
    assert!(got == spec_want, "the three nodes' results differ from those of the rows sent");
}

#[test]
fn a_second_weir_load_starts_after_the_first_and_verify_counts_both() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let log = dir.path().join("node-1.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    let first = ["--events", "100k", "--rows-per-ms", "100", "--keys", "500"];
    let (code, a, err) = summary_of(load(&config, &first), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{a:#} {err}");
    // Another seed and key count, right after: its event time starts past the first load's
    // last window (which the first load's end closed), so none of its rows is late.
    let second = ["--events", "60k", "--rows-per-ms", "100", "--keys", "700", "--seed", "7"];
    let (code, b, err) = summary_of(load(&config, &second), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{b:#} {err}");
    assert!(b["ts_start"].as_i64().unwrap() >= a["ts_start"].as_i64().unwrap() + 500, "{a:#} {b:#}");
    assert_eq!(b["partitions"][0]["events_before"], 50_000, "{b:#}");
    let mut want = expected(&a, 2, 50_000);
    want.extend(expected(&b, 2, 30_000));
    wait_for_results(&config, want.len(), &log);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("match the 160000 rows of 2 load(s) (per partition: 80000, 80000)"), "{text}");
    // Without the config: the node says what the stream is, the secret comes from the
    // environment.
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = file["nodes"][0]["addr"].as_str().unwrap().to_string();
    let out = weir()
        .args(["verify", "--node", &addr, "--cluster", "weir-load-one-node", "--stream", "2"])
        .env("WEIR_CLUSTER_SECRET", file["cluster_secret"].as_str().unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("match the 160000 rows of 2 load(s)"), "{text}");
    // Verify refuses a stream the config does not run.
    let out = weir().args(["verify", "--stream", "9", "--config"]).arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    stop(&config, &mut node.0[0]);
    let mut got =
        weir_engine::state::NodeResults::open(&dir.path().join("data/node-1")).unwrap().scan(StreamId(2)).unwrap();
    got.sort_by_key(|r| (r.key, r.start));
    want.sort_by_key(|r| (r.key, r.start));
    assert!(got == want, "the results differ from those of both loads' rows");
}

#[test]
fn weir_verify_of_an_ingest_stream_reports_rows_its_results_lack() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_one_node(dir.path());
    let logs = [dir.path().join("node-1.log"), dir.path().join("node-1b.log")];
    let mut node = Nodes(vec![start(&config, 1, &logs[0], &[])]);
    let args = ["--events", "20k", "--rows-per-ms", "100", "--keys", "100"];
    let (code, s, err) = summary_of(load(&config, &args), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{s:#} {err}");
    let want = expected(&s, 2, 10_000);
    wait_for_results(&config, want.len(), &logs[0]);
    stop(&config, &mut node.0[0]);
    // A producer that describes rows it did not send: it says seed 9 from the load's start, and
    // appends other rows. They come after the end-of-load marker with earlier event times, so
    // the stream drops them as late; the ledger says they are there, and verify finds their
    // windows' results wrong.
    let data = dir.path().join("data/node-1");
    let part = weir_engine::ingest::service::partition_dir(&data.join("ingest"), 0);
    let mut log = weir_engine::ingest::IngestLog::open(&part, Default::default()).unwrap();
    let ts = s["ts_start"].as_i64().unwrap();
    let description = format!(
        r#"{{"weir_load":1,"seed":9,"keys":100,"ts_start":{ts},"rows_per_ms":100,"out_of_order":0.0,"max_disorder_ms":0}}"#
    );
    log.describe(0x5eed, description.as_bytes()).unwrap();
    let mut rows = weir_engine::wire::Batch::default();
    let g = GeneratorSpec { seed: 10, keys: 100, ts_start: ts, rows_per_ms: 100, ..GeneratorSpec::default() };
    weir_engine::operator::generator::Generator::new(g, 0).fill(0, 500, &mut rows);
    let from = weir_engine::ingest::segment::ProducerSeq { producer: 0x5eed, seq: 0 };
    log.append_from(from, &rows).unwrap();
    // It ends as a load does (a marker, noted in the ledger): its window counts as closed.
    log.append_marker(ts).unwrap();
    log.end_load(0x5eed, ts).unwrap();
    log.sync().unwrap();
    drop(log);
    node.0[0] = start(&config, 1, &logs[1], &[]);
    line_in(&logs[1], "checkpoint committed", Duration::from_secs(30));
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("differ or are missing") && text.contains("of 2 load(s)"), "{text}");
    assert!(text.contains("expected count"), "the first mismatches are printed: {text}");
    stop(&config, &mut node.0[0]);
}
