//! [`Board::render`]: the node's metrics in the OpenMetrics text format, each stream's labelled
//! with its id (`stream`; `weir_stream_info` gives its name).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{Board, Labels, Phase, State, TaskCounts, stream_labels, task_state};

fn counter(v: u64) -> Counter {
    let c: Counter = Counter::default();
    c.inc_by(v);
    c
}

fn task_labels(stream: u64, task: u32) -> Labels {
    vec![("stream".into(), stream.to_string()), ("task".into(), task.to_string())]
}

fn with(mut labels: Labels, key: &str, value: String) -> Labels {
    labels.push((key.into(), value));
    labels
}

const STATS: [(&str, &str); 6] = [
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

const PHASES: [(Phase, &str); 5] = [
    (Phase::Running, "running"),
    (Phase::Restarting, "restarting"),
    (Phase::Idle, "idle"),
    (Phase::Paused, "paused"),
    (Phase::Stopped, "stopped"),
];

impl Board {
    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let streams = self.lock();
        let mut r = Registry::with_prefix("weir");
        tasks(&mut r, &streams);
        let info = Family::<Labels, Gauge>::default();
        let stats: Vec<Family<Labels, Counter>> = STATS.iter().map(|_| Family::default()).collect();
        let outcomes = Family::<Labels, Counter>::default();
        let (upload, restarts) = (Family::<Labels, Counter>::default(), Family::<Labels, Counter>::default());
        let (latest, phase) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
        let (log_bytes, behind) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
        let peers = Family::<Labels, Gauge>::default();
        for (id, s) in streams.iter() {
            let l = stream_labels(*id);
            info.get_or_create(&with(l.clone(), "name", s.name.clone())).set(1);
            for (i, f) in stats.iter().enumerate() {
                f.get_or_create(&l).inc_by(s.base_stats[i] + s.stats[i]);
            }
            outcomes.get_or_create(&with(l.clone(), "outcome", "committed".into())).inc_by(s.committed);
            outcomes.get_or_create(&with(l.clone(), "outcome", "failed".into())).inc_by(s.failed);
            upload.get_or_create(&l).inc_by(s.upload_bytes);
            restarts.get_or_create(&l).inc_by(s.restarts);
            let last = s.status.as_ref().and_then(|st| st.tasks.iter().filter_map(|t| t.latest).map(|c| c.0).max());
            latest.get_or_create(&l).set(last.map_or(-1, |c| c as i64));
            for (p, name) in PHASES {
                phase.get_or_create(&with(l.clone(), "state", name.into())).set(i64::from(s.phase == Some(p)));
            }
            // The ingest logs this node holds (retention keeps them bounded), and how far each
            // copy of this node's partitions is behind.
            for g in s.status.iter().flat_map(|st| &st.logs) {
                let role = if g.source { "source" } else { "copy" };
                let part = with(l.clone(), "partition", g.partition.to_string());
                log_bytes.get_or_create(&with(part.clone(), "log", role.into())).set(g.bytes as i64);
                if g.source && g.follower.0 != 0 {
                    behind.get_or_create(&part).set(g.end.0.saturating_sub(g.readable.0) as i64);
                }
            }
            // The links are the node's: any stream's view of them is as good.
            for g in s.status.iter().flat_map(|st| &st.peers) {
                peers.get_or_create(&vec![("peer".into(), g.node.0.to_string())]).set(i64::from(g.up));
            }
        }
        r.register("stream_info", "A stream the node runs (its id and name)", info);
        for ((name, help), f) in STATS.iter().zip(stats) {
            r.register(*name, *help, f);
        }
        r.register("ingest_rows", "Rows appended to the node's ingest logs and acknowledged", self.ingest_rows.clone());
        r.register("ingest_appends", "Ingest requests acknowledged", self.ingest_appends.clone());
        r.register("ingest_duplicates", "Ingest batches sent again, stored before", self.ingest_duplicates.clone());
        r.register("ingest_refused", "Ingest requests refused", self.ingest_refused.clone());
        r.register(
            "ingest_ack_latency_seconds",
            "From the ingest writer taking a request to its acknowledgement",
            self.ingest_latency.clone(),
        );
        r.register("checkpoint_duration_seconds", "Committed checkpoints, trigger to commit", self.checkpoint.clone());
        r.register("checkpoint_alignment_seconds", "Committed checkpoints' longest alignment", self.alignment.clone());
        r.register(
            "checkpoint_snapshot_seconds",
            "Committed checkpoints' longest synchronous snapshot",
            self.snapshot.clone(),
        );
        r.register("checkpoints", "Checkpoints finished (coordinator's node)", outcomes);
        r.register("checkpoint_upload_bytes", "Bytes committed checkpoints uploaded", upload);
        r.register("last_committed_checkpoint", "The newest checkpoint a local task committed (-1: none)", latest);
        r.register("restarts", "Restarts of the stream on this node", restarts);
        r.register("node_state", "What the node does with the stream (1 for its state)", phase);
        r.register("peer_up", "Whether the link to a peer is up", peers);
        r.register("ingest_log_bytes", "Bytes of a partition's ingest log on this node", log_bytes);
        r.register("ingest_copy_behind_versions", "Versions of this node's partition its copy lacks", behind);
        self.cluster(&mut r);
        let node = Family::<Labels, Gauge>::default();
        node.get_or_create(&vec![("node".into(), self.node.to_string())]).set(1);
        r.register("node", "This node's id", node);
        let mut out = String::new();
        encode(&mut out, &r).expect("metrics encode to a string");
        out
    }

    /// The node's membership in etcd, with `[control]`.
    fn cluster(&self, r: &mut Registry) {
        let member = self.member.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|m| m.member_info());
        let Some(m) = member else { return };
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
}

/// Each stream's tasks: this run's counters plus the earlier runs', their states and progress.
fn tasks(r: &mut Registry, streams: &std::collections::BTreeMap<u64, State>) {
    let (rows_in, rows_out) = (Family::<Labels, Counter>::default(), Family::<Labels, Counter>::default());
    let state = Family::<Labels, Gauge>::default();
    let (watermark, queued) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
    let (replay_rows, replayed) = (Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
    for s in streams.values() {
        let mut counts = s.base_tasks.clone();
        for t in s.status.iter().flat_map(|st| &st.tasks) {
            let e: &mut TaskCounts = counts.entry((t.stream.0, t.task.0)).or_default();
            e.rows_in += t.rows_in;
            e.rows_out += t.rows_out;
            let l = task_labels(t.stream.0, t.task.0);
            state.get_or_create(&with(l.clone(), "state", task_state(t.state.clone()).into())).set(1);
            if t.replay_rows > 0 {
                replay_rows.get_or_create(&l).set(t.replay_rows as i64);
                replayed.get_or_create(&l).set(t.replayed as i64);
            }
            if let Some(w) = t.watermark_ms {
                watermark.get_or_create(&l).set(w);
            }
            queued.get_or_create(&l).set(t.queued as i64);
        }
        for ((stream, task), c) in &counts {
            rows_in.get_or_create(&task_labels(*stream, *task)).inc_by(c.rows_in);
            rows_out.get_or_create(&task_labels(*stream, *task)).inc_by(c.rows_out);
        }
    }
    r.register("task_rows_in", "Rows (or results) a task received", rows_in);
    r.register("task_rows_out", "Rows (or results) a task emitted", rows_out);
    r.register("task_state", "A task's state (1 for the state it is in)", state);
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
}
