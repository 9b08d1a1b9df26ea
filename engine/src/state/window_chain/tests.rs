//! Chains of state files: what a delta holds, when a chain is written whole again, and that a
//! restore from a chain equals a restore from a full snapshot of the same point.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use weir_wire::CheckpointId;

use super::*;
use crate::operator::window::{Acc, WindowAgg, WindowResult, WindowSpec};
use crate::state::{TaskStore, load_window_state, write_window_snapshot};

fn load(dir: &Path, spec: WindowSpec, delay: i64) -> WindowAgg {
    let db = tempfile::tempdir().unwrap();
    let store = TaskStore::open_from_snapshot(dir, &db.path().join("db")).unwrap();
    let mut agg = WindowAgg::new(spec, delay, 1);
    assert!(load_window_state(&store, &mut agg).unwrap());
    agg
}

fn sorted(agg: &WindowAgg) -> Vec<(i64, u64, Acc)> {
    let mut v: Vec<_> = agg.state().collect();
    v.sort_by_key(|e| (e.0, e.1));
    v
}

fn snap(root: &Path, id: u64) -> PathBuf {
    root.join(format!("chk-{id}"))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

const HOUR: i64 = 3_600_000;

/// An hour's window over keys `0..keys`, its first snapshot (checkpoint 1) written whole and
/// stored.
fn started(keys: u64) -> (tempfile::TempDir, WindowAgg, WindowChain) {
    let root = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(HOUR), 0, 1);
    (0..keys).for_each(|k| agg.add(1, k, 1.0));
    let mut chain = WindowChain::new();
    let w = chain.write(&mut agg.freeze(), CheckpointId(1), &snap(root.path(), 1)).unwrap();
    assert!(w.full);
    chain.accept(w);
    (root, agg, chain)
}

#[test]
fn a_delta_holds_only_the_entries_written_since_the_last_stored_snapshot() {
    let root = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(HOUR), 0, 1);
    (0..100_000u64).for_each(|k| agg.add(1, k, 1.0));
    let mut chain = WindowChain::new();
    let w1 = chain.write(&mut agg.freeze(), CheckpointId(1), &snap(root.path(), 1)).unwrap();
    assert!(w1.full && w1.files.len() == 1 && w1.files[0].entries == 100_000, "{w1:?}");
    chain.accept(w1);
    // A tenth of the keys again, and a few new ones.
    (0..10_000u64).for_each(|k| agg.add(2, k * 10, 2.0));
    (100_000..100_500u64).for_each(|k| agg.add(3, k, 3.0));
    let frozen = agg.freeze();
    assert_eq!(frozen.changed_bound(1), 10_500, "counted as written, exactly");
    assert_eq!(frozen.changed_bound(0), 100_500);
    let w2 = chain.write(&mut frozen.clone(), CheckpointId(2), &snap(root.path(), 2)).unwrap();
    assert!(!w2.full, "{w2:?}");
    assert_eq!(w2.files.iter().map(|f| f.entries).collect::<Vec<_>>(), vec![100_000, 10_500]);
    let full_bytes = std::fs::metadata(&w2.files[0].path).unwrap().len();
    assert!(w2.bytes * 5 < full_bytes, "delta {} bytes, full {full_bytes}", w2.bytes);
    assert_eq!(
        files_in(&snap(root.path(), 2)),
        vec![state_file_name(CheckpointId(1)), state_file_name(CheckpointId(2))]
    );
    chain.accept(w2);
    assert_eq!(sorted(&load(&snap(root.path(), 2), WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
    // Nothing written since: an empty delta.
    let w3 = chain.write(&mut agg.freeze(), CheckpointId(3), &snap(root.path(), 3)).unwrap();
    assert_eq!((w3.full, w3.files.last().unwrap().entries), (false, 0));
}

#[test]
fn the_next_delta_covers_a_snapshot_whose_upload_failed() {
    let (root, mut agg, chain) = started(1000);
    (0..100u64).for_each(|k| agg.add(1, k, 1.0));
    let lost = chain.write(&mut agg.freeze(), CheckpointId(2), &snap(root.path(), 2)).unwrap();
    assert_eq!(lost.files.last().unwrap().entries, 100);
    drop(lost); // not stored: never accepted
    std::fs::remove_dir_all(snap(root.path(), 2)).unwrap();
    (900..1000u64).for_each(|k| agg.add(1, k, 1.0));
    let w3 = chain.write(&mut agg.freeze(), CheckpointId(3), &snap(root.path(), 3)).unwrap();
    assert_eq!(w3.files.iter().map(|f| f.entries).collect::<Vec<_>>(), vec![1000, 200]);
    assert_eq!(sorted(&load(&snap(root.path(), 3), WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
}

#[test]
fn a_chain_is_written_whole_again_when_long_or_mostly_fired() {
    let root = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(HOUR), 0, 1);
    (0..10_000u64).for_each(|k| agg.add(1, k, 1.0));
    let mut chain = WindowChain::new();
    let mut kinds = Vec::new();
    for id in 1..=(MAX_FILES as u64 + 1) {
        (0..100u64).for_each(|k| agg.add(1, k * id, 1.0));
        let w = chain.write(&mut agg.freeze(), CheckpointId(id), &snap(root.path(), id)).unwrap();
        kinds.push((w.full, w.files.len()));
        chain.accept(w);
    }
    let mut want: Vec<(bool, usize)> = (1..=MAX_FILES).map(|n| (n == 1, n)).collect();
    want.push((true, 1));
    assert_eq!(kinds, want, "a delta per snapshot until the chain is full, then one file");
    // The hour's window fires; a new one holds a few keys: the chain is mostly dead entries.
    agg.advance(0, HOUR + 1, |_| {}).unwrap();
    (0..10u64).for_each(|k| agg.add(HOUR + 5, k, 1.0));
    let id = MAX_FILES as u64 + 2;
    let w = chain.write(&mut agg.freeze(), CheckpointId(id), &snap(root.path(), id)).unwrap();
    assert!(w.full && w.files.len() == 1 && w.files[0].entries == 10, "{w:?}");
    assert_eq!(files_in(&snap(root.path(), id)), vec![state_file_name(CheckpointId(id))]);
}

#[test]
fn a_chain_file_gone_from_the_node_makes_the_snapshot_whole() {
    let (root, mut agg, chain) = started(1000);
    std::fs::remove_dir_all(snap(root.path(), 1)).unwrap(); // a dropped snapshot directory
    agg.add(1, 5, 1.0);
    let w = chain.write(&mut agg.freeze(), CheckpointId(2), &snap(root.path(), 2)).unwrap();
    assert!(w.full && w.files.len() == 1 && w.files[0].entries == 1000, "{w:?}");
    assert_eq!(sorted(&load(&snap(root.path(), 2), WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
}

/// After a restore, a snapshot written whole (its chain's files gone from the node) keeps every
/// restored entry, those no row has touched since included.
#[test]
fn a_whole_snapshot_after_a_restore_keeps_the_restored_entries_no_row_touched_since() {
    let (root, _, _) = started(1000);
    let mut agg = load(&snap(root.path(), 1), WindowSpec::tumbling(HOUR), 0);
    agg.write_all();
    let mut chain = WindowChain::new();
    chain.restored(&snap(root.path(), 1), CHAIN_FORMAT, &agg.written_windows()).unwrap();
    (0..10u64).for_each(|k| agg.add(1, k, 1.0));
    std::fs::remove_dir_all(snap(root.path(), 1)).unwrap(); // the restored snapshot dropped
    let w = chain.write(&mut agg.freeze(), CheckpointId(2), &snap(root.path(), 2)).unwrap();
    assert!(w.full && w.files[0].entries == 1000, "{w:?}");
    assert_eq!(sorted(&load(&snap(root.path(), 2), WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
}

#[test]
fn a_write_begun_before_a_restore_is_not_accepted_after_it() {
    let (root, mut agg, mut chain) = started(1000);
    agg.add(1, 1, 1.0);
    let stale = chain.write(&mut agg.freeze(), CheckpointId(2), &snap(root.path(), 2)).unwrap();
    chain.restored(&snap(root.path(), 1), CHAIN_FORMAT, &[0]).unwrap();
    let restored_files = chain.files().to_vec();
    assert_eq!(restored_files.len(), 1);
    chain.accept(stale);
    assert_eq!(chain.files(), &restored_files[..], "the stale write changed nothing");
    // An older format's file starts no chain.
    chain.restored(&snap(root.path(), 1), 3, &[0]).unwrap();
    assert!(chain.files().is_empty());
}

/// One run: rows over `keys` keys into windows of `size`, progress and sliced emission after each
/// batch, a snapshot every few batches written on a chain (some not stored, as failed uploads).
/// At the last snapshot, a restore from its chain and one from a full file of the same point
/// both go on to exactly the results of the run without a restore.
fn chain_equals_full(seed: u64, keys: u64, size: i64, slice: usize) {
    let spec = WindowSpec::tumbling(size);
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut batches = Vec::new();
    let mut clock = 0i64;
    for _ in 0..60 {
        let rows: Vec<(i64, u64, f64)> = (0..(rnd() % 400))
            .map(|_| {
                clock += (rnd() % 8 == 0) as i64;
                let ts = clock - (rnd() % 6) as i64;
                (ts, rnd() % keys, (rnd() % 1000) as f64 / 8.0)
            })
            .collect();
        batches.push((rows, clock));
    }
    let run = |agg: &mut WindowAgg, from: usize, out: &mut Vec<WindowResult>| {
        for (rows, progress) in &batches[from..] {
            let mut adder = agg.batch();
            rows.iter().for_each(|&(t, k, v)| adder.add(t, k, v));
            drop(adder);
            agg.observe(0, *progress);
            agg.emit_fired(slice, |r| out.push(r)).unwrap();
        }
        agg.advance(0, i64::MAX / 2, |r| out.push(r)).unwrap();
    };
    let mut want = Vec::new();
    run(&mut WindowAgg::new(spec, 3, 1), 0, &mut want);

    let root = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(spec, 3, 1);
    let mut chain = WindowChain::new();
    let mut before = Vec::new();
    let mut last = None;
    let mut deltas = 0;
    for (i, (rows, progress)) in batches.iter().enumerate() {
        let mut adder = agg.batch();
        rows.iter().for_each(|&(t, k, v)| adder.add(t, k, v));
        drop(adder);
        agg.observe(0, *progress);
        agg.emit_fired(slice, |r| before.push(r)).unwrap();
        if i % 5 == 4 {
            let id = i as u64 + 1;
            let frozen = agg.freeze();
            let w = chain.write(&mut frozen.clone(), CheckpointId(id), &snap(root.path(), id)).unwrap();
            deltas += usize::from(!w.full);
            if rnd() % 4 != 0 {
                chain.accept(w);
            }
            let full = root.path().join(format!("full-{id}"));
            write_window_snapshot(&frozen, &full.join("state.sst")).unwrap();
            last = Some((id, full, before.len()));
        }
    }
    let (id, full, emitted) = last.expect("a snapshot");
    let from = (id as usize).min(batches.len());
    let mut from_chain = load(&snap(root.path(), id), spec, 3);
    let mut from_full = load(&full, spec, 3);
    assert_eq!(sorted(&from_chain), sorted(&from_full), "the same state from a chain and from a full file");
    let (mut a, mut b) = (before[..emitted].to_vec(), before[..emitted].to_vec());
    run(&mut from_chain, from, &mut a);
    run(&mut from_full, from, &mut b);
    let key = |r: &WindowResult| (r.start, r.key);
    for v in [&mut a, &mut b, &mut want] {
        v.sort_by_key(key);
    }
    assert!(a == want, "results after a restore from the chain differ ({} against {})", a.len(), want.len());
    assert!(b == want, "results after a restore from a full file differ");
    if size >= 200 {
        assert!(deltas > 0, "long windows make deltas");
    }
}

#[test]
fn a_restore_from_a_chain_equals_a_restore_from_a_full_snapshot_at_many_keys() {
    chain_equals_full(0x9E37_79B9, 50_000, 400, 3_000);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_restore_from_a_chain_equals_a_restore_from_a_full_snapshot(
        seed in any::<u64>(),
        keys in 1u64..3000,
        size in prop::sample::select(vec![20i64, 200, 2000]),
        slice in prop::sample::select(vec![1usize, 50, usize::MAX]),
    ) {
        chain_equals_full(seed, keys, size, slice);
    }
}

/// Random keys and `f64` aggregates do not shrink under LZ4: the first full file tries, the
/// files after it go raw (deltas and full files alike), and after `PROBE_EVERY` raw full files
/// the next tries again; aggregates that do shrink stay compressed. Either way the chain
/// restores to the state.
#[test]
fn files_go_uncompressed_while_the_last_one_did_not_shrink_and_full_files_try_again_now_and_then() {
    for random in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let mut agg = WindowAgg::new(WindowSpec::tumbling(HOUR), 0, 1);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let keys: Vec<u64> = (0..20_000u64).map(|k| if random { next() } else { k }).collect();
        let mut value = move || if random { (next() >> 11) as f64 / (1u64 << 53) as f64 * 1000.0 } else { 1.0 };
        keys.iter().for_each(|&k| agg.add(1, k, value()));
        let mut chain = WindowChain::new();
        let (mut kinds, mut mixed) = (Vec::new(), Vec::new());
        let writes = MAX_FILES * (PROBE_EVERY as usize + 1) + 1;
        for id in 1..=writes as u64 {
            (0..2_000usize).for_each(|i| agg.add(1, keys[(i * 7 + id as usize) % keys.len()], value()));
            let w = chain.write(&mut agg.freeze(), CheckpointId(id), &snap(root.path(), id)).unwrap();
            kinds.push((w.full, w.lz4));
            chain.accept(w);
            if id == MAX_FILES as u64 {
                mixed = sorted(&agg);
            }
        }
        // A full file every MAX_FILES writes (the chain is full); the probes among them.
        let want: Vec<(bool, bool)> = (0..writes)
            .map(|i| {
                let full = i % MAX_FILES == 0;
                let probe = full && (i / MAX_FILES) % (PROBE_EVERY as usize + 1) == 0;
                (full, probe || !random)
            })
            .collect();
        assert_eq!(kinds, want, "random values: {random}");
        let last = snap(root.path(), writes as u64);
        assert_eq!(sorted(&load(&last, WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
        let before_full = snap(root.path(), MAX_FILES as u64);
        assert_eq!(files_in(&before_full).len(), MAX_FILES, "a chain of a full file and its deltas");
        assert_eq!(sorted(&load(&before_full, WindowSpec::tumbling(HOUR), 0)), mixed);
    }
}

#[test]
fn a_snapshot_lets_go_of_the_shards_once_encoded_and_its_file_holds_them_all() {
    let root = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(WindowSpec::tumbling(HOUR), 0, 1);
    (0..20_000u64).for_each(|k| agg.add(1, k, 1.0));
    let mut copy = agg.freeze();
    let held: Vec<std::sync::Weak<_>> =
        copy.windows.iter().flat_map(|(_, shards)| shards.iter().map(std::sync::Arc::downgrade)).collect();
    let w = WindowChain::new().write(&mut copy, CheckpointId(1), &snap(root.path(), 1)).unwrap();
    assert!(copy.windows.is_empty(), "the snapshot holds no shard once written");
    // Only the operator holds each shard now: its next write takes it back without a copy.
    assert!(held.iter().all(|s| s.strong_count() == 1));
    assert_eq!(w.files.iter().map(|f| f.entries).sum::<u64>(), 20_000);
    assert_eq!(sorted(&load(&snap(root.path(), 1), WindowSpec::tumbling(HOUR), 0)), sorted(&agg));
}
