//! The chained checksum of a partition's log: one value that stands for every entry up to a
//! version, so that a primary can tell from a copy's answer alone whether the copy holds its
//! entries, all of them, not just the last (as Raft's log matching does with terms).
//!
//! The chain after an entry is the CRC32C of the entry's own checksum (its header's, as
//! written) seeded with the chain before it; the chain before version 0 is 0. Entries stay
//! byte for byte what they were: the chain lives beside them. A log whose older segments went
//! (retention, or a copy started again at its primary's first version) keeps the chain before
//! its first version in its `chain` file (its anchor), written before the segments below it are
//! deleted.
//!
//! Invariants: two logs whose chains agree at a version hold the same entries below it (but
//! for a CRC32C collision at the first entry where they differ: the map from the chain before
//! an entry to the chain after it is a bijection for a given entry checksum, so a difference
//! never cancels out later); a segment's seed is the chain before its first version.

use std::fs;
use std::io;
use std::path::Path;

use weir_wire::Version;

use super::log::{LogError, io_err, sync_dir};
use super::sealed::{read_sealed, write_sealed};

/// The file that keeps the chain before the log's first version.
const ANCHOR_FILE: &str = "chain";
/// Bytes of the anchor: version, seed, CRC32C of both.
const ANCHOR_BYTES: usize = 16;

/// The chain after an entry whose checksum is `entry_crc`, from the chain `before` it.
#[inline]
pub fn chained(before: u32, entry_crc: u32) -> u32 {
    crc32c::crc32c_append(before, &entry_crc.to_le_bytes())
}

/// Writes the anchor: the chain before `first` is `seed` (a new file renamed over the old one,
/// both synced).
pub(super) fn write_anchor(dir: &Path, first: Version, seed: u32) -> Result<(), LogError> {
    let mut out = Vec::with_capacity(ANCHOR_BYTES);
    out.extend_from_slice(&first.0.to_le_bytes());
    out.extend_from_slice(&seed.to_le_bytes());
    write_sealed(dir, ANCHOR_FILE, out)
}

/// Removes the anchor (and syncs the directory): what is left has none.
pub(super) fn remove_anchor(dir: &Path) -> Result<(), LogError> {
    let path = dir.join(ANCHOR_FILE);
    match fs::remove_file(&path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// The anchor (first version, seed), `None` when there is none; a damaged one is corruption.
pub(super) fn read_anchor(dir: &Path) -> Result<Option<(Version, u32)>, LogError> {
    let Some(body) = read_sealed(dir, ANCHOR_FILE, "the chain anchor")? else { return Ok(None) };
    if body.len() != ANCHOR_BYTES - 4 {
        let reason = "the chain anchor is not 16 bytes".into();
        return Err(LogError::Corrupt { path: dir.join(ANCHOR_FILE), offset: 0, reason });
    }
    let first = Version(u64::from_le_bytes(body[..8].try_into().expect("8 bytes")));
    Ok(Some((first, u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_anchor_reads_back_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_anchor(dir.path()).unwrap(), None);
        write_anchor(dir.path(), Version(1234), 0xdead_beef).unwrap();
        assert_eq!(read_anchor(dir.path()).unwrap(), Some((Version(1234), 0xdead_beef)));
        let path = dir.path().join(ANCHOR_FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[9] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(read_anchor(dir.path()), Err(LogError::Corrupt { .. })));
        fs::write(&path, &bytes[..15]).unwrap();
        assert!(matches!(read_anchor(dir.path()), Err(LogError::Corrupt { .. })));
    }

    fn batch(first: u64) -> weir_wire::Batch {
        let mut b = weir_wire::Batch::with_capacity(100);
        (first..first + 100).for_each(|v| b.push(v as i64, v, 0.5));
        b
    }

    #[test]
    fn a_truncated_log_keeps_its_chain_across_reopening_and_a_cut_short_truncation_is_finished() {
        use crate::ingest::{IngestLog, LogConfig};
        let dir = tempfile::tempdir().unwrap();
        // An entry of 100 rows takes 2,424 bytes: a segment each.
        let cfg = LogConfig { segment_bytes: 2_000, ..LogConfig::default() };
        let mut log = IngestLog::open(dir.path(), cfg).unwrap();
        for i in 0..6 {
            log.append(&batch(i * 100)).unwrap();
        }
        log.sync().unwrap();
        let chain = |log: &IngestLog, at: u64| log.chain_ending_at(Version(at)).unwrap();
        let (at_300, at_400, at_600) = (chain(&log, 300), chain(&log, 400), chain(&log, 600));
        assert!(at_300.is_some() && at_300 != chain(&log, 200) && chain(&log, 250).is_none());
        assert_eq!(log.truncate_below(Version(300)).unwrap(), Version(300));
        assert_eq!((log.first_chain(), chain(&log, 600)), (at_300.unwrap(), at_600));
        drop(log);
        let log = IngestLog::open(dir.path(), cfg).unwrap();
        assert_eq!(log.first_version(), Version(300));
        assert_eq!((Some(log.first_chain()), chain(&log, 400), chain(&log, 600)), (at_300, at_400, at_600));
        // A truncation to 500 whose anchor was written but whose segments were not yet deleted.
        write_anchor(dir.path(), Version(500), chain(&log, 500).unwrap()).unwrap();
        drop(log);
        let log = IngestLog::open(dir.path(), cfg).unwrap();
        assert_eq!((log.first_version(), chain(&log, 600)), (Version(500), at_600));
    }

    #[test]
    fn a_copy_of_the_same_entries_has_the_same_chain_through_truncations_restarts_and_reopening() {
        use crate::ingest::{IngestLog, LogConfig};
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Segments of other sizes on either side: one entry each, two each.
        let (cfg_a, cfg_b) = (
            LogConfig { segment_bytes: 2_000, ..LogConfig::default() },
            LogConfig { segment_bytes: 4_000, ..LogConfig::default() },
        );
        let mut primary = IngestLog::open(a.path(), cfg_a).unwrap();
        let mut copy = IngestLog::open(b.path(), cfg_b).unwrap();
        let ship = |primary: &mut IngestLog, copy: &mut IngestLog, from: u64, to: u64| {
            for i in from..to {
                primary.append(&batch(i * 100)).unwrap();
            }
            primary.sync().unwrap();
            let mut bytes = Vec::new();
            primary.durable_reader(copy.next_version()).read_entries(1 << 20, &mut bytes).unwrap();
            copy.append_entries(copy.next_version(), &bytes).unwrap();
            copy.sync().unwrap();
        };
        for i in 0..6 {
            primary.append(&batch(i * 100)).unwrap();
        }
        primary.sync().unwrap();
        primary.truncate_below(Version(300)).unwrap();
        // A new copy starts at the primary's first version, with its chain there.
        copy.restart_at(primary.first_version(), primary.first_chain()).unwrap();
        ship(&mut primary, &mut copy, 6, 6);
        assert_eq!(copy.chain, primary.chain);
        ship(&mut primary, &mut copy, 6, 12);
        copy.truncate_below(Version(700)).unwrap();
        primary.truncate_below(Version(500)).unwrap();
        drop((primary, copy));
        let (primary, copy) = (IngestLog::open(a.path(), cfg_a).unwrap(), IngestLog::open(b.path(), cfg_b).unwrap());
        assert!(copy.first_version() > Version(500), "the copy truncated on its own");
        for v in [700, 800, 900, 1100, 1200] {
            let at = |log: &IngestLog| log.chain_ending_at(Version(v)).unwrap();
            assert!(at(&primary).is_some() && at(&primary) == at(&copy), "at {v}");
        }
    }

    #[test]
    fn a_difference_below_does_not_cancel_out_above() {
        // Two histories that differ in their first entry and agree from then on.
        let (a, b) = ([1u32, 7, 9, 11], [2u32, 7, 9, 11]);
        let fold = |h: &[u32]| h.iter().fold(0, |c, e| chained(c, *e));
        assert_ne!(fold(&a), fold(&b));
        // And the chain is not the last entry's checksum alone, nor order-blind.
        assert_ne!(fold(&a), 11);
        assert_ne!(fold(&a), fold(&[7, 1, 9, 11]));
    }
}
