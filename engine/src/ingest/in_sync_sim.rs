//! A deterministic simulation of one replicated partition's in-sync set: the primary's
//! [`Membership`] and the control store's writes ([`ControlInSync`], the code the engine runs)
//! over an in-process store that loses answers, fails writes, and holds writes back to land them
//! later, while rows are appended, the follower's copy is cut off, heals, loses its data, and the
//! primary starts new runs. After every step it checks the promise the set makes: while the key
//! says the copy is in, the copy holds every row ever acknowledged (so a source moved to it
//! loses nothing), unless the copy lost its data and the key has not been written out since.
//! Every fault kind happens at least once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weir_wire::{NodeId, StreamId, Version};

use super::in_sync::{Membership, Step};
use crate::cluster::{ControlInSync, Fence, InSyncRecord, Keys};
use crate::control::test_store::Lossy;
use crate::control::{ControlStore, Op};

const LAG: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_millis(50);
const PRIMARY: NodeId = NodeId(2);
const FOLLOWER: NodeId = NodeId(3);
const FAULTS: [&str; 9] =
    ["cut", "heal", "copy lost", "answer lost", "write failed", "write held", "held delivered", "new run", "alone"];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One simulated partition.
struct Sim {
    store: Arc<Lossy>,
    keys: Keys,
    fence: Fence,
    run: ControlInSync,
    member: Membership,
    seq: u64,
    now: Instant,
    /// Durable on the primary, on the copy, and what the primary knows of the copy.
    durable: u64,
    copy: u64,
    known: u64,
    /// The highest row acknowledged, ever.
    acked: u64,
    linked: bool,
    /// The copy lost its data and the key has not said "out" since.
    lost: bool,
    seen: [u32; FAULTS.len()],
}

impl Sim {
    fn new() -> Self {
        let store = Arc::new(Lossy::default());
        let keys = Keys::new("sim");
        let lease = store.grant(Duration::from_secs(3600)).unwrap();
        let member = Op::Put { key: keys.member(PRIMARY), value: b"m".to_vec(), lease: Some(lease) };
        store.txn(&[], &[member]).unwrap();
        let fence = Fence::new(&keys, StreamId(1), PRIMARY, lease, 0);
        let run = ControlInSync::new(store.clone(), &keys, StreamId(1), PRIMARY, fence.clone());
        let now = Instant::now();
        Sim {
            store,
            keys,
            fence,
            run,
            member: Membership::new(now),
            seq: 0,
            now,
            durable: 0,
            copy: 0,
            known: 0,
            acked: 0,
            linked: true,
            lost: false,
            seen: [0; FAULTS.len()],
        }
    }

    fn saw(&mut self, fault: &str) {
        let i = FAULTS.iter().position(|f| *f == fault).expect("a fault kind");
        self.seen[i] += 1;
    }

    /// The key as the store holds it now.
    fn key(&self) -> Option<InSyncRecord> {
        let reader = ControlInSync::reader(self.store.clone(), &self.keys, StreamId(1));
        reader.read(0).unwrap().0
    }

    fn step(&mut self, rng: &mut Rng) {
        self.now += Duration::from_millis(rng.below(40));
        match rng.below(100) {
            0..=39 => self.durable += 1 + rng.below(50),
            40..=41 => {
                self.linked = !self.linked;
                self.saw(if self.linked { "heal" } else { "cut" });
            }
            42 => {
                self.copy = 0;
                self.known = 0;
                self.lost = true;
                self.member.copy_lost();
                self.saw("copy lost");
            }
            43 => {
                self.store.lose_txn.store(1, Ordering::Release);
                self.saw("answer lost");
            }
            44 => {
                self.store.cut_txn.store(1, Ordering::Release);
                self.saw("write failed");
            }
            45 => {
                self.store.hold_txn.store(1, Ordering::Release);
                self.saw("write held");
            }
            46..=47 if !self.store.deliver().is_empty() => self.saw("held delivered"),
            48 => {
                // The primary's next run (a restart): it confirms nothing yet and waits for the
                // copy; its earlier run's held writes may still land.
                self.run = ControlInSync::new(self.store.clone(), &self.keys, StreamId(1), PRIMARY, self.fence.clone());
                self.member = Membership::new(self.now);
                self.saw("new run");
            }
            _ => {}
        }
        if self.linked {
            // The copy catches up, and the primary hears of it a step later.
            self.known = self.copy;
            self.copy = (self.copy + rng.below(80)).min(self.durable);
        }
        self.seq += 1;
        let step = self.member.step(Some(Version(self.known)), Version(self.durable), self.now, LAG, true, self.seq);
        match step {
            Step::Request(in_sync) => {
                let done = self.run.set(0, FOLLOWER, in_sync, self.seq).is_ok();
                self.member.answered(self.seq, done, self.now, RETRY);
            }
            Step::GoAlone => self.saw("alone"),
            Step::Wait | Step::Nothing => {}
        }
        // Acknowledged: what the copy holds too, or all that is durable while alone.
        let ackable = if self.member.waits() { self.known.min(self.durable) } else { self.durable };
        self.acked = self.acked.max(ackable);
        let key = self.key();
        if key.as_ref().is_some_and(|k| !k.in_sync) {
            self.lost = false;
        }
        if let Some(k) = key.filter(|k| k.in_sync && !self.lost) {
            assert!(
                self.copy >= self.acked,
                "the key says the copy is in ({k:?}) but it holds {} of {} acknowledged",
                self.copy,
                self.acked
            );
        }
    }
}

#[test]
fn the_in_sync_key_says_in_only_while_the_copy_holds_every_acknowledged_row() {
    let mut seen = [0u32; FAULTS.len()];
    let mut acked = 0;
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut sim = Sim::new();
        for _ in 0..2_000 {
            sim.step(&mut rng);
        }
        for (all, one) in seen.iter_mut().zip(sim.seen) {
            *all += one;
        }
        acked += sim.acked;
    }
    for (fault, n) in FAULTS.iter().zip(seen) {
        assert!(n > 0, "fault {fault:?} never happened: {seen:?}");
    }
    assert!(acked > 0, "nothing was acknowledged");
}
