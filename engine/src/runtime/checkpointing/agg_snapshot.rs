//! An agg task's snapshot and restore: which windows a checkpoint writes and which it names
//! (the recovery budget's choice, `runtime/budget.rs`), the replay point it records, and how a
//! restore puts the windows back (`operator::window::replay` has the semantics).
//!
//! Invariants:
//! - A window once written stays written until it fires (its earlier rows are in no replay).
//! - With a spill store the choice is the agg's, not each window's: spilled entries of a named
//!   window would be counted again by its replay, so either every window is named or every one
//!   is written (and the spill store goes with the snapshot).
//! - During a replay every window is written (those being rebuilt as they stand), and the point
//!   resumes the replay: a restore of it replays only what was still owed.
//! - A savepoint names no window: every one is written and the manifest holds no replay point,
//!   so any number of aggs can restore it (each takes the keys it owns). One asked for during a
//!   replay fails (the coordinator asks again).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir_wire::CheckpointId;

use crate::backup::uploader::Captured;
use crate::backup::{Manifest, ReplayPoint};
use crate::operator::window::WindowAgg;
use crate::runtime::replay::AggReplay;
use crate::runtime::task::AggTask;
use crate::state::{SpillDb, StateError, WindowChain};

/// Why an agg's snapshot or restore failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AggSnapshotError {
    /// The windows to name were born before any checkpoint a replay can start at.
    #[error("no replay point for windows born at {from:?} (the oldest a replay can start at is {cutoff})")]
    NoPoint { from: Option<u64>, cutoff: u64 },
    /// A row came late, before its input's barrier, for a window held while inputs were taken
    /// on past their barriers: a snapshot at the cuts cannot name it (the next is aligned).
    #[error(
        "a row came late for a window being emitted while inputs were cut: the snapshot at the cuts cannot name it"
    )]
    LateAtCuts,
    /// The state files, or the spill store, could not be read or opened.
    #[error(transparent)]
    State(#[from] StateError),
    /// The replay point does not fit the agg.
    #[error(transparent)]
    Replay(#[from] crate::runtime::replay::ReplayError),
    /// The spill store refused the operator.
    #[error("the spill store: {0}")]
    Spill(String),
    /// A savepoint was asked for while the agg replays its windows' rows (retryable: the next
    /// one after the replay succeeds).
    #[error("a savepoint cannot be taken while the agg replays its windows' rows ({left} still to come)")]
    SavepointDuringReplay { left: u64 },
}

/// Whether `id`'s inputs may be taken on past their barriers (the snapshot then names every
/// window and is taken at the cuts: `runtime/unaligned.rs`).
pub(crate) fn cuts_allowed(a: &AggTask, id: CheckpointId) -> bool {
    a.savepoint != Some(id)
        && !a.agg.any_written()
        && !a.agg.any_late()
        && a.replay.cuts_allowed(id.0, a.agg.replay_from().unwrap_or(id.0))
}

/// What a snapshot writes: the replay point its manifest carries (`None`: a full snapshot).
#[derive(Debug)]
pub(crate) struct Choice {
    pub(crate) point: Option<ReplayPoint>,
}

/// Chooses which windows checkpoint `id` writes and records its replay point in `replay`:
/// during a replay every window (the point resumes it); with replay snapshots off, or for a
/// `savepoint`, every window (no point; a savepoint during a replay is refused); else the windows born before `cutoff(least)` (at least `least`, the budget's
/// cutoff) and those a row came late for, and with a `spill` store every window once one is.
pub(crate) fn choose(
    agg: &mut WindowAgg,
    replay: &mut AggReplay,
    id: u64,
    spill: bool,
    savepoint: bool,
    cutoff: impl FnOnce(u64) -> u64,
) -> Result<Choice, AggSnapshotError> {
    let replaying = replay.replaying();
    if savepoint && replaying {
        return Err(AggSnapshotError::SavepointDuringReplay { left: replay.left() });
    }
    let full = (!replay.enabled || savepoint) && !replaying;
    let least = replay.cutoff(id);
    if full || replaying {
        agg.write_all();
    } else {
        agg.write_born_before(cutoff(least).max(least));
    }
    if spill && agg.any_written() {
        agg.write_all();
    }
    let partial = if replaying { agg.replaying_windows() } else { Vec::new() };
    let written = agg.written_windows().into_iter().filter(|w| !partial.contains(w)).collect();
    let from = agg.replay_from();
    let point = replay.checkpoint(id, from, written, partial);
    agg.set_checkpoint(id);
    match point {
        Some(p) => Ok(Choice { point: (!full).then_some(p) }),
        None => Err(AggSnapshotError::NoPoint { from, cutoff: least }),
    }
}

/// The snapshot of checkpoint `id` of an agg whose inputs are all at their barriers.
pub(crate) fn capture(
    a: &mut AggTask,
    id: CheckpointId,
    chain: &Arc<Mutex<WindowChain>>,
) -> Result<Captured, AggSnapshotError> {
    a.replay.observe(Instant::now());
    let savepoint = a.savepoint == Some(id);
    let choice = choose(&mut a.agg, &mut a.replay, id.0, a.spill.is_some(), savepoint, |least| least)?;
    // The spill store is held until the uploader has its checkpoint: what it holds then is
    // what was spilled before this barrier (none goes with a snapshot that names windows).
    let spill = if a.agg.any_written() { a.spill.as_ref().map(|db| db.hold()) } else { None };
    Ok(Captured::Window(a.agg.snapshot_state(), chain.clone(), spill, choice.point))
}

/// The snapshot of checkpoint `id` at the cuts (inputs taken on past their barriers): every
/// window named, the counts and counters as they stood at the cuts.
pub(crate) fn capture_at_cuts(
    a: &mut AggTask,
    id: CheckpointId,
    chain: &Arc<Mutex<WindowChain>>,
) -> Result<Captured, AggSnapshotError> {
    if a.agg.any_late() {
        a.cuts.release(&mut a.agg, None);
        return Err(AggSnapshotError::LateAtCuts);
    }
    if a.savepoint == Some(id) {
        // Cut before its barrier said it was a savepoint: it cannot name windows.
        a.cuts.release(&mut a.agg, None);
        return Err(AggSnapshotError::SavepointDuringReplay { left: a.replay.left() });
    }
    let taken = a.cuts.taken_at_cuts(a.replay.taken());
    a.replay.observe_at(Instant::now(), taken.iter().sum());
    let from = a.agg.replay_from();
    let point = a.replay.checkpoint_at(id.0, from, taken, Vec::new(), Vec::new());
    a.agg.set_checkpoint(id.0);
    let mut state = a.agg.replay_state();
    (state.rows, state.late_rows) = a.cuts.counters_at_cuts(state.rows, state.late_rows);
    a.cuts.release(&mut a.agg, None);
    let p = point.ok_or(AggSnapshotError::NoPoint { from, cutoff: a.replay.cutoff(id.0) })?;
    Ok(Captured::Window(state, chain.clone(), None, Some(p)))
}

/// Restores checkpoint `id` from its files in `src` and its manifest `m`: the windows' entries,
/// which windows the replay rebuilds, and the spill store.
pub(crate) fn restore(
    a: &mut AggTask,
    id: CheckpointId,
    src: &std::path::Path,
    m: &Manifest,
    db: &std::path::Path,
) -> Result<(), AggSnapshotError> {
    let state = crate::state::TaskStore::open_from_state_files(src, db)?;
    a.agg.set_checkpoint(id.0);
    crate::state::load_window_state(&state, &mut a.agg)?;
    a.agg.clear_spill();
    a.spill = None;
    match &m.replay {
        Some(point) => {
            // Named windows come back empty, and the sources send their rows again.
            a.agg.set_restored(point.from.0, &point.written, &point.partial);
            a.replay.restore_replay(id.0, point)?;
            a.board.replay_begins(a.replay.left());
            a.agg.hold(a.replay.replaying());
            tracing::info!(task = %a.inp.task(), checkpoint = %id, from = %point.from, resume = point.resume,
                windows = a.agg.open_windows(), written = point.written.len() + point.partial.len(), "replaying the windows' rows");
        }
        None => {
            a.agg.write_all();
            a.replay.restore_full(id.0);
            a.agg.hold(false);
        }
    }
    // Spilled partials restore whether or not this run spills: they are state.
    if src.join("CURRENT").is_file() {
        open_spill(a, SpillDb::restore(src, &a.spill_root)?)?;
    } else if a.spill_budget.is_some() {
        open_spill(a, SpillDb::fresh(&a.spill_root)?)?;
    }
    Ok(())
}

/// Makes `db` the agg's spill store (with its budget; none: it only merges what is there).
pub(crate) fn open_spill(a: &mut AggTask, db: Arc<SpillDb>) -> Result<(), AggSnapshotError> {
    let budget = a.spill_budget.unwrap_or(usize::MAX);
    a.agg
        .set_spill(Box::new(crate::state::RocksSpill(db.clone())), budget)
        .map_err(|e| AggSnapshotError::Spill(e.to_string()))?;
    a.spill = Some(db);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::window::WindowSpec;

    /// An agg of one upstream holding windows [0, 1000), [1000, 2000) and [2000, 3000).
    fn holding() -> (WindowAgg, AggReplay) {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
        let mut replay = AggReplay::new(true, 1, None);
        replay.take(0, 3);
        for (t, k) in [(10, 1), (1500, 2), (2500, 3)] {
            agg.add(t, k, 1.0);
        }
        (agg, replay)
    }

    #[test]
    fn a_savepoint_writes_every_window_and_names_none() {
        let (mut agg, mut replay) = holding();
        let c = choose(&mut agg, &mut replay, 1, false, false, |least| least).unwrap();
        assert!(c.point.is_some_and(|p| p.written.is_empty()), "a replay checkpoint names the windows");
        let c = choose(&mut agg, &mut replay, 2, false, true, |least| least).unwrap();
        assert_eq!(c.point, None, "a savepoint restores without a replay");
        assert_eq!(agg.written_windows().len(), 3);
    }

    #[test]
    fn a_savepoint_during_a_replay_is_refused() {
        let (mut agg, mut replay) = holding();
        let point = ReplayPoint { from: CheckpointId(2), taken: vec![(10, 20)], ..Default::default() };
        replay.restore_replay(5, &point).unwrap();
        let refused = choose(&mut agg, &mut replay, 6, false, true, |least| least);
        assert!(matches!(refused, Err(AggSnapshotError::SavepointDuringReplay { left: 10 })), "{refused:?}");
        assert!(choose(&mut agg, &mut replay, 6, false, false, |least| least).is_ok(), "a checkpoint resumes it");
    }
}
