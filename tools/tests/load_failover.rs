//! `weir load` into three `weir node` processes whose ingest logs keep two copies
//! (`[stream.ingest] replicas = 2`): a node killed for good in the middle of the load loses no
//! acknowledged row. Its partition's source moves to the node keeping the copy, the load goes
//! on there, and every window's result is that of the rows sent.

mod util;

use std::path::PathBuf;
use std::time::Duration;

use util::load::*;
use util::*;

#[test]
fn with_two_copies_a_node_killed_for_good_mid_load_loses_no_acknowledged_row() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "ingest", "replicas"], 2i64);
        set(t, &["restart", "move_after"], "2s");
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
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
