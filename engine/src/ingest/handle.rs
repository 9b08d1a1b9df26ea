//! Read access to one partition's log from threads other than its writer's: readers, what is
//! durable and readable, the producers' ledger, and the log's extent on disk.
//!
//! Invariant: a handle only reads; every change goes through the writer's [`super::IngestLog`].

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use weir_wire::Version;

use super::ledger::{Ledger, ProducerRecord};
use super::log::{LogConfig, LogError, io_err};
use super::reader::LogReader;
use super::segment;

/// Read access to a log that another thread writes.
#[derive(Clone, Debug)]
pub struct LogHandle {
    pub(super) dir: PathBuf,
    pub(super) cfg: LogConfig,
    pub(super) durable: Arc<AtomicU64>,
    pub(super) readable: Arc<AtomicU64>,
    pub(super) standing: Arc<AtomicU8>,
    pub(super) ledger: Ledger,
}

impl LogHandle {
    /// What each producer appended, in the order they first did (rows not yet durable included).
    pub fn producers(&self) -> Vec<ProducerRecord> {
        self.ledger.records()
    }

    /// A page of [`Self::producers`]: from the `from`-th on, descriptions up to about `budget`
    /// bytes (at least one record), and where the next page starts.
    pub fn producers_page(&self, from: usize, budget: usize) -> (Vec<ProducerRecord>, Option<usize>) {
        self.ledger.page(from, budget)
    }

    /// Every version below this is durable.
    pub fn durable_version(&self) -> Version {
        Version(self.durable.load(Ordering::Acquire))
    }

    /// What the partition's source may read: durable here and, for a replicated partition's
    /// primary, on the follower too.
    pub fn readable_version(&self) -> Version {
        Version(self.readable.load(Ordering::Acquire))
    }

    /// Where the partition's copy stands in its in-sync set, on its primary
    /// ([`super::in_sync::Standing`] as a number; 0: no set).
    pub fn standing(&self) -> u8 {
        self.standing.load(Ordering::Acquire)
    }

    /// Whether appends are acknowledged on this node alone (its copy is out of the set).
    pub fn alone(&self) -> bool {
        self.standing() == super::in_sync::Standing::Alone as u8
    }

    /// A reader from `from` (a version the log no longer or not yet holds fails on first read).
    pub fn reader(&self, from: Version) -> LogReader {
        LogReader::new(self.dir.clone(), self.cfg, self.readable.clone(), from)
    }

    /// The oldest version the log holds and the bytes of its segments, read from its directory
    /// (`None` for the version when it has no segment).
    pub fn extent(&self) -> Result<(Option<Version>, u64), LogError> {
        let (mut first, mut bytes) = (None::<Version>, 0);
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let path = entry.map_err(io_err(&self.dir))?.path();
            if let Some(f) = segment::parse_segment_name(&path) {
                first = Some(first.map_or(f, |v| v.min(f)));
                // A segment deleted between the listing and here holds nothing any more.
                bytes += fs::metadata(&path).map_or(0, |m| m.len());
            }
        }
        Ok((first, bytes))
    }
}
