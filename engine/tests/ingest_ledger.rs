//! The ingest log's ledger on a real file system: what each producer appended (its description,
//! rows, batches, end) counted once per batch, across reopening and retention; damage refused.

use std::time::Duration;

use weir_engine::ingest::ledger::MAX_DESCRIPTION;
use weir_engine::ingest::segment::ProducerSeq;
use weir_engine::ingest::service::partition_dir;
use weir_engine::ingest::*;
use weir_engine::wire::{Batch, Version};

fn rows(first: u64, n: usize) -> Batch {
    let mut b = Batch::with_capacity(n);
    for v in first..first + n as u64 {
        b.push(v as i64, v, v as f64);
    }
    b
}

fn from(producer: u64, seq: u64) -> ProducerSeq {
    ProducerSeq { producer, seq }
}

fn record(
    producer: u64,
    description: &[u8],
    first: u64,
    rows: u64,
    batches: u64,
    ended: Option<i64>,
) -> ProducerRecord {
    ProducerRecord { producer, description: description.to_vec(), first: Version(first), rows, batches, ended }
}

#[test]
fn the_ledger_counts_each_batch_once_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&rows(0, 2)).unwrap(); // rows of no producer: not in the ledger
    log.describe(1, b"load one").unwrap();
    log.append_from(from(1, 0), &rows(2, 5)).unwrap();
    // Sent again (and described again): counted once, the first description kept.
    log.describe(1, b"something else").unwrap();
    assert!(matches!(log.append_from(from(1, 0), &rows(2, 5)).unwrap(), AppendOutcome::Duplicate(..)));
    log.append_from(from(2, 0), &rows(7, 4)).unwrap(); // no description
    log.append_from(from(1, 1), &rows(11, 3)).unwrap();
    log.append_marker(500).unwrap();
    log.end_load(1, 500).unwrap();
    log.end_load(9, 1).unwrap(); // unknown: nothing recorded
    let want = vec![record(1, b"load one", 2, 8, 2, Some(500)), record(2, b"", 7, 4, 1, None)];
    assert_eq!(log.producers(), want);
    assert_eq!(log.handle().producers(), want);
    log.sync().unwrap();
    drop(log);
    let log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.producers(), want, "rebuilt from the ledger file and the entries, nothing counted twice");
}

#[test]
fn the_ledger_outlives_the_segments_retention_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 1024, ..LogConfig::default() };
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    log.describe(7, br#"{"seed":1}"#).unwrap();
    let mut v = 0;
    for seq in 0..40 {
        log.append_from(from(7, seq), &rows(v, 10)).unwrap();
        v += 10;
    }
    log.sync().unwrap();
    let kept = log.truncate_below(Version(300)).unwrap();
    assert!(kept > Version(0), "segments were deleted");
    drop(log);
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    assert_eq!(log.producers(), vec![record(7, br#"{"seed":1}"#, 0, 400, 40, None)]);
    // It counts on from there.
    log.append_from(from(7, 40), &rows(v, 10)).unwrap();
    assert_eq!(log.producers()[0].rows, 410);
}

#[test]
fn a_damaged_ledger_is_refused_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    log.describe(3, b"three").unwrap();
    log.describe(4, b"four").unwrap();
    drop(log);
    // The first of two journal records damaged: not a torn tail, refused.
    let path = dir.path().join("ledger.journal");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let err = IngestLog::open(dir.path(), LogConfig::default()).unwrap_err();
    assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
fn a_description_too_long_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    let err = log.describe(1, &vec![b'x'; MAX_DESCRIPTION + 1]).unwrap_err();
    assert!(matches!(err, LogError::Refused { .. }) && !err.is_retryable(), "{err}");
    assert!(log.producers().is_empty());
}

#[test]
fn the_writer_records_a_description_with_the_first_batch_and_the_end_with_the_marker() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, acks) = crossbeam_channel::unbounded();
    let svc = IngestService::start(dir.path(), 2, LogConfig::default(), SyncPolicy::EveryAppend, tx).unwrap();
    let send = |seq: u64, batch: Batch, watermark: Option<i64>, describe: Option<&[u8]>| {
        svc.requests()
            .send(AppendRequest {
                partition: 1,
                batch,
                from: Some(from(5, seq)),
                watermark,
                describe: describe.map(<[u8]>::to_vec),
                token: seq,
            })
            .unwrap();
        let a = acks.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(a.result.is_ok(), "{:?}", a.result);
    };
    send(0, rows(0, 10), None, Some(b"five"));
    send(1, rows(10, 10), None, Some(b"ignored: not the first batch"));
    send(2, Batch::default(), Some(1234), None);
    assert_eq!(svc.log(1).unwrap().producers(), vec![record(5, b"five", 0, 20, 2, Some(1234))]);
    assert!(svc.log(0).unwrap().producers().is_empty());
    drop(svc);
    let log = IngestLog::open(&partition_dir(dir.path(), 1), LogConfig::default()).unwrap();
    assert_eq!(log.producers(), vec![record(5, b"five", 0, 20, 2, Some(1234))]);
}
