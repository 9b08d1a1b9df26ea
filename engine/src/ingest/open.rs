//! Opening one partition's log: its segments in version order, each checked entry by entry, the
//! producers' last batches and the ledger brought up to date from the entries, and a torn tail
//! (the last write, cut short by a crash) cut off.
//!
//! Invariant: only the last entries of the last segment may be cut; damage anywhere else, or a
//! gap between segments, is refused as corruption.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64};

use weir_wire::Version;

use super::chain::{chained, read_anchor};
use super::ledger::Ledger;
use super::log::{IngestLog, LogConfig, LogError, Segment, io_err, sync_dir};
use super::producers::{Producers, read_producers, remember};
use super::segment::{self, Parsed};

impl IngestLog {
    /// Opens (or creates) the log in `dir`, cutting a torn tail.
    pub fn open(dir: &Path, cfg: LogConfig) -> Result<IngestLog, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut segments = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let path = entry.map_err(io_err(dir))?.path();
            if let Some(first) = segment::parse_segment_name(&path) {
                segments.push(Segment { first, path, seed: 0 });
            }
        }
        segments.sort_by_key(|s| s.first);
        let (mut chain, anchor) = anchored(dir, &mut segments)?;
        let mut next = segments.first().map_or(anchor.unwrap_or(Version(0)), |s| s.first);
        let count = segments.len();
        let mut producers = read_producers(dir)?;
        let ledger = Ledger::read(dir)?;
        for (i, seg) in segments.iter_mut().enumerate() {
            if seg.first != next {
                return Err(LogError::Corrupt {
                    path: seg.path.clone(),
                    offset: 0,
                    reason: format!("segment starts at {} but the previous one ends at {next}", seg.first),
                });
            }
            let known = (&mut producers, &ledger);
            seg.seed = chain;
            (next, chain) = scan_segment(&seg.path, (seg.first, chain), cfg.max_entry_bytes, i + 1 == count, known)?;
        }
        if segments.is_empty() {
            segments.push(Segment { first: next, path: segment::segment_path(dir, next), seed: chain });
        }
        let last = segments.last().expect("one segment").path.clone();
        let active = OpenOptions::new().create(true).append(true).open(&last).map_err(io_err(&last))?;
        let active_len = active.metadata().map_err(io_err(&last))?.len();
        sync_dir(dir)?;
        Ok(IngestLog {
            dir: dir.to_path_buf(),
            cfg,
            segments,
            active,
            active_len,
            next,
            written_unsynced: false,
            // What survived the restart is on disk: it is durable.
            durable: Arc::new(AtomicU64::new(next.0)),
            readable: Arc::new(AtomicU64::new(next.0)),
            replicated: false,
            standing: Arc::new(AtomicU8::new(0)),
            copy: Version(0),
            unshipped: Default::default(),
            buf: Vec::new(),
            producers,
            ledger,
            chain,
        })
    }
}

/// The chain before the oldest segment, from the log's anchor (`chain.rs`), and the anchor's
/// version; segments below the anchor (a truncation a crash cut short) are deleted. Without an
/// anchor the chain before version 0 is 0, and a log that begins later (written before logs kept
/// anchors) starts its chain at 0 too: a copy compared with it is then copied again once.
fn anchored(dir: &Path, segments: &mut Vec<Segment>) -> Result<(u32, Option<Version>), LogError> {
    let Some((first, seed)) = read_anchor(dir)? else {
        if let Some(s) = segments.first().filter(|s| s.first > Version(0)) {
            tracing::warn!(dir = %dir.display(), first = %s.first, "ingest log without a chain anchor: its chain starts at 0 here");
        }
        return Ok((0, None));
    };
    let Some(at) = segments.iter().position(|s| s.first == first) else {
        if segments.is_empty() {
            return Ok((seed, Some(first)));
        }
        // Not written by this log's own steps (segments deleted by hand, or by a Weir that
        // kept no anchor): the chain starts at 0, and a copy compared with it is copied again.
        tracing::warn!(dir = %dir.display(), anchor = %first, "the chain anchor names no segment: the chain starts at 0 here");
        return Ok((0, None));
    };
    for seg in segments.drain(..at) {
        tracing::warn!(segment = %seg.path.display(), anchor = %first, "deleting a segment below the chain anchor (a cut-short truncation)");
        fs::remove_file(&seg.path).map_err(io_err(&seg.path))?;
    }
    Ok((seed, Some(first)))
}

/// Checks a segment entry by entry, from its first version and the chain before it; returns
/// the version after its last entry and the chain there. In the last segment a torn tail is
/// cut; anywhere else damage is corruption.
fn scan_segment(
    path: &Path,
    (first, seed): (Version, u32),
    max_entry: usize,
    last: bool,
    (producers, ledger): (&mut Producers, &Ledger),
) -> Result<(Version, u32), LogError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    let mut off = 0usize;
    let mut next = first;
    let mut chain = seed;
    while off < bytes.len() {
        let why = match segment::parse_entry(&bytes[off..], max_entry) {
            Parsed::Entry { first: f, rows, len, from, watermark } if f == next => {
                chain = chained(chain, segment::entry_crc(&bytes[off..]));
                off += len;
                next = Version(next.0 + Parsed::versions(rows, watermark));
                if let Some(from) = from {
                    remember(producers, from, f, Version(next.0 - 1));
                    ledger.count(from, f, rows as u64);
                }
                continue;
            }
            Parsed::Entry { first: f, .. } => format!("entry starts at {f}, expected {next}"),
            Parsed::Incomplete => "incomplete entry".to_string(),
            Parsed::Corrupt(reason) => reason,
        };
        // A torn tail is the last write: nothing valid may follow it.
        let valid_after = (off + 1..bytes.len()).any(
            |o| matches!(segment::parse_entry(&bytes[o..], max_entry), Parsed::Entry { first: f, .. } if f >= next),
        );
        if !last || valid_after {
            return Err(LogError::Corrupt { path: path.to_path_buf(), offset: off as u64, reason: why });
        }
        tracing::warn!(
            segment = %path.display(), offset = off, cut_bytes = bytes.len() - off, reason = %why,
            "cutting torn tail of the ingest log"
        );
        let f = OpenOptions::new().write(true).open(path).map_err(io_err(path))?;
        f.set_len(off as u64).map_err(io_err(path))?;
        f.sync_all().map_err(io_err(path))?;
        break;
    }
    Ok((next, chain))
}
