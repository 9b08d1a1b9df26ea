//! How a result store lays out window results: in blocks, one per message of results a sink
//! receives from an upstream agg.
//!
//! ```text
//! key (28 bytes, big-endian)                         value
//! stream:u64 start:i64 upstream:u32 first:u64        n × (key:u64 count:u64 sum:f64 min:f64 max:f64)
//!            (sign bit flipped: keys     (order_of      little-endian, 40 bytes each, in
//!             sort by window start)       of its first   order_of(key) order
//!                                         key)
//! ```
//!
//! Why blocks and not one RocksDB entry per result: an entry costs RocksDB about 200–300 ns to
//! sort, write and flush on this machine, and a window over millions of keys yields millions of
//! results at once; a block of up to 512 costs one put. An agg emits a window's results in
//! [`order_of`] order, cut into messages from the window's first result on (see the runtime's
//! `result_chunks`), so the blocks of one (window, upstream) never overlap and a lookup is one
//! seek per upstream; and a replay after a restore sends the same messages, so it rewrites the
//! same blocks (results are upserts, block by block).
//!
//! Keys are ordered by window start first: each checkpoint's new results lie past the older ones,
//! so RocksDB's compactions stay among the newest files instead of rewriting the store.

use weir_wire::{StreamId, TaskId};

use crate::operator::window::{WindowResult, order_of};

/// Bytes of a block key.
pub const KEY_LEN: usize = 28;
/// Bytes of one result in a block.
pub const ENTRY_LEN: usize = 40;

fn flip(start: i64) -> [u8; 8] {
    ((start as u64) ^ (1 << 63)).to_be_bytes()
}

/// The 16-byte prefix of every block of (stream, window start).
pub fn window_prefix(stream: StreamId, start: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[0..8].copy_from_slice(&stream.0.to_be_bytes());
    k[8..16].copy_from_slice(&flip(start));
    k
}

/// The key of the block of `stream`'s window `start` from `upstream` whose first result has
/// order `first`.
pub fn block_key(stream: StreamId, start: i64, upstream: TaskId, first: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0..16].copy_from_slice(&window_prefix(stream, start));
    k[16..20].copy_from_slice(&upstream.0.to_be_bytes());
    k[20..28].copy_from_slice(&first.to_be_bytes());
    k
}

/// A block key's parts: (stream, window start, upstream).
pub fn parse_key(k: &[u8]) -> Option<(StreamId, i64, TaskId)> {
    if k.len() != KEY_LEN {
        return None;
    }
    let u = |i: usize| u64::from_be_bytes(k[i..i + 8].try_into().expect("8 bytes"));
    let up = u32::from_be_bytes(k[16..20].try_into().expect("4 bytes"));
    Some((StreamId(u(0)), (u(8) ^ (1 << 63)) as i64, TaskId(up)))
}

/// Appends the block of `rs` (one window's results, in [`order_of`] order) to `out`.
pub fn encode(rs: &[WindowResult], out: &mut Vec<u8>) {
    out.reserve(rs.len() * ENTRY_LEN);
    for r in rs {
        out.extend_from_slice(&r.key.to_le_bytes());
        out.extend_from_slice(&r.count.to_le_bytes());
        out.extend_from_slice(&r.sum.to_le_bytes());
        out.extend_from_slice(&r.min.to_le_bytes());
        out.extend_from_slice(&r.max.to_le_bytes());
    }
}

/// The `i`-th result of a block of window `start` (the caller checked the block's length).
fn entry(v: &[u8], i: usize, start: i64) -> WindowResult {
    let e = &v[i * ENTRY_LEN..(i + 1) * ENTRY_LEN];
    let f = |j: usize| <[u8; 8]>::try_from(&e[j..j + 8]).expect("8 bytes");
    WindowResult {
        key: u64::from_le_bytes(f(0)),
        start,
        count: u64::from_le_bytes(f(8)),
        sum: f64::from_le_bytes(f(16)),
        min: f64::from_le_bytes(f(24)),
        max: f64::from_le_bytes(f(32)),
    }
}

/// What is wrong with a stored block (of results, or of an agg's window entries). Fatal: the
/// bytes are damaged or not a block (a store reports it as corrupt, naming its path).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// A key or value of a length no block has.
    #[error("{what} block of {key}+{value} bytes")]
    Length { what: &'static str, key: usize, value: usize },
    /// The block promises more entries than it holds.
    #[error("entry {entry} of a window block is cut short")]
    CutShort { entry: u32 },
    /// Bytes after the entries the block promises.
    #[error("{bytes} bytes after a window block's entries")]
    Trailing { bytes: usize },
    /// An entry that counts no row (none is ever written).
    #[error("an entry of key {key} counts no row")]
    NoRow { key: u64 },
}

/// Checks a block's length.
pub fn check(k: &[u8], v: &[u8]) -> Result<(), BlockError> {
    if k.len() != KEY_LEN || v.is_empty() || v.len() % ENTRY_LEN != 0 {
        return Err(BlockError::Length { what: "result", key: k.len(), value: v.len() });
    }
    Ok(())
}

/// Every result of a checked block of window `start`, in order.
pub fn decode(v: &[u8], start: i64) -> impl Iterator<Item = WindowResult> + '_ {
    (0..v.len() / ENTRY_LEN).map(move |i| entry(v, i, start))
}

/// The result of `key` in a checked block of window `start`, if it holds one.
pub fn find(v: &[u8], start: i64, key: u64) -> Option<WindowResult> {
    let want = order_of(key);
    let (mut lo, mut hi) = (0, v.len() / ENTRY_LEN);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let k = u64::from_le_bytes(v[mid * ENTRY_LEN..mid * ENTRY_LEN + 8].try_into().expect("8 bytes"));
        match order_of(k).cmp(&want) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Some(entry(v, mid, start)),
        }
    }
    None
}

/// Splits `rs` (any results) into blocks as an agg would have sent them: by window, each in
/// [`order_of`] order. A sink receives them so already (checked: one comparison per result);
/// this is the way for anything else.
pub fn sorted_windows(rs: &[WindowResult]) -> Vec<Vec<WindowResult>> {
    let mut v = rs.to_vec();
    v.sort_by_key(|r| (r.start, order_of(r.key)));
    // The same (window, key) twice: the later one stands, as it would have in two writes.
    let mut out: Vec<WindowResult> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(l) if l.start == r.start && l.key == r.key => *l = r,
            _ => out.push(r),
        }
    }
    out.chunk_by(|a, b| a.start == b.start).map(<[WindowResult]>::to_vec).collect()
}

/// Whether `rs` is one window's results in [`order_of`] order without repeats: a block as is.
pub fn is_block(rs: &[WindowResult]) -> bool {
    rs.windows(2).all(|w| w[0].start == w[1].start && order_of(w[0].key) < order_of(w[1].key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(key: u64, start: i64) -> WindowResult {
        WindowResult { key, start, count: key + 1, sum: key as f64 / 3.0, min: -1.5, max: 1e300 }
    }

    #[test]
    fn a_block_decodes_to_what_was_encoded_and_finds_each_key() {
        let mut rs: Vec<_> = (0..300u64).map(|k| r(k * 7, -5000)).collect();
        rs.sort_by_key(|r| order_of(r.key));
        assert!(is_block(&rs));
        let mut v = Vec::new();
        encode(&rs, &mut v);
        let k = block_key(StreamId(3), -5000, TaskId(9), order_of(rs[0].key));
        check(&k, &v).unwrap();
        assert_eq!(parse_key(&k), Some((StreamId(3), -5000, TaskId(9))));
        assert_eq!(decode(&v, -5000).collect::<Vec<_>>(), rs);
        for x in &rs {
            assert_eq!(find(&v, -5000, x.key), Some(*x));
        }
        assert_eq!(find(&v, -5000, 1), None);
    }

    #[test]
    fn keys_order_by_stream_then_window_start_including_negative_ones() {
        let a = block_key(StreamId(1), -1, TaskId(5), u64::MAX);
        let b = block_key(StreamId(1), 0, TaskId(0), 0);
        let c = block_key(StreamId(2), i64::MIN, TaskId(0), 0);
        assert!(a < b && b < c);
    }

    #[test]
    fn results_in_any_order_are_cut_into_sorted_blocks_per_window() {
        let rs = vec![r(5, 10), r(1, 0), r(2, 10), r(3, 0)];
        let blocks = sorted_windows(&rs);
        assert_eq!(blocks.len(), 2);
        assert!(blocks.iter().all(|b| is_block(b)));
        assert_eq!(blocks[0].iter().map(|r| r.start).collect::<Vec<_>>(), vec![0, 0]);
        assert!(!is_block(&rs));
    }
}
