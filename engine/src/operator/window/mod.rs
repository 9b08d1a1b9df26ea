//! Keyed event-time window aggregation (tumbling and hopping) with count, sum, min, max and avg.
//!
//! Semantics, which the reference implementation in the tests repeats independently:
//! - A window is `[start, start + size)` with `start` a multiple of `slide` (tumbling: slide = size).
//!   A row with event time `ts` belongs to every window that contains `ts`.
//! - Each upstream reports progress (the largest event time it has sent). The operator's watermark
//!   is the minimum over its upstreams minus the configured delay; until every upstream has reported,
//!   it is `i64::MIN`.
//! - A window fires (its results are emitted and it is forgotten) once the watermark reaches its end.
//!   [`WindowAgg::emit_fired`] emits fired windows a bounded number of results at a time, oldest
//!   first; until then they are part of the state (a snapshot holds what is left of them).
//!   A row's contribution to a window whose end is at or below the watermark is late: it is dropped,
//!   and the row counts once in `late_rows`.
//! - Sums are accumulated in fixed point (value × 2^32, rounded, in an i128), so they do not depend on
//!   the order rows arrive in: a replay after recovery that interleaves upstreams differently gives
//!   bit-identical results. Exact to 2^-32; values beyond ±2^94 saturate.
//! - A fired window's results come out in [`order_of`] order of their keys (the result store's
//!   order), window after window, oldest first.
//!
//! Open windows live in memory ([`WindowTable`]: sharded, copy-on-write); [`WindowAgg::freeze`]
//! hands a snapshot their shards without copying entries, and [`WindowAgg::restore`] puts a
//! checkpoint's entries back.

mod adder;
mod fixed;
mod frozen;
pub mod replay;
mod slots;
mod spill;
mod table;

use slots::SlotPool;

pub use adder::RowAdder;
pub use fixed::{from_fixed, to_fixed};
pub use frozen::FrozenState;
#[cfg(test)]
pub(crate) use spill::MemSpill;
pub use spill::{RunWriter, SpillError, SpillStore};
pub use table::{SHARDS, ShardMap, WindowTable, order_of, shard_of, shard_orders};

/// A restore's state has progress for another number of upstreams than the operator has.
/// Fatal for that state: it is another stream's, or another shape of this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("state has progress for {state} upstreams, the operator has {operator}")]
pub struct UpstreamsMismatch {
    /// Upstreams the state has progress for.
    pub state: usize,
    /// Upstreams the operator has.
    pub operator: usize,
}

/// Window shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// Length of a window (ms).
    pub size_ms: i64,
    /// Distance between window starts (ms); equal to `size_ms` for tumbling windows.
    pub slide_ms: i64,
}

impl WindowSpec {
    /// Tumbling windows of `size_ms`.
    pub fn tumbling(size_ms: i64) -> Self {
        Self { size_ms, slide_ms: size_ms }
    }

    /// Hopping windows of `size_ms` every `slide_ms`.
    pub fn hopping(size_ms: i64, slide_ms: i64) -> Self {
        Self { size_ms, slide_ms }
    }

    /// Checks the shape: positive, and the size a multiple of the slide.
    pub fn validate(&self) -> Result<(), crate::spec::SpecError> {
        let (size_ms, slide_ms) = (self.size_ms, self.slide_ms);
        if size_ms <= 0 || slide_ms <= 0 {
            return Err(crate::spec::SpecError::WindowNotPositive { size_ms, slide_ms });
        }
        if size_ms % slide_ms != 0 {
            return Err(crate::spec::SpecError::WindowNotMultiple { size_ms, slide_ms });
        }
        Ok(())
    }

    /// Start of the latest window containing `ts`.
    #[inline]
    pub fn last_start(&self, ts: i64) -> i64 {
        ts - ts.rem_euclid(self.slide_ms)
    }

    /// Number of windows each row belongs to.
    #[inline]
    pub fn windows_per_row(&self) -> i64 {
        self.size_ms / self.slide_ms
    }
}

/// Running aggregate of one key in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Acc {
    /// Rows.
    pub count: u64,
    /// Sum in fixed point (see [`to_fixed`]).
    pub sum_fx: i128,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Acc {
    #[inline]
    fn new(v: f64) -> Self {
        Acc { count: 1, sum_fx: to_fixed(v), min: v, max: v }
    }

    #[inline]
    fn add(&mut self, v: f64) {
        self.count += 1;
        if v.is_nan() {
            // What a NaN adds: nothing to the sum (its fixed point is 0), and `f64::min` and
            // `max` pass over it. One predicted branch, so the row below needs no NaN checks.
            return;
        }
        let t = to_fixed(v);
        match self.sum_fx.overflowing_add(t) {
            (s, false) => self.sum_fx = s,
            (_, true) => self.sum_fx = saturated(t),
        }
        // `f64::min` and `max` with `v` not NaN, in one instruction each: a NaN held (every
        // earlier row was NaN) gives way to `v`, as it does there.
        self.min = crate::sys::min_or_second(self.min, v);
        self.max = crate::sys::max_or_second(self.max, v);
    }
}

/// The bound a sum that overflowed adding `t` stays at (out of line: a sum of values below about
/// 2.1·10^9 reaches it only after 2^64 rows, and the add's overflow flag then is one branch
/// instead of the conditional moves of `saturating_add`).
#[cold]
#[inline(never)]
fn saturated(t: i128) -> i128 {
    if t > 0 { i128::MAX } else { i128::MIN }
}

/// One key's result for one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowResult {
    /// Series key.
    pub key: u64,
    /// Window start (ms).
    pub start: i64,
    /// Rows.
    pub count: u64,
    /// Sum (fixed-point exact, see the module docs).
    pub sum: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl From<WindowResult> for weir_wire::msg::ResultRow {
    fn from(r: WindowResult) -> Self {
        Self { key: r.key, start: r.start, count: r.count, sum: r.sum, min: r.min, max: r.max }
    }
}

impl From<&weir_wire::msg::ResultRow> for WindowResult {
    fn from(r: &weir_wire::msg::ResultRow) -> Self {
        Self { key: r.key, start: r.start, count: r.count, sum: r.sum, min: r.min, max: r.max }
    }
}

impl WindowResult {
    /// Average.
    pub fn avg(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum / self.count as f64 }
    }
}

/// The operator's state for one agg task.
#[derive(Debug)]
pub struct WindowAgg {
    spec: WindowSpec,
    delay_ms: i64,
    /// Open windows, sorted by start; rows mostly hit the last one or two.
    windows: Vec<(i64, WindowTable)>,
    /// Largest event time reported by each upstream (`None` until it reports).
    upstream: Vec<Option<i64>>,
    watermark: i64,
    late_rows: u64,
    rows: u64,
    /// One shard's entries at a time, sorted when a window fires.
    scratch: Vec<(u64, u64, Acc)>,
    /// The next shard of the oldest window to emit, once that window fired.
    cursor: usize,
    /// What writes stamp on entries: the epoch of the next snapshot (1 after a start or a
    /// restore, whose entries are stamped 0).
    epoch: u32,
    /// Where state beyond the memory budget goes, if anywhere.
    spill: Option<spill::Spilling>,
    /// Spills since the start or the restore: a snapshot after a spill cannot be a delta of
    /// one before it (entries moved out of memory).
    spill_gen: u32,
    /// Fired windows' slot arrays for the next windows (none kept under a memory budget).
    pool: SlotPool,
    /// The last checkpoint this agg took (0: none since its start from nothing): a window
    /// created now is born at it (see [`replay`]).
    checkpoint: u64,
    /// Fired windows wait: a restore's replay is not over (see [`replay`]).
    held: bool,
    /// Rows go in past their input's barrier (the agg cut it): windows they come late for are
    /// noted in `late_deferred`, not flagged, until the cuts end (see [`replay`]).
    defer_late: bool,
    late_deferred: Vec<i64>,
}

impl WindowAgg {
    /// An operator with `upstreams` inputs.
    pub fn new(spec: WindowSpec, delay_ms: i64, upstreams: usize) -> Self {
        Self {
            spec,
            delay_ms,
            windows: Vec::new(),
            upstream: vec![None; upstreams],
            watermark: i64::MIN,
            late_rows: 0,
            rows: 0,
            scratch: Vec::new(),
            cursor: 0,
            epoch: 1,
            spill: None,
            spill_gen: 0,
            pool: SlotPool::default(),
            checkpoint: 0,
            held: false,
            defer_late: false,
            late_deferred: Vec::new(),
        }
    }

    /// The combined watermark.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Rows dropped as late so far.
    pub fn late_rows(&self) -> u64 {
        self.late_rows
    }

    /// Rows processed so far (late ones included).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Windows held: open, or fired and not all emitted yet.
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }

    #[inline]
    fn window_mut(&mut self, start: i64) -> &mut WindowTable {
        let i = self.window_index(start);
        &mut self.windows[i].1
    }

    /// The index of the window starting at `start`, created if need be.
    #[inline]
    fn window_index(&mut self, start: i64) -> usize {
        // Scan from the newest: in-order data hits the last window at once.
        let mut i = self.windows.len();
        while i > 0 && self.windows[i - 1].0 > start {
            i -= 1;
        }
        if i == 0 || self.windows[i - 1].0 != start {
            // A new window: sized like the newest one, which is over the same keys.
            let e = self.epoch;
            let pool = &mut self.pool;
            let mut table =
                self.windows.last().map_or_else(|| WindowTable::empty(e), |(_, t)| WindowTable::sized_like(t, e, pool));
            table.born = self.checkpoint;
            self.windows.insert(i, (start, table));
            return i;
        }
        i - 1
    }

    /// Adds one row.
    #[inline]
    pub fn add(&mut self, ts: i64, key: u64, value: f64) {
        self.rows += 1;
        let size = self.spec.size_ms;
        let mut start = self.spec.last_start(ts);
        let mut late = false;
        // Windows containing ts: start > ts - size, stepping back by the slide.
        while start > ts - size {
            if start.saturating_add(size) <= self.watermark {
                late = true;
                self.late_for(start);
            } else {
                let h = order_of(key);
                self.window_mut(start).add(h, key, value);
            }
            start -= self.spec.slide_ms;
        }
        if late {
            self.late_rows += 1;
        }
    }

    /// A way to add many rows at once: consecutive rows of the same window (the common case:
    /// event time moves slowly against the row rate) find their window and its lateness once.
    #[inline]
    pub fn batch(&mut self) -> RowAdder<'_> {
        RowAdder::new(self, false)
    }

    /// [`Self::batch`] for rows a restore sends again (see [`replay`]).
    #[inline]
    pub fn replay_batch(&mut self) -> RowAdder<'_> {
        RowAdder::new(self, true)
    }

    /// Upstream `input` has sent every row with event time up to `max_ts`. Fires the windows the
    /// new watermark closes, calling `emit` for each result, oldest window first.
    pub fn advance(&mut self, input: usize, max_ts: i64, emit: impl FnMut(WindowResult)) -> Result<(), SpillError> {
        self.observe(input, max_ts);
        self.emit_fired(usize::MAX, emit).map(|_| ())
    }

    /// Upstream `input` has sent every row with event time up to `max_ts`: the watermark moves,
    /// and the windows it closes are fired, to be emitted by [`Self::emit_fired`].
    pub fn observe(&mut self, input: usize, max_ts: i64) {
        let slot = &mut self.upstream[input];
        *slot = Some(slot.map_or(max_ts, |t| t.max(max_ts)));
        let Some(min) = self.upstream.iter().try_fold(i64::MAX, |m, u| u.map(|t| m.min(t))) else {
            return;
        };
        self.watermark = self.watermark.max(min.saturating_sub(self.delay_ms));
    }

    /// Whether fired windows wait to be emitted.
    pub fn has_fired(&self) -> bool {
        !self.held && self.windows.first().is_some_and(|(s, _)| s.saturating_add(self.spec.size_ms) <= self.watermark)
    }

    /// Emits fired windows, oldest first, shard by shard, until at least `max` results went out
    /// (or none is left); returns how many did. Fails only when spilled partials cannot be read.
    pub fn emit_fired(&mut self, max: usize, mut emit: impl FnMut(WindowResult)) -> Result<usize, SpillError> {
        let mut n = 0;
        self.pool.reclaim_one();
        while n < max && self.has_fired() {
            let (start, table) = &mut self.windows[0];
            let start = *start;
            if self.cursor == 0 && self.spill.is_none() {
                // The pool keeps up to one window's tables: what the next window will take.
                self.pool.set_limit(self.pool.limit().max(table.bytes()));
            }
            let mut out = |key, a: &Acc| {
                emit(WindowResult { key, start, count: a.count, sum: from_fixed(a.sum_fx), min: a.min, max: a.max })
            };
            n += match &mut self.spill {
                Some(sp) if sp.has(start) => {
                    sp.emit_shard(start, self.cursor, table, &mut self.scratch, &mut self.pool, &mut out)?
                }
                _ => table.drain_shard_sorted(self.cursor, &mut self.scratch, &mut self.pool, out),
            };
            self.cursor += 1;
            if self.cursor == SHARDS {
                self.windows.remove(0);
                self.cursor = 0;
                if let Some(sp) = &mut self.spill {
                    sp.fired(start)?;
                }
            }
        }
        Ok(n)
    }

    /// How many (window, key) entries are open.
    pub fn state_len(&self) -> usize {
        self.windows.iter().map(|(_, t)| t.len()).sum()
    }

    /// Every open (window start, key, aggregate).
    pub fn state(&self) -> impl Iterator<Item = (i64, u64, Acc)> + '_ {
        self.windows.iter().flat_map(|(s, t)| t.iter().map(move |(k, a)| (*s, k, a)))
    }

    /// The state as it is now, for a snapshot written elsewhere: the windows' shards are
    /// shared, not copied (microseconds whatever the state's size).
    pub fn freeze(&mut self) -> FrozenState {
        self.freeze_where(|_| true)
    }

    /// [`Self::freeze`] of the windows `written` accepts; the others are in the snapshot
    /// without entries (named: see [`replay`]).
    fn freeze_where(&mut self, written: impl Fn(&WindowTable) -> bool) -> FrozenState {
        let epoch = self.epoch;
        self.epoch = epoch.checked_add(1).expect("fewer than 2^32 snapshots between two restores");
        let next = self.epoch;
        FrozenState {
            windows: self
                .windows
                .iter_mut()
                .map(|(s, t)| (*s, if written(t) { t.freeze(next) } else { Vec::new() }))
                .collect(),
            progress: self.upstream.clone(),
            late_rows: self.late_rows,
            rows: self.rows,
            epoch,
            cursor: self.cursor,
            spill_gen: self.spill_gen,
            floors: self.windows.iter().filter(|(_, t)| written(t)).map(|(s, t)| (*s, t.floor)).collect(),
        }
    }

    /// Progress per upstream, for the state store.
    pub fn progress(&self) -> &[Option<i64>] {
        &self.upstream
    }

    /// Replaces the in-memory state with what a checkpoint held. `progress` must have one entry per
    /// upstream of this operator.
    pub fn restore(
        &mut self,
        entries: impl IntoIterator<Item = (i64, u64, Acc)>,
        progress: &[Option<i64>],
        late_rows: u64,
        rows: u64,
    ) -> Result<(), UpstreamsMismatch> {
        // Tables sized first: inserting millions of entries into tables that double on the way
        // took half of a restore's time at 4,000,000 keys.
        let entries: Vec<(i64, u64, Acc)> = entries.into_iter().collect();
        let mut sizes: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
        for (start, key, _) in &entries {
            sizes.entry(*start).or_insert_with(|| vec![0; SHARDS])[shard_of(*key)] += 1;
        }
        self.restore_begin(sizes.into_iter().collect(), progress, late_rows, rows)?;
        for (start, key, acc) in entries {
            self.restore_put(start, key, acc);
        }
        self.restore_end();
        Ok(())
    }

    /// A restore entry by entry (the loader streams them from disk): empties the state, sizes
    /// the windows (`sizes`: per window, entries expected per shard), and sets the progress and
    /// counters; then [`Self::restore_put`] for each entry and [`Self::restore_end`].
    pub fn restore_begin(
        &mut self,
        sizes: Vec<(i64, Vec<usize>)>,
        progress: &[Option<i64>],
        late_rows: u64,
        rows: u64,
    ) -> Result<(), UpstreamsMismatch> {
        if progress.len() != self.upstream.len() {
            return Err(UpstreamsMismatch { state: progress.len(), operator: self.upstream.len() });
        }
        self.cursor = 0;
        (self.defer_late, self.late_deferred) = (false, Vec::new());
        self.windows = sizes.into_iter().map(|(start, n)| (start, WindowTable::with_shard_sizes(&n))).collect();
        self.windows.sort_by_key(|w| w.0);
        self.upstream.copy_from_slice(progress);
        self.watermark = self
            .upstream
            .iter()
            .try_fold(i64::MAX, |m, u| u.map(|t| m.min(t)))
            .map_or(i64::MIN, |m| m.saturating_sub(self.delay_ms));
        self.late_rows = late_rows;
        self.rows = rows;
        Ok(())
    }

    /// One entry of a restore (a later one of the same window and key replaces it).
    pub fn restore_put(&mut self, start: i64, key: u64, acc: Acc) {
        self.window_mut(start).map_for(order_of(key)).insert(key, acc);
    }

    /// The end of a restore: restored entries are stamped 0 (they are in the checkpoint);
    /// what comes next, 1.
    pub fn restore_end(&mut self) {
        self.epoch = 1;
        self.spill_gen = 0;
        self.windows.iter_mut().for_each(|(_, t)| t.set_epoch(1));
    }

    /// After [`Self::restore`]: the windows open at the snapshot (some may hold no entry in
    /// memory: all spilled), and how far the oldest one's emission had come.
    pub fn reopen(&mut self, windows: &[i64], cursor: usize) {
        for start in windows {
            self.window_index(*start);
        }
        self.windows.iter_mut().for_each(|(_, t)| t.set_epoch(self.epoch));
        if windows.first().is_some_and(|s| self.windows.first().is_some_and(|w| w.0 == *s)) {
            self.cursor = cursor.min(SHARDS - 1);
        }
    }
}

#[cfg(test)]
mod tests;
