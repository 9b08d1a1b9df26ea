//! The cluster's control logic on the in-process control store, on a clock the tests move:
//! membership, self-fencing, absence, fenced placement writes and the move decision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_wire::{NodeId, StreamId};

use super::*;
use crate::control::{Compare, ControlError, ControlStore, Entry, LeaseId, ManualClock, MemControl, Op, TxnOutcome};
use crate::spec::{Placement, StreamSpec};

const TTL: Duration = Duration::from_secs(3);

/// The in-process store and one clock for its leases and the members' instants.
struct World {
    store: Arc<MemControl>,
    clock: ManualClock,
    t0: Instant,
    elapsed: Duration,
}

impl World {
    fn new() -> Self {
        let clock = ManualClock::default();
        Self {
            store: Arc::new(MemControl::with_clock(clock.clone())),
            clock,
            t0: Instant::now(),
            elapsed: Duration::ZERO,
        }
    }
    fn now(&self) -> Instant {
        self.t0 + self.elapsed
    }
    fn pass(&mut self, d: Duration) {
        self.clock.advance(d);
        self.elapsed += d;
    }
}

/// The in-process store with one kind of fault.
struct Faulty(Arc<MemControl>, Fault);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Every transaction is applied, and then answered as if its reply was lost.
    LostTxnReplies,
    /// Prefix reads fail: a member renews its lease but cannot see (or write) the member keys.
    NoLists,
}

impl ControlStore for Faulty {
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError> {
        self.0.grant(ttl)
    }
    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError> {
        self.0.keep_alive(lease)
    }
    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError> {
        self.0.revoke(lease)
    }
    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError> {
        self.0.get(key)
    }
    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        match self.1 {
            Fault::NoLists => {
                Err(ControlError::Unavailable { endpoint: "mem".into(), op: "list", reason: "cut".into() })
            }
            Fault::LostTxnReplies => self.0.list(prefix, limit),
        }
    }
    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        let outcome = self.0.txn(when, then)?;
        match self.1 {
            Fault::LostTxnReplies => {
                Err(ControlError::Unavailable { endpoint: "mem".into(), op: "txn", reason: "reply lost".into() })
            }
            Fault::NoLists => Ok(outcome),
        }
    }
}

fn members(keys: &Keys, n: u32) -> Vec<Member> {
    let nodes: Vec<NodeId> = (1..=n).map(NodeId).collect();
    nodes.iter().map(|id| Member::new(keys.clone(), *id, &nodes, TTL)).collect()
}

#[test]
fn the_first_member_leads_and_sees_the_others_absent_until_they_join() {
    let w = World::new();
    let keys = Keys::new("c1");
    let mut m = members(&keys, 3);
    let first = m[0].step(&*w.store, w.now()).unwrap();
    assert!(first.leader && first.leader_node == Some(NodeId(1)), "{first:?}");
    assert_eq!(first.absent, [NodeId(2), NodeId(3)]);
    let second = m[1].step(&*w.store, w.now()).unwrap();
    assert!(!second.leader && second.leader_node == Some(NodeId(1)), "{second:?}");
    assert_eq!(second.absent, [NodeId(3)]);
    assert_eq!(m[0].step(&*w.store, w.now()).unwrap().absent, [NodeId(3)]);
    assert!(m[0].holds(w.now()) && m[0].leads(w.now()) && m[1].holds(w.now()) && !m[1].leads(w.now()));
}

#[test]
fn a_member_that_cannot_renew_stops_holding_before_its_lease_ends_and_another_leads() {
    let mut w = World::new();
    let keys = Keys::new("c2");
    let mut m = members(&keys, 2);
    m[0].step(&*w.store, w.now()).unwrap();
    m[1].step(&*w.store, w.now()).unwrap();
    let until = m[0].held_until().expect("a member that stepped holds its lease");
    // Node 1 stops renewing (paused, or cut off). It stops holding before the store ends its
    // lease: at every moment it holds, its member key still exists.
    while m[0].holds(w.now()) {
        assert!(w.store.get(&keys.member(NodeId(1))).unwrap().is_some(), "node 1 held a lease the store had ended");
        w.pass(Duration::from_millis(100));
        m[1].step(&*w.store, w.now()).unwrap();
    }
    assert!(w.now() >= until && !m[0].leads(w.now()));
    let deadline = w.now() + TTL;
    let view = loop {
        let v = m[1].step(&*w.store, w.now()).unwrap();
        if v.leader {
            break v;
        }
        assert!(w.now() < deadline, "node 2 never led after node 1's lease ended");
        w.pass(Duration::from_millis(100));
    };
    assert_eq!(view.absent, [NodeId(1)]);
    // Node 1 comes back: it is a member again under a new lease, and a follower.
    let back = m[0].step(&*w.store, w.now()).unwrap();
    assert!(!back.leader && back.leader_node == Some(NodeId(2)) && m[0].holds(w.now()), "{back:?}");
}

#[test]
fn absence_counts_from_the_first_observation_and_ends_when_the_node_returns() {
    let t0 = Instant::now();
    let s = |ms: u64| t0 + Duration::from_millis(ms);
    let after = Duration::from_secs(2);
    let mut a = Absence::default();
    a.observe(&[NodeId(3)], s(0));
    a.observe(&[NodeId(2), NodeId(3)], s(1_000));
    assert!(a.overdue(after, s(1_999)).is_empty());
    assert_eq!(a.overdue(after, s(2_500)), [(NodeId(3), Duration::from_millis(2_500))]);
    // Node 3 returns, then leaves again: counted afresh.
    a.observe(&[NodeId(2)], s(2_600));
    a.observe(&[NodeId(2), NodeId(3)], s(2_700));
    assert_eq!(a.overdue(after, s(3_000)), [(NodeId(2), Duration::from_millis(2_000))]);
    a.reset();
    assert!(a.overdue(Duration::ZERO, s(10_000)).is_empty(), "a new leader counts from its own observations");
}

fn three_node() -> (StreamSpec, Placement) {
    let spec = StreamSpec::generator(StreamId(1), 3, 3, 3);
    let p = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2), NodeId(3)]);
    (spec, p)
}

#[test]
fn only_the_leader_writes_placement_and_a_deposed_leader_or_a_stale_read_writes_nothing() {
    let mut w = World::new();
    let keys = Keys::new("c3");
    let book = ControlBook::new(w.store.clone(), keys.clone());
    let mut m = members(&keys, 3);
    for x in m.iter_mut() {
        x.step(&*w.store, w.now()).unwrap();
    }
    let (spec, p) = three_node();
    let read = book.latest(spec.id).unwrap();
    assert_eq!((read.version(), read.revision), (0, 0), "no version stored: the file's");
    let lost = [(NodeId(3), Duration::from_secs(5))];
    let mover = Mover::new(&spec, &p, read.clone(), 1);
    let record = mover.decide(&lost, &[NodeId(1), NodeId(2)]).unwrap();
    // A follower has no fence.
    let e = book.write(spec.id, &read, &record, m[1].fence().as_slice()).unwrap_err();
    assert!(matches!(e, BookError::NotLeader { version: 1 }), "{e}");
    // The leader's fence, but its lease ended (it stopped renewing): refused by the store.
    let fence = m[0].fence().unwrap();
    w.pass(TTL * 2);
    m[1].step(&*w.store, w.now()).unwrap();
    let e = book.write(spec.id, &read, &record, std::slice::from_ref(&fence)).unwrap_err();
    assert!(matches!(e, BookError::Refused { version: 1, .. }), "{e}");
    assert_eq!(book.latest(spec.id).unwrap().version(), 0);
    // The new leader writes version 1; a write after the same (now stale) read is refused.
    let new = m[1].fence().expect("node 2 leads");
    let stored = book.write(spec.id, &read, &record, std::slice::from_ref(&new)).unwrap();
    assert_eq!(stored.version, 1);
    let after = book.latest(spec.id).unwrap();
    assert_eq!(after.record.as_ref().map(|r| r.tasks.clone()), Some(record.tasks.clone()));
    let other = Mover::new(&spec, &p, read.clone(), 1).decide(&[(NodeId(2), Duration::from_secs(5))], &[NodeId(1)]);
    let e = book.write(spec.id, &read, &other.unwrap(), std::slice::from_ref(&new)).unwrap_err();
    assert!(matches!(e, BookError::Refused { version: 1, stands: Some(1), .. }), "{e}");
    assert!(e.to_string().contains("version 1 stands"), "{e}");
}

#[test]
fn a_placement_write_that_landed_but_answered_an_error_is_found_by_its_retry() {
    let w = World::new();
    let keys = Keys::new("c4");
    let mut leader = Member::new(keys.clone(), NodeId(1), &[NodeId(1), NodeId(2), NodeId(3)], TTL);
    leader.step(&*w.store, w.now()).unwrap();
    let book = ControlBook::new(Arc::new(Faulty(w.store.clone(), Fault::LostTxnReplies)), keys);
    let (spec, p) = three_node();
    let read = book.latest(spec.id).unwrap();
    let mut mover = Mover::new(&spec, &p, read, 1);
    let lost = [(NodeId(3), Duration::from_secs(5))];
    let moved = mover.check(&book, &lost, &[NodeId(1), NodeId(2)], leader.fence().as_ref()).expect("the move stands");
    assert_eq!(moved.incarnation, 1 << 32);
    assert!(moved.reason.starts_with("node 3 has been down for 5s: its tasks move"), "{}", moved.reason);
    // Decided again a moment later (another reason's text): the same decision, found.
    let later = [(NodeId(3), Duration::from_secs(6))];
    let again = mover.check(&book, &later, &[NodeId(1), NodeId(2)], leader.fence().as_ref()).unwrap();
    assert_eq!(again.reason, moved.reason, "the stored record's reason");
}

#[test]
fn a_move_gives_the_lost_nodes_tasks_to_the_nodes_named_and_ignores_nodes_without_tasks() {
    let (spec, p) = three_node();
    let t = spec.topology();
    let mover = Mover::new(&spec, &p, Versioned { record: None, revision: 0 }, 1);
    assert_eq!(mover.decide(&[(NodeId(4), Duration::from_secs(9))], &[NodeId(1)]), None, "node 4 runs nothing");
    assert_eq!(mover.decide(&[(NodeId(3), Duration::from_secs(9))], &[NodeId(3)]), None, "nowhere to go");
    let r: PlacementRecord = mover.decide(&[(NodeId(3), Duration::from_secs(9))], &[NodeId(1), NodeId(2)]).unwrap();
    assert_eq!((r.version, r.moved.clone()), (1, vec![NodeId(3)]));
    let moved = r.placement(&t).unwrap();
    assert!(moved.nodes(&t).iter().all(|n| *n != NodeId(3)));
    // Tasks may go to a member that ran none (an idle node that came back).
    let r = mover.decide(&[(NodeId(3), Duration::from_secs(9))], &[NodeId(1), NodeId(2), NodeId(4)]).unwrap();
    assert!(r.placement(&t).unwrap().nodes(&t).contains(&NodeId(4)), "{r:?}");
}

#[test]
fn a_node_that_came_back_before_the_leaders_write_keeps_its_tasks() {
    let w = World::new();
    let keys = Keys::new("c5");
    let book = ControlBook::new(w.store.clone(), keys.clone());
    let mut m = members(&keys, 3);
    m[0].step(&*w.store, w.now()).unwrap();
    m[1].step(&*w.store, w.now()).unwrap();
    let (spec, p) = three_node();
    let read = book.latest(spec.id).unwrap();
    // The leader decided on node 3 being away; node 3 comes back before the write lands.
    let record =
        Mover::new(&spec, &p, read.clone(), 1).decide(&[(NodeId(3), Duration::from_secs(5))], &[NodeId(1), NodeId(2)]);
    m[2].step(&*w.store, w.now()).unwrap();
    let e = book.write(spec.id, &read, &record.unwrap(), m[0].fence().as_slice()).unwrap_err();
    assert!(matches!(e, BookError::Refused { version: 1, stands: None, .. }), "{e}");
    assert_eq!(book.latest(spec.id).unwrap().version(), 0, "node 3 keeps its tasks");
}

#[test]
fn a_member_holds_only_once_its_member_key_lives_by_its_current_lease() {
    let w = World::new();
    let keys = Keys::new("c6");
    let mut m = members(&keys, 2);
    let broken = Faulty(w.store.clone(), Fault::NoLists);
    assert!(m[0].step(&broken, w.now()).is_err());
    assert!(m[0].lease().is_some(), "the renewal itself succeeded");
    assert!(!m[0].holds(w.now()), "held without a member key the others can see");
    m[0].step(&*w.store, w.now()).unwrap();
    assert!(m[0].holds(w.now()));
    // The lease is ended from outside (an operator, a restored store): the next renewal takes
    // a new one, and the node does not hold until its key lives by that one.
    w.store.revoke(m[0].lease().unwrap()).unwrap();
    let old = m[0].lease();
    assert!(m[0].step(&broken, w.now()).is_err());
    assert!(m[0].lease() != old && !m[0].holds(w.now()));
    m[0].step(&*w.store, w.now()).unwrap();
    assert!(m[0].holds(w.now()));
}

#[test]
fn a_leader_that_finds_a_newer_placement_standing_restarts_at_it() {
    let w = World::new();
    let keys = Keys::new("c7");
    let book = ControlBook::new(w.store.clone(), keys.clone());
    let mut m = members(&keys, 3);
    m[0].step(&*w.store, w.now()).unwrap();
    let (spec, p) = three_node();
    let stale = book.latest(spec.id).unwrap();
    let to = [NodeId(1), NodeId(2)];
    let first = Mover::new(&spec, &p, stale.clone(), 1).decide(&[(NodeId(3), Duration::from_secs(5))], &to).unwrap();
    book.write(spec.id, &stale, &first, m[0].fence().as_slice()).unwrap();
    // Another decision after the same stale read (node 2 lost instead): version 1 stands.
    let mut mover = Mover::new(&spec, &p, stale, 1);
    let moved =
        mover.check(&book, &[(NodeId(2), Duration::from_secs(5))], &[NodeId(1), NodeId(3)], m[0].fence().as_ref());
    let moved = moved.expect("the stream restarts at the version that stands");
    assert_eq!(moved.incarnation, 1 << 32);
    assert!(moved.reason.contains("placement version 1 stands"), "{}", moved.reason);
}

#[test]
fn a_lost_node_that_keeps_the_only_copy_of_an_ingest_log_has_nothing_moved() {
    let w = World::new();
    let keys = Keys::new("c8");
    let book = ControlBook::new(w.store.clone(), keys.clone());
    let mut leader = Member::new(keys, NodeId(1), &[NodeId(1), NodeId(2), NodeId(3)], TTL);
    leader.step(&*w.store, w.now()).unwrap();
    let (mut spec, p) = three_node();
    spec.source = crate::spec::SourceKind::IngestLog;
    let three = [(NodeId(3), Duration::from_secs(5))];
    let to = [NodeId(1), NodeId(2)];
    // One copy: partition 2's log is on node 3 alone.
    let mut one = Mover::new(&spec, &p, book.latest(spec.id).unwrap(), 1);
    assert_eq!(one.stranded(&three, &to), [(2, "partition 2's ingest log is only on node 3".to_string())]);
    assert_eq!(one.check(&book, &three, &to, leader.fence().as_ref()), None);
    assert_eq!(book.latest(spec.id).unwrap().version(), 0, "nothing moved");
    // Two copies: node 3's partition has its copy on node 1, which lives. With node 1 lost too,
    // partition 2 has no copy left; partition 0 (node 1's) still has its copy on node 2.
    let two = Mover::new(&spec, &p, book.latest(spec.id).unwrap(), 2);
    assert!(two.stranded(&three, &to).is_empty());
    let both = [(NodeId(3), Duration::from_secs(5)), (NodeId(1), Duration::from_secs(5))];
    assert_eq!(two.stranded(&both, &[NodeId(2)]).len(), 1);
    assert_eq!(two.stranded(&both, &[NodeId(2)])[0].0, 2);
    // A generator's sources move anywhere.
    let (gen_spec, _) = three_node();
    assert!(Mover::new(&gen_spec, &p, book.latest(spec.id).unwrap(), 1).stranded(&three, &to).is_empty());
}

#[test]
fn a_lost_primary_whose_copy_is_not_known_in_its_in_sync_set_has_nothing_moved() {
    let w = World::new();
    let keys = Keys::new("c9");
    let book = ControlBook::new(w.store.clone(), keys.clone());
    let mut leader = Member::new(keys.clone(), NodeId(1), &[NodeId(1), NodeId(2), NodeId(3)], TTL);
    leader.step(&*w.store, w.now()).unwrap();
    let (mut spec, p) = three_node();
    spec.source = crate::spec::SourceKind::IngestLog;
    let three = [(NodeId(3), Duration::from_secs(5))];
    let to = [NodeId(1), NodeId(2)];
    let reader = || ControlInSync::reader(w.store.clone(), &keys, spec.id);
    let mover = || Mover::new(&spec, &p, book.latest(spec.id).unwrap(), 2).with_in_sync(reader());
    let why = |m: &Mover| m.stranded(&three, &to).into_iter().map(|(p, why)| format!("{p}: {why}")).collect::<Vec<_>>();
    assert_eq!(why(&mover()).len(), 1, "nothing written: nothing known of partition 2's copy on node 1");
    // Node 3 (partition 2's primary, its copy on node 1) writes its sets.
    let lease = w.store.grant(TTL).unwrap();
    let member = Op::Put { key: keys.member(NodeId(3)), value: b"m".to_vec(), lease: Some(lease) };
    w.store.txn(&[], &[member]).unwrap();
    let writer =
        ControlInSync::new(w.store.clone(), &keys, spec.id, NodeId(3), Fence::new(&keys, spec.id, NodeId(3), lease, 0));
    writer.set(2, NodeId(1), false, 1).unwrap();
    let stranded = why(&mover());
    assert!(
        stranded.len() == 1 && stranded[0].contains("node 1 is not known to hold every row node 3"),
        "{stranded:?}"
    );
    // In for another follower (an older placement's): still nothing known of node 1's copy.
    writer.set(2, NodeId(2), true, 2).unwrap();
    assert_eq!(why(&mover()).len(), 1);
    writer.set(2, NodeId(1), true, 3).unwrap();
    assert!(why(&mover()).is_empty());
    w.store.revoke(lease).unwrap(); // node 3 lost: its member key gone
    // The leader read the set; node 3 came back and wrote it out before the move: refused.
    let decided = mover();
    let lease = w.store.grant(TTL).unwrap();
    let again =
        ControlInSync::new(w.store.clone(), &keys, spec.id, NodeId(3), Fence::new(&keys, spec.id, NodeId(3), lease, 0));
    let member = Op::Put { key: keys.member(NodeId(3)), value: b"m".to_vec(), lease: Some(lease) };
    w.store.txn(&[], &[member]).unwrap();
    assert!(decided.stranded(&three, &to).is_empty());
    let (_, read) = decided.sources(&three, &to);
    again.set(2, NodeId(1), false, 1).unwrap();
    w.store.revoke(lease).unwrap();
    let record = decided.decide(&three, &to).unwrap();
    let mut when = leader.fence().into_iter().collect::<Vec<_>>();
    when.extend(read);
    assert!(
        book.write(spec.id, &book.latest(spec.id).unwrap(), &record, &when).is_err(),
        "the set moved since it was read"
    );
    assert_eq!(book.latest(spec.id).unwrap().version(), 0, "nothing moved");
    assert_eq!(mover().check(&book, &three, &to, leader.fence().as_ref()), None, "out: nothing moves");
    // Back once more, it writes its copy in and is lost: the move stands.
    let lease = w.store.grant(TTL).unwrap();
    let member = Op::Put { key: keys.member(NodeId(3)), value: b"m".to_vec(), lease: Some(lease) };
    w.store.txn(&[], &[member]).unwrap();
    let last =
        ControlInSync::new(w.store.clone(), &keys, spec.id, NodeId(3), Fence::new(&keys, spec.id, NodeId(3), lease, 0));
    last.set(2, NodeId(1), true, 1).unwrap();
    w.store.revoke(lease).unwrap();
    assert!(mover().check(&book, &three, &to, leader.fence().as_ref()).is_some());
}
