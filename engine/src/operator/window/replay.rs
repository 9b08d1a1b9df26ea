//! Replay checkpoints of a window agg: a snapshot that names some of the windows it holds
//! instead of writing their entries, and the restore that rebuilds those from the sources' rows.
//!
//! Every window remembers the checkpoint it was *born* at: the last one this agg took before
//! the window's first row. That row, and every later row of the window, reached the agg after
//! the barrier of that checkpoint, so each was sent by its source after the source's offset
//! at that checkpoint. A snapshot of checkpoint `N` holds the windows' starts (and how far the
//! oldest one's emission had come), the watermark and the counters; each window is either
//! *named* (no entries: a replay rebuilds it) or *written* (its entries in the snapshot's files,
//! incrementally: [`crate::state::WindowChain`]). The oldest birth among the named windows is
//! the replay's `from`. A restore of `N` rewinds each source to its offset at `from` and sends
//! the rows taken before `N` again; the agg knows how many come from each upstream (the rows it
//! had taken from it between the two barriers, routing being a function of the key) and adds
//! them with [`WindowAgg::replay_add`]:
//!
//! - a replayed row goes into each of its windows that takes replayed rows (the named ones,
//!   and a resumed replay's partly rebuilt ones), whatever the watermark: no row taken before
//!   `N` was late for a named window (a window a row came late for while it was still held,
//!   fired and being emitted, is written: [`WindowAgg::write_born_before`]);
//! - a written window takes none: its entries hold every row taken before `N`;
//! - a replayed row of any other window is skipped and not counted: its window fired before `N`
//!   (emitted then), or the row was late then (counted then). Such a window cannot be one
//!   created after the restore: that one's end is past the restored watermark, so a row of it
//!   taken before `N` was on time and its window would be held;
//! - fired windows wait until every upstream's replay is over ([`WindowAgg::hold`]), so none
//!   is emitted without the rows it is owed.
//!
//! Which windows are written is the recovery budget's choice (`runtime/replay.rs`): a window
//! whose rows would take longer to replay than the budget is written from then on, until it
//! fires. A window is never named again once written (its earlier entries are in the files,
//! and its rows before `from` in no replay), so [`WRITTEN`] is a birth no replay starts at.

use super::{FrozenState, WindowAgg, WindowTable};

/// The birth of windows whose entries the snapshots write (restored from entries, or chosen by
/// the recovery budget): no replay rebuilds them.
pub const WRITTEN: u64 = u64::MAX;

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

    /// After a restore of a snapshot whose entries were loaded: the windows in `written` take
    /// no replayed row, those in `partial` (a resumed replay) keep their entries and take the
    /// replayed rows, and every other one is rebuilt by the replay from its start, born at
    /// `from` (it holds nothing until then).
    pub fn set_restored(&mut self, from: u64, written: &[i64], partial: &[i64]) {
        let epoch = self.epoch;
        for (s, t) in &mut self.windows {
            (t.born, t.replays) = if written.contains(s) {
                (WRITTEN, false)
            } else if partial.contains(s) {
                (WRITTEN, true)
            } else {
                if !t.is_empty() {
                    *t = WindowTable::empty(epoch);
                }
                t.floor = epoch; // it holds nothing yet
                (from, true)
            };
        }
    }

    /// Every window held is written from now on (a restore of entries, a full snapshot, a
    /// checkpoint during a replay); returns how many were not. Whether a window takes replayed
    /// rows does not change.
    pub fn write_all(&mut self) -> usize {
        self.write_born_before(WRITTEN)
    }

    /// The named windows born before checkpoint `cutoff`, and those a row came late for, are
    /// written from now on; returns how many there were.
    pub fn write_born_before(&mut self, cutoff: u64) -> usize {
        let mut n = 0;
        for (_, t) in &mut self.windows {
            if t.born != WRITTEN && (t.born < cutoff || t.late) {
                t.born = WRITTEN;
                n += 1;
            }
        }
        n
    }

    /// The checkpoint a snapshot taken now would replay from: the oldest birth among the named
    /// windows (`None`: every window held is written, or none is held).
    pub fn replay_from(&self) -> Option<u64> {
        self.windows.iter().map(|(_, t)| t.born).filter(|b| *b != WRITTEN).min()
    }

    /// Whether some window held is written.
    pub fn any_written(&self) -> bool {
        self.windows.iter().any(|(_, t)| t.born == WRITTEN)
    }

    /// Whether a row came late for a named window held.
    pub fn any_late(&self) -> bool {
        self.windows.iter().any(|(_, t)| t.late && t.born != WRITTEN)
    }

    /// The starts of the written windows held.
    pub fn written_windows(&self) -> Vec<i64> {
        self.windows.iter().filter(|(_, t)| t.born == WRITTEN).map(|(s, _)| *s).collect()
    }

    /// The starts of the windows that take replayed rows.
    pub fn replaying_windows(&self) -> Vec<i64> {
        self.windows.iter().filter(|(_, t)| t.replays).map(|(s, _)| *s).collect()
    }

    /// The state a snapshot writes: every window held, the written ones with their entries
    /// (shared, not copied: [`Self::freeze`]) and the named ones without, with the progress and
    /// counters. With nothing written, nothing is frozen (the tables stay the operator's alone),
    /// and its spill count is one no frozen snapshot has, so the next written one is whole.
    pub fn snapshot_state(&mut self) -> FrozenState {
        if !self.any_written() {
            return self.replay_state();
        }
        self.freeze_where(|t| t.born == WRITTEN)
    }

    /// The state of a snapshot that names every window: no entries.
    pub fn replay_state(&self) -> FrozenState {
        FrozenState {
            windows: self.windows.iter().map(|(s, _)| (*s, Vec::new())).collect(),
            progress: self.upstream.clone(),
            late_rows: self.late_rows,
            rows: self.rows,
            epoch: self.epoch,
            cursor: self.cursor,
            spill_gen: u32::MAX,
            floors: Vec::new(),
        }
    }

    /// A row came late for the window starting at `start`: if it is still held (fired, its
    /// emission not over), a replay could not tell its rows from the late ones.
    /// Past a cut the row belongs to the next checkpoint: noted until [`Self::end_cuts`].
    #[cold]
    pub(super) fn late_for(&mut self, start: i64) {
        if self.defer_late {
            self.late_deferred.push(start);
        } else if let Ok(i) = self.windows.binary_search_by_key(&start, |w| w.0) {
            self.windows[i].1.late = true;
        }
    }

    /// Rows from now on come past their input's barrier (`true`: the agg cut it) or not.
    pub fn past_cut(&mut self, on: bool) {
        self.defer_late = on;
    }

    /// The cuts ended (the snapshot at them is taken, or the checkpoint given up): windows
    /// rows past them came late for are flagged now.
    pub fn end_cuts(&mut self) {
        self.defer_late = false;
        for start in std::mem::take(&mut self.late_deferred) {
            self.late_for(start);
        }
    }

    /// Holds fired windows back (a replay is under way), or lets them go.
    pub fn hold(&mut self, on: bool) {
        self.held = on;
    }

    /// Adds a row taken before the restored checkpoint, sent again: to each of its windows that
    /// takes replayed rows, whatever the watermark; skipped for the others. The counters are
    /// not touched (the checkpoint's counted it).
    pub fn replay_add(&mut self, ts: i64, key: u64, value: f64) {
        let size = self.spec.size_ms;
        let mut start = self.spec.last_start(ts);
        while start > ts - size {
            if let Ok(i) = self.windows.binary_search_by_key(&start, |w| w.0)
                && self.windows[i].1.replays
            {
                self.windows[i].1.add(super::order_of(key), key, value);
            }
            start -= self.spec.slide_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{WindowAgg, WindowResult, WindowSpec};

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
        assert_eq!(agg.replay_from(), None, "nothing held");
        feed(&mut agg, &[(1, 1, 1.0)]);
        agg.set_checkpoint(4);
        feed(&mut agg, &[(12, 1, 1.0), (5, 2, 1.0)]);
        assert_eq!(agg.replay_from(), Some(0), "window 0 was born before checkpoint 4");
        assert_eq!(agg.write_born_before(4), 1, "window 0 is written from now on");
        assert_eq!(agg.replay_from(), Some(4), "the oldest named window: 10, born at 4");
        feed(&mut agg, &[(21, 1, 1.0)]);
        drain(&mut agg);
        assert_eq!(agg.written_windows(), Vec::<i64>::new(), "windows 0 and 10 fired");
        assert_eq!(agg.replay_from(), Some(4), "window 20 was born at 4");
        assert_eq!(agg.write_all(), 1);
        assert_eq!(agg.replay_from(), None, "every window written: no replay rebuilds one");
        assert_eq!(agg.written_windows(), vec![20]);
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
        agg.set_restored(from, &[], &[]);
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
    fn a_row_late_for_a_window_being_emitted_makes_it_written_past_a_cut_only_once_the_cuts_end() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        feed(&mut agg, &[(1, 1, 1.0), (15, 1, 1.0)]);
        assert!(agg.has_fired(), "window 0 fired and is not emitted yet");
        agg.past_cut(true);
        agg.add(2, 2, 1.0); // late, past a cut: the next checkpoint's
        assert!(!agg.any_late(), "the snapshot at the cuts may still name window 0");
        agg.end_cuts();
        assert!(agg.any_late());
        assert_eq!(agg.write_born_before(0), 1, "written whatever its birth");
        assert_eq!(agg.written_windows(), vec![0]);
        let mut aligned = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        feed(&mut aligned, &[(1, 1, 1.0), (15, 1, 1.0)]);
        aligned.batch().add(2, 2, 1.0);
        assert!(aligned.any_late(), "a late row before any cut flags at once, through a batch too");
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
