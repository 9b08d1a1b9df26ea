//! The result store's column families, and reading across them in key order.
//!
//! Each upstream's blocks go to a column family of their own (`u<task id>`). An agg emits its
//! windows oldest first and each window in key order, so its blocks' keys only grow: the files
//! its column family flushes do not overlap, and RocksDB moves them down the levels instead of
//! rewriting them. In one column family the aggs' blocks of a window would interleave, every
//! flushed file overlap the next, and compaction rewrite every result once: at 4,000,000 keys
//! as many bytes as the results themselves, written, and uploaded again at the next checkpoint.
//!
//! Readers see one ordered set of blocks: [`Merged`] walks the column families side by side.
//! The default column family holds what older Weirs wrote (one column family for all); a block
//! key found in an upstream's column family and in the default one is read from the upstream's
//! (written later, by a replay over a restored older store).

use rocksdb::{ColumnFamily, DB, DBRawIterator, ReadOptions};

use weir_wire::TaskId;

/// The column family of `upstream`'s blocks.
pub(super) fn cf_name(upstream: TaskId) -> String {
    format!("u{}", upstream.0)
}

/// The handles of `names` that exist, then the default column family's.
pub(super) fn handles<'a>(db: &'a DB, names: &[String]) -> Vec<&'a ColumnFamily> {
    let mut cfs: Vec<&ColumnFamily> = names.iter().filter_map(|n| db.cf_handle(n)).collect();
    cfs.extend(db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME));
    cfs
}

/// A block's key and value.
pub(super) type Block = (Vec<u8>, Vec<u8>);

/// Blocks of several column families in key order, each key once (from the first column family
/// that holds it).
pub(super) struct Merged<'a> {
    its: Vec<DBRawIterator<'a>>,
}

impl<'a> Merged<'a> {
    /// Positioned at the first key at or after `from`, below `upper` when given.
    pub(super) fn new(db: &'a DB, cfs: &[&ColumnFamily], from: &[u8], upper: Option<Vec<u8>>) -> Self {
        let its = cfs
            .iter()
            .map(|cf| {
                let mut ro = ReadOptions::default();
                if let Some(u) = &upper {
                    ro.set_iterate_upper_bound(u.clone());
                }
                let mut it = db.raw_iterator_cf_opt(*cf, ro);
                it.seek(from);
                it
            })
            .collect();
        Merged { its }
    }

    /// The next (key, value), or the first error of any column family's iterator.
    pub(super) fn next_block(&mut self) -> Result<Option<Block>, rocksdb::Error> {
        let mut best: Option<usize> = None;
        for (i, it) in self.its.iter().enumerate() {
            if let Some(k) = it.key()
                && best.is_none_or(|b| k < self.its[b].key().expect("valid"))
            {
                best = Some(i);
            }
        }
        let Some(b) = best else {
            for it in &self.its {
                it.status()?;
            }
            return Ok(None);
        };
        let key = self.its[b].key().expect("valid").to_vec();
        let value = self.its[b].value().expect("valid").to_vec();
        for it in &mut self.its {
            if it.key() == Some(&key[..]) {
                it.next();
            }
        }
        Ok(Some((key, value)))
    }
}
