//! Clusters of `weir node` processes on 127.0.0.1 whose control state is in a real etcd
//! (`WEIR_TEST_ETCD_ENDPOINT`, started by `scripts/services`): membership by lease, the elected
//! node that decides placement, and placement written only by it.

mod util;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use util::etcd::Etcd;
use util::*;
use weir_engine::backup::Store;
use weir_engine::cluster::{ControlBook, Keys, PlacementBook};
use weir_engine::control::{ControlStore, EtcdControl};
use weir_engine::wire::{NodeId, StreamId};

/// The three-node example on etcd, under a cluster name no other test uses (its keys are its
/// own), with `tune` applied.
fn on_etcd(dir: &Path, tune: impl FnOnce(&mut toml::Table)) -> (PathBuf, String) {
    on(dir, vec![etcd_endpoint()], "2s", tune)
}

/// The three-node example on the etcd members at `endpoints`, with leases of `lease`.
fn on(dir: &Path, endpoints: Vec<String>, lease: &str, tune: impl FnOnce(&mut toml::Table)) -> (PathBuf, String) {
    on_example("three-node.toml", dir, endpoints, lease, tune)
}

/// Example `file` on the etcd members at `endpoints`, with leases of `lease`.
fn on_example(
    file: &str,
    dir: &Path,
    endpoints: Vec<String>,
    lease: &str,
    tune: impl FnOnce(&mut toml::Table),
) -> (PathBuf, String) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let cluster = format!("etcd-test-{}-{nanos}", std::process::id());
    let name = cluster.clone();
    let config = adjusted(example(file), dir, |t| {
        t.insert("cluster".into(), name.into());
        let mut control = toml::Table::new();
        control.insert("etcd".into(), toml::Value::Array(endpoints.into_iter().map(Into::into).collect()));
        control.insert("lease".into(), lease.into());
        control.insert("timeout".into(), "300ms".into());
        t.insert("control".into(), control.into());
        tune(t);
    });
    (config, cluster)
}

fn etcd() -> Arc<dyn ControlStore> {
    Arc::new(EtcdControl::connect(&[etcd_endpoint()], Duration::from_secs(5)).expect("etcd answers"))
}

/// Node 1 (the lowest id, so the checkpoint coordinator's node) killed with SIGKILL for good:
/// its lease ends, the node elected in its place moves its tasks to nodes 2 and 3 through a
/// fenced write to etcd, the coordinator moves with them, and `weir verify` finds every result
/// exact.
#[test]
fn the_coordinators_node_killed_for_good_has_its_tasks_moved_by_the_elected_node_and_weir_verify_passes() {
    const EVENTS: u64 = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let (config, cluster) = on_etcd(dir.path(), |t| {
        set(t, &["stream", "generator", "events"], EVENTS as i64);
        set(t, &["stream", "generator", "rate"], 100_000);
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["restart", "move_after"], "2s");
    });
    let log = |n: u32| dir.path().join(format!("node-{n}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &log(n), &[])).collect());
    line_in(&log(1), "checkpoint committed", Duration::from_secs(60));
    nodes.0[0].kill().unwrap(); // SIGKILL
    nodes.0[0].wait().unwrap();
    // Node 2 or 3 leads once node 1's lease has ended, and moves its tasks.
    let moved = line_in_any(&[&log(2), &log(3)], "moving the tasks of a lost node", Duration::from_secs(60));
    assert!(moved.contains("node 1 has been down for") && moved.contains("placement=1"), "{moved}");
    let said = verify_until_ended(&config, Duration::from_secs(120));
    assert!(said.contains("all 10000 window results match") && said.contains("from 2 nodes"), "{said}");
    // The placement is in etcd.
    let book = ControlBook::new(etcd(), Keys::new(&cluster));
    let stored = book.latest(StreamId(1)).unwrap().record.expect("a placement version in etcd");
    assert_eq!((stored.version, stored.moved.clone()), (1, vec![NodeId(1)]));
    assert!(stored.tasks.values().all(|n| *n != NodeId(1)), "{stored:?}");
    let store = weir_engine::backup::LocalDirStore::new(dir.path().join("remote"));
    // So are the checkpoint ids and the commit point: the key names the last commit, which is
    // the last `weir checkpoints list` shows when it reads etcd; the store holds no id record.
    let key = etcd().get(&Keys::new(&cluster).checkpoints(StreamId(1))).unwrap().expect("the checkpoints key");
    let text = String::from_utf8(key.value).unwrap();
    let listed: Vec<u64> =
        text.lines().filter_map(|l| l.strip_prefix("commit ")?.split(' ').next()?.parse().ok()).collect();
    let point = *listed.last().unwrap_or_else(|| panic!("no commit in {text}"));
    assert!(text.contains("next-id "), "{text}");
    assert!(store.get_at_most("1/coordinator/ids", 4096).is_err(), "an id record in the store");
    let remote = format!("file://{}", dir.path().join("remote").display());
    let out = weir()
        .args(["checkpoints", "list", "--json", "--remote", &remote, "--cluster", &cluster, "--etcd"])
        .arg(etcd_endpoint())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u64> = shown.as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert!(ids.iter().all(|i| listed.contains(i)) && ids.last() == Some(&point), "{shown:#}\n{text}");
    // Without etcd the store refuses to say (it would count records etcd does not list).
    let out = weir().args(["checkpoints", "list", "--remote", &remote]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&format!("--cluster {cluster}")), "{err}");
    // Status and metrics say who leads, the placement version and each node's lease.
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let leader = j["nodes"][1]["member"]["leader"].as_u64().expect("a leader known to node 2");
    assert!(leader == 2 || leader == 3, "{j:#}");
    for n in [1, 2] {
        let m = &j["nodes"][n]["member"];
        assert!(m["placement"] == 1 && m["lease_left_ms"].as_u64().unwrap() > 0, "{j:#}");
    }
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("etcd: node {leader} leads")) && text.contains("placement version 1"), "{text}");
    let metrics = scrape(&config, leader);
    for line in ["weir_cluster_elections_total 1", "weir_cluster_leader 1", "weir_cluster_placement_version 1"] {
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");
    }
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate().skip(1) {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
}

/// A three-member etcd: one member killed stops nothing (commits go on, no node stops); all
/// three killed, every node stops its stream within its lease and nothing commits; the members
/// back after 10 s, the nodes take leases again, restart from the last commit, and `weir
/// verify` finds every result exact.
#[test]
fn one_etcd_member_down_stops_nothing_and_all_of_etcd_down_pauses_the_stream_until_it_returns() {
    const EVENTS: u64 = 1_500_000;
    const STOPPED: &str = "stopped the stream: this node's lease in etcd may have ended";
    const COMMITTED: &str = "checkpoint committed";
    const WAITS: &str = "waiting to hold a lease in etcd before running the stream";
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(dir.path(), 3);
    let (config, _) = on(dir.path(), etcd.endpoints(), "4s", |t| {
        set(t, &["stream", "generator", "events"], EVENTS as i64);
        set(t, &["stream", "generator", "rate"], 100_000);
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let log = |n: u32| dir.path().join(format!("node-{n}.log"));
    let nodes = Nodes((1..=3).map(|n| start(&config, n, &log(n), &[])).collect());
    line_in(&log(1), COMMITTED, Duration::from_secs(60));
    // One member down for longer than a lease: nothing stops, commits go on.
    etcd.kill(0);
    let before = count_in(&log(1), COMMITTED);
    std::thread::sleep(Duration::from_secs(6));
    for n in 1..=3 {
        assert_eq!(count_in(&log(n), STOPPED), 0, "node {n} stopped with two of three etcd members up");
    }
    assert!(count_in(&log(1), COMMITTED) > before + 5, "commits stopped with one etcd member down");
    // All of etcd down: every node stops within its lease (plus a call's timeout). A node
    // whose stream failed first (a peer that stopped) waits for a lease instead of restarting.
    let fenced = |n: u32| count_in(&log(n), STOPPED) + count_in(&log(n), WAITS);
    let before: Vec<usize> = (1..=3).map(fenced).collect();
    etcd.kill(1);
    etcd.kill(2);
    let down = Instant::now();
    for n in 1..=3 {
        while fenced(n) == before[n as usize - 1] {
            assert!(down.elapsed() < Duration::from_secs(10), "node {n} still runs its stream without a lease");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(down.elapsed() < Duration::from_secs(6), "the nodes stopped {:?} after etcd went down", down.elapsed());
    let paused = count_in(&log(1), COMMITTED);
    std::thread::sleep(Duration::from_secs(10).saturating_sub(down.elapsed()));
    assert_eq!(count_in(&log(1), COMMITTED), paused, "a commit while no node held a lease");
    for i in 0..3 {
        etcd.start_member(i);
    }
    let said = verify_until_ended(&config, Duration::from_secs(180));
    assert!(said.contains("window results match") && said.contains("from 3 nodes"), "{said}");
    assert!(count_in(&log(1), COMMITTED) > paused, "no commit after etcd came back");
    drop(nodes);
}

/// Nodes 1 (the checkpoint coordinator's) and 2 paused with SIGSTOP for longer than their
/// lease: node 3 is elected and moves every task to itself; resumed, nodes 1 and 2 find their
/// lease gone, stop what they ran without acting on it, and rejoin idle; `weir verify` finds
/// every result exact.
#[test]
fn two_nodes_paused_with_sigstop_longer_than_their_lease_rejoin_idle_and_weir_verify_passes() {
    const EVENTS: u64 = 600_000;
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = on_etcd(dir.path(), |t| {
        set(t, &["stream", "generator", "events"], EVENTS as i64);
        set(t, &["stream", "generator", "rate"], 100_000);
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["restart", "move_after"], "2s");
    });
    let log = |n: u32| dir.path().join(format!("node-{n}.log"));
    let nodes = Nodes((1..=3).map(|n| start(&config, n, &log(n), &[])).collect());
    line_in(&log(1), "checkpoint committed", Duration::from_secs(60));
    signal(&nodes.0[0], "-STOP");
    signal(&nodes.0[1], "-STOP");
    let moved = line_in(&log(3), "moving the tasks of a lost node", Duration::from_secs(60));
    assert!(moved.contains("node 1 has been down") && moved.contains("node 2 has been down"), "{moved}");
    std::thread::sleep(Duration::from_secs(1));
    signal(&nodes.0[0], "-CONT");
    signal(&nodes.0[1], "-CONT");
    for n in [1, 2] {
        line_in(&log(n), "stopped the stream: this node's lease in etcd may have ended", Duration::from_secs(30));
        line_in(&log(n), "node idle", Duration::from_secs(30));
    }
    let said = verify_until_ended(&config, Duration::from_secs(120));
    assert!(said.contains("window results match") && said.contains("from 1 node"), "{said}");
    drop(nodes);
}

/// One copy of each ingest log (`replicas = 1`) and node 3 killed for good: its partition's log
/// is on no other node, so nothing moves (a source started elsewhere would find none of its
/// rows); the elected node says why, and the stream waits for node 3, which rejoins when it
/// comes back.
#[test]
fn a_lost_node_with_the_only_copy_of_a_partition_has_nothing_moved_and_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = on_example("load-three-node.toml", dir.path(), vec![etcd_endpoint()], "2s", |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "ingest", "replicas"], 1i64);
        set(t, &["restart", "move_after"], "2s");
    });
    let log = |n: u32| dir.path().join(format!("node-{n}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start(&config, n, &log(n), &[])).collect());
    line_in(&log(1), "checkpoint committed", Duration::from_secs(60));
    nodes.0[2].kill().unwrap(); // SIGKILL
    nodes.0[2].wait().unwrap();
    let why = line_in_any(&[&log(1), &log(2)], "has no other copy known to hold all its rows", Duration::from_secs(30));
    assert!(why.contains("partition 2's ingest log is only on node 3") && why.contains("waits for the node"), "{why}");
    std::thread::sleep(Duration::from_secs(2));
    for n in [1, 2] {
        assert_eq!(count_in(&log(n), "moving the tasks of a lost node"), 0, "node {n} moved tasks");
    }
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["nodes"][0]["member"]["placement"], 0, "{j:#}");
    // Node 3 back: the stream runs on all three again and commits.
    nodes.0[2] = start(&config, 3, &log(30), &[]);
    line_in(&log(30), "node started", Duration::from_secs(30));
    let before = count_in(&log(1), "checkpoint committed");
    let t0 = Instant::now();
    while count_in(&log(1), "checkpoint committed") < before + 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no commit after node 3 came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}
