//! An agg's unaligned barriers: what it records when it takes an input on past that input's
//! barrier instead of holding it ([`Hold::Cut`](crate::checkpoint::driver::Hold)), so that its
//! snapshot is still the state at each input's barrier.
//!
//! Only an agg that takes a replay snapshot of the checkpoint cuts (see
//! `operator::window::replay`): such a snapshot holds the windows' starts, the progress, the
//! counters and the rows taken from each upstream, never the windows' entries, which a restore
//! rebuilds from the sources. So rows taken past a cut may go into the windows, as long as:
//!
//! - the rows counted for the upstream are those at its barrier (`taken`: a restore replays
//!   exactly the rows before it, and the source resends the rest as new ones);
//! - the counters leave out what the rows past the cut added (`rows`, `late`);
//! - the upstream's progress past the cut waits (`pending`) until the snapshot: no window fires
//!   on rows after a barrier, so nothing they cause reaches the downstream before the agg's
//!   own barrier, and the snapshot's progress is the one at the cut.
//!
//! Invariant: while any input is cut, the agg takes a checkpoint's barrier on every input
//! either cut or not yet come; the cut ends at the snapshot ([`Cuts::release`]), or when the
//! machine reopens the inputs (the checkpoint was abandoned: the rows past the cut are simply
//! new rows then, and the progress that waited is applied).

use crate::operator::window::WindowAgg;

/// One input's cut.
#[derive(Clone, Copy, Debug, Default)]
struct Cut {
    /// Rows taken from the upstream by its barrier.
    taken: u64,
    /// What rows past the barrier added to the agg's counters.
    rows: u64,
    late: u64,
    /// The largest progress past the barrier, not applied yet.
    pending: Option<i64>,
}

/// The cuts of the checkpoint under way, per input.
#[derive(Debug, Default)]
pub(crate) struct Cuts {
    cuts: Vec<Option<Cut>>,
    active: usize,
}

impl Cuts {
    pub(crate) fn new(inputs: usize) -> Self {
        Cuts { cuts: vec![None; inputs], active: 0 }
    }

    /// Whether any input is cut.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.active > 0
    }

    /// Whether input `i` is cut.
    #[inline]
    pub(crate) fn is_cut(&self, i: usize) -> bool {
        self.active > 0 && self.cuts[i].is_some()
    }

    /// Input `i`'s barrier came with `taken` rows taken from it.
    pub(crate) fn cut(&mut self, i: usize, taken: u64) {
        if self.cuts[i].is_none() {
            self.active += 1;
        }
        self.cuts[i] = Some(Cut { taken, ..Cut::default() });
    }

    /// Rows past input `i`'s cut added `rows` and `late` to the agg's counters.
    #[inline]
    pub(crate) fn counted(&mut self, i: usize, rows: u64, late: u64) {
        if let Some(c) = &mut self.cuts[i] {
            c.rows += rows;
            c.late += late;
        }
    }

    /// Progress `ts` from input `i` (`i64::MAX`: its end): to `agg` now, or, past the input's
    /// cut, at its release.
    #[inline]
    pub(crate) fn observe(&mut self, agg: &mut WindowAgg, i: usize, ts: i64) {
        match &mut self.cuts[i] {
            Some(c) => c.pending = Some(c.pending.map_or(ts, |p| p.max(ts))),
            None => agg.observe(i, ts),
        }
    }

    /// `taken` (rows taken per upstream now) as it stood at each cut.
    pub(crate) fn taken_at_cuts(&self, taken: &[u64]) -> Vec<u64> {
        taken.iter().zip(&self.cuts).map(|(t, c)| c.map_or(*t, |c| c.taken)).collect()
    }

    /// The agg's `(rows, late rows)` without what rows past the cuts added.
    pub(crate) fn counters_at_cuts(&self, rows: u64, late: u64) -> (u64, u64) {
        self.cuts.iter().flatten().fold((rows, late), |(r, l), c| (r - c.rows, l - c.late))
    }

    /// Ends input `i`'s cut (`None`: every input's): the progress that waited goes to the agg.
    pub(crate) fn release(&mut self, agg: &mut WindowAgg, i: Option<usize>) {
        if self.active == 0 {
            return;
        }
        let range = match i {
            Some(i) => i..i + 1,
            None => 0..self.cuts.len(),
        };
        for j in range {
            if let Some(c) = self.cuts[j].take() {
                self.active -= 1;
                if let Some(ts) = c.pending {
                    agg.observe(j, ts);
                }
            }
        }
        if self.active == 0 {
            agg.end_cuts();
        }
    }

    /// Forgets every cut (a restore: the agg's state is replaced).
    pub(crate) fn clear(&mut self) {
        self.cuts.iter_mut().for_each(|c| *c = None);
        self.active = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::window::WindowSpec;

    #[test]
    fn progress_past_a_cut_waits_for_the_release() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 2);
        agg.observe(0, 5);
        agg.observe(1, 5);
        let mut cuts = Cuts::new(2);
        cuts.cut(0, 100);
        cuts.observe(&mut agg, 0, 25);
        cuts.observe(&mut agg, 0, 22);
        cuts.observe(&mut agg, 1, 30); // input 1 is not cut: applied now
        assert_eq!(agg.progress()[1], Some(30), "input 1 is not cut");
        assert_eq!(agg.watermark(), 5, "input 0's progress past its cut waits");
        assert!(!agg.has_fired());
        cuts.release(&mut agg, None);
        assert_eq!(agg.watermark(), 25, "the largest progress that waited, applied");
        assert!(!cuts.any());
    }

    #[test]
    fn the_counts_at_the_cuts_leave_out_what_came_after() {
        let mut cuts = Cuts::new(3);
        cuts.cut(0, 100);
        cuts.cut(2, 7);
        cuts.counted(0, 40, 2);
        cuts.counted(1, 99, 9); // not cut: counts as usual
        cuts.counted(2, 3, 0);
        assert_eq!(cuts.taken_at_cuts(&[140, 50, 10]), vec![100, 50, 7]);
        assert_eq!(cuts.counters_at_cuts(1000, 10), (957, 8));
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 3);
        cuts.release(&mut agg, Some(2));
        assert!(cuts.is_cut(0) && !cuts.is_cut(2));
        cuts.clear();
        assert!(!cuts.any() && !cuts.is_cut(0));
    }
}
