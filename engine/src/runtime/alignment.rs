//! Event-time alignment of an agg's upstreams: an upstream whose progress runs more than the
//! drift ahead of the slowest upstream still sending is held back. Its messages wait in its
//! channel, which fills and stops its source (backpressure), until the others catch up.
//!
//! Why: a window fires when every upstream has passed its end, so the windows an agg holds
//! open span the distance between its fastest and its slowest upstream. Sources run on
//! different workers and nodes at different speeds (the worker that also hosts a sink runs
//! its source slower); without a bound the distance grew for as long as the stream ran: in
//! `weir-e2e keys 20 4000000` with one sink, six windows open after 20 s instead of two, 3.6 GB
//! resident and growing, the rows aggregated per second inflated by windows that could not fire.
//! Flink bounds the same thing with watermark alignment (FLIP-182).
//!
//! Invariants:
//! - Nothing is held while a checkpoint has cut or closed an input (the held input's barrier
//!   must reach the agg, and a cut input's progress is not the agg's to compare).
//! - Only an upstream whose progress advanced within [`IDLE_AFTER`] and that has not ended counts
//!   as the slowest: an idle or finished upstream never holds the others back (an ingest
//!   partition nobody loads would otherwise stop the stream), nor does one that sends rows
//!   without advancing (a backfill of old event times). Progress, not rows: a source reports it
//!   to every agg after each batch, while its rows reach only the aggs of their keys.
//! - The decision depends on the progress each upstream reported and the time of its last
//!   rows, nothing else ([`Alignment::decide`] is pure); it is made again at every poll and
//!   after every progress report, so a hold ends as soon as its reason does.

use std::time::{Duration, Instant};

/// An upstream whose progress has not advanced for this long is idle: it holds nobody back. Long enough for a
/// feed that sends a batch a second to count as live; an upstream that stopped costs the
/// others this long before they go on (and holds the watermark anyway, so no window could
/// fire meanwhile).
pub(crate) const IDLE_AFTER: Duration = Duration::from_secs(2);

/// The smallest drift (ms of event time) an upstream may run ahead: with small windows a tight
/// bound would hold and release inputs many times a second for no memory saved.
pub(crate) const MIN_DRIFT_MS: i64 = 1000;

/// The drift for windows sliding by `slide_ms`: one slide (one more open window), at least
/// [`MIN_DRIFT_MS`].
pub(crate) fn drift_for(slide_ms: i64) -> i64 {
    slide_ms.max(MIN_DRIFT_MS)
}

#[derive(Clone, Copy, Debug, Default)]
struct Upstream {
    /// The largest event time it reported.
    progress: Option<i64>,
    /// When that last advanced.
    advanced: Option<Instant>,
    ended: bool,
}

/// What an agg knows of its upstreams' pace, and which of them it holds back.
#[derive(Debug)]
pub(crate) struct Alignment {
    drift_ms: i64,
    ups: Vec<Upstream>,
}

impl Alignment {
    /// For `upstreams` upstreams, holding back those more than `drift_ms` ahead.
    pub(crate) fn new(upstreams: usize, drift_ms: i64) -> Self {
        Self { drift_ms, ups: vec![Upstream::default(); upstreams] }
    }

    /// Upstream `i` reported `ts` (its largest event time so far) at `now`.
    #[inline]
    pub(crate) fn progress(&mut self, i: usize, ts: i64, now: Instant) {
        let u = &mut self.ups[i];
        if u.progress.is_none_or(|p| ts > p) {
            u.progress = Some(ts);
            u.advanced = Some(now);
        }
    }

    /// Upstream `i` sent its last message.
    pub(crate) fn ended(&mut self, i: usize) {
        self.ups[i].ended = true;
    }

    /// Which upstreams to hold back at `now`: `set(i, held)` for each; `checkpointing`: an
    /// input is cut or closed for a checkpoint.
    pub(crate) fn decide(&self, now: Instant, checkpointing: bool, mut set: impl FnMut(usize, bool)) {
        let active =
            |u: &Upstream| !u.ended && u.advanced.is_some_and(|t| now.saturating_duration_since(t) < IDLE_AFTER);
        // The slowest active upstream (an upstream that is the slowest is never above it).
        let slowest = match checkpointing || self.ups.len() < 2 {
            true => None,
            false => self.ups.iter().filter(|u| active(u)).filter_map(|u| u.progress).min(),
        };
        for (i, u) in self.ups.iter().enumerate() {
            let ahead = |s: i64| u.progress.is_some_and(|p| p > s.saturating_add(self.drift_ms));
            set(i, slowest.is_some_and(ahead));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which upstreams `al` holds at `now`.
    fn held(al: &Alignment, now: Instant, checkpointing: bool) -> Vec<bool> {
        let mut v = vec![false; al.ups.len()];
        al.decide(now, checkpointing, |i, h| v[i] = h);
        v
    }

    fn two(drift: i64, a: i64, b: i64, now: Instant) -> Alignment {
        let mut al = Alignment::new(2, drift);
        al.progress(0, a, now);
        al.progress(1, b, now);
        al
    }

    #[test]
    fn an_upstream_ahead_by_more_than_the_drift_is_held_and_the_slowest_never_is() {
        let now = Instant::now();
        let al = two(1000, 5_000, 3_000, now);
        assert_eq!(held(&al, now, false), [true, false]);
        // Within the drift: both run.
        let al = two(1000, 4_000, 3_000, now);
        assert_eq!(held(&al, now, false), [false, false]);
    }

    #[test]
    fn a_slow_upstream_that_stops_advancing_holds_nobody_back_once_idle() {
        let t0 = Instant::now();
        let mut al = two(1000, 5_000, 3_000, t0);
        // The fast one goes on; the slow one reports the same progress again (rows of old event
        // times, or nothing new).
        let later = t0 + IDLE_AFTER;
        al.progress(0, 6_000, later);
        al.progress(1, 3_000, later);
        assert_eq!(held(&al, later, false), [false, false], "upstream 1 has not advanced for IDLE_AFTER");
        // It advances again: the fast one is held again.
        al.progress(1, 3_500, later);
        assert_eq!(held(&al, later, false), [true, false]);
    }

    #[test]
    fn an_ended_upstream_holds_nobody_back() {
        let now = Instant::now();
        let mut al = two(1000, 5_000, 3_000, now);
        al.ended(1);
        assert_eq!(held(&al, now, false), [false, false]);
    }

    #[test]
    fn nothing_is_held_while_a_checkpoint_cuts_or_closes_inputs() {
        let now = Instant::now();
        let al = two(1000, 5_000, 3_000, now);
        assert_eq!(held(&al, now, true), [false, false]);
    }

    #[test]
    fn an_upstream_without_progress_is_never_held_and_holds_nobody_back() {
        let now = Instant::now();
        let mut al = Alignment::new(3, 1000);
        al.progress(0, 9_000, now);
        al.progress(2, 8_500, now);
        assert_eq!(held(&al, now, false), [false, false, false], "1 has reported nothing, 2 is within the drift");
        al.progress(1, 1_000, now);
        assert_eq!(held(&al, now, false), [true, false, true]);
    }

    #[test]
    fn the_drift_is_a_slide_and_at_least_a_second() {
        assert_eq!(drift_for(10), MIN_DRIFT_MS);
        assert_eq!(drift_for(60_000), 60_000);
    }
}
