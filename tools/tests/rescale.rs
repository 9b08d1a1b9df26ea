//! `weir stream rescale` of a running stream on a real `weir node`: from 2 aggs to 5 and back to
//! 1 while its generator runs, or while `weir load` feeds it, its results those of a run that
//! never rescaled.

mod util;

use std::path::Path;
use std::time::Duration;

use util::created::results_match;
use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::WindowSpec;
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

/// `weir stream ARGS --config CONFIG`: exit code, and what it printed.
fn stream(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = weir().arg("stream").args(args).arg("--config").arg(config).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// One `weir node` taking replay snapshots (as it does by default: only a pause's savepoint
/// writes every window), with stream `name` created from `text`: its config, log and process.
fn node_with(dir: &Path, name: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf, Nodes) {
    let config = util::load::load_one_node_with(dir, "replay");
    let log = dir.join("node.log");
    let node = Nodes(vec![start(&config, 1, &log, &[])]);
    line_in(&log, "checkpoint committed", Duration::from_secs(60));
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    let (code, said) = stream(&config, &["create", "--file", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    (config, log, node)
}

/// A stream file `meters` of about 10 s of rows at 40,000 a second (hopping windows: several
/// open per key at each savepoint) from generator seed `seed`: its text, and the stream.
fn meters_text(seed: u64) -> String {
    format!(
        "[stream]\nname = \"meters\"\npartitions = 2\naggs = 2\nsinks = 1\nwindow = \"2s\"\nslide = \"500ms\"\n\
         [stream.generator]\nseed = {seed}\nkeys = 2000\nrows_per_ms = 20\nevents = 200000\nrate = 20000\n"
    )
}

/// The stream of [`meters_text`] (aggs and sinks do not change its results).
fn meters(seed: u64) -> StreamSpec {
    let mut spec = StreamSpec::generator(StreamId(2), 2, 2, 1);
    spec.window = WindowSpec::hopping(2000, 500);
    spec.source = SourceKind::Generator {
        spec: GeneratorSpec { seed, keys: 2000, rows_per_ms: 20, ..GeneratorSpec::default() },
        limit: Some(200_000),
        rate: Some(20_000),
    };
    spec
}

#[test]
fn a_running_stream_rescaled_from_two_aggs_to_five_and_back_to_one_gives_exact_results() {
    let dir = tempfile::tempdir().unwrap();
    let text = meters_text(11);
    let (config, log, _node) = node_with(dir.path(), "meters", &text);
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "meters", "--aggs", "5"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("rescaled to 5 aggs") && said.contains("running at generator 2p/5a/1s"), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "meters", "--aggs", "1"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("2p/1a/1s"), "{said}");
    // A paused stream stays paused, and a sink rescale is refused with the reason.
    let (code, said) = stream(&config, &["rescale", "meters", "--aggs", "2", "--sinks", "3"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("a rescale of the sinks is not built"), "{said}");
    let (code, said) = stream(&config, &["rescale", "ingest", "--aggs", "3"]);
    assert_eq!(code, Some(2), "the cluster file's stream: {said}");
    let spec = meters(11);
    let want = weir_engine::reference::bounded_results(&spec).unwrap().len();
    let t0 = std::time::Instant::now();
    while util::created::query(&config, "meters").len() != want {
        if t0.elapsed() > Duration::from_secs(60) {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> =
                text.lines().rev().filter(|l| !l.contains("checkpoint committed stream=s2")).take(60).collect();
            panic!("the rescaled stream did not finish; the node's log ends:\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    results_match(&config, "meters", &spec);
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_ingest_stream_rescaled_from_two_aggs_to_five_and_back_to_one_under_load_verifies() {
    use util::load::{assert_acknowledged, expected, load, summary_of};
    let dir = tempfile::tempdir().unwrap();
    let text = "[stream]\nname = \"feed\"\nsource = \"ingest\"\npartitions = 2\naggs = 2\nsinks = 1\nwindow = \"1s\"\n\
                [stream.ingest]\ngroup_commit = \"10ms\"\n";
    let (config, _log, _node) = node_with(dir.path(), "feed", text);
    let args = ["--stream", "feed", "--events", "400k", "--rate", "50k", "--rows-per-ms", "100", "--keys", "1000"];
    let loading = load(&config, &[&args[..], &["--timeout", "60s"]].concat());
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "feed", "--aggs", "5"]);
    assert_eq!(code, Some(0), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "feed", "--aggs", "1"]);
    assert_eq!(code, Some(0), "{said}");
    let (code, s, err) = summary_of(loading, Duration::from_secs(90));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 2, 200_000);
    // Every acknowledged event in the results once: as many results as the rows sent make, and
    // `weir verify` finds each the rows' own.
    let want = expected(&s, 2, 200_000).len();
    let t0 = std::time::Instant::now();
    while util::created::query(&config, "feed").len() != want {
        assert!(t0.elapsed() < Duration::from_secs(60), "not every result within 60 s");
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = weir().args(["verify", "--all", "--stream", "feed", "--config"]).arg(&config).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_ingest_stream_on_three_nodes_rescaled_from_two_aggs_to_five_and_back_to_one_under_load_verifies() {
    use util::load::{assert_acknowledged, expected, load, summary_of};
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-three-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let logs: Vec<std::path::PathBuf> = (1..=3).map(|n| dir.path().join(format!("node-{n}.log"))).collect();
    let _nodes = Nodes((1..=3).map(|n| start(&config, n, &logs[n as usize - 1], &[])).collect());
    line_in(&logs[0], "checkpoint committed", Duration::from_secs(60));
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = |n: usize| file["nodes"][n - 1]["addr"].as_str().unwrap().to_string();
    // A partition, a sink and (at first) an agg or none on each node.
    let text = "[stream]\nname = \"feed\"\nsource = \"ingest\"\npartitions = 3\naggs = 2\nsinks = 3\nwindow = \"1s\"\n\
                placement = \"spread\"\n[stream.ingest]\ngroup_commit = \"10ms\"\n";
    let path = dir.path().join("feed.toml");
    std::fs::write(&path, text).unwrap();
    let (code, said) = stream(&config, &["create", "--file", path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    let args = ["--stream", "feed", "--events", "600k", "--rate", "60k", "--rows-per-ms", "100", "--keys", "1000"];
    let loading = load(&config, &[&args[..], &["--timeout", "60s"]].concat());
    // Rescaled through node 2, then through node 3 (neither coordinates the stream).
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "feed", "--aggs", "5", "--node", &addr(2)]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("rescaled to 5 aggs") && said.contains("3p/5a/3s"), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["rescale", "feed", "--aggs", "1", "--node", &addr(3)]);
    assert_eq!(code, Some(0), "{said}");
    let (code, s, err) = summary_of(loading, Duration::from_secs(90));
    let logs_text = || logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect::<Vec<_>>();
    assert_eq!(code, Some(0), "{s:#} {err}\n{}", logs_text().join("\n"));
    assert_acknowledged(&s, 3, 200_000);
    let want = expected(&s, 3, 200_000).len();
    let t0 = std::time::Instant::now();
    while util::created::query(&config, "feed").len() != want {
        assert!(t0.elapsed() < Duration::from_secs(60), "not every result within 60 s\n{}", logs_text().join("\n"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = weir().args(["verify", "--all", "--stream", "feed", "--config"]).arg(&config).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("from 3 nodes"), "{said}");

    // A stream with no task on node 1, stopped through node 1: answered once its coordinator
    // has committed the savepoint, which node 1 cannot see being taken.
    let text = "[stream]\nname = \"tail\"\npartitions = 1\naggs = 1\nsinks = 1\nwindow = \"1s\"\n\
                placement = { \"0\" = 2, \"1\" = 3, \"2\" = 2 }\n[stream.generator]\nkeys = 100\nrows_per_ms = 1\nrate = 1000\n";
    let path = dir.path().join("tail.toml");
    std::fs::write(&path, text).unwrap();
    let (code, said) = stream(&config, &["create", "--file", path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, said) = stream(&config, &["stop", "tail", "--node", &addr(1)]);
    assert_eq!(code, Some(0), "{said}\n{}", logs_text().join("\n"));
    assert!(said.contains("stream tail") && said.contains("stopped at a savepoint"), "{said}");
    let (code, said) = stream(&config, &["rescale", "tail", "--aggs", "2", "--node", &addr(3)]);
    assert_eq!(code, Some(0), "a stopped stream rescales: {said}");
}

#[test]
fn a_created_stream_stopped_at_a_savepoint_restarts_at_other_parallelism_while_its_node_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let text = meters_text(12);
    let (config, _log, mut node) = node_with(dir.path(), "meters", &text);
    std::thread::sleep(Duration::from_secs(2));
    // `weir stop --stream` of a created stream stops it alone, at a savepoint.
    let out = weir().args(["stop", "--stream", "meters", "--config"]).arg(&config).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("stream meters stopped at a savepoint"), "{said}");
    assert!(node.0[0].try_wait().unwrap().is_none(), "the node went on running");
    let (code, said) = stream(&config, &["list"]);
    assert!(code == Some(0) && said.lines().any(|l| l.starts_with("meters") && l.contains("paused")), "{said}");
    // Stopped already: at its savepoint still.
    let (code, said) = stream(&config, &["stop", "meters"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("stopped at a savepoint"), "{said}");
    // Started again at other parallelism: a rescale of a stopped stream leaves it stopped.
    let (code, said) = stream(&config, &["rescale", "meters", "--aggs", "3"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("paused at generator 2p/3a/1s"), "{said}");
    let (code, said) = stream(&config, &["resume", "meters"]);
    assert_eq!(code, Some(0), "{said}");
    let spec = meters(12);
    results_match(&config, "meters", &spec);
}
