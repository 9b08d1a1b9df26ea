use std::sync::Arc;

use weir_wire::StreamId;
use weir_wire::msg::{Catalog, MAX_STREAMS, StreamState};

use super::*;
use crate::cluster::Keys;
use crate::control::{ControlStore, MemControl};

const SPEC: &str = "partitions = 2\n";

fn created(c: &Catalog, name: &str) -> Catalog {
    create(c, name, SPEC, 10).unwrap().0
}

#[test]
fn create_assigns_increasing_ids_and_refuses_a_taken_name() {
    let c = created(&created(&empty(), "a"), "b");
    let ids: Vec<(u64, &str)> = c.streams.iter().map(|s| (s.id.0, s.name.as_str())).collect();
    assert_eq!(ids, [(1, "a"), (2, "b")]);
    let e = create(&c, "a", SPEC, 11).unwrap_err();
    assert!(!e.is_retryable() && e.to_string().contains("already exists"), "{e}");
    let e = create(&c, "no/slash", SPEC, 11).unwrap_err();
    assert!(e.to_string().contains("is not a stream name"), "{e}");
}

#[test]
fn a_dropped_name_created_again_is_a_new_stream() {
    let c = created(&empty(), "a");
    let (c, dropped) = drop_stream(&c, "a", 20).unwrap();
    assert_eq!(dropped.state, StreamState::Dropping { since_ms: 20 });
    // Dropping again keeps the first time.
    assert_eq!(drop_stream(&c, "a", 30).unwrap().1.state, StreamState::Dropping { since_ms: 20 });
    // The name is free at once: the new stream has another id, beside the old one's entry.
    let (c, again) = create(&c, "a", SPEC, 40).unwrap();
    assert_eq!(again.id, StreamId(2), "ids are never reused");
    assert!(create(&c, "a", SPEC, 41).unwrap_err().to_string().contains("already exists"));
    assert_eq!(Catalog::decode(&c.encode()).unwrap(), c, "both entries are a valid catalog");
    // A change by name reaches the kept one.
    let (c, paused) = set_paused(&c, "a", true, 50).unwrap();
    assert_eq!((paused.id, paused.state), (StreamId(2), StreamState::Paused { since_ms: 50 }));
    let c = forget(&c, StreamId(1)).expect("a dropping stream is forgotten");
    assert!(forget(&c, StreamId(1)).is_none(), "forgetting twice changes nothing");
    assert!(forget(&c, StreamId(2)).is_none(), "a kept stream is not forgotten");
    assert!(drop_stream(&c, "zz", 1).unwrap_err().to_string().contains("no stream named zz"));
}

#[test]
fn pause_and_resume_keep_the_stream_and_a_dropping_stream_can_do_neither() {
    let c = created(&empty(), "a");
    let (c, paused) = set_paused(&c, "a", true, 20).unwrap();
    assert_eq!(paused.state, StreamState::Paused { since_ms: 20 });
    // Pausing again keeps the first time; the name stays taken while paused.
    assert_eq!(set_paused(&c, "a", true, 30).unwrap().1.state, StreamState::Paused { since_ms: 20 });
    assert!(create(&c, "a", SPEC, 31).unwrap_err().to_string().contains("is paused"));
    let (c, resumed) = set_paused(&c, "a", false, 40).unwrap();
    assert_eq!((resumed.state, resumed.id), (StreamState::Running, StreamId(1)));
    assert_eq!(set_paused(&c, "a", false, 41).unwrap().0, c, "resuming a running stream changes nothing");
    // A paused stream can be dropped; a dropping one neither pauses nor resumes.
    let (c, _) = set_paused(&c, "a", true, 50).unwrap();
    let (c, dropped) = drop_stream(&c, "a", 60).unwrap();
    assert_eq!(dropped.state, StreamState::Dropping { since_ms: 60 });
    for pause in [true, false] {
        let e = set_paused(&c, "a", pause, 70).unwrap_err();
        assert!(!e.is_retryable() && e.to_string().contains("being dropped"), "{e}");
    }
    assert!(set_paused(&c, "zz", true, 1).unwrap_err().to_string().contains("no stream named zz"));
}

#[test]
fn only_a_paused_streams_spec_is_replaced_and_only_the_one_it_was_computed_from() {
    let c = created(&empty(), "a");
    let spec = c.streams[0].spec.clone();
    let err = set_spec(&c, "a", &spec, "aggs = 5").unwrap_err();
    assert!(err.to_string().contains("pause it first"), "{err}");
    let (c, _) = set_paused(&c, "a", true, 10).unwrap();
    let stale = set_spec(&c, "a", "aggs = 1", "aggs = 5").unwrap_err();
    assert!(stale.is_retryable(), "{stale}");
    let long = "#".repeat(weir_wire::msg::MAX_SPEC_TEXT + 1);
    assert!(set_spec(&c, "a", &spec, &long).is_err(), "a spec the catalog could not keep");
    let (c, e) = set_spec(&c, "a", &spec, "aggs = 5").unwrap();
    assert_eq!((e.spec.as_str(), c.streams[0].state), ("aggs = 5", StreamState::Paused { since_ms: 10 }));
}

#[test]
fn a_full_catalog_refuses_another_stream() {
    let mut c = empty();
    for i in 0..MAX_STREAMS {
        c = created(&c, &format!("s{i}"));
    }
    let e = create(&c, "one-more", SPEC, 1).unwrap_err();
    assert!(e.to_string().contains("drop one first"), "{e}");
    assert_eq!(Catalog::decode(&c.encode()).unwrap(), c, "a full catalog still decodes");
}

#[test]
fn concurrent_changes_through_the_control_store_all_land() {
    let store: Arc<dyn ControlStore> = Arc::new(MemControl::new());
    let keys = Keys::new("c");
    let (one, two) = (ControlCatalog::new(store.clone(), &keys), ControlCatalog::new(store.clone(), &keys));
    // `two` changes the catalog between `one`'s read and its write: `one` reads again.
    let mut raced = false;
    let out = change(&one, |c| {
        if !raced {
            raced = true;
            change(&two, |c| create(c, "b", SPEC, 1).map(Some)).unwrap();
        }
        create(c, "a", SPEC, 2).map(Some)
    })
    .unwrap()
    .unwrap();
    assert_eq!(out.1.id, StreamId(2), "a sees b's id taken");
    let (c, _) = two.read().unwrap();
    let names: Vec<&str> = c.streams.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    // A change that changes nothing writes nothing.
    let rev = store.get(&keys.catalog()).unwrap().unwrap().mod_revision;
    assert!(change(&one, |_| Ok(None::<(Catalog, ())>)).unwrap().is_none());
    assert_eq!(store.get(&keys.catalog()).unwrap().unwrap().mod_revision, rev);
}

#[test]
fn a_damaged_catalog_in_the_control_store_is_refused_not_replaced() {
    let store: Arc<dyn ControlStore> = Arc::new(MemControl::new());
    let keys = Keys::new("c");
    let put = crate::control::Op::Put { key: keys.catalog(), value: b"WEIRCAT1junk".to_vec(), lease: None };
    store.txn(&[], &[put]).unwrap();
    let cat = ControlCatalog::new(store, &keys);
    let e = change(&cat, |c| create(c, "a", SPEC, 1).map(Some)).unwrap_err();
    assert!(matches!(e, CatalogError::Damaged { .. }) && !e.is_retryable(), "{e}");
}

#[test]
fn the_file_catalog_survives_a_restart_and_refuses_damage() {
    let dir = tempfile::tempdir().unwrap();
    let cat = FileCatalog::new(dir.path());
    assert_eq!(cat.read().unwrap(), (empty(), 0), "never written: revision 0");
    change(&cat, |c| create(c, "a", SPEC, 1).map(Some)).unwrap();
    change(&cat, |c| create(c, "b", SPEC, 1).map(Some)).unwrap();
    // A stale revision does not write.
    assert!(!cat.write(0, &empty()).unwrap());
    let again = FileCatalog::new(dir.path());
    assert_eq!(again.read().unwrap().1, 1, "written before: revision 1 on");
    let names: Vec<String> = again.read().unwrap().0.streams.into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["a", "b"]);
    let path = dir.path().join("catalog");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(FileCatalog::new(dir.path()).read(), Err(CatalogError::Damaged { .. })));
}

#[test]
fn the_config_files_stream_seeds_a_catalog_with_its_own_id() {
    let c = seed(5, "bench", StreamId(7), SPEC, 3).unwrap();
    assert_eq!((c.next_id, c.streams[0].id, c.streams[0].name.as_str()), (8, StreamId(7), "bench"));
    let c = seed(5, "zero", StreamId(0), SPEC, 3).unwrap();
    assert_eq!((c.next_id, c.lineage), (1, 5));
    assert!(seed(5, "../x", StreamId(1), SPEC, 3).is_err());
    // Every change keeps the lineage.
    let (c, _) = create(&c, "b", SPEC, 4).unwrap();
    let (c, _) = drop_stream(&c, "b", 5).unwrap();
    assert_eq!(forget(&c, StreamId(1)).unwrap().lineage, 5);
}

#[test]
fn a_dropped_streams_control_keys_go_and_no_other_streams() {
    let store = MemControl::new();
    let keys = Keys::new("c");
    let put = |k: String| Op::Put { key: k, value: b"x".to_vec(), lease: None };
    // More keys than one list (and one transaction) takes.
    let ops: Vec<Op> = (0..250)
        .map(|p| put(keys.in_sync(StreamId(2), p)))
        .chain([put(keys.placement(StreamId(2))), put(keys.placement(StreamId(20))), put(keys.catalog())])
        .collect();
    store.txn(&[], &ops).unwrap();
    assert_eq!(remove_stream_keys(&store, &keys, StreamId(2)).unwrap(), 251);
    let left: Vec<String> = store.list("/weir/c/", 100).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, [keys.catalog(), keys.placement(StreamId(20))]);
    assert_eq!(remove_stream_keys(&store, &keys, StreamId(2)).unwrap(), 0);
}
