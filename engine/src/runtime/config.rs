//! [`EngineConfig`]: the settings of one engine (one node's share of a stream).

use std::path::PathBuf;
use std::time::Duration;

use weir_wire::NodeId;
use weir_wire::transport::TransportConfig;

use super::checkpointing::CheckpointSettings;
use crate::ingest::{LogConfig, SyncPolicy};

/// Settings of one engine (one node's share of a stream).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// This node.
    pub node: NodeId,
    /// Worker threads.
    pub workers: usize,
    /// Pin worker `i` to core `i` (modulo the cores there are).
    pub pin_workers: bool,
    /// Where the result store, task state and ingest logs live.
    pub data_dir: PathBuf,
    /// Messages per input queue between tasks of this node. Small on purpose: a checkpoint's
    /// barrier waits behind what is queued, so this bounds alignment (16 messages of about 2,000
    /// rows are about 1.2 ms of an agg's work).
    pub queue_capacity: usize,
    /// Credits per remote channel into this node (frames in flight, and the receiving queue's
    /// size), granted to the sender when the receiving task starts. Deeper than local queues, to
    /// cover the network's round trip. Each node sets it for its own inputs.
    pub remote_credits: usize,
    /// Transport to the other nodes; required when the placement puts tasks elsewhere.
    pub transport: Option<TransportConfig>,
    /// This run of the stream ([`Epoch`](weir_wire::Epoch)): every start of a stream on its
    /// nodes takes the same epoch, greater than its earlier runs'; its nodes take only frames of
    /// this run into it. `None`: the transport's incarnation (a stream that runs once per start
    /// of its nodes).
    pub epoch: Option<weir_wire::Epoch>,
    /// Ingest log settings (ingest-log sources).
    pub log: LogConfig,
    /// When ingested rows are acknowledged.
    pub sync: SyncPolicy,
    /// An ingest-log partition without rows this long stops holding back the watermark: its
    /// source has a watermark marker appended (the wall clock minus this) and goes on from it
    /// (`None`: a partition without rows holds the watermark until rows come).
    pub idle_after: Option<Duration>,
    /// Copies of each ingest-log partition: 1, or 2 (the partition's source's node and the
    /// next node in id order, [`crate::spec::Placement::ingest_follower`]; an append is
    /// acknowledged once durable on both).
    pub ingest_replicas: u8,
    /// Test and demo knob: each sink sleeps this long per result message.
    pub sink_throttle: Option<Duration>,
    /// Checkpoints (and restore from the last commit at start); `None` runs without.
    pub checkpoint: Option<CheckpointSettings>,
    /// Bytes of window state this engine's aggs keep in memory, split evenly between them;
    /// beyond it, state spills to each agg's RocksDB (`None`: all in memory).
    pub state_budget: Option<usize>,
    /// A member of a cluster that restarts its stream on failure (`weir node`): the engine
    /// fails when a peer of the stream vanishes (not when it leaves in order; its new process is
    /// a loss when it comes back) or says its part of the run failed, and tasks not on the coordinator's node take their restore point from
    /// the coordinator instead of reading the commit record themselves (a record it writes
    /// while they restart must not split the stream between two points).
    pub failover: bool,
    /// The stream's last restarts on this node (`weir node` keeps 20), for status.
    pub restarts: Vec<weir_wire::msg::RestartInfo>,
    /// What the node knew of its links to its peers before this engine (a restart), for status
    /// until they change.
    pub links: Vec<weir_wire::msg::PeerLink>,
    /// Told of every ingest append's acknowledgement or refusal (a node's metrics).
    pub ingest_observer: Option<std::sync::Arc<dyn crate::ingest::IngestObserver>>,
    /// The node's hold on its cluster membership (a lease in etcd): while it does not hold,
    /// no ingest append is acknowledged (`None`: always, without a control store).
    pub tenure: Option<std::sync::Arc<crate::cluster::Tenure>>,
    /// What status says of the node's membership (`None`: the cluster has no control store).
    pub member_status: Option<std::sync::Arc<dyn crate::cluster::MemberStatus>>,
    /// Where the stream's checkpoint ids and commit point are kept (`None`: the remote store
    /// alone, [`crate::backup::commit_point::StoreCommits`]).
    pub commits: Option<std::sync::Arc<dyn crate::backup::commit_point::CommitBook>>,
    /// Where the ingest partitions' in-sync sets are kept (`None`: appends of a replicated
    /// partition always wait for its follower, and no set is written), and how long a copy may
    /// take to reach what was durable before this node writes it out (`Duration::MAX`: only a
    /// lost copy is written out), and whether the node may write a late copy out now (it
    /// reaches most of the other members).
    pub in_sync: Option<InSync>,
    /// Set once a client asks for the stream to stop (a `StopReq` to this node or to a peer):
    /// the node's flag, shared by its engines, so that a request that came while a run ended
    /// or failed to start is still honoured.
    pub stop_requested: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A paused run: the node's share of the stream without its tasks (no worker, no
    /// checkpoint). Its ingest partitions still take, replicate and acknowledge appends, its
    /// results stay readable, and the next run goes on from the last commit.
    pub paused: bool,
}

impl EngineConfig {
    /// The run's epoch: [`EngineConfig::epoch`], else the transport's incarnation (0 without).
    pub fn run_epoch(&self) -> weir_wire::Epoch {
        self.epoch.unwrap_or(weir_wire::Epoch(self.transport.as_ref().map_or(0, |t| t.incarnation)))
    }

    /// Defaults for `node` with data under `data_dir`: 2 pinned workers, 16-message local queues,
    /// 64 credits per remote channel.
    pub fn new(node: NodeId, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            node,
            workers: 2,
            pin_workers: true,
            data_dir: data_dir.into(),
            queue_capacity: 16,
            remote_credits: 64,
            transport: None,
            epoch: None,
            log: LogConfig::default(),
            sync: SyncPolicy::GroupCommit(Duration::from_millis(10)),
            idle_after: None,
            ingest_replicas: 1,
            sink_throttle: None,
            checkpoint: None,
            state_budget: None,
            failover: false,
            restarts: Vec::new(),
            links: Vec::new(),
            ingest_observer: None,
            tenure: None,
            member_status: None,
            commits: None,
            in_sync: None,
            stop_requested: Default::default(),
            paused: false,
        }
    }
}

/// Where the ingest partitions' in-sync sets are kept, and when a copy is written out.
#[derive(Clone, Debug)]
pub struct InSync {
    /// The keys, written by this run.
    pub book: std::sync::Arc<crate::cluster::ControlInSync>,
    /// How long a copy may take to reach what was durable before it is written out
    /// (`Duration::MAX`: only a lost copy is).
    pub lag: Duration,
    /// Whether this node may write a late copy out now: it reaches most of the other members.
    pub may_leave: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
