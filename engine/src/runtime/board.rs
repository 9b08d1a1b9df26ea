//! [`TaskBoard`]: what one task publishes for status responses, without a lock its worker could
//! wait on: row counters (relaxed atomics, per batch) and the checkpoint machine's view (one
//! atomic cell, per protocol input), event-time progress and input queue depth (per poll), read by the router or `Engine::status`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crossbeam_utils::atomic::AtomicCell;
use weir_wire::msg::{TaskHeartbeat, TaskState as WireState, TaskStatus};
use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use crate::checkpoint::TaskState;

/// The checkpoint machine's view, published as one value so a reader never mixes two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Published {
    state: TaskState,
    latest: Option<CheckpointId>,
    latest_version: Version,
    latest_ts_ms: u64,
    failed: Option<CheckpointId>,
}

/// One task's published status.
#[derive(Debug)]
pub(crate) struct TaskBoard {
    task: TaskId,
    published: AtomicCell<Published>,
    pub(crate) rows_in: AtomicU64,
    pub(crate) rows_out: AtomicU64,
    /// Event-time progress (`i64::MIN`: none yet), as [`TaskStatus::watermark_ms`].
    pub(crate) watermark_ms: AtomicI64,
    /// Messages in its input queues, as of its last poll.
    pub(crate) queued: AtomicU64,
    /// An agg's replay since its restore: rows to take again in all, of which taken.
    replay_rows: AtomicU64,
    replayed: AtomicU64,
    /// When it began and when it ended (ms since the board was made; the end 0 while it runs).
    replay_span: AtomicCell<(u64, u64)>,
    made: std::time::Instant,
    /// Its input has ended and it has emitted everything (a bounded stream): reported stopped.
    finished: std::sync::atomic::AtomicBool,
    /// A task of a paused run (it does not run): reported paused.
    paused: bool,
}

impl TaskBoard {
    /// A task's board before it starts: with checkpoints `Uninit` (shown as waiting while it
    /// restores) until its machine publishes; without them, `Ready` from the start.
    pub(crate) fn new(task: TaskId, checkpoints: bool) -> Arc<Self> {
        Self::of(task, checkpoints, false)
    }

    /// The board of a task of a paused run: reported paused, with the stream's last commit
    /// (what it restores when the stream resumes).
    pub(crate) fn paused(task: TaskId, latest: Option<CheckpointId>) -> Arc<Self> {
        let b = Self::of(task, false, true);
        b.published.store(Published { latest, ..b.published.load() });
        b
    }

    fn of(task: TaskId, checkpoints: bool, paused: bool) -> Arc<Self> {
        Arc::new(Self {
            task,
            published: AtomicCell::new(Published {
                state: if checkpoints { TaskState::Uninit } else { TaskState::Ready },
                latest: None,
                latest_version: Version(0),
                latest_ts_ms: 0,
                failed: None,
            }),
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
            watermark_ms: AtomicI64::new(i64::MIN),
            queued: AtomicU64::new(0),
            replay_rows: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            replay_span: AtomicCell::new((0, 0)),
            made: std::time::Instant::now(),
            finished: Default::default(),
            paused,
        })
    }

    /// A restore sends `rows` again (an agg's replay): progress counts from here.
    pub(crate) fn replay_begins(&self, rows: u64) {
        self.replay_rows.store(rows, Ordering::Relaxed);
        self.replayed.store(0, Ordering::Relaxed);
        let now = self.made.elapsed().as_millis() as u64;
        self.replay_span.store((now, if rows == 0 { now } else { 0 }));
    }

    /// The agg took `n` replayed rows; `over`: its replay is over.
    pub(crate) fn replayed(&self, n: u64, over: bool) {
        self.replayed.fetch_add(n, Ordering::Relaxed);
        if over {
            let (from, _) = self.replay_span.load();
            self.replay_span.store((from, self.made.elapsed().as_millis().max(1) as u64));
        }
    }

    /// Publishes the checkpoint machine's view.
    pub(crate) fn publish(&self, m: &crate::checkpoint::TaskMachine) {
        let p = Published {
            state: m.state(),
            latest: m.latest(),
            latest_version: m.latest_version(),
            latest_ts_ms: m.latest_ts().unwrap_or(0),
            failed: m.failed(),
        };
        // Most polls change nothing: a load is cheaper than a store on the shared line.
        if self.published.load() != p {
            self.published.store(p);
        }
    }

    /// The task's summary in this node's heartbeats.
    pub(crate) fn heartbeat(&self, stream: StreamId, epoch: weir_wire::Epoch) -> TaskHeartbeat {
        let p = self.published.load();
        TaskHeartbeat {
            stream,
            epoch,
            task: self.task,
            latest: p.latest,
            latest_version: p.latest_version,
            latest_ts_ms: p.latest_ts_ms,
            active: match p.state {
                TaskState::Checkpointing(id) => Some(id),
                _ => None,
            },
            failed: p.failed,
        }
    }

    /// The task has finished (its worker polls it no more).
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }

    /// Whether the task has finished.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    pub(crate) fn read(&self, stream: StreamId) -> TaskStatus {
        let p = self.published.load();
        let (state, active) = match p.state {
            _ if self.paused => (WireState::Paused, None),
            _ if self.finished.load(Ordering::Acquire) => (WireState::Stopped, None),
            TaskState::Uninit => (WireState::Uninit, None),
            TaskState::Ready => (WireState::Ready, None),
            TaskState::Checkpointing(id) => (WireState::Checkpointing, Some(id)),
            TaskState::Stopped => (WireState::Stopped, None),
        };
        TaskStatus {
            stream,
            task: self.task,
            state,
            latest: p.latest,
            active,
            failed: p.failed,
            rows_in: self.rows_in.load(Ordering::Relaxed),
            rows_out: self.rows_out.load(Ordering::Relaxed),
            watermark_ms: Some(self.watermark_ms.load(Ordering::Relaxed)).filter(|w| *w != i64::MIN),
            queued: self.queued.load(Ordering::Relaxed),
            replay_rows: self.replay_rows.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            replay_ms: match self.replay_span.load() {
                (_, _) if self.replay_rows.load(Ordering::Relaxed) == 0 => 0,
                (from, 0) => (self.made.elapsed().as_millis() as u64).saturating_sub(from),
                (from, to) => to.saturating_sub(from),
            },
        }
    }
}
