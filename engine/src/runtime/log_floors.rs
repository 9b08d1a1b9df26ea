//! Ingest log retention on a node: a thread that reads the floors retention publishes in the
//! store (`backup::floor`) and has the ingest writer delete each partition's segments below
//! them, on every node holding a copy (the primary's and the follower's alike).
//!
//! Invariant: a floor read is never above what a kept checkpoint's restore reads (the
//! record's own invariant), so deleting below it loses nothing a restore needs. A record that
//! cannot be read truncates nothing.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
use weir_wire::StreamId;

use super::router::IngestToken;
use crate::backup::Store;
use crate::backup::floor::read_floors;
use crate::ingest::IngestService;

/// How often the record is read: a few times per retention pass at the usual checkpoint
/// intervals, one small GET each.
const EVERY: Duration = Duration::from_secs(2);

/// The running thread; dropping it stops it.
pub(crate) struct FloorWatch {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FloorWatch {
    /// Starts reading `stream`'s floors from `store` for the logs of `ingest`.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        stream: StreamId,
        ingest: Arc<IngestService<IngestToken>>,
    ) -> Result<Self, std::io::Error> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new().name("weir-log-floors".into()).spawn(move || {
            let mut failing = false;
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                match read_floors(store.as_ref(), stream) {
                    Ok(floors) => {
                        failing = false;
                        for (p, v) in floors {
                            ingest.truncate_below(p, v);
                        }
                    }
                    // Logged once per run of failures: the store is down, or the record damaged.
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(stream = %stream, error = %e, "cannot read the ingest log floors: logs kept whole");
                    }
                    Err(_) => {}
                }
            }
        })?;
        Ok(Self { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for FloorWatch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
