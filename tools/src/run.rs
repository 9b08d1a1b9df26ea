//! `weir run`: the embedded default. One process runs a whole stream (generator sources, window
//! aggregation, sinks into the result store under `--data-dir`), checkpoints it every second into
//! `--data-dir/remote` (or the store `--remote` names: S3, rsync, a directory), prints a status
//! line every second and a summary at the end. With `--resume` it continues from the last
//! committed checkpoint (after a crash, say, or on a node that lost its data directory) with
//! exactly the results an uninterrupted run would have had.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::remote::RemoteArgs;
use weir_engine::backup::commit_point::{CommitBook, StoreCommits};
use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{CheckpointSettings, Engine, EngineConfig, Remote};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::msg::CheckpointOutcome;
use weir_engine::wire::{NodeId, StreamId};

/// Options of `weir run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// How long to run, e.g. `30s`, `2m`.
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    duration: Duration,
    /// Where results and state go.
    #[arg(long, default_value = "weir-data", value_parser = crate::config::parse_path)]
    data_dir: std::path::PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Source partitions.
    #[arg(long, default_value_t = 2)]
    partitions: u32,
    /// Agg tasks.
    #[arg(long, default_value_t = 2)]
    aggs: u32,
    /// Distinct series keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Tumbling window size, e.g. `1s`, `250ms`, `1m`.
    #[arg(long, default_value = "1s", value_parser = crate::config::parse_duration)]
    window: Duration,
    /// Events per second per partition (omit for as fast as possible).
    #[arg(long)]
    rate: Option<u64>,
    /// Do not pin workers to cores.
    #[arg(long)]
    no_pin: bool,
    /// Events per partition, then the stream ends (and `weir run` with it); default: endless.
    #[arg(long)]
    events: Option<u64>,
    /// Time between checkpoints, e.g. `1s`, `100ms`; `0s` turns checkpoints off.
    #[arg(long, default_value = "1s", value_parser = crate::config::parse_duration)]
    checkpoint_interval: Duration,
    /// Continue from the last committed checkpoint instead of starting afresh.
    #[arg(long)]
    resume: bool,
    /// The remote store (default: `--data-dir`/remote, wiped by a fresh run; a store named
    /// with `--remote` never is).
    #[command(flatten)]
    remote: RemoteArgs,
    /// Upload bandwidth limit per second, e.g. `50M` (bytes; K, M, G are binary multiples).
    #[arg(long, env = "WEIR_UPLOAD_LIMIT", value_name = "BYTES", value_parser = parse_bytes)]
    upload_limit: Option<u64>,
    /// Uploader threads: snapshots shipped at the same time (each ships its files eight at a time).
    #[arg(long, env = "WEIR_UPLOADERS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    uploaders: u64,
    /// Memory for window state, e.g. `512M` (all aggs together); beyond it state spills to each
    /// agg's RocksDB. Default: all state in memory.
    #[arg(long, env = "WEIR_STATE_BUDGET", value_name = "BYTES", value_parser = parse_bytes)]
    state_budget: Option<u64>,
    /// What an agg's checkpoint holds: `replay` (where the sources' rows for its windows begin;
    /// a restore sends them again: checkpoints cost the same at any key count, a restore replays
    /// up to a window's rows) or `full` (its windows' entries, written incrementally: a restore
    /// reads them, whatever the window's length).
    #[arg(long, env = "WEIR_SNAPSHOTS", default_value = "replay", action = clap::ArgAction::Set, value_name = "full|replay", value_parser = crate::config::parse_snapshots)]
    snapshots: bool,
    /// With replay snapshots, the longest a restore's replay may take at the rate replays run
    /// at (measured): a window whose rows would take longer is written (its entries,
    /// incrementally) instead, until it fires. `off`: no bound.
    #[arg(long, env = "WEIR_RECOVERY_BUDGET", default_value = "5s", value_name = "DURATION|off", value_parser = crate::config::parse_recovery_budget)]
    recovery_budget: crate::config::RecoveryBudget,
}

/// `512`, `64K`, `50M`, `1G` (binary multiples; an optional `B`, `iB`, `/s`).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches("/s").trim_end_matches('B').trim_end_matches('i');
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size like 512, 64K, 50M or 1G"))?;
    if n <= 0.0 {
        return Err(format!("{s:?}: the limit must be above zero"));
    }
    Ok((n * mult as f64) as u64)
}

impl RunArgs {
    /// Where the run keeps its data (and its log file).
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }
}

/// The remote store of a run, and how to name it.
fn remote_store(
    args: &RunArgs,
    stream: StreamId,
) -> anyhow::Result<(Option<std::sync::Arc<dyn weir_engine::backup::Store>>, String)> {
    let Some(url) = &args.remote.remote else {
        return Ok((None, args.data_dir.join("remote").display().to_string()));
    };
    let remote = crate::remote::RemoteArgs { scratch_dir: Some(args.data_dir.clone()), ..args.remote.clone() };
    let store = remote.open(url)?;
    let last =
        StoreCommits::new(stream).last(store.as_ref()).with_context(|| format!("reading the checkpoints in {url}"))?;
    match last {
        // Never wipe a store someone named: a fresh run there would mix two histories.
        Some(c) if !args.resume => anyhow::bail!(
            "{url} already holds checkpoints of stream {stream} (the last is {}): pass --resume to continue from it, \
             or name another prefix to start afresh",
            c.id
        ),
        _ => Ok((Some(store), url.clone())),
    }
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| (pages * 4096) >> 20)
}

/// Runs the embedded stream (`log`: the file the log goes to, if not the terminal).
///
/// Exit code 1 when checkpoints were on and the run ended without a commit after a failure, or
/// with more failures in a row than tolerated: a run whose state never left the node says so.
pub fn run(args: &RunArgs, log: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut spec = StreamSpec::generator(StreamId(1), args.partitions, args.aggs, 1);
    let window_ms = i64::try_from(args.window.as_millis()).unwrap_or(i64::MAX);
    spec.window = WindowSpec::tumbling(window_ms);
    if let SourceKind::Generator { spec: g, rate, limit } = &mut spec.source {
        g.keys = args.keys;
        // Event time runs about as fast as the wall clock at 10 M events/s per partition.
        g.rows_per_ms = args.rate.map_or(10_000, |r| (r / 1000).max(1));
        *rate = args.rate;
        *limit = args.events;
    }
    let run_dir = args.data_dir.join("run");
    let remote = args.data_dir.join("remote");
    let (named, remote_name) = remote_store(args, spec.id)?;
    if !args.resume {
        let embedded = named.is_none().then_some(&remote);
        for d in std::iter::once(&run_dir).chain(embedded) {
            if d.exists() {
                std::fs::remove_dir_all(d).with_context(|| format!("clearing {}", d.display()))?;
            }
        }
    }
    let mut cfg = EngineConfig::new(NodeId(1), &run_dir);
    cfg.workers = args.workers;
    cfg.pin_workers = !args.no_pin;
    cfg.state_budget = args.state_budget.map(|b| b as usize);
    if !args.checkpoint_interval.is_zero() {
        let mut ck = CheckpointSettings::every(args.checkpoint_interval.as_millis().max(1) as u64, &remote);
        if let Some(store) = named {
            ck.remote = Remote::Store(store);
        }
        ck.upload_limit = args.upload_limit;
        ck.uploaders = args.uploaders as usize;
        ck.replay = args.snapshots;
        ck.recovery_budget = args.recovery_budget.0;
        cfg.checkpoint = Some(ck);
    }
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).context("starting the engine")?;
    let live = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "weir run: {} source partitions -> {} aggs ({} ms tumbling windows, {} keys) -> sink, {} workers; data in {}",
        args.partitions,
        args.aggs,
        window_ms,
        args.keys,
        args.workers,
        run_dir.display()
    )?;
    if let Some(log) = log {
        writeln!(out, "          log in {} (WEIR_LOG=info shows it here)", log.display())?;
    }
    let engine = std::sync::Arc::new(engine);
    let stats = engine.stats();
    let t0 = Instant::now();
    let (mut last_t, mut last_rows) = (t0, 0u64);
    let mut peak_rate = 0f64;
    let done = |e: &Engine| args.events.is_some() && e.is_finished();
    while t0.elapsed() < args.duration && !done(&engine) {
        std::thread::sleep(Duration::from_millis(if args.events.is_some() { 100 } else { 1000 }));
        let now = Instant::now();
        if now.duration_since(last_t) < Duration::from_millis(900) {
            continue; // bounded runs look every 100 ms for the end, and report once a second
        }
        let rows = stats.rows_aggregated.load(Ordering::Relaxed);
        let rate = (rows - last_rows) as f64 / now.duration_since(last_t).as_secs_f64();
        peak_rate = peak_rate.max(rate);
        let (committed, last_ms, failing) = engine.checkpoints().map_or((0, 0.0, 0), |log| {
            let last = log.recent(1).last().map_or(0.0, |c| c.duration_us as f64 / 1e3);
            (log.totals().0, last, log.consecutive_failures())
        });
        // A restore's replay: the rows the aggs take again are not events of this run.
        let tasks = engine.status().tasks;
        let replaying: Vec<_> = tasks.iter().filter(|t| t.replay_rows > t.replayed).collect();
        let replay = match replaying.iter().max_by_key(|t| t.replay_rows - t.replayed) {
            Some(t) => {
                format!("  replaying {} (the slowest of {} aggs)", crate::status::replay_progress(t), replaying.len())
            }
            None => String::new(),
        };
        // On a terminal the status line is rewritten in place (the log is in a file then, see
        // `logging::init_run`); elsewhere one line a second, between the log's lines.
        write!(out, "{}", if live { "\r\x1b[2K" } else { "" })?;
        write!(
            out,
            "  {:>5.1}s  {:>7.2} M events/s  {:>14} events  {:>9} window results  {:>4} checkpoints (last {:>5.1} ms{})  rss {:>4} MiB{replay}",
            t0.elapsed().as_secs_f64(),
            rate / 1e6,
            rows,
            stats.results_written.load(Ordering::Relaxed),
            committed,
            last_ms,
            if failing > 0 { format!(", {failing} FAILING") } else { String::new() },
            rss_mib()
        )?;
        if !live {
            writeln!(out)?;
        }
        out.flush()?;
        (last_t, last_rows) = (now, rows);
    }
    let rows = stats.rows_aggregated.load(Ordering::Relaxed);
    let written = stats.results_written.load(Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let sample = engine.results().first(spec.id, 3).context("reading results")?;
    let ck = engine.checkpoints().map(|log| {
        let mut ms: Vec<f64> = log
            .finished()
            .iter()
            .filter(|c| c.outcome == CheckpointOutcome::Committed)
            .map(|c| c.duration_us as f64 / 1e3)
            .collect();
        ms.sort_by(f64::total_cmp);
        let (ok, failed) = log.totals();
        let failing =
            failed_checkpoints(ok, failed + log.not_started(), log.healthy(), t0.elapsed(), args.checkpoint_interval);
        let cause = match log.cause() {
            c if !c.is_empty() => c,
            _ => "none has finished yet: the store may not be answering (see the log)".to_string(),
        };
        (ok, failed, log.not_started(), ms.get(ms.len() / 2).copied().unwrap_or(0.0), failing.then_some(cause))
    });
    let engine = std::sync::Arc::into_inner(engine).context("engine still shared")?;
    if args.events.is_none() {
        engine.stop();
    }
    engine.wait().context("stopping the engine")?;
    if live {
        writeln!(out)?; // below the last status line
    }
    writeln!(
        out,
        "summary: {rows} events in {secs:.1} s = {:.2} M events/s (peak {:.2} M/s)",
        rows as f64 / secs / 1e6,
        peak_rate / 1e6
    )?;
    writeln!(out, "         {written} window results in {}", run_dir.join("tasks/*/results").display())?;
    match &ck {
        &Some((ok, failed, not_started, median, ref failing)) => {
            let not_started = if not_started > 0 { format!(", {not_started} could not start") } else { String::new() };
            writeln!(
                out,
                "         {ok} checkpoints committed ({failed} failed{not_started}), trigger to commit median {median:.1} ms, in {remote_name}"
            )?;
            if let Some(cause) = &failing {
                let what = if ok == 0 {
                    format!("no checkpoint committed: the state is not in {remote_name}")
                } else {
                    format!(
                        "checkpoints were failing at the end: what came after the last commit is not in {remote_name}"
                    )
                };
                out.flush()?;
                writeln!(std::io::stderr(), "error: {what}; first cause: {cause}")?;
            }
        }
        None => writeln!(out, "         checkpoints off")?,
    }
    for r in sample {
        writeln!(
            out,
            "         key {:>5} window {} count {} sum {:.3} min {:.3} max {:.3} avg {:.3}",
            r.key,
            r.start,
            r.count,
            r.sum,
            r.min,
            r.max,
            r.avg()
        )?;
    }
    let failing = ck.as_ref().is_some_and(|c| c.4.is_some());
    Ok(if failing { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Whether a run's checkpoints failed: none committed after a failure, or after three
/// intervals (time for a commit: a store that does not answer ends no checkpoint), or more
/// failures in a row than tolerated at the end.
fn failed_checkpoints(committed: u64, failed: u64, healthy: bool, ran: Duration, interval: Duration) -> bool {
    (committed == 0 && (failed > 0 || ran >= interval * 3)) || !healthy
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_run_fails_its_checkpoints_without_a_commit_after_a_failure_or_three_intervals() {
        let s = Duration::from_secs;
        let failed = |c, f, h, ran| super::failed_checkpoints(c, f, h, s(ran), s(1));
        assert!(!failed(0, 0, true, 2), "too short for a commit");
        assert!(failed(0, 1, true, 2), "a failure and no commit");
        assert!(failed(0, 0, true, 3), "three intervals and nothing ended: the store does not answer");
        assert!(!failed(5, 2, true, 10), "commits, failures within the tolerated");
        assert!(failed(5, 9, false, 10), "failing at the end");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        for (s, n) in [("512", 512), ("64K", 65_536), ("50M", 50 << 20), ("50MiB/s", 50 << 20), ("1.5G", 3 << 29)] {
            assert_eq!(super::parse_bytes(s), Ok(n), "{s}");
        }
        for bad in ["", "fast", "0", "-1M", "10X"] {
            assert!(super::parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
