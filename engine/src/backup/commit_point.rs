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
//! they agree on it.

use weir_wire::{CheckpointId, StreamId};

use super::commit::{CommitWrite, last_commit, read_ids, write_commit, write_ids};
use super::{Store, StoreError};
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
            PointError::Fenced { .. } | PointError::Corrupt { .. } => false,
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
    /// The newest commit id this book wrote or read (`None`: it names none, and every record
    /// in the store counts). Retention keeps no record above it, nor counts one.
    fn point(&self) -> Option<CheckpointId>;
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

impl CommitBook for StoreCommits {
    fn begin(&self, store: &dyn Store) -> Result<Begin, PointError> {
        Ok(Begin { ids: read_ids(store, self.stream)?, last: last_commit(store, self.stream)? })
    }

    fn reserve(&self, store: &dyn Store, ids: &IdRecord) -> Result<(), PointError> {
        Ok(write_ids(store, self.stream, ids)?)
    }

    fn commit(&self, store: &dyn Store, record: &CommitRecord) -> CommitWrite {
        write_commit(store, self.stream, record)
    }

    fn last(&self, store: &dyn Store) -> Result<Option<CommitRecord>, PointError> {
        Ok(last_commit(store, self.stream)?)
    }

    fn point(&self) -> Option<CheckpointId> {
        None
    }
}
