//! The operator against a naive reference, restores midway, and the fixed-point conversion.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::fixed::{EXACT_INT, FX_SCALE};
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

/// Rows go in a batch at a time (the engine's way: a batch's first rows one by one, then some
/// as native columns and the rest as the little-endian columns of a batch from another node, so
/// every path and the switches between them inside one adder are checked); `run_sliced` adds
/// them one by one.
fn run(agg: &mut WindowAgg, evs: &[Ev], out: &mut Vec<WindowResult>) {
    use rkyv::rend::{f64_le, i64_le, u64_le};
    for ev in evs {
        match ev {
            Ev::Rows(rows) => {
                let mut adder = agg.batch();
                let (one_by_one, columns) = rows.split_at(rows.len() / 3);
                let (native, remote) = columns.split_at(columns.len() / 2);
                one_by_one.iter().for_each(|&(t, k, v)| adder.add(t, k, v));
                let ts: Vec<i64> = native.iter().map(|r| r.0).collect();
                let keys: Vec<u64> = native.iter().map(|r| r.1).collect();
                let values: Vec<f64> = native.iter().map(|r| r.2).collect();
                adder.add_columns(&ts, &keys, &values);
                let ts: Vec<i64_le> = remote.iter().map(|r| i64_le::from_native(r.0)).collect();
                let keys: Vec<u64_le> = remote.iter().map(|r| u64_le::from_native(r.1)).collect();
                let values: Vec<f64_le> = remote.iter().map(|r| f64_le::from_native(r.2)).collect();
                adder.add_columns(&ts, &keys, &values);
            }
            Ev::Progress(i, t) => agg.advance(*i, *t, |r| out.push(r)).unwrap(),
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
        (EXACT_INT / 2.0 + 0.5) / FX_SCALE, // a tie where the spacing is a half
        -(EXACT_INT / 2.0 + 1.5) / FX_SCALE,
        (EXACT_INT + 1.0) / FX_SCALE,
        0.3 / FX_SCALE,
        -0.25 / FX_SCALE,
        // x just below 2^63, where the one-truncation path ends (2^63 itself is below).
        f64::from_bits(2_147_483_648f64.to_bits() - 1),
        -f64::from_bits(2_147_483_648f64.to_bits() - 1),
        1e30,
        -1e30,
        // Past 2^52 (x whole), and the out-of-line path from 2^63 on.
        1_048_576.0,
        -1_048_576.5,
        3.5e9,
        -2_147_483_647.75,
        2_147_483_648.0,
        -2_147_483_648.0,
        1.7e15,
        -1.7e18,
        39_614_081_257_132_168_796_771_975_168.0,  // 2^95: x = 2^127, saturates
        -39_614_081_257_132_168_796_771_975_168.0, // x = -2^127 = i128::MIN exactly
        f64::from_bits(2f64.powi(95).to_bits() - 1), // the f64 below 2^95
        -f64::from_bits(2f64.powi(95).to_bits() - 1),
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

/// An aggregate's row, as defined: a saturating sum of the values' fixed points and `f64`'s
/// `min` and `max`. `Acc::add` reaches the same by other instructions (an overflow branch, NaN
/// set aside first, x86's one-instruction minimum and maximum).
#[test]
fn an_aggregate_adds_rows_as_saturating_sums_and_f64_min_and_max_define() {
    let edges = [
        0.0,
        -0.0,
        1.5,
        -2.25,
        999.999,
        3.5e9,
        -1.7e18,
        39_614_081_257_132_168_796_771_975_168.0, // 2^95: its fixed point is i128::MAX
        -39_614_081_257_132_168_796_771_975_168.0,
        f64::MAX,
        f64::MIN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::MIN_POSITIVE,
    ];
    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
    let mut h = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..20_000 {
        let mut row = || {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            edges[(h % edges.len() as u64) as usize]
        };
        let len = 1 + (row().to_bits() % 6) as usize;
        let values: Vec<f64> = (0..len).map(|_| row()).collect();
        let mut acc = Acc::new(values[0]);
        let (mut sum, mut min, mut max) = (to_fixed_by_round(values[0]), values[0], values[0]);
        for &v in &values[1..] {
            acc.add(v);
            sum = sum.saturating_add(to_fixed_by_round(v));
            min = min.min(v);
            max = max.max(v);
        }
        assert_eq!(acc.count, len as u64, "{values:?}");
        assert_eq!(acc.sum_fx, sum, "{values:?}");
        assert!(same(acc.min, min) && same(acc.max, max), "{values:?}: {acc:?} against {min} {max}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn window_results_equal_the_reference((spec, delay, ups, evs) in events()) {
        let mut agg = WindowAgg::new(spec, delay, ups);
        let mut got = Vec::new();
        run(&mut agg, &evs, &mut got);
        equals_the_reference(&agg, got, spec, delay, ups, &evs)?;
    }

    #[test]
    fn state_restored_midway_gives_the_same_results((spec, delay, ups, evs) in events(), cut in 0usize..120) {
        let cut = cut.min(evs.len());
        let (straight, mut want) = straight_run(spec, delay, ups, &evs);

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

    #[test]
    fn emission_in_slices_cut_by_a_snapshot_gives_the_same_results_shard_by_shard(
        (spec, delay, ups, evs) in events(), cut in 0usize..120, slice in 1usize..8,
    ) {
        let cut = cut.min(evs.len());
        let (_, want) = straight_run(spec, delay, ups, &evs);

        let mut first = WindowAgg::new(spec, delay, ups);
        let mut got = Vec::new();
        run_sliced(&mut first, &evs[..cut], slice, &mut got);
        let frozen = first.freeze();
        // The operator goes on after the barrier; the snapshot does not see it.
        run_sliced(&mut first, &evs[cut..], slice, &mut Vec::new());
        let mut second = restored(spec, delay, ups, &frozen);
        run_sliced(&mut second, &evs[cut..], slice, &mut got);
        second.emit_fired(usize::MAX, |r| got.push(r)).unwrap();
        prop_assert!(!second.has_fired());
        // Each (window, shard) came out whole, in the same order: the same messages.
        let groups = |rs: &[WindowResult]| {
            let mut g: BTreeMap<(i64, usize), Vec<WindowResult>> = BTreeMap::new();
            for r in rs {
                g.entry((r.start, shard_of(r.key))).or_default().push(*r);
            }
            g
        };
        prop_assert_eq!(groups(&got), groups(&want));
        prop_assert_eq!(got.len(), want.len());
    }
}

/// `got` (an operator's results, in any order) and the operator's counters are the reference's,
/// and nothing is left open.
fn equals_the_reference(
    agg: &WindowAgg,
    mut got: Vec<WindowResult>,
    spec: WindowSpec,
    delay: i64,
    ups: usize,
    evs: &[Ev],
) -> Result<(), TestCaseError> {
    got.sort_by_key(|r| (r.start, r.key));
    let (want, late) = reference(spec, delay, ups, evs);
    prop_assert_eq!(got, want);
    prop_assert_eq!(agg.late_rows(), late);
    prop_assert_eq!(agg.open_windows(), 0);
    Ok(())
}

/// The events run through one operator from start to end: the operator and its results.
fn straight_run(spec: WindowSpec, delay: i64, ups: usize, evs: &[Ev]) -> (WindowAgg, Vec<WindowResult>) {
    let mut agg = WindowAgg::new(spec, delay, ups);
    let mut out = Vec::new();
    run(&mut agg, evs, &mut out);
    (agg, out)
}

/// A new operator restored from `frozen`.
fn restored(spec: WindowSpec, delay: i64, ups: usize, frozen: &FrozenState) -> WindowAgg {
    let mut agg = WindowAgg::new(spec, delay, ups);
    agg.restore(frozen.entries(), &frozen.progress, frozen.late_rows, frozen.rows).unwrap();
    agg
}

/// Like `run`, but fired windows go out `slice` results (whole shards) after each progress.
fn run_sliced(agg: &mut WindowAgg, evs: &[Ev], slice: usize, out: &mut Vec<WindowResult>) {
    for ev in evs {
        match ev {
            Ev::Rows(rows) => rows.iter().for_each(|&(t, k, v)| agg.add(t, k, v)),
            Ev::Progress(i, t) => {
                agg.observe(*i, *t);
                agg.emit_fired(slice, |r| out.push(r)).unwrap();
            }
        }
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
    a.advance(0, 100, |r| ra.push(r)).unwrap();
    b.advance(0, 100, |r| rb.push(r)).unwrap();
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
    agg.advance(0, 10, |r| out.push(r)).unwrap();
    assert_eq!(out.len(), 1);
    agg.add(9, 1, 100.0); // window [0,10) already fired
    agg.add(10, 1, 2.0);
    agg.advance(0, 20, |r| out.push(r)).unwrap();
    assert_eq!(agg.late_rows(), 1);
    assert_eq!(out.iter().map(|r| (r.start, r.count)).collect::<Vec<_>>(), vec![(0, 1), (10, 1)]);
}

#[test]
fn watermark_waits_for_every_upstream() {
    let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 2, 2);
    agg.add(1, 1, 1.0);
    let mut out = Vec::new();
    agg.advance(0, 100, |r| out.push(r)).unwrap();
    assert!(out.is_empty(), "upstream 1 has not reported");
    agg.advance(1, 11, |r| out.push(r)).unwrap();
    assert!(out.is_empty(), "min(100, 11) - 2 = 9 < 10");
    agg.advance(1, 12, |r| out.push(r)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(agg.watermark(), 10);
}

#[test]
fn bad_window_shapes_are_refused() {
    assert!(WindowSpec::hopping(10, 3).validate().is_err());
    assert!(WindowSpec::tumbling(0).validate().is_err());
    assert!(WindowSpec::hopping(10, 5).validate().is_ok());
}

/// Many keys (every shard, tables that grow, windows sized like the last), rows out of order
/// across windows, a snapshot cutting a slice-by-slice emission, restored: the results equal the
/// naive reference's.
#[test]
fn results_at_a_high_key_count_equal_the_reference_across_a_snapshot() {
    const KEYS: u64 = 300_000;
    let spec = WindowSpec::tumbling(100);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut evs = Vec::new();
    let mut clock = 0i64;
    for _ in 0..40 {
        let mut rows = Vec::with_capacity(20_000);
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            clock += (x % 3 == 0) as i64;
            let ts = clock / 100 - (x >> 60) as i64; // up to 15 ms late
            rows.push((ts, (x >> 8) % KEYS, (x % 10_000) as f64 / 16.0));
        }
        evs.push(Ev::Rows(rows));
        evs.push(Ev::Progress(0, clock / 100));
    }
    evs.push(Ev::Progress(0, i64::MAX / 2));
    let (want, late) = reference(spec, 10, 1, &evs);
    assert!(want.len() > 500_000, "{} results", want.len());

    let cut = evs.len() / 2 + 1; // after a progress: a firing is under way
    let mut first = WindowAgg::new(spec, 10, 1);
    let mut got = Vec::new();
    run_sliced(&mut first, &evs[..cut], 5_000, &mut got);
    assert!(first.has_fired(), "the cut falls in the middle of an emission");
    let frozen = first.freeze();
    let mut second = restored(spec, 10, 1, &frozen);
    run(&mut second, &evs[cut..], &mut got);
    got.sort_by_key(|r| (r.start, r.key));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "results differ from the reference");
    assert_eq!(second.late_rows(), late);
}

/// Windows one after the other over the same keys: each fired window's tables go to the pool and
/// the next window takes them (also those a snapshot held when their window fired, once it let
/// go), and the results stay the reference's.
#[test]
fn tables_of_fired_windows_serve_the_next_windows_and_results_stay_exact() {
    let spec = WindowSpec::tumbling(10);
    let mut evs = Vec::new();
    for w in 0..12i64 {
        let rows = (0..20_000u64).map(|k| (w * 10 + (k % 10) as i64, k, (k % 97) as f64 - 40.0 + w as f64)).collect();
        evs.push(Ev::Rows(rows));
        evs.push(Ev::Progress(0, w * 10 + 9));
    }
    evs.push(Ev::Progress(0, 1_000));
    let mut agg = WindowAgg::new(spec, 0, 1);
    let mut got = Vec::new();
    let (mut held, mut served, mut reclaimed) = (None, 0, false);
    for (i, ev) in evs.iter().enumerate() {
        let before = agg.pooled_bytes();
        run(&mut agg, std::slice::from_ref(ev), &mut got);
        match ev {
            // A new window took tables from the pool.
            Ev::Rows(_) if agg.pooled_bytes() < before => served += 1,
            Ev::Progress(..) if i == 9 => held = Some(agg.freeze()),
            // The window the snapshot holds has fired: its tables wait for the snapshot.
            Ev::Progress(..) if i == 11 => {
                let waiting = agg.pooled_bytes();
                drop(held.take());
                (0..SHARDS).for_each(|_| {
                    agg.emit_fired(0, |_| {}).unwrap();
                });
                reclaimed = agg.pooled_bytes() > waiting;
            }
            _ => {}
        }
    }
    assert!(served >= 8, "{served} windows took pooled tables");
    assert!(reclaimed, "tables a snapshot held came back once it let go");
    equals_the_reference(&agg, got, spec, 0, 1, &evs).unwrap();
}

/// Like `run_sliced`, spilling whenever the agg is past its budget.
fn run_spilling(agg: &mut WindowAgg, evs: &[Ev], slice: usize, out: &mut Vec<WindowResult>) -> u32 {
    let mut spills = 0;
    for ev in evs {
        match ev {
            Ev::Rows(rows) => {
                let mut adder = agg.batch();
                rows.iter().for_each(|&(t, k, v)| adder.add(t, k, v));
                drop(adder);
                spills += u32::from(agg.maybe_spill().unwrap());
            }
            Ev::Progress(i, t) => {
                agg.observe(*i, *t);
                agg.emit_fired(slice, |r| out.push(r)).unwrap();
            }
        }
    }
    spills
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn window_results_equal_the_reference_with_state_spilled(
        (spec, delay, ups, evs) in events(), budget in 0usize..600_000, slice in 1usize..8,
    ) {
        let mut agg = WindowAgg::new(spec, delay, ups);
        agg.set_spill(Box::<MemSpill>::default(), budget).unwrap();
        let mut got = Vec::new();
        run_spilling(&mut agg, &evs, slice, &mut got);
        agg.emit_fired(usize::MAX, |r| got.push(r)).unwrap();
        equals_the_reference(&agg, got, spec, delay, ups, &evs)?;
    }
}

#[test]
fn results_at_a_high_key_count_equal_the_reference_with_state_spilled() {
    const KEYS: u64 = 200_000;
    let spec = WindowSpec::tumbling(100);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut evs = Vec::new();
    let mut clock = 0i64;
    for _ in 0..30 {
        let rows: Vec<_> = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                clock += (x % 3 == 0) as i64;
                (clock / 100 - (x >> 60) as i64, (x >> 8) % KEYS, (x % 10_000) as f64 / 16.0)
            })
            .collect();
        evs.push(Ev::Rows(rows));
        evs.push(Ev::Progress(0, clock / 100));
    }
    evs.push(Ev::Progress(0, i64::MAX / 2));
    let (want, late) = reference(spec, 10, 1, &evs);
    let mut agg = WindowAgg::new(spec, 10, 1);
    agg.set_spill(Box::<MemSpill>::default(), 4 << 20).unwrap();
    let mut got = Vec::new();
    let spills = run_spilling(&mut agg, &evs, 5_000, &mut got);
    assert!(spills >= 5, "{spills} spills");
    assert!(agg.memory_bytes() <= 4 << 20, "{} bytes in memory", agg.memory_bytes());
    agg.emit_fired(usize::MAX, |r| got.push(r)).unwrap();
    got.sort_by_key(|r| (r.start, r.key));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "results differ from the reference");
    assert_eq!(agg.late_rows(), late);
}
