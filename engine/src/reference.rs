//! The results a generator stream (or any known rows) must produce, computed row by row
//! without the engine: the definition the engine's results are checked against (tests, and `weir verify`).
//!
//! Precondition: no row is late (the generator's disorder stays within the watermark delay), so
//! the results do not depend on how the partitions interleave; then every (key, window) of
//! every row emitted is a result, with the exact fixed-point sum the engine computes.

use std::collections::HashMap;

use crate::operator::generator::Generator;
use crate::operator::window::{WindowResult, WindowSpec, from_fixed, to_fixed};
use crate::spec::{SourceKind, StreamSpec};

/// The results of `spec`'s generator partitions over offsets `0..rows[p]` each, ordered by
/// (key, window start). `None` when `spec` has no generator source.
pub fn generator_results(spec: &StreamSpec, rows: &[u64]) -> Option<Vec<WindowResult>> {
    let SourceKind::Generator { spec: g, .. } = &spec.source else { return None };
    let all = rows.iter().enumerate().flat_map(|(p, &n)| {
        let generator = Generator::new(*g, p as u32);
        (0..n).map(move |o| generator.row(o))
    });
    Some(window_results(spec.window, all))
}

/// The results of the windows starting in `starts` over the rows of `segments` (a generator and
/// the offsets it produced, each), ordered by (key, window start). Only the rows that can fall
/// in those windows are computed ([`Generator::offsets_between`]): the cost follows the windows
/// asked for, not the length of the stream.
pub fn results_of_windows(
    w: WindowSpec,
    segments: &[(Generator, std::ops::Range<u64>)],
    starts: std::ops::RangeInclusive<i64>,
) -> Vec<WindowResult> {
    let (lo, end) = (*starts.start(), starts.end().saturating_add(w.size_ms));
    let rows = segments.iter().flat_map(|(g, have)| {
        let want = g.offsets_between(lo, end);
        (want.start.max(have.start)..want.end.min(have.end)).map(move |o| g.row(o))
    });
    let mut out = window_results(w, rows.filter(|r| (lo..end).contains(&r.0)));
    out.retain(|r| starts.contains(&r.start));
    out
}

/// The results of `rows` (ts, key, value; in any order) in `w`'s windows, ordered by (key,
/// window start): every row counts (none is late).
pub fn window_results(w: WindowSpec, rows: impl IntoIterator<Item = (i64, u64, f64)>) -> Vec<WindowResult> {
    // A hash map, sorted once at the end: verify runs this over every row a load sent.
    let mut acc: HashMap<(u64, i64), (u64, i128, f64, f64)> = HashMap::new();
    for (ts, key, v) in rows {
        let mut s = w.last_start(ts);
        while s > ts - w.size_ms {
            let e = acc.entry((key, s)).or_insert((0, 0, f64::INFINITY, f64::NEG_INFINITY));
            e.0 += 1;
            e.1 += to_fixed(v);
            e.2 = e.2.min(v);
            e.3 = e.3.max(v);
            s -= w.slide_ms;
        }
    }
    let mut out: Vec<WindowResult> = acc
        .into_iter()
        .map(|((key, start), (count, sum, min, max))| WindowResult {
            key,
            start,
            count,
            sum: from_fixed(sum),
            min,
            max,
        })
        .collect();
    out.sort_unstable_by_key(|r| (r.key, r.start));
    out
}

/// The results of a bounded generator stream run to its end (every partition emits its limit).
pub fn bounded_results(spec: &StreamSpec) -> Option<Vec<WindowResult>> {
    let SourceKind::Generator { limit: Some(limit), .. } = &spec.source else { return None };
    generator_results(spec, &vec![*limit; spec.partitions as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::generator::GeneratorSpec;

    #[test]
    fn the_results_of_some_windows_are_those_of_every_window_restricted_to_them() {
        for (w, disorder) in [(WindowSpec::tumbling(10), 0.0), (WindowSpec::hopping(20, 5), 0.2)] {
            let g = GeneratorSpec {
                keys: 7,
                rows_per_ms: 3,
                out_of_order: disorder,
                max_disorder_ms: 4,
                ..Default::default()
            };
            let rows = [900u64, 1_000];
            let segments: Vec<_> = (0..2u32).map(|p| (Generator::new(g, p), 0..rows[p as usize])).collect();
            let all = window_results(w, segments.iter().flat_map(|(g, r)| r.clone().map(|o| g.row(o))));
            for starts in [
                g.ts_start + 40..=g.ts_start + 40,
                g.ts_start - 20..=g.ts_start + 100,
                g.ts_start + 250..=g.ts_start + 400,
            ] {
                let want: Vec<_> = all.iter().filter(|r| starts.contains(&r.start)).cloned().collect();
                assert!(!want.is_empty(), "{starts:?}");
                assert_eq!(results_of_windows(w, &segments, starts.clone()), want, "{w:?} {starts:?}");
            }
        }
    }
}
