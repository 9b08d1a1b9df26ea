//! One partition's ingest log: append, sync, read from any version, truncate below a version.
//!
//! Segment files rather than RocksDB: the log is append-only and read sequentially, so a file per
//! segment gives one `write` per batch and one `fdatasync` per group commit with no compaction,
//! no write amplification and a format we can check byte for byte. Retention deletes whole files.
//!
//! Invariants:
//! - Versions are dense: the log holds every version in `[first, next)` (a row, or a watermark
//!   marker: [`IngestLog::append_marker`]).
//! - `durable` never exceeds what was synced under the policy; readers ([`LogReader`]) never read at
//!   or past it, so nothing the engine processes can vanish in a crash.
//! - On open, a torn tail (an incomplete or checksum-failing *last* entry of the *last* segment) is
//!   cut and logged; damage anywhere else is refused as corruption, never silently dropped
//!   (`open.rs`). Other threads read through a [`super::LogHandle`] (`handle.rs`).
//! - Appends are idempotent per producer ([`IngestLog::append_from`]): a producer's batches on a
//!   partition carry sequence numbers 0, 1, 2, ...; the log keeps the versions of each producer's
//!   last [`DEDUP_WINDOW`] batches (rebuilt on open from the entries, and from the `producers`
//!   file for producers whose entries retention deleted), so a batch sent again is answered with
//!   its original versions and never stored twice, and a gap is refused.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use weir_wire::{Batch, Version};

use super::chain::{chained, write_anchor};
use super::handle::LogHandle;
use super::ledger::{Ledger, MAX_DESCRIPTION, MAX_LEDGER_BYTES, MAX_PRODUCERS, ProducerRecord};
pub use super::producers::{AppendOutcome, DEDUP_WINDOW};
use super::producers::{Producers, remember, write_producers};
use super::reader::LogReader;
use super::segment::{self, ProducerSeq};

/// Errors of the ingest log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The disk refused (retryable once space or permissions are fixed).
    #[error("ingest log {path}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// Bytes on disk are damaged somewhere other than the tail (fatal: needs an operator).
    #[error("ingest log segment {path} is corrupt at byte {offset}: {reason}")]
    Corrupt {
        /// Segment.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What.
        reason: String,
    },
    /// A producer's batch does not follow its last one (fatal for that request: the client must
    /// send the missing batches first).
    #[error("producer {producer:#x} sent batch {got} on this partition, expected {expected} (a gap)")]
    SequenceGap {
        /// Producer.
        producer: u64,
        /// The sequence number that would have been accepted.
        expected: u64,
        /// The one that came.
        got: u64,
    },
    /// A batch sent again that is older than what the log remembers of its producer (fatal for
    /// that request: whether it was stored cannot be told).
    #[error("producer {producer:#x} sent batch {got} again, older than the last {DEDUP_WINDOW} remembered")]
    TooOld {
        /// Producer.
        producer: u64,
        /// Its sequence number.
        got: u64,
    },
    /// A producer's request the log does not take: a description too long, more producers than
    /// the ledger records (fatal for that request).
    #[error("{reason}")]
    Refused {
        /// Why.
        reason: String,
    },
    /// Entries shipped to a follower's copy do not continue it (retryable: the primary ships
    /// from where the copy ends).
    #[error("replica of {dir}: {reason}")]
    Replica {
        /// The partition's log directory.
        dir: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A version outside what the log holds was asked for (fatal for that request).
    #[error("version {asked} is outside the log's range {first}..{next}")]
    OutOfRange {
        /// Requested version.
        asked: Version,
        /// Oldest version kept.
        first: Version,
        /// Next version to be written.
        next: Version,
    },
}

impl LogError {
    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, LogError::Io { .. })
    }
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io { path: path.to_path_buf(), source }
}

/// Ingest log settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Start a new segment past this size.
    pub segment_bytes: u64,
    /// Largest entry accepted (and believed when reading).
    pub max_entry_bytes: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { segment_bytes: 64 << 20, max_entry_bytes: 64 << 20 }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub(super) first: Version,
    pub(super) path: PathBuf,
    /// The chain before `first` (see `chain.rs`).
    pub(super) seed: u32,
}

/// The writing side of one partition's log. Owned by one thread.
#[derive(Debug)]
pub struct IngestLog {
    pub(super) dir: PathBuf,
    pub(super) cfg: LogConfig,
    pub(super) segments: Vec<Segment>,
    pub(super) active: File,
    pub(super) active_len: u64,
    pub(super) next: Version,
    pub(super) written_unsynced: bool,
    pub(super) durable: Arc<AtomicU64>,
    /// What readers (the partition's source) may read: `durable`, or for a partition replicated
    /// to a follower, the part of it the follower holds too ([`IngestLog::publish_replicated`]),
    /// so no row a source processed can be missing from the copy a moved source reads.
    pub(super) readable: Arc<AtomicU64>,
    pub(super) replicated: bool,
    /// Where the follower's copy stands in the partition's in-sync set
    /// ([`super::in_sync::Standing`]); `Alone`: readers see what is durable here, and appends
    /// are acknowledged on this node's sync alone.
    pub(super) standing: Arc<AtomicU8>,
    /// Where the follower's copy ends (durably), as it last said.
    pub(super) copy: Version,
    /// A replicated partition's entries written since they were last shipped, as written (the
    /// primary ships them from here instead of reading them back; `replica.rs`).
    pub(super) unshipped: super::replica::Unshipped,
    pub(super) buf: Vec<u8>,
    /// Each producer's last batches: (sequence number, first and last version), oldest first.
    pub(super) producers: Producers,
    /// What each producer appended, shared with the log's handles.
    pub(super) ledger: Ledger,
    /// The chain at `next` (`chain.rs`): a copy's answer carries it, so that its primary can
    /// tell whether the copy is a prefix of its log.
    pub(super) chain: u32,
}

impl IngestLog {
    /// Version the next appended row gets.
    pub fn next_version(&self) -> Version {
        self.next
    }

    /// Oldest version still kept.
    pub fn first_version(&self) -> Version {
        self.segments.first().map_or(self.next, |s| s.first)
    }

    /// Every version below this is durable.
    pub fn durable_version(&self) -> Version {
        Version(self.durable.load(Ordering::Acquire))
    }

    /// Appends `batch` (written to the OS, not yet synced). Returns the versions of its first and
    /// last rows. An empty batch gets no versions (`None`).
    pub fn append(&mut self, batch: &Batch) -> Result<Option<(Version, Version)>, LogError> {
        self.write(batch, None)
    }

    /// Appends `batch` for a producer, idempotently: batch `from.seq` of `from.producer` is
    /// stored once however often it is sent; sent again, it is answered with the versions it was
    /// stored at (durable once the original is). Its batches count from 0 without gaps: a
    /// sequence number past the next one is refused ([`LogError::SequenceGap`]), as is an empty
    /// batch's (it takes no number: [`AppendOutcome::New`]`(None)`).
    pub fn append_from(&mut self, from: ProducerSeq, batch: &Batch) -> Result<AppendOutcome, LogError> {
        let last = self.producers.get(&from.producer).and_then(|q| q.back().map(|b| b.0));
        // A copy that began past a producer's entries knows its batches from the ledger only.
        let expected = last.map_or_else(|| self.ledger.batches(from.producer).unwrap_or(0), |s| s + 1);
        if from.seq < expected && last.is_none() {
            return Err(LogError::TooOld { producer: from.producer, got: from.seq });
        }
        if from.seq < expected {
            let q = &self.producers[&from.producer];
            // Sequence numbers in the window are consecutive: the batch is at a known offset.
            let oldest = q.front().expect("not empty").0;
            return match from.seq.checked_sub(oldest) {
                Some(i) => {
                    let (_, first, last) = q[i as usize];
                    Ok(AppendOutcome::Duplicate(first, last))
                }
                None => Err(LogError::TooOld { producer: from.producer, got: from.seq }),
            };
        }
        if from.seq > expected {
            return Err(LogError::SequenceGap { producer: from.producer, expected, got: from.seq });
        }
        if !self.ledger.admits(from.producer, 0) {
            return Err(full_ledger());
        }
        let v = self.write(batch, Some(from))?;
        if let Some((first, last)) = v {
            remember(&mut self.producers, from, first, last);
            self.ledger.count(from, first, batch.len() as u64);
        }
        Ok(AppendOutcome::New(v))
    }

    /// Records what `producer` says of itself (`weir load`: the parameters of its rows), durably,
    /// before its first rows; a producer the log knows keeps its record (a first batch sent
    /// again). See [`super::ledger`].
    pub fn describe(&mut self, producer: u64, description: &[u8]) -> Result<(), LogError> {
        if self.ledger.knows(producer) {
            return Ok(());
        }
        if description.len() > MAX_DESCRIPTION {
            let reason = format!("a producer's description of {} bytes exceeds {MAX_DESCRIPTION}", description.len());
            return Err(LogError::Refused { reason });
        }
        if !self.ledger.admits(producer, description.len()) {
            return Err(full_ledger());
        }
        self.ledger.describe_durably(&self.dir, producer, self.next, description)
    }

    /// Notes that `producer`'s load ended with a marker of `watermark` (written and synced with
    /// the ledger: markers do not name their producer). A producer the log does not know is
    /// not recorded.
    pub fn end_load(&mut self, producer: u64, watermark: i64) -> Result<(), LogError> {
        self.ledger.end_durably(&self.dir, producer, watermark).map(drop)
    }

    /// What each producer appended, in the order they first did.
    pub fn producers(&self) -> Vec<ProducerRecord> {
        self.ledger.records()
    }

    /// A page of [`Self::producers`] (see [`LogHandle::producers_page`]).
    pub fn producers_page(&self, from: usize, budget: usize) -> (Vec<ProducerRecord>, Option<usize>) {
        self.ledger.page(from, budget)
    }

    /// Appends a watermark marker (written to the OS, not yet synced): no row appended after it
    /// has an earlier event time than `watermark_ms` that counts as on time. It takes one version
    /// (returned) and holds no row; sources read it between the same rows on every replay.
    pub fn append_marker(&mut self, watermark_ms: i64) -> Result<Version, LogError> {
        if self.active_len >= self.cfg.segment_bytes {
            self.roll()?;
        }
        let at = self.next;
        self.buf.clear();
        segment::encode_marker(at, watermark_ms, &mut self.buf);
        self.put()?;
        self.chain = chained(self.chain, segment::entry_crc(&self.buf));
        self.next = Version(at.0 + 1);
        self.keep_for_follower(at);
        Ok(at)
    }

    /// Writes `self.buf` at the end of the active segment.
    pub(super) fn put(&mut self) -> Result<(), LogError> {
        let buf = std::mem::take(&mut self.buf);
        let written = self.put_bytes(&buf);
        self.buf = buf;
        written
    }

    /// Writes whole entries at the end of the active segment.
    pub(super) fn put_bytes(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        let path = &self.segments.last().expect("segment").path;
        if let Err(e) = self.active.write_all(bytes) {
            // A partial write leaves a torn entry; cut it so the next append starts clean.
            let _ = self.active.set_len(self.active_len);
            return Err(io_err(path)(e));
        }
        self.active_len += bytes.len() as u64;
        self.written_unsynced = true;
        Ok(())
    }

    fn write(&mut self, batch: &Batch, from: Option<ProducerSeq>) -> Result<Option<(Version, Version)>, LogError> {
        if batch.is_empty() {
            return Ok(None);
        }
        if batch.column_bytes() > self.cfg.max_entry_bytes {
            let path = self.segments.last().expect("segment").path.clone();
            let reason = format!("entry of {} bytes exceeds {}", batch.column_bytes(), self.cfg.max_entry_bytes);
            return Err(LogError::Io { path, source: io::Error::new(io::ErrorKind::InvalidInput, reason) });
        }
        if self.active_len >= self.cfg.segment_bytes {
            self.roll()?;
        }
        let first = self.next;
        self.buf.clear();
        segment::encode_entry(first, batch, from, &mut self.buf);
        self.put()?;
        self.chain = chained(self.chain, segment::entry_crc(&self.buf));
        self.next = Version(first.0 + batch.len() as u64);
        self.keep_for_follower(first);
        Ok(Some((first, Version(self.next.0 - 1))))
    }

    /// Makes everything appended so far durable (`fdatasync`) and publishes it to readers.
    pub fn sync(&mut self) -> Result<Version, LogError> {
        if self.written_unsynced {
            let path = &self.segments.last().expect("segment").path;
            self.active.sync_data().map_err(io_err(path))?;
            self.written_unsynced = false;
        }
        self.publish(self.next);
        Ok(self.next)
    }

    /// Publishes what was written without syncing (the `None` policy: survives a process crash,
    /// not a power loss).
    pub fn publish_unsynced(&mut self) -> Version {
        self.publish(self.next);
        self.next
    }

    fn publish(&mut self, durable: Version) {
        self.durable.store(durable.0, Ordering::Release);
        // A replicated partition's readers see what both copies hold: the follower's answer
        // may have come before this sync (the primary ships before it syncs).
        if self.replicated {
            // Never back: a reader may have read up to there.
            let readable = if self.is_alone() { durable } else { durable.min(self.copy) };
            self.readable.fetch_max(readable.0, Ordering::AcqRel);
        } else {
            self.readable.store(durable.0, Ordering::Release);
        }
    }

    /// From now on readers see only what [`Self::publish_replicated`] says the follower holds
    /// (nothing past the log's first version until it does).
    pub fn replicate(&mut self) {
        self.replicated = true;
        self.copy = self.first_version();
        self.unshipped = Default::default();
        self.readable.store(self.first_version().0, Ordering::Release);
    }

    /// The follower holds every version below `copy` durably: readers may read up to there (and
    /// never past what is durable here; while the copy is out of the in-sync set, all of that).
    pub fn publish_replicated(&mut self, copy: Version) {
        self.copy = copy;
        let v = if self.is_alone() { self.durable_version() } else { copy.min(self.durable_version()) };
        // Never back: a reader may have read up to there (while the copy was out of the set).
        self.readable.fetch_max(v.0, Ordering::AcqRel);
    }

    /// Where the follower's copy stands ([`super::in_sync::Standing`]).
    pub fn standing(&self) -> super::in_sync::Standing {
        use super::in_sync::Standing;
        match self.standing.load(Ordering::Acquire) {
            1 => Standing::In,
            2 => Standing::Unknown,
            3 => Standing::Out,
            4 => Standing::Alone,
            _ => Standing::NoSet,
        }
    }

    /// Whether appends are acknowledged on this node alone (the copy is out of the set).
    pub fn is_alone(&self) -> bool {
        self.standing.load(Ordering::Acquire) == super::in_sync::Standing::Alone as u8
    }

    /// Where the follower's copy stands: `Alone` lets readers see all that is durable here;
    /// anything else, what the copy holds too (and what they were let see before).
    pub fn set_standing(&mut self, standing: super::in_sync::Standing) {
        self.standing.store(standing as u8, Ordering::Release);
        self.publish_replicated(self.copy);
    }

    /// A reader of what is durable here, replicated or not (the primary's shipping).
    pub fn durable_reader(&self, from: Version) -> LogReader {
        LogReader::new(self.dir.clone(), self.cfg, self.durable.clone(), from)
    }

    pub(super) fn roll(&mut self) -> Result<(), LogError> {
        self.sync()?;
        let path = segment::segment_path(&self.dir, self.next);
        self.active = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        self.active_len = 0;
        self.segments.push(Segment { first: self.next, path, seed: self.chain });
        sync_dir(&self.dir)
    }

    /// Deletes whole segments whose rows are all below `version` (retention). Returns the new
    /// oldest version kept.
    pub fn truncate_below(&mut self, version: Version) -> Result<Version, LogError> {
        if self.segments.len() < 2 || self.segments[1].first > version {
            return Ok(self.first_version());
        }
        // The producers and ledger files are synced and describe what the segments hold: only
        // durable entries may be in them (a batch they name that a crash then took back would
        // be answered as stored).
        self.sync()?;
        // The producers' last batches outlive their entries: a batch sent again after its
        // segment went is still recognised.
        write_producers(&self.dir, &self.producers)?;
        self.ledger.write(&self.dir)?;
        // The chain before the new first segment, before anything goes: a crash in between
        // leaves segments below the anchor, which the next open deletes.
        let keep = self.segments.iter().rposition(|s| s.first <= version).expect("checked above");
        write_anchor(&self.dir, self.segments[keep].first, self.segments[keep].seed)?;
        while self.segments.len() > 1 && self.segments[1].first <= version {
            let seg = self.segments.remove(0);
            fs::remove_file(&seg.path).map_err(io_err(&seg.path))?;
        }
        sync_dir(&self.dir)?;
        Ok(self.first_version())
    }

    /// The chain before the log's first version.
    pub fn first_chain(&self) -> u32 {
        self.segments.first().map_or(self.chain, |s| s.seed)
    }

    /// The chain at `end`: `None` when no entry ends there (inside an entry, before the log's
    /// first version or past its end).
    pub(super) fn chain_ending_at(&self, end: Version) -> Result<Option<u32>, LogError> {
        if end == self.next {
            return Ok(Some(self.chain));
        }
        if end == self.first_version() {
            return Ok(Some(self.first_chain()));
        }
        if end < self.first_version() || end > self.next {
            return Ok(None);
        }
        // The entry ending at `end` holds `end - 1`, in the last segment starting at or below it.
        let seg = self.segments.iter().rev().find(|s| s.first < end).expect("end is past the first version");
        let mut r = LogReader::new(self.dir.clone(), self.cfg, self.durable.clone(), Version(end.0 - 1));
        r.chain_ending_at(end, seg.seed)
    }

    /// A reader starting at `from` that sees rows as they become durable.
    pub fn reader(&self, from: Version) -> Result<LogReader, LogError> {
        let (first, next) = (self.first_version(), self.next);
        if from < first || from > next {
            return Err(LogError::OutOfRange { asked: from, first, next });
        }
        Ok(self.handle().reader(from))
    }

    /// A handle that other threads use to read this log.
    pub fn handle(&self) -> LogHandle {
        LogHandle {
            dir: self.dir.clone(),
            cfg: self.cfg,
            durable: self.durable.clone(),
            readable: self.readable.clone(),
            standing: self.standing.clone(),
            ledger: self.ledger.clone(),
        }
    }
}

fn full_ledger() -> LogError {
    LogError::Refused {
        reason: format!(
            "the partition's ledger is full ({MAX_PRODUCERS} producers or {} MiB of descriptions): no room for another",
            MAX_LEDGER_BYTES >> 20
        ),
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}
