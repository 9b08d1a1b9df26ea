//! A node's Prometheus metrics over HTTP (`[[nodes]] metrics = "127.0.0.1:9111"`): `GET /metrics`
//! answers in the OpenMetrics text format (`prometheus-client`), which Prometheus scrapes.
//!
//! The engine keeps its own counters (task status, engine stats) and restarts them with every
//! run of the stream; the [`Board`] takes a snapshot of them twice a second from the node's
//! supervising loop and adds the counts of the node's earlier runs, so every counter exported
//! only grows while the process lives (Prometheus's `rate()` handles a process restart). The
//! ingest writer reports each acknowledgement itself ([`IngestObserver`]), into a histogram.
//! Checkpoint durations go into histograms once per checkpoint, on the coordinator's node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use weir_engine::ingest::IngestObserver;
use weir_engine::runtime::EngineStats;
use weir_engine::wire::msg::{CheckpointOutcome, StatusRsp, TaskState};

type Labels = Vec<(String, String)>;

/// What the node is doing, for `weir_node_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    Restarting,
    Idle,
    /// The stream is paused: its partitions take appends, its tasks do not run.
    Paused,
    /// The stream's supervisor has ended here (its restart strategy gave up, or it ended).
    Stopped,
}

/// A histogram family built with the node's buckets.
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

fn histograms() -> Histograms {
    Family::new_with_constructor(|| Histogram::new(seconds_buckets()))
}

fn stream_labels(stream: u64) -> Labels {
    vec![("stream".into(), stream.to_string())]
}

/// One stream's ingest acknowledgements, told by its ingest writer (handles into the board's
/// families).
#[derive(Debug)]
pub struct IngestMetrics {
    rows: Counter,
    appends: Counter,
    duplicates: Counter,
    refused: Family<Labels, Counter>,
    stream: u64,
    latency: Histogram,
}

impl IngestObserver for IngestMetrics {
    fn acknowledged(&self, rows: u64, latency: Duration, duplicate: bool) {
        if duplicate {
            self.duplicates.inc();
        } else {
            self.rows.inc_by(rows);
        }
        self.appends.inc();
        self.latency.observe(latency.as_secs_f64());
    }

    fn refused(&self, retryable: bool) {
        let kind = if retryable { "retryable" } else { "fatal" };
        let mut labels = stream_labels(self.stream);
        labels.push(("kind".into(), kind.into()));
        self.refused.get_or_create(&labels).inc();
    }
}

/// Counters of one task, summed over the node's runs of the stream.
#[derive(Clone, Copy, Default)]
struct TaskCounts {
    rows_in: u64,
    rows_out: u64,
}

/// One stream's counts on the node.
#[derive(Default)]
struct State {
    /// The stream's name (`weir_stream_info`).
    name: String,
    phase: Option<Phase>,
    /// The current run's last snapshot.
    status: Option<StatusRsp>,
    stats: [u64; 6],
    /// Earlier runs' totals.
    base_tasks: BTreeMap<(u64, u32), TaskCounts>,
    base_stats: [u64; 6],
    restarts: u64,
    /// Checkpoints already counted (their ids), and the outcomes counted.
    seen: BTreeSet<u64>,
    committed: u64,
    failed: u64,
    upload_bytes: u64,
}

/// The node's metrics: each stream's, labelled `stream` (its id), and the node's own.
pub struct Board {
    node: u32,
    /// By stream id.
    streams: Mutex<BTreeMap<u64, State>>,
    /// The node's membership in etcd, with `[control]`.
    member: Mutex<Option<Arc<dyn weir_engine::cluster::MemberStatus>>>,
    ingest_rows: Family<Labels, Counter>,
    ingest_appends: Family<Labels, Counter>,
    ingest_duplicates: Family<Labels, Counter>,
    ingest_refused: Family<Labels, Counter>,
    ingest_latency: Histograms,
    checkpoint: Histograms,
    alignment: Histograms,
    snapshot: Histograms,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 100 µs to ~52 s.
    exponential_buckets(0.0001, 2.0, 20)
}

fn stats_of(s: &EngineStats) -> [u64; 6] {
    [&s.rows_in, &s.rows_aggregated, &s.results_emitted, &s.results_written, &s.late_rows, &s.rows_past_cuts]
        .map(|a| a.load(Ordering::Relaxed))
}

/// One stream's side of the node's [`Board`]: what its supervisor and ingest writer report to.
#[derive(Clone)]
pub struct StreamMetrics {
    board: Arc<Board>,
    stream: u64,
}

impl Board {
    pub fn new(node: u32) -> Arc<Board> {
        Arc::new(Board {
            node,
            streams: Mutex::new(BTreeMap::new()),
            member: Mutex::new(None),
            ingest_rows: Family::default(),
            ingest_appends: Family::default(),
            ingest_duplicates: Family::default(),
            ingest_refused: Family::default(),
            ingest_latency: histograms(),
            checkpoint: histograms(),
            alignment: histograms(),
            snapshot: histograms(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, State>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stream `stream` (named `name`) reports here from now on; a stream reported before keeps
    /// its counts.
    pub fn stream(self: &Arc<Self>, stream: u64, name: &str) -> StreamMetrics {
        self.lock().entry(stream).or_default().name = name.to_string();
        StreamMetrics { board: self.clone(), stream }
    }

    /// Keeps the metrics of the streams `kept` only (the others were dropped).
    pub fn retain(&self, kept: &BTreeSet<u64>) {
        let gone: Vec<u64> = self.lock().keys().copied().filter(|id| !kept.contains(id)).collect();
        gone.into_iter().for_each(|id| self.forget(id));
    }

    /// Stream `stream` is gone from the node (dropped): its metrics go.
    fn forget(&self, stream: u64) {
        self.lock().remove(&stream);
        let labels = stream_labels(stream);
        for f in [&self.ingest_rows, &self.ingest_appends, &self.ingest_duplicates] {
            f.remove(&labels);
        }
        for f in [&self.ingest_latency, &self.checkpoint, &self.alignment, &self.snapshot] {
            f.remove(&labels);
        }
        for kind in ["retryable", "fatal"] {
            let mut l = labels.clone();
            l.push(("kind".into(), kind.into()));
            self.ingest_refused.remove(&l);
        }
    }

    /// Reports the node's membership in etcd from now on.
    pub fn set_member(&self, member: Arc<dyn weir_engine::cluster::MemberStatus>) {
        *self.member.lock().unwrap_or_else(|e| e.into_inner()) = Some(member);
    }
}

impl StreamMetrics {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(self.board.lock().entry(self.stream).or_default())
    }

    /// What the stream's ingest writer reports to.
    pub fn ingest(&self) -> Arc<dyn IngestObserver> {
        let (b, labels) = (&self.board, stream_labels(self.stream));
        Arc::new(IngestMetrics {
            rows: b.ingest_rows.get_or_create(&labels).clone(),
            appends: b.ingest_appends.get_or_create(&labels).clone(),
            duplicates: b.ingest_duplicates.get_or_create(&labels).clone(),
            refused: b.ingest_refused.clone(),
            stream: self.stream,
            latency: b.ingest_latency.get_or_create(&labels).clone(),
        })
    }

    pub fn set_phase(&self, phase: Phase) {
        self.with(|s| s.phase = Some(phase));
    }

    /// A restart of the stream on this node.
    pub fn restarted(&self) {
        self.with(|s| s.restarts += 1);
    }

    /// A snapshot of the stream's running engine.
    pub fn update(&self, status: StatusRsp, stats: &EngineStats) {
        let labels = stream_labels(self.stream);
        let b = &self.board;
        self.with(|s| {
            s.phase = Some(if status.paused { Phase::Paused } else { Phase::Running });
            for c in &status.checkpoints {
                let done = !matches!(c.outcome, CheckpointOutcome::InProgress);
                if !done || !s.seen.insert(c.checkpoint.0) {
                    continue;
                }
                match c.outcome {
                    CheckpointOutcome::Committed => {
                        s.committed += 1;
                        s.upload_bytes += c.upload_bytes;
                        b.checkpoint.get_or_create(&labels).observe(c.duration_us as f64 / 1e6);
                        b.alignment.get_or_create(&labels).observe(c.max_align_us as f64 / 1e6);
                        b.snapshot.get_or_create(&labels).observe(c.max_snapshot_us as f64 / 1e6);
                    }
                    _ => s.failed += 1,
                }
            }
            // Ids are kept for the checkpoints the status still lists (it lists the recent ones).
            if s.seen.len() > 4096 {
                let keep: BTreeSet<u64> = status.checkpoints.iter().map(|c| c.checkpoint.0).collect();
                s.seen.retain(|id| keep.contains(id));
            }
            s.stats = stats_of(stats);
            s.status = Some(status);
        });
    }

    /// The engine ended: its counts join the earlier runs'.
    pub fn engine_ended(&self) {
        self.with(|s| {
            if let Some(st) = s.status.take() {
                for t in &st.tasks {
                    let b = s.base_tasks.entry((t.stream.0, t.task.0)).or_default();
                    b.rows_in += t.rows_in;
                    b.rows_out += t.rows_out;
                }
            }
            let stats = std::mem::take(&mut s.stats);
            for (b, v) in s.base_stats.iter_mut().zip(stats) {
                *b += v;
            }
        });
    }
}

#[path = "metrics_render.rs"]
mod render;

fn task_state(s: TaskState) -> &'static str {
    match s {
        TaskState::Uninit => "uninit",
        TaskState::Ready => "ready",
        TaskState::Checkpointing => "checkpointing",
        TaskState::Paused => "paused",
        TaskState::Stopped => "stopped",
    }
}
