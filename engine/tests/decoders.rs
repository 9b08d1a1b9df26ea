//! Every decoder of bytes from the store or the disk, fed random bytes and random damage to valid
//! encodings: none panics, each answers a value or a clear error, and what a damaged record
//! decodes to is never taken silently where its checksum says otherwise. (Frames from sockets
//! have theirs in `wire/tests/frames.rs`.)

use std::collections::BTreeMap;

use proptest::prelude::*;
use weir_engine::backup::ahead::{decode_record, encode_record};
use weir_engine::backup::commit::{decode_commit, decode_ids, encode_commit, encode_ids};
use weir_engine::backup::*;
use weir_engine::checkpoint::{CommitRecord, IdRecord};
use weir_engine::cluster::PlacementRecord;
use weir_engine::cluster::record::{decode_placement, encode_placement};
use weir_engine::ingest::segment::{Parsed, encode_entry, parse_entry};
use weir_engine::ingest::{IngestLog, LogConfig};
use weir_engine::wire::{Batch, CheckpointId, NodeId, TaskId, TransId, Version};

/// A valid encoding of each record kind.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        id: CheckpointId(7),
        version: Version(100),
        files: vec![ManifestEntry {
            name: "000012.sst".into(),
            key: "1/tasks/2/sst/000012-ab.sst".into(),
            size: 4096,
            crc: 0xabcd,
        }],
        offsets: vec![(CheckpointId(6), Version(90))],
        outputs: Vec::new(),
        replay: Some(ReplayPoint {
            from: CheckpointId(5),
            taken: vec![(10, 20)],
            written: vec![0],
            ..Default::default()
        }),
    };
    let mut commit = CommitRecord::consensus(CheckpointId(9), CheckpointId(7), 1234);
    commit.manifests.insert(TaskId(1), 0xfeed);
    let placement = PlacementRecord {
        version: 2,
        tasks: BTreeMap::from([(TaskId(0), NodeId(1)), (TaskId(1), NodeId(2))]),
        moved: vec![NodeId(3)],
        reason: "node 3 lost".into(),
        ts: 99,
    };
    vec![
        ("manifest", manifest.encode().into_bytes()),
        ("commit", encode_commit(&commit).into_bytes()),
        ("ids", encode_ids(&IdRecord { next_id: CheckpointId(10), next_trans: TransId(4) }).into_bytes()),
        ("placement", encode_placement(&placement).into_bytes()),
        ("ahead", encode_record(&["1/tasks/2/sst/a.sst".to_string()]).into_bytes()),
    ]
}

/// Decodes `bytes` as the record `kind`: what it decoded to (as `Debug` text), or the error's.
fn decode(kind: &str, bytes: &[u8]) -> Result<String, String> {
    fn shown<T: std::fmt::Debug>(r: Result<T, StoreError>) -> Result<String, String> {
        r.map(|v| format!("{v:?}")).map_err(|e| e.to_string())
    }
    match kind {
        "manifest" => shown(Manifest::decode("k", bytes)),
        "commit" => shown(decode_commit("k", bytes)),
        "ids" => shown(decode_ids("k", bytes)),
        "placement" => shown(decode_placement("1/placement", bytes)),
        "ahead" => shown(decode_record("k", bytes)),
        _ => unreachable!(),
    }
}

fn batch(n: usize) -> Batch {
    let mut b = Batch::with_capacity(n);
    for i in 0..n {
        b.push(i as i64, i as u64 * 7, i as f64);
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_a_record_decoder(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        for (kind, _) in samples() {
            if let Err(e) = decode(kind, &bytes) {
                // Random bytes fail as a damaged object, naming it.
                prop_assert!(e.contains("corrupt object k") || e.contains("corrupt object 1/placement"), "{}: {}", kind, e);
            }
        }
    }

    #[test]
    fn damaged_records_are_refused_with_a_reason(pos in 0usize..4096, val in any::<u8>(), cut in 0usize..4096) {
        for (kind, good) in samples() {
            let want = decode(kind, &good);
            prop_assert!(want.is_ok(), "{} sample does not decode", kind);
            let mut b = good.clone();
            let p = pos % b.len();
            b[p] = val;
            match decode(kind, &b) {
                // Only what the checksum does not cover may change (the final newline, the case
                // of the checksum's hex digits), and then the record means the same.
                Ok(got) => prop_assert_eq!(Ok(got), want.clone(), "{}: a damaged record decoded", kind),
                Err(e) => prop_assert!(e.contains("corrupt"), "{}: {}", kind, e),
            }
            // Cut short: refused, unless only the final newline went.
            let c = cut % good.len();
            prop_assert!(
                decode(kind, &good[..c]).is_err() || good[c..].iter().all(u8::is_ascii_whitespace),
                "{}: a truncated record decoded", kind
            );
        }
    }

    #[test]
    fn random_bytes_never_panic_the_entry_parser(bytes in prop::collection::vec(any::<u8>(), 0..512), max in 0usize..1024) {
        match parse_entry(&bytes, max) {
            Parsed::Corrupt(why) => {
                prop_assert!(["inconsistent", "unknown", "marker", "checksum"].iter().any(|w| why.contains(w)), "{}", why)
            }
            Parsed::Entry { len, .. } => prop_assert!(len <= bytes.len()),
            Parsed::Incomplete => {}
        }
    }

    #[test]
    fn damaged_entries_are_refused(rows in 1usize..40, pos in 0usize..2048, val in any::<u8>()) {
        let mut good = Vec::new();
        encode_entry(Version(5), &batch(rows), None, &mut good);
        let mut b = good.clone();
        let p = pos % b.len();
        b[p] = val;
        match parse_entry(&b, 1 << 20) {
            Parsed::Entry { .. } => prop_assert_eq!(b, good),
            Parsed::Corrupt(_) | Parsed::Incomplete => prop_assert_ne!(b, good),
        }
    }
}

proptest! {
    // Each case opens a log on the file system: fewer of them.
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_ledger_and_journal_files_open_or_are_refused(
        ledger in prop::option::of(prop::collection::vec(any::<u8>(), 0..256)),
        journal in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(l) = &ledger {
            std::fs::write(dir.path().join("ledger"), l).unwrap();
        }
        std::fs::write(dir.path().join("ledger.journal"), &journal).unwrap();
        match IngestLog::open(dir.path(), LogConfig::default()) {
            Ok(log) => prop_assert!(log.producers().len() <= journal.len() / 8 + 1),
            Err(e) => prop_assert!(e.to_string().contains("ledger"), "{}", e),
        }
    }

    #[test]
    fn a_random_or_damaged_chain_anchor_opens_or_is_refused(
        bytes in prop::collection::vec(any::<u8>(), 0..32),
        flip in prop::option::of((0usize..16, 1u8..)),
    ) {
        // A log truncated to its second segment: its anchor names where it begins.
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig { segment_bytes: 1_000, ..LogConfig::default() };
        let mut log = IngestLog::open(dir.path(), cfg).unwrap();
        for _ in 0..3 {
            log.append(&batch(50)).unwrap();
            log.sync().unwrap();
        }
        let first = log.truncate_below(Version(50)).unwrap();
        drop(log);
        let path = dir.path().join("chain");
        let anchor = match flip {
            // The real anchor with one byte changed: its checksum refuses it.
            Some((at, x)) => {
                let mut b = std::fs::read(&path).unwrap();
                b[at] ^= x;
                b
            }
            None => bytes,
        };
        std::fs::write(&path, &anchor).unwrap();
        match IngestLog::open(dir.path(), cfg) {
            // Random bytes that pass the checksum name some version: the log opens as it was.
            Ok(log) => prop_assert_eq!(log.first_version(), first),
            Err(e) => prop_assert!(e.to_string().contains("chain anchor"), "{}", e),
        }
    }

    #[test]
    fn a_damaged_journal_record_is_cut_at_the_tail_or_refused(pos in 0usize..400, val in any::<u8>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
        for p in 0..4u64 {
            log.describe(p, format!("producer {p}").as_bytes()).unwrap();
        }
        drop(log);
        let path = dir.path().join("ledger.journal");
        let good = std::fs::read(&path).unwrap();
        let mut b = good.clone();
        let p = pos % b.len();
        b[p] = val;
        std::fs::write(&path, &b).unwrap();
        // Damage is never taken for a torn tail: all four producers, or a refusal.
        match IngestLog::open(dir.path(), LogConfig::default()) {
            Ok(log) => {
                prop_assert_eq!(&b, &good);
                prop_assert_eq!(log.producers().len(), 4);
            }
            Err(e) => prop_assert!(e.to_string().contains("journal record"), "{}", e),
        }
    }
}
