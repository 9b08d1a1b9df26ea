//! Tests of the window state's layout: compact entries at their edges, and files of older
//! formats (alone, and in a chain with compact ones) restored.

use super::*;

/// A file in the layout of format 3 and older (13-byte block keys, `m:` records), written by
/// hand as that Weir wrote it.
fn format3_file(path: &std::path::Path, entries: &[(i64, u64, Acc)], progress: &[Option<i64>]) {
    let mut blocks: BTreeMap<[u8; 13], Vec<u8>> = BTreeMap::new();
    for (start, key, a) in entries {
        let mut k = [0u8; 13];
        k[0] = b'b';
        k[1..9].copy_from_slice(&((*start as u64) ^ (1 << 63)).to_be_bytes());
        let v = blocks.entry(k).or_default();
        v.extend_from_slice(&key.to_le_bytes());
        v.extend_from_slice(&a.count.to_le_bytes());
        v.extend_from_slice(&a.sum_fx.to_le_bytes());
        v.extend_from_slice(&a.min.to_le_bytes());
        v.extend_from_slice(&a.max.to_le_bytes());
    }
    let counters = [7u64.to_le_bytes(), 1234u64.to_le_bytes()].concat();
    let p: Vec<u8> =
        progress.iter().flat_map(|u| std::iter::once(u.is_some() as u8).chain(u.unwrap_or(0).to_le_bytes())).collect();
    let kvs =
        blocks.iter().map(|(k, v)| (&k[..], &v[..])).chain([(OLD_COUNTERS, &counters[..]), (OLD_PROGRESS, &p[..])]);
    super::super::write_sst(path, kvs).unwrap();
}

#[test]
fn compact_entries_round_trip_at_their_edges() {
    let edges = [
        (0u64, Acc { count: 1, sum_fx: 0, min: 0.0, max: -0.0 }),
        (u64::MAX, Acc { count: u64::MAX, sum_fx: i128::MAX, min: f64::NEG_INFINITY, max: f64::NAN }),
        (7, Acc { count: 127, sum_fx: i128::MIN, min: f64::MIN_POSITIVE, max: f64::MAX }),
        (1 << 40, Acc { count: 128, sum_fx: -1, min: -3.5, max: 1e300 }),
        (9, Acc { count: 3, sum_fx: 1000 << 32, min: 1.0, max: 999.0 }),
    ];
    let mut v = Vec::new();
    edges.iter().for_each(|(k, a)| put_entry(&mut v, *k, a));
    let mut b = &v[..];
    for (k, a) in &edges {
        let (k2, a2) = get_entry(&mut b).expect("decodes");
        assert_eq!(
            (k2, a2.count, a2.sum_fx, a2.min.to_bits(), a2.max.to_bits()),
            (*k, a.count, a.sum_fx, a.min.to_bits(), a.max.to_bits())
        );
    }
    assert!(b.is_empty());
    // A typical entry is two thirds of a fixed one or less; a cut one does not decode.
    let mut one = Vec::new();
    put_entry(&mut one, 123_456_789, &edges[4].1);
    assert!(one.len() <= 32, "{} bytes", one.len());
    assert!(get_entry(&mut &one[..one.len() - 1]).is_none());
    assert!(
        block_entries(&[BLOCK_PREFIX; 21], &[2, 0, 0, 0], |_, _| Ok(())).is_err(),
        "two entries promised, none there"
    );
}

#[test]
fn a_chain_of_a_format_4_file_and_a_compact_delta_restores() {
    let dir = tempfile::tempdir().unwrap();
    let mut agg = WindowAgg::new(crate::operator::window::WindowSpec::tumbling(1000), 0, 1);
    (0..3000u64).for_each(|k| agg.add(5, k, k as f64 / 3.0));
    let first = agg.freeze();
    // File 1 as format 4 wrote it: fixed entries under `b`, then its `n` record.
    let mut block = Vec::new();
    for (_, key, a) in first.entries() {
        block.extend_from_slice(&key.to_le_bytes());
        block.extend_from_slice(&a.count.to_le_bytes());
        block.extend_from_slice(&a.sum_fx.to_le_bytes());
        block.extend_from_slice(&a.min.to_le_bytes());
        block.extend_from_slice(&a.max.to_le_bytes());
    }
    let mut k = block_key(0, 1, 0);
    k[0] = FIXED_PREFIX;
    let mut n = [META_PREFIX; 9];
    n[1..9].copy_from_slice(&1u64.to_be_bytes());
    let snap = dir.path().join("snap");
    let meta = meta_record(&first);
    super::super::write_sst(&snap.join("state-00000000000000000001.sst"), [(&k[..], &block[..]), (&n[..], &meta[..])])
        .unwrap();
    // Then a compact delta on it.
    (1000..4000u64).for_each(|k| agg.add(7, k, 1.5));
    let second = agg.freeze();
    let written =
        write_window_file(&second, Some(first.epoch), 2, &snap.join("state-00000000000000000002.sst"), true).unwrap();
    assert_eq!(written.entries, 3000);
    let store = TaskStore::open_from_state_files(&snap, &dir.path().join("db")).unwrap();
    let mut back = WindowAgg::new(crate::operator::window::WindowSpec::tumbling(1000), 0, 1);
    assert!(load_window_state(&store, &mut back).unwrap());
    let (mut a, mut b): (Vec<_>, Vec<_>) = (agg.state().collect(), back.state().collect());
    a.sort_by_key(|e| e.1);
    b.sort_by_key(|e| e.1);
    assert_eq!(a.len(), 4000);
    assert!(a == b, "the delta's entries replace the older file's");
}

#[test]
fn a_snapshot_in_the_layout_of_format_3_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    let acc = |n: u64| Acc { count: n, sum_fx: n as i128 * 3, min: 1.0, max: n as f64 };
    let entries: Vec<(i64, u64, Acc)> =
        (0..500u64).map(|k| (100, k, acc(k + 1))).chain((0..20).map(|k| (200, k, acc(1)))).collect();
    format3_file(&dir.path().join("snap/state-00000000000000000003.sst"), &entries, &[Some(150), None]);
    let store = TaskStore::open_from_snapshot(&dir.path().join("snap"), &dir.path().join("db")).unwrap();
    let mut agg = WindowAgg::new(crate::operator::window::WindowSpec::tumbling(100), 0, 2);
    assert!(load_window_state(&store, &mut agg).unwrap());
    let mut got: Vec<_> = agg.state().collect();
    got.sort_by_key(|e| (e.0, e.1));
    assert_eq!(got, entries);
    assert_eq!((agg.rows(), agg.late_rows(), agg.progress()), (1234, 7, &[Some(150), None][..]));
}
