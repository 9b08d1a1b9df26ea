//! How an agg task's window state is laid out in SST files (one file per snapshot: the whole
//! state, or what changed since an older snapshot, see [`super::WindowChain`]) and read back.
//!
//! ```text
//! key                                          value
//! b'c' start:i64 file:u64 chunk:u32            entries:u32, then up to 4,096 entries of
//!      (big-endian; start with its sign bit     key:u64 count:varint sum_fx:zigzag varint
//!      flipped so keys sort by time)            min:f64 max:f64 (little-endian; about 31 bytes)
//! b'n' file:u64                                late_rows:u64 rows:u64
//!                                              upstreams:u32, each present:u8 max_ts:i64
//!                                              windows:u32, each start:i64; cursor:u32
//! ```
//!
//! Format 4 wrote `b'b'` blocks of fixed 48-byte entries (key, count:u64, sum_fx:i128, min, max),
//! read still; a chain that has both holds the `b` files first (they are older), which is the
//! order they read in. Counts are small and sums mostly fit in 48 bits: the compact entries cut
//! a third of the bytes every checkpoint writes twice (locally and into the store).
//!
//! `file` is the file's place in its chain (the checkpoint id it was written for), so the files
//! of a chain hold disjoint keys and read back in the order they were written: an entry of a
//! later file replaces the same (window, key) of an earlier one. Only the last file's `n` record
//! counts: the windows open at that snapshot (entries of any other window in older files fired
//! since) and the shards of the oldest one already emitted (`cursor`: their entries are dropped).
//! Format 3 and older wrote one file with 13-byte block keys (no `file`) and `m:progress` /
//! `m:counters`: read as a chain of one file whose windows are all open.
//!
//! Why blocks of entries and not one RocksDB entry per (window, key): the state lives in memory
//! and is only written at checkpoints and read at restore, never looked up by key, so what
//! matters is the cost of writing it. Writing 10,000 entries one by one through an SST writer
//! took most of a checkpoint's background time on a loaded machine; a few large values cost
//! about a copy and a compression pass.

use std::collections::BTreeMap;

use super::result_blocks::BlockError;
use super::{StateError, TaskStore};
use crate::operator::window::{Acc, FrozenState, SHARDS, WindowAgg, shard_of};

const BLOCK_PREFIX: u8 = b'c';
/// Blocks of format 4 (fixed 48-byte entries).
const FIXED_PREFIX: u8 = b'b';
const META_PREFIX: u8 = b'n';
const OLD_PROGRESS: &[u8] = b"m:progress";
const OLD_COUNTERS: &[u8] = b"m:counters";
/// Bytes of one entry in a block of format 4, and at most in a compact block.
pub(crate) const ENTRY_LEN: usize = 8 + 8 + 16 + 8 + 8;

fn put_varint(v: &mut Vec<u8>, mut x: u128) {
    while x >= 0x80 {
        v.push(x as u8 | 0x80);
        x >>= 7;
    }
    v.push(x as u8);
}

fn get_varint(b: &mut &[u8]) -> Option<u128> {
    let mut x = 0u128;
    for shift in (0..128).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        x |= u128::from(byte & 0x7F) << shift;
        if byte < 0x80 {
            return Some(x);
        }
    }
    None
}

/// Appends one compact entry.
fn put_entry(v: &mut Vec<u8>, key: u64, a: &Acc) {
    v.extend_from_slice(&key.to_le_bytes());
    put_varint(v, u128::from(a.count));
    put_varint(v, ((a.sum_fx << 1) ^ (a.sum_fx >> 127)) as u128); // zigzag
    v.extend_from_slice(&a.min.to_le_bytes());
    v.extend_from_slice(&a.max.to_le_bytes());
}

/// Reads one compact entry off the front of `b`.
fn get_entry(b: &mut &[u8]) -> Option<(u64, Acc)> {
    let key = u64::from_le_bytes(b.split_first_chunk::<8>()?.0.to_owned());
    *b = &b[8..];
    let count = u64::try_from(get_varint(b)?).ok()?;
    let z = get_varint(b)?;
    let sum_fx = ((z >> 1) as i128) ^ -((z & 1) as i128);
    let min = f64::from_le_bytes(b.split_first_chunk::<8>()?.0.to_owned());
    let max = f64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    *b = &b[16..];
    Some((key, Acc { count, sum_fx, min, max }))
}

/// The entries of a block with key `k` and value `v` (either layout), or why they do not decode.
fn block_entries(k: &[u8], v: &[u8], mut f: impl FnMut(u64, Acc) -> Result<(), BlockError>) -> Result<(), BlockError> {
    let length = || BlockError::Length { what: "window", key: k.len(), value: v.len() };
    if k[0] == FIXED_PREFIX {
        if v.len() % ENTRY_LEN != 0 {
            return Err(length());
        }
        for e in v.chunks_exact(ENTRY_LEN) {
            let acc = Acc {
                count: u64::from_le_bytes(e[8..16].try_into().expect("8")),
                sum_fx: i128::from_le_bytes(e[16..32].try_into().expect("16")),
                min: f64::from_le_bytes(e[32..40].try_into().expect("8")),
                max: f64::from_le_bytes(e[40..48].try_into().expect("8")),
            };
            f(u64::from_le_bytes(e[0..8].try_into().expect("8")), acc)?;
        }
        return Ok(());
    }
    let (n, mut rest) = v.split_first_chunk::<4>().ok_or_else(length)?;
    for entry in 0..u32::from_le_bytes(*n) {
        let (key, acc) = get_entry(&mut rest).ok_or(BlockError::CutShort { entry })?;
        f(key, acc)?;
    }
    if !rest.is_empty() {
        return Err(BlockError::Trailing { bytes: rest.len() });
    }
    Ok(())
}

/// Entries a block holds, from its header (or its length, format 4).
fn block_len(k: &[u8], v: &[u8]) -> usize {
    if k[0] == FIXED_PREFIX {
        v.len() / ENTRY_LEN
    } else {
        v.first_chunk::<4>().map_or(0, |n| u32::from_le_bytes(*n) as usize)
    }
}
/// Entries per block (about 192 KiB).
const BLOCK_ENTRIES: usize = 4096;

fn block_key(start: i64, file: u64, chunk: u32) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = BLOCK_PREFIX;
    k[1..9].copy_from_slice(&((start as u64) ^ (1 << 63)).to_be_bytes());
    k[9..17].copy_from_slice(&file.to_be_bytes());
    k[17..21].copy_from_slice(&chunk.to_be_bytes());
    k
}

/// Replaces the stored window state with the operator's current state (one atomic batch).
pub fn save_window_state(store: &TaskStore, agg: &mut WindowAgg) -> Result<(), StateError> {
    save_frozen_state(store, &agg.freeze())
}

/// Replaces the stored window state with `copy`, as one ingested SST file.
pub fn save_frozen_state(store: &TaskStore, copy: &FrozenState) -> Result<(), StateError> {
    with_state_kvs(copy, None, 0, |kvs| store.replace_all(kvs))
}

/// Writes all of `copy` as one SST file at `path` (a chain of one file); returns the file's
/// size. [`TaskStore::open_from_snapshot`] reads it back.
pub fn write_window_snapshot(copy: &FrozenState, path: &std::path::Path) -> Result<u64, StateError> {
    write_window_snapshot_with(copy, path, true)
}

/// [`write_window_snapshot`], LZ4-compressed or not.
pub fn write_window_snapshot_with(copy: &FrozenState, path: &std::path::Path, lz4: bool) -> Result<u64, StateError> {
    write_window_file(copy, None, 0, path, lz4).map(|w| w.bytes)
}

/// What writing a state file did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileWrite {
    /// The file's size.
    pub bytes: u64,
    /// Its entries.
    pub entries: u64,
    /// Whether it was LZ4-compressed and came out at most 7/8 of its keys and values: worth
    /// compressing the next file too.
    pub shrank: bool,
}

/// Writes `copy` as file `file` of a chain at `path` (LZ4-compressed when `lz4`): every entry,
/// or with `since` the entries written after the snapshot of that epoch.
pub(crate) fn write_window_file(
    copy: &FrozenState,
    since: Option<u32>,
    file: u64,
    path: &std::path::Path,
    lz4: bool,
) -> Result<FileWrite, StateError> {
    write_encoded(&encode_state(copy, since, file), path, lz4)
}

/// Writes an encoded state file at `path` (LZ4-compressed when `lz4`).
pub(crate) fn write_encoded(
    encoded: &EncodedState,
    path: &std::path::Path,
    lz4: bool,
) -> Result<FileWrite, StateError> {
    let (mut entries, mut raw) = (0u64, 0u64);
    let bytes = super::write_sst_with(
        path,
        encoded.kvs().inspect(|(k, v)| {
            raw += (k.len() + v.len()) as u64;
            entries += if k[0] == BLOCK_PREFIX { block_len(k, v) as u64 } else { 0 };
        }),
        lz4,
    )?;
    Ok(FileWrite { bytes, entries, shrank: lz4 && bytes * 8 <= raw * 7 })
}

/// The `n` record of `copy`.
fn meta_record(copy: &FrozenState) -> Vec<u8> {
    let mut m = Vec::with_capacity(28 + copy.progress.len() * 9 + copy.windows.len() * 8);
    m.extend_from_slice(&copy.late_rows.to_le_bytes());
    m.extend_from_slice(&copy.rows.to_le_bytes());
    m.extend_from_slice(&(copy.progress.len() as u32).to_le_bytes());
    for u in &copy.progress {
        m.push(u.is_some() as u8);
        m.extend_from_slice(&u.unwrap_or(0).to_le_bytes());
    }
    m.extend_from_slice(&(copy.windows.len() as u32).to_le_bytes());
    for (start, _) in &copy.windows {
        m.extend_from_slice(&start.to_le_bytes());
    }
    m.extend_from_slice(&(copy.cursor as u32).to_le_bytes());
    m
}

/// Calls `f` with the keys and values of file `file` in ascending key order.
fn with_state_kvs<R>(
    copy: &FrozenState,
    since: Option<u32>,
    file: u64,
    f: impl for<'a> FnOnce(&mut dyn Iterator<Item = (&'a [u8], &'a [u8])>) -> Result<R, StateError>,
) -> Result<R, StateError> {
    f(&mut encode_state(copy, since, file).kvs())
}

/// File `file`'s keys and values, encoded: the blocks of entries and the `n` record.
pub(crate) struct EncodedState {
    blocks: Vec<([u8; 21], Vec<u8>, u32)>,
    meta_key: [u8; 9],
    meta: Vec<u8>,
}

impl EncodedState {
    /// Keys ascending: "b…" < "n…".
    fn kvs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.blocks.iter().map(|(k, v, _)| (&k[..], &v[..])).chain([(&self.meta_key[..], &self.meta[..])])
    }
}

/// Encodes file `file` of `copy` (every entry, or with `since` those written after that
/// snapshot) in memory: the shards can be let go before the file is written.
pub(crate) fn encode_state(copy: &FrozenState, since: Option<u32>, file: u64) -> EncodedState {
    // Entries of one window, in blocks; windows come oldest first, so the blocks ascend.
    let mut blocks: Vec<([u8; 21], Vec<u8>, u32)> = Vec::new();
    let mut next_chunk: BTreeMap<i64, u32> = Default::default();
    let mut filling: Option<(i64, usize)> = None; // window start and index of the block being filled
    // A whole file holds every entry: restored ones too, which are stamped 0 and no delta sees.
    let entries: Box<dyn Iterator<Item = (i64, u64, crate::operator::window::Acc)> + '_> = match since {
        Some(epoch) => Box::new(copy.changed_since(epoch)),
        None => Box::new(copy.entries()),
    };
    for (start, key, a) in entries {
        let i = match filling {
            Some((s, i)) if s == start && (blocks[i].2 as usize) < BLOCK_ENTRIES => i,
            _ => {
                let c = next_chunk.entry(start).or_insert(0);
                let v = Vec::with_capacity(BLOCK_ENTRIES * 32);
                blocks.push((block_key(start, file, *c), v, 0));
                *c += 1;
                blocks.len() - 1
            }
        };
        filling = Some((start, i));
        let (_, v, n) = &mut blocks[i];
        if *n == 0 {
            v.extend_from_slice(&[0; 4]); // the count, set below
        }
        put_entry(v, key, &a);
        *n += 1;
    }
    for (_, v, n) in &mut blocks {
        v[..4].copy_from_slice(&n.to_le_bytes());
    }
    blocks.sort_unstable_by_key(|b| b.0);
    let mut meta_key = [0u8; 9];
    meta_key[0] = META_PREFIX;
    meta_key[1..9].copy_from_slice(&file.to_be_bytes());
    EncodedState { blocks, meta_key, meta: meta_record(copy) }
}

/// What a chain's last `n` record says.
pub(crate) struct Meta {
    pub(crate) progress: Vec<Option<i64>>,
    pub(crate) late_rows: u64,
    pub(crate) rows: u64,
    /// `None`: format 3 and older (every window in the file is open).
    pub(crate) windows: Option<Vec<i64>>,
    pub(crate) cursor: usize,
}

/// A little-endian reader over one record.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

fn parse_meta(v: &[u8]) -> Option<Meta> {
    let mut r = Reader(v);
    let (late_rows, rows) = (r.u64()?, r.u64()?);
    let ups = r.u32()? as usize;
    let progress = (0..ups)
        .map(|_| {
            let present = r.take::<1>()?[0] == 1;
            let t = r.u64()? as i64;
            Some(present.then_some(t))
        })
        .collect::<Option<Vec<_>>>()?;
    let n = r.u32()? as usize;
    let windows = (0..n).map(|_| r.u64().map(|s| s as i64)).collect::<Option<Vec<_>>>()?;
    let cursor = r.u32()? as usize;
    r.0.is_empty().then_some(Meta { progress, late_rows, rows, windows: Some(windows), cursor })
}

/// The format-3 records, when there is no `n` record.
fn old_meta(store: &TaskStore, corrupt: &dyn Fn(String) -> StateError) -> Result<Option<Meta>, StateError> {
    let Some(p) = store.get(OLD_PROGRESS)? else { return Ok(None) };
    if p.len() % 9 != 0 {
        return Err(corrupt(format!("progress record of {} bytes", p.len())));
    }
    let progress = p
        .chunks_exact(9)
        .map(|c| (c[0] == 1).then(|| i64::from_le_bytes(c[1..9].try_into().expect("8 bytes"))))
        .collect();
    let c = store.get(OLD_COUNTERS)?.ok_or_else(|| corrupt("counters missing".into()))?;
    if c.len() != 16 {
        return Err(corrupt(format!("counters record of {} bytes", c.len())));
    }
    let late_rows = u64::from_le_bytes(c[0..8].try_into().expect("8 bytes"));
    let rows = u64::from_le_bytes(c[8..16].try_into().expect("8 bytes"));
    Ok(Some(Meta { progress, late_rows, rows, windows: None, cursor: 0 }))
}

/// Loads window state saved by [`save_window_state`] (or a chain of files, see the module docs)
/// into `agg`. Returns false (and leaves `agg` as it is) when the store holds no state yet.
pub fn load_window_state(store: &TaskStore, agg: &mut WindowAgg) -> Result<bool, StateError> {
    let corrupt = |reason: String| StateError::Corrupt { path: store.path().to_path_buf(), reason };
    let (mut windows, mut cursor) = (None, 0);
    let cell = std::cell::RefCell::new(&mut *agg);
    let found = scan_window_state(
        store,
        |meta, sizes| {
            (windows, cursor) = (meta.windows.clone(), meta.cursor);
            let mut agg = cell.borrow_mut();
            agg.restore_begin(sizes, &meta.progress, meta.late_rows, meta.rows).map_err(|e| corrupt(e.to_string()))
        },
        |start, key, acc| cell.borrow_mut().restore_put(start, key, acc),
    )?;
    if !found {
        return Ok(false);
    }
    agg.restore_end();
    if let Some(windows) = &windows {
        agg.reopen(windows, cursor);
    }
    Ok(true)
}

/// Reads the state of a chain of files: `begin` gets its last record and the entries expected
/// per window and shard, then `entry` every entry still to emit (those of the oldest window's
/// shards emitted already are dropped), in chain order (a later one of the same window and key
/// replaces the earlier). Returns false, calling neither, when the store holds no state.
pub(crate) fn scan_window_state(
    store: &TaskStore,
    begin: impl FnOnce(&Meta, Vec<(i64, Vec<usize>)>) -> Result<(), StateError>,
    mut entry: impl FnMut(i64, u64, Acc),
) -> Result<bool, StateError> {
    let corrupt = |reason: String| StateError::Corrupt { path: store.path().to_path_buf(), reason };
    let mut last: Option<Vec<u8>> = None;
    store.scan_prefix(&[META_PREFIX], |k, v| {
        if k.len() != 9 {
            return Err(corrupt(format!("state record key of {} bytes", k.len())));
        }
        last = Some(v.to_vec());
        Ok(())
    })?;
    let meta = match last {
        Some(v) => parse_meta(&v).ok_or_else(|| corrupt(format!("state record of {} bytes", v.len())))?,
        None => match old_meta(store, &corrupt)? {
            Some(m) => m,
            None => return Ok(false),
        },
    };
    let open: Option<std::collections::HashSet<i64>> = meta.windows.as_ref().map(|w| w.iter().copied().collect());
    let oldest = meta.windows.as_ref().and_then(|w| w.first().copied());
    let check = |k: &[u8], v: &[u8]| {
        if !(k.len() == 13 || k.len() == 21) {
            return Err(corrupt(format!("window block of {}+{} bytes", k.len(), v.len())));
        }
        let start = (u64::from_be_bytes(k[1..9].try_into().expect("8")) ^ (1 << 63)) as i64;
        // Entries of windows that fired after their file was written are not state.
        Ok(open.as_ref().is_none_or(|o| o.contains(&start)).then_some(start))
    };
    // Two passes, so that no copy of the state is held besides the tables: the entries per
    // window (blocks' lengths) to size them, then the entries straight into them.
    let mut per_window: BTreeMap<i64, usize> = BTreeMap::new();
    for prefix in [FIXED_PREFIX, BLOCK_PREFIX] {
        store.scan_prefix(&[prefix], |k, v| {
            if let Some(start) = check(k, v)? {
                *per_window.entry(start).or_insert(0) += block_len(k, v);
            }
            Ok(())
        })?;
    }
    // Keys spread evenly over the shards (`order_of` mixes them); an eighth more for the spread.
    let sizes = per_window.into_iter().map(|(s, n)| (s, vec![n / SHARDS + n / SHARDS / 8 + 1; SHARDS])).collect();
    begin(&meta, sizes)?;
    // Format 4's blocks first: in a chain that has both, they are the older files.
    for prefix in [FIXED_PREFIX, BLOCK_PREFIX] {
        store.scan_prefix(&[prefix], |k, v| {
            let Some(start) = check(k, v)? else { return Ok(()) };
            let emitted = if oldest == Some(start) { meta.cursor } else { 0 };
            block_entries(k, v, |key, acc| {
                if acc.count == 0 {
                    return Err(BlockError::NoRow { key });
                }
                if shard_of(key) >= emitted {
                    entry(start, key, acc);
                }
                Ok(())
            })
            .map_err(|e| corrupt(e.to_string()))
        })?;
    }
    Ok(true)
}

#[cfg(test)]
#[path = "window_state_tests.rs"]
mod tests;
