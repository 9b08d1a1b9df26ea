//! The hash table of one shard of a window: open addressing with linear probing over slots of
//! one cache line each (the key and its aggregate together).
//!
//! Why not `HashMap`: at every key count the agg's time goes to memory, not arithmetic (`perf` of
//! the window benchmark at 10,000 keys: 40 % of the cycles on the first touch of the control
//! bytes and of the entry, which SwissTable keeps apart). Here a lookup touches one line, which
//! [`SlotMap::prefetch`] can ask for ahead of time.
//!
//! A quarter full at most up to [`QUARTER_UP_TO`] slots (64 KiB), half full at most beyond: a
//! key its probe does not find in its first slot costs a mispredicted branch and another line,
//! about as much as the rest of its row, and at half load a fifth to a third of the rows are
//! such. At a quarter that is half as many: `weir-e2e keys 6 100000`, three pairs, 93 / 93 / 95
//! against 82 / 81 / 85 M events/s at half load, for twice the memory (an
//! entry takes 256 to 512 bytes instead of 128 to 256), which small tables can spend and large
//! ones, whose state is what the memory budget is for, cannot. At three quarters the agg loop was
//! 20 % slower at 10,000 to 4,000,000 keys (`weir-e2e agg`: 42.8 / 98.3 / 141.8 against 35.3 /
//! 77.7 / 117.6 ns per row).
//!
//! Invariants: the number of slots is zero or a power of two, at most half used; a slot is empty
//! when its count is zero (a live aggregate has counted at least one row); a key's probe starts
//! at the slot named by the bits of `order_of(key)` right below the shard's ([`SHARD_BITS`]), so
//! slots hold keys almost in `order_of` order (apart from probing's displacements) and a fired
//! shard sorts in about one pass; every write stamps the slot with the table's epoch (the
//! snapshot it will first be part of), so a snapshot can write only what changed since an older
//! one, and no slot's epoch is above the table's.

use super::Acc;
use super::table::{SHARD_BITS, order_of};
use crate::sys::TableBuf;

#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
struct Slot {
    key: u64,
    /// The table's epoch at the last write (in what was padding before `acc`).
    epoch: u32,
    acc: Acc,
}

/// Keys to aggregates, for one shard of a window.
#[derive(Clone, Debug, Default)]
pub struct SlotMap {
    /// On huge pages when large (see [`TableBuf`]).
    slots: TableBuf<Slot>,
    len: usize,
    /// `64 - log2(slots)`: the start of a probe is `(h << SHARD_BITS) >> shift`.
    shift: u32,
    /// Slots of the first allocation, when there is none yet.
    first: usize,
    /// Entries the slots hold before the table grows ([`room`]).
    room: usize,
    /// The epoch writes stamp on slots (see [`Self::set_epoch`]).
    epoch: u32,
    /// Slots stamped with `epoch`.
    stamped: usize,
}

/// Slots of a table's first allocation.
const FIRST: usize = 8;

/// Slots up to which a table is a quarter full at most (half full beyond).
const QUARTER_UP_TO: usize = 1024;

/// Entries a table of `slots` slots holds before it grows.
fn room(slots: usize) -> usize {
    if slots <= QUARTER_UP_TO { slots / 4 } else { slots / 2 }
}

/// Slots of the smallest table (from [`FIRST`]) with [`room`] for `n` entries.
fn slots_for(n: usize) -> usize {
    let mut slots = FIRST;
    while room(slots) < n {
        slots *= 2;
    }
    slots
}

impl SlotMap {
    /// Entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The epoch writes stamp on slots: at least that of every slot.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Writes from now on stamp `epoch` (which must not be below the current one).
    #[inline]
    pub fn set_epoch(&mut self, epoch: u32) {
        debug_assert!(epoch >= self.epoch);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.stamped = 0;
        }
    }

    /// Bytes of the table's slots.
    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }

    /// Entries stamped with [`Self::epoch`]: written since the table took that epoch.
    pub fn stamped(&self) -> usize {
        self.stamped
    }

    /// A table for about `n` entries.
    pub fn with_capacity(n: usize) -> Self {
        let mut t = Self::expecting(n);
        if n > 0 {
            t.resize(t.first);
        }
        t
    }

    /// An empty table that allocates room for about `n` entries on its first insert: a new
    /// window's 256 tables allocate one by one as rows reach them, instead of all at once (half
    /// a gigabyte at 4,000,000 keys) on the row that opens the window.
    pub fn expecting(n: usize) -> Self {
        Self { first: slots_for(n), ..Self::default() }
    }

    /// An empty table for about `n` entries whose slots come from `pool` when it has a table of
    /// the size the first allocation would have (no page to fault in and clear), else lazily
    /// as [`Self::expecting`].
    pub fn from_pool(n: usize, pool: &mut SlotPool) -> Self {
        let mut t = Self::expecting(n);
        if let Some(slots) = pool.take(t.first) {
            t.set_slots(slots);
        }
        t
    }

    /// Empties the table into `out` as (order, key, aggregate), almost in [`order_of`] order
    /// (see [`sort_drained`]), keeping its slots (every one empty again) for [`SlotPool::put`].
    ///
    /// Slot order is the order of the keys' first slots, apart from two things probing does:
    /// a key sits a few slots past its first one (a local disorder), and a probe that runs off
    /// the table's end goes on at its start, so the run of slots before the first empty one
    /// may hold keys whose first slot is near the end: those go out last.
    pub fn drain_into(&mut self, out: &mut Vec<(u64, u64, Acc)>) {
        out.reserve(self.len);
        if self.len > 0 {
            // At most half used, so there is an empty slot.
            let first_empty = self.slots.iter().position(|s| s.acc.count == 0).expect("a slot is empty");
            let wrapped = |m: &Self, i: usize| m.start(order_of(m.slots[i].key)) > i;
            let mut take = |m: &mut Self, i: usize| {
                let s = &mut m.slots[i];
                if s.acc.count > 0 {
                    out.push((order_of(s.key), s.key, s.acc));
                    // The line is in cache already: emptying it here is nearly free.
                    s.acc.count = 0;
                }
            };
            for i in 0..first_empty {
                if !wrapped(self, i) {
                    take(self, i);
                }
            }
            (first_empty..self.slots.len()).for_each(|i| take(self, i));
            // What is left before the first empty slot is what wrapped round.
            (0..first_empty).for_each(|i| take(self, i));
        }
        self.len = 0;
        self.stamped = 0;
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    fn start(&self, h: u64) -> usize {
        // An empty table (shift 64) gives an index past its end, which `prefetch` and `get` never
        // read; `add` and `insert` grow the table first. A plain shift, no branch: it runs twice
        // per row.
        ((h << SHARD_BITS) >> (self.shift & 63)) as usize
    }

    /// Adds `value` to `key`'s aggregate (`h` is `order_of(key)`).
    ///
    /// Always inlined: the agg task's row loop otherwise calls it (two call sites in
    /// `WindowTable::add`), spilling its registers on every row.
    #[inline(always)]
    pub fn add(&mut self, h: u64, key: u64, value: f64) {
        if self.len >= self.room {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.start(h);
        loop {
            let s = &mut self.slots[i];
            if s.acc.count == 0 {
                *s = Slot { key, epoch: self.epoch, acc: Acc::new(value) };
                self.len += 1;
                self.stamped += 1;
                return;
            }
            if s.key == key {
                s.acc.add(value);
                if s.epoch != self.epoch {
                    s.epoch = self.epoch;
                    self.stamped += 1;
                }
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Sets `key`'s aggregate (a restore); `acc.count` must be positive.
    pub fn insert(&mut self, key: u64, acc: Acc) {
        debug_assert!(acc.count > 0);
        if self.len >= self.room {
            self.grow();
        }
        self.put(order_of(key), key, self.epoch, acc);
    }

    fn put(&mut self, h: u64, key: u64, epoch: u32, acc: Acc) {
        let mask = self.mask();
        let mut i = self.start(h);
        loop {
            let s = &mut self.slots[i];
            if s.acc.count == 0 || s.key == key {
                self.len += usize::from(s.acc.count == 0);
                // A slot takes the table's epoch: counted unless it had it (a growth moves slots
                // with their own epochs).
                let fresh = epoch == self.epoch && (s.acc.count == 0 || s.epoch != epoch);
                self.stamped += usize::from(fresh);
                *s = Slot { key, epoch, acc };
                return;
            }
            i = (i + 1) & mask;
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        self.resize((self.slots.len() * 2).max(self.first).max(FIRST));
    }

    /// Makes `slots` the table's slots (with what follows from their number), returning the old.
    fn set_slots(&mut self, slots: TableBuf<Slot>) -> TableBuf<Slot> {
        self.shift = 64 - slots.len().trailing_zeros();
        self.room = room(slots.len());
        std::mem::replace(&mut self.slots, slots)
    }

    fn resize(&mut self, n: usize) {
        let old = self.set_slots(TableBuf::new(n));
        self.len = 0;
        self.stamped = 0;
        for s in old.iter().filter(|s| s.acc.count > 0) {
            self.put(order_of(s.key), s.key, s.epoch, s.acc);
        }
    }

    /// `key`'s aggregate.
    pub fn get(&self, key: u64) -> Option<&Acc> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.start(order_of(key));
        loop {
            let s = &self.slots[i];
            if s.acc.count == 0 {
                return None;
            }
            if s.key == key {
                return Some(&s.acc);
            }
            i = (i + 1) & mask;
        }
    }

    /// Every (key, aggregate), in slot order (almost `order_of` order).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Acc)> + '_ {
        self.slots.iter().filter(|s| s.acc.count > 0).map(|s| (s.key, &s.acc))
    }

    /// Every (key, aggregate) written at an epoch above `epoch`, in slot order.
    pub fn iter_since(&self, epoch: u32) -> impl Iterator<Item = (u64, &Acc)> + '_ {
        // A table stamped at `epoch` or below holds nothing newer: not even scanned.
        let slots = if self.epoch > epoch { &self.slots[..] } else { &[] };
        slots.iter().filter(move |s| s.acc.count > 0 && s.epoch > epoch).map(|s| (s.key, &s.acc))
    }

    /// Asks the CPU for the line where a probe for `h` starts, ahead of [`Self::add`], and in a
    /// table past the caches for the next line too.
    ///
    /// Why the next line: a slot is a line, so every step of a probe past its first slot is
    /// another line, and at the loads large tables keep (between a quarter and a half) a third
    /// of the rows take that step, which missed the cache unasked (`perf annotate` of `weir-e2e
    /// agg 4000000`: 71 % of `WindowTable::add`'s samples on the second slot's load). Small
    /// tables are in cache: the second prefetch would cost them an instruction for nothing.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        let i = self.start(h);
        if let Some(s) = self.slots.get(i) {
            crate::sys::prefetch(s);
            if self.slots.len() >= PREFETCH_NEXT_FROM {
                if let Some(next) = self.slots.get((i + 1) & self.mask()) {
                    crate::sys::prefetch(next);
                }
            }
        }
    }
}

/// Slots from which [`SlotMap::prefetch`] asks for a probe's second line too: 32 KiB tables,
/// 8 MiB for a window's 256 shards (past a core's 2 MiB L2: 100,000 keys over two aggs). Was
/// 2,048 (the L3's size); `weir-e2e keys 6 100000`, four pairs: 89 / 93 / 92 / 92 % of timely
/// against 90 / 87 / 86 / 90 %.
const PREFETCH_NEXT_FROM: usize = 512;

/// Sorts what [`SlotMap::drain_into`] gave by [`order_of`]: by insertion, which costs a move per
/// step a key sits out of place (a few, at the loads the tables keep), not `n log n` comparisons;
/// entries further out of order than that (rows applied after a drain) fall back to a full
/// sort.
///
/// Why: the standard sort finds no long runs in a drained table (every probe that went past
/// its first slot breaks one), so it sorted from scratch: 10 % of `weir-e2e agg 4000000`'s
/// samples.
pub fn sort_drained(v: &mut [(u64, u64, Acc)]) {
    let budget = v.len() * 4 + 64;
    let mut moves = 0;
    for i in 1..v.len() {
        if v[i].0 >= v[i - 1].0 {
            continue;
        }
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1].0 > x.0 {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
        moves += i - j;
        if moves > budget {
            v.sort_unstable_by_key(|e| e.0);
            return;
        }
    }
}

/// Slot arrays of fired windows, kept for the next windows' tables.
///
/// Why: every window allocates its tables afresh, and at millions of keys a window's tables are
/// hundreds of megabytes that the allocator had given back to the kernel when the last window
/// went; the kernel then faults in and clears every page again (`perf` of `weir run --keys
/// 4000000` on tmpfs: 42 % of all CPU in `clear_page_erms`, 31 % under `SlotMap::resize`). A
/// table handed back here is emptied while it is drained (its lines are in cache then), so the
/// next window takes it as it is.
///
/// Invariants: every array held is a power of two in length with every slot empty; the arrays
/// held take at most `limit` bytes; tables a snapshot still shared when their window fired wait
/// in `shared` until the snapshot lets go.
#[derive(Debug, Default)]
pub struct SlotPool {
    /// Arrays held, by log2 of their length.
    free: Vec<Vec<TableBuf<Slot>>>,
    bytes: usize,
    limit: usize,
    shared: Vec<std::sync::Arc<SlotMap>>,
}

impl SlotPool {
    /// Bytes of the arrays held (the shared ones not counted: a snapshot holds those).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds at most `limit` bytes from now on (0: nothing, and what is held goes).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        if limit == 0 {
            *self = Self::default();
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Keeps `m`'s slots (an emptied table: see [`SlotMap::drain_into`]) if there is room.
    pub fn put(&mut self, m: SlotMap) {
        debug_assert!(m.is_empty());
        let b = m.bytes();
        if m.slots.is_empty() || self.bytes + b > self.limit {
            return;
        }
        debug_assert!(m.slots.iter().all(|s| s.acc.count == 0));
        let log = m.slots.len().trailing_zeros() as usize;
        if self.free.len() <= log {
            self.free.resize_with(log + 1, Vec::new);
        }
        self.bytes += b;
        self.free[log].push(m.slots);
    }

    /// Keeps a table a snapshot still holds, to empty and keep once the snapshot lets go
    /// ([`Self::reclaim_one`]).
    pub fn put_shared(&mut self, m: std::sync::Arc<SlotMap>) {
        if self.limit > 0 && !m.slots.is_empty() {
            self.shared.push(m);
        }
    }

    /// An array of `n` (a power of two) empty slots, if one is held.
    fn take(&mut self, n: usize) -> Option<TableBuf<Slot>> {
        let v = self.free.get_mut(n.trailing_zeros() as usize)?.pop()?;
        self.bytes -= v.len() * std::mem::size_of::<Slot>();
        Some(v)
    }

    /// Empties and keeps one of the shared tables no snapshot holds any more, if there is one:
    /// a bounded piece of work (one table), called between messages.
    pub fn reclaim_one(&mut self) {
        let Some(i) = self.shared.iter().position(|a| std::sync::Arc::strong_count(a) == 1) else { return };
        if let Ok(mut m) = std::sync::Arc::try_unwrap(self.shared.swap_remove(i)) {
            m.slots.iter_mut().for_each(|s| s.acc.count = 0);
            m.len = 0;
            m.stamped = 0;
            self.put(m);
        }
    }
}

#[cfg(test)]
mod tests;
