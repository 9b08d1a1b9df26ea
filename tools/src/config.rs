//! The cluster config file of `weir node`: defaults, then the TOML file, then `WEIR_*`
//! environment variables, into typed settings the engine takes.
//!
//! One file describes the whole cluster (every node reads the same file and picks its own entry
//! by id): the nodes and their addresses, the stream, checkpoints and the
//! remote store. An unknown key is an error naming it and its line; an environment variable
//! `WEIR_A__B` sets key `b` of table `a` (`WEIR_CHECKPOINT__INTERVAL=2s`), and
//! `WEIR_CLUSTER_SECRET` the secret (taken raw, never parsed). Variables whose first part names no
//! top-level key (`WEIR_LOG`, say) are not config. Secrets never appear in `Debug` output. Durations are human (`"1s"`, `"250ms"`, `"2m"`), sizes
//! binary (`"512M"`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

mod access;
mod control;
mod load;
mod stream_doc;
mod validate;
pub use access::{ClientEntry, Secret, TlsFile};
pub use control::ControlFile;
pub use load::load;
pub use stream_doc::{parse_stream_doc, rescaled_doc};

/// The file, as written.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Cluster name: peers and clients of another cluster are refused.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The shared secret every node proves (or `WEIR_CLUSTER_SECRET`). Required by nodes.
    pub cluster_secret: Option<Secret>,
    /// Client credentials the nodes accept: a name and a role each (`weir credential` derives
    /// each one's key from the cluster secret).
    #[serde(default)]
    pub clients: Vec<ClientEntry>,
    /// The credential client commands prove instead of the cluster secret, `NAME:KEY` (or
    /// `WEIR_CREDENTIAL`).
    pub credential: Option<Secret>,
    /// Where nodes keep their data: `<data_dir>/node-<id>` unless a node names its own (default
    /// `weir-data` beside the file; relative paths are taken from the file's directory).
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Worker threads per node.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Pin each worker to a core.
    #[serde(default = "default_true")]
    pub pin_workers: bool,
    /// Memory for window state per node, e.g. `"512M"`; beyond it state spills to RocksDB.
    #[serde(default, deserialize_with = "de_size")]
    pub state_budget: Option<u64>,
    /// How long a dropped stream's checkpoints in the remote store and keys in etcd stay after
    /// the drop (the uploads its nodes had in flight end first), e.g. `"1m"`.
    #[serde(default = "default_drop_grace", deserialize_with = "de_duration")]
    pub drop_grace: Duration,
    /// The members.
    pub nodes: Vec<NodeEntry>,
    /// The stream every node runs its share of.
    pub stream: StreamFile,
    /// Checkpoints and the remote store.
    #[serde(default)]
    pub checkpoint: CheckpointFile,
    /// What a node does when its stream fails.
    #[serde(default)]
    pub restart: RestartFile,
    /// TLS 1.3 on every link (none: plain TCP).
    pub tls: Option<TlsFile>,
    /// The etcd cluster that holds membership, the election of the node that decides placement,
    /// and the placement (none: the lowest node decides, from its links).
    pub control: Option<ControlFile>,
}

/// One member.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Node id (1 and up).
    pub id: u32,
    /// Where it listens for peers and clients (and where the others reach it).
    pub addr: SocketAddr,
    /// Its data directory (default `<data_dir>/node-<id>`).
    pub data_dir: Option<PathBuf>,
    /// Its worker threads (default: the cluster's `workers`).
    pub workers: Option<usize>,
    /// Whether its workers are pinned (default: the cluster's `pin_workers`).
    pub pin_workers: Option<bool>,
    /// Where it serves Prometheus metrics over HTTP (`GET /metrics`; default: nowhere).
    pub metrics: Option<SocketAddr>,
}

/// The stream.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct StreamFile {
    /// Stream id.
    #[serde(default = "default_stream_id")]
    pub id: u64,
    /// Name shown in logs and status.
    pub name: Option<String>,
    /// Source partitions (one source task each).
    #[serde(default = "default_two")]
    pub partitions: u32,
    /// Window agg tasks.
    #[serde(default = "default_two")]
    pub aggs: u32,
    /// Sink tasks.
    #[serde(default = "default_one")]
    pub sinks: u32,
    /// The id of the first agg task (sinks follow the aggs). Set by `weir stream rescale`,
    /// which gives the new tasks ids the stream never used; unset, right after the sources.
    pub first_agg_task: Option<u32>,
    /// `"spread"` (every level round robin over the nodes) or a table of task id to node id.
    #[serde(default)]
    pub placement: PlacementFile,
    /// Window size.
    #[serde(default = "default_window", deserialize_with = "de_duration")]
    pub window: Duration,
    /// Window slide (default: the size, tumbling windows).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub slide: Option<Duration>,
    /// Disorder tolerated before rows count as late.
    #[serde(default, deserialize_with = "de_duration")]
    pub watermark_delay: Duration,
    /// Where rows come from: `"generator"` (the `generator` table) or `"ingest"` (each node's
    /// durable ingest log of its partitions, fed by `weir load`; the `ingest` table).
    #[serde(default = "default_source")]
    pub source: String,
    /// The generator source.
    #[serde(default)]
    pub generator: GeneratorFile,
    /// The ingest-log source.
    #[serde(default)]
    pub ingest: IngestFile,
}

impl StreamFile {
    /// Whether rows come from the ingest log (`weir load`).
    pub fn is_ingest(&self) -> bool {
        self.source == "ingest"
    }
}

/// The ingest-log source: when appended rows count as durable and are acknowledged.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct IngestFile {
    /// Group commit: the log syncs (`fdatasync`) at most this often and acknowledges what the
    /// sync made durable; `"0s"` syncs before every acknowledgement.
    #[serde(default = "default_group_commit", deserialize_with = "de_duration")]
    pub group_commit: Duration,
    /// A partition without rows this long stops holding back the stream's watermark (a marker
    /// in its log: the wall clock minus this); `"0s"` (the default): a partition without rows
    /// holds the watermark until rows or a producer's end-of-load marker come. Rows that arrive
    /// after a longer pause (a node's restart included) with earlier event times are late.
    #[serde(default = "default_idle_after", deserialize_with = "de_duration")]
    pub idle_after: Duration,
    /// Copies of each partition's log: 1, or 2 (also on the next node in id order; an append is
    /// acknowledged once durable on every copy in the partition's in-sync set, and a lost node's
    /// sources move to their copies in the set).
    #[serde(default = "default_replicas")]
    pub replicas: u8,
    /// With two copies: an append that waited this long for the follower's copy has the primary
    /// ask etcd to take the copy out of the partition's in-sync set, and appends are then
    /// acknowledged on the primary alone until the copy catches up (at least 2s; `"0s"`:
    /// never, appends wait for the copy).
    #[serde(default = "default_in_sync_lag", deserialize_with = "de_duration")]
    pub in_sync_lag: Duration,
    /// Size of one log segment file, e.g. `"64M"` (at least 1M): retention deletes whole
    /// segments below what the kept checkpoints read, so a log keeps up to one more.
    #[serde(default = "default_segment", deserialize_with = "de_size")]
    pub segment: Option<u64>,
}

fn default_segment() -> Option<u64> {
    Some(64 << 20)
}

impl Default for IngestFile {
    fn default() -> Self {
        toml::from_str("").expect("every ingest key has a default")
    }
}

/// Task placement.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PlacementFile {
    /// `"spread"`.
    Named(String),
    /// Task id (as a string key) to node id; tasks not named go to the lowest node.
    Explicit(BTreeMap<String, u32>),
}

impl Default for PlacementFile {
    fn default() -> Self {
        PlacementFile::Named("spread".into())
    }
}

/// Generator parameters: rows are a pure function of (seed, partition, offset).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct GeneratorFile {
    /// Distinct series keys.
    #[serde(default = "default_keys")]
    pub keys: u64,
    /// Rows per millisecond of event time per partition.
    #[serde(default = "default_rows_per_ms")]
    pub rows_per_ms: u64,
    /// Seed.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Events per second per partition (omit for as fast as possible).
    pub rate: Option<u64>,
    /// Events per partition, then the stream ends (omit for endless).
    pub events: Option<u64>,
    /// Share of rows emitted late, up to `max_disorder`.
    #[serde(default)]
    pub out_of_order: f64,
    /// Largest disorder of a late row.
    #[serde(default, deserialize_with = "de_duration")]
    pub max_disorder: Duration,
}

impl Default for GeneratorFile {
    fn default() -> Self {
        toml::from_str("").expect("every generator key has a default")
    }
}

/// Checkpoints.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct CheckpointFile {
    /// Time between checkpoint starts; `"0s"` turns checkpoints off.
    #[serde(default = "default_interval", deserialize_with = "de_duration")]
    pub interval: Duration,
    /// A checkpoint running longer fails.
    #[serde(default = "default_timeout", deserialize_with = "de_duration")]
    pub timeout: Duration,
    /// Committed checkpoints kept in the store (0: all).
    #[serde(default = "default_retain")]
    pub retain: usize,
    /// `file://PATH`, `s3://bucket/prefix` or `rsync://[user@]host[:port]/module/prefix`
    /// (default `file://<data_dir>/remote`: one directory every node of the machine shares).
    pub remote: Option<String>,
    /// S3 endpoint of a server other than AWS.
    pub s3_endpoint: Option<String>,
    /// S3 region (default `AWS_REGION`, else us-east-1).
    pub s3_region: Option<String>,
    /// File with the rsync user's password (else `RSYNC_PASSWORD`).
    pub rsync_password_file: Option<PathBuf>,
    /// Upload bandwidth limit per node and second, e.g. `"50M"`.
    #[serde(default, deserialize_with = "de_size")]
    pub upload_limit: Option<u64>,
    /// Uploader threads per node.
    #[serde(default = "default_uploaders")]
    pub uploaders: usize,
    /// What an agg's checkpoint holds: `"replay"` (where the sources' rows for its windows
    /// begin; a restore sends them again) or `"full"` (its windows' entries).
    #[serde(default = "default_snapshots", deserialize_with = "de_snapshots")]
    pub snapshots: bool,
    /// With replay snapshots, the longest a restore's replay may take, e.g. `"5s"`, or `"off"`
    /// (no bound): a window whose rows would take longer to replay is written instead.
    #[serde(default = "default_recovery_budget", deserialize_with = "de_recovery_budget")]
    pub recovery_budget: Option<Duration>,
}

fn default_snapshots() -> bool {
    true
}

fn default_recovery_budget() -> Option<Duration> {
    Some(Duration::from_secs(5))
}

/// A recovery budget: the longest a restore's replay may take, or no bound (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecoveryBudget(pub(crate) Option<Duration>);

/// A duration such as `5s`, or `off` (no bound): the recovery budget.
pub(crate) fn parse_recovery_budget(s: &str) -> Result<RecoveryBudget, String> {
    match s.trim() {
        "off" => Ok(RecoveryBudget(None)),
        d => match parse_duration(d)? {
            Duration::ZERO => Err("the recovery budget must be above 0 (or `off`)".to_string()),
            d => Ok(RecoveryBudget(Some(d))),
        },
    }
}

fn de_recovery_budget<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parse_recovery_budget(&String::deserialize(d)?).map(|b| b.0).map_err(serde::de::Error::custom)
}

/// `full` or `replay` (true): what an agg's checkpoint holds.
pub(crate) fn parse_snapshots(s: &str) -> Result<bool, String> {
    match s.trim() {
        "full" => Ok(false),
        "replay" => Ok(true),
        other => Err(format!("snapshots must be `full` or `replay`, not `{other}`")),
    }
}

fn de_snapshots<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    parse_snapshots(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

impl Default for CheckpointFile {
    fn default() -> Self {
        toml::from_str("").expect("every checkpoint key has a default")
    }
}

/// Restarts after a failure (a lost node, a gap on a channel, a task's error), as Flink's
/// restart strategies: a delay before each, and at most `max_restarts` within `window`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RestartFile {
    /// `"fixed-delay"`, `"exponential-backoff"` (the delay doubles with each restart within
    /// `window`, up to `max_delay`) or `"none"` (the node exits at the first failure).
    #[serde(default = "default_strategy")]
    pub strategy: String,
    /// The delay before a restart (the first one, with backoff).
    #[serde(default = "default_restart_delay", deserialize_with = "de_duration")]
    pub delay: Duration,
    /// The longest delay of exponential backoff.
    #[serde(default = "default_max_delay", deserialize_with = "de_duration")]
    pub max_delay: Duration,
    /// Restarts allowed within `window`; one more and the stream is reported failed (exit 2).
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// The time window `max_restarts` counts in.
    #[serde(default = "default_restart_window", deserialize_with = "de_duration")]
    pub window: Duration,
    /// How long a lost node may stay away before its tasks move to the surviving nodes and are
    /// restored there from the remote store (`"0s"`: never; the stream waits for the node).
    /// The elected leader (etcd) decides; any node's tasks move, the coordinator's included.
    #[serde(default = "default_move_after", deserialize_with = "de_duration")]
    pub move_after: Duration,
}

impl Default for RestartFile {
    fn default() -> Self {
        toml::from_str("").expect("every restart key has a default")
    }
}

fn default_strategy() -> String {
    "fixed-delay".into()
}
fn default_restart_delay() -> Duration {
    Duration::from_secs(1)
}
fn default_max_delay() -> Duration {
    Duration::from_secs(30)
}
fn default_max_restarts() -> u32 {
    10
}
fn default_restart_window() -> Duration {
    Duration::from_secs(600)
}
fn default_move_after() -> Duration {
    Duration::from_secs(30)
}

fn default_cluster() -> String {
    "weir".into()
}
fn default_data_dir() -> PathBuf {
    "weir-data".into()
}
fn default_workers() -> usize {
    2
}
fn default_drop_grace() -> Duration {
    Duration::from_secs(60)
}
fn default_true() -> bool {
    true
}
fn default_stream_id() -> u64 {
    1
}
fn default_one() -> u32 {
    1
}
fn default_two() -> u32 {
    2
}
fn default_source() -> String {
    "generator".into()
}
fn default_replicas() -> u8 {
    1
}

fn default_in_sync_lag() -> Duration {
    Duration::from_secs(5)
}

fn default_idle_after() -> Duration {
    Duration::ZERO
}
fn default_group_commit() -> Duration {
    Duration::from_millis(10)
}
fn default_window() -> Duration {
    Duration::from_secs(1)
}
fn default_keys() -> u64 {
    10_000
}
fn default_rows_per_ms() -> u64 {
    1_000
}
fn default_seed() -> u64 {
    42
}
fn default_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_retain() -> usize {
    3
}
fn default_uploaders() -> usize {
    4
}

/// A path from the command line, made absolute from the working directory: what a command
/// prints and its errors name the place it used, wherever it is run from.
pub fn parse_path(s: &str) -> Result<std::path::PathBuf, String> {
    std::path::absolute(s).map_err(|e| format!("{s:?}: {e}"))
}

/// `"1s"`, `"250ms"`, `"1m 30s"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?} is not a duration like 30s, 250ms or 2m: {e}"))
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    de_duration(d).map(Some)
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(b) => Ok(Some(b)),
        Size::Text(s) => crate::run::parse_bytes(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

impl ClusterFile {
    /// The secret; an error when none is set (never a default).
    pub fn secret(&self) -> anyhow::Result<Vec<u8>> {
        match &self.cluster_secret {
            Some(Secret(s)) if !s.is_empty() => Ok(s.as_bytes().to_vec()),
            _ => bail!("no cluster secret: set cluster_secret in the config file or WEIR_CLUSTER_SECRET"),
        }
    }

    /// The entry of node `id`, or of the only node when `id` is `None`.
    pub fn node(&self, id: Option<u32>) -> anyhow::Result<&NodeEntry> {
        let ids = || self.nodes.iter().map(|n| n.id.to_string()).collect::<Vec<_>>().join(", ");
        match id {
            Some(id) => self
                .nodes
                .iter()
                .find(|n| n.id == id)
                .with_context(|| format!("node {id} is not in the config (its nodes: {})", ids())),
            None if self.nodes.len() == 1 => Ok(&self.nodes[0]),
            None => bail!("the config lists nodes {}: say which this is with --node-id N (or WEIR_NODE_ID)", ids()),
        }
    }

    /// The streams the file describes (one today).
    pub fn streams(&self) -> Vec<&StreamFile> {
        vec![&self.stream]
    }
}
