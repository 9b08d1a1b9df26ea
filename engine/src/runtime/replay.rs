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
//! - A checkpoint taken while a replay is under way resumes it: the agg's snapshot writes every
//!   window (those being rebuilt as they stand) and names, per upstream, the rows it has had
//!   again and the rows it is owed; each source records, per output, the offset its replay to
//!   that output had reached. A restore of it replays only the rest.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use weir_wire::{CheckpointId, Version};

use super::budget::Budget;
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
    /// A resumed replay names an output the source has not.
    #[error("the resumed replay is for output {output}, the source has {outputs}")]
    Output { output: usize, outputs: usize },
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
    /// How much a restore may replay.
    pub(crate) budget: Budget,
}

impl AggReplay {
    /// `budget`: the longest a restore's replay may take (`None`: no bound).
    pub(crate) fn new(enabled: bool, upstreams: usize, budget: Option<Duration>) -> Self {
        let mut r = AggReplay {
            enabled,
            taken: Vec::new(),
            history: VecDeque::new(),
            left: Vec::new(),
            replaying: 0,
            budget: Budget::new(budget),
        };
        r.restart(0, vec![0; upstreams]);
        r
    }

    fn restart(&mut self, id: u64, taken: Vec<u64>) {
        self.left = vec![0; taken.len()];
        self.replaying = 0;
        self.history = VecDeque::from([(id, taken.clone())]);
        self.budget.restart(Instant::now(), taken.iter().sum());
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
            if self.replaying == 0 {
                self.budget.replay_ended(Instant::now());
            }
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

    /// The agg took checkpoint `id`, whose named windows were born at `from` at the oldest
    /// (`None`: none is named), with `written` windows and, during a replay, `partial` ones
    /// (being rebuilt, every one written): records `taken` at `id`, forgets what no window
    /// needs, and returns the snapshot's replay point. The named windows must be born at or
    /// after [`Self::cutoff`] (the sources remember their offsets there; `None` otherwise).
    pub(crate) fn checkpoint(
        &mut self,
        id: u64,
        from: Option<u64>,
        written: Vec<i64>,
        partial: Vec<i64>,
    ) -> Option<ReplayPoint> {
        self.checkpoint_at(id, from, self.taken.clone(), written, partial)
    }

    /// [`Self::checkpoint`] with `taken` as it stood at each input's barrier (inputs taken on
    /// past their barrier: `runtime/unaligned.rs`).
    pub(crate) fn checkpoint_at(
        &mut self,
        id: u64,
        from: Option<u64>,
        taken: Vec<u64>,
        written: Vec<i64>,
        partial: Vec<i64>,
    ) -> Option<ReplayPoint> {
        let resume = self.replaying();
        let at_id = taken.clone();
        self.history.push_back((id, taken));
        let from = if resume { id } else { from.unwrap_or(id) };
        while self.history.len() > 1 && self.history[1].0 <= from {
            self.history.pop_front();
        }
        while self.history.len() > TAKEN_HISTORY {
            self.history.pop_front();
        }
        let taken = if resume {
            // Per upstream: the rows had again so far, and those owed after them.
            at_id.iter().zip(&self.left).map(|(t, l)| (t - l, *t)).collect()
        } else {
            if id.saturating_sub(from) >= OFFSET_HISTORY as u64 {
                return None; // the sources no longer remember their offsets there
            }
            let (_, at) = self.history.iter().find(|(c, _)| *c == from)?;
            at.iter().zip(&at_id).map(|(a, b)| (*a, *b)).collect()
        };
        Some(ReplayPoint { from: CheckpointId(from), taken, written, partial, resume })
    }

    /// The agg reached a checkpoint at `now`: the budget measures the interval since the last.
    pub(crate) fn observe(&mut self, now: Instant) {
        self.observe_at(now, self.taken.iter().sum());
    }

    /// [`Self::observe`] with the rows taken by the checkpoint (at its cuts).
    pub(crate) fn observe_at(&mut self, now: Instant, taken: u64) {
        self.budget.observe(now, taken, self.replaying());
    }

    /// The checkpoint below which windows must be written at checkpoint `id`: the oldest one
    /// a replay can start at (the sources remember their offsets there) whose rows since are
    /// within the budget (`id` itself when none is: every window held is written).
    pub(crate) fn cutoff(&self, id: u64) -> u64 {
        let limit = self.budget.rows();
        let now: u64 = self.taken.iter().sum();
        self.history
            .iter()
            .find(|(c, t)| id.saturating_sub(*c) < OFFSET_HISTORY as u64 && now - t.iter().sum::<u64>() <= limit)
            .map_or(id, |(c, _)| *c)
    }

    /// Rows taken from each upstream so far.
    pub(crate) fn taken(&self) -> &[u64] {
        &self.taken
    }

    /// Whether checkpoint `id` of an agg whose windows are all named, the oldest born at
    /// `from`, may take inputs on past their barriers (a snapshot that names every window):
    /// replay snapshots on, no replay under way (its counts and the sources' restored offsets
    /// are aligned ones), and no window to write (its entries would hold rows past the cuts).
    pub(crate) fn cuts_allowed(&self, id: u64, from: u64) -> bool {
        self.enabled && !self.replaying() && from >= self.cutoff(id)
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
    /// agg took between `point.from` and `id` (a resumed replay: what it was still owed).
    pub(crate) fn restore_replay(&mut self, id: u64, point: &ReplayPoint) -> Result<(), ReplayError> {
        if point.taken.len() != self.taken.len() {
            return Err(ReplayError::Upstreams { point: point.taken.len(), agg: self.taken.len() });
        }
        if let Some((a, b)) = point.taken.iter().find(|(a, b)| a > b) {
            return Err(ReplayError::Backwards { start: *a, end: *b });
        }
        let at_id: Vec<u64> = point.taken.iter().map(|(_, b)| *b).collect();
        if point.resume {
            // Windows born at `id` came after the rows owed: their replay counts from there.
            self.restart(id, at_id);
        } else {
            self.restart(point.from.0, point.taken.iter().map(|(a, _)| *a).collect());
            self.taken = at_id;
            if id != point.from.0 {
                self.history.push_back((id, self.taken.clone()));
            }
        }
        self.left = point.taken.iter().map(|(a, b)| b - a).collect();
        self.replaying = self.left.iter().filter(|l| **l > 0).count();
        self.budget.restart(Instant::now(), self.taken.iter().sum());
        self.budget.replay_began(Instant::now(), self.left());
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
    /// Per output, the offset its replay had reached, at the checkpoints taken during a replay
    /// (a restore of one resumes each output's replay there), oldest first.
    pub(crate) outputs: VecDeque<(CheckpointId, Vec<u64>)>,
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

    /// The source reached checkpoint `id` having read up to `offset`, with `outputs` outputs:
    /// records its [`Self::position`] and, during a replay, where each output's stands.
    pub(crate) fn checkpoint(&mut self, id: CheckpointId, offset: u64, outputs: usize) {
        self.history.push_back((id, self.position(offset)));
        while self.history.len() > OFFSET_HISTORY {
            self.history.pop_front();
        }
        if offset < self.counted_from {
            let at = |j: usize| self.skip_below.get(j).map_or(offset, |s| offset.max(*s));
            self.outputs.push_back((id, (0..outputs).map(at).collect()));
        }
        let oldest = self.history.front().map_or(id, |(c, _)| *c);
        while self.outputs.front().is_some_and(|(c, _)| *c < oldest) {
            self.outputs.pop_front();
        }
    }

    /// Where output `j` of `outputs` resumes a replay at checkpoint `id`: the offset its replay
    /// had reached then, or the source's position when no replay was under way.
    pub(crate) fn output_offset_at(&self, id: CheckpointId, j: usize, outputs: usize) -> Result<u64, ReplayError> {
        match self.outputs.iter().find(|(c, _)| *c == id) {
            Some((_, at)) if at.len() == outputs => Ok(at[j]),
            Some((_, at)) => Err(ReplayError::Output { output: j, outputs: at.len() }),
            None => self.offset_at(id),
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
mod prop;
#[cfg(test)]
mod tests;
