//! Operations: status, manual checkpoints, and what they carry.

use super::*;

archived! {
    /// Client → node: report your status, of `stream` (`None`: the node's stream of the lowest
    /// id, with every stream's tasks and health).
    pub struct StatusReq {
        /// Echoed in the response.
        pub request: u64,
        /// The stream asked about.
        pub stream: Option<StreamId>,
    }
}

archived! {
    /// A task's lifecycle state.
    pub enum TaskState {
        /// Not started.
        Uninit,
        /// Processing.
        Ready,
        /// Taking part in a checkpoint.
        Checkpointing,
        /// Paused by an operator.
        Paused,
        /// Stopped: its input ended and it emitted everything (a bounded stream), or the engine
        /// stops.
        Stopped,
    }
}

archived! {
    /// One task in a [`StatusRsp`].
    pub struct TaskStatus {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// State.
        pub state: TaskState,
        /// Latest committed checkpoint.
        pub latest: Option<CheckpointId>,
        /// Checkpoint in progress.
        pub active: Option<CheckpointId>,
        /// Last failed checkpoint.
        pub failed: Option<CheckpointId>,
        /// Rows received.
        pub rows_in: u64,
        /// Rows emitted.
        pub rows_out: u64,
        /// Event-time progress (ms): a source's largest event time (or marker) sent on, an
        /// agg's combined watermark; `None` before any (and for sinks).
        pub watermark_ms: Option<i64>,
        /// Messages waiting in the task's input queues (aggs and sinks).
        pub queued: u64,
        /// An agg's replay since its restore: rows the sources send again, in all.
        pub replay_rows: u64,
        /// Of which it has taken so far (equal when the replay is over; replayed rows are not
        /// in `rows_in`).
        pub replayed: u64,
        /// How long it has replayed (ms; 0 without a replay).
        pub replay_ms: u64,
    }
}

archived! {
    /// How a checkpoint ended, as the coordinator saw it.
    pub enum CheckpointOutcome {
        /// Still running.
        InProgress,
        /// Committed.
        Committed,
        /// Failed.
        Failed {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// One task's statistics within a [`CheckpointStats`].
    pub struct TaskCheckpointEntry {
        /// Task.
        pub task: TaskId,
        /// Its figures.
        pub stats: TaskCheckpointStats,
    }
}

archived! {
    /// Statistics of one checkpoint in a [`StatusRsp`].
    pub struct CheckpointStats {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint.
        pub checkpoint: CheckpointId,
        /// Start (ms since the epoch).
        pub started_at_ms: u64,
        /// Trigger to commit (µs); zero while in progress.
        pub duration_us: u64,
        /// Outcome.
        pub outcome: CheckpointOutcome,
        /// Bytes uploaded by all tasks.
        pub upload_bytes: u64,
        /// Longest alignment of any task (µs).
        pub max_align_us: u64,
        /// Longest synchronous snapshot of any task (µs).
        pub max_snapshot_us: u64,
        /// Per task, as reported (empty while in progress or when the checkpoint failed early).
        pub tasks: Vec<TaskCheckpointEntry>,
        /// Whether it is a savepoint (every task wrote all its state: it restores with other
        /// parallelism).
        pub savepoint: bool,
    }
}

archived! {
    /// A stream's checkpoint health in a [`StatusRsp`] (from its coordinator's node).
    pub struct StreamHealth {
        /// Stream.
        pub stream: StreamId,
        /// False once more consecutive checkpoints failed than tolerated, until one commits.
        pub healthy: bool,
        /// Checkpoints failed since the last commit.
        pub consecutive_failures: u32,
        /// Checkpoints committed since the node started.
        pub committed: u64,
        /// Checkpoints failed since the node started.
        pub failed: u64,
        /// Checkpoints that could not start since the node started (their ids could not be
        /// reserved in the store).
        pub not_started: u64,
        /// Time between periodic checkpoints (ms; 0: only on request).
        pub interval_ms: u64,
        /// Why the first checkpoint failed or could not start since the last commit (empty
        /// after a commit); at most [`MAX_CAUSE`] bytes.
        pub cause: String,
    }
}

/// The longest [`StreamHealth::cause`] a node sends.
pub const MAX_CAUSE: usize = 512;

archived! {
    /// Node → client: status.
    pub struct StatusRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// Time since the node started (ms).
        pub uptime_ms: u64,
        /// Tasks on the node.
        pub tasks: Vec<TaskStatus>,
        /// Recent checkpoints (coordinator node only).
        pub checkpoints: Vec<CheckpointStats>,
        /// Health of the streams this node coordinates.
        pub streams: Vec<StreamHealth>,
        /// The incarnation the node runs the stream at (0: not a cluster member).
        pub incarnation: u64,
        /// The stream's restarts on this node since the process started, oldest first (the
        /// last 20).
        pub restarts: Vec<RestartInfo>,
        /// This node's links to the other nodes of the stream.
        pub peers: Vec<PeerLink>,
        /// The node waits to restart its stream (the restart strategy's delay): no tasks now.
        pub restarting: bool,
        /// The node runs no task of the stream: the cluster moved its tasks to the other nodes
        /// while it was away (placement version `incarnation >> 32`).
        pub idle: bool,
        /// The stream is paused (`weir stream pause`): its tasks stopped after a checkpoint; its
        /// partitions still take appends, which wait in the log.
        pub paused: bool,
        /// The stream the node runs (or waits to run again), so that a client needs no config
        /// file to read its results (`weir verify` of an ingest-log stream).
        pub stream: Option<StreamInfo>,
        /// The node's membership in the cluster's control store (`None`: the cluster has none).
        pub member: Option<MemberInfo>,
        /// The ingest logs the node holds, by partition (an ingest-log stream's).
        pub logs: Vec<LogStatus>,
    }
}

archived! {
    /// One partition's ingest log on a node, in a [`StatusRsp`].
    pub struct LogStatus {
        /// Partition.
        pub partition: u32,
        /// The node runs the partition's source (its log is the partition's primary); else it
        /// keeps a copy.
        pub source: bool,
        /// The oldest version the log holds (retention deletes what no kept checkpoint reads).
        pub first: Version,
        /// Every version below this is durable here.
        pub end: Version,
        /// What the source may read: durable on both copies (on the source's node; `end` with
        /// one copy).
        pub readable: Version,
        /// Bytes of the log's segment files.
        pub bytes: u64,
        /// The node keeping the copy (on the source's node with two copies; 0: none).
        pub follower: NodeId,
        /// Where the copy stands in the partition's in-sync set, on the source's node: 0 no set
        /// (appends always wait for it), 1 in, 2 being written or not known (appends wait), 3
        /// out but waited for, 4 out and appends acknowledged on the source's node alone.
        pub in_sync: u8,
    }
}

archived! {
    /// A node's membership in the cluster's control store (etcd), in a [`StatusRsp`].
    pub struct MemberInfo {
        /// The node the election chose to decide placement, as this node last saw (0: none).
        pub leader: NodeId,
        /// How long the node's membership surely lasts still without a renewal (ms; 0: the
        /// node holds none now and runs nothing).
        pub lease_left_ms: u64,
        /// The stream's placement version (its epoch) the node last read.
        pub placement: u32,
        /// Times this node was elected.
        pub elections: u64,
        /// Times the node lost its membership.
        pub lease_losses: u64,
        /// This node's placement writes that the store refused (it was deposed, or another
        /// placement stood).
        pub fenced_writes: u64,
        /// The last error talking to the store (empty: none).
        pub error: String,
        /// The node gave up its membership: it reaches the store but not most of the other
        /// members.
        pub withheld: bool,
        /// The other nodes whose transport port this node's probes do not reach now.
        pub unreachable: Vec<NodeId>,
        /// The stream's in-sync sets as this node last read them from the store (about once a
        /// second), in partition order: also those of a partition whose source's node is down.
        pub in_sync: Vec<InSyncEntry>,
        /// How long before this answer the node read `in_sync` (ms): more than a few seconds
        /// when etcd has not answered since.
        pub in_sync_age_ms: u64,
    }
}

archived! {
    /// One ingest partition's in-sync set as the control store holds it, in a [`MemberInfo`].
    pub struct InSyncEntry {
        /// The partition.
        pub partition: u32,
        /// The node of its source, which wrote the record.
        pub primary: NodeId,
        /// The node keeping its copy.
        pub follower: NodeId,
        /// Whether the copy is in the set (it holds every row the primary acknowledged).
        pub in_sync: bool,
    }
}

archived! {
    /// A stream's shape, in a [`StatusRsp`].
    pub struct StreamInfo {
        /// Stream.
        pub stream: StreamId,
        /// Its name.
        pub name: String,
        /// Its sources read the nodes' ingest logs (`false`: the generator).
        pub ingest: bool,
        /// Source partitions (source tasks `0..partitions`).
        pub partitions: u32,
        /// Agg tasks.
        pub aggs: u32,
        /// Sink tasks.
        pub sinks: u32,
        /// The id of the first agg task (aggs are `first_agg_task..+aggs`, sinks follow them;
        /// `partitions` until a rescale, which never reuses an id).
        pub first_agg_task: u32,
        /// Window size (ms).
        pub window_ms: i64,
        /// Window slide (ms; the size for tumbling windows).
        pub slide_ms: i64,
        /// Disorder tolerated before a row is late (ms).
        pub watermark_delay_ms: i64,
    }
}

archived! {
    /// What a node knows of its link to another node of the stream.
    pub struct PeerLink {
        /// The other node.
        pub node: NodeId,
        /// Connected now.
        pub up: bool,
        /// Since when (ms since the epoch; 0: never connected since this engine started).
        pub since_ms: u64,
        /// Why it went down (empty when up or never connected).
        pub reason: String,
    }
}

archived! {
    /// One restart of a stream on a node.
    pub struct RestartInfo {
        /// When the stream stopped for it (ms since the epoch).
        pub at_ms: u64,
        /// The incarnation it restarted at.
        pub incarnation: u64,
        /// Why it stopped.
        pub reason: String,
    }
}

archived! {
    /// Client → node: start a checkpoint of `stream` now (the coordinator's manual trigger).
    pub struct CheckpointNowReq {
        /// Echoed in the response.
        pub request: u64,
        /// Stream.
        pub stream: StreamId,
    }
}

archived! {
    /// What became of a manual trigger.
    pub enum CheckpointNowOutcome {
        /// The coordinator starts a checkpoint as soon as the one in flight (if any) has ended
        /// and the minimum pause has passed; `Engine` statistics and status show it.
        Accepted,
        /// This node does not coordinate the stream; ask `coordinator` (fatal here, retry there).
        NotCoordinator {
            /// The stream's coordinator node.
            coordinator: NodeId,
        },
        /// The stream runs without checkpoints, or not on this node (fatal).
        Refused {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// Node → client: the answer to a `CheckpointNowReq`.
    pub struct CheckpointNowRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// What became of it.
        pub outcome: CheckpointNowOutcome,
    }
}

archived! {
    /// Client → node, or node → its peers: stop `stream` on every node (each node's process
    /// exits 0, its checkpoints kept; started again, it resumes from the last commit).
    pub struct StopReq {
        /// Echoed in the response.
        pub request: u64,
        /// Stream.
        pub stream: StreamId,
        /// Sent on by a node to its peers (who do not send it on again); false from a client.
        pub forwarded: bool,
    }
}

archived! {
    /// Node → client: what became of a [`StopReq`].
    pub struct StopRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// Whether the node stops the stream (and told its peers to); false: it does not run it.
        pub stopping: bool,
        /// The peers it told.
        pub peers: Vec<NodeId>,
    }
}

archived! {
    /// One window result in a [`ResultsRsp`].
    pub struct ResultRow {
        /// Series key.
        pub key: u64,
        /// Window start (ms).
        pub start: i64,
        /// Rows.
        pub count: u64,
        /// Sum.
        pub sum: f64,
        /// Minimum.
        pub min: f64,
        /// Maximum.
        pub max: f64,
    }
}

archived! {
    /// Client → node: a page of `stream`'s results from the result store `store` of the node
    /// (its sinks' stores, numbered from 0), after the block `after` (empty: from the start).
    pub struct ResultsReq {
        /// Echoed in the response.
        pub request: u64,
        /// Stream.
        pub stream: StreamId,
        /// Which of the node's result stores.
        pub store: u32,
        /// The last block of the previous page ([`ResultsRsp::next`]); empty for the first.
        pub after: Vec<u8>,
        /// Results wanted at most (whole blocks: a page may hold up to a block more).
        pub max: u32,
    }
}

archived! {
    /// Node → client: a page of results.
    pub struct ResultsRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// Result stores on the node.
        pub stores: u32,
        /// The results, in the store's order (window start, upstream, key order).
        pub results: Vec<ResultRow>,
        /// Where the next page starts (`after` of the next request); `None`: the store is done.
        pub next: Option<Vec<u8>>,
        /// Why there is no page (an unknown store, a read that failed); empty when there is.
        pub error: String,
    }
}

archived! {
    /// Client → node: what each producer appended to `stream`'s ingest-log partitions on this
    /// node (their ledgers).
    pub struct ProducersReq {
        /// Echoed in the response.
        pub request: u64,
        /// Stream.
        pub stream: StreamId,
        /// Where this page starts (the previous answer's `next`; zeros for the first page).
        pub from: ProducersCursor,
    }
}

archived! {
    /// A place in a node's ledgers: partition, and a producer's index in it.
    #[derive(Copy, Default, Eq, PartialOrd, Ord)]
    pub struct ProducersCursor {
        /// Partition.
        pub partition: u32,
        /// Index of the producer in the partition's ledger (the order producers first appended).
        pub producer: u32,
    }
}

archived! {
    /// What one producer appended to one partition.
    pub struct ProducerInfo {
        /// Producer id.
        pub producer: u64,
        /// What it said of itself with its first batch (empty: nothing).
        pub description: Vec<u8>,
        /// Version of its first row.
        pub first: Version,
        /// Rows appended.
        pub rows: u64,
        /// Batches appended (sequence numbers `0..batches`).
        pub batches: u64,
        /// The watermark of its last end-of-load marker: it said it was done.
        pub ended: Option<i64>,
    }
}

archived! {
    /// One partition's ledger in a [`ProducersRsp`].
    pub struct PartitionProducers {
        /// Partition.
        pub partition: u32,
        /// Every version below this is durable.
        pub durable: Version,
        /// Its producers, in the order they first appended.
        pub producers: Vec<ProducerInfo>,
    }
}

archived! {
    /// Node → client: the ledgers of the node's partitions that have any producer.
    pub struct ProducersRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// Partitions with at least one producer, ascending (a partition may continue on the
        /// next page).
        pub partitions: Vec<PartitionProducers>,
        /// Where the next page starts; `None`: this was the last. Pages stay well under the frame
        /// limit whatever the ledgers hold.
        pub next: Option<ProducersCursor>,
        /// Why there is no answer (not an ingest-log stream of this node); empty when there is.
        pub error: String,
    }
}
