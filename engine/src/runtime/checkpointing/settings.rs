//! [`CheckpointSettings`]: how often an engine checkpoints, its timeouts, and where the remote
//! store is.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backup::{LocalDirStore, Store, Throttled};

/// Where checkpoints go.
#[derive(Clone, Debug)]
pub enum Remote {
    /// A local directory (the embedded default; shared by the nodes of one machine).
    Dir(PathBuf),
    /// A store built by the caller (object stores, test stores that inject faults).
    Store(Arc<dyn Store>),
}

/// Checkpoint settings of an engine.
#[derive(Clone, Debug)]
pub struct CheckpointSettings {
    /// Time between checkpoint starts (ms; 0: none but those triggered by hand).
    pub interval_ms: u64,
    /// Minimum pause between the end of one checkpoint and the next start (ms).
    pub min_pause_ms: u64,
    /// A checkpoint running longer fails (ms).
    pub timeout_ms: u64,
    /// Time without an upstream's barrier before retrieving it (ms).
    pub trigger_timeout_ms: u64,
    /// Resend interval of unconfirmed ready messages (ms).
    pub ready_resend_ms: u64,
    /// Consecutive failures before the stream is reported unhealthy.
    pub tolerable_failures: u32,
    /// The remote store.
    pub remote: Remote,
    /// Uploader threads.
    pub uploaders: usize,
    /// Restarting without a commit record: how long the coordinator waits for every task's
    /// consensus request before counting the silent ones as having nothing (ms).
    pub consensus_wait_ms: u64,
    /// How long the coordinator's writes (the id record, a commit record) may take before they
    /// count as failed (ms).
    pub store_timeout_ms: u64,
    /// Committed checkpoints kept in the remote store (older ones and every file only they
    /// name are collected after each commit); 0 keeps everything.
    pub retain: usize,
    /// Upload bandwidth limit of this engine (bytes per second, all uploads together); `None`:
    /// as fast as the store takes them.
    pub upload_limit: Option<u64>,
    /// Aggs take replay snapshots: their windows' starts and where the sources' rows for them
    /// begin, not the windows' entries, and a restore sends the rows again
    /// (`operator::window::replay`). A checkpoint's cost then does not grow with the state; a
    /// restore replays up to the windows' rows, and needs sources that can (the generator and
    /// the ingest logs can). `false`: full snapshots (the entries, incrementally).
    pub replay: bool,
    /// With replay snapshots: the longest a restore's replay may take. A window whose rows
    /// would take longer to replay is written instead (its entries, incrementally) from then
    /// on, until it fires (`runtime/budget.rs`). `None`: no bound (every window is named while
    /// the sources remember where its rows begin).
    pub recovery_budget: Option<std::time::Duration>,
}

impl CheckpointSettings {
    /// Checkpoints every `interval_ms` into the directory `remote_dir`.
    pub fn every(interval_ms: u64, remote_dir: impl Into<PathBuf>) -> Self {
        Self {
            interval_ms,
            min_pause_ms: interval_ms / 4,
            timeout_ms: 30_000,
            trigger_timeout_ms: 10_000,
            ready_resend_ms: 1_000,
            tolerable_failures: 3,
            remote: Remote::Dir(remote_dir.into()),
            uploaders: 4,
            consensus_wait_ms: 10_000,
            store_timeout_ms: 10_000,
            retain: 3,
            upload_limit: None,
            replay: false,
            recovery_budget: Some(std::time::Duration::from_secs(5)),
        }
    }

    /// The remote store.
    pub fn open_store(&self) -> Arc<dyn Store> {
        let store: Arc<dyn Store> = match &self.remote {
            Remote::Dir(d) => Arc::new(LocalDirStore::new(d)),
            Remote::Store(s) => s.clone(),
        };
        match self.upload_limit {
            Some(rate) => Arc::new(Throttled::new(store, rate)),
            None => store,
        }
    }
}
