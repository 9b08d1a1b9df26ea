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

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
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
}

/// Ingest acknowledgements, told by the ingest writer.
#[derive(Debug)]
pub struct IngestMetrics {
    rows: Counter,
    appends: Counter,
    duplicates: Counter,
    refused: Family<Labels, Counter>,
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
        self.refused.get_or_create(&vec![("kind".into(), kind.into())]).inc();
    }
}

/// Counters of one task, summed over the node's runs of the stream.
#[derive(Clone, Copy, Default)]
struct TaskCounts {
    rows_in: u64,
    rows_out: u64,
}

#[derive(Default)]
struct State {
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

/// The node's metrics.
pub struct Board {
    node: u32,
    state: Mutex<State>,
    /// The node's membership in etcd, with `[control]`.
    member: Mutex<Option<Arc<dyn weir_engine::cluster::MemberStatus>>>,
    ingest: Arc<IngestMetrics>,
    checkpoint: Histogram,
    alignment: Histogram,
    snapshot: Histogram,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 100 µs to ~52 s.
    exponential_buckets(0.0001, 2.0, 20)
}

fn stats_of(s: &EngineStats) -> [u64; 6] {
    [&s.rows_in, &s.rows_aggregated, &s.results_emitted, &s.results_written, &s.late_rows, &s.rows_past_cuts]
        .map(|a| a.load(Ordering::Relaxed))
}

impl Board {
    pub fn new(node: u32) -> Arc<Board> {
        Arc::new(Board {
            node,
            state: Mutex::new(State::default()),
            member: Mutex::new(None),
            ingest: Arc::new(IngestMetrics {
                rows: Counter::default(),
                appends: Counter::default(),
                duplicates: Counter::default(),
                refused: Family::default(),
                latency: Histogram::new(seconds_buckets()),
            }),
            checkpoint: Histogram::new(seconds_buckets()),
            alignment: Histogram::new(seconds_buckets()),
            snapshot: Histogram::new(seconds_buckets()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the ingest writer reports to.
    pub fn ingest(&self) -> Arc<dyn IngestObserver> {
        self.ingest.clone()
    }

    /// Reports the node's membership in etcd from now on.
    pub fn set_member(&self, member: Arc<dyn weir_engine::cluster::MemberStatus>) {
        *self.member.lock().unwrap_or_else(|e| e.into_inner()) = Some(member);
    }

    pub fn set_phase(&self, phase: Phase) {
        self.lock().phase = Some(phase);
    }

    /// A restart of the stream on this node.
    pub fn restarted(&self) {
        self.lock().restarts += 1;
    }

    /// A snapshot of the running engine.
    pub fn update(&self, status: StatusRsp, stats: &EngineStats) {
        let mut s = self.lock();
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
                    self.checkpoint.observe(c.duration_us as f64 / 1e6);
                    self.alignment.observe(c.max_align_us as f64 / 1e6);
                    self.snapshot.observe(c.max_snapshot_us as f64 / 1e6);
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
    }

    /// The engine ended: its counts join the earlier runs'.
    pub fn engine_ended(&self) {
        let mut s = self.lock();
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
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let s = self.lock();
        let mut r = Registry::with_prefix("weir");
        let node = self.node.to_string();
        let counter = |v: u64| {
            let c: Counter = Counter::default();
            c.inc_by(v);
            c
        };
        // Tasks: this run's counters plus the earlier runs'.
        let mut tasks = s.base_tasks.clone();
        let mut states = Vec::new();
        if let Some(st) = &s.status {
            for t in &st.tasks {
                let e = tasks.entry((t.stream.0, t.task.0)).or_default();
                e.rows_in += t.rows_in;
                e.rows_out += t.rows_out;
                states.push((t.stream.0, t.task.0, t.state.clone()));
            }
        }
        let task_labels =
            |stream: u64, task: u32| vec![("stream".into(), stream.to_string()), ("task".into(), task.to_string())];
        let rows_in = Family::<Labels, Counter>::default();
        let rows_out = Family::<Labels, Counter>::default();
        for ((stream, task), c) in &tasks {
            rows_in.get_or_create(&task_labels(*stream, *task)).inc_by(c.rows_in);
            rows_out.get_or_create(&task_labels(*stream, *task)).inc_by(c.rows_out);
        }
        r.register("task_rows_in", "Rows (or results) a task received", rows_in);
        r.register("task_rows_out", "Rows (or results) a task emitted", rows_out);
        let state = Family::<Labels, Gauge>::default();
        for (stream, task, st) in states {
            let mut l = task_labels(stream, task);
            l.push(("state".into(), task_state(st).into()));
            state.get_or_create(&l).set(1);
        }
        r.register("task_state", "A task's state (1 for the state it is in)", state);
        let watermark = Family::<Labels, Gauge>::default();
        let queued = Family::<Labels, Gauge>::default();
        let (replay_rows, replayed) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
        if let Some(st) = &s.status {
            for t in &st.tasks {
                if t.replay_rows > 0 {
                    replay_rows.get_or_create(&task_labels(t.stream.0, t.task.0)).set(t.replay_rows as i64);
                    replayed.get_or_create(&task_labels(t.stream.0, t.task.0)).set(t.replayed as i64);
                }
                if let Some(w) = t.watermark_ms {
                    watermark.get_or_create(&task_labels(t.stream.0, t.task.0)).set(w);
                }
                queued.get_or_create(&task_labels(t.stream.0, t.task.0)).set(t.queued as i64);
            }
        }
        r.register(
            "task_watermark_ms",
            "A task's event-time progress, ms since the epoch: a source's largest event time sent on, an agg's watermark",
            watermark,
        );
        r.register("task_input_queue", "Messages waiting in a task's input queues", queued);
        r.register(
            "task_replay_rows",
            "Rows an agg's restore has the sources send again (its last restore's replay)",
            replay_rows,
        );
        r.register("task_replayed_rows", "Of those, rows the agg has taken (not in task_rows_in)", replayed);
        let names = [
            ("source_rows", "Rows the node's sources read"),
            ("agg_rows", "Rows the node's aggs processed"),
            ("results_emitted", "Window results the node's aggs emitted"),
            ("results_written", "Window results the node's sinks wrote"),
            ("late_rows", "Late rows the node's aggs dropped"),
            (
                "agg_rows_past_cuts",
                "Rows the node's aggs took past a checkpoint barrier while waiting for another input's (unaligned barriers)",
            ),
        ];
        for (i, (name, help)) in names.iter().enumerate() {
            r.register(*name, *help, counter(s.base_stats[i] + s.stats[i]));
        }
        r.register("ingest_rows", "Rows appended to the node's ingest logs and acknowledged", self.ingest.rows.clone());
        r.register("ingest_appends", "Ingest requests acknowledged", self.ingest.appends.clone());
        r.register("ingest_duplicates", "Ingest batches sent again, stored before", self.ingest.duplicates.clone());
        r.register("ingest_refused", "Ingest requests refused", self.ingest.refused.clone());
        r.register(
            "ingest_ack_latency_seconds",
            "From the ingest writer taking a request to its acknowledgement",
            self.ingest.latency.clone(),
        );
        r.register("checkpoint_duration_seconds", "Committed checkpoints, trigger to commit", self.checkpoint.clone());
        r.register("checkpoint_alignment_seconds", "Committed checkpoints' longest alignment", self.alignment.clone());
        r.register(
            "checkpoint_snapshot_seconds",
            "Committed checkpoints' longest synchronous snapshot",
            self.snapshot.clone(),
        );
        let outcomes = Family::<Labels, Counter>::default();
        outcomes.get_or_create(&vec![("outcome".into(), "committed".into())]).inc_by(s.committed);
        outcomes.get_or_create(&vec![("outcome".into(), "failed".into())]).inc_by(s.failed);
        r.register("checkpoints", "Checkpoints finished (coordinator's node)", outcomes);
        r.register("checkpoint_upload_bytes", "Bytes committed checkpoints uploaded", counter(s.upload_bytes));
        let latest = Gauge::<i64>::default();
        let last = s.status.as_ref().and_then(|st| st.tasks.iter().filter_map(|t| t.latest).map(|c| c.0).max());
        latest.set(last.map_or(-1, |c| c as i64));
        r.register("last_committed_checkpoint", "The newest checkpoint a local task committed (-1: none)", latest);
        r.register("restarts", "Restarts of the stream on this node", counter(s.restarts));
        let phase = Family::<Labels, Gauge>::default();
        let phases = [
            (Phase::Running, "running"),
            (Phase::Restarting, "restarting"),
            (Phase::Idle, "idle"),
            (Phase::Paused, "paused"),
        ];
        for (p, name) in phases {
            phase.get_or_create(&vec![("state".into(), name.into())]).set(i64::from(s.phase == Some(p)));
        }
        r.register("node_state", "What the node does (1 for its state)", phase);
        let peers = Family::<Labels, Gauge>::default();
        if let Some(st) = &s.status {
            for l in &st.peers {
                peers.get_or_create(&vec![("peer".into(), l.node.0.to_string())]).set(i64::from(l.up));
            }
        }
        r.register("peer_up", "Whether the link to a peer is up", peers);
        // The ingest logs this node holds (retention keeps them bounded), and how far each copy
        // of this node's partitions is behind.
        let (log_bytes, behind) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
        for l in s.status.iter().flat_map(|st| &st.logs) {
            let role = if l.source { "source" } else { "copy" };
            let labels = vec![("partition".into(), l.partition.to_string()), ("log".into(), role.into())];
            log_bytes.get_or_create(&labels).set(l.bytes as i64);
            if l.source && l.follower.0 != 0 {
                let lag = l.end.0.saturating_sub(l.readable.0);
                behind.get_or_create(&vec![("partition".into(), l.partition.to_string())]).set(lag as i64);
            }
        }
        r.register("ingest_log_bytes", "Bytes of a partition's ingest log on this node", log_bytes);
        r.register("ingest_copy_behind_versions", "Versions of this node's partition its copy lacks", behind);
        let member = self.member.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|m| m.member_info());
        if let Some(m) = member {
            r.register("cluster_elections", "Times this node was elected to decide placement", counter(m.elections));
            r.register(
                "cluster_lease_losses",
                "Times this node lost its membership (its lease in etcd)",
                counter(m.lease_losses),
            );
            r.register("cluster_fenced_writes", "This node's placement writes etcd refused", counter(m.fenced_writes));
            let left = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
            left.set(m.lease_left_ms as f64 / 1e3);
            r.register(
                "cluster_lease_left_seconds",
                "How long the node's membership lasts without a renewal (0: none)",
                left,
            );
            let leads = Gauge::<i64>::default();
            leads.set(i64::from(m.leader.0 == self.node));
            r.register("cluster_leader", "Whether this node leads (decides placement)", leads);
            let version = Gauge::<i64>::default();
            version.set(i64::from(m.placement));
            r.register("cluster_placement_version", "The placement version (the stream's epoch) last read", version);
        }
        let info = Family::<Labels, Gauge>::default();
        info.get_or_create(&vec![("node".into(), node)]).set(1);
        r.register("node", "This node's id", info);
        let mut out = String::new();
        encode(&mut out, &r).expect("metrics encode to a string");
        out
    }
}

fn task_state(s: TaskState) -> &'static str {
    match s {
        TaskState::Uninit => "uninit",
        TaskState::Ready => "ready",
        TaskState::Checkpointing => "checkpointing",
        TaskState::Paused => "paused",
        TaskState::Stopped => "stopped",
    }
}
