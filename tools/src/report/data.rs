//! What `weir report` reads: a `weir load` HdrHistogram interval log (events acknowledged and
//! their ack latency, a histogram a second) and, optionally, a `weir status --status-log` file
//! (JSON lines), from which it takes every finished checkpoint once.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine as _;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};

/// One interval of the load.
pub struct Interval {
    /// Start, seconds since the load's start.
    pub at_s: f64,
    pub length_s: f64,
    /// Ack latency of its events (µs); its count is the events acknowledged.
    pub histogram: Histogram<u64>,
}

/// The load, from its interval log.
pub struct Load {
    /// The load's start (ms since the epoch), when the log says (`StartTime`).
    pub start_ms: Option<f64>,
    pub intervals: Vec<Interval>,
    /// Every interval merged.
    pub total: Histogram<u64>,
}

/// A finished checkpoint, from the status log.
pub struct Checkpoint {
    /// Start, ms since the epoch.
    pub started_ms: f64,
    pub committed: bool,
    pub end_to_end_ms: f64,
    pub alignment_ms: f64,
    pub snapshot_ms: f64,
    pub upload_ms: f64,
    pub upload_bytes: u64,
}

/// The load's interval log at `path`.
pub fn load(path: &Path) -> anyhow::Result<Load> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read the HdrHistogram log {}", path.display()))?;
    let mut start_ms = None;
    let mut base = None;
    let mut intervals = Vec::new();
    let mut total: Option<Histogram<u64>> = None;
    let mut de = Deserializer::new();
    for (i, entry) in IntervalLogIterator::new(&bytes).enumerate() {
        let entry =
            entry.map_err(|e| anyhow::anyhow!("{}: entry {}: not an interval log ({e:?})", path.display(), i + 1))?;
        match entry {
            LogEntry::StartTime(t) => start_ms = Some(t.as_secs_f64() * 1000.0),
            LogEntry::BaseTime(t) => base = Some(t.as_secs_f64()),
            LogEntry::Interval(h) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(h.encoded_histogram())
                    .with_context(|| format!("{}: interval {}: bad base64", path.display(), intervals.len() + 1))?;
                let histogram: Histogram<u64> = de
                    .deserialize(&mut &raw[..])
                    .map_err(|e| anyhow::anyhow!("{}: interval {}: {e:?}", path.display(), intervals.len() + 1))?;
                match &mut total {
                    Some(t) => t.add(&histogram).context("intervals of different ranges")?,
                    None => total = Some(histogram.clone()),
                }
                // With a BaseTime, timestamps are offsets from it; both are the load's start here.
                let at = h.start_timestamp().as_secs_f64();
                let at_s = match (base, start_ms) {
                    (Some(_), _) => at,
                    (None, Some(s)) if at > 1e9 => at - s / 1000.0,
                    _ => at,
                };
                intervals.push(Interval { at_s, length_s: h.duration().as_secs_f64(), histogram });
            }
        }
    }
    let Some(total) = total else { bail!("{}: no interval in the log (an empty load?)", path.display()) };
    Ok(Load { start_ms, intervals, total })
}

fn field(v: &serde_json::Value, name: &str) -> f64 {
    v[name].as_f64().unwrap_or(0.0)
}

/// Every finished checkpoint the status log at `path` shows, once, by start.
pub fn checkpoints(path: &Path) -> anyhow::Result<Vec<Checkpoint>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the status log {}", path.display()))?;
    let mut by_id: BTreeMap<(u64, u64), Checkpoint> = BTreeMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| {
            format!("{}: line {}: not a status line (weir status --status-log)", path.display(), n + 1)
        })?;
        let Some(nodes) = v["nodes"].as_array() else {
            bail!("{}: line {}: no \"nodes\": not a status line", path.display(), n + 1)
        };
        for c in nodes.iter().filter_map(|n| n["checkpoints"].as_array()).flatten() {
            let outcome = c["outcome"].as_str().unwrap_or("");
            if outcome == "in progress" || outcome.is_empty() {
                continue;
            }
            let key = (c["stream"].as_u64().unwrap_or(0), c["checkpoint"].as_u64().unwrap_or(0));
            by_id.insert(
                key,
                Checkpoint {
                    started_ms: field(c, "started_at_ms"),
                    committed: outcome == "committed",
                    end_to_end_ms: field(c, "duration_us") / 1000.0,
                    alignment_ms: field(c, "max_align_us") / 1000.0,
                    snapshot_ms: field(c, "max_snapshot_us") / 1000.0,
                    upload_ms: field(c, "max_upload_us") / 1000.0,
                    upload_bytes: c["upload_bytes"].as_u64().unwrap_or(0),
                },
            );
        }
    }
    let mut out: Vec<Checkpoint> = by_id.into_values().collect();
    out.sort_by(|a, b| a.started_ms.total_cmp(&b.started_ms));
    Ok(out)
}
