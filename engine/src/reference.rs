//! The results a generator stream must produce, computed row by row without the engine: the
//! definition the engine's results are checked against (tests, and `weir verify`).
//!
//! Precondition: no row is late (the generator's disorder stays within the watermark delay), so
//! the results do not depend on how the partitions interleave; then every (key, window) of
//! every row emitted is a result, with the exact fixed-point sum the engine computes.

use std::collections::BTreeMap;

use crate::operator::generator::Generator;
use crate::operator::window::{WindowResult, from_fixed, to_fixed};
use crate::spec::{SourceKind, StreamSpec};

/// The results of `spec`'s generator partitions over offsets `0..rows[p]` each, ordered by
/// (key, window start). `None` when `spec` has no generator source.
pub fn generator_results(spec: &StreamSpec, rows: &[u64]) -> Option<Vec<WindowResult>> {
    let SourceKind::Generator { spec: g, .. } = &spec.source else { return None };
    let mut acc: BTreeMap<(u64, i64), (u64, i128, f64, f64)> = BTreeMap::new();
    let w = spec.window;
    for (p, &n) in rows.iter().enumerate() {
        let generator = Generator::new(*g, p as u32);
        for o in 0..n {
            let (ts, key, v) = generator.row(o);
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
    }
    Some(
        acc.into_iter()
            .map(|((key, start), (count, sum, min, max))| WindowResult {
                key,
                start,
                count,
                sum: from_fixed(sum),
                min,
                max,
            })
            .collect(),
    )
}

/// The results of a bounded generator stream run to its end (every partition emits its limit).
pub fn bounded_results(spec: &StreamSpec) -> Option<Vec<WindowResult>> {
    let SourceKind::Generator { limit: Some(limit), .. } = &spec.source else { return None };
    generator_results(spec, &vec![*limit; spec.partitions as usize])
}
