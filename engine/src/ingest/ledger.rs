//! What each producer appended to a partition, for as long as the log exists: its description
//! (opaque bytes the producer gives with its first batch; `weir load` puts the parameters its
//! rows are a pure function of there), the version its rows start at, how many rows and batches
//! it appended. `weir verify` recomputes an ingest stream's results from it, and a second load
//! learns where the first one ended.
//!
//! Invariants: a producer's record counts each of its batches once, in sequence order (a batch
//! sent again is not counted again); records stay in the order their producers first appended.
//! The `ledger` file holds the records as of its writing (retention rewrites it before deleting a
//! segment); the `ledger.journal` beside it holds what changed since, one record appended and
//! synced per change (a description before the batch it came with is appended, an end-of-load),
//! so a new producer costs one small append, never a rewrite. A reopened log reads the file, then
//! the journal (a torn last record, from a crash mid-append, is cut off: its batch was never
//! appended), then counts on from its entries, each of which names its producer and batch.
//!
//! Bounds: at most [`MAX_PRODUCERS`] producers and [`MAX_LEDGER_BYTES`] of descriptions per
//! partition; a producer past either is refused, so a client cannot grow a ledger without end.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use weir_wire::Version;

use super::log::{LogError, io_err, sync_dir};
use super::sealed::write_sealed;
use super::segment::ProducerSeq;

/// Longest description a producer may give (bytes).
pub const MAX_DESCRIPTION: usize = 64 << 10;
/// Producers a partition's ledger records at most (each load is one; a client that invents
/// producers without end is refused rather than growing the ledger without bound).
pub const MAX_PRODUCERS: usize = 100_000;
/// Bytes of descriptions a partition's ledger holds at most.
pub const MAX_LEDGER_BYTES: usize = 16 << 20;

/// What one producer appended to one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Producer id.
    pub producer: u64,
    /// What the producer said of itself with its first batch (empty: nothing).
    pub description: Vec<u8>,
    /// Version of its first row (or where it would have been, before its first batch).
    pub first: Version,
    /// Rows appended.
    pub rows: u64,
    /// Batches appended: its sequence numbers `0..batches`.
    pub batches: u64,
    /// The watermark of the end-of-load marker it appended last (it said it was done).
    pub ended: Option<i64>,
}

/// A partition's producers, shared between the log's writer and its readers (a lock per append,
/// uncontended but for a client asking).
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<Records>>);

#[derive(Debug, Default)]
struct Records {
    list: Vec<ProducerRecord>,
    index: HashMap<u64, usize>,
    /// Bytes of descriptions in `list`.
    bytes: usize,
}

impl Records {
    fn record(&mut self, producer: u64, first: Version, description: Vec<u8>) -> &mut ProducerRecord {
        let i = *self.index.entry(producer).or_insert_with(|| {
            self.bytes += description.len();
            self.list.push(ProducerRecord { producer, description, first, rows: 0, batches: 0, ended: None });
            self.list.len() - 1
        });
        &mut self.list[i]
    }
}

/// Appends `rec` as the ledger files store it: producer, first version, rows, batches (`u64`
/// each), whether it ended (`u8`) and the end's watermark (`i64`), description length (`u32`)
/// and bytes; little-endian.
fn encode_record(out: &mut Vec<u8>, rec: &ProducerRecord) {
    for w in [rec.producer, rec.first.0, rec.rows, rec.batches] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.push(u8::from(rec.ended.is_some()));
    out.extend_from_slice(&rec.ended.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&(rec.description.len() as u32).to_le_bytes());
    out.extend_from_slice(&rec.description);
}

/// The record at `body[at..]` and where the next one starts; `Err` says what is wrong.
fn decode_record(body: &[u8], at: usize) -> Result<(ProducerRecord, usize), &'static str> {
    const FIXED: usize = 32 + 1 + 8 + 4;
    let fixed = body.get(at..at + FIXED).ok_or("ends inside a record")?;
    let w = |i: usize| u64::from_le_bytes(fixed[i..i + 8].try_into().expect("8 bytes"));
    let ended = match fixed[32] {
        0 => None,
        1 => Some(w(33) as i64),
        _ => return Err("a record's end flag is neither 0 nor 1"),
    };
    let len = u32::from_le_bytes(fixed[41..45].try_into().expect("4 bytes")) as usize;
    if len > MAX_DESCRIPTION {
        return Err("a description longer than any producer may give");
    }
    let description = body.get(at + FIXED..at + FIXED + len).ok_or("ends inside a description")?;
    let rec = ProducerRecord {
        producer: w(0),
        first: Version(w(8)),
        rows: w(16),
        batches: w(24),
        ended,
        description: description.to_vec(),
    };
    Ok((rec, at + FIXED + len))
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Records> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every producer's record, in the order they first appended.
    pub fn records(&self) -> Vec<ProducerRecord> {
        self.lock().list.clone()
    }

    /// Records from the `from`-th on, until their descriptions pass `budget` bytes (at least
    /// one), and the index of the first left out (`None`: none was).
    pub fn page(&self, from: usize, budget: usize) -> (Vec<ProducerRecord>, Option<usize>) {
        let r = self.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (i, rec) in r.list.iter().enumerate().skip(from) {
            if !out.is_empty() && bytes + rec.description.len() > budget {
                return (out, Some(i));
            }
            bytes += rec.description.len() + 64;
            out.push(rec.clone());
        }
        (out, None)
    }

    /// Forgets every record (a follower's copy started afresh).
    pub(super) fn clear(&self) {
        let mut r = self.lock();
        r.list.clear();
        r.index.clear();
        r.bytes = 0;
    }

    /// How many producers there are and how many of them ended (what a follower's copy of the
    /// ledger would miss).
    pub(super) fn summary(&self) -> (usize, usize) {
        let r = self.lock();
        (r.list.len(), r.list.iter().filter(|rec| rec.ended.is_some()).count())
    }

    /// Whether `producer` has a record.
    pub fn knows(&self, producer: u64) -> bool {
        self.lock().index.contains_key(&producer)
    }

    /// Whether `producer` has a record or there is room for one with a description of
    /// `description` bytes.
    pub(super) fn admits(&self, producer: u64, description: usize) -> bool {
        let r = self.lock();
        r.index.contains_key(&producer) || (r.list.len() < MAX_PRODUCERS && r.bytes + description <= MAX_LEDGER_BYTES)
    }

    /// Records `producer` with `description`, its rows to start at `first`, in memory only.
    fn describe(&self, producer: u64, first: Version, description: &[u8]) {
        self.lock().record(producer, first, description.to_vec());
    }

    /// Counts batch `from.seq` of `from.producer` (`rows` rows from `first`), once.
    pub(super) fn count(&self, from: ProducerSeq, first: Version, rows: u64) {
        let mut r = self.lock();
        let rec = r.record(from.producer, first, Vec::new());
        if from.seq >= rec.batches {
            rec.rows += rows;
            rec.batches = from.seq + 1;
        }
    }

    /// Batches `producer` appended, when it has a record.
    pub(super) fn batches(&self, producer: u64) -> Option<u64> {
        let r = self.lock();
        r.index.get(&producer).map(|&i| r.list[i].batches)
    }

    /// Takes a primary's record of a producer into this copy's (in memory): a description the
    /// copy lacks, and the counts when they are ahead of the copy's (they cover entries below
    /// where the copy began, or on their way; those entries, by sequence number, are then not
    /// counted again). Returns whether anything changed. The caller checked [`Self::admits`].
    pub(super) fn adopt(&self, from: &ProducerRecord) -> bool {
        let mut guard = self.lock();
        let r = &mut *guard;
        let known = r.index.contains_key(&from.producer);
        r.record(from.producer, from.first, from.description.clone());
        let i = r.index[&from.producer];
        let mut changed = !known;
        if r.list[i].description.is_empty() && !from.description.is_empty() {
            r.list[i].description = from.description.clone();
            r.bytes += from.description.len();
            changed = true;
        }
        let rec = &mut r.list[i];
        if from.batches > rec.batches {
            (rec.rows, rec.batches, rec.first) = (from.rows, from.batches, from.first);
            changed = true;
        }
        changed
    }

    /// Notes that `producer` (known) ended with a marker of `watermark`, in memory only; `false`
    /// if unknown.
    fn end(&self, producer: u64, watermark: i64) -> bool {
        let mut r = self.lock();
        let Some(&i) = r.index.get(&producer) else { return false };
        r.list[i].ended = Some(watermark);
        true
    }

    /// Records `producer` with `description`, its rows to start at `first`, durably: its journal
    /// record is appended and synced first, and only then is it known (a failed write leaves it
    /// unknown, so the batch it came with is refused, not acknowledged without it). The caller
    /// checked [`Self::admits`]; a producer known already is left as it is.
    pub(super) fn describe_durably(
        &self,
        dir: &Path,
        producer: u64,
        first: Version,
        description: &[u8],
    ) -> Result<(), LogError> {
        if self.knows(producer) {
            return Ok(());
        }
        let rec =
            ProducerRecord { producer, description: description.to_vec(), first, rows: 0, batches: 0, ended: None };
        self.append_journal(dir, &rec)?;
        self.describe(producer, first, description);
        self.compact_if_long(dir)
    }

    /// Notes, durably, that `producer` (known) ended with a marker of `watermark`: `false` when
    /// it is unknown or had noted that already (nothing written).
    pub(super) fn end_durably(&self, dir: &Path, producer: u64, watermark: i64) -> Result<bool, LogError> {
        let first = {
            let r = self.lock();
            match r.index.get(&producer).map(|&i| &r.list[i]) {
                Some(rec) if rec.ended != Some(watermark) => rec.first,
                _ => return Ok(false),
            }
        };
        // The end alone: no description again.
        let rec =
            ProducerRecord { producer, description: Vec::new(), first, rows: 0, batches: 0, ended: Some(watermark) };
        self.append_journal(dir, &rec)?;
        self.end(producer, watermark);
        self.compact_if_long(dir)?;
        Ok(true)
    }

    /// Appends `rec` to `dir`'s journal and syncs it: one small write, whatever the ledger holds.
    /// A write that fails part way is cut back off, so the journal never holds half a record
    /// before good ones.
    ///
    /// Journal format: per change, `u32` length and its complement (a damaged length is told
    /// from a torn one), the record (as in the `ledger` file, its counts zero: those come from
    /// the entries; an end's without its description), and a CRC32C of all three;
    /// little-endian.
    fn append_journal(&self, dir: &Path, rec: &ProducerRecord) -> Result<(), LogError> {
        let mut body = Vec::new();
        encode_record(&mut body, rec);
        let mut out = Vec::with_capacity(body.len() + JOURNAL_HEAD + 4);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&(!(body.len() as u32)).to_le_bytes());
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let path = dir.join(JOURNAL_FILE);
        let new = !path.exists();
        let mut f = fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        let before = f.metadata().map_err(io_err(&path))?.len();
        if before > JOURNAL_LIMIT {
            // Compaction keeps failing (a full disk, say): refuse rather than grow a journal the
            // next start would refuse to read.
            let reason = "the ledger journal is full and cannot be compacted (is the disk full?)".to_string();
            return Err(LogError::Refused { reason });
        }
        if let Err(e) = f.write_all(&out).and_then(|()| f.sync_data()) {
            let _ = f.set_len(before).and_then(|()| f.sync_data());
            return Err(io_err(&path)(e));
        }
        if new { sync_dir(dir) } else { Ok(()) }
    }

    /// Rewrites the ledger file (and empties the journal) once the journal passes
    /// [`JOURNAL_COMPACT`] bytes: a journal stays short however many changes come.
    fn compact_if_long(&self, dir: &Path) -> Result<(), LogError> {
        let path = dir.join(JOURNAL_FILE);
        match fs::metadata(&path) {
            Ok(m) if m.len() > JOURNAL_COMPACT => self.write(dir),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Writes the records to `dir`'s `ledger` file (a new file renamed over the old, synced),
    /// then empties the journal (what it held is in the file now).
    ///
    /// Format: `WLG1`, `u32` count, then the records (see `encode_record`), then a CRC32C of all
    /// before it; little-endian.
    pub(super) fn write(&self, dir: &Path) -> Result<(), LogError> {
        let mut out = Vec::new();
        {
            let r = self.lock();
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&(r.list.len() as u32).to_le_bytes());
            for rec in &r.list {
                encode_record(&mut out, rec);
            }
        }
        write_sealed(dir, LEDGER_FILE, out)?;
        let journal = dir.join(JOURNAL_FILE);
        match fs::remove_file(&journal) {
            Ok(()) => sync_dir(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&journal)(e)),
        }
    }

    /// The `ledger` file's records, an empty ledger when there is none; a damaged file, or one
    /// of another format, is refused as corruption.
    pub(super) fn read(dir: &Path) -> Result<Ledger, LogError> {
        let path = dir.join(LEDGER_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut records = Records::default();
                Self::replay_journal(dir, &mut records)?;
                return Ok(Ledger(Arc::new(Mutex::new(records))));
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let corrupt = |offset: usize, reason: &str| LogError::Corrupt {
            path: path.clone(),
            offset: offset as u64,
            reason: reason.to_string(),
        };
        if bytes.len() < 12 {
            return Err(corrupt(0, "shorter than its header"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(corrupt(0, "checksum does not match"));
        }
        if &body[..4] != MAGIC {
            return Err(corrupt(0, "not a ledger of this format (WLG1): written by another version?"));
        }
        let n = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes")) as usize;
        if n > MAX_PRODUCERS {
            return Err(corrupt(4, "more producers than a ledger holds"));
        }
        let mut at = 8;
        let mut records = Records::default();
        for _ in 0..n {
            let (rec, next) = decode_record(body, at).map_err(|why| corrupt(at, why))?;
            if records.index.contains_key(&rec.producer) {
                return Err(corrupt(at, "a producer recorded twice"));
            }
            let (rows, batches, ended) = (rec.rows, rec.batches, rec.ended);
            let r = records.record(rec.producer, rec.first, rec.description);
            (r.rows, r.batches, r.ended) = (rows, batches, ended);
            at = next;
        }
        if at != body.len() {
            return Err(corrupt(at, "bytes after the last record"));
        }
        Self::replay_journal(dir, &mut records)?;
        Ok(Ledger(Arc::new(Mutex::new(records))))
    }

    /// Applies `dir`'s journal to `records`, and cuts a torn tail off the file (a crash
    /// mid-append: the batch that change came before was never appended); damage is refused.
    fn replay_journal(dir: &Path, records: &mut Records) -> Result<(), LogError> {
        let path = dir.join(JOURNAL_FILE);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(&path)(e)),
        };
        // A journal is compacted past JOURNAL_COMPACT and refuses appends past JOURNAL_LIMIT: one
        // longer is not ours.
        if meta.len() > JOURNAL_LIMIT + MAX_DESCRIPTION as u64 + 128 {
            return Err(LogError::Corrupt { path, offset: 0, reason: "larger than any journal".into() });
        }
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let corrupt = |at: usize, reason: &str| LogError::Corrupt {
            path: path.clone(),
            offset: at as u64,
            reason: format!("a journal record {reason}"),
        };
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            // A torn append (a crash mid-write) leaves a short last record, or zeros: cut it
            // off. Anything else that does not check out is damage, refused rather than cut.
            if rest.len() < JOURNAL_HEAD || rest.iter().all(|b| *b == 0) {
                break;
            }
            let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().expect("4 bytes"));
            let (len, check) = (word(0), word(4));
            if len ^ check != u32::MAX {
                return Err(corrupt(at, "has a damaged length"));
            }
            let len = len as usize;
            if len > MAX_DESCRIPTION + 64 {
                return Err(corrupt(at, "is longer than any record"));
            }
            if rest.len() < JOURNAL_HEAD + len + 4 {
                break;
            }
            let crc = u32::from_le_bytes(rest[JOURNAL_HEAD + len..JOURNAL_HEAD + len + 4].try_into().expect("4 bytes"));
            if crc32c::crc32c(&rest[..JOURNAL_HEAD + len]) != crc {
                return Err(corrupt(at, "does not match its checksum"));
            }
            let (rec, end) =
                decode_record(&rest[JOURNAL_HEAD..JOURNAL_HEAD + len], 0).map_err(|why| corrupt(at, why))?;
            if end != len {
                return Err(corrupt(at, "is longer than its content"));
            }
            if !records.index.contains_key(&rec.producer)
                && (records.list.len() >= MAX_PRODUCERS || records.bytes + rec.description.len() > MAX_LEDGER_BYTES)
            {
                return Err(corrupt(at, "takes the ledger past its bounds"));
            }
            let r = records.record(rec.producer, rec.first, rec.description);
            if rec.ended.is_some() {
                r.ended = rec.ended;
            }
            at += JOURNAL_HEAD + len + 4;
        }
        if at < bytes.len() {
            tracing::warn!(path = %path.display(), kept = at, cut = bytes.len() - at, "ledger journal: torn tail cut off");
            let f = fs::OpenOptions::new().write(true).open(&path).map_err(io_err(&path))?;
            f.set_len(at as u64).and_then(|()| f.sync_all()).map_err(io_err(&path))?;
        }
        Ok(())
    }
}

const LEDGER_FILE: &str = "ledger";
const JOURNAL_FILE: &str = "ledger.journal";
/// A journal record's length and its complement.
const JOURNAL_HEAD: usize = 8;
/// Past this many bytes the journal is folded into the ledger file.
const JOURNAL_COMPACT: u64 = 4 << 20;
/// Past this many (compaction failing) appends are refused.
const JOURNAL_LIMIT: u64 = 8 << 20;
const MAGIC: &[u8; 4] = b"WLG1";
