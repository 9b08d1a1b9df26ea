//! The `weir` binary as a user runs it.

use std::process::Command;

fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

#[test]
fn weir_run_processes_events_and_prints_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = weir()
        .args(["run", "--duration", "2s", "--no-pin", "--keys", "100", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "weir run failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout.lines().find(|l| l.starts_with("summary:")).expect("a summary line");
    let events: u64 = summary.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(events > 1_000_000, "{summary}");
    assert!(stdout.contains("window results in"), "{stdout}");
    let results = weir_engine::state::NodeResults::open(&dir.path().join("run")).unwrap();
    assert!(!results.scan(weir_engine::wire::StreamId(1)).unwrap().is_empty(), "results in the sinks' stores");
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
    let out = weir().args(["run", "--duration", "soon"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value"));
}

/// A bounded stream of `events` per partition (2 partitions, 100,000 events/s each), slow enough
/// to be killed in the middle, checkpointing every 100 ms.
fn bounded(events: u64) -> Vec<String> {
    ["run", "--events", &events.to_string(), "--rate", "100000", "--keys", "100", "--window", "100ms"]
        .into_iter()
        .chain(["--no-pin", "--checkpoint-interval", "100ms", "--duration", "10m", "--workers", "2"])
        .map(String::from)
        .collect()
}

/// Kill rounds of the SIGKILL test: 4, or `WEIR_KILL_ROUNDS` (a soak: the stream grows with it).
fn kill_rounds() -> u64 {
    std::env::var("WEIR_KILL_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4)
}

fn results(dir: &std::path::Path) -> Vec<weir_engine::operator::window::WindowResult> {
    let store = weir_engine::state::NodeResults::open(&dir.join("run")).unwrap();
    store.scan(weir_engine::wire::StreamId(1)).unwrap()
}

#[test]
fn killed_with_sigkill_and_resumed_it_ends_with_the_results_of_an_uninterrupted_run() {
    killed_and_resumed(&["--snapshots", "full"], "restoring from the last commit");
}

#[test]
fn killed_with_sigkill_and_resumed_from_replay_snapshots_it_ends_with_the_same_results() {
    killed_and_resumed(&["--snapshots", "replay"], "replaying the windows' rows");
}

#[test]
fn killed_with_sigkill_and_resumed_with_windows_past_a_small_recovery_budget_it_ends_with_the_same_results() {
    // Windows of 0.1 s of rows and a budget of half that: each window is written once its rows
    // would take longer to replay, beside the younger named ones.
    killed_and_resumed(&["--snapshots", "replay", "--recovery-budget", "50ms"], "replaying the windows' rows");
}

/// The SIGKILL test, with `extra` arguments for every run of the stream; the last run's log
/// says `restored`.
fn killed_and_resumed(extra: &[&str], restored: &str) {
    let bounded = |n| {
        let mut a = bounded(n);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
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
    let logs = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let log = logs.path().join(format!("round-{round}.log"));
        let mut child = weir()
            .args(bounded(per_partition))
            .arg("--resume")
            .arg("--data-dir")
            .arg(crashed.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        if round == 0 {
            // However slow the machine, the kills come after a commit: the last run must have
            // one to restore.
            wait_for_line(&log, "checkpoint committed", std::time::Duration::from_secs(60));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(300 + seed % 600));
        if let Some(status) = child.try_wait().unwrap() {
            // Resumed runs can finish the remaining work before the next kill: that is fine.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(status.success(), "a resumed run failed ({status}):\n{text}");
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
    assert!(stderr.contains(restored), "the last run's log does not say {restored:?}: {stderr}");
    // It resumed part-way: fewer events than the whole stream (2 partitions).
    let summary = stdout.lines().find(|l| l.starts_with("summary:")).expect("summary");
    let events: u64 = summary.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(events < 2 * per_partition, "the resumed run replayed everything: {summary}");
    assert_same_results(&results(crashed.path()), &want);
}

/// Waits for a line holding `what` in the file at `path` (`weir run` logs to stderr when it is
/// not a terminal).
fn wait_for_line(path: &std::path::Path, what: &str, limit: std::time::Duration) {
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(path).unwrap_or_default().contains(what) {
        assert!(t0.elapsed() < limit, "no {what:?} within {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `got` equals `want`; else the first differences, side by side (the whole vectors are too
/// long to read, and a rare failure must say what went wrong).
fn assert_same_results(
    got: &[weir_engine::operator::window::WindowResult],
    want: &[weir_engine::operator::window::WindowResult],
) {
    if got == want {
        return;
    }
    let at = |rs: &[weir_engine::operator::window::WindowResult]| {
        rs.iter().map(|r| ((r.key, r.start), *r)).collect::<std::collections::BTreeMap<_, _>>()
    };
    let (g, w) = (at(got), at(want));
    let diffs: Vec<String> = w
        .keys()
        .chain(g.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| g.get(k) != w.get(k))
        .map(|k| format!("key {} window {}: got {:?}, want {:?}", k.0, k.1, g.get(k), w.get(k)))
        .collect();
    let windows: std::collections::BTreeSet<i64> =
        diffs.iter().filter_map(|d| d.split_whitespace().nth(3)?.trim_end_matches(':').parse().ok()).collect();
    panic!(
        "{} of {} results differ (windows {windows:?}); the first:\n{}",
        diffs.len(),
        want.len(),
        diffs.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
}

fn service(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with scripts/test"))
}

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// `weir run` into the store at `url` (with `env`): a bounded run commits there, a fresh run
/// into the same store is refused (it never wipes a named store), `--resume` continues, and a
/// resumed run on a node whose data directory is gone ends with the results of one run.
fn a_named_store_is_used_never_wiped_and_resumed_from(url: &str, env: &[(&str, String)]) {
    let events = 300_000;
    let run = |dir: &std::path::Path, resume: bool| {
        let mut cmd = weir();
        cmd.args(bounded(events)).arg("--data-dir").arg(dir).arg("--remote").arg(url);
        if resume {
            cmd.arg("--resume");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let straight = tempfile::tempdir().unwrap();
    let out = weir().args(bounded(events)).arg("--data-dir").arg(straight.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = results(straight.path());

    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("in {url}")), "the summary names the store: {stdout}");
    assert!(!stdout.contains(" 0 checkpoints committed"), "{stdout}");
    let again = run(dir.path(), false);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "a fresh run into a store that holds checkpoints must be refused");
    assert!(stderr.contains("already holds checkpoints") && stderr.contains("--resume"), "{stderr}");
    // The node loses its data directory; the store alone restores it.
    std::fs::remove_dir_all(dir.path().join("run/tasks")).unwrap();
    let out = run(dir.path(), true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("restoring from the last commit"), "{stderr}");
    assert_eq!(results(dir.path()), want);
}

#[test]
fn weir_run_checkpoints_into_s3_and_resumes_from_it() {
    let url = format!("s3://{}/{}", service("WEIR_TEST_S3_BUCKET"), unique("cli"));
    a_named_store_is_used_never_wiped_and_resumed_from(
        &url,
        &[
            ("WEIR_S3_ENDPOINT", service("WEIR_TEST_S3_ENDPOINT")),
            ("AWS_ACCESS_KEY_ID", service("WEIR_TEST_S3_ACCESS_KEY")),
            ("AWS_SECRET_ACCESS_KEY", service("WEIR_TEST_S3_SECRET_KEY")),
        ],
    );
}

#[test]
fn weir_run_checkpoints_into_rsync_and_resumes_from_it() {
    let url = format!("{}/{}", service("WEIR_TEST_RSYNC_URL"), unique("cli"));
    a_named_store_is_used_never_wiped_and_resumed_from(
        &url,
        &[("RSYNC_PASSWORD", service("WEIR_TEST_RSYNC_PASSWORD"))],
    );
}

#[test]
fn weir_run_whose_checkpoints_never_start_exits_non_zero_with_the_first_cause() {
    // A module that refuses writes: no checkpoint id can be reserved, so none starts.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}/{}", service("WEIR_TEST_RSYNC_READONLY_URL"), unique("cli"));
    let out = weir()
        .args(["run", "--duration", "3s", "--checkpoint-interval", "300ms", "--remote", &url, "--data-dir"])
        .arg(dir.path())
        .env("RSYNC_PASSWORD", service("WEIR_TEST_RSYNC_PASSWORD"))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("0 checkpoints committed (0 failed, ") && stdout.contains("could not start"), "{stdout}");
    assert!(stdout.contains("FAILING"), "the status line says so while it runs: {stdout}");
    let error =
        stderr.lines().find(|l| l.starts_with("error: no checkpoint committed")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(error.contains("first cause: no checkpoint could start") && error.contains("read only"), "{error}");
}

#[test]
fn weir_run_with_a_bad_remote_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    for (url, says) in [("ftp://host/x", "unknown scheme"), ("s3://", "no bucket"), ("rsync://host", "no module")] {
        let out =
            weir().args(["run", "--duration", "1s", "--remote", url, "--data-dir"]).arg(dir.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}");
        assert!(stderr.contains(url) && stderr.contains(says), "{url}: {stderr}");
    }
}

#[test]
fn weir_checkpoints_lists_shows_verifies_and_collects_what_a_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let out = weir().args(bounded(200_000)).arg("--data-dir").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let remote = format!("file://{}", dir.path().join("remote").display());
    let ck = |args: &[&str]| weir().arg("checkpoints").args(args).args(["--remote", &remote]).output().unwrap();
    let list = ck(&["list", "--json"]);
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).expect("list --json is JSON");
    let ids: Vec<u64> = v.as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert!(!ids.is_empty() && ids.len() <= 3, "retention keeps three: {ids:?}");
    let last = *ids.last().unwrap();
    assert!(v[ids.len() - 1]["files"].as_u64().unwrap() > 0 && v[ids.len() - 1]["offsets"]["t0"].as_u64().is_some());
    let table = String::from_utf8(ck(&["list"]).stdout).unwrap();
    assert!(table.contains("committed") && table.contains(&format!(" {last} ")), "{table}");
    let show = String::from_utf8(ck(&["show", &last.to_string()]).stdout).unwrap();
    assert!(show.contains(&format!("checkpoint {last} of stream")) && show.contains("/sst/"), "{show}");
    assert!(show.contains("rows again") || show.contains("nothing to replay"), "an agg's replay point: {show}");
    let ok = ck(&["verify", &last.to_string()]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    // One damaged byte: verify names the file and exits 1; a checkpoint that is not there exits 2.
    let shown: serde_json::Value = serde_json::from_slice(&ck(&["show", &last.to_string(), "--json"]).stdout).unwrap();
    let points: Vec<_> = shown["tasks"].as_array().unwrap().iter().filter(|t| t["replay"].is_object()).collect();
    assert_eq!(points.len(), 2, "the two aggs' replay points: {shown}");
    assert!(points.iter().all(|t| t["replay"]["rows"].is_u64() && t["replay"]["written"].is_array()), "{shown}");
    let key = shown["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|t| t["files"].as_array()?.first()?["key"].as_str().map(String::from))
        .unwrap();
    let path = dir.path().join("remote").join(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    let bad = ck(&["verify", &last.to_string()]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stdout).contains(&key), "{}", String::from_utf8_lossy(&bad.stdout));
    let missing = ck(&["verify", "999999"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no object"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    // gc: a dry run deletes nothing; keeping one deletes the others.
    let before = ck(&["list", "--json"]).stdout;
    let dry = ck(&["gc", "--keep", "1", "--dry-run", "--stopped"]);
    assert!(String::from_utf8_lossy(&dry.stdout).contains("would delete"), "{}", String::from_utf8_lossy(&dry.stdout));
    assert_eq!(ck(&["list", "--json"]).stdout, before);
    assert!(ck(&["gc", "--keep", "1", "--stopped"]).status.success());
    let after: serde_json::Value = serde_json::from_slice(&ck(&["list", "--json"]).stdout).unwrap();
    assert_eq!(after.as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect::<Vec<_>>(), vec![last]);
}

/// Flips one byte in the middle of the file at `p` (written anew: no hard link shares the damage).
/// A bounded run into `dir` (store `dir/remote`), killed with SIGKILL once three checkpoints
/// committed: the id of the last one.
fn killed_after_three_commits(dir: &std::path::Path, per_partition: u64) -> u64 {
    let mut child = weir()
        .args(bounded(per_partition))
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let records = dir.join("remote/1/checkpoints");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_dir(&records).map_or(0, |d| d.count()) < 3 {
        assert!(std::time::Instant::now() < deadline, "three commits in 20 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    std::fs::read_dir(&records)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_string_lossy().strip_suffix(".commit")?.parse::<u64>().ok())
        .max()
        .unwrap()
}

fn flip_a_byte(p: &std::path::Path) {
    let mut bytes = std::fs::read(p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::remove_file(p).unwrap();
    std::fs::write(p, &bytes).unwrap();
}

#[test]
fn weir_run_resume_goes_back_past_a_checkpoint_damaged_on_the_node_and_in_the_store() {
    let per_partition = 300_000;
    let straight = tempfile::tempdir().unwrap();
    let out = weir().args(bounded(per_partition)).arg("--data-dir").arg(straight.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = results(straight.path());

    let dir = tempfile::tempdir().unwrap();
    let last = killed_after_three_commits(dir.path(), per_partition);
    // The last commit's window state, damaged in the store and in the local snapshots (aggs t2, t3).
    let mut damaged = 0;
    for t in [2, 3] {
        let state = format!("state-{last:020}");
        for e in std::fs::read_dir(dir.path().join(format!("remote/1/tasks/{t}/sst"))).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().unwrap().to_string_lossy().starts_with(&state) {
                flip_a_byte(&p);
                damaged += 1;
            }
        }
        let local = dir.path().join(format!("run/tasks/{t}/snapshots/chk-{last:020}/{state}.sst"));
        if local.exists() {
            flip_a_byte(&local);
        }
    }
    assert_eq!(damaged, 2, "both aggs' state of checkpoint {last}");
    let out = weir().args(bounded(per_partition)).arg("--resume").arg("--data-dir").arg(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("checkpoint chk-{last} cannot be restored; the whole stream goes back to checkpoint")),
        "{stderr}"
    );
    assert_eq!(results(dir.path()), want);
}

#[test]
fn weir_run_resume_refuses_a_forged_manifest_and_writes_nothing_outside() {
    use weir_engine::backup::commit::{commit_key, decode_commit, encode_commit};
    use weir_engine::backup::{Manifest, manifest_key};
    use weir_engine::wire::{CheckpointId, StreamId, TaskId};
    let per_partition = 300_000;
    let straight = tempfile::tempdir().unwrap();
    let out = weir().args(bounded(per_partition)).arg("--data-dir").arg(straight.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = results(straight.path());

    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let last = killed_after_three_commits(dir.path(), per_partition);
    let remote = dir.path().join("remote");
    // Whoever can write the store rewrites the sink's last manifest to name a file outside, and
    // reseals it and the commit record (CRC32C is no MAC).
    let (stream, sink, chk) = (StreamId(1), TaskId(4), CheckpointId(last));
    let key = manifest_key(stream, sink, chk);
    let mut m = Manifest::decode(&key, &std::fs::read(remote.join(&key)).unwrap()).unwrap();
    let escape = outside.path().join("escaped");
    m.files[0].name = escape.display().to_string();
    let text = m.encode();
    std::fs::write(remote.join(&key), &text).unwrap();
    let ckey = commit_key(stream, chk);
    let mut record = decode_commit(&ckey, &std::fs::read(remote.join(&ckey)).unwrap()).unwrap();
    record.manifests.insert(sink, crc32c::crc32c(text.as_bytes()));
    std::fs::write(remote.join(&ckey), encode_commit(&record)).unwrap();
    // The node lost its copy: the restore must come from the store.
    std::fs::remove_dir_all(dir.path().join("run/tasks/4/snapshots")).unwrap();

    let out = weir().args(bounded(per_partition)).arg("--resume").arg("--data-dir").arg(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!escape.exists(), "the restore wrote outside its directory");
    assert!(stderr.contains("not a plain file name"), "{stderr}");
    // The forged checkpoint cannot be restored; the one before it can, and the stream ends exact.
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("checkpoint chk-{last} cannot be restored")), "{stderr}");
    assert_eq!(results(dir.path()), want);
}
