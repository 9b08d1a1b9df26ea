//! Incremental snapshots of an agg's windows: [`WindowChain`], the files the task's last stored
//! snapshot consists of (a full file and the deltas written after it), and how the next snapshot
//! adds to it.
//!
//! A snapshot directory holds the chain's files (hard links to the previous snapshot's) and one
//! new file: either a delta with the entries written since the chain's last snapshot (the
//! slot epochs of [`crate::operator::window`] say which), or, when the chain is long or mostly
//! dead (windows that fired since its files were written), the whole state again, which starts
//! a new chain. The uploader sends only files its index does not know, so a snapshot's upload is
//! what changed since the last one; a restore reads at most [`MAX_FILES`] files of at most about
//! [`MAX_READ_FACTOR`] times the live state.
//!
//! Invariants:
//! - The chain changes only once a snapshot written on it is stored ([`WindowChain::accept`]),
//!   so a delta is always relative to files the store holds; a snapshot whose upload failed is
//!   forgotten, and the next delta covers its changes too.
//! - A restore replaces the chain with the restored checkpoint's files (its entries are stamped
//!   epoch 0, so the next delta holds what changed after the restore); an upload begun before
//!   the restore is not accepted into the new chain (the generation differs).
//! - The chain knows which windows its files hold whole (`covers`): the written windows of its
//!   last stored snapshot. A snapshot whose written windows include one it does not cover, with
//!   entries that may be stamped at or below the chain's epoch (a window a snapshot named until
//!   now), is written whole: a delta would leave those entries out. Until such a snapshot is
//!   stored, the next one is whole again.
//! - Files go LZ4-compressed while that shrinks them: deltas follow what the last file found,
//!   and so do full files, except that after [`PROBE_EVERY`] full files in a row written raw
//!   the next one tries LZ4 again (the data may have changed). Random `f64` aggregates do not
//!   shrink, and trying cost half the write: at 4,000,000 keys with 1 s windows half the
//!   snapshots are full files.

use std::path::{Path, PathBuf};

use weir_wire::CheckpointId;

use super::StateError;
use super::window_state::{ENTRY_LEN, encode_state, write_encoded};
use crate::operator::window::FrozenState;

/// The manifest format from which an agg's files form a chain.
const CHAIN_FORMAT: u32 = 4;

/// Files a chain holds at most (a full file and the deltas after it).
pub const MAX_FILES: usize = 8;
/// A delta is written only while the chain's entries, with it, are at most this many times the
/// live entries; beyond, the whole state is written (what a restore reads stays bounded).
pub const MAX_READ_FACTOR: u64 = 2;
/// After this many full files in a row written raw (the last file had not shrunk), the next
/// full file tries LZ4 again.
pub const PROBE_EVERY: u32 = 8;

/// One file of a chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainFile {
    /// Name in a snapshot directory (`state-<checkpoint id>.sst`).
    pub name: String,
    /// Where the file is on the node (in the newest snapshot directory holding it).
    pub path: PathBuf,
    /// Entries in it.
    pub entries: u64,
}

/// The files of an agg task's last stored snapshot.
#[derive(Debug, Default)]
pub struct WindowChain {
    /// Epoch of the chain's last snapshot ([`FrozenState::epoch`]); 0 for none, or a restore.
    epoch: u32,
    files: Vec<ChainFile>,
    /// The agg's spills before the chain's last snapshot ([`FrozenState::spill_gen`]): after
    /// a spill the entries of older files are in the spill store, so the next file is whole.
    spill_gen: u32,
    /// Bumped by every restore: a write begun before one is not accepted after it.
    generation: u64,
    /// The chain's last file was written without LZ4, or with it and did not shrink: the next
    /// file goes uncompressed (a full file after [`PROBE_EVERY`] raw ones in a row tries LZ4).
    plain: bool,
    /// Full files written raw since the last full file that tried LZ4.
    raw_fulls: u32,
    /// The windows the files hold whole (sorted).
    covers: Vec<i64>,
}

/// A snapshot written on a chain, to [`WindowChain::accept`] once it is stored.
#[derive(Debug)]
pub struct ChainWrite {
    /// The snapshot's files, oldest first (the last one new).
    pub files: Vec<ChainFile>,
    /// Its epoch.
    pub epoch: u32,
    /// Whether the new file holds the whole state (a new chain).
    pub full: bool,
    /// Bytes of the new file.
    pub bytes: u64,
    /// Whether the new file went LZ4-compressed.
    pub lz4: bool,
    spill_gen: u32,
    generation: u64,
    shrank: bool,
    covers: Vec<i64>,
}

/// The name of the state file written for checkpoint `id`.
pub fn state_file_name(id: CheckpointId) -> String {
    format!("state-{:020}.sst", id.0)
}

impl WindowChain {
    /// A chain that holds nothing: the next snapshot writes everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// The chain of a restored snapshot in `dir`, written in manifest `format`, whose files hold
    /// the windows `written` whole: its state files, in chain order. A snapshot of format 3 or
    /// older (one file in the older layout, whose keys would not sort before a delta's) starts
    /// no chain: the next snapshot is written whole.
    pub fn restored(&mut self, dir: &Path, format: u32, written: &[i64]) -> Result<(), StateError> {
        if format < CHAIN_FORMAT {
            self.clear();
            return Ok(());
        }
        let io = super::io_err(dir);
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io)? {
            let e = e.map_err(super::io_err(dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("state-") && name.ends_with(".sst") {
                let len = e.metadata().map_err(super::io_err(dir))?.len();
                // Raw, or compressed by less than half (an entry takes at least 26 bytes): an
                // upper bound of its entries (the sooner the chain is written whole again, the
                // less a restore reads).
                files.push(ChainFile { path: e.path(), name, entries: len * 2 / ENTRY_LEN as u64 });
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        let mut covers = written.to_vec();
        covers.sort_unstable();
        *self = Self { epoch: 0, files, spill_gen: 0, generation: self.generation + 1, covers, ..Self::default() };
        Ok(())
    }

    /// Forgets the chain (a start from nothing).
    pub fn clear(&mut self) {
        *self = Self { generation: self.generation + 1, ..Self::default() };
    }

    /// The chain's files, oldest first.
    pub fn files(&self) -> &[ChainFile] {
        &self.files
    }

    /// Writes snapshot `copy` of checkpoint `id` into `dir` (created; it must not hold other
    /// files): the chain's files linked in and a delta after them, or the whole state alone.
    /// `copy`'s windows are let go once encoded, before the file is written: the operator takes
    /// its shards back without a copy, and rows for them stop waiting (at 4,000,000 keys the
    /// file's writes and compression are most of a snapshot's time).
    pub fn write(&self, copy: &mut FrozenState, id: CheckpointId, dir: &Path) -> Result<ChainWrite, StateError> {
        std::fs::create_dir_all(dir).map_err(super::io_err(dir))?;
        let live = copy.len() as u64;
        let chained: u64 = self.files.iter().map(|f| f.entries).sum();
        let changed = copy.changed_bound(self.epoch) as u64;
        let name = state_file_name(id);
        // A window written now whose entries the files lack, some perhaps stamped at or below
        // the chain's epoch: only a whole file holds them.
        let uncovered = copy.floors.iter().any(|(s, f)| *f <= self.epoch && self.covers.binary_search(s).is_err());
        let may_delta = !uncovered
            && !self.files.is_empty()
            && self.files.len() < MAX_FILES
            && copy.epoch > self.epoch
            && copy.spill_gen == self.spill_gen
            && chained + changed <= MAX_READ_FACTOR * live.max(1)
            && self.files.iter().all(|f| f.name < name);
        // A delta needs the chain's files beside it; one missing makes the snapshot whole.
        let delta = may_delta && self.link_into(dir);
        let mut files = if delta { self.relinked(dir) } else { Vec::new() };
        if !delta {
            // A full file: nothing else of the chain belongs in the directory.
            for f in &self.files {
                let _ = std::fs::remove_file(dir.join(&f.name));
            }
        }
        let path = dir.join(&name);
        let since = delta.then_some(self.epoch);
        let lz4 = !self.plain || (!delta && self.raw_fulls >= PROBE_EVERY);
        let encoded = encode_state(copy, since, id.0);
        let mut copy_covers: Vec<i64> = copy.floors.iter().map(|(s, _)| *s).collect();
        copy_covers.sort_unstable();
        copy.windows = Vec::new();
        let w = write_encoded(&encoded, &path, lz4)?;
        files.push(ChainFile { name, path, entries: w.entries });
        Ok(ChainWrite {
            files,
            epoch: copy.epoch,
            full: !delta,
            bytes: w.bytes,
            lz4,
            spill_gen: copy.spill_gen,
            generation: self.generation,
            shrank: w.shrank,
            covers: copy_covers,
        })
    }

    /// Hard-links the chain's files into `dir` (copies where links fail); false when one is
    /// missing (its snapshot directory was dropped), and the snapshot is written whole.
    fn link_into(&self, dir: &Path) -> bool {
        self.files.iter().all(|f| {
            let to = dir.join(&f.name);
            let _ = std::fs::remove_file(&to);
            std::fs::hard_link(&f.path, &to).is_ok() || std::fs::copy(&f.path, &to).is_ok()
        })
    }

    fn relinked(&self, dir: &Path) -> Vec<ChainFile> {
        self.files.iter().map(|f| ChainFile { path: dir.join(&f.name), ..f.clone() }).collect()
    }

    /// The snapshot `w` is stored: the chain is its files from now on (unless a restore came
    /// in between).
    pub fn accept(&mut self, w: ChainWrite) {
        if w.generation == self.generation {
            self.epoch = w.epoch;
            self.files = w.files;
            self.spill_gen = w.spill_gen;
            self.plain = !w.shrank;
            self.covers = w.covers;
            if w.full {
                self.raw_fulls = if w.lz4 { 0 } else { self.raw_fulls + 1 };
            }
        }
    }
}

#[cfg(test)]
mod tests;
