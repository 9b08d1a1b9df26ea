//! Which windows `weir verify` checks: every closed window (`--all`), or by default those that
//! closed in the last `--since` of event time and a seeded sample of the older ones, so that a
//! check costs the same after a minute or a week of running. Pure: the window grid in, ranges
//! of window starts out.

use std::ops::RangeInclusive;

use weir_engine::operator::window::WindowSpec;

/// What to check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scope {
    /// Every closed window.
    All,
    /// The windows that closed within `since_ms` of event time before the last one closed, and
    /// `sample` older windows chosen with `seed`.
    Recent { since_ms: i64, sample: usize, seed: u64 },
}

/// The windows chosen: ranges of window starts, each a grid of `slide_ms`.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The latest closed windows (every one of them with [`Scope::All`]; none with a `since` of
    /// 0).
    pub recent: Option<RangeInclusive<i64>>,
    /// Older windows sampled, by start.
    pub sampled: Vec<i64>,
    /// Closed windows in all.
    pub closed: u64,
}

/// The latest window start at or before `ts` (`None` past the range of i64).
fn start_at(w: WindowSpec, ts: i64) -> Option<i64> {
    ts.checked_sub(ts.rem_euclid(w.slide_ms))
}

/// The first window start whose window holds event time `ts` (`None` past the range of i64).
pub fn first_start(w: WindowSpec, ts: i64) -> Option<i64> {
    start_at(w, ts)?.checked_sub((w.windows_per_row() - 1).checked_mul(w.slide_ms)?)
}

/// The start of the last window that ends at or before `closed` (it holds only rows before
/// it); `None` when no window can have (`closed` near the start of time).
pub fn last_closed_start(w: WindowSpec, closed: i64) -> Option<i64> {
    start_at(w, closed.checked_sub(w.size_ms)?)
}

/// The windows to check among those starting in `first..=last` (both on the grid).
pub fn plan(w: WindowSpec, first: i64, last: i64, scope: Scope) -> Plan {
    if last < first {
        return Plan { recent: None, sampled: Vec::new(), closed: 0 };
    }
    let windows = |from: i64, to: i64| ((i128::from(to) - i128::from(from)) / i128::from(w.slide_ms)) as u64;
    let closed = windows(first, last) + 1;
    let Scope::Recent { since_ms, sample, seed } = scope else {
        return Plan { recent: Some(first..=last), sampled: Vec::new(), closed };
    };
    // The windows whose end is within `since_ms` of the last one's end: starts after
    // `last - since_ms` (none for 0).
    let after = start_at(w, last.saturating_sub(since_ms.max(0))).unwrap_or(i64::MIN);
    let lo = after.saturating_add(w.slide_ms).max(first);
    let recent = (lo <= last).then_some(lo..=last);
    let older = windows(first, lo.min(last.saturating_add(w.slide_ms)));
    let mut picked = std::collections::BTreeSet::new();
    let mut state = seed;
    while (picked.len() as u64) < older.min(sample as u64) {
        picked.insert(splitmix(&mut state) % older);
    }
    let sampled = picked.into_iter().map(|i| first.saturating_add((i as i64).saturating_mul(w.slide_ms))).collect();
    Plan { recent, sampled, closed }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WindowSpec = WindowSpec { size_ms: 1_000, slide_ms: 1_000 };

    #[test]
    fn all_checks_every_closed_window() {
        let p = plan(W, 0, 9_000, Scope::All);
        assert_eq!(p, Plan { recent: Some(0..=9_000), sampled: vec![], closed: 10 });
        assert_eq!(plan(W, 5_000, 4_000, Scope::All).closed, 0, "nothing closed yet");
    }

    #[test]
    fn recent_checks_the_last_span_and_a_repeatable_sample_of_the_older_windows() {
        let scope = Scope::Recent { since_ms: 60_000, sample: 3, seed: 7 };
        let p = plan(W, 0, 3_599_000, scope);
        assert_eq!(p.closed, 3_600);
        assert_eq!(p.recent, Some(3_540_000..=3_599_000), "the 60 windows that closed in the last minute");
        assert_eq!(p.sampled.len(), 3);
        assert!(p.sampled.iter().all(|s| (0..3_540_000).contains(s) && s % 1_000 == 0), "{:?}", p.sampled);
        assert_eq!(plan(W, 0, 3_599_000, scope), p, "the same seed, the same sample");
        let other = plan(W, 0, 3_599_000, Scope::Recent { since_ms: 60_000, sample: 3, seed: 8 });
        assert_ne!(other.sampled, p.sampled);
        // A young stream: every window is recent, none to sample.
        let young = plan(W, 0, 20_000, scope);
        assert_eq!((young.recent, young.sampled.len()), (Some(0..=20_000), 0));
        // Fewer older windows than the sample: all of them.
        assert_eq!(plan(W, 0, 61_000, scope).sampled, vec![0, 1_000]);
        // A `since` of 0: no recent window, only the sample, taken from every closed window.
        let none = plan(W, 0, 9_000, Scope::Recent { since_ms: 0, sample: 20, seed: 1 });
        assert_eq!((none.recent, none.sampled.len()), (None, 10));
        // Extremes do not overflow.
        let wide = plan(W, i64::MIN + 808, i64::MAX - 807, scope);
        assert!(wide.closed > 0 && wide.sampled.len() == 3, "{wide:?}");
    }

    #[test]
    fn hopping_windows_start_where_their_first_row_falls() {
        let w = WindowSpec { size_ms: 3_000, slide_ms: 1_000 };
        assert_eq!(first_start(w, 10_500), Some(8_000), "windows 8..11, 9..12 and 10..13 hold 10.5");
        assert_eq!(last_closed_start(w, 20_000), Some(17_000), "17..20 is the last closed by 20");
        assert_eq!(last_closed_start(W, 20_999), Some(19_000));
        assert_eq!((first_start(w, i64::MIN), last_closed_start(w, i64::MIN + 5)), (None, None), "no overflow");
    }
}
