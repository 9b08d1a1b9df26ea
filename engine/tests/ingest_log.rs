//! The ingest log on a real file system: appends, reads from any version, retention, torn tails,
//! corruption, group commit, idempotent appends per producer, and a child process killed with
//! `kill -9` mid-append.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir_engine::ingest::ledger::{MAX_DESCRIPTION, MAX_LEDGER_BYTES};
use weir_engine::ingest::segment::{ENTRY_HEADER, ProducerSeq, ROW_BYTES, segment_path};
use weir_engine::ingest::service::partition_dir;
use weir_engine::ingest::*;
use weir_engine::wire::{Batch, Version};

/// Deterministic content: row `v` of the log is derived from `v`.
fn rows(first: u64, n: usize) -> Batch {
    let mut b = Batch::with_capacity(n);
    for v in first..first + n as u64 {
        b.push(v as i64 * 3, v.wrapping_mul(0x9E37_79B9), v as f64 / 4.0);
    }
    b
}

fn read_all(log: &IngestLog, from: u64) -> Batch {
    let mut r = log.reader(Version(from)).unwrap();
    let mut out = Batch::default();
    while r.read(10_000, &mut out).unwrap() > 0 {}
    out
}

#[test]
fn appended_rows_read_back_from_any_version() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 4096, ..LogConfig::default() };
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    let mut v = 0;
    for n in [1usize, 50, 7, 300, 2, 99] {
        assert_eq!(log.append(&rows(v, n)).unwrap(), Some((Version(v), Version(v + n as u64 - 1))));
        v += n as u64;
    }
    assert_eq!(log.append(&Batch::default()).unwrap(), None);
    // Readers see only what is durable (rolling a segment syncs; the last appends are not yet).
    assert!(log.durable_version() < Version(v));
    assert_eq!(read_all(&log, 0).len() as u64, log.durable_version().0);
    assert_eq!(log.sync().unwrap(), Version(v));
    assert_eq!(read_all(&log, 0), rows(0, v as usize));
    for from in [1, 51, 57, 200, 358, 458, v] {
        assert_eq!(read_all(&log, from), rows(from, (v - from) as usize), "from {from}");
    }
    assert!(matches!(log.reader(Version(v + 1)), Err(LogError::OutOfRange { .. })));
    // Reopen: same content, versions continue.
    drop(log);
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    assert_eq!(log.next_version(), Version(v));
    assert_eq!(log.append(&rows(v, 10)).unwrap(), Some((Version(v), Version(v + 9))));
    log.sync().unwrap();
    assert_eq!(read_all(&log, 0), rows(0, v as usize + 10));
}

#[test]
fn truncation_drops_whole_segments_below_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 2048, ..LogConfig::default() };
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    for i in 0..20 {
        log.append(&rows(i * 50, 50)).unwrap();
    }
    log.sync().unwrap();
    let first = log.truncate_below(Version(500)).unwrap();
    assert!(first <= Version(500) && first > Version(0), "kept from {first}");
    assert_eq!(read_all(&log, 500), rows(500, 500));
    assert!(matches!(log.reader(Version(0)), Err(LogError::OutOfRange { .. })));
    drop(log);
    let log = IngestLog::open(dir.path(), cfg).unwrap();
    assert_eq!((log.first_version(), log.next_version()), (first, Version(1000)));
}

#[test]
fn torn_tail_is_cut_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&rows(0, 10)).unwrap();
    log.append(&rows(10, 10)).unwrap();
    log.sync().unwrap();
    drop(log);
    // A crash in the middle of the third append: half an entry at the end.
    let seg = segment_path(dir.path(), Version(0));
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    let mut torn = Vec::new();
    weir_engine::ingest::segment::encode_entry(Version(20), &rows(20, 10), None, &mut torn);
    f.write_all(&torn[..torn.len() / 2]).unwrap();
    drop(f);
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.next_version(), Version(20));
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, 2 * (ENTRY_HEADER + 10 * ROW_BYTES));
    log.append(&rows(20, 5)).unwrap();
    log.sync().unwrap();
    assert_eq!(read_all(&log, 0), rows(0, 25));
}

#[test]
fn damage_before_the_tail_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    for i in 0..3 {
        log.append(&rows(i * 10, 10)).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let seg = segment_path(dir.path(), Version(0));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[ENTRY_HEADER + 5] ^= 0xFF; // inside the first entry's payload; two good entries follow
    std::fs::write(&seg, &bytes).unwrap();
    match IngestLog::open(dir.path(), LogConfig::default()) {
        Err(e @ LogError::Corrupt { offset: 0, .. }) => assert!(!e.is_retryable()),
        other => panic!("expected corruption at offset 0, got {other:?}"),
    }
    // Nothing was cut.
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);
}

#[test]
fn group_commit_acknowledges_only_durable_rows_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, acks) = crossbeam_channel::unbounded();
    let svc = IngestService::start(
        dir.path(),
        2,
        LogConfig::default(),
        SyncPolicy::GroupCommit(Duration::from_millis(10)),
        tx,
    )
    .unwrap();
    for i in 0..100u64 {
        let p = (i % 2) as u32;
        svc.requests()
            .send(AppendRequest {
                partition: p,
                batch: rows(i / 2 * 10, 10),
                from: None,
                watermark: None,
                describe: None,
                token: i,
            })
            .unwrap();
    }
    svc.requests()
        .send(AppendRequest {
            partition: 7,
            batch: rows(0, 1),
            from: None,
            watermark: None,
            describe: None,
            token: 999,
        })
        .unwrap();
    let mut next = [0u64; 2];
    let mut got = 0;
    while got < 101 {
        let a = acks.recv_timeout(Duration::from_secs(10)).unwrap();
        got += 1;
        if a.token == 999 {
            let e = a.result.unwrap_err();
            assert!(matches!(e, AppendFailure::NoPartition { partition: 7, .. }) && !e.is_retryable(), "{e}");
            continue;
        }
        let (first, last) = a.result.unwrap().unwrap();
        let p = a.partition as usize;
        assert_eq!((first, last), (Version(next[p]), Version(next[p] + 9)));
        // Acknowledged means readable (durable) already.
        assert!(svc.log(a.partition).unwrap().durable_version() > last);
        next[p] += 10;
    }
    assert_eq!(next, [500, 500]);
    let mut r = svc.log(1).unwrap().reader(Version(0));
    let mut b = Batch::default();
    while r.read(1000, &mut b).unwrap() > 0 {}
    assert_eq!(b, rows(0, 500));
}

/// Child side of the crash test: appends forever with `EveryAppend` and prints each acknowledged
/// range. Run only by `acknowledged_entries_survive_kill_9`.
#[test]
#[ignore = "child process of acknowledged_entries_survive_kill_9"]
fn crash_child_appender() {
    let dir = std::env::var("WEIR_CRASH_DIR").expect("run by the crash test");
    let (tx, acks) = crossbeam_channel::unbounded();
    let svc = IngestService::start(
        dir.as_ref(),
        1,
        LogConfig { segment_bytes: 256 << 10, ..LogConfig::default() },
        SyncPolicy::EveryAppend,
        tx,
    )
    .unwrap();
    let mut v = 0u64;
    let mut out = std::io::stdout().lock();
    // Restarted children continue where the log ends.
    let start = svc.log(0).unwrap().durable_version().0;
    v += start;
    loop {
        let n = 1 + (v % 97) as usize;
        svc.requests()
            .send(AppendRequest {
                partition: 0,
                batch: rows(v, n),
                from: None,
                watermark: None,
                describe: None,
                token: v,
            })
            .unwrap();
        v += n as u64;
        while let Ok(a) = acks.try_recv() {
            let (_, last) = a.result.unwrap().unwrap();
            writeln!(out, "acked {}", last.0).unwrap();
            out.flush().unwrap();
        }
    }
}

#[test]
fn acknowledged_entries_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acked = 0u64;
    let mut seed = 0x1234_5678u64;
    for round in 0..5 {
        let mut child = Command::new(&exe)
            .args(["crash_child_appender", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("WEIR_CRASH_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let kill_after = 20 + (seed % 200) as usize; // acknowledgements before the kill
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < kill_after && Instant::now() < deadline {
            let line = lines.next().expect("child alive").unwrap();
            if let Some(v) = line.strip_prefix("acked ") {
                acked = acked.max(v.parse::<u64>().unwrap() + 1);
                seen += 1;
            }
        }
        // `Child::kill` is SIGKILL on Unix: no destructor, flush or sync runs in the child.
        child.kill().unwrap();
        let _ = child.wait();
        // Everything acknowledged is there, intact; a torn tail (if any) is cut on open.
        let log = IngestLog::open(
            &partition_dir(dir.path(), 0),
            LogConfig { segment_bytes: 256 << 10, ..LogConfig::default() },
        )
        .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        assert!(
            log.next_version().0 >= acked,
            "round {round}: acked up to {acked}, log ends at {}",
            log.next_version()
        );
        let all = read_all(&log, 0);
        assert_eq!(all, rows(0, all.len()), "round {round}: content differs");
    }
    assert!(acked > 100);
}

fn from(producer: u64, seq: u64) -> ProducerSeq {
    ProducerSeq { producer, seq }
}

#[test]
fn a_batch_sent_again_is_stored_once_and_answered_with_its_original_versions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 2048, ..LogConfig::default() };
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    // Two producers interleaved on one partition, 30 batches each of 10 rows.
    let mut stored = 0u64;
    let mut versions = std::collections::HashMap::new();
    for i in 0..60u64 {
        let (p, seq) = (i % 2, i / 2);
        let b = rows(stored, 10);
        let AppendOutcome::New(Some(v)) = log.append_from(from(p, seq), &b).unwrap() else { panic!("not stored") };
        versions.insert((p, seq), v);
        stored += 10;
        // Every batch sent again right away, and an older one: answered, not stored.
        for again in [seq, seq / 2] {
            let (f, l) = versions[&(p, again)];
            assert_eq!(log.append_from(from(p, again), &b).unwrap(), AppendOutcome::Duplicate(f, l));
        }
    }
    log.sync().unwrap();
    assert_eq!(read_all(&log, 0), rows(0, stored as usize));
    // After a restart the log knows its producers from the entries alone.
    drop(log);
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    let (f, l) = versions[&(1, 29)];
    assert_eq!(log.append_from(from(1, 29), &rows(0, 10)).unwrap(), AppendOutcome::Duplicate(f, l));
    assert_eq!(log.append_from(from(0, 3), &rows(0, 10)).unwrap().versions(), Some(versions[&(0, 3)]));
    // And after retention deleted the segments holding them (the `producers` file).
    assert!(log.truncate_below(Version(590)).unwrap() > Version(300));
    drop(log);
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    assert_eq!(log.append_from(from(0, 3), &rows(0, 10)).unwrap().versions(), Some(versions[&(0, 3)]));
    // The next batch of a producer is stored where the log ends.
    assert_eq!(
        log.append_from(from(0, 30), &rows(600, 10)).unwrap(),
        AppendOutcome::New(Some((Version(600), Version(609))))
    );
    // A new producer starts at 0.
    assert!(matches!(log.append_from(from(7, 0), &rows(610, 1)).unwrap(), AppendOutcome::New(Some(_))));
}

#[test]
fn a_sequence_gap_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    // A producer's first batch is batch 0.
    match log.append_from(from(5, 1), &rows(0, 10)) {
        Err(e @ LogError::SequenceGap { producer: 5, expected: 0, got: 1 }) => {
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("expected 0"), "{e}");
        }
        other => panic!("a gap was accepted: {other:?}"),
    }
    log.append_from(from(5, 0), &rows(0, 10)).unwrap();
    assert!(matches!(log.append_from(from(5, 2), &rows(10, 10)), Err(LogError::SequenceGap { expected: 1, .. })));
    assert_eq!(log.next_version(), Version(10));
    // An empty batch takes no sequence number.
    assert_eq!(log.append_from(from(5, 1), &Batch::default()).unwrap(), AppendOutcome::New(None));
    assert!(matches!(log.append_from(from(5, 1), &rows(10, 10)).unwrap(), AppendOutcome::New(Some(_))));
    // Older than what is remembered: refused, since whether it was stored cannot be told.
    for seq in 2..DEDUP_WINDOW as u64 + 3 {
        log.append_from(from(5, seq), &rows(0, 1)).unwrap();
    }
    assert!(matches!(log.append_from(from(5, 1), &rows(0, 1)), Err(LogError::TooOld { producer: 5, got: 1 })));
}

#[test]
fn an_entry_with_unknown_flags_is_refused_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    log.append_from(from(1, 0), &rows(0, 10)).unwrap();
    log.append(&rows(10, 10)).unwrap();
    log.append_from(from(1, 1), &rows(20, 10)).unwrap();
    log.sync().unwrap();
    assert_eq!(read_all(&log, 0), rows(0, 30));
    drop(log);
    let seg = segment_path(dir.path(), Version(0));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[20] = 3; // the first entry's flags: a format this version does not know
    std::fs::write(&seg, &bytes).unwrap();
    match IngestLog::open(dir.path(), LogConfig::default()) {
        Err(LogError::Corrupt { offset: 0, reason, .. }) => assert!(reason.contains("flags"), "{reason}"),
        other => panic!("expected the unknown entry refused, got {other:?}"),
    }
}

#[test]
fn a_watermark_marker_takes_a_version_and_a_replay_meets_it_between_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&rows(0, 10)).unwrap();
    assert_eq!(log.append_marker(12_345).unwrap(), Version(10));
    assert_eq!(log.append(&rows(10, 5)).unwrap(), Some((Version(11), Version(15))));
    log.sync().unwrap();
    let mut r = log.reader(Version(0)).unwrap();
    let mut b = Batch::default();
    // A read stops after the marker, with the rows before it.
    assert_eq!(r.read_marked(100, &mut b).unwrap(), LogRead { rows: 10, watermark: Some(12_345) });
    assert_eq!((b.len(), r.position()), (10, Version(11)));
    assert_eq!(r.read_marked(100, &mut b).unwrap(), LogRead { rows: 5, watermark: None });
    // A reader restored at the marker's version meets it; one restored after it does not.
    let mut at = r.reopen_at(Version(10));
    assert_eq!(at.read_marked(100, &mut Batch::default()).unwrap().watermark, Some(12_345));
    let mut after = r.reopen_at(Version(11));
    assert_eq!(after.read_marked(100, &mut Batch::default()).unwrap(), LogRead { rows: 5, watermark: None });
    // `read` reads past markers; the rows are the rows.
    let mut all = Batch::default();
    log.reader(Version(0)).unwrap().read(100, &mut all).unwrap();
    let mut want = rows(0, 10);
    for r in rows(10, 5).rows() {
        want.push(r.ts, r.key, r.value);
    }
    assert_eq!(all, want);
    // Reopened, the log continues after the marker.
    drop(log);
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.next_version(), Version(16));
    assert_eq!(log.append_marker(1).unwrap(), Version(16));
}

#[test]
fn a_new_producer_appends_to_the_ledger_journal_and_a_reopened_log_knows_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::default();
    let mut log = IngestLog::open(dir.path(), cfg).unwrap();
    let journal = dir.path().join("ledger.journal");
    let mut sizes = Vec::new();
    for p in 0..200u64 {
        log.describe(p, format!("{{\"load\":{p}}}").as_bytes()).unwrap();
        log.append_from(from(p, 0), &rows(p * 2, 2)).unwrap();
        sizes.push(std::fs::metadata(&journal).unwrap().len());
    }
    // Each producer cost one record of its own size: the journal grows by the same step, and
    // the ledger file was never rewritten.
    let steps: std::collections::BTreeSet<u64> = sizes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(steps.len() <= 3 && steps.iter().all(|s| *s < 100), "journal steps {steps:?}");
    assert!(!dir.path().join("ledger").exists(), "a new producer rewrote the ledger file");
    log.end_load(7, 12_345).unwrap();
    log.sync().unwrap();
    drop(log);
    let whole = std::fs::metadata(&journal).unwrap().len();
    // A torn last record (a crash mid-append) is cut off; everything before it is kept.
    let mut f = OpenOptions::new().append(true).open(&journal).unwrap();
    f.write_all(&[40, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(f);
    let log = IngestLog::open(dir.path(), cfg).unwrap();
    let recs = log.producers();
    assert_eq!(recs.len(), 200);
    assert_eq!(recs[7].description, b"{\"load\":7}");
    assert_eq!((recs[7].rows, recs[7].ended), (2, Some(12_345)));
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), whole, "the torn tail was not cut");
    // Pages of the ledger: each bounded, together the whole of it, in order.
    let (mut all, mut at) = (Vec::new(), Some(0));
    while let Some(from) = at {
        let (page, next) = log.producers_page(from, 1000);
        assert!(!page.is_empty() && page.len() < 60, "{}", page.len());
        all.extend(page);
        at = next;
    }
    assert_eq!(all, recs);
}

#[test]
fn descriptions_past_the_ledgers_bound_are_refused_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).unwrap();
    let big = vec![b'x'; MAX_DESCRIPTION];
    let fit = MAX_LEDGER_BYTES / MAX_DESCRIPTION;
    for p in 0..fit as u64 {
        log.describe(p, &big).unwrap();
    }
    let err = log.describe(fit as u64, &big).unwrap_err();
    assert!(err.to_string().contains("ledger is full"), "{err}");
    // Known producers and small ones still go on.
    log.describe(3, &big).unwrap();
    log.append_from(from(3, 0), &rows(0, 5)).unwrap();
    log.describe(fit as u64 + 1, b"").unwrap();
}
