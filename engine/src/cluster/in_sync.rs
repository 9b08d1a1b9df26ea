//! Each ingest partition's in-sync set in the control store, as Kafka's ISR: whether the
//! follower's copy of a partition holds every row its primary acknowledged.
//!
//! One key per partition, `/weir/<cluster>/streams/<id>/in-sync/<partition>`: the primary, the
//! follower, whether the follower is in the set, and which run of the primary wrote it (with
//! the write's number), sealed text with a CRC. Only the primary of the placement that stands
//! writes it, in a transaction fenced as the commit point is ([`Fence`]: its member key still
//! lives by its run's lease, the placement key is at the revision its run read) and compared
//! with the key's revision as this run last confirmed it: its own last write, or the read
//! before its first.
//!
//! Invariants:
//! - Of one run's writes, one lands only if no other write landed since the one it follows; a
//!   run's first write ends every earlier run's chance to land one; a write whose answer was
//!   lost is found by its run and number, never by its value.
//! - The key says a follower is in only when its copy holds every row its primary acknowledged
//!   or let its source read (`crate::ingest::in_sync`), so the leader moves a lost primary's
//!   source to its follower only when the key names that very primary and follower in the set
//!   ([`InSyncRecord::holds_all`]); a missing key, or one of another placement, says nothing.
//! - The leader's move compares the key's revision as it read it, so a primary that came back
//!   and wrote its copy out in the meantime makes the move fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weir_wire::{NodeId, StreamId};

use super::{BookError, Fence, Keys};
use crate::backup::{StoreError, seal, unseal};
use crate::control::{Compare, ControlStore, Op};

/// A partition's in-sync set as one key holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InSyncRecord {
    /// The node of the partition's source (its log is the partition).
    pub primary: NodeId,
    /// The node keeping the copy.
    pub follower: NodeId,
    /// Whether the copy holds every row the primary acknowledged.
    pub in_sync: bool,
    /// The lease the primary's run holds, the run (a number of its process), and the write's
    /// number in the run: together, which write this is.
    pub lease: i64,
    pub run: u64,
    pub seq: u64,
}

impl InSyncRecord {
    /// Whether a lost `primary`'s source may move to `follower`: the record names them and
    /// the follower in the set.
    pub fn holds_all(record: Option<&InSyncRecord>, primary: NodeId, follower: NodeId) -> bool {
        record.is_some_and(|r| r.primary == primary && r.follower == follower && r.in_sync)
    }

    fn encode(&self) -> String {
        seal(format!(
            "weir-in-sync 1\nprimary {}\nfollower {}\nin-sync {}\nlease {}\nrun {}\nseq {}\n",
            self.primary.0,
            self.follower.0,
            u8::from(self.in_sync),
            self.lease,
            self.run,
            self.seq
        ))
    }

    pub(super) fn decode(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
        let body = unseal(key, bytes)?;
        let mut lines = body.lines();
        match lines.next() {
            Some("weir-in-sync 1") => {}
            Some(l) if l.starts_with("weir-in-sync ") => {
                return Err(bad(&format!("written by a newer Weir ({l}; this one reads weir-in-sync 1)")));
            }
            _ => return Err(bad("not an in-sync record")),
        }
        let (mut primary, mut follower, mut in_sync, mut lease, mut run, mut seq) =
            (None, None, None, None, None, None);
        for l in lines {
            let (word, rest) = l.split_once(' ').ok_or_else(|| bad("a line without a value"))?;
            if word == "lease" {
                lease = Some(rest.parse::<i64>().map_err(|_| bad("bad lease"))?);
                continue;
            }
            let n: u64 = rest.parse().map_err(|_| bad("bad number"))?;
            let node = || u32::try_from(n).map(NodeId).map_err(|_| bad("bad node id"));
            match word {
                "primary" => primary = Some(node()?),
                "follower" => follower = Some(node()?),
                "in-sync" if n <= 1 => in_sync = Some(n == 1),
                "run" => run = Some(n),
                "seq" => seq = Some(n),
                _ => return Err(bad("unknown line")),
            }
        }
        match (primary, follower, in_sync, lease, run, seq) {
            (Some(primary), Some(follower), Some(in_sync), Some(lease), Some(run), Some(seq)) => {
                Ok(Self { primary, follower, in_sync, lease, run, seq })
            }
            _ => Err(bad("primary, follower, in-sync, lease, run or seq missing")),
        }
    }
}

/// Why a write of the set did not land (retryable unless another run wrote the key).
#[derive(Debug, thiserror::Error)]
pub enum InSyncError {
    /// The control store or the record failed.
    #[error(transparent)]
    Book(#[from] BookError),
    /// Not written (fenced, or no answer and not found): it may still land until a later
    /// write of this run does.
    #[error("partition {partition}'s in-sync set not written: {why}")]
    NotWritten { partition: u32, why: String },
    /// Another run of a primary wrote the key since this run's last write: this run writes
    /// nothing more to it.
    #[error("partition {partition}'s in-sync set was written by another run (run {run}): this run no longer writes it")]
    Foreign { partition: u32, run: u64 },
}

/// What a run last confirmed of one key.
#[derive(Clone, Copy, Debug)]
enum Base {
    /// The key's revision as this run last read or wrote it (0: missing), and whether a write
    /// of this run landed (before one does, an earlier run's late write only moves the base).
    At(i64, bool),
    /// Another run wrote it after this one did.
    Foreign(u64),
}

/// A stream's in-sync keys: written by one run of a primary, or read by the leader.
pub struct ControlInSync {
    store: Arc<dyn ControlStore>,
    keys: Keys,
    stream: StreamId,
    /// The writing primary's node and fence (`None`: a reader, the leader).
    writer: Option<(NodeId, Fence)>,
    /// This run (a number no other run of any node takes, in practice).
    run: u64,
    bases: Mutex<BTreeMap<u32, Base>>,
}

impl std::fmt::Debug for ControlInSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlInSync").field("stream", &self.stream).field("run", &self.run).finish()
    }
}

impl ControlInSync {
    /// The keys of `stream`, written by a run of primary `me` under `fence`.
    pub fn new(store: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId, me: NodeId, fence: Fence) -> Self {
        // Runs under one lease are runs of one process: a counter tells them apart.
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { store, keys: keys.clone(), stream, writer: Some((me, fence)), run, bases: Mutex::default() }
    }

    /// The keys of `stream`, read only.
    pub fn reader(store: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId) -> Self {
        Self { store, keys: keys.clone(), stream, writer: None, run: 0, bases: Mutex::default() }
    }

    /// Partition `partition`'s key's name.
    pub fn key(&self, partition: u32) -> String {
        self.keys.in_sync(self.stream, partition)
    }

    /// Partition `partition`'s record and the key's revision (0: missing).
    pub fn read(&self, partition: u32) -> Result<(Option<InSyncRecord>, i64), BookError> {
        let key = self.key(partition);
        match self.store.get(&key)? {
            None => Ok((None, 0)),
            Some(e) => Ok((Some(InSyncRecord::decode(&key, &e.value)?), e.mod_revision)),
        }
    }

    /// Writes that `follower`'s copy of partition `partition` is in the set (`in_sync`) or out,
    /// as this run's write number `seq`: `Ok` once the key holds this very write.
    pub fn set(&self, partition: u32, follower: NodeId, in_sync: bool, seq: u64) -> Result<(), InSyncError> {
        let Some((me, fence)) = &self.writer else {
            return Err(InSyncError::NotWritten { partition, why: "a reader writes nothing".into() });
        };
        let base = self.bases.lock().expect("bases").get(&partition).copied();
        let (base, ours) = match base {
            Some(Base::At(rev, ours)) => (rev, ours),
            Some(Base::Foreign(run)) => return Err(InSyncError::Foreign { partition, run }),
            // This run's first write follows the key as it is now (whatever it holds: one
            // that cannot be read is written over).
            None => {
                (self.store.get(&self.key(partition)).map_err(BookError::from)?.map_or(0, |e| e.mod_revision), false)
            }
        };
        let key = self.key(partition);
        let record = InSyncRecord { primary: *me, follower, in_sync, lease: fence.lease.0, run: self.run, seq };
        let mine = |r: &InSyncRecord| r.primary == *me && r.lease == fence.lease.0 && r.run == self.run;
        let mut when = fence.compares();
        when.push(Compare::ModRevision(key.clone(), base));
        let put = Op::Put { key, value: record.encode().into_bytes(), lease: None };
        let tried = self.store.txn(&when, &[put]);
        if let Ok(o) = &tried
            && o.succeeded
        {
            self.rebase(partition, Base::At(o.revision, true));
            return Ok(());
        }
        // Refused or unanswered: this write, or an earlier one of this run, may be there.
        let entry = match self.store.get(&self.key(partition)) {
            Ok(e) => e,
            Err(e) => {
                // Not known where the key is now: the next write reads it first.
                self.bases.lock().expect("bases").remove(&partition);
                return Err(InSyncError::Book(e.into()));
            }
        };
        let rev = entry.as_ref().map_or(0, |e| e.mod_revision);
        let now = entry.and_then(|e| InSyncRecord::decode(&self.key(partition), &e.value).ok());
        match now {
            Some(r) if mine(&r) && rev != base => {
                self.rebase(partition, Base::At(rev, true));
                if r.seq == seq {
                    return Ok(());
                }
            }
            _ if rev != base && ours => {
                let run = now.map_or(0, |r| r.run);
                self.rebase(partition, Base::Foreign(run));
                return Err(InSyncError::Foreign { partition, run });
            }
            // An earlier run's write landed before this run's first: the next try follows it.
            _ if rev != base => self.rebase(partition, Base::At(rev, false)),
            _ => self.rebase(partition, Base::At(base, ours)),
        }
        let why = match tried {
            Err(e) => e.to_string(),
            Ok(_) => "this node's lease ended, or the placement changed".into(),
        };
        Err(InSyncError::NotWritten { partition, why })
    }

    fn rebase(&self, partition: u32, base: Base) {
        self.bases.lock().expect("bases").insert(partition, base);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::atomic::Ordering;

    use super::*;
    use crate::control::LeaseId;
    use crate::control::test_store::Lossy;

    fn faulty() -> Arc<Lossy> {
        Arc::new(Lossy::default())
    }

    const F: NodeId = NodeId(3);

    /// Node 2, a member under a lease, and a run of it writing stream 1's sets.
    fn primary(store: &Arc<Lossy>) -> (LeaseId, Keys) {
        let keys = Keys::new("c");
        let lease = store.grant(Duration::from_secs(5)).unwrap();
        let member = Op::Put { key: keys.member(NodeId(2)), value: b"m".to_vec(), lease: Some(lease) };
        store.txn(&[], &[member]).unwrap();
        (lease, keys)
    }

    fn run(store: &Arc<Lossy>, keys: &Keys, lease: LeaseId) -> ControlInSync {
        let fence = Fence::new(keys, StreamId(1), NodeId(2), lease, 0);
        ControlInSync::new(store.clone(), keys, StreamId(1), NodeId(2), fence)
    }

    /// `isr` writes the copy out (its write 1), then asks it in (write 2), a write the store
    /// holds back: unanswered, and not there yet.
    fn in_on_its_way(store: &Lossy, isr: &ControlInSync) {
        isr.set(0, F, false, 1).unwrap();
        store.hold_txn.store(1, Ordering::Release);
        assert!(isr.set(0, F, true, 2).is_err());
    }

    fn in_sync(isr: &ControlInSync) -> Option<bool> {
        isr.read(0).unwrap().0.map(|r| r.in_sync)
    }

    #[test]
    fn an_in_sync_record_roundtrips_and_a_damaged_one_is_refused() {
        let r = InSyncRecord { primary: NodeId(2), follower: F, in_sync: true, lease: -3, run: 77, seq: 5 };
        assert_eq!(InSyncRecord::decode("k", r.encode().as_bytes()).unwrap(), r);
        let damaged = r.encode().replace("in-sync 1", "in-sync 0");
        assert!(InSyncRecord::decode("k", damaged.as_bytes()).is_err());
        let newer = seal("weir-in-sync 2\n".into());
        assert!(InSyncRecord::decode("k", newer.as_bytes()).unwrap_err().to_string().contains("newer Weir"));
        let two = seal("weir-in-sync 1\nprimary 1\nfollower 2\nin-sync 2\nlease 1\nrun 1\nseq 1\n".into());
        assert!(InSyncRecord::decode("k", two.as_bytes()).is_err());
    }

    #[test]
    fn only_a_record_naming_the_very_primary_and_follower_in_the_set_lets_a_source_move() {
        let (p, f) = (NodeId(2), F);
        let r = |primary, follower, in_sync| InSyncRecord { primary, follower, in_sync, lease: 1, run: 1, seq: 1 };
        assert!(InSyncRecord::holds_all(Some(&r(p, f, true)), p, f));
        assert!(!InSyncRecord::holds_all(None, p, f), "nothing written: nothing known");
        assert!(!InSyncRecord::holds_all(Some(&r(p, f, false)), p, f));
        // Written under another placement: another primary or follower.
        assert!(!InSyncRecord::holds_all(Some(&r(NodeId(1), f, true)), p, f));
        assert!(!InSyncRecord::holds_all(Some(&r(p, NodeId(1), true)), p, f));
    }

    #[test]
    fn the_set_is_written_under_the_primarys_fence_and_refused_once_its_lease_ended() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let isr = run(&store, &keys, lease);
        assert_eq!(isr.read(0).unwrap(), (None, 0));
        isr.set(0, F, false, 1).unwrap();
        assert_eq!(in_sync(&isr), Some(false));
        isr.set(0, F, true, 2).unwrap();
        let reader = ControlInSync::reader(store.clone(), &keys, StreamId(1));
        assert_eq!(in_sync(&reader), Some(true));
        assert!(reader.set(0, F, false, 1).is_err(), "a reader writes nothing");
        store.revoke(lease).unwrap();
        let e = isr.set(0, F, false, 3).unwrap_err().to_string();
        assert!(e.contains("not written"), "{e}");
        assert_eq!(in_sync(&reader), Some(true), "a deposed primary's write refused");
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_found_by_its_run_and_number() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let isr = run(&store, &keys, lease);
        isr.set(0, F, false, 1).unwrap();
        store.lose_txn.store(1, Ordering::Release);
        isr.set(0, F, true, 2).unwrap();
        assert_eq!(in_sync(&isr), Some(true));
        isr.set(0, F, false, 3).unwrap();
    }

    #[test]
    fn a_write_still_on_its_way_never_lands_after_a_later_write_of_its_run() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let isr = run(&store, &keys, lease);
        // "In", unanswered and not there yet: unknown.
        in_on_its_way(&store, &isr);
        // "Out" lands: the writer may now acknowledge alone...
        isr.set(0, F, false, 3).unwrap();
        // ... so the late "in" must not land.
        assert_eq!(store.deliver(), [false]);
        assert_eq!(in_sync(&isr), Some(false));
    }

    #[test]
    fn a_late_write_of_this_run_is_found_when_the_next_is_refused() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let isr = run(&store, &keys, lease);
        in_on_its_way(&store, &isr);
        assert_eq!(store.deliver(), [true], "it lands after all");
        // The next write follows the one that landed.
        assert!(isr.set(0, F, false, 3).is_err(), "refused: it compared the revision before");
        isr.set(0, F, false, 4).unwrap();
        assert_eq!(in_sync(&isr), Some(false));
    }

    #[test]
    fn a_runs_first_write_ends_every_earlier_runs_writes() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let old = run(&store, &keys, lease);
        // On its way while the node restarts its stream.
        in_on_its_way(&store, &old);
        let new = run(&store, &keys, lease);
        new.set(0, F, false, 1).unwrap();
        assert_eq!(store.deliver(), [false], "the old run's write never lands");
        let e = old.set(0, F, true, 3).unwrap_err();
        assert!(matches!(e, InSyncError::Foreign { .. }), "{e}");
        assert_eq!(in_sync(&new), Some(false));
    }

    #[test]
    fn an_earlier_runs_write_landing_before_a_runs_first_only_moves_where_it_follows() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let old = run(&store, &keys, lease);
        in_on_its_way(&store, &old);
        let new = run(&store, &keys, lease);
        // The new run reads the key, then the old write lands before the new run's first.
        let base = new.read(0).unwrap().1;
        new.rebase(0, Base::At(base, false));
        assert_eq!(store.deliver(), [true]);
        assert!(new.set(0, F, false, 1).is_err(), "refused: the key moved");
        new.set(0, F, false, 2).unwrap();
        assert_eq!(in_sync(&new), Some(false));
    }

    #[test]
    fn a_key_that_cannot_be_read_is_written_over_and_strands_a_move_until_then() {
        let store = faulty();
        let (lease, keys) = primary(&store);
        let isr = run(&store, &keys, lease);
        let garbage = Op::Put { key: isr.key(0), value: b"weir-in-sync 1\nold".to_vec(), lease: None };
        store.txn(&[], &[garbage]).unwrap();
        assert!(isr.read(0).is_err(), "the leader reads nothing from it");
        isr.set(0, F, true, 1).unwrap();
        assert_eq!(in_sync(&isr), Some(true));
    }
}
