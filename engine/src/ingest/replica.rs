//! A partition log's side of replication: reading whole entries to ship them (the primary) and
//! writing shipped entries as they are (the follower).
//!
//! Invariants: a follower's copy holds exactly the primary's entries, byte for byte, at the same
//! versions, so its producers (rebuilt from the entries' producer fields) and its rows are the
//! primary's; shipped entries that overlap what the copy holds are skipped, never written twice;
//! entries that do not continue the copy are refused ([`LogError::Replica`]) and the primary
//! ships from where the copy ends.

use std::fs::{self, OpenOptions};

use weir_wire::Version;
use weir_wire::msg::ReplicaProducer;

use super::chain::{chained, remove_anchor, write_anchor};
use super::ledger::ProducerRecord;
use super::log::{IngestLog, LogError, Segment, io_err, sync_dir};
use super::producers::remember;
use super::reader::LogReader;
use super::segment::{self, Parsed};

/// Bytes of entries a primary keeps for its follower at most; past them it reads its log.
const UNSHIPPED_BYTES: usize = 64 << 20;

/// Entries written and not yet shipped, in order: `bytes` holds whole entries from version
/// `from`, each ending at a mark (its end version and byte offset).
#[derive(Debug, Default)]
pub(super) struct Unshipped {
    from: Version,
    bytes: Vec<u8>,
    marks: std::collections::VecDeque<(Version, usize)>,
    /// Bytes at the front already taken (dropped in bulk, not per message).
    taken: usize,
}

/// Entries of a shipped message that continue the copy, not yet written: `bytes[start..end]`
/// of the message (consecutive entries are contiguous there: written as they are, no copy).
struct Run {
    start: usize,
    end: usize,
    /// The copy's next version once they are.
    next: Version,
    /// The chain after the run's last entry.
    chain: u32,
    /// Their producers' batches: producer, first version, end, rows.
    counted: Vec<(super::segment::ProducerSeq, Version, Version, u32)>,
}

impl IngestLog {
    /// Appends entries shipped from the partition's primary, `bytes` holding whole entries from
    /// version `at` on. Entries the copy holds already are skipped; the rest must continue it.
    /// Returns the copy's next version. Written to the OS, not yet synced.
    pub fn append_entries(&mut self, at: Version, bytes: &[u8]) -> Result<Version, LogError> {
        if at > self.next {
            return Err(self.out_of_step(format!("entries start at {at}, the copy ends at {}", self.next)));
        }
        // Consecutive entries go out in one write (split where a segment ends): a message of
        // many entries costs one system call, not one per entry.
        let mut run = Run { start: 0, end: 0, next: self.next, chain: self.chain, counted: Vec::new() };
        let mut off = 0;
        let mut refused = None;
        while off < bytes.len() {
            let parsed = segment::parse_entry(&bytes[off..], self.cfg.max_entry_bytes);
            let (first, rows, len, from, watermark) = match parsed {
                Parsed::Entry { first, rows, len, from, watermark } => (first, rows, len, from, watermark),
                Parsed::Incomplete => {
                    refused = Some("shipped bytes end inside an entry".to_string());
                    break;
                }
                Parsed::Corrupt(reason) => {
                    refused = Some(format!("shipped entry: {reason}"));
                    break;
                }
            };
            let end = Version(first.0 + Parsed::versions(rows, watermark));
            let at = off;
            off += len;
            if end <= run.next {
                continue; // the copy has it
            }
            if first != run.next {
                refused = Some(format!("entry at {first} does not continue the copy at {}", run.next));
                break;
            }
            if self.active_len + (run.end - run.start) as u64 >= self.cfg.segment_bytes {
                self.write_run(bytes, &mut run)?;
                self.roll()?;
            }
            if run.start == run.end {
                run.start = at;
            }
            run.end = off;
            run.next = end;
            run.chain = chained(run.chain, segment::entry_crc(&bytes[at..]));
            if let Some(from) = from {
                run.counted.push((from, first, end, rows));
            }
        }
        self.write_run(bytes, &mut run)?;
        match refused {
            Some(reason) => Err(self.out_of_step(reason)),
            None => Ok(self.next),
        }
    }

    /// Writes the entries of `run` and takes their producers' batches into account.
    fn write_run(&mut self, bytes: &[u8], run: &mut Run) -> Result<(), LogError> {
        if run.start == run.end {
            return Ok(());
        }
        self.put_bytes(&bytes[run.start..run.end])?;
        run.start = run.end;
        self.next = run.next;
        self.chain = run.chain;
        for (from, first, end, rows) in run.counted.drain(..) {
            remember(&mut self.producers, from, first, Version(end.0 - 1));
            self.ledger.count(from, first, rows as u64);
        }
        Ok(())
    }

    /// Takes the producers' descriptions and ends from the primary (the part of its ledger the
    /// entries do not carry; before the entries that count their rows), writing the ledger when
    /// something changed.
    pub fn adopt_producers(&mut self, facts: &[ReplicaProducer]) -> Result<(), LogError> {
        let mut changed = false;
        for f in facts {
            if !self.ledger.knows(f.producer) && !self.ledger.admits(f.producer, f.description.len()) {
                let reason = "the primary's producers overflow this copy's ledger".to_string();
                return Err(LogError::Refused { reason });
            }
            // The primary's counts cover entries below where this copy began (its log was
            // truncated there), which no entry here will count.
            changed |= self.ledger.adopt(&ProducerRecord {
                producer: f.producer,
                description: f.description.clone(),
                first: f.first,
                rows: f.rows,
                batches: f.batches,
                ended: None,
            });
        }
        if changed {
            // Durable before the entries they came with: reopened, the copy counts on from its
            // entries, which do not hold what the counts cover.
            self.ledger.write(&self.dir)?;
        }
        for f in facts {
            if let Some(w) = f.ended {
                self.ledger.end_durably(&self.dir, f.producer, w)?;
            }
        }
        Ok(())
    }

    /// Empties the copy and starts it again at `at`, where the primary's chain is `seed` (the
    /// primary's copy differs from this one, or no longer holds where this one ends).
    pub fn restart_at(&mut self, at: Version, seed: u32) -> Result<(), LogError> {
        tracing::warn!(dir = %self.dir.display(), from = %self.next, to = %at, "ingest replica starts afresh");
        // In an order a crash at any point leaves openable: the anchor first, then the segments
        // oldest first (what is left is a run of segments without an anchor, whose chain starts
        // at 0: its primary starts it afresh again), the anchor of the new copy, its segment.
        remove_anchor(&self.dir)?;
        for seg in &self.segments {
            fs::remove_file(&seg.path).map_err(io_err(&seg.path))?;
        }
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let path = entry.map_err(io_err(&self.dir))?.path();
            if path.is_file() {
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        self.producers.clear();
        self.ledger.clear();
        write_anchor(&self.dir, at, seed)?;
        let path = segment::segment_path(&self.dir, at);
        self.active = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        self.active_len = 0;
        self.segments = vec![Segment { first: at, path, seed }];
        self.next = at;
        self.chain = seed;
        self.written_unsynced = false;
        self.durable.store(at.0, std::sync::atomic::Ordering::Release);
        self.readable.store(at.0, std::sync::atomic::Ordering::Release);
        sync_dir(&self.dir)
    }

    /// How many producers the ledger records and how many of them ended.
    pub fn ledger_summary(&self) -> (usize, usize) {
        self.ledger.summary()
    }

    /// The entry in `buf` was written at `first` (up to `next`): a replicated partition keeps
    /// it for its follower.
    pub(super) fn keep_for_follower(&mut self, first: Version) {
        if !self.replicated {
            return;
        }
        let u = &mut self.unshipped;
        let end = u.marks.back().map_or(u.from, |m| m.0);
        if end != first || u.bytes.len() - u.taken + self.buf.len() > UNSHIPPED_BYTES {
            // Not what follows (or too far behind): start again here; the rest is read back.
            u.bytes.clear();
            u.marks.clear();
            u.taken = 0;
            u.from = first;
        }
        u.bytes.extend_from_slice(&self.buf);
        u.marks.push_back((self.next, u.bytes.len()));
    }

    /// Appends the kept entries from version `from` on, about `max_bytes` of them (one at
    /// least), to `out`, and forgets them. Returns where they end; `None` when the entries at
    /// `from` are no longer kept (read them from the log).
    pub(super) fn take_unshipped(&mut self, from: Version, max_bytes: usize, out: &mut Vec<u8>) -> Option<Version> {
        let u = &mut self.unshipped;
        // Entries already shipped another way go.
        while u.from < from
            && let Some(&(end, byte_end)) = u.marks.front()
        {
            if end > from {
                return None; // `from` is inside an entry: not where shipping stands
            }
            u.marks.pop_front();
            u.taken = byte_end;
            u.from = end;
        }
        if u.from != from || u.marks.is_empty() {
            return None; // not kept: read from the log
        }
        let start = u.taken;
        while let Some(&(end, byte_end)) = u.marks.front() {
            if byte_end - start > max_bytes && u.taken > start {
                break;
            }
            u.marks.pop_front();
            u.taken = byte_end;
            u.from = end;
        }
        out.extend_from_slice(&u.bytes[start..u.taken]);
        if u.marks.is_empty() {
            u.bytes.clear();
            u.taken = 0;
        } else if u.taken > UNSHIPPED_BYTES / 2 {
            u.bytes.drain(..u.taken);
            for m in &mut u.marks {
                m.1 -= u.taken;
            }
            u.taken = 0;
        }
        Some(u.from)
    }

    fn out_of_step(&self, reason: String) -> LogError {
        LogError::Replica { dir: self.dir.clone(), reason }
    }
}

impl LogReader {
    /// Appends whole durable entries from the reader's position to `out`, about `max_bytes` at
    /// most (one entry at least), as they are on disk. The position must be where an entry
    /// starts. Returns the new position.
    pub fn read_entries(&mut self, max_bytes: usize, out: &mut Vec<u8>) -> Result<Version, LogError> {
        let start = out.len();
        while self.pos < self.durable() && (out.len() == start || out.len() - start < max_bytes) {
            let at = out.len();
            let Some(e) = self.next_entry(out)? else { continue };
            if e.end() <= self.pos {
                out.truncate(at); // before our start (the first entries after opening a segment)
                continue;
            }
            if e.first != self.pos {
                out.truncate(at);
                let reason = format!("version {} is inside the entry at {}, not where one starts", self.pos, e.first);
                return Err(LogError::Corrupt { path: e.segment, offset: e.offset, reason });
            }
            self.pos = e.end();
        }
        Ok(self.pos)
    }
}
