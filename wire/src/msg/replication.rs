//! Ingest-log replication between the node that owns a partition (its primary: the node its
//! source runs on) and the node that keeps a copy (its follower).
//!
//! The primary ships whole, checksummed log entries exactly as they are on its disk, from the
//! version the follower says it holds up to; the follower writes them as they are, so both
//! copies hold the same entries at the same versions and a source moved to the follower reads
//! the same rows, markers and producers. A client's append is acknowledged only once the
//! follower has the entry durably ([`ReplicateAck::next`] past it).

use crate::ids::{StreamId, Version};

archived! {
    /// What a producer said of itself and whether it ended, for the follower's ledger (the
    /// rows and batches it counts from the entries themselves).
    pub struct ReplicaProducer {
        /// Producer id.
        pub producer: u64,
        /// Its description (empty: none).
        pub description: Vec<u8>,
        /// Version of its first row on the partition.
        pub first: Version,
        /// The watermark of its end-of-load marker.
        pub ended: Option<i64>,
        /// Rows it appended, as the primary counts them (a copy that began past some of its
        /// entries takes these).
        pub rows: u64,
        /// Batches it appended: its sequence numbers `0..batches`.
        pub batches: u64,
    }
}

archived! {
    /// Entries of a partition's log, primary to follower. An empty `entries` asks where the
    /// follower is.
    pub struct Replicate {
        /// Stream.
        pub stream: StreamId,
        /// Partition.
        pub partition: u32,
        /// Version of the first entry in `entries`.
        pub at: Version,
        /// The oldest version the primary holds: a follower behind it starts its copy there.
        pub log_first: Version,
        /// The primary's chained checksum before `log_first` (`weir_engine::ingest`'s chain): a
        /// copy started again there starts its chain from it.
        pub log_first_chain: u32,
        /// The follower's copy is not the primary's (it holds more): start it afresh, empty, at
        /// `log_first`.
        pub reset: bool,
        /// Whole log entries in the segment format (`weir_engine::ingest::segment`).
        pub entries: Vec<u8>,
        /// The partition's producers as the primary knows them (sent when they change).
        pub producers: Vec<ReplicaProducer>,
        /// The primary's session with this follower: a new one when its writer starts and at
        /// each reset of the copy. The answer names it; an answer to another is stale.
        pub session: u64,
    }
}

archived! {
    /// The follower's answer to a [`Replicate`]: where its copy ends.
    pub struct ReplicateAck {
        /// Stream.
        pub stream: StreamId,
        /// Partition.
        pub partition: u32,
        /// Every version below this is durable in the follower's copy.
        pub next: Version,
        /// Why the entries were not taken (empty: taken); the primary ships from `next` again.
        pub error: String,
        /// The session of the message answered ([`Replicate::session`]).
        pub session: u64,
        /// The copy's chained checksum at `next`, which stands for every entry below it, when
        /// `next` is where the copy ends: the primary compares it with its own chain there
        /// before it counts on the copy.
        pub chain: Option<u32>,
    }
}
