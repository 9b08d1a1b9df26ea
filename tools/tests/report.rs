//! `weir report` from a real load: a node, `weir status --watch --status-log` and `weir load
//! --hdr-log` side by side, then the page rendered in headless Chromium (Debian's `chromium`,
//! installed by `scripts/install-deps`), which must load it without a script error and draw
//! every plot. Bad input gets a clear error.

mod util;

use std::process::{Command, Stdio};
use std::time::Duration;

use util::*;

#[test]
fn weir_report_renders_in_headless_chromium_with_every_plot_and_no_error() {
    let chromium = Command::new("chromium").arg("--version").output();
    assert!(
        chromium.is_ok_and(|o| o.status.success()),
        "no `chromium` binary: run scripts/install-deps (Debian's chromium package)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let mut node = Nodes(vec![start(&config, 1, &dir.path().join("node.log"), &[])]);
    let status_log = dir.path().join("status.jsonl");
    let hdr = dir.path().join("load.hlog");
    let status = weir()
        .args(["status", "--watch", "--config"])
        .arg(&config)
        .arg("--status-log")
        .arg(&status_log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = Nodes(vec![status]);
    let out = weir()
        .args(["load", "--config"])
        .arg(&config)
        .args(["--rate", "200k", "--duration", "3s", "--keys", "100", "--hdr-log"])
        .arg(&hdr)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A refresh a second: one after the load's last checkpoints.
    std::thread::sleep(Duration::from_millis(1200));
    let _ = status.0[0].kill();
    let report = dir.path().join("report");
    let out = weir()
        .args(["report", "--hdr-log"])
        .arg(&hdr)
        .arg("--status-log")
        .arg(&status_log)
        .arg("--out")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    // Self-contained: nothing fetched from elsewhere.
    assert!(!page.contains("src=") && !page.contains("href="), "the page refers to other files");
    assert!(page.contains("events acknowledged</td><td>600000<"), "the figures' table counts every event");
    for name in ["throughput", "latency", "distribution", "checkpoints"] {
        let svg = std::fs::read_to_string(report.join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<polyline") || svg.contains("<path"), "{name}.svg has no line");
    }
    // Chromium loads it and runs its script: it says how many plots it drew and how many
    // script errors there were.
    let mut chromium = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("--user-data-dir={}", dir.path().join("chromium").display()))
        .arg(format!("file://{}", report.join("index.html").display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut dom = String::new();
    std::io::Read::read_to_string(chromium.stdout.as_mut().unwrap(), &mut dom).unwrap();
    assert!(exit_within(&mut chromium, Duration::from_secs(60), "chromium").success());
    assert!(dom.contains(r#"data-plots="4""#), "not every plot was drawn: {}", &dom[..dom.len().min(400)]);
    assert!(dom.contains(r#"data-errors="0""#), "script errors on the page");
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exit_within(&mut node.0[0], Duration::from_secs(30), "node").success());
}

#[test]
fn weir_report_refuses_a_missing_or_foreign_file_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = weir().arg("report").args(args).arg("--out").arg(dir.path().join("r")).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--hdr-log", "/nonexistent/load.hlog"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("cannot read the HdrHistogram log /nonexistent/load.hlog"), "{err}");
    let text = dir.path().join("not.hlog");
    std::fs::write(&text, "hello\n").unwrap();
    let (code, err) = run(&["--hdr-log", text.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("not an interval log") || err.contains("no interval"), "{err}");
}
