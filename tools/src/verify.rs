//! `weir verify`: recomputes a generator stream's window results from the generator's
//! parameters (the config file's), reads what every node's result stores hold over the wire
//! protocol, page by page, and compares them row by row. Exit code 0 only on an exact match.
//!
//! For a bounded stream that has ended on every node (every task reports `stopped`): every
//! result. For a running stream (endless, or not ended yet): the windows its last commit closed,
//! from the commit record's source offsets (rows in order only: a window every partition has
//! passed holds exactly the rows before the offsets), read again a few times before a mismatch
//! counts (the sinks may still be writing the windows the commit closed).
//!
//! For an ingest-log stream: the rows every `weir load` sent it, as the partitions' ledgers on
//! the nodes record them ([`crate::loads`]), in the windows their watermarks have closed.
//!
//! Each task counts once, on the node that reports it: after a lost node's tasks moved to the
//! survivors, that node may be down or idle, and the results are read from the nodes that run
//! tasks. Two nodes reporting one task is an error (they run different placements).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use weir_engine::operator::window::WindowResult;
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::TaskState;

use crate::client::Target;

/// Options of `weir verify`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  \
    weir verify --config examples/three-node.toml\n  \
    weir verify --config examples/load-three-node.toml --stream 2\n  \
    WEIR_CLUSTER_SECRET=... weir verify --node 10.0.0.5:7111 --cluster lab --stream 2\n\n\
    A running generator stream is compared up to its last commit (the windows it closed). An \
    ingest-log stream is compared with the rows every weir load sent it, as its nodes recorded \
    them, in the windows closed so far.\n\n\
    Exit codes: 0 every result is exactly the expected one, 1 a mismatch (the first ones are \
    printed), 2 an error (a node down or restarting, no commit yet).")]
pub struct VerifyArgs {
    /// The cluster: `--config` (needed for a generator stream: its parameters are in it), or,
    /// for an ingest-log stream, `--node` (each node that runs it) with `--stream`.
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// The stream (its id; default: the config's; another is an error).
    #[arg(long, value_name = "ID")]
    stream: Option<u64>,
    /// Mismatches printed at most.
    #[arg(long, default_value_t = 10)]
    show: usize,
}

const ASK: Duration = Duration::from_secs(10);

/// Every result of `stream` on the nodes `at`, sorted by (key, window start).
fn found(t: &Target, at: &[SocketAddr], stream: StreamId) -> anyhow::Result<Vec<WindowResult>> {
    let mut out = Vec::new();
    for addr in at {
        crate::results::pages(t, *addr, stream, |page| out.extend(page.iter().map(WindowResult::from)))?;
    }
    out.sort_by_key(|r| (r.key, r.start));
    Ok(out)
}

fn row(r: &WindowResult) -> String {
    format!("count {} sum {} min {} max {}", r.count, r.sum, r.min, r.max)
}

/// Runs `weir verify`.
#[allow(clippy::print_stdout)]
pub fn run(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    let spec = match (&t.file, args.stream) {
        (Some(file), s) => {
            let spec = crate::node::stream_spec(file)?;
            if let Some(s) = s.filter(|s| *s != spec.id.0) {
                bail!(
                    "the config's stream is {}, not {s}: pass the --config of the cluster that runs stream {s}",
                    spec.id.0
                );
            }
            spec
        }
        (None, Some(s)) => spec_from_nodes(&t, StreamId(s))?,
        (None, None) => bail!("which stream? pass --stream ID (and --node ADDR), or --config FILE"),
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
        let rsp = match crate::client::status(&t, *addr, ASK)? {
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
    if matches!(spec.source, weir_engine::spec::SourceKind::IngestLog) {
        let owners: Vec<SocketAddr> = sources.into_values().collect();
        return ingested(args, &t, &serving, &owners, &spec);
    }
    let Some(file) = &t.file else {
        bail!("stream {} is a generator stream: its generator's parameters are in its --config FILE", stream.0)
    };
    if !running.is_empty() || !bounded {
        return committed(args, &t, &serving, file, &spec);
    }
    let want = weir_engine::reference::bounded_results(&spec).expect("a bounded generator");
    let got = found(&t, &serving, stream)?;
    let bad = compare(&want, &got, args.show);
    if bad == 0 {
        println!(
            "stream {}: all {} window results match the generator's, from {} nodes",
            stream.0,
            got.len(),
            serving.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "stream {}: {bad} of {} expected results differ or are missing ({} found)",
            stream.0,
            want.len(),
            got.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// The stream's shape as the nodes report it (no config file: `--node` and `--stream`). Only an
/// ingest-log stream is known this way whole: a generator's parameters are in its config.
fn spec_from_nodes(t: &Target, stream: StreamId) -> anyhow::Result<weir_engine::spec::StreamSpec> {
    let mut why = Vec::new();
    for addr in &t.nodes {
        match crate::client::status(t, *addr, ASK)? {
            Ok(rsp) => match rsp.stream.filter(|i| i.stream == stream) {
                Some(i) => {
                    let mut spec = weir_engine::spec::StreamSpec::generator(stream, i.partitions, i.aggs, i.sinks);
                    spec.name = i.name;
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
#[allow(clippy::print_stdout)]
fn ingested(
    args: &VerifyArgs,
    t: &Target,
    serving: &[SocketAddr],
    owners: &[SocketAddr],
    spec: &weir_engine::spec::StreamSpec,
) -> anyhow::Result<ExitCode> {
    let loads = crate::loads::loads(t, spec.id, owners)?;
    if let Some(l) = loads.iter().flatten().find(|l| l.generator.max_disorder_ms > spec.watermark_delay_ms) {
        bail!(
            "load {:#x} sent rows up to {} ms out of order, past stream {}'s watermark delay of {} ms:              which of them were late depends on timing, and verify cannot tell",
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
                let g = weir_engine::operator::generator::Generator::new(last.generator, p as u32);
                g.max_ts_before(last.rows).saturating_sub(spec.watermark_delay_ms)
            }
        })
        .min()
        .unwrap_or(i64::MIN);
    let in_closed = |r: &WindowResult| r.start.saturating_add(w.size_ms) <= closed;
    let all = loads.iter().enumerate().flat_map(|(p, l)| {
        l.iter().flat_map(move |x| {
            let g = weir_engine::operator::generator::Generator::new(x.generator, p as u32);
            (0..x.rows).map(move |o| g.row(o))
        })
    });
    let want: Vec<WindowResult> =
        weir_engine::reference::window_results(w, all).into_iter().filter(in_closed).collect();
    let open = want.is_empty() || closed == i64::MIN;
    let per_partition: Vec<String> = loads.iter().map(|l| l.iter().map(|x| x.rows).sum::<u64>().to_string()).collect();
    // The sinks may still be writing the last windows: a few reads before a mismatch counts.
    let mut tries = 0;
    loop {
        let got: Vec<WindowResult> = found(t, serving, spec.id)?.into_iter().filter(in_closed).collect();
        let last = tries == 10;
        let bad = compare(&want, &got, if last { args.show } else { 0 });
        if bad == 0 && !open {
            println!(
                "stream {} (ingest): all {} results match the {rows} rows of {count} load(s) (per partition: {}), from {} nodes",
                spec.id.0,
                got.len(),
                per_partition.join(", "),
                serving.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if open {
            bail!(
                "stream {}: no window of its {rows} rows has closed yet (a partition without rows, or loads still running)",
                spec.id.0
            );
        }
        if last {
            println!(
                "stream {} (ingest): {bad} of {} expected results differ or are missing ({} found; {rows} rows of {count} load(s))",
                spec.id.0,
                want.len(),
                got.len()
            );
            return Ok(ExitCode::from(1));
        }
        tries += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A running stream: the windows its last commit closed.
#[allow(clippy::print_stdout)]
fn committed(
    args: &VerifyArgs,
    t: &Target,
    serving: &[SocketAddr],
    file: &crate::config::ClusterFile,
    spec: &weir_engine::spec::StreamSpec,
) -> anyhow::Result<ExitCode> {
    let weir_engine::spec::SourceKind::Generator { spec: g, .. } = &spec.source else {
        bail!("stream {} has no generator source", spec.id.0)
    };
    if g.out_of_order > 0.0 {
        bail!("stream {} is running and its rows come out of order: verify compares it once it has ended", spec.id.0);
    }
    let (url, store) = crate::node::remote_store(file)?;
    let record = weir_engine::backup::commit::last_commit(store.as_ref(), spec.id)
        .with_context(|| format!("reading stream {}'s last commit from {url}", spec.id.0))?;
    let Some(record) = record.filter(|r| !r.versions.is_empty()) else {
        bail!("stream {} is running and has no commit with source offsets yet: try again later", spec.id.0)
    };
    let offsets: Vec<u64> =
        (0..spec.partitions).map(|p| record.versions.get(&weir_engine::wire::TaskId(p)).map_or(0, |v| v.0)).collect();
    // Every partition has passed `closed`: the windows ending there hold rows before the offsets only.
    let progress = offsets
        .iter()
        .enumerate()
        .map(|(p, o)| weir_engine::operator::generator::Generator::new(*g, p as u32).max_ts_before(*o))
        .min()
        .unwrap_or(i64::MIN);
    let closed = progress.saturating_sub(spec.watermark_delay_ms);
    let size = spec.window.size_ms;
    let in_closed = |r: &WindowResult| r.start.saturating_add(size) <= closed;
    let want: Vec<WindowResult> = weir_engine::reference::generator_results(spec, &offsets)
        .expect("a generator stream")
        .into_iter()
        .filter(in_closed)
        .collect();
    let mut tries = 0;
    loop {
        let got: Vec<WindowResult> = found(t, serving, spec.id)?.into_iter().filter(in_closed).collect();
        let last = tries == 3;
        let bad = compare(&want, &got, if last { args.show } else { 0 });
        if bad == 0 {
            println!(
                "stream {} (running): all {} results of the windows its last commit ({}) closed match the generator's, from {} nodes",
                spec.id.0,
                got.len(),
                record.id,
                serving.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if last {
            println!(
                "stream {} (running): {bad} of {} expected results of the windows {} closed differ or are missing ({} found)",
                spec.id.0,
                want.len(),
                record.id,
                got.len()
            );
            return Ok(ExitCode::from(1));
        }
        tries += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Compares `want` with `got` (both sorted by key and window), printing the first `show`
/// differences; returns how many there are.
#[allow(clippy::print_stdout)]
fn compare(want: &[WindowResult], got: &[WindowResult], show_at_most: usize) -> usize {
    let (mut i, mut j, mut bad, mut shown) = (0, 0, 0usize, 0);
    let mut show = |what: String| {
        if shown < show_at_most {
            println!("{what}");
            shown += 1;
        }
    };
    while i < want.len() || j < got.len() {
        let order = match (want.get(i), got.get(j)) {
            (Some(w), Some(g)) => (w.key, w.start).cmp(&(g.key, g.start)),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                show(format!(
                    "key {} window {}: expected {}, found nothing",
                    want[i].key,
                    want[i].start,
                    row(&want[i])
                ));
                (i, bad) = (i + 1, bad + 1);
            }
            std::cmp::Ordering::Greater => {
                show(format!("key {} window {}: expected nothing, found {}", got[j].key, got[j].start, row(&got[j])));
                (j, bad) = (j + 1, bad + 1);
            }
            std::cmp::Ordering::Equal => {
                if want[i] != got[j] {
                    show(format!(
                        "key {} window {}: expected {}, found {}",
                        want[i].key,
                        want[i].start,
                        row(&want[i]),
                        row(&got[j])
                    ));
                    bad += 1;
                }
                (i, j) = (i + 1, j + 1);
            }
        }
    }
    bad
}
