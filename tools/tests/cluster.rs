//! Clusters of separate `weir node` processes on 127.0.0.1, from the example config: a bounded
//! stream verified, a stop with a final checkpoint, a node killed with SIGKILL.

mod util;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use util::*;
use weir_engine::wire::StreamId;

#[test]
fn three_nodes_from_the_example_run_a_bounded_stream_and_weir_verify_finds_every_result_exact() {
    const EVENTS: u64 = 150_000;
    let dir = tempfile::tempdir().unwrap();
    let config = bounded_three_node(dir.path(), EVENTS); // 1.5 s of stream: time for checkpoints
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    // Once it has ended on every node (they keep serving), every result is exact.
    let said = verify_until_ended(&config, Duration::from_secs(90));
    assert!(said.contains("all 10000 window results match"), "{said}");
    // Verify can fail: against another seed, every result differs.
    let (code, out, _) = verify(&config, &[("WEIR_STREAM__GENERATOR__SEED", "43")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("expected count") && out.contains("differ"), "{out}");
    // The engine's own reading of the stores agrees, and the store holds the commits.
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        let status = exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1));
        let log = std::fs::read_to_string(&logs[i]).unwrap();
        assert!(status.success(), "node {} exited with {status}:\n{log}", i + 1);
        let prefix = format!("node={} ", i + 1);
        assert!(log.lines().all(|l| l.starts_with(&prefix)), "every line names the node:\n{log}");
        assert!(log.contains("stream=bench"), "the stream's lines name it:\n{log}");
        assert!(log.contains("stream ended on this node"), "{log}");
    }
    let data: Vec<PathBuf> = (1..=3).map(|n| dir.path().join("data").join(format!("node-{n}"))).collect();
    let want = weir_engine::reference::bounded_results(&three_node_stream(EVENTS)).unwrap();
    assert!(results_of(&data) == want, "results differ from the reference");
    for d in &data {
        assert!(!results_of(std::slice::from_ref(d)).is_empty(), "{} has results of its own sink", d.display());
    }
    let store = weir_engine::backup::LocalDirStore::new(dir.path().join("remote"));
    let last = weir_engine::backup::commit::last_commit(&store, StreamId(1)).unwrap();
    assert!(last.is_some(), "the coordinator committed checkpoints into the shared store");
}

#[test]
fn weir_stop_with_a_checkpoint_stops_every_node_and_a_restart_resumes_from_that_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("three-node.toml"), dir.path(), |t| {
        set(t, &["stream", "generator", "rate"], 200_000);
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    // Running and committing on all three.
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(60));
    let out = weir().args(["stop", "--checkpoint", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    // It returns once every node has exited.
    assert!(said.contains("stopped: nodes 1, 2, 3 no longer listening (exited)"), "{said}");
    let final_id: u64 = said
        .split_whitespace()
        .find_map(|w| w.strip_prefix("chk-").and_then(|n| n.parse().ok()))
        .unwrap_or_else(|| panic!("which checkpoint: {said}"));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        let status =
            exit_within_logged(c, Duration::from_secs(30), &format!("node {} after weir stop", i + 1), &logs[i]);
        let log = std::fs::read_to_string(&logs[i]).unwrap();
        assert!(status.success() && log.contains("reason=\"weir stop\""), "{status}\n{log}");
    }
    // Started again, every node restores the final checkpoint or a later one (a commit may have
    // landed between it and the stop).
    let logs2: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("again-{n}.log"))).collect();
    let mut again = Nodes((1..=3).map(|n| start(&config, n, &logs2[n as usize - 1], &[])).collect());
    for log in &logs2 {
        // The coordinator's node reads the commit record; the others restore what it answers.
        let restored = line_in(log, " restored task=", Duration::from_secs(30));
        let id: u64 = restored
            .split_whitespace()
            .find_map(|w| w.strip_prefix("checkpoint=chk-").and_then(|n| n.parse().ok()))
            .unwrap_or_else(|| panic!("{restored}"));
        assert!(id >= final_id, "restored chk-{id}, the final checkpoint was chk-{final_id}");
    }
    // A stop sent to a node that does not coordinate reaches every node too.
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let third = file["nodes"][2]["addr"].as_str().unwrap().to_string();
    let out = weir().args(["stop", "--node", &third, "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in again.0.iter_mut().enumerate() {
        assert!(exit_within_logged(c, Duration::from_secs(30), &format!("node {}", i + 1), &logs2[i]).success());
    }
}

/// Node `victim` of three killed with SIGKILL while checkpoints run every 200 ms (so most
/// likely in the middle of one) and started again on its own: the survivors restart the stream
/// by themselves at the newer incarnation, every node restores the same commit, and `weir
/// verify` finds every result exact.
/// With `wipe`, the victim's data directory is deleted before it starts again: it restores its
/// tasks from the remote store.
fn killed_and_restarted_node_rejoins_and_the_results_are_exact(victim: u32, wipe: bool) {
    const EVENTS: u64 = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let config = bounded_three_node(dir.path(), EVENTS); // 4 s of stream
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &log(&format!("node-{n}")), &[])).collect());
    line_in(&log("node-1"), "checkpoint committed", Duration::from_secs(60));
    let v = victim as usize - 1;
    nodes.0[v].kill().unwrap(); // SIGKILL
    nodes.0[v].wait().unwrap();
    // The survivors answer status while they wait to restart.
    let t0 = Instant::now();
    loop {
        let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let nodes = json["nodes"].as_array().unwrap();
        if nodes.iter().any(|n| n["restarting"] == true) {
            // And they say since when the lost node is gone.
            let lost = &nodes[v];
            assert!(lost["up"] == false && lost["down_since_ms"].as_u64().is_some_and(|t| t > 0), "{json:#}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no node said it was restarting: {json:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let data = dir.path().join("data").join(format!("node-{victim}"));
    if wipe {
        std::fs::remove_dir_all(&data).unwrap();
    }
    nodes.0[v] = start(&config, victim, &log("again"), &[]);
    let said = verify_until_ended(&config, Duration::from_secs(120));
    assert!(said.contains("all 10000 window results match"), "{said}");
    // The restarted stream keeps its interval: no more commits than it allows since the
    // coordinator's node started it again (plus the one in flight).
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let coord = json["nodes"].as_array().unwrap().iter().find(|n| !n["streams"].as_array().unwrap().is_empty());
    let coord = coord.unwrap_or_else(|| panic!("no coordinator answered: {json:#}"));
    let (committed, interval) =
        (coord["streams"][0]["committed"].as_u64().unwrap(), coord["streams"][0]["interval_ms"].as_u64().unwrap());
    assert_eq!(interval, 200, "{json:#}");
    assert!(committed <= coord["uptime_ms"].as_u64().unwrap() / interval + 2, "{json:#}");
    let again = std::fs::read_to_string(log("again")).unwrap();
    if wipe {
        assert!(again.contains("downloading the snapshot"), "restored from the remote store:\n{again}");
    } else {
        assert!(again.contains("incarnation=2"), "the returning node starts above its last incarnation:\n{again}");
    }
    for n in (1..=3).filter(|n| *n != victim) {
        let text = std::fs::read_to_string(log(&format!("node-{n}"))).unwrap();
        assert!(text.contains("restarting it from the last commit"), "node {n} did not restart:\n{text}");
    }
    // Status tells the restart and its reason.
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let survivor = if victim == 1 { 1 } else { 0 };
    let restarts = &json["nodes"][survivor]["restarts"];
    assert!(restarts.as_array().is_some_and(|r| !r.is_empty()), "{json:#}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
}

#[test]
fn a_node_killed_with_sigkill_and_restarted_rejoins_and_weir_verify_passes() {
    killed_and_restarted_node_rejoins_and_the_results_are_exact(3, false);
}

#[test]
fn the_coordinator_killed_with_sigkill_and_restarted_resumes_and_weir_verify_passes() {
    killed_and_restarted_node_rejoins_and_the_results_are_exact(1, false);
}

#[test]
fn a_node_whose_data_directory_was_deleted_restores_from_the_remote_store_and_weir_verify_passes() {
    killed_and_restarted_node_rejoins_and_the_results_are_exact(2, true);
}

/// Node 3 of three killed with SIGKILL and not started again: once its lease has ended and
/// `restart.move_after` (2 s here) passed, the elected node moves its tasks to nodes 1 and 2,
/// which restore them from the
/// remote store and finish the stream; `weir verify` finds every result exact with node 3 down.
/// Started again, node 3 finds its tasks gone: it is idle, and the stream does not restart.
#[test]
fn a_node_that_never_comes_back_has_its_tasks_moved_and_weir_verify_passes() {
    const EVENTS: u64 = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("three-node.toml"), dir.path(), |t| {
        set(t, &["stream", "generator", "events"], EVENTS as i64);
        set(t, &["stream", "generator", "rate"], 100_000);
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["restart", "move_after"], "2s");
    });
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &log(&format!("node-{n}")), &[])).collect());
    line_in(&log("node-1"), "checkpoint committed", Duration::from_secs(60));
    nodes.0[2].kill().unwrap(); // SIGKILL
    nodes.0[2].wait().unwrap();
    let moved =
        line_in_any(&[&log("node-1"), &log("node-2")], "moving the tasks of a lost node", Duration::from_secs(60));
    assert!(moved.contains("node 3 has been down for 2s") && moved.contains("placement=1"), "{moved}");
    let said = verify_until_ended(&config, Duration::from_secs(120));
    assert!(said.contains("all 10000 window results match") && said.contains("from 2 nodes"), "{said}");
    for n in [1, 2] {
        let text = std::fs::read_to_string(log(&format!("node-{n}"))).unwrap();
        assert!(text.contains("downloading the snapshot") || n == 1, "node {n} restored moved tasks:\n{text}");
        assert!(text.contains(&format!("incarnation={}", 1u64 << 32)), "node {n} runs placement 1:\n{text}");
    }
    let status = || -> serde_json::Value {
        let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = status();
    let incarnations = |j: &serde_json::Value| [0, 1].map(|i| j["nodes"][i]["incarnation"].as_u64().unwrap());
    // Node 3 comes back: idle, and the others go on at their incarnation.
    nodes.0[2] = start(&config, 3, &log("again"), &[]);
    line_in(&log("again"), "node idle", Duration::from_secs(30));
    let t0 = Instant::now();
    let after = loop {
        let j = status();
        if j["nodes"][2]["idle"] == true
            && j["nodes"][2]["peers"].as_array().is_some_and(|p| p.iter().all(|l| l["up"] == true))
        {
            break j;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "node 3 never said it was idle and connected: {j:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(incarnations(&after), incarnations(&before), "the stream restarted for an idle node: {after:#}");
    for n in 0..3 {
        // Each node's incarnation of the stream (its run's epoch) names the placement it runs.
        assert_eq!(after["nodes"][n]["placement"], 1, "node {}: {after:#}", n + 1);
    }
    assert!(after["nodes"][2]["tasks"].as_array().is_some_and(|t| t.is_empty()), "{after:#}");
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("idle for") && text.contains("its tasks moved to the other nodes"), "{text}");
    let (code, out, err) = verify(&config, &[]);
    assert_eq!(code, Some(0), "{out} {err}");
    // `weir stop` stops the idle node too.
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
}

/// A soak behind `WEIR_CLUSTER_SOAK=N`: N SIGKILLs of random nodes (the coordinator included),
/// each started again after a random pause, while a longer bounded stream runs; then `weir
/// verify` passes.
#[test]
fn soak_random_kills_of_random_nodes_end_with_exact_results() {
    let Some(kills) = std::env::var("WEIR_CLUSTER_SOAK").ok().and_then(|v| v.parse::<u64>().ok()) else {
        return;
    };
    let events = 400_000 + kills * 150_000; // 100,000 events/s per partition
    let dir = tempfile::tempdir().unwrap();
    let config = bounded_three_node(dir.path(), events);
    let log = |n: u32, round: u64| dir.path().join(format!("node-{n}-{round}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &log(n, 0), &[])).collect());
    line_in(&log(1, 0), "checkpoint committed", Duration::from_secs(60));
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for round in 1..=kills {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let victim = (x % 3) as usize;
        std::thread::sleep(Duration::from_millis(300 + x % 900));
        nodes.0[victim].kill().unwrap();
        nodes.0[victim].wait().unwrap();
        std::thread::sleep(Duration::from_millis(x % 500));
        nodes.0[victim] = start(&config, victim as u32 + 1, &log(victim as u32 + 1, round), &[]);
    }
    let said = verify_until_ended(&config, Duration::from_secs(300));
    assert!(said.contains("window results match"), "{said}");
}

#[test]
fn status_says_the_stream_waits_while_its_coordinator_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("three-node.toml"), dir.path(), |_| {});
    let _node2 = Nodes(vec![start(&config, 2, &dir.path().join("node-2.log"), &[])]);
    let t0 = Instant::now();
    let text = loop {
        let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("waiting") {
            assert_eq!(out.status.code(), Some(1), "nodes 1 and 3 are down: {text}");
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "node 2 never answered: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("the stream waits for it and nothing commits"), "{text}");
    assert!(text.lines().filter(|l| l.contains(" down ")).count() == 2, "{text}");
}
