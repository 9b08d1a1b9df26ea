//! What an ingest log remembers of its producers: the sequence numbers and versions of each
//! producer's last [`DEDUP_WINDOW`] batches on the partition, which make appends idempotent.
//!
//! Invariants: a producer's remembered sequence numbers are consecutive and ascending (so a
//! batch sent again is found by its offset from the oldest); the table is rebuilt on open from
//! the `producers` file (written before retention deletes a segment) and then from the entries,
//! each of which names its producer.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use weir_wire::Version;

use super::log::LogError;
use super::sealed::{read_sealed, write_sealed};
use super::segment::ProducerSeq;

/// Batches per producer whose versions the log remembers: a batch sent again is recognised if it
/// is among its producer's last this many (a client keeps fewer than this in flight per partition).
pub const DEDUP_WINDOW: usize = 1024;

/// Each producer's last [`DEDUP_WINDOW`] batches: (sequence number, first and last version).
pub(super) type Producers = HashMap<u64, VecDeque<(u64, Version, Version)>>;

/// What an idempotent append did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Stored at these versions (`None`: an empty batch, nothing stored).
    New(Option<(Version, Version)>),
    /// Stored before, at these versions: a batch sent again.
    Duplicate(Version, Version),
}

impl AppendOutcome {
    /// The versions of the rows, wherever they were stored.
    pub fn versions(self) -> Option<(Version, Version)> {
        match self {
            AppendOutcome::New(v) => v,
            AppendOutcome::Duplicate(f, l) => Some((f, l)),
        }
    }
}

pub(super) fn remember(producers: &mut Producers, from: ProducerSeq, first: Version, last: Version) {
    let q = producers.entry(from.producer).or_default();
    if q.back().is_some_and(|b| b.0 >= from.seq) {
        return; // known already (from the `producers` file, then from its entry)
    }
    if q.len() == DEDUP_WINDOW {
        q.pop_front();
    }
    q.push_back((from.seq, first, last));
}

/// The file that keeps the producers' last batches across retention.
const PRODUCERS_FILE: &str = "producers";

/// Writes `producers` to the log's `producers` file (a new file renamed over the old one, both
/// synced): `u32` count, then per batch producer, sequence number, first and last version
/// (`u64` each, little-endian), then a CRC32C of all before it.
pub(super) fn write_producers(dir: &Path, producers: &Producers) -> Result<(), LogError> {
    let mut out = Vec::new();
    let n: usize = producers.values().map(VecDeque::len).sum();
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for (p, q) in producers {
        for (seq, first, last) in q {
            for w in [*p, *seq, first.0, last.0] {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
    }
    write_sealed(dir, PRODUCERS_FILE, out)
}

/// The `producers` file's table, empty when there is none; a damaged file is corruption.
pub(super) fn read_producers(dir: &Path) -> Result<Producers, LogError> {
    let path = dir.join(PRODUCERS_FILE);
    let Some(body) = read_sealed(dir, PRODUCERS_FILE, "the producers file")? else { return Ok(Producers::new()) };
    let corrupt = |reason: &str| LogError::Corrupt { path: path.clone(), offset: 0, reason: reason.to_string() };
    if body.len() < 4 {
        return Err(corrupt("shorter than its header"));
    }
    let n = u32::from_le_bytes(body[0..4].try_into().expect("4 bytes")) as usize;
    if body.len() != 4 + n * 32 {
        return Err(corrupt("length does not match its count"));
    }
    let mut producers = Producers::new();
    for rec in body[4..].chunks_exact(32) {
        let w = |i: usize| u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        remember(&mut producers, ProducerSeq { producer: w(0), seq: w(1) }, Version(w(2)), Version(w(3)));
    }
    Ok(producers)
}
