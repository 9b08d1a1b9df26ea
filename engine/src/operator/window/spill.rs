//! Spilling: an agg's state beyond its memory budget goes to a [`SpillStore`] as sorted runs of
//! partial aggregates, and comes back when its window fires.
//!
//! Aggregates are mergeable (counts and fixed-point sums add, min and max combine), so a spill
//! is a write and never a read: when the open windows' tables pass the budget, every entry goes
//! out as one *run* (sorted by window start and [`super::order_of`], the order a fired window is
//! emitted in) and the tables start empty. Rows for a key that went out make a new partial in
//! memory. A fired window's shard reads its spilled partials in order and merges them with the
//! shard's, so its results are exactly those of a run that never spilled (sums in fixed point do
//! not depend on the order of their terms).
//!
//! Invariants: a run, once written, is never changed; a window's spilled partials are read only
//! when it fires, and dropped once all of it is emitted; no run is written while the store says
//! it is [`SpillStore::held`] (a snapshot of it is under way: what the snapshot holds is what was
//! spilled before its barrier).

use std::collections::BTreeSet;

use super::slots::SlotPool;
use super::{Acc, SHARDS, WindowAgg, WindowTable, shard_orders};

/// Why a spill store failed.
#[derive(Debug, thiserror::Error)]
#[error("spill store at {path}: {reason}")]
pub struct SpillError {
    /// The store's place.
    pub path: String,
    /// What failed.
    pub reason: String,
    /// Whether retrying (a restart of the task from its checkpoint) may succeed.
    pub retryable: bool,
}

/// A run being written: entries ascending by (window start, order of the key).
pub trait RunWriter {
    /// One partial aggregate.
    fn put(&mut self, start: i64, order: u64, key: u64, acc: &Acc) -> Result<(), SpillError>;
    /// Makes the run part of the store.
    fn finish(self: Box<Self>) -> Result<(), SpillError>;
}

/// Where an agg's spilled partial aggregates live (the task's RocksDB in the engine).
pub trait SpillStore: std::fmt::Debug + Send {
    /// Starts run `run` (runs are numbered upwards).
    fn begin_run(&mut self, run: u32) -> Result<Box<dyn RunWriter + '_>, SpillError>;
    /// Calls `f` with the partials of window `start` whose key's order is in `lo..=hi`,
    /// ascending by order (the partials of one key, one per run, together).
    fn read(&self, start: i64, lo: u64, hi: u64, f: &mut dyn FnMut(u64, u64, Acc)) -> Result<(), SpillError>;
    /// Forgets window `start`'s partials.
    fn drop_window(&mut self, start: i64) -> Result<(), SpillError>;
    /// Whether writes wait (a snapshot of the store is being taken).
    fn held(&self) -> bool;
    /// The next run number after what the store holds (after a restore).
    fn next_run(&self) -> u32;
    /// Windows the store holds partials of.
    fn windows(&self) -> Result<Vec<i64>, SpillError>;
}

/// An agg's spilling: its store, its budget, and which windows have partials there.
#[derive(Debug)]
pub(crate) struct Spilling {
    store: Box<dyn SpillStore>,
    /// Bytes the open windows' tables may take before they spill.
    limit: usize,
    next_run: u32,
    /// Windows with partials in the store.
    spilled: BTreeSet<i64>,
    /// Windows emitted whose partials wait to be dropped (not while the store is held).
    dead: Vec<i64>,
    /// One shard's spilled partials, merged per key.
    merged: Vec<(u64, u64, Acc)>,
}

impl Spilling {
    pub(crate) fn has(&self, start: i64) -> bool {
        self.spilled.contains(&start)
    }

    /// Emits shard `s` of window `start`: its entries in memory merged with its spilled
    /// partials, in order. Returns how many results.
    pub(crate) fn emit_shard(
        &mut self,
        start: i64,
        s: usize,
        table: &mut WindowTable,
        scratch: &mut Vec<(u64, u64, Acc)>,
        pool: &mut SlotPool,
        out: &mut impl FnMut(u64, &Acc),
    ) -> Result<usize, SpillError> {
        table.take_shard_sorted(s, scratch, pool);
        let merged = &mut self.merged;
        merged.clear();
        let (lo, hi) = shard_orders(s);
        self.store.read(start, lo, hi, &mut |order, key, acc| match merged.last_mut() {
            Some(last) if last.0 == order => merge(&mut last.2, &acc),
            _ => merged.push((order, key, acc)),
        })?;
        let (mut i, mut j, mut n) = (0, 0, 0);
        while i < scratch.len() || j < merged.len() {
            let take_mem = j == merged.len() || (i < scratch.len() && scratch[i].0 <= merged[j].0);
            if take_mem {
                let (o, k, mut a) = scratch[i];
                i += 1;
                if j < merged.len() && merged[j].0 == o {
                    merge(&mut a, &merged[j].2);
                    j += 1;
                }
                out(k, &a);
            } else {
                out(merged[j].1, &merged[j].2);
                j += 1;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Window `start` is all emitted: its partials go (now, or once the store is not held).
    pub(crate) fn fired(&mut self, start: i64) -> Result<(), SpillError> {
        if self.spilled.remove(&start) {
            self.dead.push(start);
        }
        self.drop_dead()
    }

    fn drop_dead(&mut self) -> Result<(), SpillError> {
        if !self.store.held() {
            while let Some(start) = self.dead.pop() {
                self.store.drop_window(start)?;
            }
        }
        Ok(())
    }
}

impl WindowAgg {
    /// Spills state beyond `budget` bytes into `store` from now on. The open windows' tables
    /// are kept at half the budget: a snapshot may hold as much again until it is written
    /// (copy-on-write). Partials the store already holds (a restore) are merged in when their
    /// windows fire; those of windows not open any more are dropped.
    pub fn set_spill(&mut self, store: Box<dyn SpillStore>, budget: usize) -> Result<(), SpillError> {
        let open: BTreeSet<i64> = self.windows.iter().map(|w| w.0).collect();
        let (spilled, dead): (Vec<i64>, Vec<i64>) = store.windows()?.into_iter().partition(|w| open.contains(w));
        let next_run = store.next_run();
        let mut sp = Spilling {
            store,
            limit: budget / 2,
            next_run,
            spilled: spilled.into_iter().collect(),
            dead,
            merged: Vec::new(),
        };
        sp.drop_dead()?;
        self.spill = Some(sp);
        // Under a budget, memory a fired window gave back is not kept.
        self.pool.set_limit(0);
        Ok(())
    }

    /// Stops spilling (the store is let go; a restore sets the next one).
    pub fn clear_spill(&mut self) {
        self.spill = None;
    }

    /// Bytes of fired windows' tables kept for the next windows (none under a budget).
    pub fn pooled_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Bytes of the open windows' tables.
    pub fn memory_bytes(&self) -> usize {
        self.windows.iter().map(|(_, t)| t.bytes()).sum()
    }

    /// Spills every entry in memory as one run when the tables passed half the budget (and the
    /// store is not held by a snapshot); returns whether it did.
    pub fn maybe_spill(&mut self) -> Result<bool, SpillError> {
        let Some(sp) = &mut self.spill else { return Ok(false) };
        if sp.store.held() {
            return Ok(false);
        }
        sp.drop_dead()?;
        let bytes: usize = self.windows.iter().map(|(_, t)| t.bytes()).sum();
        if bytes <= sp.limit {
            return Ok(false);
        }
        let mut w = sp.store.begin_run(sp.next_run)?;
        let scratch = &mut self.scratch;
        let mut entries = 0usize;
        for (start, table) in &mut self.windows {
            for s in 0..SHARDS {
                table.take_shard_sorted(s, scratch, &mut self.pool);
                for (o, k, a) in scratch.iter() {
                    w.put(*start, *o, *k, a)?;
                }
                entries += scratch.len();
            }
        }
        w.finish()?;
        tracing::debug!(run = sp.next_run, entries, bytes, "agg state spilled");
        sp.next_run += 1;
        sp.spilled.extend(self.windows.iter().map(|w| w.0));
        self.spill_gen += 1;
        Ok(true)
    }

    /// Whether the agg spills, and how many times it did since its start or restore.
    pub fn spills(&self) -> Option<u32> {
        self.spill.as_ref().map(|_| self.spill_gen)
    }
}

/// Merges `b` into `a` (the same key's partials).
#[inline]
pub(crate) fn merge(a: &mut Acc, b: &Acc) {
    a.count += b.count;
    a.sum_fx = a.sum_fx.saturating_add(b.sum_fx);
    a.min = a.min.min(b.min);
    a.max = a.max.max(b.max);
}

#[cfg(test)]
pub(crate) use mem::MemSpill;

#[cfg(test)]
mod mem {
    use super::{Acc, RunWriter, SpillError, SpillStore};

    /// A spill store in memory, for tests of the operator.
    #[derive(Debug, Default)]
    pub struct MemSpill {
        /// (start, order, run) → (key, partial).
        pub entries: std::collections::BTreeMap<(i64, u64, u32), (u64, Acc)>,
        /// Runs written.
        pub runs: u32,
        /// Set to hold writes back.
        pub hold: bool,
    }

    struct MemRun<'a> {
        store: &'a mut MemSpill,
        run: u32,
        last: Option<(i64, u64)>,
    }

    impl RunWriter for MemRun<'_> {
        fn put(&mut self, start: i64, order: u64, key: u64, acc: &Acc) -> Result<(), SpillError> {
            assert!(self.last < Some((start, order)), "a run ascends");
            self.last = Some((start, order));
            self.store.entries.insert((start, order, self.run), (key, *acc));
            Ok(())
        }

        fn finish(self: Box<Self>) -> Result<(), SpillError> {
            self.store.runs += 1;
            Ok(())
        }
    }

    impl SpillStore for MemSpill {
        fn begin_run(&mut self, run: u32) -> Result<Box<dyn RunWriter + '_>, SpillError> {
            assert!(!self.hold, "no run while held");
            Ok(Box::new(MemRun { store: self, run, last: None }))
        }

        fn read(&self, start: i64, lo: u64, hi: u64, f: &mut dyn FnMut(u64, u64, Acc)) -> Result<(), SpillError> {
            for ((_, order, _), (key, acc)) in self.entries.range((start, lo, 0)..=(start, hi, u32::MAX)) {
                f(*order, *key, *acc);
            }
            Ok(())
        }

        fn drop_window(&mut self, start: i64) -> Result<(), SpillError> {
            self.entries.retain(|k, _| k.0 != start);
            Ok(())
        }

        fn held(&self) -> bool {
            self.hold
        }

        fn next_run(&self) -> u32 {
            self.entries.keys().map(|k| k.2 + 1).max().unwrap_or(0)
        }

        fn windows(&self) -> Result<Vec<i64>, SpillError> {
            let mut w: Vec<i64> = self.entries.keys().map(|k| k.0).collect();
            w.dedup();
            Ok(w)
        }
    }
}
