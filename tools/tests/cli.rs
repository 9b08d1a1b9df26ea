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

/// A bounded stream of `events` per partition (2 partitions, 100,000 events/s each), slow enough
/// to be killed in the middle, checkpointing every 100 ms.
fn bounded(events: u64) -> Vec<String> {
    ["run", "--events", &events.to_string(), "--rate", "100000", "--keys", "100", "--window-ms", "100"]
        .into_iter()
        .chain(["--no-pin", "--checkpoint-ms", "100", "--seconds", "600", "--workers", "2"])
        .map(String::from)
        .collect()
}

/// Kill rounds of the SIGKILL test: 4, or `WEIR_KILL_ROUNDS` (a soak: the stream grows with it).
fn kill_rounds() -> u64 {
    std::env::var("WEIR_KILL_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4)
}

fn results(dir: &std::path::Path) -> Vec<weir_engine::operator::window::WindowResult> {
    let store = weir_engine::state::ResultStore::open(&dir.join("run/results")).unwrap();
    store.scan(weir_engine::wire::StreamId(1)).unwrap()
}

#[test]
fn killed_with_sigkill_and_resumed_it_ends_with_the_results_of_an_uninterrupted_run() {
    let rounds = kill_rounds();
    // Each round runs 0.3-0.9 s of a stream that takes 3 s: longer soaks get a longer stream.
    let per_partition = 300_000.max(rounds * 75_000);
    let straight = tempfile::tempdir().unwrap();
    let out = weir().args(bounded(per_partition)).arg("--data-dir").arg(straight.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = results(straight.path());
    // 100 rows per ms of event time per partition: a 100 ms window per 10,000 rows.
    assert_eq!(want.len() as u64, 100 * per_partition / 10_000, "100 keys x the windows");

    let crashed = tempfile::tempdir().unwrap();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut kills = 0;
    for _ in 0..rounds {
        let mut child = weir()
            .args(bounded(per_partition))
            .arg("--resume")
            .arg("--data-dir")
            .arg(crashed.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(300 + seed % 600));
        if let Some(status) = child.try_wait().unwrap() {
            // Resumed runs can finish the remaining work before the next kill: that is fine.
            assert!(status.success(), "a resumed run failed");
            break;
        }
        child.kill().unwrap(); // SIGKILL: no destructor, flush or sync runs
        let _ = child.wait();
        kills += 1;
    }
    assert!(kills >= 1, "no run was killed mid-stream");
    let commits = std::fs::read_dir(crashed.path().join("remote/1/checkpoints")).map_or(0, |d| d.count());
    assert!(commits > 0, "no checkpoint committed before the kills");
    let out =
        weir().args(bounded(per_partition)).arg("--resume").arg("--data-dir").arg(crashed.path()).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("restoring from the last commit"), "the last run did not restore: {stderr}");
    // It resumed part-way: fewer events than the whole stream (2 partitions).
    let summary = stdout.lines().find(|l| l.starts_with("summary:")).expect("summary");
    let events: u64 = summary.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(events < 2 * per_partition, "the resumed run replayed everything: {summary}");
    assert_eq!(results(crashed.path()), want);
}
