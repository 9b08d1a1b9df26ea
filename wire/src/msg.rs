//! Every message of the Weir protocol, one rkyv type each.
//!
//! A frame carries exactly one message; its kind byte ([`Kind`]) says which type the payload is
//! archived as. Field names follow the seed (`streamCheckpoint.c`) and the reference notes, with
//! what Weir adds: sequence numbers on channel messages (so a lost frame is a detected gap),
//! checksums and statistics in reports, and outcomes that say *why* a request was not acted on.
//!
//! Kind numbers are part of the wire format: never renumber, only append.

use crate::batch::Batch;
use crate::ids::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

/// Length of handshake nonces and HMAC-SHA256 proofs.
pub const NONCE_LEN: usize = 32;

macro_rules! archived {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
    };
    ($(#[$m:meta])* pub enum $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum $name { $($body)* }
    };
}

// ---------------------------------------------------------------------------------------------
// Connection: handshake, liveness, close.

archived! {
    /// First frame of a connection, from the dialing side.
    pub struct Hello {
        /// The cluster this node belongs to; a mismatch refuses the connection.
        pub cluster: String,
        /// The dialer's node id.
        pub node: NodeId,
        /// The dialer's protocol version (also in every frame header).
        pub protocol_version: u8,
        /// Random challenge for the accepting side to prove the secret over.
        pub nonce: [u8; NONCE_LEN],
    }
}

archived! {
    /// The accepting side's answer to [`Hello`]: its identity, its own challenge, and its proof.
    pub struct Challenge {
        /// The acceptor's cluster.
        pub cluster: String,
        /// The acceptor's node id.
        pub node: NodeId,
        /// The acceptor's protocol version.
        pub protocol_version: u8,
        /// Random challenge for the dialer to prove the secret over.
        pub nonce: [u8; NONCE_LEN],
        /// HMAC-SHA256 over both nonces and identities, keyed by the cluster secret.
        pub proof: [u8; NONCE_LEN],
    }
}

archived! {
    /// The dialer's proof of the cluster secret; after it the connection carries traffic.
    pub struct Auth {
        /// HMAC-SHA256 over both nonces and identities, keyed by the cluster secret.
        pub proof: [u8; NONCE_LEN],
    }
}

archived! {
    /// Liveness and task summary, sent periodically on every connection.
    pub struct Heartbeat {
        /// Sender.
        pub node: NodeId,
        /// Sender's wall clock (ms since the epoch), for lag diagnostics only.
        pub sent_at_ms: u64,
        /// Per-task checkpoint summary (the seed's heartbeat content); empty on plain links.
        pub tasks: Vec<TaskHeartbeat>,
    }
}

archived! {
    /// One task's checkpoint summary inside a [`Heartbeat`].
    pub struct TaskHeartbeat {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// Latest checkpoint this task committed.
        pub latest: Option<CheckpointId>,
        /// Source offset of that checkpoint.
        pub latest_version: Version,
        /// When it committed (ms since the epoch; 0: not known, as for a restored checkpoint).
        pub latest_ts_ms: u64,
        /// Checkpoint in progress, if any.
        pub active: Option<CheckpointId>,
        /// Last failed checkpoint, if any.
        pub failed: Option<CheckpointId>,
    }
}

archived! {
    /// Why a connection is closed.
    pub enum CloseCode {
        /// Orderly shutdown.
        Shutdown,
        /// The peer belongs to another cluster.
        ClusterMismatch,
        /// The peer speaks another protocol version.
        VersionMismatch,
        /// The peer could not prove the cluster secret.
        AuthFailed,
        /// The peer sent a frame that failed to decode or validate.
        BadFrame,
        /// Nothing was heard from the peer within the dead-peer timeout.
        Timeout,
        /// The peer sent a message that is not allowed at this point (e.g. data before auth).
        ProtocolViolation,
        /// Another connection to the same node replaced this one.
        Replaced,
    }
}

archived! {
    /// Last frame on a connection: why it closes.
    pub struct Close {
        /// Machine-readable reason.
        pub code: CloseCode,
        /// Human-readable detail.
        pub message: String,
    }
}

// ---------------------------------------------------------------------------------------------
// Data plane.

archived! {
    /// Rows sent to a node's ingest log (`weir load`).
    pub struct Ingest {
        /// Target stream.
        pub stream: StreamId,
        /// Target partition (one source task each).
        pub partition: u32,
        /// Client's request id, echoed in the ack.
        pub request: u64,
        /// The rows.
        pub batch: Batch,
    }
}

archived! {
    /// Result of an [`Ingest`].
    pub enum IngestOutcome {
        /// The rows are durable under the node's policy, at versions `first..=last`.
        Durable {
            /// Version of the first row.
            first: Version,
            /// Version of the last row.
            last: Version,
        },
        /// The rows were not stored.
        Rejected {
            /// Why.
            reason: String,
            /// Whether sending again may succeed.
            retryable: bool,
        },
    }
}

archived! {
    /// Acknowledges an [`Ingest`] once its rows are durable (or refuses it).
    pub struct IngestAck {
        /// Stream.
        pub stream: StreamId,
        /// Partition.
        pub partition: u32,
        /// The request this answers.
        pub request: u64,
        /// What happened.
        pub outcome: IngestOutcome,
    }
}

archived! {
    /// A batch on a channel between two tasks.
    pub struct Data {
        /// Stream.
        pub stream: StreamId,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number (shared with watermarks and triggers on that channel).
        pub seq: Seq,
        /// The rows.
        pub batch: Batch,
    }
}

archived! {
    /// Event-time progress of an upstream on a channel.
    pub struct Watermark {
        /// Stream.
        pub stream: StreamId,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
        /// No row with a smaller event time (ms) follows on this channel.
        pub watermark_ms: i64,
    }
}

archived! {
    /// Window results from an agg task to a sink task (columnar).
    pub struct WindowResults {
        /// Stream.
        pub stream: StreamId,
        /// Sending agg.
        pub from: TaskId,
        /// Receiving sink.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
        /// Series keys.
        pub key: Vec<u64>,
        /// Window starts (ms).
        pub start: Vec<i64>,
        /// Row counts.
        pub count: Vec<u64>,
        /// Sums.
        pub sum: Vec<f64>,
        /// Minimums.
        pub min: Vec<f64>,
        /// Maximums.
        pub max: Vec<f64>,
    }
}

impl ArchivedWindowResults {
    /// All columns must have the same length.
    pub fn check_columns(&self) -> Result<(), String> {
        let n = self.key.len();
        let lens = [self.start.len(), self.count.len(), self.sum.len(), self.min.len(), self.max.len()];
        if lens.iter().all(|l| *l == n) {
            Ok(())
        } else {
            Err(format!("window result columns differ in length: key {n}, others {lens:?}"))
        }
    }
}

archived! {
    /// The upstream task has sent everything: its channel ends here.
    pub struct EndOfStream {
        /// Stream.
        pub stream: StreamId,
        /// Sending task.
        pub from: TaskId,
        /// Receiving task.
        pub to: TaskId,
        /// Per-channel sequence number.
        pub seq: Seq,
    }
}

archived! {
    /// Receiver → sender of a remote channel: room for `credits` more frames (credit-based flow
    /// control, so one slow channel never blocks a connection that others share).
    pub struct Credit {
        /// Stream.
        pub stream: StreamId,
        /// Sending task of the channel (who gets the credit).
        pub from: TaskId,
        /// Receiving task of the channel.
        pub to: TaskId,
        /// Frames granted.
        pub credits: u32,
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoint protocol.

archived! {
    /// Why the coordinator started a checkpoint.
    pub enum TriggerKind {
        /// The interval timer.
        Periodic,
        /// An operator asked for it.
        Manual,
    }
}

archived! {
    /// Coordinator → source task: start checkpoint `checkpoint`.
    pub struct CheckpointSourceReq {
        /// Stream.
        pub stream: StreamId,
        /// New checkpoint id.
        pub checkpoint: CheckpointId,
        /// Coordinator transaction.
        pub trans: TransId,
        /// Target source task.
        pub task: TaskId,
        /// Node the task runs on.
        pub node: NodeId,
        /// Why.
        pub kind: TriggerKind,
        /// Past this time (ms since the epoch) the request is stale and must not start anything.
        pub expire_at_ms: u64,
    }
}

archived! {
    /// What a source did with a [`CheckpointSourceReq`].
    pub enum SourceOutcome {
        /// The source built its part of the checkpoint at this ingest offset.
        Done {
            /// The source offset recorded at the trigger (checkpointVer).
            version: Version,
        },
        /// The task is not a source; nothing was done.
        NotSource,
        /// The id is at or below the task's last completed checkpoint; nothing was done.
        AlreadyCompleted {
            /// The task's last completed id.
            latest: CheckpointId,
        },
        /// The id is at or below the task's last failed checkpoint; nothing was done.
        AlreadyFailed {
            /// The task's last failed id.
            failed: CheckpointId,
        },
        /// The task is already checkpointing another id; nothing was done.
        Busy {
            /// The id in progress.
            active: CheckpointId,
        },
        /// The source failed to build its checkpoint.
        Failed {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// Source task → coordinator: answer to a [`CheckpointSourceReq`].
    pub struct CheckpointSourceRsp {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint id of the request.
        pub checkpoint: CheckpointId,
        /// Transaction of the request.
        pub trans: TransId,
        /// Answering task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// What happened.
        pub outcome: SourceOutcome,
    }
}

archived! {
    /// The barrier: in-band on a data channel, after every row of the checkpoint's cut.
    pub struct CheckpointTrigger {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// Coordinator transaction.
        pub trans: TransId,
        /// Upstream task that dispatched it.
        pub from: TaskId,
        /// Downstream task it is for.
        pub to: TaskId,
        /// Its sequence number on the channel.
        pub seq: Seq,
    }
}

archived! {
    /// Downstream → upstream: my part of `checkpoint` is durable and all my downstreams are ready.
    pub struct CheckpointReady {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// Transaction.
        pub trans: TransId,
        /// The ready (downstream) task.
        pub downstream: TaskId,
        /// Its node.
        pub downstream_node: NodeId,
        /// The upstream task this is sent to.
        pub upstream: TaskId,
        /// Its node.
        pub upstream_node: NodeId,
    }
}

archived! {
    /// Upstream → downstream: confirms a [`CheckpointReady`], which stops its resending.
    pub struct CheckpointReadyRsp {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint id.
        pub checkpoint: CheckpointId,
        /// The confirming (upstream) task.
        pub upstream: TaskId,
        /// The task whose ready message is confirmed.
        pub downstream: TaskId,
    }
}

archived! {
    /// Downstream → upstream: I have not received your trigger for `checkpoint`.
    pub struct RetrieveTriggerReq {
        /// Stream.
        pub stream: StreamId,
        /// Checkpoint id the downstream is aligning for.
        pub checkpoint: CheckpointId,
        /// The upstream asked.
        pub upstream: TaskId,
        /// Its node.
        pub upstream_node: NodeId,
        /// The asking downstream.
        pub downstream: TaskId,
        /// Its node.
        pub downstream_node: NodeId,
    }
}

archived! {
    /// Upstream's answer to a [`RetrieveTriggerReq`].
    pub enum TriggerRspCode {
        /// The trigger was dispatched; the downstream may inject it once every frame before
        /// `trigger_seq` on the channel has arrived.
        Success,
        /// The upstream has not reached the trigger yet; ask again later.
        InProgress,
        /// The upstream is not checkpointing that id.
        Invalid,
    }
}

archived! {
    /// Upstream → downstream: answer to a [`RetrieveTriggerReq`].
    pub struct TriggerRsp {
        /// Stream.
        pub stream: StreamId,
        /// The upstream's active checkpoint id (or the asked id when it has none).
        pub checkpoint: CheckpointId,
        /// The upstream's transaction.
        pub trans: TransId,
        /// Answering upstream.
        pub upstream: TaskId,
        /// Asking downstream.
        pub downstream: TaskId,
        /// Outcome.
        pub code: TriggerRspCode,
        /// Sequence number the trigger had on the channel (meaningful on success).
        pub trigger_seq: Seq,
    }
}

archived! {
    /// Timing and size of one task's part of a checkpoint.
    #[derive(Default)]
    pub struct TaskCheckpointStats {
        /// When the first trigger reached the task (a source: when it reached its queued trigger),
        /// µs since the epoch.
        pub trigger_at_us: u64,
        /// Time from the first to the last trigger (µs): the alignment.
        pub align_us: u64,
        /// Synchronous state capture and barrier forwarding (µs); with the alignment, the pause
        /// the task's pipeline saw.
        pub snapshot_us: u64,
        /// Bytes uploaded for this checkpoint (new files only).
        pub upload_bytes: u64,
        /// Background work: state write, local RocksDB checkpoint and upload (µs).
        pub upload_us: u64,
        /// Files in the manifest.
        pub files: u32,
        /// When the task reported (its snapshot durable, its downstream ready), µs since the epoch.
        pub reported_at_us: u64,
    }
}

archived! {
    /// How a task's part of a checkpoint ended.
    pub enum ReportOutcome {
        /// Snapshot durable in the store.
        Done,
        /// The task failed its part.
        Failed {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// Task → coordinator: my part of `checkpoint` is done (or failed).
    pub struct CheckpointReport {
        /// Stream.
        pub stream: StreamId,
        /// Reporting task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// Checkpoint id; a mismatch with the coordinator's is rejected.
        pub checkpoint: CheckpointId,
        /// Transaction; a mismatch is rejected.
        pub trans: TransId,
        /// Outcome.
        pub outcome: ReportOutcome,
        /// Source offset recorded (checkpointVer); zero for non-sources.
        pub version: Version,
        /// When the task took its snapshot (ms since the epoch).
        pub checkpoint_ts_ms: u64,
        /// CRC32C of the task's manifest as stored, so a commit names exactly what was uploaded.
        pub manifest_crc: u32,
        /// Timing and size.
        pub stats: TaskCheckpointStats,
    }
}

archived! {
    /// Coordinator → task: `checkpoint` is committed.
    pub struct UpdateCheckpointInfo {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// Committed id.
        pub checkpoint: CheckpointId,
        /// Transaction.
        pub trans: TransId,
        /// The task's source offset in that checkpoint.
        pub version: Version,
        /// Commit time (ms since the epoch).
        pub checkpoint_ts_ms: u64,
    }
}

archived! {
    /// Coordinator → task: checkpoint `failed` is abandoned; drop it and return to ready.
    pub struct TaskReset {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// The failed checkpoint.
        pub failed: CheckpointId,
        /// Its transaction.
        pub trans: TransId,
        /// Why it failed.
        pub reason: String,
    }
}

archived! {
    /// Task → coordinator on start: what I have, so a restore point can be agreed.
    pub struct ConsensusReq {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// Its node.
        pub node: NodeId,
        /// Latest checkpoint the task has locally committed, if any; the restore point names
        /// the offset.
        pub latest: Option<CheckpointId>,
        /// The request (unique per start of the task), echoed by the [`Restore`] answering it.
        pub request: u64,
    }
}

archived! {
    /// Where a restore point came from.
    pub enum RestoreBasis {
        /// The coordinator's durable commit record.
        Committed,
        /// The seed's consensus: the minimum of the tasks' latest ids.
        Consensus,
        /// Nothing committed yet: start empty from the beginning.
        Fresh,
    }
}

archived! {
    /// Coordinator → task: restore this checkpoint before processing.
    pub struct Restore {
        /// Stream.
        pub stream: StreamId,
        /// Task.
        pub task: TaskId,
        /// Checkpoint to restore (none for a fresh start).
        pub checkpoint: Option<CheckpointId>,
        /// How it was chosen.
        pub basis: RestoreBasis,
        /// Source offset to replay from, when the commit record names it (none: the one in the
        /// task's manifest).
        pub version: Option<Version>,
        /// The [`ConsensusReq`] this answers.
        pub request: u64,
    }
}

// ---------------------------------------------------------------------------------------------
// Operations.

archived! {
    /// Client → node: report your status.
    pub struct StatusReq {
        /// Echoed in the response.
        pub request: u64,
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
        /// Stopped.
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
    }
}

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

// ---------------------------------------------------------------------------------------------
// Kinds.

/// Per-message validation beyond what bytecheck checks (invariants between fields).
pub trait Check {
    /// `Err` names the broken invariant.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A message type: which frame kind carries it.
pub trait Message:
    rkyv::Archive<Archived: Check>
    + for<'a> rkyv::Serialize<
        rkyv::api::high::HighSerializer<
            rkyv::util::AlignedVec<16>,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rkyv::rancor::Error,
        >,
    >
{
    /// Frame kind of this message.
    const KIND: Kind;
}

macro_rules! kinds {
    ($( $num:literal => $ty:ident $({ $checker:expr })? ),* $(,)?) => {
        /// Frame kind: which message type the payload is archived as.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Kind { $( #[doc = concat!("[`", stringify!($ty), "`]")] $ty = $num ),* }

        impl Kind {
            /// Every kind, in wire order.
            pub const ALL: &'static [Kind] = &[$(Kind::$ty),*];

            /// The kind with this wire number.
            pub fn from_u8(n: u8) -> Option<Kind> {
                match n { $($num => Some(Kind::$ty),)* _ => None }
            }

            /// Name of the message type.
            pub fn name(self) -> &'static str {
                match self { $(Kind::$ty => stringify!($ty)),* }
            }
        }

        $(
            impl Message for $ty { const KIND: Kind = Kind::$ty; }
            kinds!(@check $ty $({ $checker })?);
        )*

        /// A validated payload of any kind, borrowed from its frame.
        #[derive(Debug)]
        pub enum AnyMessage<'a> { $( #[doc = concat!("[`", stringify!($ty), "`]")] $ty(&'a rkyv::Archived<$ty>) ),* }

        impl<'a> AnyMessage<'a> {
            /// Validates `payload` as message `kind`.
            pub fn access(kind: Kind, payload: &'a [u8]) -> Result<AnyMessage<'a>, String> {
                match kind {
                    $(Kind::$ty => {
                        let m = rkyv::access::<rkyv::Archived<$ty>, rkyv::rancor::Error>(payload)
                            .map_err(|e| e.to_string())?;
                        m.check()?;
                        Ok(AnyMessage::$ty(m))
                    })*
                }
            }

            /// The kind.
            pub fn kind(&self) -> Kind {
                match self { $(AnyMessage::$ty(_) => Kind::$ty),* }
            }
        }
    };
    (@check $ty:ident { $checker:expr }) => {
        impl Check for rkyv::Archived<$ty> {
            fn check(&self) -> Result<(), String> { ($checker)(self) }
        }
    };
    (@check $ty:ident) => {
        impl Check for rkyv::Archived<$ty> {}
    };
}

kinds! {
    1 => Hello,
    2 => Challenge,
    3 => Auth,
    4 => Heartbeat,
    5 => Close,
    10 => Ingest { |m: &ArchivedIngest| m.batch.check() },
    11 => IngestAck,
    12 => Data { |m: &ArchivedData| m.batch.check() },
    13 => Watermark,
    14 => WindowResults { |m: &ArchivedWindowResults| m.check_columns() },
    15 => EndOfStream,
    16 => Credit,
    20 => CheckpointSourceReq,
    21 => CheckpointSourceRsp,
    22 => CheckpointTrigger,
    23 => CheckpointReady,
    24 => CheckpointReadyRsp,
    25 => RetrieveTriggerReq,
    26 => TriggerRsp,
    27 => CheckpointReport,
    28 => UpdateCheckpointInfo,
    29 => TaskReset,
    30 => ConsensusReq,
    31 => Restore,
    40 => StatusReq,
    41 => StatusRsp,
    42 => CheckpointNowReq,
    43 => CheckpointNowRsp,
}
