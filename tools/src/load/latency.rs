//! Ack latency of `weir load`: one histogram of the whole run and one per second, written as an
//! HdrHistogram interval log (`--hdr-log`) that HdrHistogram's own tools read.
//!
//! Histograms count events: each event's ack latency is its batch's (so an interval's count is
//! the events acknowledged in it, the throughput `weir report` plots).
//!
//! Latency is measured from each batch's *scheduled* send time, not from when it was sent: a
//! node that stalls shows as latency of every batch that should have gone meanwhile (open loop,
//! coordinated omission corrected as wrk2 does), not as a lower send rate.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};

/// Largest latency recorded exactly (µs): an hour; longer ones count as an hour.
const MAX_US: u64 = 3_600_000_000;

/// Histograms of ack latency in microseconds.
pub struct Latency {
    /// The whole run.
    pub total: Histogram<u64>,
    /// Since the last interval was written.
    interval: Histogram<u64>,
    /// The interval log and when its current interval started (since the run's start).
    log: Option<IntervalLog>,
    interval_start: Duration,
}

struct IntervalLog {
    out: BufWriter<File>,
    serializer: V2DeflateSerializer,
    /// Encoded intervals waiting to be written (the writer borrows `out`; see `write`).
    lines: Vec<u8>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid bounds")
}

impl Latency {
    /// Histograms for a run that started at `start`, with an interval log at `path`.
    pub fn new(path: Option<&Path>, start: SystemTime) -> anyhow::Result<Self> {
        let log = match path {
            Some(p) => {
                let f =
                    File::create(p).with_context(|| format!("cannot create the HdrHistogram log {}", p.display()))?;
                let mut out = BufWriter::new(f);
                let mut serializer = V2DeflateSerializer::new();
                // The header: how to read the values, and the time intervals count from.
                IntervalLogWriterBuilder::new()
                    .add_comment(
                        "weir load: ack latency in microseconds of every event, from its batch's scheduled send time",
                    )
                    .with_start_time(start)
                    .with_base_time(start)
                    .begin_log_with(&mut out, &mut serializer)
                    .context("cannot write the HdrHistogram log")?;
                out.write_all(
                    b"\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n",
                )?;
                Some(IntervalLog { out, serializer, lines: Vec::new() })
            }
            None => None,
        };
        Ok(Self { total: histogram(), interval: histogram(), log, interval_start: Duration::ZERO })
    }

    /// Records the latency of an acknowledged batch of `rows` events.
    pub fn record(&mut self, latency: Duration, rows: u64) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_US);
        self.total.record_n(us, rows).expect("within bounds");
        self.interval.record_n(us, rows).expect("within bounds");
    }

    /// Ends the current interval at `now` (since the run's start): writes it to the log (when
    /// there is one) and starts the next. Returns the interval's p99 (µs), 0 when it had no ack.
    pub fn end_interval(&mut self, now: Duration) -> anyhow::Result<u64> {
        let p99 = if self.interval.is_empty() { 0 } else { self.interval.value_at_quantile(0.99) };
        if let Some(log) = &mut self.log {
            log.lines.clear();
            let mut w = IntervalLogWriterBuilder::new()
                .begin_log_with(&mut log.lines, &mut log.serializer)
                .context("cannot encode an interval")?;
            let length = now.saturating_sub(self.interval_start);
            w.write_histogram(&self.interval, self.interval_start, length, None::<Tag<'_>>)
                .map_err(|e| anyhow::anyhow!("cannot encode an interval: {e:?}"))?;
            log.out.write_all(&log.lines).context("cannot write the HdrHistogram log")?;
            log.out.flush().context("cannot write the HdrHistogram log")?;
        }
        self.interval.reset();
        self.interval_start = now;
        Ok(p99)
    }
}
