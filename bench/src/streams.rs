//! `weir-e2e streams [seconds]`: what a stream costs the others on one `weir node`, and how long
//! the catalog's commands take, measured on the `weir` binary (beside this one, or `WEIR_BIN`).
//!
//! One node (one unpinned worker per stream, checkpoints every second to a `file://` store)
//! runs the cluster file's stream `bench` (a generator at full speed: 2 partitions, 2 aggs,
//! 10,000 keys, 1 s windows). Its throughput (the sources' rows over `seconds`, after 3 s of
//! warm-up, from `weir status --json`) is measured alone, beside nine idle streams (ingest
//! streams nothing appends to) created one by one (the time from `weir stream create` to the
//! stream's first commit in the store), alone again once they are dropped, beside one more
//! generator stream at full speed, and alone once more; each figure beside others is compared
//! with the mean of the runs alone before and after it. The second stream is paused and resumed
//! three times: each command's time (answered once in effect) and the time from the resume to
//! its next commit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_engine::backup::LocalDirStore;
use weir_engine::backup::commit::last_commit;
use weir_engine::wire::{CheckpointId, StreamId};

use crate::recovery::weir_bin;

const SECRET: &str = "weir-e2e-streams-secret-0123456789";

/// The node's config file: one node on free ports, `bench` at full speed.
fn cluster_file(dir: &Path) -> PathBuf {
    let port = |_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let (addr, metrics) = (port(0), port(1));
    let text = format!(
        "cluster = \"e2e-streams\"\ncluster_secret = \"{SECRET}\"\ndata_dir = \"{data}\"\nworkers = 1\n\
         pin_workers = false\n\n[[nodes]]\nid = 1\naddr = \"127.0.0.1:{addr}\"\nmetrics = \"127.0.0.1:{metrics}\"\n\n\
         [stream]\nid = 1\nname = \"bench\"\npartitions = 2\naggs = 2\nsinks = 1\nwindow = \"1s\"\n\n\
         [stream.generator]\nkeys = 10000\nrows_per_ms = 1000\n\n\
         [checkpoint]\ninterval = \"1s\"\nremote = \"file://{remote}\"\n",
        data = dir.join("data").display(),
        remote = dir.join("remote").display(),
    );
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).expect("write the config");
    path
}

/// `weir ARGS --config CONFIG`, which must succeed; its time.
fn weir(config: &Path, args: &[&str]) -> Duration {
    let t0 = Instant::now();
    let out = Command::new(weir_bin()).args(args).arg("--config").arg(config).output().expect("run weir");
    assert!(
        out.status.success(),
        "weir {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    t0.elapsed()
}

/// Rows stream `name`'s sources have sent (`weir status --json --stream NAME`).
fn source_rows(config: &Path, name: &str) -> u64 {
    let out = Command::new(weir_bin())
        .args(["status", "--json", "--stream", name, "--config"])
        .arg(config)
        .output()
        .expect("run weir status");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("weir status --json");
    // The sources are the stream's first tasks, one per partition.
    let partitions = status["nodes"][0]["stream"]["partitions"].as_u64().expect("the stream's partitions");
    let tasks = status["nodes"][0]["tasks"].as_array().expect("tasks");
    tasks
        .iter()
        .filter(|t| t["task"].as_u64().is_some_and(|t| t < partitions))
        .filter_map(|t| t["rows_out"].as_u64())
        .sum()
}

/// Stream `name`'s rows per second over `seconds`, after 3 s of warm-up.
fn rate(config: &Path, name: &str, seconds: u64) -> f64 {
    std::thread::sleep(Duration::from_secs(3));
    let (r0, t0) = (source_rows(config, name), Instant::now());
    std::thread::sleep(Duration::from_secs(seconds));
    (source_rows(config, name) - r0) as f64 / t0.elapsed().as_secs_f64()
}

fn committed(store: &LocalDirStore, stream: u64) -> Option<CheckpointId> {
    last_commit(store, StreamId(stream)).ok().flatten().map(|r| r.id)
}

/// Waits (at most 60 s) for a commit of `stream` after `after`; the time it took.
fn next_commit(store: &LocalDirStore, stream: u64, after: Option<CheckpointId>) -> Duration {
    let t0 = Instant::now();
    while committed(store, stream) <= after {
        assert!(t0.elapsed() < Duration::from_secs(60), "stream {stream} committed nothing in 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.elapsed()
}

/// Creates stream `name` from `text`; its id (`stream NAME (id N) created and running`).
fn create(config: &Path, dir: &Path, name: &str, text: &str) -> u64 {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("write the stream file");
    let out = Command::new(weir_bin())
        .args(["stream", "create", "--file"])
        .arg(&file)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run weir stream create");
    let said = String::from_utf8_lossy(&out.stdout);
    said.split("(id ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("create {name}: {said}{}", String::from_utf8_lossy(&out.stderr)))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the measurements and prints them.
#[allow(clippy::print_stdout)]
pub fn streams(seconds: u64) {
    let dir = tempfile::Builder::new().prefix("weir-streams").tempdir_in("/var/tmp").expect("temp dir");
    let config = cluster_file(dir.path());
    let store = LocalDirStore::new(dir.path().join("remote"));
    let log = std::fs::File::create(dir.path().join("node.log")).expect("log");
    let _node = Node(
        Command::new(weir_bin())
            .args(["node", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (cargo build --release -p weir-tools)", weir_bin().display())),
    );
    next_commit(&store, 1, None);
    println!("one weir node, one unpinned worker per stream, checkpoints every 1 s to file://");
    println!("bench: generator at full speed, 2 partitions, 2 aggs, 10,000 keys, 1 s windows; {seconds} s each");
    // Each figure beside others against the mean of the runs alone just before and after it:
    // this machine's speed drifts by more than the differences measured.
    let alone = rate(&config, "bench", seconds);
    println!("bench alone                     {:>8.2} M rows/s", alone / 1e6);

    let mut created = Vec::new();
    for i in 1..=9 {
        let name = format!("idle{i}");
        let text = format!(
            "[stream]\nname = \"{name}\"\nsource = \"ingest\"\npartitions = 2\naggs = 2\nsinks = 1\nwindow = \"1s\"\n"
        );
        let t0 = Instant::now();
        let id = create(&config, dir.path(), &name, &text);
        next_commit(&store, id, None);
        created.push(t0.elapsed());
    }
    let beside_idle = rate(&config, "bench", seconds);
    for i in 1..=9 {
        weir(&config, &["stream", "drop", &format!("idle{i}")]);
    }
    let alone_2 = rate(&config, "bench", seconds);
    println!(
        "bench beside nine idle streams  {:>8.2} M rows/s ({:.0} % of alone before and after: {:.2} M rows/s)",
        beside_idle / 1e6,
        200.0 * beside_idle / (alone + alone_2),
        alone_2 / 1e6
    );

    let busy = "[stream]\nname = \"busy\"\npartitions = 2\naggs = 2\nsinks = 1\nwindow = \"1s\"\n\
                [stream.generator]\nseed = 9\nkeys = 10000\nrows_per_ms = 1000\n";
    let busy_id = create(&config, dir.path(), "busy", busy);
    next_commit(&store, busy_id, None);
    let (t0, b0) = (Instant::now(), source_rows(&config, "busy"));
    let beside_busy = rate(&config, "bench", seconds);
    let busy_rate = (source_rows(&config, "busy") - b0) as f64 / t0.elapsed().as_secs_f64();

    let (mut pauses, mut resumes, mut to_commit) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        pauses.push(weir(&config, &["stream", "pause", "busy"]));
        let before = committed(&store, busy_id);
        let t0 = Instant::now();
        resumes.push(weir(&config, &["stream", "resume", "busy"]));
        next_commit(&store, busy_id, before);
        to_commit.push(t0.elapsed());
        std::thread::sleep(Duration::from_secs(2));
    }
    weir(&config, &["stream", "drop", "busy"]);
    let alone_3 = rate(&config, "bench", seconds);
    let around = (alone_2 + alone_3) / 2.0;
    println!(
        "bench beside one busy stream    {:>8.2} M rows/s ({:.0} % of alone before and after: {:.2} M rows/s; busy {:.2} M rows/s, the two {:.0} %)",
        beside_busy / 1e6,
        100.0 * beside_busy / around,
        alone_3 / 1e6,
        busy_rate / 1e6,
        100.0 * (beside_busy + busy_rate) / around
    );
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    println!(
        "create -> first commit (9 streams, beside bench): median {}, longest {}",
        ms(median(created.clone())),
        ms(*created.iter().max().expect("nine"))
    );
    println!(
        "pause (savepoint, answered once paused): median {} of 3; resume: median {}; resume -> next commit: median {}",
        ms(median(pauses)),
        ms(median(resumes)),
        ms(median(to_commit))
    );
}
