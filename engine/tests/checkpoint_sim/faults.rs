//! The rarer faults the scheduler injects: crashes of everything or of the coordinator, a node
//! partitioned away, and with a control store, the coordinator's node losing its tasks and the
//! deposed coordinator's writes.

use weir_engine::backup::commit::CommitWrite;
use weir_engine::backup::commit_point::CommitBook;
use weir_engine::checkpoint::{CommitRecord, CoordInput, IdRecord};
use weir_engine::wire::{CheckpointId, NodeId, TransId};

use super::sim::Sim;

impl Sim {
    /// One of the rarer faults, or a tick.
    pub fn fault(&mut self) {
        let (faults, r) = {
            let mut w = self.w.borrow_mut();
            let r = w.rng.below(1000);
            (w.faults, r)
        };
        match r {
            _ if !faults => self.tick(),
            0..=9 => self.restart(),
            10..=17 => {
                self.w.borrow_mut().stats.coordinator_crashes += 1;
                let d = self.w.borrow_mut().rng.below(800);
                self.w.borrow_mut().note("coordinator crashes".into());
                self.crash_coordinator(d);
            }
            23..=40 => self.deposed_writes(),
            41..=46 if self.w.borrow().control.is_some() => {
                // The coordinator's node loses its tasks (it stopped within its lease first):
                // every node restarts at the new placement.
                let mut w = self.w.borrow_mut();
                w.control.as_mut().expect("checked").move_away();
                w.note("the coordinator's node loses its tasks to another".into());
                drop(w);
                self.restart();
            }
            18..=22 => {
                let started = {
                    let mut w = self.w.borrow_mut();
                    let start = w.partition_until.is_none();
                    if start {
                        let until = w.now + 200 + w.rng.below(1_500);
                        w.partition_until = Some(until);
                        w.stats.partitions += 1;
                        w.note("node 2 partitioned".into());
                    }
                    start
                };
                if started {
                    // The coordinator's transport notices the lost peer.
                    self.coord_input(CoordInput::NodeLost { node: NodeId(2) });
                }
            }
            _ => self.tick(),
        }
    }

    /// A deposed coordinator (its node lost its tasks to another) wakes and writes: it
    /// reserves ids and commits a record (a start from nothing, under an id no live
    /// coordinator reaches). The control store must refuse both, and the point stays.
    fn deposed_writes(&mut self) {
        let mut w = self.w.borrow_mut();
        let Some(deposed) = w.control.as_ref().and_then(|c| c.deposed.clone()) else {
            drop(w);
            return self.tick();
        };
        let before = w.point();
        let ids = IdRecord { next_id: CheckpointId(u64::MAX / 2), next_trans: TransId(u64::MAX / 2) };
        let reserved = deposed.reserve(&*w.store, &ids);
        assert!(reserved.is_err(), "a deposed coordinator reserved ids");
        let id = CheckpointId(u64::MAX / 2 + w.rng.below(1_000));
        let now = w.now;
        let committed = deposed.commit(&*w.store, &CommitRecord::fresh(id, now));
        assert!(!matches!(committed, CommitWrite::Durable), "a deposed coordinator committed {id}");
        assert_eq!(w.point(), before, "a deposed coordinator moved the commit point");
        w.stats.fenced_writes += u64::from(matches!(committed, CommitWrite::Refused(_)));
        w.note(format!("the deposed coordinator's writes refused ({committed:?})"));
    }
}
