//! The commit point in a control store, as a cluster on etcd keeps it: the engine's own
//! `ControlCommits` on an in-process store that fails transactions, applies them and loses the
//! answer, and fails reads (deterministically, its own seeded random source); coordinators that
//! move to another node (the old one's lease ends, a new placement is written), and the deposed
//! one that tries to write after the move.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_engine::backup::commit::Point;
use weir_engine::backup::commit_point::CommitBook;
use weir_engine::checkpoint::IdRecord;
use weir_engine::cluster::{ControlCommits, Fence, Keys};
use weir_engine::control::{Compare, ControlError, ControlStore, Entry, LeaseId, MemControl, Op, TxnOutcome};
use weir_engine::wire::{CheckpointId, NodeId, TransId};

use super::fx::STREAM;
use super::store::FaultyStore;
use super::world::Rng;

#[derive(Debug, Default)]
struct Faults {
    rng: u64,
    on: bool,
    /// Transactions failed unapplied, applied with the answer lost, reads failed.
    cut: u64,
    lost: u64,
    failed_reads: u64,
}

/// An in-process control store with faults.
pub struct FaultyControl {
    inner: Arc<MemControl>,
    faults: Mutex<Faults>,
}

impl FaultyControl {
    fn roll(&self, per_mille: u64) -> bool {
        let mut f = self.faults.lock().unwrap();
        let mut r = Rng(f.rng);
        let hit = f.on && r.chance(per_mille);
        f.rng = r.0;
        hit
    }

    /// (transactions failed unapplied, applied with the answer lost, reads failed) so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let f = self.faults.lock().unwrap();
        (f.cut, f.lost, f.failed_reads)
    }
}

fn unavailable(op: &'static str) -> ControlError {
    ControlError::Unavailable { endpoint: "sim".into(), op, reason: "injected".into() }
}

impl ControlStore for FaultyControl {
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
        if self.roll(60) {
            self.faults.lock().unwrap().failed_reads += 1;
            return Err(unavailable("get"));
        }
        self.inner.get(key)
    }
    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        self.inner.list(prefix, limit)
    }
    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        if self.roll(80) {
            self.faults.lock().unwrap().cut += 1;
            return Err(unavailable("txn"));
        }
        let out = self.inner.txn(when, then)?;
        if self.roll(80) {
            self.faults.lock().unwrap().lost += 1;
            return Err(unavailable("txn"));
        }
        Ok(out)
    }
}

/// The seed's control store, the node that coordinates and its lease.
pub struct Control {
    pub store: Arc<FaultyControl>,
    keys: Keys,
    node: NodeId,
    lease: LeaseId,
    /// The running coordinator's book.
    pub current: Option<Arc<ControlCommits>>,
    /// The book of a coordinator whose node lost its tasks to another.
    pub deposed: Option<Arc<ControlCommits>>,
}

const LONG: Duration = Duration::from_secs(1 << 30);

impl Control {
    pub fn new(seed: u64) -> Self {
        let inner = Arc::new(MemControl::new());
        let store =
            Arc::new(FaultyControl { inner, faults: Mutex::new(Faults { rng: seed | 1, ..Faults::default() }) });
        let keys = Keys::new("sim");
        let (node, lease) = (NodeId(1), LeaseId(0));
        let mut c = Self { store, keys, node, lease, current: None, deposed: None };
        c.lease = c.member(node);
        c
    }

    pub fn set_faults(&self, on: bool) {
        self.store.faults.lock().unwrap().on = on;
    }

    /// Node `node` becomes a member under a new lease (never ending on its own here).
    fn member(&self, node: NodeId) -> LeaseId {
        let inner = &self.store.inner;
        let lease = inner.grant(LONG).expect("in process");
        let put = Op::Put { key: self.keys.member(node), value: vec![b'1'], lease: Some(lease) };
        inner.txn(&[], &[put]).expect("in process");
        lease
    }

    /// The coordinator's node loses its tasks to another: its lease ends, a leader writes a new
    /// placement, and the coordinator lives on, deposed (a paused process, say), until the
    /// next one starts and after.
    pub fn move_away(&mut self) {
        let inner = self.store.inner.clone();
        inner.revoke(self.lease).expect("in process");
        self.node = NodeId(self.node.0 % 3 + 1);
        self.lease = self.member(self.node);
        let put = Op::Put { key: self.keys.placement(STREAM), value: b"moved".to_vec(), lease: None };
        inner.txn(&[], &[put]).expect("in process");
        if let Some(c) = self.current.take() {
            self.deposed = Some(c);
        }
    }

    /// The book of a coordinator starting now, on the node that holds the tasks.
    pub fn start(&mut self) -> Arc<ControlCommits> {
        let inner = self.store.inner.clone();
        let revision = inner.get(&self.keys.placement(STREAM)).expect("in process").map_or(0, |e| e.mod_revision);
        let fence = Fence::new(&self.keys, STREAM, self.node, self.lease, revision);
        let book = Arc::new(ControlCommits::new(self.store.clone(), &self.keys, STREAM, fence));
        self.current = Some(book.clone());
        book
    }

    /// The ids the key says are reserved, without faults (`None`: no key yet).
    pub fn reserved(&self) -> Option<IdRecord> {
        let e = self.store.inner.get(&self.keys.checkpoints(STREAM)).expect("in process")?;
        let text = String::from_utf8(e.value).expect("text");
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.parse::<u64>().ok());
        Some(IdRecord { next_id: CheckpointId(field("next-id ")?), next_trans: TransId(field("next-trans ")?) })
    }

    /// The commits the key lists, oldest first, without faults.
    pub fn listed(&self, store: &FaultyStore) -> Vec<Point> {
        let reader = ControlCommits::reader(self.store.inner.clone(), &self.keys, STREAM);
        store.calm(|| reader.commits(store)).expect("no faults").unwrap_or_default()
    }
}
