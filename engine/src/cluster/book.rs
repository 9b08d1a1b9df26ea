//! Where a stream's placement versions are kept, and the one write that moves tasks.
//!
//! - [`ControlBook`]: one key of the control store holds the newest version. A write is a
//!   transaction that compares the leader's fence and the key's revision as it was read, so a
//!   deposed leader, or one that read a placement another has replaced since, writes nothing.
//!
//! Invariant: a write whose reply was lost but which landed is found again by its retry (the
//! same decision: version, tasks and nodes moved) instead of being refused for ever; another
//! decision of the same version is never accepted.

use std::sync::Arc;

use weir_wire::StreamId;

use super::Keys;
use super::record::{PlacementRecord, decode_placement, encode_placement};
use crate::backup::StoreError;
use crate::control::{Compare, ControlError, ControlStore, Op};

/// The newest placement as read, with what a write after it compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The newest record (`None`: version 0, the config file's placement).
    pub record: Option<PlacementRecord>,
    /// The control store's revision of the key when read (0: missing; unused by a store book).
    pub revision: i64,
}

impl Versioned {
    /// The version read (0 without a record).
    pub fn version(&self) -> u32 {
        self.record.as_ref().map_or(0, |r| r.version)
    }
}

/// Why a placement could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    /// The checkpoint store failed (retryable when it says so).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The control store failed (retryable when it says so).
    #[error(transparent)]
    Control(#[from] ControlError),
    /// This node does not lead (or no longer): it may not write placement. Fatal for the write.
    #[error("placement version {version} not written: this node does not lead the cluster")]
    NotLeader {
        /// The version it tried.
        version: u32,
    },
    /// The placement changed since it was read (another leader wrote), a node it moves is a
    /// member again, or this node was deposed between its read and its write. Fatal for the
    /// write: read again.
    #[error("placement version {version} not written: {why}")]
    Refused {
        /// The version it tried.
        version: u32,
        /// What stands instead.
        why: String,
        /// The newest version stored, when it is newer than the one the write followed.
        stands: Option<u32>,
    },
}

impl BookError {
    /// Whether the same write may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        match self {
            BookError::Store(e) => e.is_retryable(),
            BookError::Control(e) => e.is_retryable(),
            BookError::NotLeader { .. } | BookError::Refused { .. } => false,
        }
    }
}

/// The placement's versions of every stream of a cluster.
pub trait PlacementBook: Send + Sync {
    /// The newest version of `stream`'s placement.
    fn latest(&self, stream: StreamId) -> Result<Versioned, BookError>;
    /// Stores `record` (the version after `read`'s) if nothing replaced `read` since, writing
    /// as the leader fenced by `fence` (its first condition, the leader's own; empty: not the
    /// leader) and what else it names; returns the record that stands for it.
    fn write(
        &self,
        stream: StreamId,
        read: &Versioned,
        record: &PlacementRecord,
        fence: &[Compare],
    ) -> Result<PlacementRecord, BookError>;
}

/// Placement in the control store, written by the elected leader only.
pub struct ControlBook {
    store: Arc<dyn ControlStore>,
    keys: Keys,
    /// Writes the store refused (for status and metrics).
    refused: std::sync::atomic::AtomicU64,
}

impl ControlBook {
    /// The book of the cluster whose keys are `keys`.
    pub fn new(store: Arc<dyn ControlStore>, keys: Keys) -> Self {
        Self { store, keys, refused: Default::default() }
    }

    /// Writes the store refused so far: this node was deposed, or another placement stood.
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn same_decision(a: &PlacementRecord, b: &PlacementRecord) -> bool {
        a.version == b.version && a.tasks == b.tasks && a.moved == b.moved
    }
}

impl PlacementBook for ControlBook {
    fn latest(&self, stream: StreamId) -> Result<Versioned, BookError> {
        let key = self.keys.placement(stream);
        match self.store.get(&key)? {
            None => Ok(Versioned { record: None, revision: 0 }),
            Some(e) => Ok(Versioned { record: Some(decode_placement(&key, &e.value)?), revision: e.mod_revision }),
        }
    }

    fn write(
        &self,
        stream: StreamId,
        read: &Versioned,
        record: &PlacementRecord,
        fence: &[Compare],
    ) -> Result<PlacementRecord, BookError> {
        let version = record.version;
        if fence.is_empty() {
            return Err(BookError::NotLeader { version });
        }
        let key = self.keys.placement(stream);
        let put = Op::Put { key: key.clone(), value: encode_placement(record).into_bytes(), lease: None };
        // The nodes it moves away from must still be absent: one that came back in the meantime
        // may have read the old version and started on it.
        let mut when = fence.to_vec();
        when.push(Compare::ModRevision(key, read.revision));
        when.extend(record.moved.iter().map(|n| Compare::ModRevision(self.keys.member(*n), 0)));
        let tried = self.store.txn(&when, &[put]);
        match tried {
            Ok(o) if o.succeeded => return Ok(record.clone()),
            Ok(_) => {}
            Err(e) if !e.is_retryable() => return Err(e.into()),
            Err(_) => {}
        }
        // Refused, or no answer: an earlier try may have landed. Read back; the same decision
        // stands for this one, anything else refuses it.
        let now = self.latest(stream)?;
        let refused = || self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match now.record {
            Some(stored) if Self::same_decision(&stored, record) => Ok(stored),
            Some(stored) if stored.version > read.version() => {
                refused();
                Err(BookError::Refused {
                    version,
                    why: format!("version {} stands, written by another decision", stored.version),
                    stands: Some(stored.version),
                })
            }
            _ => match tried {
                Err(e) => Err(e.into()),
                Ok(_) => {
                    refused();
                    Err(BookError::Refused {
                        version,
                        why: "this node no longer leads the cluster, a node it moves is a member again, or an in-sync set it read changed".into(),
                        stands: None,
                    })
                }
            },
        }
    }
}
