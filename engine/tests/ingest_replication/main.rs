//! Ingest replication between two real ingest writers on real logs, their messages carried by
//! channels (the engine carries them over its transport; the cluster test runs that): an append
//! is acknowledged once both copies hold it, a follower behind catches up, a copy past its
//! primary's log (or holding a tail the primary lost: `divergence.rs`) starts afresh, retention deletes both
//! copies below the floor, both copies end byte for byte the same, and a follower that stops
//! answering leaves the in-sync set (only once the control store says so) and rejoins.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use weir_engine::ingest::replication::{ReplicaInput, ReplicaLink, Replication};
use weir_engine::ingest::segment::ProducerSeq;
use weir_engine::ingest::service::partition_dir;
use weir_engine::ingest::*;
use weir_engine::wire::msg::{Replicate, ReplicateAck};
use weir_engine::wire::{Batch, NodeId, StreamId, Version};

mod divergence;

const PRIMARY: NodeId = NodeId(1);
const FOLLOWER: NodeId = NodeId(2);

/// Both writers' replica inputs, and whether messages get through.
#[derive(Clone, Default)]
struct Net {
    inputs: Arc<Mutex<BTreeMap<NodeId, Sender<ReplicaInput>>>>,
    down: Arc<AtomicBool>,
}

struct Link {
    me: NodeId,
    net: Net,
}

impl Link {
    fn deliver(&self, to: NodeId, input: ReplicaInput) -> bool {
        if self.net.down.load(Ordering::Acquire) {
            return false;
        }
        match self.net.inputs.lock().unwrap().get(&to) {
            Some(tx) => tx.try_send(input).is_ok(),
            None => false,
        }
    }
}

impl ReplicaLink for Link {
    fn ship(&mut self, to: NodeId, msg: &Replicate) -> bool {
        self.deliver(to, ReplicaInput::Entries { from: self.me, msg: msg.clone() })
    }
    fn answer(&mut self, to: NodeId, msg: &ReplicateAck) -> bool {
        self.deliver(to, ReplicaInput::Ack { from: self.me, msg: msg.clone() })
    }
}

type Service = IngestService<u64>;

fn start(dir: &Path, me: NodeId, net: &Net, ship_to: Option<NodeId>) -> (Service, Receiver<Appended<u64>>) {
    start_with(dir, me, net, ship_to, Duration::from_millis(5), LogConfig::default())
}

/// The control store's side of the in-sync set: every request answered at once with `done`,
/// and kept.
#[derive(Clone)]
struct Set {
    done: bool,
    asked: Arc<Mutex<Vec<(u32, bool)>>>,
    answers: Arc<Mutex<Vec<(u32, u64, bool)>>>,
}

impl weir_engine::ingest::in_sync::InSyncSet for Set {
    fn request(&mut self, partition: u32, in_sync: bool, seq: u64) {
        self.asked.lock().unwrap().push((partition, in_sync));
        self.answers.lock().unwrap().push((partition, seq, self.done));
    }
    fn answer(&mut self) -> Option<(u32, u64, bool)> {
        self.answers.lock().unwrap().pop()
    }
}

/// A primary shipping partition 0 to FOLLOWER, its in-sync set answered by `set`, copies asked
/// out after `lag`.
fn start_in_sync(dir: &Path, net: &Net, set: &Set, lag: Duration) -> (Service, Receiver<Appended<u64>>) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let replication = Replication {
        stream: StreamId(1),
        followers: BTreeMap::from([(0, FOLLOWER)]),
        link: Box::new(Link { me: PRIMARY, net: net.clone() }),
        in_sync: Some(Box::new(set.clone())),
        lag,
    };
    let policy = SyncPolicy::GroupCommit(Duration::from_millis(5));
    let svc =
        IngestService::start_replicated(dir, 1, LogConfig::default(), policy, tx, None, Some(replication)).unwrap();
    net.inputs.lock().unwrap().insert(PRIMARY, svc.replica_inputs().clone());
    (svc, rx)
}

fn start_with(
    dir: &Path,
    me: NodeId,
    net: &Net,
    ship_to: Option<NodeId>,
    group_commit: Duration,
    cfg: LogConfig,
) -> (Service, Receiver<Appended<u64>>) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let replication = ship_to.map(|f| Replication {
        stream: StreamId(1),
        followers: BTreeMap::from([(0, f)]),
        link: Box::new(Link { me, net: net.clone() }),
        in_sync: None,
        lag: Duration::ZERO,
    });
    // Every writer answers the copies it keeps, replicating or not.
    let replication = replication.or_else(|| {
        Some(Replication {
            stream: StreamId(1),
            followers: BTreeMap::new(),
            link: Box::new(Link { me, net: net.clone() }),
            in_sync: None,
            lag: Duration::ZERO,
        })
    });
    let policy = SyncPolicy::GroupCommit(group_commit);
    let svc = IngestService::start_replicated(dir, 1, cfg, policy, tx, None, replication).unwrap();
    net.inputs.lock().unwrap().insert(me, svc.replica_inputs().clone());
    (svc, rx)
}

fn rows(first: u64, n: usize) -> Batch {
    let mut b = Batch::with_capacity(n);
    for v in first..first + n as u64 {
        b.push(v as i64, v % 7, v as f64 * 0.5);
    }
    b
}

fn append(svc: &Service, producer: u64, seq: u64, batch: Batch, describe: bool) {
    let req = AppendRequest {
        partition: 0,
        batch,
        from: Some(ProducerSeq { producer, seq }),
        watermark: None,
        describe: describe.then(|| b"{\"seed\":1}".to_vec()),
        token: seq,
    };
    svc.requests().send(req).unwrap();
}

fn acked(rx: &Receiver<Appended<u64>>, within: Duration) -> Option<(u64, Version, Version)> {
    let a = rx.recv_timeout(within).ok()?;
    let (first, last) = a.result.expect("appended").expect("rows");
    Some((a.token, first, last))
}

/// Every byte of partition 0's log files under `dir` (segments in order).
fn log_bytes(dir: &Path) -> Vec<u8> {
    let part = partition_dir(dir, 0);
    let mut names: Vec<_> = std::fs::read_dir(&part)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    names.sort();
    names.iter().flat_map(|p| std::fs::read(p).unwrap()).collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_append_is_acknowledged_only_once_its_follower_holds_it() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    net.down.store(true, Ordering::Release);
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 7, 0, rows(0, 1000), true);
    // Durable on the primary, but the follower cannot be reached: no acknowledgement.
    assert_eq!(acked(&acks, Duration::from_millis(600)), None);
    assert_eq!(primary.log(0).unwrap().durable_version(), Version(1000));
    // Nor does the partition's source read it: a source moved to the follower could not.
    let mut source = primary.log(0).unwrap().reader(Version(0));
    let mut out = Batch::default();
    assert_eq!(source.read(10_000, &mut out).unwrap(), 0);
    net.down.store(false, Ordering::Release);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((0, Version(0), Version(999))));
    assert_eq!(source.read(10_000, &mut out).unwrap(), 1000, "the source reads it once the copy holds it");
    // The follower held it durably before the acknowledgement.
    assert_eq!(follower.log(0).unwrap().durable_version(), Version(1000));
    for seq in 1..20 {
        append(&primary, 7, seq, rows(seq * 1000, 1000), false);
    }
    for seq in 1..20 {
        let (token, first, _) = acked(&acks, Duration::from_secs(10)).expect("acknowledged");
        assert_eq!((token, first), (seq, Version(seq * 1000)));
    }
    // A batch sent again is answered with its versions and stored once, on both.
    append(&primary, 7, 3, rows(3000, 1000), false);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((3, Version(3000), Version(3999))));
    let (pf, ff) = (primary.log(0).unwrap().producers(), follower.log(0).unwrap().producers());
    assert_eq!(pf, ff, "the follower's ledger is the primary's");
    assert_eq!((ff[0].rows, ff[0].batches, ff[0].description.as_slice()), (20_000, 20, &b"{\"seed\":1}"[..]));
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

#[test]
fn a_follower_that_stops_answering_leaves_the_in_sync_set_appends_go_on_alone_and_it_rejoins_caught_up() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    let set = Set { done: true, asked: Default::default(), answers: Default::default() };
    let lag = Duration::from_millis(300);
    let (primary, acks) = start_in_sync(a.path(), &net, &set, lag);
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 7, 0, rows(0, 1000), true);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((0, Version(0), Version(999))));
    let log = primary.log(0).unwrap();
    wait_for("the run's first write", || log.standing() == 1);
    assert_eq!(*set.asked.lock().unwrap(), [(0, true)], "an empty log's copy holds all of it");
    net.down.store(true, Ordering::Release);
    append(&primary, 7, 1, rows(1000, 1000), false);
    // Waits for the follower up to the lag, then goes on alone once the set says so.
    assert_eq!(acked(&acks, lag / 2), None);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((1, Version(1000), Version(1999))));
    assert_eq!(*set.asked.lock().unwrap(), [(0, true), (0, false)]);
    assert!(log.alone());
    // The source reads what only this node holds (the set says no copy has all of it).
    let mut out = Batch::default();
    assert_eq!(log.reader(Version(0)).read(10_000, &mut out).unwrap(), 2000);
    for seq in 2..5 {
        append(&primary, 7, seq, rows(seq * 1000, 1000), false);
        assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(seq), "acknowledged alone");
    }
    // Back: the copy catches up, is asked back in, and appends wait for it again.
    net.down.store(false, Ordering::Release);
    wait_for("the copy back in the set", || log.standing() == 1);
    assert_eq!(*set.asked.lock().unwrap(), [(0, true), (0, false), (0, true)]);
    assert!(follower.log(0).unwrap().durable_version() >= Version(5000));
    net.down.store(true, Ordering::Release);
    append(&primary, 7, 5, rows(5000, 1000), false);
    assert_eq!(acked(&acks, lag / 2), None, "in the set again: waits for the copy");
    net.down.store(false, Ordering::Release);
    assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(5));
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

#[test]
fn a_follower_the_control_store_does_not_let_out_of_the_set_keeps_every_append_waiting() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    let set = Set { done: false, asked: Default::default(), answers: Default::default() };
    let lag = Duration::from_millis(200);
    let (primary, acks) = start_in_sync(a.path(), &net, &set, lag);
    let (_follower, _) = start(b.path(), FOLLOWER, &net, None);
    net.down.store(true, Ordering::Release);
    append(&primary, 7, 0, rows(0, 1000), true);
    // Asked again and again, never written: nothing is acknowledged alone.
    assert_eq!(acked(&acks, lag * 5), None);
    let asked = set.asked.lock().unwrap().clone();
    assert!(asked.len() >= 2, "{asked:?}");
    assert!(!primary.log(0).unwrap().alone());
    net.down.store(false, Ordering::Release);
    assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(0));
}

#[test]
fn the_source_reads_what_both_copies_hold_when_the_follower_answered_before_the_primary_synced() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    // The primary ships as it writes and syncs only every 300 ms: the follower answers first.
    let (primary, acks) =
        start_with(a.path(), PRIMARY, &net, Some(FOLLOWER), Duration::from_millis(300), LogConfig::default());
    let (_follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 5, 0, rows(0, 700), true);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((0, Version(0), Version(699))));
    // Nothing comes after it: the source reads it all the same, once both copies hold it.
    let mut source = primary.log(0).unwrap().reader(Version(0));
    let mut out = Batch::default();
    wait_for("the source to read the last batch", || {
        source.read(10_000, &mut out).unwrap();
        out.len() == 700
    });
}

#[test]
fn a_follower_behind_catches_up_from_where_its_copy_ends() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    {
        // Appended without a follower (one copy), markers included.
        let mut log = IngestLog::open(&partition_dir(a.path(), 0), LogConfig::default()).unwrap();
        for seq in 0..50 {
            log.append_from(ProducerSeq { producer: 9, seq }, &rows(seq * 100, 100)).unwrap();
        }
        log.append_marker(12_345).unwrap();
        log.sync().unwrap();
    }
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 9, 50, rows(5001, 100), false);
    // Acknowledged once the follower holds everything before it too.
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((50, Version(5001), Version(5100))));
    assert_eq!(follower.log(0).unwrap().durable_version(), Version(5101));
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
    // The follower's copy reopens as a log of its own: a source moved there reads the same.
    let copy = IngestLog::open(&partition_dir(b.path(), 0), LogConfig::default()).unwrap();
    let mut r = copy.reader(Version(0)).unwrap();
    let mut out = Batch::default();
    let first = r.read_marked(100_000, &mut out).unwrap();
    assert_eq!((first.rows, first.watermark), (5000, Some(12_345)));
    assert_eq!(copy.producers()[0].batches, 51);
}

#[test]
fn a_copy_past_its_primarys_log_starts_afresh_from_the_primarys() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    {
        // The follower holds rows the primary does not (the primary lost its disk).
        let mut log = IngestLog::open(&partition_dir(b.path(), 0), LogConfig::default()).unwrap();
        log.append_from(ProducerSeq { producer: 1, seq: 0 }, &rows(77, 3000)).unwrap();
        log.sync().unwrap();
    }
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 2, 0, rows(0, 10), true);
    assert_eq!(acked(&acks, Duration::from_secs(10)), Some((0, Version(0), Version(9))));
    wait_for("the follower's copy", || follower.log(0).unwrap().durable_version() == Version(10));
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

#[test]
fn shipped_entries_that_do_not_continue_a_copy_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    let mut other = IngestLog::open(&dir.path().join("other"), LogConfig::default()).unwrap();
    other.append(&rows(0, 10)).unwrap();
    other.append(&rows(10, 10)).unwrap();
    other.sync().unwrap();
    let mut entries = Vec::new();
    let mut r = other.reader(Version(10)).unwrap();
    assert_eq!(r.read_entries(1 << 20, &mut entries).unwrap(), Version(20));
    // Versions 10.. do not continue an empty copy.
    assert!(matches!(log.append_entries(Version(10), &entries), Err(LogError::Replica { .. })));
    // Damaged bytes are refused, not written.
    let mut all = Vec::new();
    other.reader(Version(0)).unwrap().read_entries(1 << 20, &mut all).unwrap();
    let mut bad = all.clone();
    let n = bad.len();
    bad[n - 3] ^= 0xff;
    assert!(matches!(log.append_entries(Version(0), &bad), Err(LogError::Replica { .. })));
    assert_eq!(log.next_version(), Version(10), "the first, intact entry was taken");
    // Sent again whole: what the copy has is skipped, the rest taken.
    assert_eq!(log.append_entries(Version(0), &all).unwrap(), Version(20));
    // A reader must start where an entry starts.
    let mut mid = Vec::new();
    assert!(other.reader(Version(5)).unwrap().read_entries(1 << 20, &mut mid).is_err());
}

#[test]
fn both_copies_delete_below_the_floor_and_a_new_follower_copies_from_there_not_from_version_0() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    let small = LogConfig { segment_bytes: 8 << 10, ..LogConfig::default() };
    let five = Duration::from_millis(5);
    let (primary, acks) = start_with(a.path(), PRIMARY, &net, Some(FOLLOWER), five, small);
    let (follower, _) = start_with(b.path(), FOLLOWER, &net, None, five, small);
    for seq in 0..100 {
        append(&primary, 3, seq, rows(seq * 100, 100), seq == 0);
        assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(seq));
    }
    let whole = primary.log(0).unwrap().extent().unwrap();
    assert_eq!(whole.0, Some(Version(0)));
    // Retention says no restore reads below 6,000.
    for svc in [&primary, &follower] {
        svc.truncate_below(0, Version(6000));
    }
    for (name, svc) in [("primary", &primary), ("follower", &follower)] {
        wait_for(name, || svc.log(0).unwrap().extent().unwrap().0 > Some(Version(4000)));
        let (first, bytes) = svc.log(0).unwrap().extent().unwrap();
        assert!(first <= Some(Version(6000)) && bytes < whole.1 * 6 / 10, "{name}: {first:?}, {bytes} of {}", whole.1);
        // Reads from the floor on see every row; below what is left they fail, never skip.
        let mut out = Batch::default();
        let mut r = svc.log(0).unwrap().reader(Version(6000));
        while r.read(100_000, &mut out).unwrap() > 0 {}
        assert_eq!(out, rows(6000, 4000), "{name}");
        assert!(svc.log(0).unwrap().reader(Version(0)).read(10, &mut Batch::default()).is_err(), "{name}");
        // A lower floor later changes nothing.
        svc.truncate_below(0, Version(10));
    }
    // The follower loses its disk: its new copy starts where the primary's log does.
    drop(follower);
    std::fs::remove_dir_all(b.path()).unwrap();
    std::fs::create_dir_all(b.path()).unwrap();
    let (follower, _) = start_with(b.path(), FOLLOWER, &net, None, five, small);
    append(&primary, 3, 100, rows(10_000, 100), false);
    assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(100));
    // Read once the writer has taken an append since: its truncation pass, which a reader of the
    // directory may see half done, is over.
    let first = primary.log(0).unwrap().extent().unwrap().0.unwrap();
    let (copy_first, copy_bytes) = follower.log(0).unwrap().extent().unwrap();
    assert_eq!(copy_first, Some(first), "the new copy starts at the primary's first version");
    assert!(copy_bytes < whole.1 * 2 / 3, "{copy_bytes}");
    // Its ledger counts what the producer appended below where it began too (taken from the
    // primary's), as a source moved there reports it to `weir verify` and the next load.
    let ledger = follower.log(0).unwrap().producers();
    assert_eq!(ledger, primary.log(0).unwrap().producers());
    assert_eq!((ledger[0].rows, ledger[0].batches, ledger[0].first), (10_100, 101, Version(0)), "{ledger:?}");
    assert!(!ledger[0].description.is_empty());
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
    // Reopened, the copy keeps those counts, and takes the producer's next batch as the next.
    let mut copy = IngestLog::open(&partition_dir(b.path(), 0), small).unwrap();
    assert_eq!(copy.producers(), ledger);
    let next = copy.append_from(ProducerSeq { producer: 3, seq: 101 }, &rows(10_100, 10)).unwrap();
    assert!(matches!(next, AppendOutcome::New(Some(_))), "{next:?}");
    let old = copy.append_from(ProducerSeq { producer: 3, seq: 5 }, &rows(500, 100));
    assert!(matches!(old, Err(LogError::TooOld { .. })), "{old:?}");
}

/// Waits until `svc`'s log of partition 0 holds more bytes than `rows` rows take.
fn wait_written(svc: &Service, rows: u64) {
    wait_for("the appends written", || svc.log(0).unwrap().extent().unwrap().1 > rows * 24);
}

/// Every row of partition 0 that `svc` holds.
fn all_rows(svc: &Service) -> Batch {
    let mut out = Batch::default();
    let mut r = svc.log(0).unwrap().reader(Version(0));
    while r.read(100_000, &mut out).unwrap() > 0 {}
    out
}
