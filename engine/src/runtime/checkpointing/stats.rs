//! [`CheckpointLog`]: the statistics of finished checkpoints and of task pauses, for status
//! responses, logs and benchmarks. Written by the coordinator's driver (checkpoints) and the
//! workers (pauses), once per checkpoint: never on the per-row path.

use std::sync::atomic::Ordering;

use weir_wire::msg::{CheckpointOutcome, CheckpointStats};

/// How many finished checkpoints (and task pauses) the statistics keep.
const HISTORY: usize = 4096;

/// Statistics of finished checkpoints and task pauses.
#[derive(Debug, Default)]
pub struct CheckpointLog {
    finished: parking::Mutex<std::collections::VecDeque<CheckpointStats>>,
    pauses_us: parking::Mutex<std::collections::VecDeque<u64>>,
    /// Checkpoints committed and failed since the engine started.
    totals: parking::Mutex<(u64, u64)>,
    /// Consecutive failures past the tolerable number: the stream is unhealthy.
    pub(crate) unhealthy: std::sync::atomic::AtomicBool,
    /// Checkpoints failed since the last commit.
    consecutive_failures: std::sync::atomic::AtomicU32,
}

impl CheckpointLog {
    /// The last finished checkpoints (at most 4,096), oldest first.
    pub fn finished(&self) -> Vec<CheckpointStats> {
        self.finished.lock().iter().cloned().collect()
    }

    /// The last `n` finished checkpoints, oldest first.
    pub fn recent(&self, n: usize) -> Vec<CheckpointStats> {
        let f = self.finished.lock();
        f.iter().skip(f.len().saturating_sub(n)).cloned().collect()
    }

    /// Whether the stream is healthy: fewer consecutive failed checkpoints than tolerated.
    pub fn healthy(&self) -> bool {
        !self.unhealthy.load(Ordering::Relaxed)
    }

    /// Checkpoints failed since the last commit.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Checkpoints committed and failed since the engine started.
    pub fn totals(&self) -> (u64, u64) {
        *self.totals.lock()
    }

    /// Per task checkpoint: alignment plus synchronous snapshot (µs), the last 4,096.
    pub fn pauses_us(&self) -> Vec<u64> {
        self.pauses_us.lock().iter().copied().collect()
    }

    pub(crate) fn push_finished(&self, c: CheckpointStats) {
        {
            let mut t = self.totals.lock();
            match c.outcome {
                CheckpointOutcome::Committed => {
                    t.0 += 1;
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                }
                _ => {
                    t.1 += 1;
                    self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut f = self.finished.lock();
        if f.len() == HISTORY {
            f.pop_front();
        }
        f.push_back(c);
    }

    pub(crate) fn push_pause(&self, us: u64) {
        let mut p = self.pauses_us.lock();
        if p.len() == HISTORY {
            p.pop_front();
        }
        p.push_back(us);
    }
}

/// A tiny mutex wrapper for statistics (not on the data path).
pub mod parking {
    /// A mutex that ignores poisoning (statistics survive a panicking reader).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// Locks.
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
