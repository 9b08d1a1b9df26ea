//! Replay checkpoints of a window agg: a snapshot that names the windows it holds instead of
//! writing their entries, and the restore that rebuilds those entries from the sources' rows.
//!
//! Every window remembers the checkpoint it was *born* at: the last one this agg took before
//! the window's first row. That row, and every later row of the window, reached the agg after
//! the barrier of that checkpoint, so each was sent by its source after the source's offset
//! at that checkpoint. A replay snapshot of checkpoint `N` therefore holds the windows' starts
//! (and how far the oldest one's emission had come), the watermark and the counters, and the
//! oldest birth among the windows: `from`. A restore of `N` rewinds each source to its offset at
//! `from` and sends the rows taken before `N` again; the agg knows how many come from each
//! upstream (the rows it had taken from it between the two barriers, routing being a function
//! of the key) and adds them with [`WindowAgg::replay_add`]:
//!
//! - a replayed row's windows that the snapshot holds get it, whatever the watermark (none had
//!   fired when the row first came, or the window would not be held);
//! - a replayed row of any other window is skipped and not counted: its window fired before `N`
//!   (emitted then), or the row was late then (counted then). Such a window cannot be one
//!   created after the restore: that one's end is past the restored watermark, so a row of it
//!   taken before `N` was on time and its window would be held;
//! - fired windows wait until every upstream's replay is over ([`WindowAgg::hold`]), so none
//!   is emitted without the rows it is owed.
//!
//! The cost of a checkpoint does not grow with the state: a snapshot is a few hundred bytes,
//! and a restore replays at most the rows of the windows held. Windows restored from a full
//! snapshot's entries are born at [`NEEDS_FULL`]: their earlier rows are in no replay, so the
//! agg takes full snapshots until they have fired.

use super::{FrozenState, WindowAgg};

/// The birth of windows whose entries came from a full snapshot (no replay rebuilds them).
pub const NEEDS_FULL: u64 = u64::MAX;

impl WindowAgg {
    /// Records that this agg took checkpoint `id` (0: a start from nothing): windows created
    /// from now on are born at it.
    pub fn set_checkpoint(&mut self, id: u64) {
        self.checkpoint = id;
    }

    /// The last checkpoint this agg took.
    pub fn checkpoint(&self) -> u64 {
        self.checkpoint
    }

    /// Marks every window held as born at `born` (a restore: the replay's `from`, or
    /// [`NEEDS_FULL`] for entries restored from a full snapshot).
    pub fn set_born(&mut self, born: u64) {
        self.windows.iter_mut().for_each(|(_, t)| t.born = born);
    }

    /// The checkpoint a replay snapshot taken now would replay from: the oldest birth among the
    /// windows held (none held: the last checkpoint). `None` while a window restored from a full
    /// snapshot is held: the snapshot must be full.
    pub fn replay_from(&self) -> Option<u64> {
        let oldest = self.windows.iter().map(|(_, t)| t.born).min().unwrap_or(self.checkpoint);
        (oldest != NEEDS_FULL).then_some(oldest)
    }

    /// The state a replay snapshot writes: the windows held, without their entries, with the
    /// progress and counters. Nothing is frozen (the tables stay the operator's alone), and
    /// its spill count is one no snapshot of [`Self::freeze`] has, so a full snapshot after it
    /// is never written as a delta of it.
    pub fn replay_state(&self) -> FrozenState {
        FrozenState {
            windows: self.windows.iter().map(|(s, _)| (*s, Vec::new())).collect(),
            progress: self.upstream.clone(),
            late_rows: self.late_rows,
            rows: self.rows,
            epoch: self.epoch,
            cursor: self.cursor,
            spill_gen: u32::MAX,
        }
    }

    /// Holds fired windows back (a replay is under way), or lets them go.
    pub fn hold(&mut self, on: bool) {
        self.held = on;
    }

    /// Adds a row taken before the restored checkpoint, sent again: to each of its windows that
    /// is held, whatever the watermark; skipped for the others. The counters are not touched
    /// (the checkpoint's counted it).
    pub fn replay_add(&mut self, ts: i64, key: u64, value: f64) {
        let size = self.spec.size_ms;
        let mut start = self.spec.last_start(ts);
        while start > ts - size {
            if let Ok(i) = self.windows.binary_search_by_key(&start, |w| w.0) {
                self.windows[i].1.add(super::order_of(key), key, value);
            }
            start -= self.spec.slide_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{WindowAgg, WindowResult, WindowSpec};
    use super::NEEDS_FULL;

    fn drain(agg: &mut WindowAgg) -> Vec<WindowResult> {
        let mut out = Vec::new();
        agg.emit_fired(usize::MAX, |r| out.push(r)).unwrap();
        out
    }

    /// Rows of (ts, key, value) from one upstream; progress after each.
    fn feed(agg: &mut WindowAgg, rows: &[(i64, u64, f64)]) {
        for &(t, k, v) in rows {
            agg.add(t, k, v);
            agg.observe(0, t);
        }
    }

    #[test]
    fn a_window_is_born_at_the_checkpoint_before_its_first_row() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        assert_eq!(agg.replay_from(), Some(0), "nothing held: the last checkpoint (none)");
        feed(&mut agg, &[(1, 1, 1.0)]);
        agg.set_checkpoint(4);
        feed(&mut agg, &[(12, 1, 1.0), (5, 2, 1.0)]);
        assert_eq!(agg.replay_from(), Some(0), "window 0 was born before checkpoint 4");
        feed(&mut agg, &[(21, 1, 1.0)]);
        drain(&mut agg);
        assert_eq!(agg.replay_from(), Some(4), "window 0 fired; windows 10 and 20 were born at 4");
        agg.set_born(NEEDS_FULL);
        assert_eq!(agg.replay_from(), None, "entries from a full snapshot: no replay rebuilds them");
    }

    #[test]
    fn a_replay_rebuilds_the_held_windows_and_skips_the_rest_uncounted() {
        rebuild(Way::RowByRow);
    }

    #[test]
    fn a_replay_through_a_batch_rebuilds_the_same() {
        rebuild(Way::Batch);
    }

    #[test]
    fn a_replay_as_columns_rebuilds_the_same() {
        rebuild(Way::Columns);
    }

    enum Way {
        RowByRow,
        Batch,
        Columns,
    }

    /// The rows of a checkpoint replayed row by row, or through [`WindowAgg::replay_batch`] one
    /// by one or as columns.
    fn rebuild(way: Way) {
        // Window 0 fires at ts 11 (emitted before the checkpoint), so ts 2 is late; window 10
        // is held at the checkpoint.
        let before = [(1, 1, 1.0), (3, 2, 2.0), (11, 1, 4.0), (2, 3, 8.0), (13, 2, 16.0)];
        let after = [(14, 1, 32.0), (22, 2, 64.0), (9, 9, 1.0), (31, 1, 1.0)];
        let mut whole = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        feed(&mut whole, &before);
        assert_eq!(drain(&mut whole).len(), 2, "window 0 went out before the checkpoint");
        let snap = whole.replay_state();
        let from = whole.replay_from().unwrap();
        feed(&mut whole, &after);
        let want = drain(&mut whole);
        // The restored agg: the snapshot's windows without entries, the replay, then the rest.
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        agg.restore(std::iter::empty(), &snap.progress, snap.late_rows, snap.rows).unwrap();
        agg.reopen(&snap.windows.iter().map(|w| w.0).collect::<Vec<_>>(), snap.cursor);
        agg.set_born(from);
        agg.hold(true);
        match way {
            Way::RowByRow => before.iter().for_each(|&(t, k, v)| agg.replay_add(t, k, v)),
            Way::Batch => {
                let mut adder = agg.replay_batch();
                before.iter().for_each(|&(t, k, v)| adder.add(t, k, v));
            }
            Way::Columns => {
                let ts: Vec<i64> = before.iter().map(|r| r.0).collect();
                let keys: Vec<u64> = before.iter().map(|r| r.1).collect();
                let values: Vec<f64> = before.iter().map(|r| r.2).collect();
                agg.replay_batch().add_columns(&ts, &keys, &values);
            }
        }
        agg.hold(false);
        feed(&mut agg, &after);
        assert_eq!(drain(&mut agg), want);
        assert_eq!((agg.late_rows(), agg.rows()), (whole.late_rows(), whole.rows()), "the replay counted nothing");
    }

    #[test]
    fn fired_windows_wait_while_held() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        feed(&mut agg, &[(1, 1, 1.0)]);
        agg.hold(true);
        agg.observe(0, 25);
        assert!(!agg.has_fired());
        assert!(drain(&mut agg).is_empty());
        agg.hold(false);
        assert_eq!(drain(&mut agg).len(), 1);
    }
}
