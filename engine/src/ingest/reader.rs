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

/// Reads one partition's log from a version on, up to what is durable.
#[derive(Debug)]
pub struct LogReader {
    pub(super) dir: PathBuf,
    pub(super) cfg: LogConfig,
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
        let durable = Version(self.durable.load(Ordering::Acquire));
        let mut read = 0;
        while self.pos < durable && read < max_rows {
            if self.file.is_none() {
                self.open_at(self.pos)?;
            }
            let (file, seg_first, offset) = self.file.as_mut().expect("opened");
            let seg_path = segment::segment_path(&self.dir, *seg_first);
            let mut head = [0u8; segment::ENTRY_HEADER];
            match file.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    // End of this segment: the next one starts at pos.
                    self.file = None;
                    let next = segment::segment_path(&self.dir, self.pos);
                    if !next.exists() {
                        let reason = format!("segment for {} missing", self.pos);
                        return Err(LogError::Corrupt { path: next, offset: 0, reason });
                    }
                    continue;
                }
                Err(e) => return Err(io_err(&seg_path)(e)),
            }
            // An unknown header reads no further: `parse_entry` says what is wrong with it.
            let rest = segment::rest_len(&head).unwrap_or(0);
            self.buf.clear();
            self.buf.extend_from_slice(&head);
            let cap = self.cfg.max_entry_bytes + segment::PRODUCER_BYTES;
            self.buf.resize(segment::ENTRY_HEADER + rest.min(cap), 0);
            file.read_exact(&mut self.buf[segment::ENTRY_HEADER..]).map_err(io_err(&seg_path))?;
            let (first, rows, len, watermark) = match segment::parse_entry(&self.buf, self.cfg.max_entry_bytes) {
                Parsed::Entry { first, rows, len, watermark, .. } => (first, rows as usize, len, watermark),
                Parsed::Incomplete => unreachable!("read the whole entry"),
                Parsed::Corrupt(reason) => {
                    return Err(LogError::Corrupt { path: seg_path, offset: *offset, reason });
                }
            };
            *offset += len as u64;
            let end = Version(first.0 + Parsed::versions(rows as u32, watermark));
            if end <= self.pos {
                continue; // before our start (first entry after a seek)
            }
            let skip = (self.pos.0 - first.0) as usize;
            self.pos = end;
            if let Some(w) = watermark {
                return Ok(LogRead { rows: read, watermark: Some(w) });
            }
            segment::decode_rows(&self.buf, rows, skip, out);
            read += rows - skip;
        }
        Ok(LogRead { rows: read, watermark: None })
    }

    /// Every version below this is durable.
    pub(super) fn durable(&self) -> Version {
        Version(self.durable.load(Ordering::Acquire))
    }

    /// The segment holding the position, open at the entry to read next: the file, its first
    /// version and the entry's byte offset.
    pub(super) fn entry_file(&mut self) -> Result<(&mut File, Version, u64), LogError> {
        if self.file.is_none() {
            self.open_at(self.pos)?;
        }
        let (file, first, offset) = self.file.as_mut().expect("opened");
        Ok((file, *first, *offset))
    }

    /// The open segment has no more entries: the next one starts at the position.
    pub(super) fn segment_ended(&mut self) -> Result<(), LogError> {
        self.file = None;
        let next = segment::segment_path(&self.dir, self.pos);
        if !next.exists() {
            let reason = format!("segment for {} missing", self.pos);
            return Err(LogError::Corrupt { path: next, offset: 0, reason });
        }
        Ok(())
    }

    /// The entry read last took `len` bytes of the open segment.
    pub(super) fn advance(&mut self, len: u64) {
        if let Some((_, _, offset)) = self.file.as_mut() {
            *offset += len;
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
