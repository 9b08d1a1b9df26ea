//! `weir run`: the embedded default. One process runs a whole stream (generator sources, window
//! aggregation, sinks into the result store under `--data-dir`), prints a live status line every
//! second and a summary at the end. Checkpoints join it with the checkpoint protocol.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{Engine, EngineConfig};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::{NodeId, StreamId};

/// Options of `weir run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// How long to run (seconds).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Where results and state go.
    #[arg(long, default_value = "weir-data")]
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
    /// Tumbling window size (ms).
    #[arg(long, default_value_t = 1000)]
    window_ms: i64,
    /// Events per second per partition (omit for as fast as possible).
    #[arg(long)]
    rate: Option<u64>,
    /// Do not pin workers to cores.
    #[arg(long)]
    no_pin: bool,
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| (pages * 4096) >> 20)
}

/// Runs the embedded stream.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let mut spec = StreamSpec::generator(StreamId(1), args.partitions, args.aggs, 1);
    spec.window = WindowSpec::tumbling(args.window_ms);
    if let SourceKind::Generator { spec: g, rate, .. } = &mut spec.source {
        g.keys = args.keys;
        // Event time runs about as fast as the wall clock at 10 M events/s per partition.
        g.rows_per_ms = args.rate.map_or(10_000, |r| (r / 1000).max(1));
        *rate = args.rate;
    }
    // No recovery yet (it comes with checkpoints): every run starts from scratch.
    let run_dir = args.data_dir.join("run");
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir).with_context(|| format!("clearing {}", run_dir.display()))?;
    }
    let mut cfg = EngineConfig::new(NodeId(1), &run_dir);
    cfg.workers = args.workers;
    cfg.pin_workers = !args.no_pin;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).context("starting the engine")?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "weir run: {} source partitions -> {} aggs ({} ms tumbling windows, {} keys) -> sink, {} workers; data in {}",
        args.partitions,
        args.aggs,
        args.window_ms,
        args.keys,
        args.workers,
        run_dir.display()
    )?;
    let stats = engine.stats();
    let t0 = Instant::now();
    let (mut last_t, mut last_rows) = (t0, 0u64);
    let mut peak_rate = 0f64;
    while t0.elapsed() < Duration::from_secs(args.seconds) {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        let rows = stats.rows_aggregated.load(Ordering::Relaxed);
        let rate = (rows - last_rows) as f64 / now.duration_since(last_t).as_secs_f64();
        peak_rate = peak_rate.max(rate);
        write!(
            out,
            "\r  {:>4.0}s  {:>7.2} M events/s  {:>14} events  {:>10} window results  rss {:>4} MiB ",
            t0.elapsed().as_secs_f64(),
            rate / 1e6,
            rows,
            stats.results_written.load(Ordering::Relaxed),
            rss_mib()
        )?;
        out.flush()?;
        (last_t, last_rows) = (now, rows);
    }
    writeln!(out)?;
    let rows = stats.rows_aggregated.load(Ordering::Relaxed);
    let written = stats.results_written.load(Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let sample = engine.results().scan(spec.id).context("reading results")?.into_iter().take(3).collect::<Vec<_>>();
    engine.stop();
    engine.wait().context("stopping the engine")?;
    writeln!(
        out,
        "summary: {rows} events in {secs:.1} s = {:.2} M events/s (peak {:.2} M/s)",
        rows as f64 / secs / 1e6,
        peak_rate / 1e6
    )?;
    writeln!(out, "         {written} window results in {}", run_dir.join("results").display())?;
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
    writeln!(out, "         (checkpoints and crash recovery arrive with the checkpoint protocol)")?;
    Ok(())
}
