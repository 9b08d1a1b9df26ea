//! [`ControlCommits`] on the in-process control store and a store directory: the commit point
//! and ids in one fenced key, what a restart, retention and a reader make of records above it,
//! and writes whose answers were lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_wire::{CheckpointId, NodeId, StreamId, TransId};

use super::{ControlCommits, Fence, Keys};
use crate::backup::commit::{CommitWrite, commit_key, encode_commit, write_ids};
use crate::backup::commit_point::{CommitBook, PointError, StoreCommits};
use crate::backup::inspect::list_commits_in;
use crate::backup::retention::{CollectOptions, Collector};
use crate::backup::{LocalDirStore, Store};
use crate::checkpoint::{CommitRecord, IdRecord, RecordKind};
use crate::control::test_store::Lossy;
use crate::control::{ControlStore, LeaseId, Op};

const S: StreamId = StreamId(1);

fn rec(id: u64) -> CommitRecord {
    CommitRecord {
        id: CheckpointId(id),
        kind: RecordKind::Commit(TransId(id)),
        versions: Default::default(),
        manifests: Default::default(),
        ts: id,
        shape: None,
        savepoint: false,
    }
}

/// A cluster: the control store, node 1 a member under a lease, and the stream's store.
struct World {
    control: Arc<Lossy>,
    keys: Keys,
    lease: LeaseId,
    _dir: tempfile::TempDir,
    store: LocalDirStore,
}

impl World {
    fn new() -> Self {
        let control = Arc::new(Lossy::default());
        let keys = Keys::new("test");
        let lease = control.grant(Duration::from_secs(10)).unwrap();
        control.txn(&[], &[Op::Put { key: keys.member(NodeId(1)), value: b"1".to_vec(), lease: Some(lease) }]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        Self { control, keys, lease, _dir: dir, store }
    }

    /// Node 1's coordinator at the placement as it stands now.
    fn coordinator(&self) -> ControlCommits {
        let placement = self.control.get(&self.keys.placement(S)).unwrap().map_or(0, |e| e.mod_revision);
        let fence = Fence::new(&self.keys, S, NodeId(1), self.lease, placement);
        ControlCommits::new(self.control.clone(), &self.keys, S, fence)
    }

    fn reader(&self) -> ControlCommits {
        ControlCommits::reader(self.control.clone(), &self.keys, S)
    }

    fn last(&self) -> Option<CheckpointId> {
        self.reader().last(&self.store).unwrap().map(|r| r.id)
    }
}

fn ids(next: u64) -> IdRecord {
    IdRecord { next_id: CheckpointId(next), next_trans: TransId(next) }
}

#[test]
fn a_commit_moves_the_point_and_a_restart_begins_from_it() {
    let w = World::new();
    let c = w.coordinator();
    let b = c.begin(&w.store).unwrap();
    assert_eq!((b.ids, b.last), (IdRecord::default(), None), "nothing yet");
    c.reserve(&w.store, &ids(513)).unwrap();
    assert_eq!(c.commit(&w.store, &rec(1)), CommitWrite::Durable);
    assert_eq!(c.commit(&w.store, &rec(2)), CommitWrite::Durable);
    assert_eq!(c.listed().unwrap().iter().map(|p| p.id.0).collect::<Vec<_>>(), [1, 2]);
    let again = w.coordinator().begin(&w.store).unwrap();
    assert_eq!((again.ids, again.last), (ids(513), Some(rec(2))));
    assert_eq!(w.last(), Some(CheckpointId(2)));
    // The ids are in the control store, not in the store's id record; the store says so.
    assert!(w.store.get("1/coordinator/ids").is_err());
    let alone = StoreCommits::new(S).begin(&w.store);
    assert!(matches!(&alone, Err(PointError::Elsewhere { cluster, .. }) if cluster == "test"), "{alone:?}");
    assert!(matches!(StoreCommits::new(S).last(&w.store), Err(PointError::Elsewhere { .. })));
}

#[test]
fn a_record_the_key_does_not_list_is_no_commit_for_a_restart_a_reader_a_task_going_back_or_retention() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    assert_eq!(c.commit(&w.store, &rec(1)), CommitWrite::Durable);
    // A coordinator wrote record 2 and died before its transaction.
    w.store.put(&commit_key(S, CheckpointId(2)), encode_commit(&rec(2)).as_bytes()).unwrap();
    // The restarted coordinator.
    let c = w.coordinator();
    assert_eq!(c.begin(&w.store).unwrap().last, Some(rec(1)));
    assert_eq!(w.last(), Some(CheckpointId(1)));
    assert!(matches!(StoreCommits::new(S).last(&w.store), Err(PointError::Elsewhere { .. })), "the store alone");
    let opts = CollectOptions { keep: 1, dry_run: false, stopped: false, listed: c.listed(), ahead_runs_below: 0 };
    let done = Collector::new().collect_with(&w.store, S, opts).unwrap();
    assert_eq!(done.kept, vec![CheckpointId(1)], "the commit is kept, the record above neither counted ...");
    assert!(w.store.get(&commit_key(S, CheckpointId(2))).is_ok(), "... nor deleted");
    // Below the point once 3 commits: still no commit, for a task going back or retention.
    assert_eq!(c.commit(&w.store, &rec(3)), CommitWrite::Durable);
    let listed = c.commits(&w.store).unwrap();
    let ids: Vec<u64> = list_commits_in(&w.store, S, listed.as_deref()).unwrap().iter().map(|r| r.id.0).collect();
    assert_eq!(ids, [1, 3]);
    let opts = CollectOptions { keep: 3, dry_run: false, stopped: false, listed: c.listed(), ahead_runs_below: 0 };
    assert_eq!(Collector::new().collect_with(&w.store, S, opts).unwrap().kept, [CheckpointId(1), CheckpointId(3)]);
    // Record 3 replaced behind the point's back: it is not the one committed; 1 is the last.
    let mut other = rec(3);
    other.ts = 99;
    w.store.put(&commit_key(S, CheckpointId(3)), encode_commit(&other).as_bytes()).unwrap();
    assert_eq!(w.last(), Some(CheckpointId(1)));
}

#[test]
fn a_coordinator_whose_placement_changed_commits_nothing() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    assert_eq!(c.commit(&w.store, &rec(1)), CommitWrite::Durable);
    // A leader moved tasks: a new placement, a new epoch.
    w.control.txn(&[], &[Op::Put { key: w.keys.placement(S), value: b"v1".to_vec(), lease: None }]).unwrap();
    let refused = c.commit(&w.store, &rec(2));
    assert!(matches!(&refused, CommitWrite::Refused(why) if why.contains("placement changed")), "{refused:?}");
    assert!(w.store.get(&commit_key(S, CheckpointId(2))).is_err(), "a fenced coordinator wrote its record");
    assert!(matches!(c.reserve(&w.store, &ids(1025)), Err(PointError::Fenced { .. })));
    assert_eq!(w.last(), Some(CheckpointId(1)));
    // The run at the new placement commits.
    let next = w.coordinator();
    next.begin(&w.store).unwrap();
    assert_eq!(next.commit(&w.store, &rec(3)), CommitWrite::Durable);
    assert_eq!(w.last(), Some(CheckpointId(3)));
}

#[test]
fn a_coordinator_whose_lease_ended_commits_nothing() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    w.control.revoke(w.lease).unwrap();
    let refused = c.commit(&w.store, &rec(1));
    assert!(matches!(&refused, CommitWrite::Refused(why) if why.contains("lease")), "{refused:?}");
    assert_eq!(w.last(), None);
}

#[test]
fn two_coordinators_of_one_placement_cannot_both_commit() {
    let w = World::new();
    let (a, b) = (w.coordinator(), w.coordinator());
    a.begin(&w.store).unwrap();
    b.begin(&w.store).unwrap();
    assert_eq!(b.commit(&w.store, &rec(5)), CommitWrite::Durable);
    let refused = a.commit(&w.store, &rec(6));
    assert!(matches!(&refused, CommitWrite::Refused(why) if why.contains("another coordinator")), "{refused:?}");
    assert_eq!(w.last(), Some(CheckpointId(5)));
}

#[test]
fn a_commit_whose_answer_was_lost_is_read_back_or_found_by_the_next_write() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    // Applied, its answer lost: the read back finds it.
    w.control.pass_writes.store(1, Ordering::Release);
    w.control.lose_txn.store(1, Ordering::Release);
    assert_eq!(c.commit(&w.store, &rec(1)), CommitWrite::Durable);
    // Applied, its answer lost and the read back failing too: failed as far as it knows ...
    w.control.pass_writes.store(1, Ordering::Release);
    w.control.lose_txn.store(1, Ordering::Release);
    w.control.fail_get.store(1, Ordering::Release);
    assert!(matches!(c.commit(&w.store, &rec(2)), CommitWrite::Failed(_)));
    assert_eq!(w.last(), Some(CheckpointId(2)), "it landed");
    // ... and the next write finds its own write there and goes on from it.
    c.reserve(&w.store, &ids(1025)).unwrap();
    assert_eq!(c.commit(&w.store, &rec(3)), CommitWrite::Durable);
    assert_eq!(w.last(), Some(CheckpointId(3)));
    // Not applied at all: failed, and the next try succeeds.
    w.control.pass_writes.store(1, Ordering::Release);
    w.control.cut_txn.store(1, Ordering::Release);
    assert!(matches!(c.commit(&w.store, &rec(4)), CommitWrite::Failed(_)));
    assert_eq!(w.last(), Some(CheckpointId(3)));
    assert_eq!(c.commit(&w.store, &rec(5)), CommitWrite::Durable);
    let b = w.coordinator().begin(&w.store).unwrap();
    assert_eq!((b.ids, b.last.map(|r| r.id)), (ids(1025), Some(CheckpointId(5))));
}

#[test]
fn a_cluster_whose_records_were_in_the_store_alone_takes_them_over_once() {
    let w = World::new();
    write_ids(&w.store, S, &ids(513)).unwrap();
    assert_eq!(StoreCommits::new(S).commit(&w.store, &rec(3)), CommitWrite::Durable);
    let (a, b) = (w.coordinator(), w.coordinator());
    let begun = a.begin(&w.store).unwrap();
    assert_eq!((begun.ids, begun.last.map(|r| r.id)), (ids(513), Some(CheckpointId(3))));
    assert!(w.control.get(&w.keys.checkpoints(S)).unwrap().is_some(), "taken over before anything else");
    // The run that began last holds the key.
    b.begin(&w.store).unwrap();
    assert!(matches!(a.reserve(&w.store, &ids(1025)), Err(PointError::Fenced { .. })), "one writer at a time");
    b.reserve(&w.store, &ids(1025)).unwrap();
    assert_eq!(w.last(), Some(CheckpointId(3)));
    assert_eq!(b.commit(&w.store, &rec(4)), CommitWrite::Durable);
    assert_eq!(w.last(), Some(CheckpointId(4)));
}

#[test]
fn a_damaged_key_is_an_error_not_a_fresh_start() {
    let w = World::new();
    w.control.txn(&[], &[Op::Put { key: w.keys.checkpoints(S), value: b"next-id 1".to_vec(), lease: None }]).unwrap();
    assert!(matches!(w.coordinator().begin(&w.store), Err(PointError::Corrupt { .. })));
    assert!(matches!(w.reader().last(&w.store), Err(PointError::Corrupt { .. })));
}

#[test]
fn a_new_run_fences_the_runs_before_it_on_the_same_node() {
    let w = World::new();
    let old = w.coordinator();
    old.begin(&w.store).unwrap();
    assert_eq!(old.commit(&w.store, &rec(1)), CommitWrite::Durable);
    // The node restarts its stream (same lease, same placement): the new run claims the key.
    let new = w.coordinator();
    new.begin(&w.store).unwrap();
    let late = old.commit(&w.store, &rec(2));
    assert!(matches!(&late, CommitWrite::Refused(why) if why.contains("another coordinator")), "{late:?}");
    assert!(matches!(old.reserve(&w.store, &ids(1025)), Err(PointError::Fenced { .. })));
    assert_eq!(new.commit(&w.store, &rec(2)), CommitWrite::Durable);
}

#[test]
fn a_key_that_names_no_commit_restores_nothing_whatever_the_store_holds() {
    let w = World::new();
    w.coordinator().begin(&w.store).unwrap(); // the key, naming no commit
    // A record written whose transaction never landed.
    w.store.put(&commit_key(S, CheckpointId(1)), encode_commit(&rec(1)).as_bytes()).unwrap();
    assert_eq!(w.coordinator().begin(&w.store).unwrap().last, None);
    assert_eq!(w.last(), None);
    let listed = w.coordinator().commits(&w.store).unwrap();
    assert_eq!(listed, Some(Vec::new()));
    let done = Collector::new().collect_with(
        &w.store,
        S,
        CollectOptions { keep: 1, dry_run: false, stopped: false, listed, ahead_runs_below: 0 },
    );
    assert!(done.unwrap().kept.is_empty());
}

#[test]
fn a_consensus_takes_an_id_past_the_point_and_an_older_commit_is_refused() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    assert_eq!(c.commit(&w.store, &rec(5)), CommitWrite::Durable);
    // A checkpoint in flight across a fallback (the stream went back past it): failed, unwritten.
    let stale = c.commit(&w.store, &rec(4));
    assert!(matches!(&stale, CommitWrite::Failed(why) if why.contains("not newer")), "{stale:?}");
    assert!(w.store.get(&commit_key(S, CheckpointId(4))).is_err());
    // The record of 5 is lost; the tasks agree on 5 again: the consensus record goes back to it
    // under an id of its own. One that reused 5's would write a key a second time: refused.
    w.store.delete(&commit_key(S, CheckpointId(5))).unwrap();
    let again = w.coordinator();
    let begun = again.begin(&w.store).unwrap();
    assert_eq!(begun.last, None);
    assert!(begun.ids.next_id > CheckpointId(5), "{begun:?}");
    let reused = again.commit(&w.store, &CommitRecord::consensus(CheckpointId(5), CheckpointId(5), 9));
    assert!(matches!(&reused, CommitWrite::Refused(why) if why.contains("not newer")), "{reused:?}");
    assert!(w.store.get(&commit_key(S, CheckpointId(5))).is_err());
    let consensus = CommitRecord::consensus(begun.ids.next_id, CheckpointId(5), 9);
    assert_eq!(again.commit(&w.store, &consensus), CommitWrite::Durable);
    assert_eq!(w.reader().last(&w.store).unwrap(), Some(consensus));
}

#[test]
fn ids_pass_every_commit_even_an_unreserved_fresh_start_whose_record_is_lost() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    c.reserve(&w.store, &ids(257)).unwrap();
    // A start from nothing under the first unreserved id.
    assert_eq!(c.commit(&w.store, &CommitRecord::fresh(CheckpointId(257), 1)), CommitWrite::Durable);
    w.store.delete(&commit_key(S, CheckpointId(257))).unwrap();
    let b = w.coordinator().begin(&w.store).unwrap();
    assert_eq!((b.last, b.ids.next_id), (None, CheckpointId(258)), "never 257 again");
}

#[test]
fn retention_counts_the_points_id_only_as_the_record_it_names() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    for id in 1..=3 {
        assert_eq!(c.commit(&w.store, &rec(id)), CommitWrite::Durable);
    }
    // A deposed coordinator's record under the point's id.
    let mut other = rec(3);
    other.ts = 77;
    w.store.put(&commit_key(S, CheckpointId(3)), encode_commit(&other).as_bytes()).unwrap();
    let opts = CollectOptions { keep: 1, dry_run: false, stopped: false, listed: c.listed(), ahead_runs_below: 0 };
    let done = Collector::new().collect_with(&w.store, S, opts).unwrap();
    assert_eq!(done.kept, vec![CheckpointId(2)], "the restore point readers fall back to stays");
    assert_eq!(w.last(), Some(CheckpointId(2)));
}

#[test]
fn a_takeover_that_stopped_before_its_key_was_written_begins_again() {
    let w = World::new();
    assert_eq!(StoreCommits::new(S).commit(&w.store, &rec(3)), CommitWrite::Durable);
    // The store marked, the key's write failing.
    w.control.cut_txn.store(1, Ordering::Release);
    assert!(w.coordinator().begin(&w.store).is_err());
    assert!(matches!(StoreCommits::new(S).last(&w.store), Err(PointError::Elsewhere { .. })), "marked already");
    assert_eq!(w.coordinator().begin(&w.store).unwrap().last, Some(rec(3)));
    assert_eq!(w.last(), Some(CheckpointId(3)));
}

#[test]
fn a_lost_key_is_an_error_not_a_takeover_from_the_store() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    assert_eq!(c.commit(&w.store, &rec(1)), CommitWrite::Durable);
    w.control.txn(&[], &[Op::Delete(w.keys.checkpoints(S))]).unwrap();
    let lost = w.coordinator().begin(&w.store);
    assert!(
        matches!(&lost, Err(PointError::Corrupt { reason, .. }) if reason.contains("must not be deleted")),
        "{lost:?}"
    );
    assert!(matches!(w.reader().last(&w.store), Err(PointError::Corrupt { .. })));
    // Another cluster's name on the same store is refused too.
    let other = ControlCommits::reader(w.control.clone(), &Keys::new("other"), S);
    assert!(matches!(other.last(&w.store), Err(PointError::Corrupt { reason, .. }) if reason.contains("cluster test")));
}

#[test]
fn a_takeover_lists_the_stores_newest_commits_so_retention_keeps_them() {
    let w = World::new();
    for id in 1..=4 {
        assert_eq!(StoreCommits::new(S).commit(&w.store, &rec(id)), CommitWrite::Durable);
    }
    let c = w.coordinator();
    assert_eq!(c.begin(&w.store).unwrap().last, Some(rec(4)));
    assert_eq!(c.listed().unwrap().iter().map(|p| p.id.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let opts = CollectOptions { keep: 3, dry_run: false, stopped: false, listed: c.listed(), ahead_runs_below: 0 };
    let kept = Collector::new().collect_with(&w.store, S, opts).unwrap().kept;
    assert_eq!(kept, [CheckpointId(2), CheckpointId(3), CheckpointId(4)]);
}

#[test]
fn a_commit_takes_its_id_before_its_record_reaches_the_store() {
    let w = World::new();
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    // A start from nothing under an id no reservation covers; its record's write fails after
    // the id is taken (a run that stopped there, or paused).
    let failing = crate::backup::test_store::HookedStore::new(LocalDirStore::new(w._dir.path()), |_, key, _| {
        Err(crate::backup::StoreError::Unavailable { op: "put", key: key.into(), reason: "down".into() })
    });
    assert!(matches!(c.commit(&failing, &CommitRecord::fresh(CheckpointId(9), 1)), CommitWrite::Failed(_)));
    let next = w.coordinator().begin(&w.store).unwrap();
    assert_eq!((next.last, next.ids.next_id), (None, CheckpointId(10)), "a later run never writes record 9");
    // An out-of-step record other than a checkpoint in flight is refused, not retried.
    let c = w.coordinator();
    c.begin(&w.store).unwrap();
    assert_eq!(c.commit(&w.store, &rec(12)), CommitWrite::Durable);
    let out_of_step = c.commit(&w.store, &CommitRecord::fresh(CheckpointId(11), 2));
    assert!(matches!(&out_of_step, CommitWrite::Refused(why) if why.contains("not newer")), "{out_of_step:?}");
}
