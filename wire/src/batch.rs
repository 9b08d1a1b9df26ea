//! The columnar batch that carries rows through the engine and over the wire.
//!
//! A batch is three equally long columns (`ts`, `key`, `value`). On the wire it is an rkyv archive
//! that the receiver reads in place: [`ArchivedBatch`] hands out the archived columns as slices of
//! little-endian primitives, so reading a received batch never copies its columns.
//!
//! Invariant: the three columns have the same length. [`Batch::push`] keeps it; for a batch from the
//! wire, [`ArchivedBatch::check`] enforces it during frame validation, before anyone reads a row.

use rkyv::rend::{f64_le, i64_le, u64_le};

/// A column's element as a native value: the native types themselves (a batch in memory), and
/// the little-endian ones of an archived batch read in place (a no-op on little-endian machines).
/// Lets one loop read the columns of either without copying them.
pub trait Native: Copy {
    /// The native type.
    type Out: Copy;
    /// The value.
    fn native(self) -> Self::Out;
}

macro_rules! native {
    ($($t:ty => $out:ty, $f:expr;)*) => {$(
        impl Native for $t {
            type Out = $out;
            #[inline(always)]
            fn native(self) -> $out {
                $f(self)
            }
        }
    )*};
}

native! {
    i64 => i64, |x| x;
    u64 => u64, |x| x;
    f64 => f64, |x| x;
    i64_le => i64, |x: i64_le| x.to_native();
    u64_le => u64, |x: u64_le| x.to_native();
    f64_le => f64, |x: f64_le| x.to_native();
}

/// A record: event time in milliseconds, series key, value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Event time, milliseconds since the epoch.
    pub ts: i64,
    /// Series id.
    pub key: u64,
    /// Measured value.
    pub value: f64,
}

/// Rows in columnar form.
#[derive(Clone, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct Batch {
    /// Event times (ms).
    pub ts: Vec<i64>,
    /// Series keys.
    pub key: Vec<u64>,
    /// Values.
    pub value: Vec<f64>,
}

impl Batch {
    /// An empty batch with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self { ts: Vec::with_capacity(rows), key: Vec::with_capacity(rows), value: Vec::with_capacity(rows) }
    }

    /// Appends one row.
    #[inline]
    pub fn push(&mut self, ts: i64, key: u64, value: f64) {
        self.ts.push(ts);
        self.key.push(key);
        self.value.push(value);
    }

    /// Number of rows.
    #[inline]
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    /// Whether the batch has no rows.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    /// Rows the batch holds without growing a column.
    pub fn capacity(&self) -> usize {
        self.ts.capacity().min(self.key.capacity()).min(self.value.capacity())
    }

    /// Removes every row, keeping the allocations.
    pub fn clear(&mut self) {
        self.ts.clear();
        self.key.clear();
        self.value.clear();
    }

    /// The rows, in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = Row> + '_ {
        (0..self.len()).map(|i| Row { ts: self.ts[i], key: self.key[i], value: self.value[i] })
    }

    /// Size of the three columns in bytes (what a batch frame mostly consists of).
    pub fn column_bytes(&self) -> usize {
        self.len() * (8 + 8 + 8)
    }
}

impl ArchivedBatch {
    /// Checks the invariant that bytecheck cannot: all columns have the same length.
    pub fn check(&self) -> Result<(), crate::msg::CheckError> {
        let (t, k, v) = (self.ts.len(), self.key.len(), self.value.len());
        if t == k && k == v {
            Ok(())
        } else {
            Err(crate::msg::CheckError::Columns { what: "batch (ts, key, value)", lens: vec![t, k, v] })
        }
    }

    /// Number of rows.
    #[inline]
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    /// Whether the batch has no rows.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    /// The event-time column, in place.
    #[inline]
    pub fn ts_column(&self) -> &[i64_le] {
        self.ts.as_slice()
    }

    /// The key column, in place.
    #[inline]
    pub fn key_column(&self) -> &[u64_le] {
        self.key.as_slice()
    }

    /// The value column, in place.
    #[inline]
    pub fn value_column(&self) -> &[f64_le] {
        self.value.as_slice()
    }

    /// One row, read in place. Panics if `i` is out of range.
    #[inline]
    pub fn row(&self, i: usize) -> Row {
        Row { ts: self.ts[i].to_native(), key: self.key[i].to_native(), value: self.value[i].to_native() }
    }

    /// The rows, read in place without copying the columns.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = Row> + '_ {
        let (ts, key, value) = (self.ts.as_slice(), self.key.as_slice(), self.value.as_slice());
        let n = ts.len().min(key.len()).min(value.len());
        (0..n).map(move |i| Row { ts: ts[i].to_native(), key: key[i].to_native(), value: value[i].to_native() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_that_of_the_smallest_column() {
        let mut b = Batch::with_capacity(64);
        assert!(b.capacity() >= 64);
        b.key = Vec::with_capacity(8);
        assert_eq!(b.capacity(), b.key.capacity());
    }

    #[test]
    fn an_archived_batchs_columns_read_as_native_give_the_rows() {
        let mut b = Batch::default();
        for (t, k, v) in [(-5i64, u64::MAX, -0.25f64), (1_700_000_000_000, 7, f64::MAX), (0, 0, f64::NAN)] {
            b.push(t, k, v);
        }
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&b).unwrap();
        let a = rkyv::access::<ArchivedBatch, rkyv::rancor::Error>(&bytes).unwrap();
        let ts: Vec<i64> = a.ts_column().iter().map(|x| x.native()).collect();
        let keys: Vec<u64> = a.key_column().iter().map(|x| x.native()).collect();
        let values: Vec<u64> = a.value_column().iter().map(|x| x.native().to_bits()).collect();
        assert_eq!((ts, keys), (b.ts.clone(), b.key.clone()));
        assert_eq!(values, b.value.iter().map(|v| v.native().to_bits()).collect::<Vec<_>>());
    }
}
