//! Keyed event-time window aggregation (tumbling and hopping) with count, sum, min, max and avg.
//!
//! Semantics, which the reference implementation in the tests repeats independently:
//! - A window is `[start, start + size)` with `start` a multiple of `slide` (tumbling: slide = size).
//!   A row with event time `ts` belongs to every window that contains `ts`.
//! - Each upstream reports progress (the largest event time it has sent). The operator's watermark
//!   is the minimum over its upstreams minus the configured delay; until every upstream has reported,
//!   it is `i64::MIN`.
//! - A window fires (its results are emitted and it is forgotten) once the watermark reaches its end.
//!   A row's contribution to a window whose end is at or below the watermark is late: it is dropped,
//!   and the row counts once in `late_rows`.
//! - Sums are accumulated in fixed point (value × 2^32, rounded, in an i128), so they do not depend on
//!   the order rows arrive in: a replay after recovery that interleaves upstreams differently gives
//!   bit-identical results. Exact to 2^-32; values beyond ±2^94 saturate.
//!
//! Open windows live in memory; [`WindowAgg::state`] and [`WindowAgg::restore`] move them to and
//! from the task's state store at checkpoints.

use rustc_hash::FxHashMap;

/// Window shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// Length of a window (ms).
    pub size_ms: i64,
    /// Distance between window starts (ms); equal to `size_ms` for tumbling windows.
    pub slide_ms: i64,
}

impl WindowSpec {
    /// Tumbling windows of `size_ms`.
    pub fn tumbling(size_ms: i64) -> Self {
        Self { size_ms, slide_ms: size_ms }
    }

    /// Hopping windows of `size_ms` every `slide_ms`.
    pub fn hopping(size_ms: i64, slide_ms: i64) -> Self {
        Self { size_ms, slide_ms }
    }

    /// Checks the shape: positive, and the size a multiple of the slide.
    pub fn validate(&self) -> Result<(), String> {
        if self.size_ms <= 0 || self.slide_ms <= 0 {
            return Err(format!("window size and slide must be positive, got {self:?}"));
        }
        if self.size_ms % self.slide_ms != 0 {
            return Err(format!("window size {} must be a multiple of the slide {}", self.size_ms, self.slide_ms));
        }
        Ok(())
    }

    /// Start of the latest window containing `ts`.
    #[inline]
    pub fn last_start(&self, ts: i64) -> i64 {
        ts - ts.rem_euclid(self.slide_ms)
    }

    /// Number of windows each row belongs to.
    #[inline]
    pub fn windows_per_row(&self) -> i64 {
        self.size_ms / self.slide_ms
    }
}

/// Fixed-point scale of sums.
const FX_SCALE: f64 = 4_294_967_296.0; // 2^32

/// 2^52: below it in magnitude, every f64 has an exact integer part and fraction.
const EXACT_INT: f64 = 4_503_599_627_370_496.0;

/// `v` in fixed point, rounded half away from zero; the defined rounding of every value that
/// enters a sum.
#[inline]
pub fn to_fixed(v: f64) -> i128 {
    let x = v * FX_SCALE;
    // Values below 2^20 (all but huge ones): truncation to i64 is one instruction, and `x - t` is
    // exact, so the result is `round`'s without its libm call and the software f64 → i128
    // conversion (together 14 % of the engine's CPU at 10,000 keys, `perf` in issue 11).
    if x.abs() < EXACT_INT {
        let t = x as i64;
        let frac = x - t as f64;
        let r = if frac >= 0.5 {
            t + 1
        } else if frac <= -0.5 {
            t - 1
        } else {
            t
        };
        return i128::from(r);
    }
    to_fixed_large(x)
}

/// Huge values, NaN and infinities; out of line, or the compiler computes `round` (a libm call)
/// ahead of the branch for every value.
#[cold]
#[inline(never)]
fn to_fixed_large(x: f64) -> i128 {
    // `as` saturates (and maps NaN to 0), which keeps the operator total on any input.
    x.round() as i128
}

/// A fixed-point sum back to f64.
#[inline]
pub fn from_fixed(s: i128) -> f64 {
    s as f64 / FX_SCALE
}

/// Running aggregate of one key in one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acc {
    /// Rows.
    pub count: u64,
    /// Sum in fixed point (see [`to_fixed`]).
    pub sum_fx: i128,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Acc {
    #[inline]
    fn new(v: f64) -> Self {
        Acc { count: 1, sum_fx: to_fixed(v), min: v, max: v }
    }

    #[inline]
    fn add(&mut self, v: f64) {
        self.count += 1;
        self.sum_fx = self.sum_fx.saturating_add(to_fixed(v));
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// One key's result for one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowResult {
    /// Series key.
    pub key: u64,
    /// Window start (ms).
    pub start: i64,
    /// Rows.
    pub count: u64,
    /// Sum (fixed-point exact, see the module docs).
    pub sum: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl WindowResult {
    /// Average.
    pub fn avg(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum / self.count as f64 }
    }
}

/// The operator's state for one agg task.
#[derive(Debug)]
pub struct WindowAgg {
    spec: WindowSpec,
    delay_ms: i64,
    /// Open windows, sorted by start; rows mostly hit the last one or two.
    windows: Vec<(i64, FxHashMap<u64, Acc>)>,
    /// Largest event time reported by each upstream (`None` until it reports).
    upstream: Vec<Option<i64>>,
    watermark: i64,
    late_rows: u64,
    rows: u64,
}

impl WindowAgg {
    /// An operator with `upstreams` inputs.
    pub fn new(spec: WindowSpec, delay_ms: i64, upstreams: usize) -> Self {
        Self {
            spec,
            delay_ms,
            windows: Vec::new(),
            upstream: vec![None; upstreams],
            watermark: i64::MIN,
            late_rows: 0,
            rows: 0,
        }
    }

    /// The combined watermark.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Rows dropped as late so far.
    pub fn late_rows(&self) -> u64 {
        self.late_rows
    }

    /// Rows processed so far (late ones included).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Open windows.
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }

    #[inline]
    fn window_mut(&mut self, start: i64) -> &mut FxHashMap<u64, Acc> {
        // Scan from the newest: in-order data hits the last window at once.
        let mut i = self.windows.len();
        while i > 0 && self.windows[i - 1].0 > start {
            i -= 1;
        }
        if i == 0 || self.windows[i - 1].0 != start {
            self.windows.insert(i, (start, FxHashMap::default()));
            return &mut self.windows[i].1;
        }
        &mut self.windows[i - 1].1
    }

    /// Adds one row.
    #[inline]
    pub fn add(&mut self, ts: i64, key: u64, value: f64) {
        self.rows += 1;
        let size = self.spec.size_ms;
        let mut start = self.spec.last_start(ts);
        let mut late = false;
        // Windows containing ts: start > ts - size, stepping back by the slide.
        while start > ts - size {
            if start.saturating_add(size) <= self.watermark {
                late = true;
            } else {
                match self.window_mut(start).entry(key) {
                    std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().add(value),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(Acc::new(value));
                    }
                }
            }
            start -= self.spec.slide_ms;
        }
        if late {
            self.late_rows += 1;
        }
    }

    /// Upstream `input` has sent every row with event time up to `max_ts`. Fires the windows the
    /// new watermark closes, calling `emit` for each result, oldest window first.
    pub fn advance(&mut self, input: usize, max_ts: i64, mut emit: impl FnMut(WindowResult)) {
        let slot = &mut self.upstream[input];
        *slot = Some(slot.map_or(max_ts, |t| t.max(max_ts)));
        let Some(min) = self.upstream.iter().try_fold(i64::MAX, |m, u| u.map(|t| m.min(t))) else {
            return;
        };
        let wm = min.saturating_sub(self.delay_ms);
        if wm <= self.watermark {
            return;
        }
        self.watermark = wm;
        let size = self.spec.size_ms;
        let fired = self.windows.iter().take_while(|(s, _)| s.saturating_add(size) <= wm).count();
        for (start, keys) in self.windows.drain(..fired) {
            for (key, a) in keys {
                emit(WindowResult { key, start, count: a.count, sum: from_fixed(a.sum_fx), min: a.min, max: a.max });
            }
        }
    }

    /// How many (window, key) entries are open.
    pub fn state_len(&self) -> usize {
        self.windows.iter().map(|(_, keys)| keys.len()).sum()
    }

    /// Every open (window start, key, aggregate), for the state store.
    pub fn state(&self) -> impl Iterator<Item = (i64, u64, Acc)> + '_ {
        self.windows.iter().flat_map(|(s, keys)| keys.iter().map(move |(k, a)| (*s, *k, *a)))
    }

    /// Progress per upstream, for the state store.
    pub fn progress(&self) -> &[Option<i64>] {
        &self.upstream
    }

    /// Replaces the in-memory state with what a checkpoint held. `progress` must have one entry per
    /// upstream of this operator.
    pub fn restore(
        &mut self,
        entries: impl IntoIterator<Item = (i64, u64, Acc)>,
        progress: &[Option<i64>],
        late_rows: u64,
        rows: u64,
    ) -> Result<(), String> {
        if progress.len() != self.upstream.len() {
            return Err(format!(
                "state has progress for {} upstreams, the operator has {}",
                progress.len(),
                self.upstream.len()
            ));
        }
        self.windows.clear();
        for (start, key, acc) in entries {
            self.window_mut(start).insert(key, acc);
        }
        self.upstream.copy_from_slice(progress);
        self.watermark = self
            .upstream
            .iter()
            .try_fold(i64::MAX, |m, u| u.map(|t| m.min(t)))
            .map_or(i64::MIN, |m| m.saturating_sub(self.delay_ms));
        self.late_rows = late_rows;
        self.rows = rows;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Ev {
        Rows(Vec<(i64, u64, f64)>),
        Progress(usize, i64),
    }

    /// The semantics of the module docs, written as plainly as possible.
    fn reference(spec: WindowSpec, delay: i64, ups: usize, evs: &[Ev]) -> (Vec<WindowResult>, u64) {
        let mut progress: Vec<Option<i64>> = vec![None; ups];
        let mut wm = i64::MIN;
        let mut open: BTreeMap<(i64, u64), Vec<f64>> = BTreeMap::new();
        let (mut out, mut late) = (Vec::new(), 0);
        for ev in evs {
            match ev {
                Ev::Rows(rows) => {
                    for &(ts, key, v) in rows {
                        let mut is_late = false;
                        for s in (ts - spec.size_ms + 1)..=ts {
                            if s.rem_euclid(spec.slide_ms) != 0 {
                                continue;
                            }
                            if s + spec.size_ms <= wm {
                                is_late = true;
                            } else {
                                open.entry((s, key)).or_default().push(v);
                            }
                        }
                        late += is_late as u64;
                    }
                }
                Ev::Progress(i, t) => {
                    progress[*i] = Some(progress[*i].map_or(*t, |p| p.max(*t)));
                    if progress.iter().all(Option::is_some) {
                        let m = progress.iter().map(|p| p.unwrap()).min().unwrap() - delay;
                        wm = wm.max(m);
                    }
                    let fired: Vec<(i64, u64)> = open.keys().filter(|(s, _)| s + spec.size_ms <= wm).copied().collect();
                    for k in fired {
                        let vals = open.remove(&k).unwrap();
                        out.push(WindowResult {
                            key: k.1,
                            start: k.0,
                            count: vals.len() as u64,
                            sum: from_fixed(vals.iter().map(|v| to_fixed(*v)).sum()),
                            min: vals.iter().copied().fold(f64::INFINITY, f64::min),
                            max: vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                        });
                    }
                }
            }
        }
        out.sort_by_key(|r| (r.start, r.key));
        (out, late)
    }

    fn run(agg: &mut WindowAgg, evs: &[Ev], out: &mut Vec<WindowResult>) {
        for ev in evs {
            match ev {
                Ev::Rows(rows) => rows.iter().for_each(|&(t, k, v)| agg.add(t, k, v)),
                Ev::Progress(i, t) => agg.advance(*i, *t, |r| out.push(r)),
            }
        }
    }

    /// Random per-upstream streams: mostly increasing times with some disorder, progress reports
    /// after each batch (what sources send), interleaved at random.
    fn events() -> impl Strategy<Value = (WindowSpec, i64, usize, Vec<Ev>)> {
        (1usize..4, 1i64..5, 1i64..4, 0i64..30, any::<u64>()).prop_map(|(ups, slide, mult, delay, seed)| {
            let spec = WindowSpec::hopping(slide * 5 * mult, slide * 5);
            let mut x = seed | 1;
            let mut rnd = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut clock = vec![0i64; ups];
            let mut max_seen = vec![i64::MIN; ups];
            let mut evs = Vec::new();
            for _ in 0..60 {
                let i = (rnd() % ups as u64) as usize;
                let mut rows = Vec::new();
                for _ in 0..(rnd() % 20) {
                    clock[i] += (rnd() % 4) as i64;
                    let disorder = if rnd() % 5 == 0 { (rnd() % 40) as i64 } else { 0 };
                    let ts = clock[i] - disorder;
                    max_seen[i] = max_seen[i].max(ts);
                    let v = (rnd() % 2000) as f64 / 7.0 - 100.0;
                    rows.push((ts, rnd() % 6, v));
                }
                evs.push(Ev::Rows(rows));
                if max_seen[i] > i64::MIN {
                    evs.push(Ev::Progress(i, max_seen[i]));
                }
            }
            for (i, m) in max_seen.iter().enumerate() {
                evs.push(Ev::Progress(i, m.max(&0) + 1000)); // end of input: flush everything
            }
            (spec, delay, ups, evs)
        })
    }

    /// The definition the fast path must equal.
    fn to_fixed_by_round(v: f64) -> i128 {
        (v * FX_SCALE).round() as i128
    }

    #[test]
    fn the_fast_fixed_point_conversion_rounds_exactly_as_round_does() {
        let half = 0.5 / FX_SCALE;
        let edges = [
            0.0,
            -0.0,
            half,
            -half,
            3.0 * half,
            -3.0 * half,
            0.49999999999999994 / FX_SCALE,
            1.0 / FX_SCALE,
            999.999,
            -999.999,
            (EXACT_INT - 1.0) / FX_SCALE,
            EXACT_INT / FX_SCALE,
            -(EXACT_INT - 0.5) / FX_SCALE,
            1e30,
            -1e30,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
        ];
        for v in edges {
            assert_eq!(to_fixed(v), to_fixed_by_round(v), "{v:e}");
        }
        let mut h = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1_000_000 {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            // Any bit pattern (huge, tiny, negative, NaN), and values near the ties.
            let any = f64::from_bits(h);
            let tie = ((h >> 12) as i64 - (1 << 51)) as f64 / FX_SCALE + half;
            assert_eq!(to_fixed(any), to_fixed_by_round(any), "{any:e}");
            assert_eq!(to_fixed(tie), to_fixed_by_round(tie), "{tie:e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

        #[test]
        fn window_results_equal_the_reference((spec, delay, ups, evs) in events()) {
            let mut agg = WindowAgg::new(spec, delay, ups);
            let mut got = Vec::new();
            run(&mut agg, &evs, &mut got);
            got.sort_by_key(|r| (r.start, r.key));
            let (want, late) = reference(spec, delay, ups, &evs);
            prop_assert_eq!(got, want);
            prop_assert_eq!(agg.late_rows(), late);
            prop_assert_eq!(agg.open_windows(), 0);
        }

        #[test]
        fn state_restored_midway_gives_the_same_results((spec, delay, ups, evs) in events(), cut in 0usize..120) {
            let cut = cut.min(evs.len());
            let mut straight = WindowAgg::new(spec, delay, ups);
            let mut want = Vec::new();
            run(&mut straight, &evs, &mut want);

            let mut first = WindowAgg::new(spec, delay, ups);
            let mut got = Vec::new();
            run(&mut first, &evs[..cut], &mut got);
            let state: Vec<_> = first.state().collect();
            let mut second = WindowAgg::new(spec, delay, ups);
            second.restore(state, first.progress(), first.late_rows(), first.rows()).unwrap();
            run(&mut second, &evs[cut..], &mut got);
            got.sort_by_key(|r| (r.start, r.key));
            want.sort_by_key(|r| (r.start, r.key));
            prop_assert_eq!(got, want);
            prop_assert_eq!(second.late_rows(), straight.late_rows());
        }
    }

    #[test]
    fn sums_do_not_depend_on_arrival_order() {
        let vals = [0.1, 1e9, -1e9, 0.3, 2.5e-3, 7.77];
        let mut a = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        let mut b = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        vals.iter().for_each(|v| a.add(1, 1, *v));
        vals.iter().rev().for_each(|v| b.add(1, 1, *v));
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        a.advance(0, 100, |r| ra.push(r));
        b.advance(0, 100, |r| rb.push(r));
        assert_eq!(ra.len(), 1);
        assert_eq!(ra[0].sum.to_bits(), rb[0].sum.to_bits());
        assert!((ra[0].sum - vals.iter().sum::<f64>()).abs() < 1e-6);
        assert_eq!(ra[0].avg(), ra[0].sum / 6.0);
    }

    #[test]
    fn late_rows_are_counted_and_dropped() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 1);
        agg.add(5, 1, 1.0);
        let mut out = Vec::new();
        agg.advance(0, 10, |r| out.push(r));
        assert_eq!(out.len(), 1);
        agg.add(9, 1, 100.0); // window [0,10) already fired
        agg.add(10, 1, 2.0);
        agg.advance(0, 20, |r| out.push(r));
        assert_eq!(agg.late_rows(), 1);
        assert_eq!(out.iter().map(|r| (r.start, r.count)).collect::<Vec<_>>(), vec![(0, 1), (10, 1)]);
    }

    #[test]
    fn watermark_waits_for_every_upstream() {
        let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 2, 2);
        agg.add(1, 1, 1.0);
        let mut out = Vec::new();
        agg.advance(0, 100, |r| out.push(r));
        assert!(out.is_empty(), "upstream 1 has not reported");
        agg.advance(1, 11, |r| out.push(r));
        assert!(out.is_empty(), "min(100, 11) - 2 = 9 < 10");
        agg.advance(1, 12, |r| out.push(r));
        assert_eq!(out.len(), 1);
        assert_eq!(agg.watermark(), 10);
    }

    #[test]
    fn bad_window_shapes_are_refused() {
        assert!(WindowSpec::hopping(10, 3).validate().is_err());
        assert!(WindowSpec::tumbling(0).validate().is_err());
        assert!(WindowSpec::hopping(10, 5).validate().is_ok());
    }
}
