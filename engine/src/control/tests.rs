//! The control store's contract, run against the in-process store (on a clock the test moves) and
//! against a real etcd (`WEIR_TEST_ETCD_ENDPOINT`, started by `scripts/services`; real time).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// A store under test and how time passes for it.
trait Harness {
    fn store(&self) -> Arc<dyn ControlStore>;
    /// Lets `d` pass for the store's leases.
    fn pass(&self, d: Duration);
    /// A key prefix no other test uses.
    fn prefix(&self) -> String;
}

struct Mem(Arc<MemControl>, ManualClock);

impl Harness for Mem {
    fn store(&self) -> Arc<dyn ControlStore> {
        self.0.clone()
    }
    fn pass(&self, d: Duration) {
        self.1.advance(d);
    }
    fn prefix(&self) -> String {
        "/weir-test".into()
    }
}

fn mem() -> Mem {
    let clock = ManualClock::default();
    Mem(Arc::new(MemControl::with_clock(clock.clone())), clock)
}

struct Etcd(Arc<EtcdControl>, String);

impl Harness for Etcd {
    fn store(&self) -> Arc<dyn ControlStore> {
        self.0.clone()
    }
    fn pass(&self, d: Duration) {
        std::thread::sleep(d);
    }
    fn prefix(&self) -> String {
        self.1.clone()
    }
}

fn etcd() -> Etcd {
    let endpoint = std::env::var("WEIR_TEST_ETCD_ENDPOINT").expect(
        "WEIR_TEST_ETCD_ENDPOINT is unset: run the tests through scripts/test, or `source scripts/services` first",
    );
    let store = EtcdControl::connect(&[endpoint], Duration::from_secs(5)).expect("etcd answers");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    Etcd(Arc::new(store), format!("/weir-test/{}-{nanos}", std::process::id()))
}

/// The lease TTL of these tests: etcd's smallest with its default election timeout.
const TTL: Duration = Duration::from_secs(2);

fn put(key: &str, value: &str, lease: Option<LeaseId>) -> Op {
    Op::Put { key: key.into(), value: value.as_bytes().to_vec(), lease }
}

fn transactions_apply_all_or_nothing_on_the_revisions_they_expect(h: &dyn Harness) {
    let s = h.store();
    let (a, b) = (format!("{}/a", h.prefix()), format!("{}/b", h.prefix()));
    // Created only while missing.
    let first = s.txn(&[Compare::ModRevision(a.clone(), 0)], &[put(&a, "1", None), put(&b, "1", None)]).unwrap();
    assert!(first.succeeded);
    let again = s.txn(&[Compare::ModRevision(a.clone(), 0)], &[put(&a, "2", None)]).unwrap();
    assert!(!again.succeeded, "a second create of the same key");
    let ea = s.get(&a).unwrap().expect("a exists");
    assert_eq!((ea.value.as_slice(), ea.mod_revision, ea.lease), (&b"1"[..], first.revision, None));
    // A write that expects a stale revision changes nothing, not even its other keys.
    s.txn(&[], &[put(&a, "3", None)]).unwrap();
    let stale = s.txn(&[Compare::ModRevision(a.clone(), ea.mod_revision)], &[put(&b, "stale", None)]).unwrap();
    assert!(!stale.succeeded);
    assert_eq!(s.get(&b).unwrap().unwrap().value, b"1");
    let now = s.get(&a).unwrap().unwrap();
    assert!(now.mod_revision > ea.mod_revision);
    assert!(s.txn(&[Compare::ModRevision(a.clone(), now.mod_revision)], &[Op::Delete(b.clone())]).unwrap().succeeded);
    assert_eq!(s.get(&b).unwrap(), None);
}

fn keys_go_with_their_lease_and_an_ended_lease_stays_ended(h: &dyn Harness) {
    let s = h.store();
    let (k1, k2) = (format!("{}/l1", h.prefix()), format!("{}/l2", h.prefix()));
    let l1 = s.grant(TTL).unwrap();
    let l2 = s.grant(TTL).unwrap();
    assert!(s.txn(&[], &[put(&k1, "x", Some(l1)), put(&k2, "y", Some(l2))]).unwrap().succeeded);
    assert_eq!(s.get(&k1).unwrap().unwrap().lease, Some(l1));
    s.revoke(l1).unwrap();
    assert_eq!(s.get(&k1).unwrap(), None, "a revoked lease's key");
    s.revoke(l1).unwrap();
    assert_eq!(s.keep_alive(l1).unwrap(), None);
    // l2, not renewed, ends within its TTL (and the store's expiry sweep).
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.get(&k2).unwrap().is_some() {
        assert!(Instant::now() < deadline, "an unrenewed lease's key outlived its TTL");
        h.pass(Duration::from_millis(250));
    }
    assert_eq!(s.keep_alive(l2).unwrap(), None, "an expired lease was renewed");
    assert!(s.txn(&[], &[put(&k2, "z", Some(l2))]).is_err(), "a write with an expired lease");
}

fn a_prefix_lists_its_keys_in_order_up_to_the_limit_and_no_others(h: &dyn Harness) {
    let s = h.store();
    let p = h.prefix();
    for k in ["m/2", "m/1", "m/3", "mx", "n/1"] {
        s.txn(&[], &[put(&format!("{p}/{k}"), k, None)]).unwrap();
    }
    let keys = |limit| -> Vec<String> {
        s.list(&format!("{p}/m/"), limit)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k.trim_start_matches(&p).to_string())
            .collect()
    };
    assert_eq!(keys(10), ["/m/1", "/m/2", "/m/3"]);
    assert_eq!(keys(2), ["/m/1", "/m/2"]);
    let (_, e) = &s.list(&format!("{p}/m/3"), 10).unwrap()[0];
    assert_eq!(e.value, b"m/3");
    assert!(s.list(&format!("{p}/none/"), 10).unwrap().is_empty());
}

fn one_candidate_leads_and_another_takes_over_when_its_lease_ends(h: &dyn Harness) {
    let s = h.store();
    let key = format!("{}/leader", h.prefix());
    let mut c: Vec<Election> = (1..=3).map(|n| Election::new(key.clone(), format!("node-{n}"), TTL)).collect();
    let roles: Vec<Role> = c.iter_mut().map(|e| e.step(&*s, Instant::now()).unwrap()).collect();
    assert!(matches!(roles[0], Role::Leader { .. }), "{roles:?}");
    assert_eq!(roles[1], Role::Follower { leader: Some("node-1".into()) });
    assert!(c[0].leads(Instant::now()) && !c[1].leads(Instant::now()) && !c[2].leads(Instant::now()));
    // The leader stays the leader while it renews.
    assert!(matches!(c[0].step(&*s, Instant::now()).unwrap(), Role::Leader { .. }));
    // node-1 stops (dies, pauses or is cut off): its lease ends, and one other leads.
    let fence = c[0].fence().expect("a leader has a fence");
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        h.pass(Duration::from_millis(250));
        let roles: Vec<Role> = c[1..].iter_mut().map(|e| e.step(&*s, Instant::now()).unwrap()).collect();
        if let Some(i) = roles.iter().position(|r| matches!(r, Role::Leader { .. })) {
            assert!(roles.iter().filter(|r| matches!(r, Role::Leader { .. })).count() == 1, "{roles:?}");
            break i + 1;
        }
        assert!(Instant::now() < deadline, "no candidate took over: {roles:?}");
    };
    // The deposed leader's fenced write is refused by the store.
    let w = format!("{}/placement", h.prefix());
    assert!(!s.txn(&[fence], &[put(&w, "by node-1", None)]).unwrap().succeeded, "a deposed leader wrote");
    let new_fence = c[leader].fence().unwrap();
    assert!(s.txn(&[new_fence], &[put(&w, "by the new leader", None)]).unwrap().succeeded);
    // node-1 comes back: it follows.
    assert_eq!(
        c[0].step(&*s, Instant::now()).unwrap(),
        Role::Follower { leader: Some(format!("node-{}", leader + 1)) }
    );
    assert!(!c[0].leads(Instant::now()));
    // A clean stop hands over at once.
    c[leader].resign(&*s).unwrap();
    let other = if leader == 1 { 2 } else { 1 };
    assert!(matches!(c[other].step(&*s, Instant::now()).unwrap(), Role::Leader { .. }));
}

/// Each contract as two tests: `in_process::NAME` on the in-process store, `on_etcd::NAME` on
/// the real etcd.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(#[test]
            fn $name() {
                super::$name(&super::mem());
            })*
        }
        mod on_etcd {
            $(#[test]
            fn $name() {
                super::$name(&super::etcd());
            })*
        }
    };
}

on_both_stores!(
    transactions_apply_all_or_nothing_on_the_revisions_they_expect,
    keys_go_with_their_lease_and_an_ended_lease_stays_ended,
    one_candidate_leads_and_another_takes_over_when_its_lease_ends,
    a_prefix_lists_its_keys_in_order_up_to_the_limit_and_no_others,
);

#[test]
fn a_leader_stops_leading_before_its_lease_can_have_ended_in_the_store() {
    let h = mem();
    let s = h.store();
    let mut e = Election::new("/weir-test/leader", "node-1", TTL);
    let t0 = Instant::now();
    assert!(matches!(e.step(&*s, t0).unwrap(), Role::Leader { .. }));
    assert!(e.leads(t0 + TTL - Duration::from_millis(250)));
    assert!(!e.leads(t0 + TTL - Duration::from_millis(100)), "within the margin of the lease's end");
    assert!(e.fence().is_some());
}

#[test]
fn an_etcd_that_does_not_answer_is_a_retryable_error_within_the_timeout() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let t = Instant::now();
    match EtcdControl::connect(&[format!("http://127.0.0.1:{port}")], Duration::from_millis(500)) {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        // A lazy connection: the first call fails instead.
        Ok(s) => assert!(s.get("/weir-test/x").unwrap_err().is_retryable()),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}
