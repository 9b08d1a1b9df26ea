//! The summary `weir load` prints at the end: a table for people, or JSON (`--json`, fields
//! documented in docs/cluster.md).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::Plan;
use super::driver::{Acked, Counters};
use super::progress::human;

pub struct Summary<'a> {
    pub plan: &'a Plan,
    pub elapsed: Duration,
    pub acked_rows: u64,
    pub counters: &'a Counters,
    /// Ack latency (µs).
    pub latency: &'a Histogram<u64>,
    pub partitions: &'a [Acked],
    pub errors: &'a [String],
    pub nodes: &'a [SocketAddr],
    /// Event-to-result latency (µs), with `--measure-results`.
    pub to_result: Option<&'a Histogram<u64>>,
}

const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

impl Summary<'_> {
    fn ms(&self, q: f64) -> f64 {
        if self.latency.is_empty() { 0.0 } else { self.latency.value_at_quantile(q) as f64 / 1000.0 }
    }

    fn max_ms(&self) -> f64 {
        self.latency.max() as f64 / 1000.0
    }

    fn rate(&self) -> f64 {
        self.acked_rows as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    pub fn json(&self) -> Value {
        let c = self.counters;
        let mut latency = serde_json::Map::new();
        for (name, q) in QUANTILES {
            latency.insert(name.to_string(), json!(self.ms(q)));
        }
        latency.insert("max".into(), json!(self.max_ms()));
        json!({
            "ok": self.errors.is_empty(),
            "stream": self.plan.stream.0,
            "producer": format!("{:#018x}", self.plan.producer),
            "seed": self.plan.generator.seed,
            "keys": self.plan.generator.keys,
            "rows_per_ms": self.plan.generator.rows_per_ms,
            "ts_start": self.plan.generator.ts_start,
            "batch": self.plan.batch,
            "nodes": self.nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "seconds": self.elapsed.as_secs_f64(),
            "events_acked": self.acked_rows,
            "events_sent": c.sent_rows.load(Ordering::Relaxed),
            "bytes_sent": c.sent_bytes.load(Ordering::Relaxed),
            "events_per_second": self.rate(),
            "ack_latency_ms": latency,
            "retries": c.retries.load(Ordering::Relaxed),
            "reconnects": c.reconnects.load(Ordering::Relaxed),
            "duplicates": c.duplicates.load(Ordering::Relaxed),
            "partitions": self.partitions.iter().map(|a| json!({
                "partition": a.partition,
                "events": a.rows,
                "events_before": self.plan.before.get(a.partition as usize).copied().unwrap_or(0),
                "versions": a.versions.map(|(lo, hi)| json!([lo, hi])),
            })).collect::<Vec<_>>(),
            "event_to_result_ms": self.to_result.map(|h| {
                let mut m = serde_json::Map::new();
                for (name, q) in QUANTILES {
                    m.insert(name.to_string(), json!(h.value_at_quantile(q) as f64 / 1000.0));
                }
                m.insert("max".into(), json!(h.max() as f64 / 1000.0));
                m.insert("events".into(), json!(h.len()));
                Value::Object(m)
            }),
            "errors": self.errors,
        })
    }

    /// Prints the table (a closed pipe, `| head`, ends it quietly).
    pub fn print(&self) {
        let _ = self.write(&mut std::io::stdout().lock());
    }

    fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let c = self.counters;
        let sent = c.sent_rows.load(Ordering::Relaxed);
        writeln!(
            out,
            "{} events acknowledged in {:.1} s: {}/s ({} sent, {} MB) to stream {} on {} node(s)",
            self.acked_rows,
            self.elapsed.as_secs_f64(),
            human(self.rate()),
            sent,
            c.sent_bytes.load(Ordering::Relaxed) / 1_000_000,
            self.plan.stream.0,
            self.nodes.len()
        )?;
        let cols: Vec<String> = QUANTILES.iter().map(|(n, q)| format!("{n} {:.2}", self.ms(*q))).collect();
        writeln!(out, "ack latency ms: {}, max {:.2}", cols.join(", "), self.max_ms())?;
        if let Some(h) = self.to_result.filter(|h| !h.is_empty()) {
            let cols: Vec<String> =
                QUANTILES.iter().map(|(n, q)| format!("{n} {:.1}", h.value_at_quantile(*q) as f64 / 1000.0)).collect();
            writeln!(out, "event to result ms: {}, max {:.1}", cols.join(", "), h.max() as f64 / 1000.0)?;
        }
        writeln!(
            out,
            "retries {}, reconnects {}, batches stored before (sent again) {}",
            c.retries.load(Ordering::Relaxed),
            c.reconnects.load(Ordering::Relaxed),
            c.duplicates.load(Ordering::Relaxed)
        )?;
        for a in self.partitions {
            let v = a.versions.map_or("-".to_string(), |(lo, hi)| format!("versions {lo}..={hi}"));
            let before = self.plan.before.get(a.partition as usize).copied().unwrap_or(0);
            let earlier = if before > 0 { format!(" (after {before} of earlier loads)") } else { String::new() };
            writeln!(out, "  partition {:>3}: {:>12} events, {v}{earlier}", a.partition, a.rows)?;
        }
        for e in self.errors {
            writeln!(out, "error: {e}")?;
        }
        Ok(())
    }
}
