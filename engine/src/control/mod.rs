//! The cluster's control store: a small linearizable key-value store with leases and guarded
//! transactions, behind one trait so that the same cluster logic runs on etcd ([`EtcdControl`],
//! several nodes), in process ([`MemControl`], `weir run` and one node) and in the simulator.
//!
//! What the cluster keeps there is small and decided by few writers: who coordinates
//! ([`Election`]), and the keys every guarded write compares (a leader's lease, a key's revision).
//! Bulk data (checkpoints, results, logs) never goes through it.
//!
//! Invariants every implementation keeps (the contract tests in `control/tests.rs` run each one
//! against them):
//! - Linearizable: a transaction sees every transaction that finished before it started, and
//!   applies its operations all or none.
//! - A key written with a lease is deleted when the lease ends (revoked or expired); an expired
//!   lease cannot be kept alive again.
//! - Revisions grow with every change; a key's `mod_revision` is the revision of its last write,
//!   and a missing key compares as revision 0.

mod election;
mod etcd;
mod mem;

#[cfg(test)]
mod sim;
#[cfg(test)]
pub(crate) mod test_store;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use election::{Election, Role};
pub use etcd::EtcdControl;
pub use mem::{ManualClock, MemControl};

/// A lease: keys written with it live while it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

/// A key as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its value.
    pub value: Vec<u8>,
    /// The revision of its last write.
    pub mod_revision: i64,
    /// The lease it lives by, if any.
    pub lease: Option<LeaseId>,
}

/// A condition of a [`ControlStore::txn`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's last write was at this revision (0: the key is missing).
    ModRevision(String, i64),
    /// The key exists and lives by this lease: the fence of a leader's writes.
    LeaseIs(String, LeaseId),
}

/// A write of a [`ControlStore::txn`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets the key, living by the lease if one is given.
    Put { key: String, value: Vec<u8>, lease: Option<LeaseId> },
    /// Removes the key.
    Delete(String),
}

/// What a transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Every condition held, so every write was applied; otherwise none was.
    pub succeeded: bool,
    /// The store's revision after it.
    pub revision: i64,
}

/// What went wrong talking to the control store.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The store did not answer (down, cut off, or no majority): retryable. A write that failed
    /// this way may still have been applied; callers read back before they write again.
    #[error("control store {endpoint}: {op} failed: {reason} (retryable)")]
    Unavailable { endpoint: String, op: &'static str, reason: String },
    /// The store refused the request as invalid: fatal for that request.
    #[error("control store {endpoint}: {op} refused: {reason}")]
    Refused { endpoint: String, op: &'static str, reason: String },
}

impl ControlError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ControlError::Unavailable { .. })
    }
}

/// The control store's operations: blocking calls, each bounded in time by the implementation.
pub trait ControlStore: Send + Sync {
    /// A new lease that ends `ttl` after its last keep-alive (rounded up to whole seconds, etcd's
    /// unit; stores may grant a longer one).
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError>;
    /// Renews `lease`: the time it has left, or `None` when it has ended already.
    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError>;
    /// Ends `lease` now (its keys go); ending an ended lease is not an error.
    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError>;
    /// The key, if it exists.
    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError>;
    /// The keys under `prefix` with their entries, in key order, at most `limit` of them (a
    /// bound on what one answer may allocate).
    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError>;
    /// Applies `then` if every condition of `when` holds, atomically.
    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError>;
}
