//! What every thread of an engine shares: the stop flag and first failure ([`Shared`]), and the
//! counters ([`EngineStats`], relaxed atomics).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_utils::sync::Unparker;

/// Counters of an engine (relaxed atomics).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Rows read by local sources.
    pub rows_in: AtomicU64,
    /// Rows processed by local aggs.
    pub rows_aggregated: AtomicU64,
    /// Window results emitted by local aggs.
    pub results_emitted: AtomicU64,
    /// Window results written by local sinks.
    pub results_written: AtomicU64,
    /// Late rows dropped by local aggs (added when an agg ends).
    pub late_rows: AtomicU64,
    /// Rows local aggs took on past a checkpoint barrier while waiting for another input's
    /// (unaligned barriers of replay snapshots, `runtime/unaligned.rs`): rows that aligned
    /// barriers would have held back.
    pub rows_past_cuts: AtomicU64,
}

/// The engine's stop flag, first failure and wake-up handles.
pub(crate) struct Shared {
    pub(crate) stop: AtomicBool,
    /// Tasks between a checkpoint's start and their snapshot.
    pub(crate) aligning: Arc<AtomicUsize>,
    pub(crate) failure: OnceLock<String>,
    pub(crate) unparkers: Vec<Unparker>,
    /// The newest later run of the stream a peer was seen in (0: none): the epoch to restart at.
    pub(crate) newer_epoch: AtomicU64,
    /// The node's hold on its membership: no ingest acknowledgement without it.
    pub(crate) tenure: Option<Arc<crate::cluster::Tenure>>,
}

impl Shared {
    pub(crate) fn fail(&self, why: String) {
        if self.failure.get().is_none() {
            tracing::error!(reason = %why, "engine failed");
        }
        let _ = self.failure.set(why);
        self.stop.store(true, Ordering::Release);
        for u in &self.unparkers {
            u.unpark();
        }
    }
}
