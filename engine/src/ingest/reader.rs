//! Reading one partition's ingest log from any version, up to what is durable: whole entries,
//! the first possibly from its middle, stopping after a watermark marker when asked.
//!
//! Invariant: a reader never reads at or past the log's durable version, so nothing it returns
//! can vanish in a crash.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_wire::{Batch, Version};

use super::log::{LogConfig, LogError, io_err};
use super::segment::{self, Parsed};

/// What [`LogReader::read_marked`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRead {
    /// Rows appended to the batch.
    pub rows: usize,
    /// The watermark of the marker the read stopped after.
    pub watermark: Option<i64>,
}

/// An entry [`LogReader::next_entry`] read: its first version, rows, a marker's watermark, and
/// where it is (for errors).
pub(super) struct Entry {
    pub(super) first: Version,
    pub(super) rows: u32,
    pub(super) watermark: Option<i64>,
    pub(super) segment: PathBuf,
    pub(super) offset: u64,
}

impl Entry {
    /// The version after it.
    pub(super) fn end(&self) -> Version {
        Version(self.first.0 + Parsed::versions(self.rows, self.watermark))
    }
}

/// Reads one partition's log from a version on, up to what is durable.
#[derive(Debug)]
pub struct LogReader {
    dir: PathBuf,
    cfg: LogConfig,
    durable: Arc<AtomicU64>,
    pub(super) pos: Version,
    /// Open segment, its first version and the byte offset of the entry holding `pos`.
    file: Option<(File, Version, u64)>,
    buf: Vec<u8>,
}

impl LogReader {
    pub(super) fn new(dir: PathBuf, cfg: LogConfig, durable: Arc<AtomicU64>, pos: Version) -> LogReader {
        LogReader { dir, cfg, durable, pos, file: None, buf: Vec::new() }
    }

    /// Version of the next row to be read.
    pub fn position(&self) -> Version {
        self.pos
    }

    /// A reader of the same log starting at `from` (a restored source replays from its offset).
    pub fn reopen_at(&self, from: Version) -> LogReader {
        LogReader::new(self.dir.clone(), self.cfg, self.durable.clone(), from)
    }

    /// Appends up to about `max_rows` durable rows (whole entries, the first possibly partial) to
    /// `out`, reading past markers. Returns the number of rows read; 0 when nothing new is
    /// durable.
    pub fn read(&mut self, max_rows: usize, out: &mut Batch) -> Result<usize, LogError> {
        let mut read = 0;
        loop {
            let r = self.read_marked(max_rows - read.min(max_rows), out)?;
            read += r.rows;
            if r.watermark.is_none() || read >= max_rows {
                return Ok(read);
            }
        }
    }

    /// As [`Self::read`], but stops after a marker and says so: the rows before it are in `out`,
    /// and its watermark applies after them.
    pub fn read_marked(&mut self, max_rows: usize, out: &mut Batch) -> Result<LogRead, LogError> {
        let durable = self.durable();
        let mut read = 0;
        while self.pos < durable && read < max_rows {
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            let got = self.next_entry(&mut buf);
            self.buf = buf;
            let Some(e) = got? else { continue };
            let end = e.end();
            if end <= self.pos {
                continue; // before our start (first entry after a seek)
            }
            let skip = (self.pos.0 - e.first.0) as usize;
            self.pos = end;
            if let Some(w) = e.watermark {
                return Ok(LogRead { rows: read, watermark: Some(w) });
            }
            segment::decode_rows(&self.buf, e.rows as usize, skip, out);
            read += e.rows as usize - skip;
        }
        Ok(LogRead { rows: read, watermark: None })
    }

    /// Every version below this is durable.
    pub(super) fn durable(&self) -> Version {
        Version(self.durable.load(Ordering::Acquire))
    }

    /// Reads the entry at the open segment's offset (opening the segment holding the position
    /// first) onto the end of `into`, whole and checked, and moves past it. `Ok(None)` when the
    /// segment has no more entries: the next one starts at the position.
    pub(super) fn next_entry(&mut self, into: &mut Vec<u8>) -> Result<Option<Entry>, LogError> {
        if self.file.is_none() {
            self.open_at(self.pos)?;
        }
        let (file, seg_first, offset) = self.file.as_mut().expect("opened");
        let seg_path = segment::segment_path(&self.dir, *seg_first);
        let mut head = [0u8; segment::ENTRY_HEADER];
        match file.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.file = None;
                let next = segment::segment_path(&self.dir, self.pos);
                if !next.exists() {
                    let reason = format!("segment for {} missing", self.pos);
                    return Err(LogError::Corrupt { path: next, offset: 0, reason });
                }
                return Ok(None);
            }
            Err(e) => return Err(io_err(&seg_path)(e)),
        }
        // An unknown header reads no further: `parse_entry` says what is wrong with it.
        let rest = segment::rest_len(&head).unwrap_or(0);
        let cap = self.cfg.max_entry_bytes + segment::PRODUCER_BYTES;
        let at = into.len();
        into.extend_from_slice(&head);
        into.resize(at + segment::ENTRY_HEADER + rest.min(cap), 0);
        file.read_exact(&mut into[at + segment::ENTRY_HEADER..]).map_err(io_err(&seg_path))?;
        let at_offset = *offset;
        match segment::parse_entry(&into[at..], self.cfg.max_entry_bytes) {
            Parsed::Entry { first, rows, len, watermark, .. } => {
                *offset += len as u64;
                Ok(Some(Entry { first, rows, watermark, segment: seg_path, offset: at_offset }))
            }
            Parsed::Incomplete => unreachable!("read the whole entry"),
            Parsed::Corrupt(reason) => Err(LogError::Corrupt { path: seg_path, offset: at_offset, reason }),
        }
    }

    /// The chain at `end` (`chain.rs`), folded from `seed`, the chain before the segment the
    /// reader opens (it starts at the version before `end`, in the segment holding the entry
    /// that ends there): `None` when no entry of that segment ends there.
    pub(super) fn chain_ending_at(&mut self, end: Version, seed: u32) -> Result<Option<u32>, LogError> {
        let mut buf = Vec::new();
        let mut chain = seed;
        loop {
            buf.clear();
            let Some(e) = self.next_entry(&mut buf)? else { return Ok(None) };
            chain = super::chain::chained(chain, segment::entry_crc(&buf));
            self.pos = self.pos.max(e.end());
            if e.end() == end {
                return Ok(Some(chain));
            }
            if e.end() > end {
                return Ok(None);
            }
        }
    }

    fn open_at(&mut self, pos: Version) -> Result<(), LogError> {
        let mut best = None;
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let path = entry.map_err(io_err(&self.dir))?.path();
            if let Some(first) = segment::parse_segment_name(&path)
                && first <= pos
                && best.is_none_or(|b| first > b)
            {
                best = Some(first);
            }
        }
        let Some(first) = best else {
            let reason = format!("no segment holds version {pos}");
            return Err(LogError::Corrupt { path: self.dir.clone(), offset: 0, reason });
        };
        let path = segment::segment_path(&self.dir, first);
        let mut file = File::open(&path).map_err(io_err(&path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err(&path))?;
        self.file = Some((file, first, 0));
        Ok(())
    }
}
