//! The three task kinds. A task is polled by its worker: it does a bounded amount of work and
//! says whether it made progress, so one worker can interleave many tasks without blocking.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use crossbeam_utils::sync::Unparker;

use weir_wire::{Batch, CheckpointId, StreamId, TaskId, TransId};

use super::EngineStats;
use super::channel::{ChannelError, Inputs, Msg, Outputs, Rows};
use super::status::TaskBoard;
use crate::ingest::LogReader;
use crate::operator::generator::Generator;
use crate::operator::window::{WindowAgg, WindowResult};
use crate::spec::Dispatch;
use crate::state::ResultStore;

/// What a poll achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// Did work; poll again soon.
    Busy,
    /// Nothing to do until input arrives (or a rate limit allows more).
    Idle,
    /// Waiting for downstream room.
    Blocked,
    /// Done for good.
    Finished,
}

/// Errors that stop a task.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The state or result store failed.
    #[error("task {task}: {source}")]
    State {
        /// Task.
        task: TaskId,
        /// Store error.
        #[source]
        source: crate::state::StateError,
    },
    /// The checkpoint side failed in a way the protocol cannot absorb (its state store broke).
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The ingest log failed.
    #[error("task {task}: {source}")]
    Log {
        /// Task.
        task: TaskId,
        /// Log error.
        #[source]
        source: crate::ingest::LogError,
    },
}

/// Messages handled per poll before the worker moves to its next task.
pub(crate) const BUDGET: usize = 32;

/// The budget of a task whose worker also runs a task in the middle of a checkpoint (aligning,
/// or a source waiting to emit its barrier): that task gets a turn every couple of messages of
/// the others' work instead of every 32 (about 2.6 ms of agg work, more for a sink).
pub(crate) const SHARED_BUDGET: usize = 2;

/// Window results per message from an agg to a sink.
const RESULTS_PER_MSG: usize = 512;

/// Where a source's rows come from.
pub(crate) enum Feed {
    Generator { generator: Generator, limit: Option<u64>, rate: Option<u64>, started: Option<(Instant, u64)> },
    Log(LogReader),
}

pub(crate) struct SourceTask {
    pub(crate) id: TaskId,
    pub(crate) feed: Feed,
    /// Rows emitted so far: the source's offset (checkpointVer for a log source).
    pub(crate) offset: u64,
    pub(crate) batch_rows: usize,
    pub(crate) dispatch: Dispatch,
    pub(crate) out: Outputs,
    pub(crate) builders: Vec<Batch>,
    pub(crate) max_ts: i64,
    pub(crate) scratch: Batch,
    pub(crate) ended: bool,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) board: Arc<TaskBoard>,
    /// A checkpoint trigger queued behind the data already emitted.
    pub(crate) queued_trigger: Option<CheckpointId>,
}

impl SourceTask {
    fn poll(&mut self) -> Result<Poll, TaskError> {
        if !self.out.flush()? {
            return Ok(Poll::Blocked);
        }
        if self.queued_trigger.is_some() {
            // Reached: the checkpoint machine records the offset and snapshots before more rows.
            return Ok(Poll::Busy);
        }
        if self.ended {
            return Ok(Poll::Finished);
        }
        let n_out = self.out.len();
        let rows = match &mut self.feed {
            Feed::Generator { generator, limit, rate, started } => {
                let mut n = self.batch_rows as u64;
                if let Some(l) = limit {
                    n = n.min(l.saturating_sub(self.offset));
                }
                if let Some(r) = rate {
                    // The rate counts from where this run started (a restored source resumes at
                    // its offset, not at zero).
                    let offset = self.offset;
                    let (t0, base) = *started.get_or_insert_with(|| (Instant::now(), offset));
                    let allowed = base + (t0.elapsed().as_secs_f64() * *r as f64) as u64;
                    n = n.min(allowed.saturating_sub(self.offset));
                    if n == 0 && limit.is_none_or(|l| self.offset < l) {
                        return Ok(Poll::Idle);
                    }
                }
                if n == 0 {
                    self.ended = true;
                    self.out.broadcast(|| Msg::End);
                    self.out.flush()?;
                    return Ok(Poll::Busy);
                }
                for o in self.offset..self.offset + n {
                    let (ts, key, value) = generator.row(o);
                    self.max_ts = self.max_ts.max(ts);
                    self.builders[self.dispatch.pick(key, n_out)].push(ts, key, value);
                }
                n
            }
            Feed::Log(reader) => {
                self.scratch.clear();
                let n = reader
                    .read(self.batch_rows, &mut self.scratch)
                    .map_err(|source| TaskError::Log { task: self.id, source })?;
                if n == 0 {
                    return Ok(Poll::Idle);
                }
                for r in self.scratch.rows() {
                    self.max_ts = self.max_ts.max(r.ts);
                    self.builders[self.dispatch.pick(r.key, n_out)].push(r.ts, r.key, r.value);
                }
                n as u64
            }
        };
        self.offset += rows;
        self.stats.rows_in.fetch_add(rows, Ordering::Relaxed);
        self.board.rows_out.fetch_add(rows, Ordering::Relaxed);
        let cap = self.batch_rows / n_out.max(1) + 16;
        for i in 0..n_out {
            if !self.builders[i].is_empty() {
                let b = std::mem::replace(&mut self.builders[i], Batch::with_capacity(cap));
                self.out.push(i, Msg::Rows(Rows::Local(b)));
            }
        }
        let max_ts = self.max_ts;
        self.out.broadcast(|| Msg::Progress(max_ts));
        self.out.flush()?;
        Ok(Poll::Busy)
    }
}

pub(crate) struct AggTask {
    pub(crate) agg: WindowAgg,
    pub(crate) inp: Inputs,
    pub(crate) out: Outputs,
    pub(crate) builders: Vec<Vec<WindowResult>>,
    pub(crate) dispatch: Dispatch,
    pub(crate) ended: bool,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) board: Arc<TaskBoard>,
    /// Barriers taken from the inputs, for the checkpoint machine: (input, id, trans).
    pub(crate) barriers: Vec<(usize, CheckpointId, TransId)>,
    /// Inputs whose end of stream was taken, for the checkpoint machine.
    pub(crate) ended_inputs: Vec<usize>,
}

impl AggTask {
    fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Poll, TaskError> {
        if !self.out.flush()? {
            return Ok(Poll::Blocked);
        }
        if self.ended {
            return Ok(Poll::Finished);
        }
        self.inp.retry_grants();
        let n_out = self.out.len();
        let mut worked = false;
        for _ in 0..budget {
            if attention.load(Ordering::Relaxed) {
                break;
            }
            let Some((i, m)) = self.inp.next_msg() else { break };
            worked = true;
            let builders = &mut self.builders;
            let dispatch = self.dispatch;
            match m {
                Msg::Rows(rows) => {
                    let agg = &mut self.agg;
                    rows.for_each(|t, k, v| agg.add(t, k, v));
                    self.stats.rows_aggregated.fetch_add(rows.len() as u64, Ordering::Relaxed);
                    self.board.rows_in.fetch_add(rows.len() as u64, Ordering::Relaxed);
                }
                Msg::Progress(ts) => self.agg.advance(i, ts, |r| builders[dispatch.pick(r.key, n_out)].push(r)),
                Msg::End => {
                    self.agg.advance(i, i64::MAX, |r| builders[dispatch.pick(r.key, n_out)].push(r));
                    self.ended_inputs.push(i);
                }
                Msg::Results(_) => tracing::error!("agg received window results; ignored"),
                Msg::Trigger { id, trans } => {
                    // Stop here: the checkpoint machine decides (close this input, or snapshot)
                    // before anything after the barrier is taken.
                    self.barriers.push((i, id, trans));
                    break;
                }
            }
            // Emitting fired windows may fill the outputs: stop taking input until they drain.
            if self.builders.iter().any(|b| !b.is_empty()) {
                break;
            }
        }
        for i in 0..n_out {
            if !self.builders[i].is_empty() {
                let rs = std::mem::take(&mut self.builders[i]);
                self.stats.results_emitted.fetch_add(rs.len() as u64, Ordering::Relaxed);
                self.board.rows_out.fetch_add(rs.len() as u64, Ordering::Relaxed);
                // A window firing yields thousands of results at once; in messages of bounded
                // size the sink's work per message stays short, so a control message or a
                // barrier on the sink's worker never waits for one large write.
                if rs.len() <= RESULTS_PER_MSG {
                    self.out.push(i, Msg::Results(rs));
                } else {
                    for c in rs.chunks(RESULTS_PER_MSG) {
                        self.out.push(i, Msg::Results(c.to_vec()));
                    }
                }
            }
        }
        if self.inp.all_ended() {
            self.ended = true;
            self.stats.late_rows.fetch_add(self.agg.late_rows(), Ordering::Relaxed);
            self.out.broadcast(|| Msg::End);
        }
        self.out.flush()?;
        Ok(if worked { Poll::Busy } else { Poll::Idle })
    }
}

pub(crate) struct SinkTask {
    pub(crate) id: TaskId,
    pub(crate) stream: StreamId,
    pub(crate) store: Arc<ResultStore>,
    pub(crate) inp: Inputs,
    pub(crate) throttle: Option<std::time::Duration>,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) board: Arc<TaskBoard>,
    /// Barriers taken from the inputs: (input, id, trans).
    pub(crate) barriers: Vec<(usize, CheckpointId, TransId)>,
    /// Inputs whose end of stream was taken.
    pub(crate) ended_inputs: Vec<usize>,
}

impl SinkTask {
    fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Poll, TaskError> {
        if self.inp.all_ended() {
            return Ok(Poll::Finished);
        }
        self.inp.retry_grants();
        let mut worked = false;
        for _ in 0..budget {
            if attention.load(Ordering::Relaxed) {
                break;
            }
            let Some((i, m)) = self.inp.next_msg() else { break };
            worked = true;
            if let Msg::Trigger { id, trans } = m {
                self.barriers.push((i, id, trans));
                break;
            }
            if let Msg::End = m {
                self.ended_inputs.push(i);
            }
            if let Msg::Results(rs) = m {
                if let Some(d) = self.throttle {
                    std::thread::sleep(d);
                }
                self.store.upsert(self.stream, &rs).map_err(|source| TaskError::State { task: self.id, source })?;
                self.stats.results_written.fetch_add(rs.len() as u64, Ordering::Relaxed);
                self.board.rows_in.fetch_add(rs.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(if worked { Poll::Busy } else { Poll::Idle })
    }
}

/// Commands to one task through its control queue, handled before its data.
#[derive(Clone, Debug, PartialEq)]
pub enum Control {
    /// Stop taking input (queues fill and push back upstream) until resumed.
    Pause,
    /// Take input again.
    Resume,
    /// Finish now.
    Stop,
    /// A checkpoint-protocol message or completion for the task's machine.
    Protocol(crate::checkpoint::TaskInput),
    /// The coordinator's restore point for a task that started without a commit record (ignored
    /// by a task already restored).
    Restore {
        /// Checkpoint to restore (none: start empty).
        checkpoint: Option<weir_wire::CheckpointId>,
        /// Source offset (0: the one in the checkpoint's manifest).
        version: weir_wire::Version,
        /// How it was chosen.
        basis: weir_wire::msg::RestoreBasis,
    },
}

/// How others reach a task's control queue. Sending also raises the owning worker's attention
/// flag, which cuts the data budget of whatever task that worker is polling short: control
/// messages (barrier answers, ready messages, upload completions) wait at most one message of
/// data work, not a whole round over the worker's tasks. That is what keeps the checkpoint's
/// ready chain, several hops long, within milliseconds while the workers run flat out.
#[derive(Clone, Debug)]
pub(crate) struct ControlHandle {
    tx: Sender<Control>,
    wake: Unparker,
    attention: Arc<AtomicBool>,
}

impl ControlHandle {
    pub(crate) fn new(tx: Sender<Control>, wake: Unparker, attention: Arc<AtomicBool>) -> Self {
        Self { tx, wake, attention }
    }

    fn notify(&self) {
        self.attention.store(true, Ordering::Release);
        self.wake.unpark();
    }

    /// Queues `c` unless the queue is full (a lost protocol message is resent or times out).
    pub(crate) fn try_send(&self, c: Control) -> bool {
        let ok = self.tx.try_send(c).is_ok();
        self.notify();
        ok
    }

    /// Queues `c`, waiting up to `timeout` for room.
    pub(crate) fn send_timeout(&self, c: Control, timeout: Duration) -> bool {
        let ok = self.tx.send_timeout(c, timeout).is_ok();
        self.notify();
        ok
    }
}

/// A task with its control queue (and its checkpoint side), as a worker holds it.
pub(crate) struct Cell {
    pub(crate) task: Task,
    pub(crate) control: crossbeam_channel::Receiver<Control>,
    pub(crate) paused: bool,
    pub(crate) ckpt: Option<Box<super::checkpointing::TaskCkpt>>,
    pub(crate) board: Arc<TaskBoard>,
}

impl Cell {
    /// Handles the queued control messages; `Ok(true)` when told to stop.
    pub(crate) fn handle_control(&mut self) -> Result<bool, TaskError> {
        while let Ok(c) = self.control.try_recv() {
            match c {
                Control::Pause => self.paused = true,
                Control::Resume => self.paused = false,
                Control::Stop => return Ok(true),
                Control::Protocol(input) => {
                    if let Some(ck) = self.ckpt.as_mut() {
                        let input = ck.prepare(&self.task, input);
                        ck.feed(&mut self.task, input).map_err(TaskError::Checkpoint)?;
                    }
                }
                Control::Restore { checkpoint, version, basis } => {
                    if let Some(ck) = self.ckpt.as_mut() {
                        // Version 0: the one in the checkpoint's manifest.
                        let point = checkpoint.map(|id| super::checkpointing::RestorePoint {
                            id,
                            version: (version.0 > 0).then_some(version),
                            manifest_crc: None,
                        });
                        ck.restore(&mut self.task, point, basis).map_err(TaskError::Checkpoint)?;
                    }
                }
            }
        }
        Ok(false)
    }

    /// Whether the task is between a checkpoint's start and its snapshot.
    pub(crate) fn aligning(&self) -> bool {
        self.ckpt.as_ref().is_some_and(|c| c.aligning)
    }

    /// Handles control messages, then does at most `budget` messages of data work (cut short
    /// when `attention` rises).
    pub(crate) fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Poll, TaskError> {
        if self.handle_control()? {
            return Ok(Poll::Finished);
        }
        if let Some(ck) = self.ckpt.as_mut() {
            ck.before_poll(&mut self.task).map_err(TaskError::Checkpoint)?;
            if ck.uninit() {
                // No data before the restore point is known: it decides where sources start.
                self.publish();
                return Ok(Poll::Idle);
            }
        }
        if self.paused {
            return Ok(Poll::Idle);
        }
        let p = self.task.poll(attention, budget)?;
        if let Some(ck) = self.ckpt.as_mut() {
            ck.after_poll(&mut self.task).map_err(TaskError::Checkpoint)?;
            self.publish();
        }
        Ok(p)
    }

    /// Shows the checkpoint machine's state on the task's status board.
    fn publish(&self) {
        if let Some(m) = self.ckpt.as_ref().map(|c| &c.machine) {
            self.board.publish(m.state(), m.latest(), m.failed());
        }
    }
}

/// Any task.
pub(crate) enum Task {
    Source(Box<SourceTask>),
    Agg(Box<AggTask>),
    Sink(Box<SinkTask>),
}

impl Task {
    pub(crate) fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Poll, TaskError> {
        match self {
            Task::Source(t) => t.poll(),
            Task::Agg(t) => t.poll(attention, budget),
            Task::Sink(t) => t.poll(attention, budget),
        }
    }
}
