//! Where a stream's commit point and checkpoint ids are kept: the trait the coordinator reserves
//! ids and commits through, and its form on the remote store alone.
//!
//! - [`StoreCommits`]: the remote store alone (`weir run`, one node, a cluster without a control
//!   store): the id record, and commit records, the newest that decodes being the last commit.
//! - `cluster::ControlCommits`: one key of the control store holds the ids reserved and names
//!   the last commit (its id and its record's checksum), written only in transactions fenced by
//!   the coordinator's lease and the stream's placement, so a deposed coordinator commits
//!   nothing and exactly one commit exists per id.
//!
//! Invariants: a commit counts only once [`CommitBook::commit`] answers `Durable`; every reader
//! of the last commit (a restart, retention, `weir verify`) reads it through the same book, so
//! they agree on it. A stream whose point a control store holds says so in the store
//! ([`control_marker`]), and the store alone then refuses to name its last commit rather than
//! name one the control store does not.

use weir_wire::{CheckpointId, StreamId};

use super::commit::{CommitWrite, Point, last_commit, read_ids, write_commit, write_ids};
use super::{Store, StoreError, seal, unseal};
use crate::checkpoint::{CommitRecord, IdRecord};
use crate::control::ControlError;

/// Why a book could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PointError {
    /// The remote store failed (retryable when it says so).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The control store failed (retryable when it says so; a write that failed this way may
    /// have landed, and is read back before the next).
    #[error(transparent)]
    Control(#[from] ControlError),
    /// This coordinator may no longer write: its node's lease ended, the stream's placement
    /// changed since its run began, or another coordinator wrote. Fatal for the run.
    #[error("stream {stream}: {why}")]
    Fenced {
        /// The stream.
        stream: StreamId,
        /// What stands instead.
        why: String,
    },
    /// The stream's commit point is in the control store of cluster `cluster`, which this book
    /// does not read. Fatal.
    #[error(
        "stream {stream}: its commit point is in the control store (etcd) of cluster {cluster}: read it there \
         (the cluster's config file, or --etcd URLS --cluster {cluster})"
    )]
    Elsewhere {
        /// The stream.
        stream: StreamId,
        /// The cluster whose control store holds it.
        cluster: String,
    },
    /// A commit older than the point it would follow: a coordinator out of step with the
    /// control store (a restore from a record the point does not name). Fatal for the run.
    #[error("stream {stream}: checkpoint {id} is not newer than the last commit, {point}")]
    Stale {
        /// The stream.
        stream: StreamId,
        /// The record's id.
        id: CheckpointId,
        /// The commit the point names.
        point: CheckpointId,
    },
    /// The control store's key holds something no Weir wrote. Fatal.
    #[error("stream {stream}: the checkpoint key {key} is damaged: {reason}")]
    Corrupt {
        /// The stream.
        stream: StreamId,
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl PointError {
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        match self {
            PointError::Store(e) => e.is_retryable(),
            PointError::Control(e) => e.is_retryable(),
            PointError::Fenced { .. }
            | PointError::Corrupt { .. }
            | PointError::Elsewhere { .. }
            | PointError::Stale { .. } => false,
        }
    }
}

/// Where a coordinator starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Begin {
    /// Ids and transactions below these are reserved (used, maybe).
    pub ids: IdRecord,
    /// The last commit.
    pub last: Option<CommitRecord>,
}

/// A stream's ids and commit point.
pub trait CommitBook: Send + Sync + std::fmt::Debug {
    /// Reads where a coordinator starts: the ids reserved and the last commit. A book that
    /// writes with a fence reads what its first write compares here.
    fn begin(&self, store: &dyn Store) -> Result<Begin, PointError>;
    /// Reserves every id and transaction below `ids`, durably.
    fn reserve(&self, store: &dyn Store, ids: &IdRecord) -> Result<(), PointError>;
    /// Makes `record` the last commit: writes its record to `store`, then moves the point. A
    /// record this answers `Failed` or `Fenced` for is no commit.
    fn commit(&self, store: &dyn Store, record: &CommitRecord) -> CommitWrite;
    /// The last commit, as a reader sees it now.
    fn last(&self, store: &dyn Store) -> Result<Option<CommitRecord>, PointError>;
    /// The commits as this book last wrote or read them, oldest first (`None`: the store's
    /// records are the commits). Retention counts a record only as listed, and neither counts
    /// nor deletes one above the newest.
    fn listed(&self) -> Option<Vec<Point>>;
    /// The commits as they stand now (a fresh read; `None` as for [`Self::listed`]): which
    /// older commits a task may go back to.
    fn commits(&self, store: &dyn Store) -> Result<Option<Vec<Point>>, PointError>;
}

/// Key of the record saying a control store holds the stream's commit point.
pub fn marker_key(stream: StreamId) -> String {
    format!("{}/coordinator/control", stream.0)
}

/// What the store says of the control store that holds the stream's commit point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The cluster whose control store it is.
    pub cluster: String,
    /// The control store's key was written (`false`: a takeover from the store's records began
    /// and may not have reached the control store).
    pub held: bool,
}

/// Says in the store that cluster `cluster`'s control store holds (or is taking over) the
/// stream's commit point.
pub fn write_control_marker(store: &dyn Store, stream: StreamId, m: &Marker) -> Result<(), StoreError> {
    let state = if m.held { "held" } else { "taking-over" };
    store.put(&marker_key(stream), seal(format!("weir-control 2\ncluster {}\n{state}\n", m.cluster)).as_bytes())
}

/// The control store that holds the stream's commit point, if the store names one.
pub fn control_marker(store: &dyn Store, stream: StreamId) -> Result<Option<Marker>, StoreError> {
    let key = marker_key(stream);
    let bytes = match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(b) => b,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let body = unseal(&key, &bytes)?;
    let bad = || StoreError::Corrupt { key: key.clone(), reason: "not a control record".into() };
    let mut lines = body.lines();
    if lines.next() != Some("weir-control 2") {
        return Err(bad());
    }
    let cluster = lines.next().and_then(|l| l.strip_prefix("cluster ")).ok_or_else(bad)?.to_string();
    let held = match lines.next() {
        Some("held") => true,
        Some("taking-over") => false,
        _ => return Err(bad()),
    };
    Ok(Some(Marker { cluster, held }))
}

/// The ids and commits in the remote store alone.
#[derive(Clone, Copy, Debug)]
pub struct StoreCommits {
    stream: StreamId,
}

impl StoreCommits {
    /// Stream `stream`'s records in the store it is given.
    pub fn new(stream: StreamId) -> Self {
        Self { stream }
    }
}

impl StoreCommits {
    /// Refuses a stream whose commit point a control store holds.
    fn mine(&self, store: &dyn Store) -> Result<(), PointError> {
        match control_marker(store, self.stream)? {
            Some(m) => Err(PointError::Elsewhere { stream: self.stream, cluster: m.cluster }),
            None => Ok(()),
        }
    }
}

impl CommitBook for StoreCommits {
    fn begin(&self, store: &dyn Store) -> Result<Begin, PointError> {
        self.mine(store)?;
        Ok(Begin { ids: read_ids(store, self.stream)?, last: last_commit(store, self.stream)? })
    }

    fn reserve(&self, store: &dyn Store, ids: &IdRecord) -> Result<(), PointError> {
        Ok(write_ids(store, self.stream, ids)?)
    }

    fn commit(&self, store: &dyn Store, record: &CommitRecord) -> CommitWrite {
        write_commit(store, self.stream, record)
    }

    fn last(&self, store: &dyn Store) -> Result<Option<CommitRecord>, PointError> {
        self.mine(store)?;
        Ok(last_commit(store, self.stream)?)
    }

    fn listed(&self) -> Option<Vec<Point>> {
        None
    }

    fn commits(&self, store: &dyn Store) -> Result<Option<Vec<Point>>, PointError> {
        self.mine(store)?;
        Ok(None)
    }
}
