//! [`RowAdder`]: many rows into a [`WindowAgg`] at once, each row's table line prefetched a few
//! rows ahead.

use weir_wire::Native;

use super::table::AHEAD;
use super::{WindowAgg, order_of};

/// Adds rows to a [`WindowAgg`] (see [`WindowAgg::batch`]); the counters are updated, and the
/// rows still held are aggregated, when it is dropped.
///
/// Each row's table line is prefetched as it comes in and the row aggregated `AHEAD` rows
/// later: the agg's time is memory latency (a table line per row, out of cache from 100,000 keys
/// on), and this way several rows' lines are on their way at once.
#[derive(Debug)]
pub struct RowAdder<'a> {
    agg: &'a mut WindowAgg,
    /// The event times `[lo, hi)` of the window the last row went to (tumbling windows only).
    lo: i64,
    hi: i64,
    /// That window's index, or `None` when it is late.
    window: Option<usize>,
    rows: u64,
    late: u64,
    /// Rows of `window` prefetched and not yet aggregated: (order of the key, key, value).
    ring: [(u64, u64, f64); AHEAD],
    queued: usize,
    /// Rows a restore sends again ([`WindowAgg::replay_add`]): to windows held only, uncounted.
    replay: bool,
    /// Whether windows are tumbling (read once, not per row).
    tumbling: bool,
}

impl<'a> RowAdder<'a> {
    pub(super) fn new(agg: &'a mut WindowAgg, replay: bool) -> Self {
        let tumbling = agg.spec.slide_ms == agg.spec.size_ms;
        RowAdder {
            agg,
            lo: i64::MAX,
            hi: i64::MIN,
            window: None,
            rows: 0,
            late: 0,
            ring: [(0, 0, 0.0); AHEAD],
            queued: 0,
            tumbling,
            replay,
        }
    }

    /// Adds one row (the same as [`WindowAgg::add`], or [`WindowAgg::replay_add`] for a
    /// replay).
    #[inline]
    pub fn add(&mut self, ts: i64, key: u64, value: f64) {
        if !self.tumbling {
            match self.replay {
                true => self.agg.replay_add(ts, key, value),
                false => self.agg.add(ts, key, value),
            }
            return;
        }
        self.rows += u64::from(!self.replay);
        if !(ts >= self.lo && ts < self.hi) {
            // Another window: found once for the run of rows that share it. Indices stay valid
            // until the next miss: only a miss inserts a window, and nothing fires meanwhile.
            self.drain();
            self.find(ts);
        }
        let Some(w) = self.window else {
            self.late += u64::from(!self.replay);
            return;
        };
        let h = order_of(key);
        let table = &mut self.agg.windows[w].1;
        table.prefetch(h);
        let slot = self.queued % AHEAD;
        if self.queued >= AHEAD {
            let (oh, ok, ov) = self.ring[slot];
            table.add(oh, ok, ov);
        }
        self.ring[slot] = (h, key, value);
        self.queued += 1;
    }

    /// Adds rows given as columns, the same as [`Self::add`] row by row: a run of rows in one
    /// window is found by one scan of its event times and goes to
    /// [`WindowTable::add_run`](super::WindowTable::add_run) whole, without the per-row window
    /// checks and ring of [`Self::add`]. The columns are a local batch's or, read in place, those
    /// of a batch from another node ([`Native`]).
    pub fn add_columns<T, K, V>(&mut self, ts: &[T], keys: &[K], values: &[V])
    where
        T: Native<Out = i64>,
        K: Native<Out = u64>,
        V: Native<Out = f64>,
    {
        let n = ts.len();
        assert!(keys.len() == n && values.len() == n, "columns of one length");
        if !self.tumbling {
            (0..n).for_each(|i| self.add(ts[i].native(), keys[i].native(), values[i].native()));
            return;
        }
        self.drain();
        let mut i = 0;
        while i < n {
            let t = ts[i].native();
            if !(t >= self.lo && t < self.hi) {
                self.find(t);
            }
            let (lo, hi) = (self.lo, self.hi);
            let run = ts[i..].iter().map(|t| t.native()).position(|t| !(t >= lo && t < hi)).unwrap_or(n - i);
            let counted = if self.replay { 0 } else { run as u64 };
            self.rows += counted;
            match self.window {
                Some(w) => self.agg.windows[w].1.add_run(&keys[i..i + run], &values[i..i + run]),
                None => self.late += counted,
            }
            i += run;
        }
    }

    /// Makes the window of `ts` the current one (a row outside the current one came).
    fn find(&mut self, ts: i64) {
        let agg = &mut *self.agg;
        self.lo = agg.spec.last_start(ts);
        self.hi = self.lo.saturating_add(agg.spec.size_ms);
        self.window = match self.replay {
            true => agg.windows.binary_search_by_key(&self.lo, |w| w.0).ok().filter(|i| agg.windows[*i].1.replays),
            false if self.hi > agg.watermark => Some(agg.window_index(self.lo)),
            false => {
                agg.late_for(self.lo);
                None
            }
        };
    }

    /// Aggregates the rows held.
    fn drain(&mut self) {
        if let Some(w) = self.window {
            let table = &mut self.agg.windows[w].1;
            let first = self.queued.saturating_sub(AHEAD);
            for i in first..self.queued {
                let (h, k, v) = self.ring[i % AHEAD];
                table.add(h, k, v);
            }
        }
        self.queued = 0;
    }
}

impl Drop for RowAdder<'_> {
    fn drop(&mut self) {
        self.drain();
        self.agg.rows += self.rows;
        self.agg.late_rows += self.late;
    }
}
