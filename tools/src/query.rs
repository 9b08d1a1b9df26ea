//! `weir query`: a stream's window results from every node's result stores, over the wire
//! protocol, streamed: each page (up to 50,000 results) is filtered and printed before the next
//! is asked for, so a result set of any size goes through in bounded memory.
//!
//! Order: node by node (the nodes that report tasks of the stream), store by store, and within
//! a store by window start, then the series' order within the window (the stores' own order;
//! sorting by key would need the whole set). Filters apply on the client: every page is read.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::ResultRow;

/// Options of `weir query`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    weir query --config examples/three-node.toml --key 42\n  \
    weir query --config examples/load-three-node.toml --from 2026-12-03T10:00:00Z --to 2026-12-03T10:05:00Z --csv > r.csv\n  \
    WEIR_CLUSTER_SECRET=... weir query --node 10.0.0.5:7101 --cluster lab --stream 2 --json\n\n\
    Exit codes: 0 every node that runs the stream answered, 1 one did not (what the others hold \
    was printed; a node that is down counts only when the others do not run every sink of the \
    stream, i.e. its tasks have not moved), 2 an error (a refused secret, no such stream).")]
pub struct QueryArgs {
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// The stream: its name or id (default: the config's).
    #[arg(long, value_name = "NAME|ID", value_parser = crate::client::parse_stream_ref)]
    stream: Option<crate::client::StreamRef>,
    /// Only this series key.
    #[arg(long)]
    key: Option<u64>,
    /// Only windows starting at or after this: ms since the epoch, or a time like
    /// `2026-12-03T10:00:00Z`.
    #[arg(long, value_parser = parse_time)]
    from: Option<i64>,
    /// Only windows starting before this (same forms as `--from`).
    #[arg(long, value_parser = parse_time)]
    to: Option<i64>,
    /// Print CSV (a header, then a row per result).
    #[arg(long, conflicts_with = "json")]
    csv: bool,
    /// Print JSON lines (an object per result).
    #[arg(long)]
    json: bool,
}

/// Milliseconds since the epoch, or an RFC 3339 time.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.trim().parse::<i64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s.trim())
        .map_err(|e| format!("{s:?} is neither ms since the epoch nor a time like 2026-12-03T10:00:00Z: {e}"))?;
    let d = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{s:?} is before 1970"))?;
    Ok(d.as_millis() as i64)
}

fn start_time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
        Err(_) => ms.to_string(),
    }
}

/// Runs `weir query`.
pub fn run(args: &QueryArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    let named = args.stream.as_ref().map(|r| crate::client::stream_id(&t, r, Duration::from_secs(3))).transpose()?;
    let stream = match (named, &t.file) {
        (Some(s), _) => StreamId(s),
        (None, Some(f)) => StreamId(f.stream.id),
        (None, None) => bail!("which stream? pass --stream NAME|ID or --config FILE"),
    };
    // The nodes that run tasks of the stream hold its results.
    let mut serving = Vec::new();
    let mut missing = Vec::new();
    let mut down = Vec::new();
    let mut sinks_seen = std::collections::BTreeSet::new();
    let mut sinks = None;
    for &addr in &t.nodes {
        match crate::client::status_of(&t, addr, Some(stream), Duration::from_secs(3))? {
            Ok(s) if s.tasks.iter().any(|k| k.stream == stream) => {
                if let Some(i) = s.stream.as_ref().filter(|i| i.stream == stream) {
                    let first_sink = i.first_agg_task + i.aggs;
                    sinks = Some(i.sinks);
                    sinks_seen.extend(
                        s.tasks.iter().filter(|k| k.stream == stream && k.task.0 >= first_sink).map(|k| k.task),
                    );
                }
                serving.push(addr);
            }
            Ok(s) if s.restarting => missing.push(format!("{addr} is restarting the stream")),
            Ok(_) => {}
            Err(why) => down.push(format!("{addr} is down: {why}")),
        }
    }
    // A node that is down counts as missing unless the others run every sink (its tasks moved).
    if sinks.is_none_or(|n| sinks_seen.len() < n as usize) {
        missing.extend(down);
    }
    if serving.is_empty() && missing.is_empty() {
        bail!("no node asked runs stream {}", stream.0);
    }
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let keep = |r: &ResultRow| {
        args.key.is_none_or(|k| r.key == k)
            && args.from.is_none_or(|f| r.start >= f)
            && args.to.is_none_or(|to| r.start < to)
    };
    let mut shown = 0u64;
    let mut closed = false;
    let print = |r: &ResultRow, out: &mut dyn Write| -> std::io::Result<()> {
        let avg = if r.count > 0 { r.sum / r.count as f64 } else { 0.0 };
        if args.json {
            let o = json!({"key": r.key, "start_ms": r.start, "count": r.count, "sum": r.sum, "min": r.min, "max": r.max, "avg": avg});
            writeln!(out, "{o}")
        } else if args.csv {
            writeln!(out, "{},{},{},{},{},{},{}", r.key, r.start, r.count, r.sum, r.min, r.max, avg)
        } else {
            writeln!(
                out,
                "{:>20}  {:<24}  {:>10}  {:>16.4}  {:>12.4}  {:>12.4}  {:>12.4}",
                r.key,
                start_time(r.start),
                r.count,
                r.sum,
                r.min,
                r.max,
                avg
            )
        }
    };
    let header = if args.csv {
        Some("key,start_ms,count,sum,min,max,avg".to_string())
    } else if args.json {
        None
    } else {
        Some(format!(
            "{:>20}  {:<24}  {:>10}  {:>16}  {:>12}  {:>12}  {:>12}",
            "key", "window start", "count", "sum", "min", "max", "avg"
        ))
    };
    if let Some(h) = header {
        closed |= writeln!(out, "{h}").is_err();
    }
    for addr in &serving {
        let r = crate::results::pages(&t, *addr, stream, |page| {
            for r in page.iter().filter(|r| keep(r)) {
                if closed {
                    return;
                }
                // A closed pipe (`| head`) ends the output quietly.
                closed |= print(r, &mut out).is_err();
                shown += 1;
            }
        });
        if let Err(e) = r {
            missing.push(format!("{addr}: {e:#}"));
        }
    }
    let _ = out.flush();
    drop(out);
    for m in &missing {
        tracing::warn!("{m}");
        let _ = writeln!(std::io::stderr(), "weir query: {m}: its results are not above");
    }
    tracing::debug!(shown, "results printed");
    Ok(if missing.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
