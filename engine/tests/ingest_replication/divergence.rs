//! Copies that diverged from their primary's log (the primary lost a tail it had shipped, then
//! wrote other rows at those versions) are found and started afresh, whatever entry they end
//! with and whenever the primary's writer restarted.

use std::path::Path;
use std::time::Duration;

use super::*;

#[test]
fn a_copy_holding_a_tail_its_primary_lost_is_started_afresh_even_once_the_primary_wrote_past_it() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    // Shipped to the copy, then lost by the primary (unsynced, in a power loss): never
    // acknowledged to their producer.
    logs_with_a_lost_tail(a.path(), b.path(), 10, &[(2, 0, 7_000), (2, 1, 7_100), (2, 2, 7_200)]);
    // The primary takes new appends at the versions the copy's lost tail holds, and past them,
    // before the follower first answers.
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    for seq in 10..15 {
        append(&primary, 1, seq, rows(seq * 100, 100), false);
    }
    wait_written(&primary, 15 * 100);
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    for seq in 10..15 {
        assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(seq));
    }
    let out = all_rows(&follower);
    assert!(out == rows(0, 1500), "the copy holds the primary's rows, not the lost tail's");
    assert_eq!(follower.log(0).unwrap().producers(), primary.log(0).unwrap().producers());
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

#[test]
fn a_copy_diverged_at_an_entry_boundary_is_found_by_its_checksum_after_the_primary_restarted_without_it() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    // Batches 8 and 9 as the primary had shipped them before it lost them: other rows.
    logs_with_a_lost_tail(a.path(), b.path(), 8, &[(1, 8, 50_800), (1, 9, 50_900)]);
    // The primary writes batches 8 to 12 (the copy's last entry ends where its batch 9 does)
    // while the follower is away, and its writer starts again before the follower answers.
    let (primary, _acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    for seq in 8..13 {
        append(&primary, 1, seq, rows(seq * 100, 100), false);
    }
    wait_written(&primary, 13 * 100);
    drop(primary);
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 1, 13, rows(1300, 100), false);
    assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(13));
    let out = all_rows(&follower);
    assert!(out == rows(0, 1400), "the copy holds the primary's rows, not the lost tail's");
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

/// A primary's log in `a` of `shared` batches of producer 1 (100 rows each), and its follower's
/// copy in `b` of the same and then `lost`: (producer, sequence number, first row) of batches
/// the primary shipped and lost.
fn logs_with_a_lost_tail(a: &Path, b: &Path, shared: u64, lost: &[(u64, u64, u64)]) {
    for (dir, tail) in [(a, &[][..]), (b, lost)] {
        let mut log = IngestLog::open(&partition_dir(dir, 0), LogConfig::default()).unwrap();
        log.describe(1, b"{\"seed\":1}").unwrap();
        for seq in 0..shared {
            log.append_from(ProducerSeq { producer: 1, seq }, &rows(seq * 100, 100)).unwrap();
        }
        for &(producer, seq, first) in tail {
            if seq == 0 {
                log.describe(producer, b"{\"seed\":2}").unwrap();
            }
            log.append_from(ProducerSeq { producer, seq }, &rows(first, 100)).unwrap();
        }
        log.sync().unwrap();
    }
}

#[test]
fn a_copy_whose_last_entry_matches_but_not_the_rows_below_it_is_started_afresh() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    // The lost tail: producer 2's batch, then producer 1's batch 8.
    logs_with_a_lost_tail(a.path(), b.path(), 8, &[(2, 0, 7_000), (1, 8, 800)]);
    // After the loss, producer 3's batch takes versions 800..900 and producer 1 sends batch 8
    // again: at 900..1000, byte for byte the entry the copy ends with.
    let (primary, acks) = start(a.path(), PRIMARY, &net, Some(FOLLOWER));
    append(&primary, 3, 0, rows(9_000, 100), true);
    append(&primary, 1, 8, rows(800, 100), false);
    wait_written(&primary, 10 * 100);
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    for _ in 0..2 {
        assert!(acked(&acks, Duration::from_secs(10)).is_some());
    }
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}

#[test]
fn a_copy_whose_last_entry_matches_but_not_the_rows_below_it_is_started_afresh_after_the_primarys_writer_restarted() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let net = Net::default();
    logs_with_a_lost_tail(a.path(), b.path(), 8, &[(2, 0, 7_000), (1, 8, 800)]);
    // As above, and batch 9 past them, in segments of one entry each (an entry of 100 rows
    // from a producer takes 2,440 bytes: the entry that differs is a segment below the copy's
    // last); then the primary's writer starts again before the follower first answers, so the
    // copy ends below where this run began.
    let small = LogConfig { segment_bytes: 2_000, ..LogConfig::default() };
    let ms = Duration::from_millis(5);
    let (primary, _) = start_with(a.path(), PRIMARY, &net, Some(FOLLOWER), ms, small);
    append(&primary, 3, 0, rows(9_000, 100), true);
    append(&primary, 1, 8, rows(800, 100), false);
    append(&primary, 1, 9, rows(900, 100), false);
    wait_written(&primary, 11 * 100);
    drop(primary);
    let (primary, acks) = start_with(a.path(), PRIMARY, &net, Some(FOLLOWER), ms, small);
    let (follower, _) = start(b.path(), FOLLOWER, &net, None);
    append(&primary, 1, 10, rows(1_000, 100), false);
    assert_eq!(acked(&acks, Duration::from_secs(10)).map(|a| a.0), Some(10));
    let (ours, copy) = (all_rows(&primary), all_rows(&follower));
    assert!(ours == copy, "the copy holds rows the primary lost instead of producer 3's");
    drop((primary, follower));
    assert_eq!(log_bytes(a.path()), log_bytes(b.path()), "the copies differ");
}
