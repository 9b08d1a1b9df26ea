//! On-disk format of the ingest log: segment files of checksummed entries.
//!
//! A segment is named by the version of its first row (`00000000000000001234.seg`, 20 digits so
//! that names sort by version). It is a sequence of entries:
//!
//! ```text
//! offset  size  field
//!      0     4  payload length in bytes (= rows × 24)
//!      4     4  CRC32C of bytes 8.. to the entry's end
//!      8     8  version of the entry's first row
//!     16     4  rows
//!     20     4  flags: 0 = a plain entry; 1 = appended for a producer (the next 16 bytes);
//!               2 = a watermark marker (no rows; the next 8 bytes)
//!     24     8  producer id                                        (flag 1 only)
//!     32     8  the producer's sequence number on this partition   (flag 1 only)
//!     24     8  watermark (ms): no later row of the partition is   (flag 2 only)
//!               earlier than this (the partition was idle)
//!  24/40     …  ts[rows] (i64), key[rows] (u64), value[rows] (f64), little-endian
//! ```
//!
//! Versions count rows and markers: entry `n + 1` starts where entry `n` ends, with no gaps; a
//! marker takes one version and holds no row. The producer of
//! an entry is what makes appends idempotent: a reopened log knows the last sequence numbers
//! from its entries alone, so a batch resent after a crash is never stored twice. Flags other
//! than 0, 1 and 2 are refused as corruption (a newer format is never misread); entries without
//! a producer (flag 0) read as plain entries. A marker is in the log, not
//! in a source's memory, so a replay from any version meets it between the same rows.

use std::path::{Path, PathBuf};

use weir_wire::{Batch, Version};

/// Bytes of an entry's fixed header (a producer entry has [`PRODUCER_BYTES`] more).
pub const ENTRY_HEADER: usize = 24;
/// Bytes of an entry's producer id and sequence number (flag 1).
pub const PRODUCER_BYTES: usize = 16;
/// Flag of an entry appended for a producer.
const FLAG_PRODUCER: u32 = 1;
/// Flag of a watermark marker.
const FLAG_MARKER: u32 = 2;
/// Bytes of a marker's watermark (flag 2).
pub const MARKER_BYTES: usize = 8;
/// Bytes per row in an entry.
pub const ROW_BYTES: usize = 24;

/// The checksum of the entry at the start of `entry` (its header's, as written).
pub fn entry_crc(entry: &[u8]) -> u32 {
    entry.get(4..8).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// The file name of the segment starting at `first`.
pub fn segment_name(first: Version) -> String {
    format!("{:020}.seg", first.0)
}

/// The first version of a segment file, from its name.
pub fn parse_segment_name(path: &Path) -> Option<Version> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 {
        return None;
    }
    digits.parse().ok().map(Version)
}

/// Path of segment `first` in `dir`.
pub fn segment_path(dir: &Path, first: Version) -> PathBuf {
    dir.join(segment_name(first))
}

/// Who appended an entry: a producer and its sequence number on the entry's partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerSeq {
    /// Producer id (chosen by the client, e.g. `weir load`).
    pub producer: u64,
    /// The producer's batches on this partition count from 0, without gaps.
    pub seq: u64,
}

/// Appends a watermark marker at version `at` (it takes that version and holds no row) to `out`.
pub fn encode_marker(at: Version, watermark_ms: i64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&at.0.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&FLAG_MARKER.to_le_bytes());
    out.extend_from_slice(&watermark_ms.to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends the encoded entry for `batch` (first row at `first`, appended for `from`) to `out`.
pub fn encode_entry(first: Version, batch: &Batch, from: Option<ProducerSeq>, out: &mut Vec<u8>) {
    let rows = batch.len();
    let start = out.len();
    out.reserve(ENTRY_HEADER + PRODUCER_BYTES + rows * ROW_BYTES);
    out.extend_from_slice(&((rows * ROW_BYTES) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&first.0.to_le_bytes());
    out.extend_from_slice(&(rows as u32).to_le_bytes());
    match from {
        None => out.extend_from_slice(&0u32.to_le_bytes()),
        Some(p) => {
            out.extend_from_slice(&FLAG_PRODUCER.to_le_bytes());
            out.extend_from_slice(&p.producer.to_le_bytes());
            out.extend_from_slice(&p.seq.to_le_bytes());
        }
    }
    for t in &batch.ts {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for k in &batch.key {
        out.extend_from_slice(&k.to_le_bytes());
    }
    for v in &batch.value {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What is at the start of `bytes`.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole, valid entry of `len` bytes; it takes versions `first..first + versions()`.
    Entry {
        /// First version.
        first: Version,
        /// Rows.
        rows: u32,
        /// Total bytes, header included.
        len: usize,
        /// Who appended it (flag 1).
        from: Option<ProducerSeq>,
        /// A marker's watermark (flag 2; it has no rows).
        watermark: Option<i64>,
    },
    /// The bytes end inside an entry.
    Incomplete,
    /// The bytes are not a valid entry.
    Corrupt(String),
}

/// Parses the entry at the start of `bytes` (checksum included).
pub fn parse_entry(bytes: &[u8], max_entry: usize) -> Parsed {
    if bytes.len() < ENTRY_HEADER {
        return Parsed::Incomplete;
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let payload = word(0) as usize;
    let crc = word(4);
    let first = Version(u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")));
    let rows = word(16);
    let flags = word(20);
    if payload != rows as usize * ROW_BYTES || payload > max_entry {
        return Parsed::Corrupt(format!("entry header is inconsistent (payload {payload}, rows {rows})"));
    }
    if flags > FLAG_MARKER {
        return Parsed::Corrupt(format!("entry flags {flags:#x} are unknown to this version (a newer format?)"));
    }
    if flags == FLAG_MARKER && rows != 0 {
        return Parsed::Corrupt(format!("a watermark marker with {rows} rows"));
    }
    let len = header_len(flags) + payload;
    if bytes.len() < len {
        return Parsed::Incomplete;
    }
    let computed = crc32c::crc32c(&bytes[8..len]);
    if computed != crc {
        return Parsed::Corrupt(format!("checksum {computed:#010x} does not match {crc:#010x}"));
    }
    let long = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let from = (flags == FLAG_PRODUCER).then(|| ProducerSeq { producer: long(24), seq: long(32) });
    let watermark = (flags == FLAG_MARKER).then(|| long(24) as i64);
    Parsed::Entry { first, rows, len, from, watermark }
}

impl Parsed {
    /// The versions a valid entry takes: one per row, one for a marker.
    pub fn versions(rows: u32, watermark: Option<i64>) -> u64 {
        if watermark.is_some() { 1 } else { rows as u64 }
    }
}

/// Bytes of the header of an entry with `flags` (the columns start there).
pub fn header_len(flags: u32) -> usize {
    match flags {
        FLAG_PRODUCER => ENTRY_HEADER + PRODUCER_BYTES,
        FLAG_MARKER => ENTRY_HEADER + MARKER_BYTES,
        _ => ENTRY_HEADER,
    }
}

/// Bytes an entry takes after its fixed header, from that header (`None`: not a header this
/// version reads; [`parse_entry`] says why).
pub fn rest_len(head: &[u8; ENTRY_HEADER]) -> Option<usize> {
    let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    (word(20) <= FLAG_MARKER).then(|| header_len(word(20)) - ENTRY_HEADER + word(0) as usize)
}

/// Appends rows `skip..` of the valid entry at the start of `bytes` to `out`.
pub fn decode_rows(bytes: &[u8], rows: usize, skip: usize, out: &mut Batch) {
    let data = header_len(u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes")));
    let col = |c: usize, i: usize| {
        let at = data + c * rows * 8 + i * 8;
        <[u8; 8]>::try_from(&bytes[at..at + 8]).expect("8 bytes")
    };
    for i in skip..rows {
        out.push(i64::from_le_bytes(col(0, i)), u64::from_le_bytes(col(1, i)), f64::from_le_bytes(col(2, i)));
    }
}
