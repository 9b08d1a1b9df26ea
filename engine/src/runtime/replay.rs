//! The tasks' side of replay checkpoints (`operator::window::replay` has the agg's windows):
//! what an agg counts of each upstream's rows, and what a source remembers of its offsets, so
//! that a restore can send an agg exactly the rows its windows are owed again.
//!
//! Invariants:
//! - An agg's `taken[i]` is the number of rows it has taken from upstream `i` in the stream's
//!   history: a restore sets it back to the checkpoint's, and replayed rows do not add to it.
//!   Routing is a function of the key, so the rows a source sends an agg between two of its
//!   offsets are the same in every run: the difference of `taken` at two checkpoints is what a
//!   replay between them sends.
//! - The history holds `taken` at every checkpoint a window held may be born at (the start,
//!   0, included): it is pruned only below the oldest birth.
//! - A source's history holds its offset at each of its last [`OFFSET_HISTORY`] checkpoints; a
//!   restore whose replay starts before them is refused with an error that says so.

use std::collections::VecDeque;

use weir_wire::{CheckpointId, Version};

use crate::backup::ReplayPoint;

/// Checkpoints a source remembers its offset at: a replay can start at most this many
/// checkpoints back (a window at most about this many checkpoint intervals long).
pub(crate) const OFFSET_HISTORY: usize = 1024;

/// Entries an agg's history of `taken` keeps at most (a window held longer makes the
/// snapshot full).
const TAKEN_HISTORY: usize = OFFSET_HISTORY;

/// A replay a restore cannot make. Fatal for that restore point: the same point fails the
/// same way (a stream then goes back to an older commit or takes full snapshots).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The point counts rows of another number of upstreams than the agg has.
    #[error("the replay point counts rows of {point} upstreams, the agg has {agg}")]
    Upstreams { point: usize, agg: usize },
    /// The point counts more rows at its start than at its end.
    #[error("the replay point counts {start} rows at its start and {end} at its end")]
    Backwards { start: u64, end: u64 },
    /// The source no longer remembers its offset at the checkpoint the replay starts from.
    #[error(
        "a replay from {from} needs this source's offset there, and it remembers its last {remembered} checkpoints \
         ({oldest} to {newest}): the windows are too long for replay checkpoints (use full ones)"
    )]
    Forgotten { from: CheckpointId, remembered: usize, oldest: String, newest: String },
}

/// An agg's count of its upstreams' rows, and the replay a restore is going through.
#[derive(Debug)]
pub(crate) struct AggReplay {
    /// Whether this agg takes replay snapshots (else full ones).
    pub(crate) enabled: bool,
    taken: Vec<u64>,
    /// `taken` at checkpoints, oldest first.
    history: VecDeque<(u64, Vec<u64>)>,
    /// Rows each upstream is still to send again.
    left: Vec<u64>,
    /// Upstreams whose `left` is not 0.
    replaying: usize,
}

impl AggReplay {
    pub(crate) fn new(enabled: bool, upstreams: usize) -> Self {
        let mut r = AggReplay { enabled, taken: Vec::new(), history: VecDeque::new(), left: Vec::new(), replaying: 0 };
        r.restart(0, vec![0; upstreams]);
        r
    }

    fn restart(&mut self, id: u64, taken: Vec<u64>) {
        self.left = vec![0; taken.len()];
        self.replaying = 0;
        self.history = VecDeque::from([(id, taken.clone())]);
        self.taken = taken;
    }

    /// `n` rows came from upstream `i`: returns how many of the first are replayed ones.
    #[inline]
    pub(crate) fn take(&mut self, i: usize, n: u64) -> u64 {
        if self.replaying == 0 {
            self.taken[i] += n;
            return 0;
        }
        let again = n.min(self.left[i]);
        self.left[i] -= again;
        if again > 0 && self.left[i] == 0 {
            self.replaying -= 1;
        }
        self.taken[i] += n - again;
        again
    }

    /// Rows still to be sent again, over every upstream.
    pub(crate) fn left(&self) -> u64 {
        self.left.iter().sum()
    }

    /// Whether a replay is under way.
    pub(crate) fn replaying(&self) -> bool {
        self.replaying > 0
    }

    /// The agg took checkpoint `id`, whose windows were born at `from` at the oldest (`None`:
    /// some came from a full snapshot): records `taken` at `id`, forgets what no window needs,
    /// and returns the replay point of a replay snapshot, when one can be taken.
    pub(crate) fn checkpoint(&mut self, id: u64, from: Option<u64>) -> Option<ReplayPoint> {
        self.checkpoint_at(id, from, self.taken.clone())
    }

    /// [`Self::checkpoint`] with `taken` as it stood at each input's barrier (inputs taken on
    /// past their barrier: `runtime/unaligned.rs`).
    pub(crate) fn checkpoint_at(&mut self, id: u64, from: Option<u64>, taken: Vec<u64>) -> Option<ReplayPoint> {
        let at_id = taken.clone();
        self.history.push_back((id, taken));
        if let Some(from) = from {
            while self.history.len() > 1 && self.history[1].0 <= from {
                self.history.pop_front();
            }
        }
        while self.history.len() > TAKEN_HISTORY {
            self.history.pop_front();
        }
        let from = from.filter(|f| self.point_at(id, *f))?;
        let (_, at) = self.history.iter().find(|(c, _)| *c == from)?;
        Some(ReplayPoint { from: CheckpointId(from), taken: at.iter().zip(&at_id).map(|(a, b)| (*a, *b)).collect() })
    }

    /// Rows taken from each upstream so far.
    pub(crate) fn taken(&self) -> &[u64] {
        &self.taken
    }

    /// Whether checkpoint `id` of an agg whose windows were born at `from` at the oldest will
    /// be a replay snapshot that may take inputs on past their barriers: replay snapshots on,
    /// no replay under way (its counts and the sources' restored offsets are aligned ones), and
    /// [`Self::checkpoint`] would give a replay point.
    pub(crate) fn cuts_allowed(&self, id: u64, from: Option<u64>) -> bool {
        self.enabled && !self.replaying() && from.is_some_and(|f| self.point_at(id, f))
    }

    /// Whether checkpoint `id` can replay from `from`: `taken` at `from` is known, and the
    /// sources still remember their offsets there (they remember their last OFFSET_HISTORY
    /// checkpoints, which reach back at least this far in ids: they reached every checkpoint
    /// an agg took). Otherwise the snapshot is full.
    fn point_at(&self, id: u64, from: u64) -> bool {
        id.saturating_sub(from) < OFFSET_HISTORY as u64 && self.history.iter().any(|(c, _)| *c == from)
    }

    /// A start from nothing.
    pub(crate) fn restore_fresh(&mut self) {
        self.restart(0, vec![0; self.taken.len()]);
    }

    /// A restore of checkpoint `id` from a full snapshot: counting starts again there.
    pub(crate) fn restore_full(&mut self, id: u64) {
        self.restart(id, vec![0; self.taken.len()]);
    }

    /// A restore of checkpoint `id` from a replay snapshot: the upstreams send again what the
    /// agg took between `point.from` and `id`.
    pub(crate) fn restore_replay(&mut self, id: u64, point: &ReplayPoint) -> Result<(), ReplayError> {
        if point.taken.len() != self.taken.len() {
            return Err(ReplayError::Upstreams { point: point.taken.len(), agg: self.taken.len() });
        }
        if let Some((a, b)) = point.taken.iter().find(|(a, b)| a > b) {
            return Err(ReplayError::Backwards { start: *a, end: *b });
        }
        self.restart(point.from.0, point.taken.iter().map(|(a, _)| *a).collect());
        self.taken = point.taken.iter().map(|(_, b)| *b).collect();
        if id != point.from.0 {
            self.history.push_back((id, self.taken.clone()));
        }
        self.left = point.taken.iter().map(|(a, b)| b - a).collect();
        self.replaying = self.left.iter().filter(|l| **l > 0).count();
        Ok(())
    }
}

/// A source's offsets at its recent checkpoints, and the replay a restore is going through.
#[derive(Debug, Default)]
pub(crate) struct SourceReplay {
    /// Offsets at the last checkpoints, oldest first.
    pub(crate) history: VecDeque<(CheckpointId, Version)>,
    /// Per output: rows at offsets below this are not sent to it (its agg's windows do not
    /// need them); empty when no replay is under way.
    pub(crate) skip_below: Vec<u64>,
    /// The largest of `skip_below`: past it, every row goes out as usual.
    pub(crate) skip_until: u64,
    /// The restored offset: rows below it were counted before.
    pub(crate) counted_from: u64,
}

impl SourceReplay {
    /// Where the source stands for a checkpoint taken when it has read up to `offset`: during a
    /// replay, the restored offset. Every row below it had reached each agg before the restore
    /// (an agg still owed some counts them as replayed, and replays from its own older point),
    /// so an agg not replaying, or done, continues from there: the actual offset would send it
    /// rows it already holds, and a full snapshot of it would count them twice.
    pub(crate) fn position(&self, offset: u64) -> Version {
        Version(offset.max(self.counted_from))
    }

    /// The source reached checkpoint `id` at `offset`.
    pub(crate) fn checkpoint(&mut self, id: CheckpointId, offset: Version) {
        self.history.push_back((id, offset));
        while self.history.len() > OFFSET_HISTORY {
            self.history.pop_front();
        }
    }

    /// The offset at checkpoint `id` (0: the start), or an error saying it is forgotten.
    pub(crate) fn offset_at(&self, id: CheckpointId) -> Result<u64, ReplayError> {
        if id.0 == 0 {
            return Ok(0);
        }
        match self.history.iter().find(|(c, _)| *c == id) {
            Some((_, v)) => Ok(v.0),
            None => Err(ReplayError::Forgotten {
                from: id,
                remembered: self.history.len(),
                oldest: self.history.front().map_or("none".into(), |c| c.0.to_string()),
                newest: self.history.back().map_or("none".into(), |c| c.0.to_string()),
            }),
        }
    }

    /// Starts a replay: output `j` gets rows from `from[j]` on; returns where the source
    /// starts reading (the smallest of them).
    pub(crate) fn start(&mut self, from: Vec<u64>, restored: u64) -> u64 {
        self.counted_from = restored;
        let start = from.iter().copied().min().unwrap_or(restored).min(restored);
        self.skip_until = from.iter().copied().max().unwrap_or(0);
        self.skip_below = if self.skip_until > start { from } else { Vec::new() };
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggs_replay_point_counts_the_rows_since_its_oldest_window_was_born() {
        let mut r = AggReplay::new(true, 2);
        r.take(0, 10);
        r.take(1, 5);
        assert_eq!(
            r.checkpoint(1, Some(0)).unwrap(),
            ReplayPoint { from: CheckpointId(0), taken: vec![(0, 10), (0, 5)] }
        );
        r.take(0, 7);
        let p = r.checkpoint(2, Some(1)).unwrap();
        assert_eq!(p, ReplayPoint { from: CheckpointId(1), taken: vec![(10, 17), (5, 5)] });
        assert_eq!(r.checkpoint(3, None), None, "a window from a full snapshot: no replay point");
        // The restore: upstream 0 sends 7 rows again, upstream 1 none.
        let mut back = AggReplay::new(true, 2);
        back.restore_replay(2, &p).unwrap();
        assert!(back.replaying());
        assert_eq!(back.take(0, 4), 4);
        assert_eq!(back.take(1, 3), 0, "upstream 1 owes nothing: its rows are new");
        assert_eq!(back.take(0, 5), 3, "the last 2 of this message are new");
        assert!(!back.replaying());
        assert_eq!(back.checkpoint(3, Some(2)).unwrap().taken, vec![(17, 19), (5, 8)]);
    }

    #[test]
    fn a_window_older_than_the_sources_remember_makes_the_snapshot_full() {
        let mut r = AggReplay::new(true, 1);
        let last = OFFSET_HISTORY as u64 - 1;
        for id in 1..last {
            assert!(r.checkpoint(id, Some(0)).is_some(), "checkpoint {id}");
        }
        assert_eq!(r.checkpoint(last + 1, Some(0)), None, "the sources no longer know where chk-0's rows began");
        assert!(r.checkpoint(last + 2, Some(last + 1)).is_some(), "that window fired: replay again");
    }

    #[test]
    fn a_replay_point_of_the_wrong_shape_is_refused() {
        let mut r = AggReplay::new(true, 2);
        let p = ReplayPoint { from: CheckpointId(1), taken: vec![(1, 2)] };
        assert!(r.restore_replay(2, &p).unwrap_err().to_string().contains("1 upstreams, the agg has 2"));
        let p = ReplayPoint { from: CheckpointId(1), taken: vec![(1, 2), (3, 2)] };
        assert!(r.restore_replay(2, &p).is_err());
    }

    #[test]
    fn a_source_replays_each_output_from_its_own_offset() {
        let mut s = SourceReplay::default();
        for (id, o) in [(1, 100), (2, 250), (3, 400)] {
            s.checkpoint(CheckpointId(id), Version(o));
        }
        assert_eq!(s.offset_at(CheckpointId(0)).unwrap(), 0);
        assert_eq!(s.offset_at(CheckpointId(2)).unwrap(), 250);
        assert!(
            s.offset_at(CheckpointId(9))
                .unwrap_err()
                .to_string()
                .contains("remembers its last 3 checkpoints (chk-1 to chk-3)")
        );
        assert_eq!(s.start(vec![250, 100], 400), 100);
        assert_eq!((s.skip_below.clone(), s.skip_until), (vec![250, 100], 250));
        assert_eq!(s.start(vec![400, 400], 400), 400, "nothing to replay");
        assert!(s.skip_below.is_empty());
        s.start(vec![250, 400], 400);
        assert_eq!(s.position(250), Version(400), "mid-replay: the restored offset");
        assert_eq!(s.position(420), Version(420));
    }
}
