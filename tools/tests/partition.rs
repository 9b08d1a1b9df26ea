//! Network partitions of a cluster on etcd: each `weir node` in a network namespace of its own
//! (root and iproute2 needed), the three etcd members and the clients on the bridge between
//! them.

mod util;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use util::etcd::Etcd;
use util::load::*;
use util::netns::Net;
use util::*;

fn start_in(net: &Net, config: &Path, id: u32, log: &Path) -> Child {
    net.command(id, Path::new(env!("CARGO_BIN_EXE_weir")))
        .args(["node", "--config"])
        .arg(config)
        .args(["--node-id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The load example for `count` nodes of `net` (two copies of each partition's log, a copy late
/// by 2 s written out of its in-sync set, moves after 2 s), on `etcd` with leases of 2 s.
fn netns_config(dir: &Path, net: &Net, etcd: &Etcd, count: u32) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    adjusted(example("load-three-node.toml"), dir, |t| {
        let nodes = t["nodes"].as_array_mut().unwrap();
        while nodes.len() < count as usize {
            let mut node = nodes[0].as_table().unwrap().clone();
            node.insert("id".into(), (nodes.len() as i64 + 1).into());
            nodes.push(node.into());
        }
        set(t, &["stream", "partitions"], i64::from(count));
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "ingest", "replicas"], 2i64);
        set(t, &["stream", "ingest", "in_sync_lag"], "2s");
        set(t, &["restart", "move_after"], "2s");
        t.insert("cluster".into(), format!("partition-{nanos}").into());
        for (i, node) in t["nodes"].as_array_mut().unwrap().iter_mut().enumerate() {
            let node = node.as_table_mut().unwrap();
            node.insert("addr".into(), format!("{}:7100", net.addr(i as u32 + 1)).into());
            node.insert("metrics".into(), format!("{}:9100", net.addr(i as u32 + 1)).into());
        }
        let mut control = toml::Table::new();
        control.insert("etcd".into(), toml::Value::Array(etcd.endpoints().into_iter().map(Into::into).collect()));
        control.insert("lease".into(), "2s".into());
        control.insert("timeout".into(), "300ms".into());
        t.insert("control".into(), control.into());
    })
}

/// Three nodes in namespaces of their own on a three-member etcd, taking a load of 900,000 rows
/// (still running) once they commit.
struct Loaded {
    dir: tempfile::TempDir,
    net: Net,
    etcd: Etcd,
    config: std::path::PathBuf,
    logs: Vec<std::path::PathBuf>,
    nodes: Nodes,
    child: Child,
}

fn under_load() -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let net = Net::new(&[1, 2, 3]);
    let etcd = Etcd::start_on(dir.path(), 3, &net.host());
    let config = netns_config(dir.path(), &net, &etcd, 3);
    let logs: Vec<std::path::PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let nodes = Nodes((1..=3).map(|n| start_in(&net, &config, n, &logs[n as usize - 1])).collect());
    let args = ["--events", "900k", "--rate", "150k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "90s"];
    let child = load(&config, &args);
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    Loaded { dir, net, etcd, config, logs, nodes, child }
}

/// The load of 900,000 rows ends, every acknowledged row is in the results exactly once, and
/// `weir stop` stops the three nodes.
fn load_ends_exact(child: Child, config: &Path, logs: &[std::path::PathBuf], nodes: &mut Nodes) {
    let (code, s, err) = summary_of(child, Duration::from_secs(150));
    let logs_text =
        || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text());
    assert_acknowledged(&s, 3, 300_000);
    let want = expected(&s, 3, 300_000);
    wait_for_results(config, want.len(), &logs[0]);
    let (code, text) = verify_ingest(config);
    assert_eq!(code, Some(0), "{text}\n{}", logs_text());
    assert!(text.contains("match the 900000 rows of 1 load(s)"), "{text}");
    let out = weir().args(["stop", "--config"]).arg(config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, c) in nodes.0.iter_mut().enumerate() {
        assert!(exit_within(c, Duration::from_secs(30), &format!("node {}", i + 1)).success());
    }
}

/// During a load into partitions kept on two nodes, node 3 is cut off from nodes 1 and 2 and
/// from every etcd member: it stops its stream (and acknowledges nothing) within its lease,
/// the majority's elected node moves its tasks to nodes 1 and 2, the load goes on there, and
/// after the heal node 3 rejoins idle. Every acknowledged row is in the results exactly once.
#[test]
fn a_node_cut_off_from_the_others_and_from_etcd_mid_load_loses_no_acknowledged_row() {
    let Loaded { dir: _dir, net, etcd, config, logs, mut nodes, child } = under_load();
    net.cut(3);
    let cut = Instant::now();
    line_in(&logs[2], "stopped the stream: this node's lease in etcd may have ended", Duration::from_secs(10));
    assert!(cut.elapsed() < Duration::from_secs(4), "node 3 stopped {:?} after the cut", cut.elapsed());
    let moved = line_in_any(&[&logs[0], &logs[1]], "moving the tasks of a lost node", Duration::from_secs(60));
    assert!(moved.contains("node 3 has been down"), "{moved}");
    std::thread::sleep(Duration::from_secs(2));
    net.heal(3);
    line_in(&logs[2], "node idle", Duration::from_secs(30));
    load_ends_exact(child, &config, &logs, &mut nodes);
    drop(etcd);
}

/// During a load into partitions kept on two nodes, node 3 is cut off from nodes 1 and 2 but
/// not from etcd: it holds its lease, so only it can tell it is the one cut off (it is alone on
/// its side of the split; each of the others has the other). Its probes fail at once, and after
/// `move_after` (at least the lease and a third: 2.7 s here) it gives up its membership and stops
/// its stream, the elected node moves its tasks, the load goes on, and after the heal node 3
/// takes a membership again and rejoins idle. Every acknowledged row is in the results exactly
/// once.
#[test]
fn a_node_cut_off_from_the_others_but_not_from_etcd_gives_up_its_membership_and_its_tasks_move() {
    let Loaded { dir: _dir, net, etcd, config, logs, mut nodes, child } = under_load();
    net.cut_peers(3);
    let cut = Instant::now();
    let gave_up = line_in(&logs[2], "gives up its membership, so that its tasks move", Duration::from_secs(30));
    assert!(gave_up.contains("unreachable=1,2") || gave_up.contains("unreachable=2,1"), "{gave_up}");
    assert!(cut.elapsed() < Duration::from_secs(8), "node 3 gave up {:?} after the cut", cut.elapsed());
    let moved = line_in_any(&[&logs[0], &logs[1]], "moving the tasks of a lost node", Duration::from_secs(60));
    assert!(moved.contains("node 3 has been down"), "{moved}");
    for l in &logs[..2] {
        let text = std::fs::read_to_string(l).unwrap();
        assert!(!text.contains("gives up its membership"), "a node on the majority's side gave up:\n{text}");
    }
    // Status says so, from node 3's own answer.
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let member = &j["nodes"][2]["member"];
    assert_eq!(member["withheld"], true, "{j:#}");
    assert_eq!(member["unreachable"], serde_json::json!([1, 2]), "{j:#}");
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("node 3 gave up its membership") && text.contains("no transport port of node 1, 2"),
        "{text}"
    );
    std::thread::sleep(Duration::from_secs(2));
    net.heal_peers(3);
    line_in(&logs[2], "reaches the other members again", Duration::from_secs(30));
    line_in(&logs[2], "node idle", Duration::from_secs(30));
    load_ends_exact(child, &config, &logs, &mut nodes);
    drop(etcd);
}

/// Four nodes, each the source of one partition with its copy on the next node (node 4's on
/// node 1), split 2|2 during a load, every node still reaching etcd: of an even split the side
/// of the lowest node stays, so nodes 3 and 4 give up their memberships and nodes 1 and 2 do
/// not. Partition 2 has both copies on the side that gave up, so the elected node moves nothing
/// (a stream runs whole or not at all) and the stream waits for its nodes. After the heal nodes 3
/// and 4 take memberships again and rejoin, the load ends, and every acknowledged row is in the
/// results exactly once.
#[test]
fn an_even_split_of_four_nodes_keeps_the_side_of_the_lowest_node_and_loses_no_acknowledged_row() {
    const EVENTS: u64 = 1_200_000;
    let dir = tempfile::tempdir().unwrap();
    let net = Net::new(&[1, 2, 3, 4]);
    let etcd = Etcd::start_on(dir.path(), 3, &net.host());
    let config = netns_config(dir.path(), &net, &etcd, 4);
    let logs: Vec<std::path::PathBuf> = (1..=4).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let nodes = Nodes((1..=4).map(|n| start_in(&net, &config, n, &logs[n as usize - 1])).collect());
    let events = EVENTS.to_string();
    let args = ["--events", &events, "--rate", "150k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "120s"];
    for l in &logs {
        line_in(l, "node started", Duration::from_secs(30));
    }
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(30));
    let child = load(&config, &args);
    std::thread::sleep(Duration::from_millis(1500));
    net.split(&[1, 2], &[3, 4]);
    for l in &logs[2..] {
        line_in(l, "gives up its membership, so that its tasks move", Duration::from_secs(30));
    }
    // The elected node decides: nothing moves while a partition has both copies on the side
    // that gave up (or whatever a node slow to start on a busy machine left in the placement).
    let t0 = Instant::now();
    let decided = || {
        logs[..2].iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).any(|t| {
            t.lines().any(|l| l.contains("nothing moves; the stream waits") && l.contains("reason=partition "))
                || t.lines().any(|l| l.contains("moving the tasks of a lost node"))
        })
    };
    while !decided() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the elected node decided nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    for l in &logs[..2] {
        let text = std::fs::read_to_string(l).unwrap();
        assert!(!text.contains("gives up its membership"), "a node of the lowest node's side gave up:\n{text}");
    }
    net.heal_split(&[1, 2], &[3, 4]);
    for l in &logs[2..] {
        line_in(l, "reaches the other members again", Duration::from_secs(30));
    }
    let (code, s, err) = summary_of(child, Duration::from_secs(150));
    let logs_text =
        || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text());
    assert_acknowledged(&s, 4, EVENTS / 4);
    let want = expected(&s, 4, EVENTS / 4);
    wait_for_results(&config, want.len(), &logs[0]);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}\n{}", logs_text());
    assert!(text.contains(&format!("match the {EVENTS} rows of 1 load(s)")), "{text}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(nodes);
    drop(etcd);
}

/// A soak behind `WEIR_PARTITION_SOAK=N`: during a load into partitions kept on two nodes, N
/// faults of random nodes (the coordinator's included), one at a time, each once the cluster
/// has committed again after the last: SIGKILL and a start again after up to 3 s, SIGSTOP for up
/// to 4 s, or a cut from everything for up to 4 s. Every acknowledged row is in the results
/// exactly once. About 15 s a fault.
#[test]
fn soak_random_kills_pauses_and_cuts_lose_no_acknowledged_row() {
    let Some(faults) = std::env::var("WEIR_PARTITION_SOAK").ok().and_then(|v| v.parse::<u64>().ok()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let net = Net::new(&[1, 2, 3]);
    let etcd = Etcd::start_on(dir.path(), 3, &net.host());
    let config = netns_config(dir.path(), &net, &etcd, 3);
    let log = |n: u32, round: u64| dir.path().join(format!("node-{n}-{round}.log"));
    let mut nodes = Nodes((1..=3).map(|n| start_in(&net, &config, n, &log(n, 0))).collect());
    let per = 20_000 * (15 * faults + 10);
    let (events, timeout) = ((3 * per).to_string(), format!("{}s", 30 * faults + 90));
    let args = ["--events", &events, "--rate", "60k", "--rows-per-ms", "20", "--keys", "1000", "--timeout", &timeout];
    let child = load(&config, &args);
    let commits = || -> usize {
        let logs = std::fs::read_dir(dir.path()).unwrap().filter_map(Result::ok).map(|e| e.path());
        logs.filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("node-")))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default().matches("checkpoint committed").count())
            .sum()
    };
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut seen = 0;
    let mut done = Vec::new();
    for round in 1..=faults {
        // The cluster has recovered from the last fault: it commits again.
        let t0 = Instant::now();
        while commits() < seen + 3 {
            assert!(t0.elapsed() < Duration::from_secs(120), "no commit within 120 s after faults {done:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(next() % 2000));
        let victim = (next() % 3) as usize;
        let node = victim as u32 + 1;
        let pause = Duration::from_millis(1000 + next() % 3000);
        match next() % 3 {
            0 => {
                nodes.0[victim].kill().unwrap();
                nodes.0[victim].wait().unwrap();
                std::thread::sleep(pause.min(Duration::from_secs(3)));
                nodes.0[victim] = start_in(&net, &config, node, &log(node, round));
                done.push(format!("kill {node}"));
            }
            1 => {
                signal(&nodes.0[victim], "-STOP");
                std::thread::sleep(pause);
                signal(&nodes.0[victim], "-CONT");
                done.push(format!("pause {node} {pause:?}"));
            }
            _ => {
                net.cut(node);
                std::thread::sleep(pause);
                net.heal(node);
                done.push(format!("cut {node} {pause:?}"));
            }
        }
        seen = commits();
    }
    let (code, s, err) = summary_of(child, Duration::from_secs(30 * faults + 150));
    assert_eq!(code, Some(0), "after {done:?}: {s:#} {err}");
    assert_acknowledged(&s, 3, per);
    let want = expected(&s, 3, per);
    let first = log(1, 0);
    wait_for_results(&config, want.len(), &first);
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "after {done:?}: {text}");
    assert!(text.contains(&format!("match the {events} rows of 1 load(s)")), "{text}");
    drop(nodes);
    drop(etcd);
}
