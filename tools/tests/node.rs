//! `weir node` as a user runs it: the config file and what a bad one says, the environment,
//! signals, `weir status`, and garbage on its port.

mod util;

use std::process::Command;
use std::time::{Duration, Instant};

use util::*;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;

#[test]
fn sigterm_stops_a_node_with_exit_code_0_and_a_restart_resumes_from_its_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let mut node = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut node.0[0]);
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    let pid = node.0[0].id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = exit_within(&mut node.0[0], Duration::from_secs(20), "the node after SIGTERM");
    assert!(status.success(), "exit {status}");
    // The last checkpoint it committed, before it said it stopped.
    let checkpoint = |l: &str| l.split_whitespace().find_map(|w| w.strip_prefix("checkpoint=chk-")).map(String::from);
    let mut last = None;
    let stopped = rx.iter().inspect(|l| {
        if l.contains("checkpoint committed") {
            last = checkpoint(&strip_ansi(l));
        }
    });
    assert!(stopped.map(|l| strip_ansi(&l)).any(|l| l.contains("node stopped") && l.contains("signal")));
    let last = last.unwrap_or_else(|| "1".into());

    let mut again = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut again.0[0]);
    let chosen = strip_ansi(&line_with(&rx, "restoring from the last commit", Duration::from_secs(30)));
    assert_eq!(checkpoint(&chosen), Some(last), "{chosen}");
    let pid = again.0[0].id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    assert!(exit_within(&mut again.0[0], Duration::from_secs(20), "the node after Ctrl-C").success());
}

#[test]
fn a_bad_config_is_refused_with_what_is_wrong_and_where() {
    let (code, err) = node_with(&format!("{MINIMAL}windw = \"1s\"\n"), &[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown field `windw`") && err.contains("line 6"), "{err}");

    let (code, err) = node_with(&MINIMAL.replace("cluster_secret = \"s\"\n", ""), &[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no cluster secret") && err.contains("WEIR_CLUSTER_SECRET"), "{err}");

    let (code, err) = node_with(MINIMAL, &[], &[("WEIR_CHECKPOINT__INTERVAL", "soon")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("WEIR_CHECKPOINT__INTERVAL") && err.contains("\"soon\" is not a duration"), "{err}");

    let (code, err) = node_with(MINIMAL, &[], &[("WEIR_CHECKPOINT__SNAPSHOTS", "some")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("snapshots must be `full` or `replay`, not `some`"), "{err}");

    let two = format!("{MINIMAL}[[nodes]]\nid = 2\naddr = \"127.0.0.1:2\"\n").replace("[stream]\n", "") + "[stream]\n";
    let (code, err) = node_with(&two, &["--node-id", "1"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("lists 2 nodes and no [control] table") && err.contains("WEIR_CONTROL__ETCD"), "{err}");
    let etcd = [("WEIR_CONTROL__ETCD", "http://127.0.0.1:1")];
    let (code, err) = node_with(&two, &[], &etcd);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--node-id"), "{err}");
    let (code, err) = node_with(&two, &["--node-id", "5"], &etcd);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("node 5 is not in the config"), "{err}");
}

#[test]
fn the_environment_overrides_the_file_and_supplies_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        t.remove("cluster_secret");
    });
    let out = weir()
        .args(["node", "--exit-when-done", "--config"])
        .arg(&config)
        .env("WEIR_CLUSTER_SECRET", "from-the-environment")
        .env("WEIR_STREAM__GENERATOR__EVENTS", "20000")
        .env("WEIR_CHECKPOINT__INTERVAL", "100ms")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // A bounded stream (from the environment) ends, and the node with it.
    assert!(out.status.success(), "{err}");
    assert!(err.contains("stream ended"), "{err}");
    let got = results_of(&[dir.path().join("data").join("node-1")]);
    let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
    spec.source = SourceKind::Generator {
        spec: GeneratorSpec { keys: 10_000, rows_per_ms: 1000, ..GeneratorSpec::default() },
        limit: Some(20_000),
        rate: None,
    };
    assert!(got == weir_engine::reference::bounded_results(&spec).unwrap(), "results differ from the reference");
}

#[test]
fn weir_status_reports_nodes_tasks_and_checkpoints_and_refuses_a_wrong_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _node, rx, addr) = one_node_committing(dir.path());

    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&addr) && text.contains(" up ") && text.contains("healthy"), "{text}");
    assert!(text.contains("end to end") && text.contains("committed"), "{text}");

    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = &v["nodes"][0];
    assert_eq!((n["up"].as_bool(), n["node"].as_u64()), (Some(true), Some(1)), "{v}");
    assert_eq!(n["tasks"].as_array().unwrap().len(), 5, "2 sources, 2 aggs, 1 sink: {v}");
    assert_eq!(n["streams"][0]["healthy"].as_bool(), Some(true), "{v}");
    let c = &n["checkpoints"][0];
    assert!(c["duration_us"].as_u64().unwrap() > 0 && c["outcome"] == "committed", "{v}");

    // A node that does not answer: exit code 1, and the others still reported.
    let gone = format!("127.0.0.1:{}", free_ports(1)[0]);
    let out = weir().args(["status", "--node", &addr, "--node", &gone, "--config"]).arg(&config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&gone) && text.contains("down"), "{text}");
    // The node that answered listed its tasks (each running or taking part in a checkpoint).
    let tasks = text.lines().filter(|l| l.contains(" running ") || l.contains(" checkpointing ")).count();
    assert_eq!(tasks, 5, "{text}");

    // A wrong secret is refused, clearly.
    let out = weir()
        .args(["status", "--node", &addr, "--cluster", "weir-one-node"])
        .env("WEIR_CLUSTER_SECRET", "not-the-secret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refused this client") && err.contains("secret"), "{err}");
    // The node kept serving its stream.
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
}

#[test]
fn garbage_sent_to_a_node_closes_that_connection_and_the_node_keeps_its_stream() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (config, _node, rx, addr) = one_node_committing(dir.path());
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let _ = s.write_all(&garbage); // the node may hang up before it has read it all
    let mut buf = [0u8; 256];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
        }
    };
    assert!(closed, "the node closed the connection that sent garbage");
    // Still checkpointing (new commits, not lines logged before), and still answering clients.
    while rx.try_recv().is_ok() {}
    let t0 = Instant::now();
    let mut commits = 0;
    while commits < 2 {
        line_with(&rx, "checkpoint committed", Duration::from_secs(30));
        commits += 1;
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `weir node` with `config` written to a file: its exit code and stderr.
fn node_with(config: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = weir();
    cmd.args(["node", "--config"]).arg(&path).args(args).env_remove("WEIR_CLUSTER_SECRET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const MINIMAL: &str = "cluster_secret = \"s\"\n[[nodes]]\nid = 1\naddr = \"127.0.0.1:1\"\n[stream]\n";

#[test]
fn weir_verify_of_a_running_stream_compares_the_windows_its_last_commit_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _node, rx, _) = one_node_committing(dir.path());
    // The example's 1 s windows: wait until a commit has closed one.
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let said = loop {
        let (code, out, err) = verify(&config, &[]);
        if code == Some(0) && !out.contains("all 0 window results") {
            break out;
        }
        assert!(code == Some(0) || err.contains("no commit"), "{code:?} {out} {err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{out} {err}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        said.contains("(running)")
            && said.contains("window results match the generator's")
            && said.contains("up to its last commit"),
        "{said}"
    );
    // It can fail: against another seed, what the commit closed differs.
    let (code, out, _) = verify(&config, &[("WEIR_STREAM__GENERATOR__SEED", "43")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("(running)") && out.contains("differ"), "{out}");
}

#[test]
fn weir_status_watch_appends_a_json_line_per_refresh_to_its_status_log() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _node, _rx, _addr) = one_node_committing(dir.path());
    let log = dir.path().join("status.jsonl");
    let mut watch = weir()
        .args(["status", "--watch", "--status-log"])
        .arg(&log)
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Three refreshes, a second apart.
    let t0 = Instant::now();
    while std::fs::read_to_string(&log).unwrap_or_default().lines().count() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the status log did not grow");
        std::thread::sleep(Duration::from_millis(100));
    }
    watch.kill().unwrap();
    watch.wait().unwrap();
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0]["at_ms"].as_u64() < w[1]["at_ms"].as_u64()), "{lines:?}");
    for l in &lines {
        assert_eq!(l["nodes"][0]["up"], true, "{l}");
        assert!(!l["nodes"][0]["tasks"].as_array().unwrap().is_empty(), "{l}");
    }
    // Without --watch there is nothing to log: refused as a usage error.
    let out = weir().args(["status", "--status-log"]).arg(&log).arg("--config").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn weir_verify_checks_the_last_minute_and_a_seeded_sample_by_default_and_every_window_with_all() {
    // 120 s of event time in 1 s windows (one row per millisecond), 100 keys: 120 windows.
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        set(t, &["stream", "generator", "events"], 120_000);
        set(t, &["stream", "generator", "rows_per_ms"], 1);
        set(t, &["stream", "generator", "keys"], 100);
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let log = dir.path().join("node.log");
    let _node = Nodes(vec![start(&config, 1, &log, &[])]);
    let said = verify_until_ended(&config, Duration::from_secs(60));
    let run = |args: &[&str]| {
        let out = weir().args(["verify", "--config"]).arg(&config).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    assert!(
        said.contains("all 6300 window results match the generator's")
            && said.contains("checked the 60 windows closed in the last 1m of event time up to the end of its rows and 3 of the 60 older ones, sampled with --seed")
            && said.contains("(--all checks all 120)"),
        "{said}"
    );
    let seeded = run(&["--seed", "7"]);
    assert_eq!(run(&["--seed", "7"]), seeded, "a seed repeats its sample");
    let few = run(&["--since", "10s", "--sample", "0"]);
    assert!(few.contains("all 1000 window results") && few.contains("the 10 windows closed in the last 10s"), "{few}");
    let all = run(&["--all"]);
    assert!(
        all.contains("all 12000 window results match")
            && all.contains("every window closed up to the end of its rows (120)"),
        "{all}"
    );
    assert!(all.contains("240000 rows recomputed"), "every row of both partitions, once: {all}");
}

#[test]
fn weir_status_shows_why_no_checkpoint_could_start() {
    // A store that refuses writes (an rsync module that is read only): no id can be reserved.
    let service = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run scripts/test"));
    let dir = tempfile::tempdir().unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let url = format!("{}/status-{nanos}", service("WEIR_TEST_RSYNC_READONLY_URL"));
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        set(t, &["checkpoint", "remote"], url.as_str());
    });
    let log = dir.path().join("node.log");
    let mut cmd = weir();
    cmd.args(["node", "--config"]).arg(&config).env("RSYNC_PASSWORD", service("WEIR_TEST_RSYNC_PASSWORD"));
    let _node = Nodes(vec![cmd.stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap()]);
    let t0 = Instant::now();
    let said = loop {
        let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("could not start") {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{text}\n{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    };
    let line = said.lines().find(|l| l.contains("coordinated by node 1")).unwrap_or_else(|| panic!("{said}"));
    assert!(line.contains("0 checkpoints committed") && line.contains("a checkpoint every 200ms"), "{line}");
    assert!(line.contains("first cause: no checkpoint could start") && line.contains("read only"), "{line}");
    let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &json["nodes"][0]["streams"][0];
    assert!(s["not_started"].as_u64().unwrap() > 0 && s["cause"].as_str().unwrap().contains("read only"), "{json:#}");
}
