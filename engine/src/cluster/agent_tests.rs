//! The agent thread on the in-process store in real time: a node that gives up its membership
//! (cut off from the other members) ends its lease, holds nothing and still sees who lives;
//! told to go on, it takes a new lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_wire::NodeId;

use super::{Agent, Keys, Member};
use crate::control::{ControlStore, MemControl};

const TTL: Duration = Duration::from_secs(2);

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_agent_that_withholds_ends_its_lease_holds_nothing_and_takes_a_new_one_when_told() {
    let store: Arc<dyn ControlStore> = Arc::new(MemControl::new());
    let keys = Keys::new("agents");
    let nodes = [NodeId(1), NodeId(2), NodeId(3)];
    let start = |n: u32| Agent::start(store.clone(), Member::new(keys.clone(), NodeId(n), &nodes, TTL), TTL).unwrap();
    let (a, _b, _c) = (start(1), start(2), start(3));
    until("node 1 holds and sees two live others", || {
        let v = a.view();
        v.holds(Instant::now()) && v.present.len() == 2
    });
    let first = a.view().lease.expect("a lease");
    a.withhold(true);
    until("node 1 gives up", || a.holding(Instant::now()).is_none() && a.view().withheld);
    until("its member key goes", || store.get(&keys.member(NodeId(1))).unwrap().is_none());
    assert_eq!(a.view().present, [NodeId(2), NodeId(3)], "it still sees who lives");
    a.withhold(false);
    until("node 1 holds again", || a.holding(Instant::now()).is_some());
    assert_ne!(a.view().lease, Some(first), "under a new lease");
}

#[test]
fn a_node_told_to_withhold_gives_its_membership_up_at_once_not_at_its_next_round() {
    // Rounds a third of a long lease apart: 20 s between two.
    let ttl = Duration::from_secs(60);
    let store: Arc<dyn ControlStore> = Arc::new(MemControl::new());
    let keys = Keys::new("agents");
    let a = Agent::start(store.clone(), Member::new(keys.clone(), NodeId(1), &[NodeId(1)], ttl), ttl).unwrap();
    until("node 1 holds", || a.holding(Instant::now()).is_some());
    let asked = Instant::now();
    a.withhold(true);
    until("its member key goes", || store.get(&keys.member(NodeId(1))).unwrap().is_none());
    assert!(asked.elapsed() < Duration::from_secs(10), "gave up only after {:?}", asked.elapsed());
    a.withhold(false);
    until("node 1 holds again", || a.holding(Instant::now()).is_some());
}
