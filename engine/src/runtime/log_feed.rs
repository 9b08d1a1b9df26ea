//! An ingest-log source's feed: its reader, and the idle timer that lets a partition without
//! data stop holding back the stream's watermark (as Flink's `withIdleness`).
//!
//! When no row has come for `idle_after`, the source asks the ingest writer to append a
//! watermark marker (the wall clock minus `idle_after`), again every half of `idle_after` while
//! the partition stays idle. The source does not act on the timer itself: it acts on the marker
//! when it reads it from the log, between the same rows on every replay, so a restore from a
//! checkpoint sees the same watermarks at the same rows and the results stay exactly those of a
//! run without the failure.

use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;
use weir_wire::{Batch, NodeId, StreamId};

use super::router::IngestToken;
use crate::ingest::{AppendRequest, LogHandle, LogReader};

/// What a log source needs to mark its partition idle.
pub(crate) struct IdleTimer {
    pub(crate) after: Duration,
    pub(crate) requests: Sender<AppendRequest<IngestToken>>,
    pub(crate) stream: StreamId,
    pub(crate) partition: u32,
    /// When the last row was read (or the feed started).
    pub(crate) last_data: Instant,
    /// When the last marker was asked for.
    pub(crate) last_marker: Option<Instant>,
}

/// The feed of an ingest-log source.
pub(crate) struct LogFeed {
    pub(crate) reader: LogReader,
    /// The partition's log on this node (what it holds, for a restore's check).
    pub(crate) log: LogHandle,
    pub(crate) partition: u32,
    pub(crate) idle: Option<IdleTimer>,
}

impl LogFeed {
    /// Rows came.
    pub(crate) fn saw_rows(&mut self) {
        if let Some(t) = &mut self.idle {
            t.last_data = Instant::now();
            t.last_marker = None;
        }
    }

    /// Nothing new to read: asks for a marker when the partition has been idle long enough.
    pub(crate) fn tick(&mut self) {
        let Some(t) = &mut self.idle else { return };
        let now = Instant::now();
        let every = (t.after / 2).max(Duration::from_millis(100));
        let due =
            now.duration_since(t.last_data) >= t.after && t.last_marker.is_none_or(|m| now.duration_since(m) >= every);
        if !due {
            return;
        }
        let wall_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let watermark = wall_ms - t.after.as_millis() as i64;
        // The engine's own request: nobody is acknowledged (node 0).
        let token = IngestToken { node: NodeId(0), stream: t.stream, request: 0, epoch: weir_wire::Epoch(0) };
        let req = AppendRequest {
            partition: t.partition,
            batch: Batch::default(),
            from: None,
            watermark: Some(watermark),
            describe: None,
            token,
        };
        // A full queue means rows are coming: no marker needed now.
        if t.requests.try_send(req).is_ok() {
            t.last_marker = Some(now);
            tracing::debug!(stream = %t.stream, partition = t.partition, watermark, "partition idle: marker asked for");
        }
    }
}
