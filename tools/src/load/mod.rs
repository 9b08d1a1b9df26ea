//! `weir load`: the bundled traffic generator. Sends batches of rows to the ingest logs of an
//! ingest-log stream's partitions, each to the node its source runs on, and reports what came
//! back: events acknowledged, the rate, and ack latency (open loop, from each batch's scheduled
//! send time) as percentiles and, with `--hdr-log`, an HdrHistogram interval log.
//!
//! Rows are a pure function of (seed, partition, offset) and the load's other parameters, as
//! the generator source's are; the load's producer id (random per run) and each batch's
//! sequence number make every append idempotent, so a batch sent again after a timeout, a
//! reconnect or a node's restart is stored once. The load ends with exactly the rows it meant to
//! send, each once, or exits non-zero.

mod driver;
mod latency;
mod order;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::wire::StreamId;

use crate::client::{ClusterArgs, Target};
use driver::{Acked, Counters, Driver, Report};

/// Options of `weir load`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    weir load --config examples/load-one-node.toml --events 10M\n  \
    weir load --config examples/load-three-node.toml --rate 2M --duration 30s --hdr-log load.hlog\n\n\
    Rows are a pure function of (seed, partition, offset); every batch carries the load's producer \
    id and its sequence number, so one sent again is stored once.\n\n\
    Exit codes: 0 every event acknowledged exactly once, 1 an event not acknowledged (a node \
    refused a batch or stayed unreachable past --timeout), 2 an error (config, secret).")]
pub struct LoadArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The ingest-log stream: its name or id (default: the config's ingest stream).
    #[arg(long, value_name = "NAME|ID", value_parser = crate::client::parse_stream_ref)]
    stream: Option<crate::client::StreamRef>,
    /// The stream's partitions (default: the config's).
    #[arg(long)]
    partitions: Option<u32>,
    /// Events per second in total, e.g. `2M` (default: as fast as acknowledgements come back).
    #[arg(long, value_parser = parse_count)]
    rate: Option<u64>,
    /// Events in total, e.g. `10M`, spread evenly over the partitions.
    #[arg(long, value_parser = parse_count)]
    events: Option<u64>,
    /// How long to send, e.g. `30s` (with neither this nor `--events`: 10s).
    #[arg(long, value_parser = crate::config::parse_duration)]
    duration: Option<Duration>,
    /// Rows per batch.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// Batches in flight per node at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1000))]
    in_flight: u32,
    /// Distinct series keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Seed of the rows.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Rows per millisecond of event time per partition (default: the rate's, so event time
    /// moves with the clock; 1000 without a rate).
    #[arg(long)]
    rows_per_ms: Option<u64>,
    /// Share of rows sent late (out of order), up to `--max-disorder`.
    #[arg(long, default_value_t = 0.0)]
    out_of_order: f64,
    /// Largest lateness of a late row, e.g. `200ms`.
    #[arg(long, default_value = "0s", value_parser = crate::config::parse_duration)]
    max_disorder: Duration,
    /// Write ack latency as an HdrHistogram interval log (one interval per second, µs).
    #[arg(long, value_name = "FILE")]
    hdr_log: Option<std::path::PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Also measure event-to-result latency: from each event's ack to its window's results
    /// being readable from the nodes (they are read every 50 ms; needs `--config`).
    #[arg(long)]
    measure_results: bool,
    /// Give up on a node unreachable this long, e.g. `60s`; also the wait for an ack.
    #[arg(long, default_value = "60s", value_parser = crate::config::parse_duration)]
    timeout: Duration,
}

/// `10M`, `500k`, `2G` or a plain number.
fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (digits, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        Some('m' | 'M') => (&t[..t.len() - 1], 1_000_000),
        Some('g' | 'G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (&t[..], 1),
    };
    let n: f64 = digits.parse().map_err(|_| format!("{s:?} is not a count like 10M, 500k or 1000"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("{s:?} must be positive"));
    }
    Ok((n * mult as f64).round() as u64)
}

/// What the load sends, shared by its drivers.
pub struct Plan {
    pub stream: StreamId,
    pub partitions: u32,
    pub producer: u64,
    pub generator: GeneratorSpec,
    pub batch: usize,
    pub in_flight: usize,
    pub rate: Option<u64>,
    pub events: Option<u64>,
    pub duration: Option<Duration>,
    pub start: Instant,
    pub timeout: Duration,
    pub ack_timeout: Duration,
    /// The stream's window, when the config says (the end-of-load markers close its last one).
    pub window: Option<weir_engine::operator::window::WindowSpec>,
    /// What the load says of itself with each partition's first batch ([`crate::loads`]).
    pub description: Vec<u8>,
    /// Rows earlier loads appended to each partition.
    pub before: Vec<u64>,
}

impl Plan {
    /// Rows partition `p` sends in all (`None`: until the duration ends).
    pub fn rows_of(&self, p: u32) -> Option<u64> {
        self.events.map(|n| n / self.partitions as u64 + u64::from((p as u64) < n % self.partitions as u64))
    }
}

/// The node each partition's source runs on, from the nodes' status (waiting for nodes that
/// restart, up to `timeout`).
fn owners(t: &Target, stream: StreamId, partitions: u32, timeout: Duration) -> anyhow::Result<Vec<SocketAddr>> {
    let deadline = Instant::now() + timeout;
    loop {
        let (owner, why) = owners_now(t, stream, partitions)?;
        if owner.iter().all(Option::is_some) {
            return Ok(owner.into_iter().map(|o| o.expect("all")).collect());
        }
        if Instant::now() > deadline {
            let missing: Vec<String> =
                owner.iter().enumerate().filter(|(_, o)| o.is_none()).map(|(p, _)| p.to_string()).collect();
            bail!(
                "no node runs the source of partition(s) {} of stream {} ({}; is --stream an ingest-log stream of these nodes?)",
                missing.join(", "),
                stream.0,
                if why.is_empty() { "every node answered".to_string() } else { why.join("; ") }
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The node each partition's source runs on as the nodes answer now (`None`: no node that
/// answered runs it), and what kept nodes from answering.
pub(crate) fn owners_now(
    t: &Target,
    stream: StreamId,
    partitions: u32,
) -> anyhow::Result<(Vec<Option<SocketAddr>>, Vec<String>)> {
    let mut owner = vec![None; partitions as usize];
    let mut why = Vec::new();
    for &addr in &t.nodes {
        match crate::client::status_of(t, addr, Some(stream), Duration::from_secs(3))? {
            Ok(s) => {
                for task in s.tasks.iter().filter(|k| k.stream == stream && k.task.0 < partitions) {
                    owner[task.task.0 as usize] = Some(addr);
                }
                if s.restarting {
                    why.push(format!("{addr} is restarting its stream"));
                }
            }
            Err(e) => why.push(e),
        }
    }
    Ok((owner, why))
}

/// Runs `weir load`.
#[allow(clippy::print_stdout)]
pub fn run(args: &LoadArgs) -> anyhow::Result<ExitCode> {
    let target = args.cluster.target()?;
    let ingest = target.file.as_ref().and_then(|f| f.streams().into_iter().find(|s| s.is_ingest()));
    // A stream the command names: its catalog entry, when a node keeps one (an error for a
    // name no catalog lists).
    let (named, entry) = match &args.stream {
        Some(r) => crate::client::resolve(&target, r, Duration::from_secs(3)).map(|(id, e)| (Some(id), e))?,
        None => (None, None),
    };
    let stream = match (named, &ingest) {
        (Some(id), _) => StreamId(id),
        (None, Some(s)) => StreamId(s.id),
        (None, None) => bail!("which stream? pass --stream NAME|ID (the config has no ingest-log stream)"),
    };
    let file_stream = target.file.as_ref().and_then(|f| f.streams().into_iter().find(|s| s.id == stream.0));
    // A created stream's spec is the catalog's.
    let created = entry.filter(|e| !e.spec.is_empty()).and_then(|e| crate::config::parse_stream_doc(&e.spec).ok());
    let partitions = match (args.partitions, &file_stream, &created) {
        (Some(p), _, _) => p,
        (None, Some(s), _) => s.partitions,
        (None, None, Some(s)) => s.partitions,
        (None, None, None) => {
            bail!("how many partitions? pass --partitions N (stream {} is not in a --config)", stream.0)
        }
    };
    if partitions == 0 {
        bail!("--partitions must be at least 1");
    }
    let window = match (&target.file, &file_stream) {
        (Some(f), Some(_)) => Some(crate::settings::stream_spec(f)?.window),
        _ => None,
    };
    let duration = match (args.events, args.duration) {
        (None, None) => Some(Duration::from_secs(10)),
        (_, d) => d,
    };
    let per_partition_rate = args.rate.map(|r| r / partitions as u64);
    let rows_per_ms = args.rows_per_ms.unwrap_or_else(|| per_partition_rate.map_or(1000, |r| (r / 1000).max(1)));
    let owners = owners(&target, stream, partitions, args.timeout)?;
    // Earlier loads of the stream: this one starts after their last windows.
    let earlier = crate::loads::loads(&target, stream, &owners)?;
    let before: Vec<u64> = earlier.iter().map(|l| l.iter().map(|x| x.rows).sum()).collect();
    let earlier_end = match window {
        Some(w) => earlier
            .iter()
            .enumerate()
            .flat_map(|(p, l)| l.iter().map(move |x| x.end(p as u32, w)))
            .max()
            .unwrap_or(i64::MIN),
        None => earlier.iter().flatten().filter_map(|x| x.ended).max().unwrap_or(i64::MIN),
    };
    // Event time starts now, when sending does (an idle partition's watermark follows the wall
    // clock, and rows behind it would be late), and after every earlier load's last window.
    let wall_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).context("clock before 1970")?.as_millis();
    let wall_ms = (wall_ms as i64).max(earlier_end);
    let generator = GeneratorSpec {
        seed: args.seed,
        keys: args.keys,
        rows_per_ms,
        out_of_order: args.out_of_order,
        max_disorder_ms: args.max_disorder.as_millis() as i64,
        // Event time starts at the wall clock (and with the rate's rows per ms moves with it).
        ts_start: wall_ms,
    };
    generator.validate()?;
    let mut producer = [0u8; 8];
    getrandom::fill(&mut producer).map_err(|e| anyhow::anyhow!("no randomness for the producer id: {e}"))?;
    let started = SystemTime::now();
    let plan = Arc::new(Plan {
        stream,
        partitions,
        producer: u64::from_le_bytes(producer),
        generator,
        batch: args.batch as usize,
        in_flight: args.in_flight as usize,
        rate: args.rate,
        events: args.events,
        duration,
        start: Instant::now(),
        timeout: args.timeout,
        ack_timeout: args.timeout.min(Duration::from_secs(10)),
        window,
        description: crate::loads::Description::of(&generator).encode(),
        before,
    });
    let target = Arc::new(target);
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot handle signals")?;
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut nodes: Vec<SocketAddr> = owners.clone();
    nodes.sort();
    nodes.dedup();
    let drivers: Vec<_> = nodes
        .iter()
        .map(|&node| {
            Driver {
                node,
                partitions: (0..partitions).filter(|p| owners[*p as usize] == node).collect(),
                plan: plan.clone(),
                target: target.clone(),
                counters: counters.clone(),
                reports: tx.clone(),
                stop: stop.clone(),
            }
            .spawn()
        })
        .collect();
    drop(tx);
    let mut latency = latency::Latency::new(args.hdr_log.as_deref(), started)?;
    let mut measure = match (args.measure_results, plan.window) {
        (true, Some(w)) => Some(to_result::Measure::start(target.clone(), target.nodes.clone(), stream, w)),
        (true, None) => bail!("--measure-results needs the stream's window: pass --config"),
        (false, _) => None,
    };
    let bar = progress::Bar::new(plan.events, duration);
    let mut acked_rows = 0u64;
    let mut results: Vec<Acked> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut pending = drivers.len();
    let mut next_interval = Duration::from_secs(1);
    let mut last_p99 = 0;
    while pending > 0 {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Report::Acked { partition, seq, rows, latency: l, at }) => {
                acked_rows += rows;
                latency.record(l, rows);
                if let Some(m) = &mut measure {
                    m.acked(&plan, partition, seq, rows, at);
                }
            }
            Ok(Report::Done { node, result }) => {
                pending -= 1;
                match result {
                    Ok(r) => results.extend(r),
                    Err(e) => errors.push(format!("{node}: {e}")),
                }
            }
            Err(_) => {}
        }
        let elapsed = plan.start.elapsed();
        if elapsed >= next_interval {
            last_p99 = latency.end_interval(elapsed)?;
            next_interval += Duration::from_secs(1);
        }
        bar.update(&counters, acked_rows, elapsed, last_p99);
    }
    let elapsed = plan.start.elapsed();
    latency.end_interval(elapsed)?;
    bar.finish();
    for d in drivers {
        let _ = d.join();
    }
    results.sort_by_key(|a| a.partition);
    // Every window of the load closes with its end-of-load markers: wait for their results.
    let to_result = measure.map(|m| {
        let window = plan.window.expect("measured with a window");
        m.finish(Duration::from_millis(window.size_ms.max(0) as u64 * 3) + Duration::from_secs(15))
    });
    if let Some((_, missing)) = &to_result
        && *missing > 0
    {
        errors.push(format!("{missing} window(s) of the load's rows showed no result in time"));
    }
    // Exactly the rows meant, each once (with --events; with a duration: every row sent).
    for a in &results {
        if let Some(want) = plan.rows_of(a.partition)
            && a.rows != want
        {
            errors.push(format!("partition {}: {} rows acknowledged, {want} meant", a.partition, a.rows));
        }
    }
    let summary = summary::Summary {
        plan: &plan,
        elapsed,
        acked_rows,
        counters: &counters,
        latency: &latency.total,
        partitions: &results,
        errors: &errors,
        nodes: &nodes,
        to_result: to_result.as_ref().map(|(h, _)| h),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary.json()).expect("json"));
    } else {
        summary.print();
    }
    Ok(if errors.is_empty() && !stop.load(Ordering::Relaxed) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

mod progress;
mod summary;
mod to_result;
