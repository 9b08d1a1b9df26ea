//! `weir-e2e keys`: the benchmark job at several key counts, on Weir with checkpoints every
//! second and on timely-dataflow (`timely_job`, no durable state), one after the other in the same
//! process: the key-count table of docs/benchmarks.md in one command.
//!
//! Weir: two generator partitions, two aggs, one sink, 1 s tumbling windows, 10,000 rows per
//! millisecond of event time per partition, two pinned workers, checkpoints every second into a
//! local directory. Events per second count the rows the aggs aggregated over the run after its
//! first second, and so does the pause p99 (with the whole run's beside it: the first second's
//! checkpoints come while the first windows' tables grow into fresh memory); the commit figures
//! cover every checkpoint of the run.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weir_engine::runtime::{CheckpointSettings, Engine};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::msg::CheckpointOutcome;
use weir_engine::wire::{NodeId, StreamId};

use crate::timely_job;

/// The current resident set of this process (KiB).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What one Weir run measured.
#[derive(Clone, Debug)]
pub struct WeirRun {
    /// Events per second after the first second.
    pub rate: f64,
    /// Trigger-to-commit median (ms).
    pub commit_median_ms: f64,
    /// Committed checkpoints.
    pub commits: usize,
    /// Bytes uploaded per checkpoint, median.
    pub upload_median: u64,
    /// Resident set at the end of the run (MiB).
    pub rss_mib: u64,
    /// Per-task pause (alignment plus synchronous snapshot), p99 over the task checkpoints after
    /// the first second, the window the rate is measured over (ms).
    pub pause_p99_ms: f64,
    /// The same over every task checkpoint of the run, the first second's (warm-up: the first
    /// windows' tables growing into fresh memory) included (ms).
    pub pause_p99_all_ms: f64,
}

/// Runs the job on Weir with `keys` keys for `seconds` (checkpoints every `checkpoint_ms`; 0: off;
/// `replay`: the aggs take replay snapshots).
pub fn weir(keys: u64, seconds: u64, checkpoint_ms: u64, replay: bool) -> WeirRun {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
    if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
        g.rows_per_ms = 10_000;
        g.keys = keys;
    }
    let mut cfg = crate::engine_config(NodeId(1), dir.path());
    if checkpoint_ms > 0 {
        let mut ck = CheckpointSettings::every(checkpoint_ms, dir.path().join("remote"));
        ck.replay = replay;
        cfg.checkpoint = Some(ck);
    }
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).expect("engine");
    std::thread::sleep(Duration::from_secs(1));
    let (t0, r0) = (Instant::now(), engine.stats().rows_aggregated.load(Ordering::Relaxed));
    let warm_up = engine.checkpoints().map(|l| l.pauses_us().len()).unwrap_or_default();
    std::thread::sleep(Duration::from_secs(seconds.saturating_sub(1).max(1)));
    let rate = (engine.stats().rows_aggregated.load(Ordering::Relaxed) - r0) as f64 / t0.elapsed().as_secs_f64();
    let rss_mib = rss_kib() / 1024;
    let finished = engine.checkpoints().map(|l| l.finished()).unwrap_or_default();
    let all = engine.checkpoints().map(|l| l.pauses_us()).unwrap_or_default();
    let p99 = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1))).copied().unwrap_or(0) as f64 / 1e3
    };
    let pause_p99_ms = p99(all.get(warm_up..).unwrap_or_default().to_vec());
    let pause_p99_all_ms = p99(all);
    engine.stop();
    drop(engine.wait());
    let committed: Vec<_> = finished.iter().filter(|c| c.outcome == CheckpointOutcome::Committed).collect();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    WeirRun {
        rate,
        commit_median_ms: median(committed.iter().map(|c| c.duration_us).collect()) as f64 / 1e3,
        commits: committed.len(),
        upload_median: median(committed.iter().map(|c| c.upload_bytes).collect()),
        rss_mib,
        pause_p99_ms,
        pause_p99_all_ms,
    }
}

/// Prints the table for every key count in `keys`, runs of `seconds` each, `rounds` times: Weir
/// then timely, alternately, and with more than one round the medians of the rounds (each ratio
/// is of two runs back to back). `replay`: Weir's aggs take replay snapshots (else full ones).
///
/// Why rounds: on a shared host both engines' rates move by half within minutes (timely ran the
/// 1,000,000-key job at 14.6 and 29.6 M events/s ten minutes apart); one
/// ratio says little, the median of several adjacent pairs more.
#[allow(clippy::print_stdout)]
pub fn keys(keys: &[u64], seconds: u64, rounds: usize, replay: bool) {
    let rounds = rounds.max(1);
    let kind = if replay { "replay" } else { "full" };
    println!(
        "the benchmark job, {seconds} s per run, 2 workers; Weir with checkpoints every second into file://, \
         {kind} snapshots, timely-dataflow 0.32 keeping nothing durable; {rounds} round(s) per key count"
    );
    println!(
        "{:>10} | {:>14} | {:>12} | {:>11} | {:>11} | {:>10} | {:>12} | {:>8} | {:>14} | {:>10}",
        "keys",
        "Weir M ev/s",
        "commit p50",
        "pause p99",
        "incl. 1st s",
        "commits",
        "upload/ckpt",
        "Weir RSS",
        "timely M ev/s",
        "Weir/timely"
    );
    for &k in keys {
        let mut runs = Vec::new();
        for _ in 0..rounds {
            let w = weir(k, seconds, 1000, replay);
            let t = timely_job::run(k, 1000, 2, seconds as f64).rate();
            println!(
                "{:>10} | {:>14.2} | {:>9.1} ms | {:>8.1} ms | {:>8.1} ms | {:>10} | {:>8} KiB | {:>4} MiB | {:>14.2} | {:>9.0} %",
                k,
                w.rate / 1e6,
                w.commit_median_ms,
                w.pause_p99_ms,
                w.pause_p99_all_ms,
                w.commits,
                w.upload_median / 1024,
                w.rss_mib,
                t / 1e6,
                100.0 * w.rate / t
            );
            runs.push((w, t));
        }
        if runs.len() > 1 {
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "{:>10} | {:>14.2} | {:>9.1} ms | {:>8.1} ms | {:>8.1} ms | {:>10} | {:>12} | {:>8} | {:>14.2} | {:>9.0} %",
                "median",
                median(runs.iter().map(|r| r.0.rate).collect()) / 1e6,
                median(runs.iter().map(|r| r.0.commit_median_ms).collect()),
                median(runs.iter().map(|r| r.0.pause_p99_ms).collect()),
                median(runs.iter().map(|r| r.0.pause_p99_all_ms).collect()),
                "",
                "",
                "",
                median(runs.iter().map(|r| r.1).collect()) / 1e6,
                median(runs.iter().map(|r| 100.0 * r.0.rate / r.1).collect())
            );
        }
    }
}
