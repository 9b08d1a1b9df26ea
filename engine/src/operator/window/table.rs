//! One open window's aggregates: a hash table split into [`SHARDS`] shards by the top bits of
//! [`order_of`] the key, each shard either owned by the operator or shared with a snapshot
//! (copy-on-write, as Flink's `CopyOnWriteStateMap` does per entry, here per shard).
//!
//! Why shards:
//! - A snapshot takes the shards as they are ([`WindowTable::freeze`]: one `Arc` per shard, no
//!   entry copied), so the pause at a barrier does not grow with the state. The first row that
//!   touches a shard a snapshot still holds copies that shard alone (a fraction of a millisecond
//!   at millions of keys); once the snapshot is written and dropped, the shard is taken back
//!   without a copy.
//! - A fired window comes out sorted by [`order_of`] (each shard sorted on its own, in cache,
//!   shards in order), which is the order the result store keeps a window's results in: the sink
//!   writes them as blocks without sorting anything. It comes out a few shards per poll, so a
//!   window over millions of keys never holds its worker (and the barriers behind it) for long.
//! - A shard grows on its own: no rehash of the whole window stalls the pipeline.
//!
//! Invariants: a key lives in shard `order_of(key) >> (64 - SHARD_BITS)` only; every owned shard
//! stamps the table's epoch on what it writes, and a shared shard holds nothing stamped later than
//! the snapshot that froze it (so a snapshot can tell what changed since an older one).

use std::sync::Arc;

use weir_wire::Native;

use super::Acc;
use super::slots::{SlotMap, SlotPool, sort_drained};

/// log2 of the shards per window.
pub const SHARD_BITS: u32 = 8;
/// Shards per window.
pub const SHARDS: usize = 1 << SHARD_BITS;

/// One shard's entries.
pub type ShardMap = SlotMap;

/// The order of keys within a window, in the operator's emission and in the result store: a
/// bijective mix of the key (the splitmix64 finalizer), so shards are even whatever the keys
/// look like, and independent of the hash inside a shard (whose top bits would otherwise be
/// the same for every key of a shard).
#[inline]
pub fn order_of(key: u64) -> u64 {
    let mut z = key;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The shard of `key`: a fired window is emitted shard by shard, and an agg's messages of results
/// never span two shards (so they do not depend on where a barrier cut the emission).
#[inline]
pub fn shard_of(key: u64) -> usize {
    shard_of_order(order_of(key))
}

/// The orders of shard `s`'s keys: `lo..=hi`.
pub fn shard_orders(s: usize) -> (u64, u64) {
    let lo = (s as u64) << (64 - SHARD_BITS);
    (lo, lo | (u64::MAX >> SHARD_BITS))
}

#[inline]
fn shard_of_order(h: u64) -> usize {
    (h >> (64 - SHARD_BITS)) as usize
}

#[derive(Debug)]
enum Shard {
    Owned(ShardMap),
    /// Held by a snapshot too, with the rows for it since (order, key, value), applied once the
    /// snapshot lets go of the shard (no copy), or on a copy when they grow as many as its
    /// entries or the shard must be read.
    Shared(Arc<ShardMap>, Vec<(u64, u64, f64)>),
}

impl Shard {
    fn map(&self) -> &ShardMap {
        match self {
            Shard::Owned(m) => m,
            Shard::Shared(a, _) => a,
        }
    }

    /// The shard's entries with its deferred rows applied (a copy when there are any).
    fn settled(&self) -> std::borrow::Cow<'_, ShardMap> {
        match self {
            Shard::Shared(a, rows) if !rows.is_empty() => {
                let mut m = (**a).clone();
                rows.iter().for_each(|&(h, k, v)| m.add(h, k, v));
                std::borrow::Cow::Owned(m)
            }
            s => std::borrow::Cow::Borrowed(s.map()),
        }
    }
}

/// Rows between asking for a row's table line and aggregating the row ([`WindowTable::add_run`],
/// and the ring of the row-by-row `RowAdder`): 16 or 32 were slower (`weir-e2e agg`).
pub(super) const AHEAD: usize = 8;

/// Rows a shared shard defers at least, before it is copied.
const MIN_DEFERRED: usize = 64;

/// The aggregates of one open window.
#[derive(Debug)]
pub struct WindowTable {
    /// An array, not a slice: a shard's index (`h >> 56`) needs no bounds check.
    shards: Box<[Shard; SHARDS]>,
    /// What writes stamp (see [`SlotMap::set_epoch`]).
    epoch: u32,
    /// The checkpoint the window was born at, or [`super::replay::WRITTEN`] (see `replay.rs`).
    pub(super) born: u64,
    /// Whether rows a restore sends again go into it (see `replay.rs`).
    pub(super) replays: bool,
    /// A row came late for it while it was held (fired, its emission not over): a replay
    /// could not tell its rows from the late ones, so it is written (see `replay.rs`).
    pub(super) late: bool,
    /// No entry of it is stamped below this epoch (the one it was created at; 0 for a restored
    /// window): a chain whose files do not hold it needs a full file once it is written if
    /// some of its entries may be stamped at or below the chain's epoch.
    pub(super) floor: u32,
}

impl Default for WindowTable {
    fn default() -> Self {
        Self::empty(0)
    }
}

/// [`SHARDS`] shards (`it` yields exactly that many).
fn shard_array(it: impl Iterator<Item = Shard>) -> Box<[Shard; SHARDS]> {
    it.collect::<Box<[Shard]>>().try_into().expect("one entry per shard")
}

fn owned(mut m: ShardMap, epoch: u32) -> Shard {
    m.set_epoch(epoch);
    Shard::Owned(m)
}

impl WindowTable {
    /// An empty window whose writes stamp `epoch`.
    pub fn empty(epoch: u32) -> Self {
        Self {
            shards: shard_array((0..SHARDS).map(|_| owned(ShardMap::default(), epoch))),
            epoch,
            born: 0,
            replays: false,
            late: false,
            floor: epoch,
        }
    }

    /// An empty window sized like `other` shard by shard (the next window over the same keys):
    /// its tables do not grow through every size on the way, and take their slots from `pool`
    /// where it has them.
    pub fn sized_like(other: &WindowTable, epoch: u32, pool: &mut SlotPool) -> Self {
        let shards = shard_array(other.shards.iter().map(|s| owned(ShardMap::from_pool(s.map().len(), pool), epoch)));
        Self { shards, epoch, born: 0, replays: false, late: false, floor: epoch }
    }

    /// An empty window whose shards have room for `sizes[i]` entries each (a restore: epoch 0).
    pub fn with_shard_sizes(sizes: &[usize]) -> Self {
        debug_assert_eq!(sizes.len(), SHARDS);
        Self {
            shards: shard_array(sizes.iter().map(|n| Shard::Owned(ShardMap::with_capacity(*n)))),
            epoch: 0,
            born: 0,
            replays: false,
            late: false,
            floor: 0,
        }
    }

    /// Writes from now on stamp `epoch` (not below the current one).
    pub fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
        for s in self.shards.iter_mut() {
            if let Shard::Owned(m) = s {
                m.set_epoch(epoch);
            }
        }
    }

    /// The shard of the key whose order is `h` (`order_of(key)`), writable (taken back from a
    /// snapshot, or copied, with its deferred rows applied).
    #[inline]
    pub fn map_for(&mut self, h: u64) -> &mut ShardMap {
        let shard = &mut self.shards[shard_of_order(h)];
        if let Shard::Shared(..) = shard {
            unshare(shard, self.epoch);
        }
        match shard {
            Shard::Owned(m) => m,
            Shard::Shared(..) => unreachable!("unshared above"),
        }
    }

    /// Adds a row to the key whose order is `h`. A shard a snapshot still holds is not copied
    /// for it: the row waits beside the shard until the snapshot lets go (the common case: the
    /// uploader drops a snapshot's shards once it has written them), unless as many rows as the
    /// shard has entries are waiting already.
    #[inline(always)]
    pub fn add(&mut self, h: u64, key: u64, value: f64) {
        let epoch = self.epoch;
        match &mut self.shards[shard_of_order(h)] {
            Shard::Owned(m) => m.add(h, key, value),
            shard => add_shared(shard, epoch, h, key, value),
        }
    }

    /// Adds rows `(keys[i], values[i])`, in order: each row's line is asked for `AHEAD` rows
    /// before the row is aggregated (the agg's time is the latency of a table line per row; this
    /// way several are on their way at once).
    pub fn add_run<K: Native<Out = u64>, V: Native<Out = f64>>(&mut self, keys: &[K], values: &[V]) {
        let n = keys.len().min(values.len());
        let (keys, values) = (&keys[..n], &values[..n]);
        let mut hs = [0u64; AHEAD];
        for (h, k) in hs.iter_mut().zip(keys) {
            *h = order_of(k.native());
            self.prefetch(*h);
        }
        for i in 0..n {
            let h = hs[i % AHEAD];
            if let Some(k) = keys.get(i + AHEAD) {
                let next = order_of(k.native());
                self.prefetch(next);
                hs[i % AHEAD] = next;
            }
            self.add(h, keys[i].native(), values[i].native());
        }
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.settled().len()).sum()
    }

    /// Whether the window has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry, shard by shard (unordered within a shard).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Acc)> + '_ {
        self.shards.iter().flat_map(|s| s.settled().iter().map(|(k, a)| (k, *a)).collect::<Vec<_>>())
    }

    /// Shards a snapshot still holds that have rows waiting for them.
    pub fn deferred(&self) -> usize {
        self.shards.iter().map(|s| if let Shard::Shared(_, r) = s { r.len() } else { 0 }).sum()
    }

    /// Asks for the line where the probe of the key whose order is `h` starts.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        self.shards[shard_of_order(h)].map().prefetch(h);
    }

    /// The shards as they are now, for a snapshot: no entry is copied here. Every shard becomes
    /// shared until its next write, which stamps `next_epoch` (above every epoch so far).
    pub fn freeze(&mut self, next_epoch: u32) -> Vec<Arc<ShardMap>> {
        debug_assert!(next_epoch >= self.epoch);
        let epoch = self.epoch;
        self.epoch = next_epoch;
        self.shards
            .iter_mut()
            .map(|s| {
                if matches!(s, Shard::Shared(_, rows) if !rows.is_empty()) {
                    // Rows wait for it: this snapshot holds them (stamped with their epoch).
                    unshare(s, epoch);
                }
                match s {
                    Shard::Shared(a, _) => a.clone(),
                    Shard::Owned(m) => {
                        let a = Arc::new(std::mem::take(m));
                        *s = Shard::Shared(a.clone(), Vec::new());
                        a
                    }
                }
            })
            .collect()
    }

    /// Empties shard `s`, calling `f` with its entries in [`order_of`] order (sorted in
    /// `scratch`); returns how many there were. A snapshot that shares the shard keeps it.
    pub fn drain_shard_sorted(
        &mut self,
        s: usize,
        scratch: &mut Vec<(u64, u64, Acc)>,
        pool: &mut SlotPool,
        mut f: impl FnMut(u64, &Acc),
    ) -> usize {
        self.take_shard_sorted(s, scratch, pool);
        for (_, k, a) in scratch.iter() {
            f(*k, a);
        }
        scratch.len()
    }

    /// Empties shard `s` into `scratch` as (order, key, aggregate), in [`order_of`] order; its
    /// slots go to `pool`. A snapshot that shares the shard keeps it.
    pub fn take_shard_sorted(&mut self, s: usize, scratch: &mut Vec<(u64, u64, Acc)>, pool: &mut SlotPool) {
        let shard = std::mem::replace(&mut self.shards[s], owned(ShardMap::default(), self.epoch));
        scratch.clear();
        match shard {
            Shard::Owned(mut m) => {
                m.drain_into(scratch);
                pool.put(m);
                sort_drained(scratch);
            }
            Shard::Shared(a, mut rows) => {
                // The rows that waited are applied to the entries as they come out, not to a
                // copy of the table, and the table waits for the snapshot to let go of it: a
                // copied and dropped table would never reach the pool, and the next window would
                // fault in a fresh one.
                scratch.extend(a.iter().map(|(k, a)| (order_of(k), k, *a)));
                if !rows.is_empty() {
                    apply_sorted(scratch, &mut rows);
                }
                pool.put_shared(a);
                // Sorted, and the new keys after them sorted too: the stable sort merges the two runs.
                scratch.sort_by_key(|e| e.0);
            }
        }
    }

    /// Bytes of the tables the window owns or shares (a snapshot may hold them too), and of
    /// the rows waiting for shared ones.
    pub fn bytes(&self) -> usize {
        let deferred = |s: &Shard| if let Shard::Shared(_, r) = s { r.capacity() * 24 } else { 0 };
        self.shards.iter().map(|s| s.map().bytes() + deferred(s)).sum()
    }
}

/// Adds `rows` (order, key, value) to `entries` (order, key, aggregate, one per key): rows of
/// keys it holds to their aggregates, the others as new entries at its end. Both are sorted
/// first, so one pass matches them; `rows` is left sorted.
fn apply_sorted(entries: &mut Vec<(u64, u64, Acc)>, rows: &mut [(u64, u64, f64)]) {
    entries.sort_by_key(|e| e.0);
    rows.sort_unstable_by_key(|r| r.0);
    let held = entries.len();
    let mut i = 0;
    for &(h, k, v) in rows.iter() {
        while i < held && entries[i].0 < h {
            i += 1;
        }
        if i < held && entries[i].0 == h {
            entries[i].2.add(v);
        } else if entries.len() > held && entries.last().is_some_and(|e| e.0 == h) {
            entries.last_mut().expect("a new entry").2.add(v);
        } else {
            entries.push((h, k, Acc::new(v)));
        }
    }
}

/// [`WindowTable::add`] to a shard a snapshot shares: out of line, so the row loop keeps only
/// the owned case (rows meet shared shards only between a snapshot and its upload).
#[inline(never)]
fn add_shared(shard: &mut Shard, epoch: u32, h: u64, key: u64, value: f64) {
    match shard {
        Shard::Shared(a, rows) if Arc::strong_count(a) > 1 && rows.len() < a.len().max(MIN_DEFERRED) => {
            rows.push((h, key, value))
        }
        _ => {
            unshare(shard, epoch);
            if let Shard::Owned(m) = shard {
                m.add(h, key, value)
            }
        }
    }
}

/// Takes a shared shard back: without a copy when the snapshot let go of it, else a copy.
#[cold]
#[inline(never)]
fn unshare(shard: &mut Shard, epoch: u32) {
    let Shard::Shared(a, rows) = std::mem::replace(shard, Shard::Owned(ShardMap::default())) else { return };
    let mut m = Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone());
    m.set_epoch(epoch);
    rows.iter().for_each(|&(h, k, v)| m.add(h, k, v));
    *shard = Shard::Owned(m);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(n: u64) -> Acc {
        Acc { count: n, sum_fx: n as i128, min: 0.0, max: 0.0 }
    }

    #[test]
    fn order_of_is_a_bijection_on_a_sample_and_spreads_small_keys() {
        let mut seen: Vec<u64> = (0..100_000u64).map(order_of).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
        let mut per_shard = vec![0usize; SHARDS];
        (0..100_000u64).for_each(|k| per_shard[shard_of(k)] += 1);
        let (lo, hi) = (per_shard.iter().min().unwrap(), per_shard.iter().max().unwrap());
        assert!(*lo > 300 && *hi < 500, "keys 0..100,000 per shard: {lo}..{hi}");
    }

    #[test]
    fn a_frozen_snapshot_keeps_its_entries_while_the_window_goes_on() {
        let mut t = WindowTable::default();
        for k in 0..1000 {
            t.map_for(order_of(k)).add(order_of(k), k, 1.0);
        }
        let snap = t.freeze(1);
        for k in 0..2000 {
            t.map_for(order_of(k)).add(order_of(k), k, 1.0);
        }
        let frozen: usize = snap.iter().map(|m| m.len()).sum();
        assert_eq!(frozen, 1000);
        assert!(snap.iter().flat_map(|m| m.iter()).all(|(_, a)| a.count == 1), "the snapshot saw no later write");
        assert_eq!(t.len(), 2000);
        assert!(t.iter().filter(|(k, _)| *k < 1000).all(|(_, a)| a.count == 2));
    }

    #[test]
    fn rows_for_a_shard_a_snapshot_holds_wait_beside_it_and_apply_once_it_is_let_go() {
        let mut t = WindowTable::default();
        (0..10_000u64).for_each(|k| t.add(order_of(k), k, 1.0));
        let snap = t.freeze(1);
        (0..5_000u64).for_each(|k| t.add(order_of(k), k, 2.0));
        assert_eq!(t.deferred(), 5_000, "no shard copied");
        assert!(snap.iter().flat_map(|m| m.iter()).all(|(_, a)| a.count == 1), "the snapshot saw no later row");
        assert_eq!(t.len(), 10_000);
        assert!(t.iter().all(|(k, a)| a.count == 1 + u64::from(k < 5_000)), "reads see the waiting rows");
        drop(snap);
        (5_000..5_100u64).for_each(|k| t.add(order_of(k), k, 2.0));
        assert!(t.deferred() < 5_000, "shards taken back as rows reach them");
        // A snapshot holding on: a shard's waiting rows stop at its entries, then it is copied.
        let snap = t.freeze(2);
        for _ in 0..3 {
            (0..10_000u64).for_each(|k| t.add(order_of(k), k, 1.0));
        }
        assert!(t.deferred() <= 10_000 + 256 * MIN_DEFERRED, "{} rows waiting", t.deferred());
        let again = t.freeze(3);
        assert_eq!(t.deferred(), 0, "a snapshot takes the waiting rows");
        // Keys below 5,100 had a row more (after the first snapshot).
        assert!(again.iter().flat_map(|m| m.iter()).all(|(k, a)| a.count == if k < 5_100 { 5 } else { 4 }));
        drop((snap, again));
    }

    #[test]
    fn a_window_goes_on_with_its_entries_once_the_snapshot_is_dropped() {
        let mut t = WindowTable::default();
        t.map_for(order_of(7)).insert(7, acc(1));
        drop(t.freeze(1));
        t.map_for(order_of(7)).add(order_of(7), 7, 0.0);
        let got: Vec<_> = t.iter().map(|(k, a)| (k, a.count, a.sum_fx)).collect();
        assert_eq!(got, vec![(7, 2, 1)]);
    }

    #[test]
    fn entries_come_out_in_order_of_the_mixed_key() {
        let mut t = WindowTable::default();
        for k in (0..5000u64).rev() {
            t.map_for(order_of(k)).insert(k, acc(k + 1));
        }
        let mut out = Vec::new();
        let snap = t.freeze(1);
        let n: usize = (0..SHARDS)
            .map(|s| t.drain_shard_sorted(s, &mut Vec::new(), &mut SlotPool::default(), |k, a| out.push((k, a.count))))
            .sum();
        assert_eq!((n, out.len(), t.len()), (5000, 5000, 0));
        assert_eq!(snap.iter().map(|m| m.len()).sum::<usize>(), 5000, "the snapshot keeps what was drained");
        assert!(out.windows(2).all(|w| order_of(w[0].0) < order_of(w[1].0)));
        assert!(out.iter().all(|(k, c)| k + 1 == *c));
    }

    #[test]
    fn a_fired_shard_with_waiting_rows_comes_out_exact_without_a_copy_and_its_table_is_kept() {
        let mut t = WindowTable::default();
        (0..4_000u64).for_each(|k| t.add(order_of(k), k, k as f64));
        let snap = t.freeze(1);
        // Rows for held shards wait: keys the snapshot has, new keys, and a new key twice.
        let later: Vec<(u64, f64)> = (2_000..6_000u64).chain(5_000..5_500).map(|k| (k, 0.5 + k as f64)).collect();
        later.iter().for_each(|&(k, v)| t.add(order_of(k), k, v));
        assert!(t.deferred() > 0, "rows wait beside held shards");
        let mut want: std::collections::BTreeMap<u64, Acc> = Default::default();
        for (k, v) in (0..4_000u64).map(|k| (k, k as f64)).chain(later.iter().copied()) {
            want.entry(order_of(k)).and_modify(|a| a.add(v)).or_insert_with(|| Acc::new(v));
        }
        let mut pool = SlotPool::default();
        pool.set_limit(usize::MAX);
        let mut got = Vec::new();
        for s in 0..SHARDS {
            t.drain_shard_sorted(s, &mut Vec::new(), &mut pool, |k, a| got.push((order_of(k), k, *a)));
        }
        assert_eq!(got.len(), want.len());
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "in order of the mixed key");
        for (h, k, a) in &got {
            assert_eq!(Some(a), want.get(h), "key {k}");
        }
        assert_eq!(pool.bytes(), 0, "the snapshot still holds the tables");
        drop(snap);
        (0..SHARDS).for_each(|_| pool.reclaim_one());
        assert!(pool.bytes() > 0, "the tables are kept once the snapshot lets go");
    }
}
