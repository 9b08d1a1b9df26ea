//! The recovery budget of an agg: how many rows a restore of its next checkpoint may replay,
//! from the rate it takes rows at.
//!
//! A replay sends an agg the rows it took since its oldest named window was born, through the
//! same sources, channels and agg as the live stream, so it runs at about the rate the agg takes
//! rows when its inputs are full: the budget's rows are the budget's time at the rate the last
//! replay measured, or before any, at the highest rate of recent checkpoint intervals (a light
//! load only makes the budget stricter, which costs little: its windows are small).
//!
//! Invariants: intervals during a replay are not measured (its rows are not taken rows), nor
//! those without a row (an idle or starved agg says nothing of its rate: a rate of 0 would make
//! every window born then written for its whole life); a replay shorter than [`MIN_REPLAY`]
//! does not measure a rate (its start-up dominates). So an idle start cannot make the budget
//! 0 rows. A window can still be written younger than the budget (a rate measured low after a
//! replay, or its fast intervals no longer among the kept ones): the safe direction, which
//! costs a larger snapshot, not a longer restore.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Checkpoint intervals whose intake rates are kept.
const INTERVALS: usize = 32;
/// Intervals shorter than this are added to the next (too short to measure a rate).
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// Replays shorter than this measure no rate.
const MIN_REPLAY: Duration = Duration::from_millis(500);

/// An agg's recovery budget and the rates it is judged at.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The longest a restore's replay may take; `None`: no bound.
    limit: Option<Duration>,
    /// Rows per second taken in recent checkpoint intervals.
    intake: VecDeque<f64>,
    /// When the interval being measured began, and the rows taken by then.
    since: (Instant, u64),
    /// Rows per second of the last replay long enough to tell.
    replay_rate: Option<f64>,
    /// The replay under way: when it began, and its rows.
    replay: Option<(Instant, u64)>,
}

impl Budget {
    pub(crate) fn new(limit: Option<Duration>) -> Self {
        Budget { limit, intake: VecDeque::new(), since: (Instant::now(), 0), replay_rate: None, replay: None }
    }

    /// The agg reached a checkpoint at `now` having taken `taken` rows in all: the interval
    /// since the last one is measured (unless a replay ran in it).
    pub(crate) fn observe(&mut self, now: Instant, taken: u64, replaying: bool) {
        let (t0, n0) = self.since;
        let dt = now.saturating_duration_since(t0);
        if replaying || taken <= n0 {
            self.since = (now, taken);
            return;
        }
        if dt < MIN_INTERVAL {
            return;
        }
        self.intake.push_back((taken - n0) as f64 / dt.as_secs_f64());
        if self.intake.len() > INTERVALS {
            self.intake.pop_front();
        }
        self.since = (now, taken);
    }

    /// A restore's replay of `rows` rows began at `now`.
    pub(crate) fn replay_began(&mut self, now: Instant, rows: u64) {
        self.replay = (rows > 0).then_some((now, rows));
    }

    /// The replay ended at `now`.
    pub(crate) fn replay_ended(&mut self, now: Instant) {
        if let Some((t0, rows)) = self.replay.take() {
            let dt = now.saturating_duration_since(t0);
            if dt >= MIN_REPLAY {
                self.replay_rate = Some(rows as f64 / dt.as_secs_f64());
            }
        }
    }

    /// Rows per second a replay is expected to run at: the last replay's, else the highest
    /// intake of recent intervals; `None` before either was measured.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.replay_rate.or_else(|| self.intake.iter().copied().reduce(f64::max))
    }

    /// The rows a replay may send within the budget (`u64::MAX`: no bound, or nothing measured
    /// yet).
    pub(crate) fn rows(&self) -> u64 {
        match (self.limit, self.rate()) {
            (Some(limit), Some(rate)) => (limit.as_secs_f64() * rate).min(u64::MAX as f64) as u64,
            _ => u64::MAX,
        }
    }

    /// Restarts the rows' count (a restore sets the agg's counts back).
    pub(crate) fn restart(&mut self, now: Instant, taken: u64) {
        self.since = (now, taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_its_time_at_the_highest_recent_intake_until_a_replay_measures_one() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Budget::new(Some(Duration::from_secs(5)));
        b.restart(t0, 0);
        assert_eq!(b.rows(), u64::MAX, "nothing measured: no bound yet");
        b.observe(at(1000), 1_000_000, false);
        b.observe(at(2000), 3_000_000, false);
        b.observe(at(2010), 3_100_000, false); // too short: added to the next
        b.observe(at(3000), 3_500_000, false);
        assert_eq!(b.rate(), Some(2_000_000.0));
        assert_eq!(b.rows(), 10_000_000);
        // A replay measures the rate replays run at.
        b.replay_began(at(4000), 3_000_000);
        b.observe(at(5000), 0, true);
        b.replay_ended(at(5000));
        assert_eq!(b.rate(), Some(3_000_000.0));
        // One too short to tell keeps it.
        b.replay_began(at(6000), 10);
        b.replay_ended(at(6010));
        assert_eq!(b.rate(), Some(3_000_000.0));
        assert_eq!(Budget::new(None).rows(), u64::MAX, "no budget: no bound");
    }

    #[test]
    fn an_interval_without_a_row_measures_no_rate() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Budget::new(Some(Duration::from_secs(5)));
        b.restart(t0, 0);
        // A stream slow to start: its first checkpoint found no row taken.
        b.observe(at(100), 0, false);
        assert_eq!(b.rows(), u64::MAX, "nothing measured yet");
        b.observe(at(200), 1_000, false);
        assert_eq!(b.rate(), Some(10_000.0), "the idle interval is not part of the next");
        b.observe(at(300), 1_000, false);
        assert_eq!(b.rate(), Some(10_000.0));
    }
}
