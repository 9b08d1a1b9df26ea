//! RocksDB state on disk: agg state through flush, local snapshot and open-from-snapshot gives the
//! same results as running on; the result store writes and finds blocks; damaged snapshots are refused.

use weir_engine::operator::generator::{Generator, GeneratorSpec};
use weir_engine::operator::window::{WindowAgg, WindowResult, WindowSpec};
use weir_engine::state::{ResultStore, StateError, TaskStore, load_window_state, save_window_state};
use weir_engine::wire::{StreamId, TaskId};

fn feed(agg: &mut WindowAgg, generator: &Generator, from: u64, to: u64, out: &mut Vec<WindowResult>) {
    for o in from..to {
        let (t, k, v) = generator.row(o);
        agg.add(t, k, v);
        if o % 500 == 499 {
            agg.advance(0, generator.max_ts_before(o + 1), |r| out.push(r)).unwrap();
        }
    }
}

#[test]
fn snapshot_then_open_from_snapshot_continues_with_the_same_results() {
    let spec =
        GeneratorSpec { keys: 200, rows_per_ms: 5, out_of_order: 0.2, max_disorder_ms: 40, ..GeneratorSpec::default() };
    let generator = Generator::new(spec, 0);
    let window = WindowSpec::hopping(300, 100);

    let mut straight = WindowAgg::new(window, 20, 1);
    let mut want = Vec::new();
    feed(&mut straight, &generator, 0, 60_000, &mut want);
    straight.advance(0, i64::MAX, |r| want.push(r)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut got = Vec::new();
    let mut first = WindowAgg::new(window, 20, 1);
    feed(&mut first, &generator, 0, 31_337, &mut got);
    let store = TaskStore::open(&dir.path().join("live")).unwrap();
    save_window_state(&store, &mut first).unwrap();
    let info = store.snapshot(&dir.path().join("snap-1")).unwrap();
    assert!(info.files > 0 && info.bytes > 0);
    // The live store moves on after the snapshot; the snapshot must not.
    let mut later = WindowAgg::new(window, 20, 1);
    feed(&mut later, &generator, 0, 50_000, &mut Vec::new());
    save_window_state(&store, &mut later).unwrap();
    drop(store);

    let restored = TaskStore::open_from_snapshot(&dir.path().join("snap-1"), &dir.path().join("restored")).unwrap();
    let mut second = WindowAgg::new(window, 20, 1);
    assert!(load_window_state(&restored, &mut second).unwrap());
    assert_eq!(second.state().count(), first.state().count());
    assert_eq!(
        (second.rows(), second.late_rows(), second.watermark()),
        (first.rows(), first.late_rows(), first.watermark())
    );
    feed(&mut second, &generator, 31_337, 60_000, &mut got);
    second.advance(0, i64::MAX, |r| got.push(r)).unwrap();

    let key = |r: &WindowResult| (r.start, r.key);
    got.sort_by_key(key);
    want.sort_by_key(key);
    assert!(want.len() > 1000);
    assert_eq!(got, want);
    assert_eq!(second.late_rows(), straight.late_rows());
}

#[test]
fn empty_store_has_no_window_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = TaskStore::open(dir.path()).unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 2);
    assert!(!load_window_state(&store, &mut agg).unwrap());
}

#[test]
fn a_directory_that_is_not_a_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bogus")).unwrap();
    std::fs::write(dir.path().join("bogus/junk.sst"), b"not an sst").unwrap();
    let err = TaskStore::open_from_snapshot(&dir.path().join("bogus"), &dir.path().join("db")).unwrap_err();
    assert!(matches!(err, StateError::Corrupt { .. }) && !err.is_retryable(), "{err}");
}

#[test]
fn state_for_another_operator_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = TaskStore::open(dir.path()).unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(10), 0, 3);
    agg.advance(0, 5, |_| {}).unwrap();
    save_window_state(&store, &mut agg).unwrap();
    let mut other = WindowAgg::new(WindowSpec::tumbling(10), 0, 2);
    assert!(matches!(load_window_state(&store, &mut other), Err(StateError::Corrupt { .. })));
}

/// A result store's results, by (key, window start).
fn by_key(mut v: Vec<WindowResult>) -> Vec<WindowResult> {
    v.sort_by_key(|r| (r.key, r.start));
    v
}

#[test]
fn result_store_writes_blocks_per_window_and_upstream_and_a_replay_rewrites_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = ResultStore::open(dir.path()).unwrap();
    let r = |key, start, count| WindowResult { key, start, count, sum: count as f64, min: 0.0, max: 1.0 };
    let (s1, s2, a, b) = (StreamId(1), StreamId(2), TaskId(2), TaskId(3));
    // Results in any order are cut into sorted blocks per window.
    store.upsert(s1, a, &[r(5, -1000, 1), r(5, 0, 2), r(3, 0, 3)]).unwrap();
    store.upsert(s2, a, &[r(5, 0, 9)]).unwrap();
    store.upsert(s1, b, &[r(7, 0, 7)]).unwrap();
    // A replay sends the same block again (the same results of the same upstream's window).
    store.upsert(s1, a, &[r(3, 0, 3), r(5, 0, 4)]).unwrap();
    assert_eq!(by_key(store.scan(s1).unwrap()), vec![r(3, 0, 3), r(5, -1000, 1), r(5, 0, 4), r(7, 0, 7)]);
    assert_eq!(store.get(s1, 7, 0).unwrap(), Some(r(7, 0, 7)), "found in the second upstream's block");
    assert_eq!(store.get(s1, 3, 0).unwrap(), Some(r(3, 0, 3)));
    assert_eq!(store.get(s1, 5, -1000).unwrap(), Some(r(5, -1000, 1)));
    assert_eq!(store.get(s2, 5, 0).unwrap(), Some(r(5, 0, 9)));
    assert_eq!(store.get(s2, 5, 1).unwrap(), None);
    assert_eq!(store.get(s1, 4, 0).unwrap(), None);
}

#[test]
fn a_lookup_finds_every_result_of_windows_written_in_agg_messages() {
    let dir = tempfile::tempdir().unwrap();
    let store = ResultStore::open(dir.path()).unwrap();
    // Two aggs' windows over 5,000 keys each, in the order and the messages an agg sends them.
    let mut want = Vec::new();
    for (up, keys) in [(TaskId(2), 0..5000u64), (TaskId(3), 5000..10_000)] {
        for start in [0i64, 1000] {
            let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
            keys.clone().for_each(|k| agg.add(start, k, k as f64));
            let mut w = Vec::new();
            agg.advance(0, i64::MAX, |r| w.push(r)).unwrap();
            for m in w.chunks(512) {
                store.upsert(StreamId(1), up, m).unwrap();
            }
            want.extend(w);
        }
    }
    for r in want.iter().step_by(7) {
        assert_eq!(store.get(StreamId(1), r.key, r.start).unwrap(), Some(*r));
    }
    assert_eq!(store.get(StreamId(1), 10_000, 0).unwrap(), None);
    assert_eq!(by_key(store.scan(StreamId(1)).unwrap()), by_key(want));
}

#[test]
fn a_result_store_checkpoint_restores_exactly_what_it_held_and_a_closed_store_keeps_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let r = |key, start, count| WindowResult { key, start, count, sum: count as f64, min: 0.0, max: 1.0 };
    let store = ResultStore::open(&dir.path().join("live")).unwrap();
    let up = TaskId(2);
    store.upsert(StreamId(1), up, &[r(1, 0, 1), r(2, 0, 2)]).unwrap();
    let info = store.checkpoint(&dir.path().join("chk")).unwrap();
    assert!(info.files >= 3 && info.bytes > 0, "{info:?}");
    store.upsert(StreamId(1), up, &[r(1, 10, 10), r(3, 10, 3)]).unwrap();
    assert_eq!(by_key(store.scan(StreamId(1)).unwrap()), vec![r(1, 0, 1), r(1, 10, 10), r(2, 0, 2), r(3, 10, 3)]);
    // Back to the checkpoint: later writes are gone, the checkpoint stays valid for another restore.
    store.restore_from(&dir.path().join("chk")).unwrap();
    assert_eq!(by_key(store.scan(StreamId(1)).unwrap()), vec![r(1, 0, 1), r(2, 0, 2)]);
    store.upsert(StreamId(1), up, &[r(4, 0, 4)]).unwrap();
    store.restore_from(&dir.path().join("chk")).unwrap();
    assert_eq!(by_key(store.scan(StreamId(1)).unwrap()), vec![r(1, 0, 1), r(2, 0, 2)]);
    // Writes skip the log, and a clean close flushes them.
    store.upsert(StreamId(1), up, &[r(5, 20, 5)]).unwrap();
    drop(store);
    let again = ResultStore::open(&dir.path().join("live")).unwrap();
    assert_eq!(by_key(again.scan(StreamId(1)).unwrap()), vec![r(1, 0, 1), r(2, 0, 2), r(5, 20, 5)]);
    again.clear().unwrap();
    assert!(again.scan(StreamId(1)).unwrap().is_empty());
}

#[test]
fn the_first_results_of_a_node_are_those_of_a_full_scan_read_in_one_pass() {
    use weir_engine::state::{NodeResults, result_store_dir};
    let dir = tempfile::tempdir().unwrap();
    for (sink, keys) in [(TaskId(5), [9u64, 2, 40]), (TaskId(6), [1, 30, 7])] {
        let store = ResultStore::open(&result_store_dir(dir.path(), sink)).unwrap();
        for start in [1000i64, 0] {
            let rs: Vec<_> = keys
                .iter()
                .map(|&key| WindowResult { key, start, count: key + 1, sum: key as f64 / 3.0, min: -1.5, max: 2.0 })
                .collect();
            store.upsert(StreamId(1), TaskId(2), &rs).unwrap();
        }
    }
    let node = NodeResults::open(dir.path()).unwrap();
    let all = node.scan(StreamId(1)).unwrap();
    assert_eq!(all.len(), 12);
    for n in [0, 1, 3, 12, 20] {
        assert_eq!(node.first(StreamId(1), n).unwrap(), all[..n.min(12)].to_vec(), "first {n}");
    }
}
