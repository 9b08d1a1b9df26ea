//! What each producer appended to a partition, for as long as the log exists: its description
//! (opaque bytes the producer gives with its first batch; `weir load` puts the parameters its
//! rows are a pure function of there), the version its rows start at, how many rows and batches
//! it appended. `weir verify` recomputes an ingest stream's results from it, and a second load
//! learns where the first one ended.
//!
//! Invariants: a producer's record counts each of its batches once, in sequence order (a batch
//! sent again is not counted again); records stay in the order their producers first appended.
//! The `ledger` file holds the records as of its writing (a description is written and synced
//! before the batch it came with is appended; retention writes it before deleting a segment), and
//! a reopened log counts on from its entries, each of which names its producer and batch.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use weir_wire::Version;

use super::log::{LogError, io_err, sync_dir};
use super::segment::ProducerSeq;

/// Longest description a producer may give (bytes).
pub const MAX_DESCRIPTION: usize = 64 << 10;
/// Producers a partition's ledger records at most (each load is one; a client that invents
/// producers without end is refused rather than growing the ledger without bound).
pub const MAX_PRODUCERS: usize = 100_000;

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
}

impl Records {
    fn record(&mut self, producer: u64, first: Version, description: Vec<u8>) -> &mut ProducerRecord {
        let i = *self.index.entry(producer).or_insert_with(|| {
            self.list.push(ProducerRecord { producer, description, first, rows: 0, batches: 0, ended: None });
            self.list.len() - 1
        });
        &mut self.list[i]
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Records> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every producer's record, in the order they first appended.
    pub fn records(&self) -> Vec<ProducerRecord> {
        self.lock().list.clone()
    }

    /// Forgets every record (a follower's copy started afresh).
    pub(super) fn clear(&self) {
        let mut r = self.lock();
        r.list.clear();
        r.index.clear();
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

    /// Whether `producer` has a record or there is room for one.
    pub(super) fn admits(&self, producer: u64) -> bool {
        let r = self.lock();
        r.index.contains_key(&producer) || r.list.len() < MAX_PRODUCERS
    }

    /// Records `producer` with `description`, its rows to start at `first` (the caller checked
    /// [`Self::admits`]).
    pub(super) fn describe(&self, producer: u64, first: Version, description: &[u8]) {
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

    /// The end-of-load watermark `producer` noted last.
    pub(super) fn ended(&self, producer: u64) -> Option<i64> {
        let r = self.lock();
        r.index.get(&producer).and_then(|&i| r.list[i].ended)
    }

    /// Notes that `producer` (known) ended with a marker of `watermark`; `false` if unknown.
    pub(super) fn end(&self, producer: u64, watermark: i64) -> bool {
        let mut r = self.lock();
        let Some(&i) = r.index.get(&producer) else { return false };
        r.list[i].ended = Some(watermark);
        true
    }

    /// Writes the records to `dir`'s `ledger` file (a new file renamed over the old, synced).
    ///
    /// Format: `WLG1`, `u32` count, then per record producer, first version, rows, batches
    /// (`u64` each), whether it ended (`u8`) and the end's watermark (`i64`), description length
    /// (`u32`) and bytes; then a CRC32C of all before it;
    /// little-endian.
    pub(super) fn write(&self, dir: &Path) -> Result<(), LogError> {
        let mut out = Vec::new();
        {
            let r = self.lock();
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&(r.list.len() as u32).to_le_bytes());
            for rec in &r.list {
                for w in [rec.producer, rec.first.0, rec.rows, rec.batches] {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                out.push(u8::from(rec.ended.is_some()));
                out.extend_from_slice(&rec.ended.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&(rec.description.len() as u32).to_le_bytes());
                out.extend_from_slice(&rec.description);
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let tmp = dir.join("ledger.tmp");
        let path = dir.join(LEDGER_FILE);
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&out).and_then(|()| f.sync_all()).map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(dir)
    }

    /// The `ledger` file's records, an empty ledger when there is none; a damaged file, or one
    /// of another format, is refused as corruption.
    pub(super) fn read(dir: &Path) -> Result<Ledger, LogError> {
        let path = dir.join(LEDGER_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ledger::default()),
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
        let mut at = 8;
        let mut records = Records::default();
        for _ in 0..n {
            const FIXED: usize = 32 + 1 + 8 + 4;
            let Some(fixed) = body.get(at..at + FIXED) else { return Err(corrupt(at, "ends inside a record")) };
            let w = |i: usize| u64::from_le_bytes(fixed[i..i + 8].try_into().expect("8 bytes"));
            let ended = match fixed[32] {
                0 => None,
                1 => Some(w(33) as i64),
                _ => return Err(corrupt(at, "a record's end flag is neither 0 nor 1")),
            };
            let len = u32::from_le_bytes(fixed[41..45].try_into().expect("4 bytes")) as usize;
            let Some(description) = body.get(at + FIXED..at + FIXED + len) else {
                return Err(corrupt(at, "ends inside a description"));
            };
            if records.index.contains_key(&w(0)) {
                return Err(corrupt(at, "a producer recorded twice"));
            }
            let rec = records.record(w(0), Version(w(8)), description.to_vec());
            (rec.rows, rec.batches, rec.ended) = (w(16), w(24), ended);
            at += FIXED + len;
        }
        if at != body.len() {
            return Err(corrupt(at, "bytes after the last record"));
        }
        Ok(Ledger(Arc::new(Mutex::new(records))))
    }
}

const LEDGER_FILE: &str = "ledger";
const MAGIC: &[u8; 4] = b"WLG1";
