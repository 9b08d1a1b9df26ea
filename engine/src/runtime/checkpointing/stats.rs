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
    /// Checkpoints failed or not started since the last commit.
    consecutive_failures: std::sync::atomic::AtomicU32,
    /// Checkpoints that could not start since the engine started.
    not_started: std::sync::atomic::AtomicU64,
    /// The first cause of failure since the last commit (empty after a commit).
    cause: parking::Mutex<String>,
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

    /// Checkpoints failed or not started since the last commit.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Checkpoints committed and failed since the engine started.
    pub fn totals(&self) -> (u64, u64) {
        *self.totals.lock()
    }

    /// Checkpoints that could not start since the engine started (ids not reserved).
    pub fn not_started(&self) -> u64 {
        self.not_started.load(Ordering::Relaxed)
    }

    /// Why the first checkpoint since the last commit failed or could not start; empty when
    /// none has since the last commit.
    pub fn cause(&self) -> String {
        self.cause.lock().clone()
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
                    self.cause.lock().clear();
                }
                CheckpointOutcome::Failed { ref reason } => {
                    t.1 += 1;
                    self.failed(&format!("checkpoint {} failed: {reason}", c.checkpoint.0));
                }
                CheckpointOutcome::InProgress => {}
            }
        }
        let mut f = self.finished.lock();
        if f.len() == HISTORY {
            f.pop_front();
        }
        f.push_back(c);
    }

    /// A checkpoint could not start (its ids were not reserved): `reason`.
    pub(crate) fn push_not_started(&self, reason: &str) {
        self.not_started.fetch_add(1, Ordering::Relaxed);
        self.failed(&format!("no checkpoint could start: {reason}"));
    }

    fn failed(&self, cause: &str) {
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
        let mut first = self.cause.lock();
        if first.is_empty() {
            *first = cut(cause, weir_wire::msg::MAX_CAUSE);
        }
    }

    pub(crate) fn push_pause(&self, us: u64) {
        let mut p = self.pauses_us.lock();
        if p.len() == HISTORY {
            p.pop_front();
        }
        p.push_back(us);
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
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
