//! `weir load` into three `weir node` processes whose ingest logs keep two copies
//! (`[stream.ingest] replicas = 2`): a node killed for good in the middle of the load loses no
//! acknowledged row. Its partition's source moves to the node keeping the copy, the load goes
//! on there, and every window's result is that of the rows sent. A follower lost mid-load
//! leaves its partition's in-sync set and the load goes on without it.

mod util;

use std::path::PathBuf;
use std::time::Duration;

use util::load::*;
use util::*;

#[test]
fn with_two_copies_a_node_killed_for_good_mid_load_loses_no_acknowledged_row() {
    let dir = tempfile::tempdir().unwrap();
    let (config, logs, mut nodes) = two_copies_on_three_nodes(dir.path());
    let args = ["--events", "900k", "--rate", "150k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    let child = load(&config, &args);
    // Mid-load, after a first commit: node 3 (partition 2's source; the copy of partition 1's
    // log) is killed and never comes back.
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    nodes.0[2].kill().unwrap();
    nodes.0[2].wait().unwrap();
    let (code, s, err) = summary_of(child, Duration::from_secs(120));
    let logs_text =
        || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text());
    assert_acknowledged(&s, 3, 300_000);
    assert!(s["reconnects"].as_u64().unwrap() >= 1, "{s:#}");
    // Partition 2's source moved to node 1, which kept its log's copy: the rows acknowledged by
    // node 3 before it died are there, and the results are exactly those of the rows sent.
    line_in_any(&[&logs[0], &logs[1]], "tasks move", Duration::from_secs(5));
    let want = expected(&s, 3, 300_000);
    wait_for_results(&config, want.len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}\n{}", logs_text());
    assert!(text.contains("match the 900000 rows of 1 load(s)") && text.contains("from 2 nodes"), "{text}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().take(2).enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
    // Node 1's copy of partition 2 holds every row once, in order, as node 3's log did.
    assert_logs_hold_partition_once(&dir.path().join("data/node-1"), &s, 2, 300_000);
}

/// Two copies, the sources on nodes 1 and 2 only (partition 1's copy on node 3, which runs an
/// agg and a sink): node 3 killed mid-load and started again only after the load. Partition 1's
/// appends wait for its copy for `in_sync_lag` (2 s), then node 2 takes the copy out of the
/// partition's in-sync set in etcd and acknowledges them alone, so the load ends long before
/// `move_after` (120 s, no move); status says so. Back, node 3's copy catches up and rejoins
/// the set, and every window's result is that of the rows sent.
#[test]
fn a_follower_killed_mid_load_leaves_the_in_sync_set_and_the_load_goes_on_without_a_move() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "partitions"], 2i64);
        set(t, &["stream", "ingest", "replicas"], 2i64);
        set(t, &["stream", "ingest", "in_sync_lag"], "2s");
        set(t, &["restart", "move_after"], "120s");
        // Sources 0 and 1, aggs 2 to 4, sinks 5 to 7.
        let placement: toml::Table = [(0, 1), (1, 2), (2, 1), (3, 2), (4, 3), (5, 1), (6, 2), (7, 3)]
            .into_iter()
            .map(|(t, n)| (t.to_string(), toml::Value::Integer(n)))
            .collect();
        set(t, &["stream", "placement"], placement);
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let args = ["--events", "600k", "--rate", "100k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(30));
    let child = load(&config, &args);
    std::thread::sleep(Duration::from_millis(1500));
    nodes.0[2].kill().unwrap();
    nodes.0[2].wait().unwrap();
    let (code, s, err) = summary_of(child, Duration::from_secs(60));
    let logs_text =
        || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text());
    assert_acknowledged(&s, 2, 300_000);
    line_in(&logs[1], "left the in-sync set", Duration::from_secs(5));
    let status = || -> serde_json::Value {
        let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let in_sync = |j: &serde_json::Value| -> Option<String> {
        let logs = j["nodes"][1]["logs"].as_array()?;
        Some(logs.iter().find(|l| l["partition"] == 1 && l["source"] == true)?["in_sync"].as_str()?.to_string())
    };
    assert_eq!(in_sync(&status()).as_deref(), Some("alone"), "{:#}", status());
    // Node 1, which keeps no copy of partition 1, shows its set as etcd holds it.
    let in_etcd = |j: &serde_json::Value, p: u64| -> Option<serde_json::Value> {
        j["nodes"][0]["member"]["in_sync"].as_array()?.iter().find(|e| e["partition"] == p).cloned()
    };
    let t0 = std::time::Instant::now();
    while in_etcd(&status(), 1).is_none_or(|e| e["in"] != false) {
        assert!(t0.elapsed() < Duration::from_secs(10), "node 1 never showed the set: {:#}", status());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (set0, set1) = (in_etcd(&status(), 0).unwrap(), in_etcd(&status(), 1).unwrap());
    assert_eq!((&set1["primary"], &set1["follower"]), (&2.into(), &3.into()), "{set1}");
    assert_eq!((&set0["primary"], &set0["follower"], &set0["in"]), (&1.into(), &2.into(), &true.into()), "{set0}");
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("in-sync sets (source node+copy node): p0 1+2, p1 2 (copy on 3 out)"), "{text}");
    assert_eq!(count_in(&logs[0], "moving the tasks") + count_in(&logs[1], "moving the tasks"), 0);
    // Node 3 back: its copy catches up and rejoins the set; the results are exact.
    nodes.0[2] = start(&config, 3, &dir.path().join("node-3b.log"), &[]);
    let t0 = std::time::Instant::now();
    while in_sync(&status()).as_deref() != Some("in") {
        assert!(t0.elapsed() < Duration::from_secs(60), "the copy never rejoined: {:#}", status());
        std::thread::sleep(Duration::from_millis(200));
    }
    let want = expected(&s, 2, 300_000);
    wait_for_results(&config, want.len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}\n{}", logs_text());
    assert!(text.contains("match the 600000 rows of 1 load(s)"), "{text}");
}
