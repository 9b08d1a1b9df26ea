//! Several streams on one `weir node`, as a user runs them: `weir stream create`, `list`,
//! `show` and `drop` against a running node whose config file's stream keeps committing.

mod util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::created::{commits_after, committed, results_match};
use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::WindowSpec;
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

/// `weir stream ARGS --config CONFIG`: exit code, stdout, stderr.
fn stream(config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = weir().arg("stream").args(args).arg("--config").arg(config).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The catalog as `weir stream list --json` prints it: (name, id, from the cluster file).
fn listed(config: &Path) -> Vec<(String, u64, bool)> {
    let (code, out, err) = stream(config, &["list", "--json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap().to_string();
            (name, s["id"].as_u64().unwrap(), s["from_cluster_file"].as_bool().unwrap())
        })
        .collect()
}

/// A bounded generator stream file named `meters`, and the stream it describes at `id`.
fn meters(dir: &Path, id: u64) -> (PathBuf, StreamSpec) {
    let path = dir.join("meters.toml");
    let text = "[stream]\nname = \"meters\"\npartitions = 3\naggs = 3\nsinks = 1\nwindow = \"1s\"\n\
                [stream.generator]\nseed = 7\nkeys = 1000\nrows_per_ms = 10\nevents = 60000\nrate = 100000\n";
    std::fs::write(&path, text).unwrap();
    let mut spec = StreamSpec::generator(StreamId(id), 3, 3, 1);
    spec.window = WindowSpec::tumbling(1000);
    spec.source = SourceKind::Generator {
        spec: GeneratorSpec { seed: 7, keys: 1000, rows_per_ms: 10, ..GeneratorSpec::default() },
        limit: Some(60_000),
        rate: Some(100_000),
    };
    (path, spec)
}

#[test]
fn a_stream_created_beside_the_files_runs_exactly_and_its_drop_leaves_the_other_committing() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "generator", "rate"], 200_000);
        // A dropped stream leaves the catalog as soon as its data is gone.
        t.insert("drop_grace".into(), "0s".into());
    });
    let mut node = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut node.0[0]);
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    // The config file's stream seeded the catalog.
    assert_eq!(listed(&config), [("bench".to_string(), 1, true)]);

    let (file, spec) = meters(dir.path(), 2);
    let (code, out, err) = stream(&config, &["create", "--file", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("stream meters (id 2) created and running"), "{out}");
    let (code, _, err) = stream(&config, &["create", "--file", file.to_str().unwrap()]);
    assert_eq!(code, Some(2), "a taken name is refused: {err}");
    assert!(err.contains("already exists"), "{err}");
    let (code, out, _) = stream(&config, &["show", "meters", "--json"]);
    assert_eq!(code, Some(0));
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert!(shown["streams"][0]["spec"].as_str().unwrap().contains("events = 60000"), "{out}");

    // The created stream runs to its end beside the file's, its results exactly the reference's.
    line_with(&rx, "stream=meters", Duration::from_secs(10));
    let meters_dir = dir.path().join("data/node-1/streams/2");
    assert!(meters_dir.join("tasks").is_dir(), "a created stream keeps its data under streams/<id>");
    let want = results_match(&config, "meters", &spec);
    assert!(committed(dir.path(), 2).is_some(), "the created stream committed checkpoints of its own");
    // The client commands take the stream's name: status shows that stream alone, and verify
    // checks it against its own spec.
    let out = weir().args(["status", "--json", "--stream", "meters", "--config"]).arg(&config).output().unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = &status["nodes"][0];
    assert_eq!(shown["stream"]["name"], "meters", "{status}");
    assert!(shown["tasks"].as_array().unwrap().iter().all(|t| t["stream"] == 2), "{status}");
    let out = weir().args(["verify", "--all", "--stream", "meters", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&format!("all {} window results match", want.len())), "{said}");
    // An id the catalog does not list is refused.
    let out = weir().args(["status", "--stream", "9", "--config"]).arg(&config).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no stream 9 in the catalog"), "{err}");
    // Without --stream, status opens with a line per stream of the catalog.
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<(String, String, String)> = status["catalog"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].to_string(), s["state"].to_string(), s["nodes"][0]["doing"].to_string()))
        .collect();
    let line = |n: &str| (format!("\"{n}\""), "\"running\"".to_string(), "\"runs\"".to_string());
    assert_eq!(lines, [line("bench"), line("meters")], "{status:#}");
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("meters") && l.contains("node 1 runs e")), "{text}");
    // Each stream has metrics of its own, labelled with its id.
    let metrics = scrape(&config, 1);
    for (id, name) in [(1, "bench"), (2, "meters")] {
        let info = format!("weir_stream_info{{stream=\"{id}\",name=\"{name}\"}} 1");
        assert!(metrics.lines().any(|l| l == info), "{metrics}");
        let read = format!("weir_source_rows_total{{stream=\"{id}\"}} ");
        let rows = metrics.lines().find_map(|l| l.strip_prefix(&read)?.parse::<f64>().ok());
        assert!(rows.is_some_and(|r| r > 0.0), "stream {id}'s sources read rows: {metrics}");
    }

    // Dropped: answered once its tasks have stopped and its data here is gone; the file's
    // stream commits on.
    let (code, out, err) = stream(&config, &["drop", "meters"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!meters_dir.exists(), "the dropped stream's data is gone");
    let metrics = scrape(&config, 1);
    assert!(!metrics.contains("stream=\"2\"") && metrics.contains("stream=\"1\""), "{metrics}");
    // No grace: the entry goes once the purge (on a thread of its own) is done.
    let t0 = Instant::now();
    while listed(&config) != [("bench".to_string(), 1, true)] {
        assert!(t0.elapsed() < Duration::from_secs(20), "the dropped stream stayed in the catalog");
        std::thread::sleep(Duration::from_millis(50));
    }
    commits_after(dir.path(), 1, committed(dir.path(), 1), Duration::from_secs(10));
    let (code, _, err) = stream(&config, &["drop", "meters"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no stream named meters"), "{err}");

    // The name again is a new stream; the catalog outlives the node.
    let (code, out, err) = stream(&config, &["create", "--file", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("(id 3)"), "{out}");
    signal(&node.0[0], "-TERM");
    assert!(exit_within(&mut node.0[0], Duration::from_secs(20), "the node after SIGTERM").success());
    let mut again = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut again.0[0]);
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    let names: Vec<(String, u64, bool)> = listed(&config);
    assert_eq!(names, [("bench".to_string(), 1, true), ("meters".to_string(), 3, false)]);
    // Dropping the file's stream keeps it dropped across a restart.
    let (code, out, err) = stream(&config, &["drop", "bench"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!dir.path().join("data/node-1/tasks").exists(), "the file stream's tasks are gone");
    signal(&again.0[0], "-TERM");
    assert!(exit_within(&mut again.0[0], Duration::from_secs(20), "the node after SIGTERM").success());
    let mut third = Nodes(vec![spawn_piped(&config)]);
    let _rx = lines_of(&mut third.0[0]);
    let t0 = Instant::now();
    let names = loop {
        let (code, out, _) = stream(&config, &["list", "--json"]);
        if code == Some(0) {
            break out;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the node did not answer");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!names.contains("bench") && names.contains("meters"), "{names}");
    signal(&third.0[0], "-TERM");
    assert!(exit_within(&mut third.0[0], Duration::from_secs(20), "the node after SIGTERM").success());

    // A lost catalog is not replaced by a new one: the node refuses to start, and every
    // stream's data stays.
    std::fs::remove_file(dir.path().join("data/node-1/catalog")).unwrap();
    let out = weir().args(["node", "--config"]).arg(&config).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("it is gone, but this node has seen one"), "{err}");
    assert!(dir.path().join("data/node-1/streams/3").is_dir(), "the created stream's data stays");
}

#[test]
fn a_stream_created_on_one_node_of_three_runs_on_every_node_and_its_drop_reaches_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["stream", "generator", "rate"], 100_000);
        t.insert("drop_grace".into(), "8s".into());
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let _nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let log_refs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    line_in_any(&log_refs, "checkpoint committed", Duration::from_secs(60));
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = |n: usize| file["nodes"][n - 1]["addr"].as_str().unwrap().to_string();

    // Created through node 2: etcd's catalog has it, and every node runs its share.
    let (path, spec) = meters(dir.path(), 2);
    let (code, out, err) = stream(&config, &["create", "--file", path.to_str().unwrap(), "--node", &addr(2)]);
    assert_eq!(code, Some(0), "{out}{err}");
    let data = |n: u32| dir.path().join(format!("data/node-{n}/streams/2"));
    let t0 = Instant::now();
    // A node records the incarnation of each run of the stream it starts.
    while !(1..=3).all(|n| data(n).join("incarnation").is_file()) {
        if t0.elapsed() > Duration::from_secs(20) {
            let said: Vec<String> = logs
                .iter()
                .map(|l| std::fs::read_to_string(l).unwrap_or_default())
                .flat_map(|t| {
                    t.lines()
                        .filter(|l| l.contains("meters") || l.contains("catalog"))
                        .map(String::from)
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!("not every node runs the created stream:\n{}", said.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    results_match(&config, "meters", &spec);

    // Its checkpoints in the store and its keys in etcd.
    let store = weir_engine::backup::LocalDirStore::new(dir.path().join("remote"));
    let objects = || weir_engine::backup::Store::list(&store, "2/").unwrap().len();
    let etcd = weir_engine::control::EtcdControl::connect(&[etcd_endpoint()], Duration::from_secs(5)).unwrap();
    let cluster = file["cluster"].as_str().unwrap();
    let keys_of = |s: u64| {
        let prefix = weir_engine::cluster::Keys::new(cluster).stream_prefix(StreamId(s));
        weir_engine::control::ControlStore::list(&etcd, &prefix, 100).unwrap().len()
    };
    assert!(objects() > 0 && keys_of(2) > 0, "the created stream checkpoints with its own keys");

    // Dropped through node 3: its data goes on every node at once, its checkpoints and keys
    // after the grace period; the file's stream commits on.
    let dropped = Instant::now();
    let (code, out, err) = stream(&config, &["drop", "meters", "--node", &addr(3)]);
    assert_eq!(code, Some(0), "{out}{err}");
    let t0 = Instant::now();
    while (1..=3).any(|n| data(n).exists()) {
        assert!(t0.elapsed() < Duration::from_secs(20), "a node kept the dropped stream's data");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, out, _) = stream(&config, &["list", "--node", &addr(1)]);
    assert_eq!(code, Some(0));
    // Within the grace period (8 s from before the drop was asked), the entry and the
    // checkpoints stay.
    let (listed_meters, stored) = (out.lines().any(|l| l.starts_with("meters") && l.contains("dropping")), objects());
    if dropped.elapsed() < Duration::from_secs(7) {
        assert!(listed_meters, "{out}");
        assert!(stored > 0, "the checkpoints stay for the grace period");
    }
    loop {
        let (code, out, err) = stream(&config, &["list", "--node", &addr(1)]);
        assert_eq!(code, Some(0), "{out}{err}");
        if !out.contains("meters") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(40), "the dropped stream stayed in the catalog");
        std::thread::sleep(Duration::from_millis(100));
    }
    // (The drop's time is the node's wall clock, in ms.)
    assert!(dropped.elapsed() >= Duration::from_millis(7_990), "the entry went before the grace period was over");
    // Gone once the purge is done (a run that wound down after it has its uploads purged too).
    while objects() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(40), "the dropped stream's checkpoints stay in the store");
        std::thread::sleep(Duration::from_millis(100));
    }
    while keys_of(2) > 0 {
        assert!(t0.elapsed() < Duration::from_secs(40), "the dropped stream's keys stay in etcd");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(keys_of(1) > 0, "the file's stream keeps its keys");
    commits_after(dir.path(), 1, committed(dir.path(), 1), Duration::from_secs(20));
}

#[test]
fn a_generator_stream_dropped_while_a_load_feeds_the_ingest_stream_leaves_it_exact_and_unstopped() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        t.insert("drop_grace".into(), "3s".into());
    });
    let logs: Vec<PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let _nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    let log_refs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    line_in_any(&log_refs, "checkpoint committed", Duration::from_secs(60));
    // An unbounded generator stream beside the file's ingest stream (id 2): it takes id 3.
    let generator = dir.path().join("gen.toml");
    std::fs::write(
        &generator,
        "[stream]\nname = \"gen\"\npartitions = 3\naggs = 3\nsinks = 3\nwindow = \"1s\"\n\
         [stream.generator]\nkeys = 1000\nrows_per_ms = 10\nrate = 20000\n",
    )
    .unwrap();
    let (code, out, err) = stream(&config, &["create", "--file", generator.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("stream gen (id 3) created and running"), "{out}");
    commits_after(dir.path(), 3, None, Duration::from_secs(30));

    // The load runs 10 s; the generator stream is dropped 3 s in.
    let args = ["--events", "450k", "--rate", "45k", "--rows-per-ms", "100", "--keys", "1000", "--timeout", "60s"];
    let loading = util::load::load(&config, &args);
    std::thread::sleep(Duration::from_secs(3));
    let (code, out, err) = stream(&config, &["drop", "gen"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let data = |n: u32| dir.path().join(format!("data/node-{n}/streams/3"));
    let store = weir_engine::backup::LocalDirStore::new(dir.path().join("remote"));
    let objects = |prefix: &str| weir_engine::backup::Store::list(&store, prefix).unwrap().len();
    let t0 = Instant::now();
    while (1..=3).any(|n| data(n).exists()) || objects("3/") > 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the dropped stream's data or checkpoints stayed");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The ingest stream never stopped: every event acknowledged once, exact results, and no
    // node restarted it.
    let (code, s, err) = util::load::summary_of(loading, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    util::load::assert_acknowledged(&s, 3, 150_000);
    util::load::wait_for_results(&config, util::load::expected(&s, 3, 150_000).len(), &logs[0]);
    let (code, text) = util::load::verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("(per partition: 150000, 150000, 150000), from 3 nodes"), "{text}");
    assert!(objects("2/") > 0, "the ingest stream keeps its checkpoints");
    let out = weir().args(["status", "--json", "--stream", "2", "--config"]).arg(&config).output().unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    for n in status["nodes"].as_array().unwrap() {
        assert_eq!(failures(n), 0, "the drop restarted the other stream: {n:#}");
    }
    commits_after(dir.path(), 2, committed(dir.path(), 2), Duration::from_secs(20));
}
