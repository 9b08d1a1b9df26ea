//! The `weir` binary as a user runs it.

use std::process::Command;

fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

#[test]
fn weir_run_processes_events_and_prints_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = weir()
        .args(["run", "--seconds", "2", "--no-pin", "--keys", "100", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "weir run failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout.lines().find(|l| l.starts_with("summary:")).expect("a summary line");
    let events: u64 = summary.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(events > 1_000_000, "{summary}");
    assert!(stdout.contains("window results in"), "{stdout}");
    assert!(dir.path().join("run/results/CURRENT").exists());
}

#[test]
fn weir_demo_runs_the_transport_end_to_end() {
    let out = weir().args(["demo", "--frames", "2000", "--pings", "200"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("batches : 2000 frames"), "{stdout}");
    assert!(stdout.contains("triggers: 200 round trips"), "{stdout}");
}

#[test]
fn bad_arguments_are_refused_with_usage() {
    let out = weir().args(["run", "--seconds", "soon"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value"));
}
