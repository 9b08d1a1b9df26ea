//! Identifier newtypes shared by every crate.
//!
//! Each id is a plain integer on the wire (little-endian, via rkyv) and a distinct type in Rust so a
//! task id can never be passed where a node id is expected. Ids are ordered: checkpoint ids, versions
//! and sequence numbers only ever grow, and the protocol compares them.

use std::fmt;

macro_rules! ids {
    ($( $(#[$doc:meta])* $name:ident($int:ty), $archived:ident = $prefix:literal; )*) => {$(
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
            rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
        )]
        #[rkyv(derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash))]
        #[repr(transparent)]
        pub struct $name(pub $int);

        impl $name {
            /// The raw integer.
            #[inline]
            pub const fn get(self) -> $int {
                self.0
            }
        }

        impl From<$int> for $name {
            #[inline]
            fn from(v: $int) -> Self {
                Self(v)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl $archived {
            /// The id in native form, read in place from an archive.
            #[inline]
            pub fn get(&self) -> $name {
                $name(self.0.to_native())
            }
        }

        impl From<&$archived> for $name {
            #[inline]
            fn from(v: &$archived) -> Self {
                v.get()
            }
        }
    )*};
}

ids! {
    /// A member of the cluster (one `weir node` process, or one client such as `weir load`).
    NodeId(u32), ArchivedNodeId = "n";
    /// A continuous query: its DAG of source, agg and sink tasks.
    StreamId(u64), ArchivedStreamId = "s";
    /// A run of a stream: each start of a stream takes a greater epoch than its earlier runs, and
    /// every message between its tasks carries it, so a run never takes an earlier run's frames
    /// (a node that restarts one stream leaves the others on it alone).
    Epoch(u64), ArchivedEpoch = "e";
    /// One task of a stream, unique within the cluster. Peers are always matched by task id, never by
    /// the node they run on (several tasks share a node).
    TaskId(u32), ArchivedTaskId = "t";
    /// A checkpoint, allocated monotonically and durably by the coordinator.
    CheckpointId(u64), ArchivedCheckpointId = "chk-";
    /// The coordinator's transaction that drives one checkpoint attempt.
    TransId(u64), ArchivedTransId = "tx";
    /// A position in a partition's ingest log (the seed's "ver").
    Version(u64), ArchivedVersion = "v";
    /// A per-channel sequence number of data, watermark and trigger frames; a gap means loss.
    Seq(u64), ArchivedSeq = "#";
}

impl CheckpointId {
    /// The id after this one.
    #[inline]
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl Seq {
    /// The sequence number after this one.
    #[inline]
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_display_with_their_prefix() {
        assert_eq!(NodeId(3).to_string(), "n3");
        assert_eq!(TaskId(7).to_string(), "t7");
        assert_eq!(StreamId(1).to_string(), "s1");
        assert_eq!(CheckpointId(42).to_string(), "chk-42");
        assert_eq!(TransId(9).to_string(), "tx9");
        assert_eq!(Version(100).to_string(), "v100");
        assert_eq!(Seq(5).to_string(), "#5");
    }

    #[test]
    fn ids_order_numerically() {
        assert!(CheckpointId(9) < CheckpointId(10));
        assert_eq!(CheckpointId(9).next(), CheckpointId(10));
        assert_eq!(Seq(0).next(), Seq(1));
    }
}
