//! Test doubles for the cluster code's unit tests and simulators: the in-process store whose
//! transactions can fail unapplied, be applied with their answer lost, or be held back and
//! delivered later (still on their way), and whose reads can fail, each fault a count of the
//! next calls it hits ([`Lossy`]); and the store as one node reaches it through a link that is
//! up, cut, or loses replies ([`Linked`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{Compare, ControlError, ControlStore, Entry, LeaseId, MemControl, Op, TxnOutcome};

/// A [`MemControl`] with faults.
#[derive(Default)]
pub(crate) struct Lossy {
    pub(crate) inner: MemControl,
    /// Transactions still to apply and then answer with an error.
    pub(crate) lose_txn: AtomicU32,
    /// Reads still to fail.
    pub(crate) fail_get: AtomicU32,
    /// Transactions still to fail unapplied.
    pub(crate) cut_txn: AtomicU32,
    /// Transactions still to hold back (answered with an error) until [`Lossy::deliver`].
    pub(crate) hold_txn: AtomicU32,
    /// Writes still to pass untouched before the faults above apply.
    pub(crate) pass_writes: AtomicU32,
    held: Mutex<Vec<(Vec<Compare>, Vec<Op>)>>,
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1)).is_ok()
}

fn lost(op: &'static str) -> ControlError {
    ControlError::Unavailable { endpoint: "test".into(), op, reason: "no reply".into() }
}

impl Lossy {
    /// Applies the held transactions, in order: whether each landed.
    pub(crate) fn deliver(&self) -> Vec<bool> {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        held.iter().map(|(w, t)| self.inner.txn(w, t).unwrap().succeeded).collect()
    }
}

impl ControlStore for Lossy {
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError> {
        self.inner.grant(ttl)
    }
    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError> {
        self.inner.keep_alive(lease)
    }
    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError> {
        self.inner.revoke(lease)
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError> {
        if take(&self.fail_get) { Err(lost("get")) } else { self.inner.get(key) }
    }
    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        self.inner.list(prefix, limit)
    }
    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        if !then.is_empty() && take(&self.pass_writes) {
            return self.inner.txn(when, then);
        }
        if take(&self.cut_txn) {
            return Err(lost("txn"));
        }
        if !then.is_empty() && take(&self.hold_txn) {
            self.held.lock().unwrap().push((when.to_vec(), then.to_vec()));
            return Err(lost("txn"));
        }
        let out = self.inner.txn(when, then)?;
        // Only a write's answer: a check that writes nothing has nothing to lose.
        if !then.is_empty() && take(&self.lose_txn) { Err(lost("txn")) } else { Ok(out) }
    }
}

/// What a node's calls to the store meet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Link {
    #[default]
    Up,
    /// Every call fails, unapplied.
    Cut,
    /// Calls are applied, their replies lost.
    LosesReplies,
}

/// The in-process store as one node reaches it, through a link the simulator changes.
pub(crate) struct Linked {
    store: std::sync::Arc<MemControl>,
    link: std::sync::Arc<Mutex<Link>>,
}

impl Linked {
    pub(crate) fn new(store: std::sync::Arc<MemControl>, link: std::sync::Arc<Mutex<Link>>) -> Self {
        Self { store, link }
    }

    fn pass<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T, ControlError>) -> Result<T, ControlError> {
        let link = *self.link.lock().unwrap_or_else(|p| p.into_inner());
        match link {
            Link::Up => f(),
            Link::Cut => Err(lost(op)),
            Link::LosesReplies => f().and_then(|_| Err(lost(op))),
        }
    }
}

impl ControlStore for Linked {
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError> {
        self.pass("grant", || self.store.grant(ttl))
    }
    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError> {
        self.pass("keep-alive", || self.store.keep_alive(lease))
    }
    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError> {
        self.pass("revoke", || self.store.revoke(lease))
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError> {
        self.pass("get", || self.store.get(key))
    }
    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        self.pass("list", || self.store.list(prefix, limit))
    }
    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        self.pass("txn", || self.store.txn(when, then))
    }
}
