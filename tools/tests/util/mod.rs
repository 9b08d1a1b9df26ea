//! Helpers of the `weir node` and cluster tests: the example configs on free ports, node
//! processes that are killed when a test leaves them running, their logs, and results.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::{WindowResult, WindowSpec};
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

pub mod created;
pub mod etcd;
pub mod load;
pub mod netns;

pub fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

/// An example config of the repository, as a table to adjust.
pub fn example(name: &str) -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Ports free on 127.0.0.1 right now (held together while they are picked, so they differ).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// The test etcd's client URL (`scripts/services` starts it).
pub fn etcd_endpoint() -> String {
    std::env::var("WEIR_TEST_ETCD_ENDPOINT").expect(
        "WEIR_TEST_ETCD_ENDPOINT is unset: run the tests through scripts/test, or `source scripts/services` first",
    )
}

/// `example` with its nodes on free ports and its data and store under `dir`, written there. A
/// file of several nodes keeps its control state on the test etcd (leases of 2 s), under a
/// cluster name no other test uses, so that its keys are its own.
pub fn adjusted(example: toml::Table, dir: &Path, tune: impl FnOnce(&mut toml::Table)) -> PathBuf {
    let mut t = example;
    if t["nodes"].as_array().unwrap().len() > 1 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        t.insert("cluster".into(), format!("test-{}-{nanos}", std::process::id()).into());
        let mut control = toml::Table::new();
        control.insert("etcd".into(), toml::Value::Array(vec![etcd_endpoint().into()]));
        control.insert("lease".into(), "2s".into());
        control.insert("timeout".into(), "300ms".into());
        t.insert("control".into(), control.into());
    }
    let nodes = t["nodes"].as_array_mut().unwrap();
    let ports = free_ports(6);
    for (node, port) in nodes.iter_mut().zip(ports.chunks(2)) {
        let node = node.as_table_mut().unwrap();
        node.insert("addr".into(), format!("127.0.0.1:{}", port[0]).into());
        if node.contains_key("metrics") {
            node.insert("metrics".into(), format!("127.0.0.1:{}", port[1]).into());
        }
    }
    t.insert("data_dir".into(), dir.join("data").display().to_string().into());
    let ck = t["checkpoint"].as_table_mut().unwrap();
    ck.insert("remote".into(), format!("file://{}", dir.join("remote").display()).into());
    tune(&mut t);
    let path = dir.join("cluster.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

pub fn set(t: &mut toml::Table, path: &[&str], v: impl Into<toml::Value>) {
    let (last, parents) = path.split_last().unwrap();
    let mut t = t;
    for p in parents {
        t = t.get_mut(*p).unwrap().as_table_mut().unwrap();
    }
    t.insert(last.to_string(), v.into());
}

/// Node processes, killed if a test leaves them running.
pub struct Nodes(pub Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn start(config: &Path, id: u32, log: &Path, args: &[&str]) -> Child {
    weir()
        .args(["node", "--config"])
        .arg(config)
        .args(["--node-id", &id.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits for `child` to exit by itself (at most `limit`).
pub fn exit_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(t0.elapsed() < limit, "{what} still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`exit_within`], and on a timeout the last lines of the node's log in the failure.
pub fn exit_within_logged(child: &mut Child, limit: Duration, what: &str, log: &Path) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() >= limit {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            panic!("{what} still running after {limit:?}; the end of its log:\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stream of `examples/three-node.toml` with `events` per partition.
pub fn three_node_stream(events: u64) -> StreamSpec {
    let mut s = StreamSpec::generator(StreamId(1), 3, 3, 3);
    s.window = WindowSpec::tumbling(1000);
    s.source = SourceKind::Generator {
        spec: GeneratorSpec { seed: 42, keys: 10_000, rows_per_ms: 1000, ..GeneratorSpec::default() },
        limit: Some(events),
        rate: None,
    };
    s
}

pub fn results_of(dirs: &[PathBuf]) -> Vec<WindowResult> {
    let mut got = Vec::new();
    for d in dirs {
        got.extend(weir_engine::state::NodeResults::open(d).unwrap().scan(StreamId(1)).unwrap());
    }
    got.sort_by_key(|r| (r.key, r.start));
    got
}

/// `weir verify --config FILE` with `env`: exit code and stdout.
pub fn verify(config: &Path, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = weir();
    cmd.args(["verify", "--config"]).arg(config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// Lines of a node's stderr, as they come.
pub fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line containing `what` (at most `limit`); returns it.
pub fn line_with(rx: &std::sync::mpsc::Receiver<String>, what: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    while let Some(left) = limit.checked_sub(t0.elapsed()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("no line with {what:?} within {limit:?}");
}

/// `l` without terminal colours.
pub fn strip_ansi(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut chars = l.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

pub fn spawn_piped(config: &Path) -> Child {
    weir()
        .args(["node", "--config"])
        .arg(config)
        .env("WEIR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `examples/one-node.toml` (checkpoints every 200 ms) running under `dir` until its first
/// commit: the config, the node, its stderr lines, and its address.
pub fn one_node_committing(dir: &Path) -> (PathBuf, Nodes, std::sync::mpsc::Receiver<String>, String) {
    let config = adjusted(example("one-node.toml"), dir, |t| {
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let mut node = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut node.0[0]);
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = file["nodes"][0]["addr"].as_str().unwrap().to_string();
    (config, node, rx, addr)
}

/// `examples/three-node.toml` as a bounded stream of `events` per partition at 100,000 events/s
/// each, checkpointing every 200 ms, under `dir`.
pub fn bounded_three_node(dir: &Path, events: u64) -> PathBuf {
    adjusted(example("three-node.toml"), dir, |t| {
        set(t, &["stream", "generator", "events"], events as i64);
        set(t, &["stream", "generator", "rate"], 100_000);
        set(t, &["checkpoint", "interval"], "200ms");
    })
}

/// Waits for a line containing `what` in the log file `path` (at most `limit`); returns it.
pub fn line_in(path: &Path, what: &str, limit: Duration) -> String {
    line_in_any(&[path], what, limit)
}

/// Waits for a line containing `what` in any of the log files `paths` (at most `limit`);
/// returns the first found.
pub fn line_in_any(paths: &[&Path], what: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let texts: Vec<String> = paths.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
        if let Some(l) = texts.iter().find_map(|t| t.lines().find(|l| l.contains(what))) {
            return l.to_string();
        }
        assert!(t0.elapsed() < limit, "no line with {what:?} in {paths:?} within {limit:?}: {}", texts.join("\n"));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines containing `what` in the log file `path` (0 while it does not exist).
pub fn count_in(path: &Path, what: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.contains(what)).count()
}

/// Sends `sig` (`-STOP`, `-CONT`, ...) to `child`.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(ok.success(), "kill {sig} {}", child.id());
}

/// `weir verify` until it compares the whole stream, ended on every node (at most `limit`);
/// returns what it printed then. Meanwhile it may say the stream has not ended (a node down or
/// restarting), or compare what the last commit closed: that must match too.
pub fn verify_until_ended(config: &Path, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let (code, out, err) = verify(config, &[]);
        match code {
            Some(0) if !out.contains("(running)") => return out,
            Some(0) => {}
            Some(2) => assert!(
                ["has not ended", "down", "no commit", "restarting"].iter().any(|w| err.contains(w)),
                "{out} {err}"
            ),
            _ => panic!("verify failed ({code:?}): {out} {err}"),
        }
        assert!(t0.elapsed() < limit, "the stream did not end within {limit:?}: {out} {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Node `node`'s Prometheus metrics.
pub fn scrape(config: &Path, node: u64) -> String {
    use std::io::{Read, Write};
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let entry = t["nodes"].as_array().unwrap().iter().find(|n| n["id"].as_integer() == Some(node as i64)).unwrap();
    let mut c = std::net::TcpStream::connect(entry["metrics"].as_str().unwrap()).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    body
}

/// The restarts a node of `weir status --json` lists for failures: all but those of a lease
/// etcd let lapse (a busy machine's, not the stream's).
pub fn failures(node: &serde_json::Value) -> usize {
    let restarts = node["restarts"].as_array().map_or(&[][..], Vec::as_slice);
    restarts.iter().filter(|r| !r["reason"].as_str().is_some_and(|w| w.starts_with("lost its lease"))).count()
}
