//! `weir verify`: recomputes a stream's window results from the generator's parameters and
//! compares them row by row with what every node's result stores hold, read over the wire
//! protocol page by page. Exit code 0 only on an exact match.
//!
//! Which rows: for a bounded generator stream that has ended on every node (every task reports
//! `stopped`), all of them. For a running one (endless, or not ended yet), those before its last
//! commit's source offsets (rows in order only: a window every partition has passed holds
//! exactly the rows before the offsets), read again a few times before a mismatch counts (the
//! sinks may still be writing the windows the commit closed). For an ingest-log stream, the rows
//! every `weir load` sent it, as the partitions' ledgers on the nodes record them
//! ([`crate::loads`]).
//!
//! Which windows ([`select`]): by default those that closed in the last `--since` of event time
//! and `--sample` older ones chosen with a seed it prints; with `--all`, every closed window. The
//! work follows the windows chosen, not the stream's age ([`check`]), and runs at a lower CPU
//! priority than the nodes, which may share its cores.
//!
//! Each task counts once, on the node that reports it: after a lost node's tasks moved to the
//! survivors, that node may be down or idle, and the results are read from the nodes that run
//! tasks. Two nodes reporting one task is an error (they run different placements).

mod check;
mod select;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use weir_engine::operator::generator::Generator;
use weir_engine::spec::{SourceKind, StreamSpec};
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::TaskState;

use crate::client::Target;
use check::{Check, Outcome};
use select::{Scope, first_start, last_closed_start};

/// Options of `weir verify`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  \
    weir verify --config examples/three-node.toml\n  \
    weir verify --config examples/load-three-node.toml --stream 2\n  \
    weir verify --config examples/three-node.toml --since 10m --sample 20 --seed 7\n  \
    weir verify --config examples/three-node.toml --all\n  \
    WEIR_CLUSTER_SECRET=... weir verify --node 10.0.0.5:7111 --cluster lab --stream 2\n\n\
    A running generator stream is compared up to its last commit (the windows it closed). An \
    ingest-log stream is compared with the rows every weir load sent it, as its nodes recorded \
    them, in the windows closed so far. By default the windows that closed in the last minute \
    of event time are checked, and 3 older ones chosen at random (the seed is printed: --seed \
    repeats the choice); --all checks every closed window.\n\n\
    Exit codes: 0 every result is exactly the expected one, 1 a mismatch (the first ones are \
    printed), 2 an error (a node down or restarting, no commit yet).")]
pub struct VerifyArgs {
    /// The cluster: `--config` (needed for a generator stream: its parameters are in it), or,
    /// for an ingest-log stream, `--node` (each node that runs it) with `--stream`.
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// The stream: its name or id (default: the config's).
    #[arg(long, value_name = "NAME|ID", value_parser = crate::client::parse_stream_ref)]
    stream: Option<crate::client::StreamRef>,
    /// Mismatches printed at most.
    #[arg(long, default_value_t = 10)]
    show: usize,
    /// Check the windows that closed within this much event time of the last closed one.
    #[arg(long, default_value = "1m", value_parser = crate::config::parse_duration, conflicts_with = "all")]
    since: Duration,
    /// Also check this many older windows, chosen at random.
    #[arg(long, default_value_t = 3, conflicts_with = "all")]
    sample: usize,
    /// Seed of the sample (default: a random one, printed).
    #[arg(long, conflicts_with = "all")]
    seed: Option<u64>,
    /// Check every closed window (with a progress bar and an estimate of the time left).
    #[arg(long)]
    all: bool,
}

impl VerifyArgs {
    fn scope(&self) -> anyhow::Result<Scope> {
        if self.all {
            return Ok(Scope::All);
        }
        let seed = match self.seed {
            Some(s) => s,
            None => {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("choosing a seed: {e}"))?;
                u64::from_le_bytes(b) % 1_000_000
            }
        };
        Ok(Scope::Recent { since_ms: self.since.as_millis().min(i64::MAX as u128) as i64, sample: self.sample, seed })
    }
}

const ASK: Duration = Duration::from_secs(10);

/// Runs `weir verify`.
#[allow(clippy::print_stdout)]
pub fn run(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    weir_engine::lower_priority();
    let t = args.cluster.target()?;
    // A stream of the catalog: its spec is the catalog's (the file's, for the file's stream).
    let (id, entry) = match &args.stream {
        Some(r) => crate::client::resolve(&t, r, ASK).map(|(id, e)| (Some(id), e))?,
        None => (None, None),
    };
    let spec = match (&t.file, id, entry) {
        (Some(file), _, Some(e)) => crate::settings::spec_of(&file.stream_of(&e)?)?,
        (None, _, Some(e)) if !e.spec.is_empty() => {
            let mut s = crate::config::parse_stream_doc(&e.spec)?;
            (s.id, s.name) = (e.id.0, Some(e.name.clone()));
            crate::settings::spec_of(&s)?
        }
        (Some(file), s, None) => {
            let spec = crate::settings::stream_spec(file)?;
            if let Some(s) = s.filter(|s| *s != spec.id.0) {
                bail!(
                    "the config's stream is {}, not {s}: pass the --config of the cluster that runs stream {s}",
                    spec.id.0
                );
            }
            spec
        }
        (None, Some(s), _) => spec_from_nodes(&t, StreamId(s))?,
        (None, None, _) => bail!("which stream? pass --stream NAME|ID (and --node ADDR), or --config FILE"),
    };
    let stream = spec.id;
    let bounded = matches!(&spec.source, weir_engine::spec::SourceKind::Generator { limit: Some(_), .. });
    // Every task of the stream, reported by its node (once: a node that is down or idle may
    // have had its tasks moved to the others), has ended.
    let mut running = Vec::new();
    let mut reported: BTreeMap<u32, u32> = BTreeMap::new();
    // The node each source runs on (source tasks are 0..partitions).
    let mut sources: BTreeMap<u32, SocketAddr> = BTreeMap::new();
    let (mut down, mut serving) = (Vec::new(), Vec::new());
    for addr in &t.nodes {
        let rsp = match crate::client::status_of(&t, *addr, Some(stream), ASK)? {
            Ok(rsp) => rsp,
            Err(why) => {
                down.push(format!("{addr} is down: {why}"));
                continue;
            }
        };
        if rsp.restarting {
            bail!("stream {} has not ended: node {} is restarting it", stream.0, rsp.node.0);
        }
        let mine: Vec<_> = rsp.tasks.iter().filter(|x| x.stream == stream).collect();
        if !mine.is_empty() {
            serving.push(*addr);
        }
        for task in mine {
            if let Some(other) = reported.insert(task.task.0, rsp.node.0) {
                bail!(
                    "task {} of stream {} is reported by node {other} and node {}: they run different placements (one may be restarting; try again)",
                    task.task.0,
                    stream.0,
                    rsp.node.0
                );
            }
            if task.task.0 < spec.partitions {
                sources.insert(task.task.0, *addr);
            }
            if task.state != TaskState::Stopped {
                running.push(task.task.0.to_string());
            }
        }
    }
    let tasks = spec.topology().tasks.len();
    if reported.len() < tasks {
        if !down.is_empty() {
            bail!("the nodes up report {} of stream {}'s {tasks} tasks; {}", reported.len(), stream.0, down.join("; "));
        }
        bail!(
            "the nodes asked report {} of stream {}'s {tasks} tasks: ask every node (or use --config alone)",
            reported.len(),
            stream.0
        );
    }
    if matches!(spec.source, SourceKind::IngestLog) {
        let owners: Vec<SocketAddr> = sources.into_values().collect();
        return ingested(args, &t, &serving, &owners, &spec);
    }
    if !running.is_empty() || !bounded {
        // What the last commit closed: read from the remote store the config names.
        let Some(file) = &t.file else {
            bail!(
                "stream {} runs on: verifying up to its last commit reads the remote store of its --config FILE",
                stream.0
            )
        };
        return committed(args, &t, &serving, file, &spec);
    }
    let SourceKind::Generator { spec: g, limit: Some(limit), .. } = &spec.source else { unreachable!("bounded") };
    let segments: Vec<_> = (0..spec.partitions).map(|p| (Generator::new(*g, p), 0..*limit)).collect();
    // Ended: every window is closed, the last one holding the latest row.
    let latest = segments.iter().map(|(g, r)| g.max_ts_before(r.end)).max().unwrap_or(i64::MIN);
    let last = last_closed_start(spec.window, latest.saturating_add(spec.window.size_ms));
    let what = format!("stream {} (ended)", stream.0);
    let Some(bounds) = closed_bounds(&spec, &segments, last, true) else {
        bail!("stream {} ended without a row", stream.0)
    };
    report(args, &t, &serving, &spec, segments, bounds, 0, &what, "the generator's", "the end of its rows")
}

/// The first window any row of `segments` can fall in, `last`, the last closed one, and whether
/// the stream has `ended`, when some window has closed.
fn closed_bounds(
    spec: &StreamSpec,
    segments: &[(Generator, std::ops::Range<u64>)],
    last: Option<i64>,
    ended: bool,
) -> Option<(i64, i64, bool)> {
    let last = last?;
    let first = first_start(spec.window, segments.iter().map(|(g, _)| g.min_ts()).min()?)?;
    (first <= last).then_some((first, last, ended))
}

/// Checks the windows of `spec` that `args` chose among those closed up to `last` (a window
/// start), reading again up to `tries` times before a mismatch counts, and prints the outcome.
#[allow(clippy::print_stdout, clippy::too_many_arguments)]
fn report(
    args: &VerifyArgs,
    t: &Target,
    serving: &[SocketAddr],
    spec: &StreamSpec,
    segments: Vec<(Generator, std::ops::Range<u64>)>,
    (first, last, ended): (i64, i64, bool),
    tries: u32,
    what: &str,
    source: &str,
    up_to: &str,
) -> anyhow::Result<ExitCode> {
    let w = spec.window;
    let scope = args.scope()?;
    let plan = select::plan(w, first, last, scope);
    let check = Check { t, serving, stream: spec.id, w, segments, tries, show: args.show };
    let Outcome { windows, want, found, bad, rows } = check.run(&plan, first, last, ended)?;
    let which = match scope {
        Scope::All => format!("every window closed up to {up_to} ({windows})"),
        Scope::Recent { seed, .. } => {
            let recent = windows - plan.sampled.len() as u64;
            let since = humantime::format_duration(args.since);
            let older = plan.closed - recent;
            let sampled = if older == 0 {
                String::new()
            } else {
                format!(" and {} of the {older} older ones, sampled with --seed {seed}", plan.sampled.len())
            };
            format!(
                "the {recent} windows closed in the last {since} of event time up to {up_to}{sampled} (--all checks all {})",
                plan.closed
            )
        }
    };
    if bad == 0 {
        println!(
            "{what}: all {found} window results match {source}, from {} nodes; checked {which}, {rows} rows recomputed",
            serving.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "{what}: {bad} of {want} expected results differ or are missing ({found} found) against {source}; checked {which}"
        );
        Ok(ExitCode::from(1))
    }
}

/// The stream's shape as the nodes report it (no config file: `--node` and `--stream`). Only an
/// ingest-log stream is known this way whole: a generator's parameters are in its config.
fn spec_from_nodes(t: &Target, stream: StreamId) -> anyhow::Result<weir_engine::spec::StreamSpec> {
    let mut why = Vec::new();
    for addr in &t.nodes {
        match crate::client::status_of(t, *addr, Some(stream), ASK)? {
            Ok(rsp) => match rsp.stream.filter(|i| i.stream == stream) {
                Some(i) => {
                    let mut spec = weir_engine::spec::StreamSpec::generator(stream, i.partitions, i.aggs, i.sinks);
                    spec.name = i.name;
                    spec.first_agg_task = Some(i.first_agg_task);
                    spec.window = weir_engine::operator::window::WindowSpec::hopping(i.window_ms, i.slide_ms);
                    spec.watermark_delay_ms = i.watermark_delay_ms;
                    if !i.ingest {
                        bail!(
                            "stream {} is a generator stream: its generator's parameters are in its --config FILE",
                            stream.0
                        );
                    }
                    spec.source = weir_engine::spec::SourceKind::IngestLog;
                    return Ok(spec);
                }
                None => why.push(format!("{addr} does not run stream {}", stream.0)),
            },
            Err(e) => why.push(format!("{addr} is down: {e}")),
        }
    }
    bail!("no node asked runs stream {}: {}", stream.0, why.join("; "))
}

/// An ingest-log stream: the rows every `weir load` sent it, from the partitions' ledgers (see
/// [`crate::loads`]), in the windows their watermarks closed: for a partition whose last load
/// ended, its end-of-load marker; otherwise its last row less the watermark delay.
fn ingested(
    args: &VerifyArgs,
    t: &Target,
    serving: &[SocketAddr],
    owners: &[SocketAddr],
    spec: &StreamSpec,
) -> anyhow::Result<ExitCode> {
    let loads = crate::loads::loads(t, spec.id, owners)?;
    if let Some(l) = loads.iter().flatten().find(|l| l.generator.max_disorder_ms > spec.watermark_delay_ms) {
        bail!(
            "load {:#x} sent rows up to {} ms out of order, past stream {}'s watermark delay of {} ms: \
             which of them were late depends on timing, and verify cannot tell",
            l.producer,
            l.generator.max_disorder_ms,
            spec.id.0,
            spec.watermark_delay_ms
        );
    }
    let rows: u64 = loads.iter().flatten().map(|l| l.rows).sum();
    let count = loads.iter().flatten().map(|l| l.producer).collect::<std::collections::BTreeSet<_>>().len();
    if rows == 0 {
        bail!("stream {} holds no rows of weir load yet: nothing to verify", spec.id.0);
    }
    let w = spec.window;
    let closed = loads
        .iter()
        .enumerate()
        .map(|(p, l)| match l.last() {
            None => i64::MIN,
            Some(last) if last.ended.is_some() => last.end(p as u32, w),
            Some(last) => {
                let g = Generator::new(last.generator, p as u32);
                g.max_ts_before(last.rows).saturating_sub(spec.watermark_delay_ms)
            }
        })
        .min()
        .unwrap_or(i64::MIN);
    let segments: Vec<_> = loads
        .iter()
        .enumerate()
        .flat_map(|(p, l)| l.iter().map(move |x| (Generator::new(x.generator, p as u32), 0..x.rows)))
        .collect();
    let Some(bounds) = closed_bounds(spec, &segments, last_closed_start(w, closed), false) else {
        bail!(
            "stream {}: no window of its {rows} rows has closed yet (a partition without rows, or loads still running)",
            spec.id.0
        );
    };
    let per_partition: Vec<String> = loads.iter().map(|l| l.iter().map(|x| x.rows).sum::<u64>().to_string()).collect();
    let what = format!("stream {} (ingest)", spec.id.0);
    let source = format!("the {rows} rows of {count} load(s) (per partition: {})", per_partition.join(", "));
    report(args, t, serving, spec, segments, bounds, 10, &what, &source, "the partitions' watermarks")
}

/// A running generator stream: the windows its last commit closed.
fn committed(
    args: &VerifyArgs,
    t: &Target,
    serving: &[SocketAddr],
    file: &crate::config::ClusterFile,
    spec: &StreamSpec,
) -> anyhow::Result<ExitCode> {
    let SourceKind::Generator { spec: g, .. } = &spec.source else {
        bail!("stream {} has no generator source", spec.id.0)
    };
    if g.out_of_order > 0.0 {
        bail!("stream {} is running and its rows come out of order: verify compares it once it has ended", spec.id.0);
    }
    let (url, store) = crate::settings::remote_store(file)?;
    let record = crate::placement::commit_reader(file, spec.id)?
        .last(store.as_ref())
        .with_context(|| format!("reading stream {}'s last commit from {url}", spec.id.0))?;
    let Some(record) = record.filter(|r| !r.versions.is_empty()) else {
        bail!("stream {} has no commit with source offsets in {url} yet: if it is running, try again later", spec.id.0)
    };
    let segments: Vec<_> = (0..spec.partitions)
        .map(|p| {
            let offset = record.versions.get(&weir_engine::wire::TaskId(p)).map_or(0, |v| v.0);
            (Generator::new(*g, p), 0..offset)
        })
        .collect();
    // Every partition has passed `closed`: the windows ending there hold rows before the offsets only.
    let progress = segments.iter().map(|(g, r)| g.max_ts_before(r.end)).min().unwrap_or(i64::MIN);
    let last = last_closed_start(spec.window, progress.saturating_sub(spec.watermark_delay_ms));
    let Some(bounds) = closed_bounds(spec, &segments, last, false) else {
        bail!(
            "stream {} has no commit that closed a window yet (its last, {}, closed none): try again later",
            spec.id.0,
            record.id
        )
    };
    let what = format!("stream {} (running)", spec.id.0);
    let up_to = format!("its last commit ({})", record.id);
    report(args, t, serving, spec, segments, bounds, 3, &what, "the generator's", &up_to)
}
