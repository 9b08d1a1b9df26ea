//! Tests of the result store.

use super::*;

fn r(key: u64, start: i64) -> WindowResult {
    WindowResult { key, start, count: 1, sum: 1.0, min: 1.0, max: 1.0 }
}

#[test]
fn a_write_rocksdb_would_hold_back_is_refused_at_once_and_goes_through_later() {
    let dir = tempfile::tempdir().unwrap();
    let store = ResultStore::open(dir.path()).unwrap();
    store.ensure_cf(&cfs::cf_name(TaskId(2))).unwrap();
    let set = |opts: &[(&str, &str)]| {
        let g = store.db.read().unwrap();
        let db = g.as_ref().unwrap();
        db.set_options_cf(db.cf_handle("u2").unwrap(), opts).unwrap()
    };
    // Two files in level 0 that no compaction picks up (its trigger far above), and writes
    // that stop at two.
    set(&[("level0_file_num_compaction_trigger", "100")]);
    for start in [0, 1000] {
        store.upsert(StreamId(1), TaskId(2), &[r(1, start)]).unwrap();
        store.flush().unwrap();
    }
    set(&[("level0_slowdown_writes_trigger", "1"), ("level0_stop_writes_trigger", "2")]);
    let t = std::time::Instant::now();
    assert!(!store.try_upsert(StreamId(1), TaskId(2), &[r(1, 2000)]).unwrap(), "refused, not waited for");
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(store.get(StreamId(1), 1, 2000).unwrap(), None, "nothing written");
    set(&[
        ("level0_slowdown_writes_trigger", "20"),
        ("level0_stop_writes_trigger", "36"),
        ("level0_file_num_compaction_trigger", "4"),
    ]);
    assert!(store.try_upsert(StreamId(1), TaskId(2), &[r(1, 2000)]).unwrap());
    assert_eq!(store.get(StreamId(1), 1, 2000).unwrap(), Some(r(1, 2000)));
}

#[test]
fn each_upstreams_blocks_go_to_its_column_family_and_read_back_merged_with_older_ones() {
    let dir = tempfile::tempdir().unwrap();
    // As an older Weir wrote: every block in the default column family.
    {
        let db = rocksdb::DB::open(&options(), dir.path()).unwrap();
        let mut v = Vec::new();
        for (up, start, key) in [(2, 0, 1), (3, 0, 2), (2, 1000, 3)] {
            v.clear();
            blocks::encode(&[r(key, start)], &mut v);
            db.put(blocks::block_key(StreamId(1), start, TaskId(up), order_of(key)), &v).unwrap();
        }
    }
    let store = ResultStore::open(dir.path()).unwrap();
    // A replay writes one of them again, with another value, and new ones.
    let again = WindowResult { count: 7, ..r(3, 1000) };
    store.upsert(StreamId(1), TaskId(2), &[again]).unwrap();
    store.upsert(StreamId(1), TaskId(3), &[r(4, 2000)]).unwrap();
    store.upsert(StreamId(1), TaskId(2), &[r(5, 2000)]).unwrap();
    assert_eq!(store.cf_names(), vec!["u2".to_string(), "u3".to_string()]);
    let want = vec![r(1, 0), r(2, 0), again, r(5, 2000), r(4, 2000)];
    assert_eq!(store.scan(StreamId(1)).unwrap(), want, "(window, upstream, key) order, each block once");
    assert_eq!(store.get(StreamId(1), 3, 1000).unwrap(), Some(again), "the upstream's column family first");
    assert_eq!(store.get(StreamId(1), 2, 0).unwrap(), Some(r(2, 0)));
    // Reopened (and restored from a checkpoint), the column families come back.
    let cp = dir.path().join("cp");
    store.checkpoint(&cp).unwrap();
    let other = tempfile::tempdir().unwrap();
    let restored = ResultStore::open(other.path()).unwrap();
    restored.restore_from(&cp).unwrap();
    assert_eq!(restored.scan(StreamId(1)).unwrap(), want);
    drop(store);
    assert_eq!(ResultStore::open(dir.path()).unwrap().scan(StreamId(1)).unwrap(), want);
}

#[test]
fn pages_of_a_stream_read_back_every_result_once_and_stop_at_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let store = ResultStore::open(dir.path()).unwrap();
    for start in [-1000, 0, 1000] {
        let rs: Vec<WindowResult> = (0..1500u64).map(|k| r(k, start)).collect();
        for b in blocks::sorted_windows(&rs) {
            for m in b.chunks(512) {
                store.upsert(StreamId(1), TaskId(2), m).unwrap();
            }
        }
    }
    store.upsert(StreamId(2), TaskId(2), &[r(5, 0)]).unwrap(); // another stream's
    let (mut got, mut after, mut pages) = (Vec::new(), Vec::new(), 0);
    loop {
        let (rows, next) = store.page(StreamId(1), &after, 700).unwrap();
        assert!(rows.len() >= 700 || next.is_none(), "a page is full unless it is the last");
        got.extend(rows);
        pages += 1;
        match next {
            Some(n) => after = n,
            None => break,
        }
    }
    assert!(pages > 3, "{pages} pages");
    assert_eq!(got, store.scan(StreamId(1)).unwrap(), "the pages are the scan, in its order");
    assert_eq!(got.len(), 4500);
}

/// The options RocksDB wrote for column family `cf` at the last open of the store at `dir`.
fn cf_options(dir: &std::path::Path, cf: &str) -> String {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("OPTIONS-"))
        .max()
        .expect("an options file");
    let text = std::fs::read_to_string(dir.join(newest)).unwrap();
    let section = format!("[CFOptions \"{cf}\"]");
    let at = text.find(&section).unwrap_or_else(|| panic!("no {section}"));
    let rest = &text[at + section.len()..];
    rest[..rest.find("\n[").unwrap_or(rest.len())].to_string()
}

#[test]
fn a_restored_or_reopened_store_keeps_its_options_in_every_column_family() {
    let dir = tempfile::tempdir().unwrap();
    let (live, snap, back) = (dir.path().join("live"), dir.path().join("snap"), dir.path().join("back"));
    let store = ResultStore::open(&live).unwrap();
    store.upsert(StreamId(1), TaskId(2), &[r(1, 0)]).unwrap();
    store.checkpoint(&snap).unwrap();
    drop(store);
    let reopened = ResultStore::open(&live).unwrap();
    let restored = ResultStore::open(&back).unwrap();
    restored.restore_from(&snap).unwrap();
    assert_eq!(restored.get(StreamId(1), 1, 0).unwrap(), Some(r(1, 0)));
    for path in [&live, &back] {
        let o = cf_options(path, "u2");
        for want in ["write_buffer_size=8388608", "max_write_buffer_number=6", "compression=kNoCompression"] {
            assert!(o.contains(want), "{}: {want} not in {o}", path.display());
        }
    }
    drop(reopened);
}
