//! How an agg task's window state is laid out in its [`TaskStore`].
//!
//! ```text
//! key                                  value
//! b'b' start:i64 chunk:u32 (big-endian, up to 4,096 entries of
//!      start with its sign bit flipped   key:u64 count:u64 sum_fx:i128 min:f64 max:f64
//!      so keys sort by time)             (little-endian, 48 bytes each)
//! b"m:progress"                        per upstream: present:u8 max_ts:i64
//! b"m:counters"                        late_rows:u64 rows:u64
//! ```
//!
//! Why blocks of entries and not one RocksDB entry per (window, key): the state lives in memory
//! and is only written at checkpoints and read at restore, never looked up by key, so what
//! matters is the cost of writing it. Writing 10,000 entries one by one through an SST writer
//! took most of a checkpoint's background time on a loaded machine; a few large values cost
//! about a copy and a compression pass.

use super::{StateError, TaskStore};
use crate::operator::window::{Acc, FrozenState, WindowAgg};

const BLOCK_PREFIX: &[u8] = b"b";
const PROGRESS: &[u8] = b"m:progress";
const COUNTERS: &[u8] = b"m:counters";
/// Bytes of one entry in a block.
const ENTRY_LEN: usize = 8 + 8 + 16 + 8 + 8;
/// Entries per block (about 192 KiB).
const BLOCK_ENTRIES: usize = 4096;

fn block_key(start: i64, chunk: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = BLOCK_PREFIX[0];
    k[1..9].copy_from_slice(&((start as u64) ^ (1 << 63)).to_be_bytes());
    k[9..13].copy_from_slice(&chunk.to_be_bytes());
    k
}

/// Replaces the stored window state with the operator's current state (one atomic batch).
pub fn save_window_state(store: &TaskStore, agg: &mut WindowAgg) -> Result<(), StateError> {
    save_frozen_state(store, &agg.freeze())
}

/// Replaces the stored window state with `copy`, as one ingested SST file.
pub fn save_frozen_state(store: &TaskStore, copy: &FrozenState) -> Result<(), StateError> {
    with_state_kvs(copy, |kvs| store.replace_all(kvs))
}

/// Writes `copy` as one SST file at `path` (a task's snapshot of its window state, in the layout
/// above); returns the file's size. [`TaskStore::open_from_snapshot`] reads it back.
pub fn write_window_snapshot(copy: &FrozenState, path: &std::path::Path) -> Result<u64, StateError> {
    with_state_kvs(copy, |kvs| super::write_sst(path, kvs))
}

/// Calls `f` with the state's keys and values in ascending key order.
fn with_state_kvs<R>(
    copy: &FrozenState,
    f: impl for<'a> FnOnce(&mut dyn Iterator<Item = (&'a [u8], &'a [u8])>) -> Result<R, StateError>,
) -> Result<R, StateError> {
    let mut c = [0u8; 16];
    c[0..8].copy_from_slice(&copy.late_rows.to_le_bytes());
    c[8..16].copy_from_slice(&copy.rows.to_le_bytes());
    let mut p = Vec::with_capacity(copy.progress.len() * 9);
    for u in &copy.progress {
        p.push(u.is_some() as u8);
        p.extend_from_slice(&u.unwrap_or(0).to_le_bytes());
    }
    // Entries of one window, in blocks; `entries()` yields each window's entries together, but
    // the blocks are sorted anyway: SST keys must ascend.
    let mut blocks: Vec<([u8; 13], Vec<u8>)> = Vec::new();
    let mut next_chunk: std::collections::BTreeMap<i64, u32> = Default::default();
    let mut filling: Option<(i64, usize)> = None; // window start and index of the block being filled
    for (start, key, a) in copy.entries() {
        let i = match filling {
            Some((s, i)) if s == start && blocks[i].1.len() < BLOCK_ENTRIES * ENTRY_LEN => i,
            _ => {
                let c = next_chunk.entry(start).or_insert(0);
                blocks.push((block_key(start, *c), Vec::with_capacity(BLOCK_ENTRIES * ENTRY_LEN)));
                *c += 1;
                blocks.len() - 1
            }
        };
        filling = Some((start, i));
        let v = &mut blocks[i].1;
        v.extend_from_slice(&key.to_le_bytes());
        v.extend_from_slice(&a.count.to_le_bytes());
        v.extend_from_slice(&a.sum_fx.to_le_bytes());
        v.extend_from_slice(&a.min.to_le_bytes());
        v.extend_from_slice(&a.max.to_le_bytes());
    }
    blocks.sort_unstable_by_key(|b| b.0);
    // Keys ascending: "b…" < "m:counters" < "m:progress".
    let meta = [(COUNTERS, &c[..]), (PROGRESS, &p[..])];
    let mut kvs = blocks.iter().map(|(k, v)| (&k[..], &v[..])).chain(meta);
    f(&mut kvs)
}

/// Loads window state saved by [`save_window_state`] into `agg`. Returns false (and leaves `agg`
/// as it is) when the store holds no state yet.
pub fn load_window_state(store: &TaskStore, agg: &mut WindowAgg) -> Result<bool, StateError> {
    let corrupt = |reason: String| StateError::Corrupt { path: store.path().to_path_buf(), reason };
    let Some(p) = store.get(PROGRESS)? else { return Ok(false) };
    if p.len() % 9 != 0 {
        return Err(corrupt(format!("progress record of {} bytes", p.len())));
    }
    let progress: Vec<Option<i64>> = p
        .chunks_exact(9)
        .map(|c| (c[0] == 1).then(|| i64::from_le_bytes(c[1..9].try_into().expect("8 bytes"))))
        .collect();
    let c = store.get(COUNTERS)?.ok_or_else(|| corrupt("counters missing".into()))?;
    if c.len() != 16 {
        return Err(corrupt(format!("counters record of {} bytes", c.len())));
    }
    let late = u64::from_le_bytes(c[0..8].try_into().expect("8 bytes"));
    let rows = u64::from_le_bytes(c[8..16].try_into().expect("8 bytes"));
    let mut entries = Vec::new();
    store.scan_prefix(BLOCK_PREFIX, |k, v| {
        if k.len() != 13 || v.len() % ENTRY_LEN != 0 {
            return Err(corrupt(format!("window block of {}+{} bytes", k.len(), v.len())));
        }
        let start = (u64::from_be_bytes(k[1..9].try_into().expect("8")) ^ (1 << 63)) as i64;
        for e in v.chunks_exact(ENTRY_LEN) {
            let key = u64::from_le_bytes(e[0..8].try_into().expect("8"));
            let acc = Acc {
                count: u64::from_le_bytes(e[8..16].try_into().expect("8")),
                sum_fx: i128::from_le_bytes(e[16..32].try_into().expect("16")),
                min: f64::from_le_bytes(e[32..40].try_into().expect("8")),
                max: f64::from_le_bytes(e[40..48].try_into().expect("8")),
            };
            entries.push((start, key, acc));
        }
        Ok(())
    })?;
    agg.restore(entries, &progress, late, rows).map_err(corrupt)?;
    Ok(true)
}
