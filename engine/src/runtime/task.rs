//! The three task kinds. A task is polled by its worker: it does a bounded amount of work and
//! says whether it made progress, so one worker can interleave many tasks without blocking. What
//! the checkpoint protocol must hear of (a barrier, an ended input, a source reaching its queued
//! trigger) comes back from the poll as a [`Signal`]; a poll stops right behind it, so the
//! protocol decides before anything after it is taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use weir_wire::{Batch, CheckpointId, StreamId, TaskId};

use super::board::TaskBoard;
use super::channel::{ChannelError, Inputs, Msg, Outputs, Rows};
use super::shared::EngineStats;
use crate::checkpoint::driver::Signal;
use crate::operator::generator::Generator;
use crate::operator::window::{WindowAgg, WindowResult, shard_of};
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

/// What a poll achieved, and what the checkpoint protocol must hear of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Polled {
    /// Progress.
    pub poll: Poll,
    /// A barrier, an ended input or a reached trigger.
    pub signal: Option<Signal>,
}

impl From<Poll> for Polled {
    fn from(poll: Poll) -> Self {
        Polled { poll, signal: None }
    }
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
    /// The checkpoint side failed in a way the protocol cannot absorb (its meta record or its
    /// restore).
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// An agg's spill store failed (its path names the task).
    #[error(transparent)]
    Spill(#[from] crate::operator::window::SpillError),
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
    Log(super::log_feed::LogFeed),
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
    /// The savepoint being taken, from its request to its barrier's forwarding.
    pub(crate) savepoint: Option<CheckpointId>,
    /// Offsets at recent checkpoints, and a restore's replay.
    pub(crate) replay: super::replay::SourceReplay,
}

impl SourceTask {
    fn poll(&mut self) -> Result<Polled, TaskError> {
        if !self.out.flush()? {
            return Ok(Poll::Blocked.into());
        }
        if let Some(id) = self.queued_trigger.take() {
            // Reached: the checkpoint machine records the offset and snapshots before more rows.
            let signal = Some(Signal::ReachedTrigger { id, offset: self.replay.position(self.offset) });
            return Ok(Polled { poll: Poll::Busy, signal });
        }
        if self.ended {
            return Ok(Poll::Finished.into());
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
                        return Ok(Poll::Idle.into());
                    }
                }
                if n == 0 {
                    self.ended = true;
                    self.out.broadcast(|| Msg::End);
                    self.out.flush()?;
                    return Ok(Poll::Busy.into());
                }
                if self.replay.skip_until > self.offset {
                    // A replay: each output gets the rows from its agg's point on.
                    let skip = &self.replay.skip_below;
                    for o in self.offset..self.offset + n {
                        let (ts, key, value) = generator.row(o);
                        self.max_ts = self.max_ts.max(ts);
                        let j = self.dispatch.pick(key, n_out);
                        if o >= skip[j] {
                            self.builders[j].push(ts, key, value);
                        }
                    }
                } else {
                    for o in self.offset..self.offset + n {
                        let (ts, key, value) = generator.row(o);
                        self.max_ts = self.max_ts.max(ts);
                        self.builders[self.dispatch.pick(key, n_out)].push(ts, key, value);
                    }
                }
                n
            }
            Feed::Log(feed) => {
                self.scratch.clear();
                let read = feed
                    .reader
                    .read_marked(self.batch_rows, &mut self.scratch)
                    .map_err(|source| TaskError::Log { task: self.id, source })?;
                if read.rows == 0 && read.watermark.is_none() {
                    feed.tick();
                    return Ok(Poll::Idle.into());
                }
                if read.rows > 0 {
                    feed.saw_rows();
                }
                // The rows' versions: they end at the marker, when one ended the read.
                let first = feed.reader.position().0 - read.rows as u64 - u64::from(read.watermark.is_some());
                for (o, r) in (first..).zip(self.scratch.rows()) {
                    self.max_ts = self.max_ts.max(r.ts);
                    let j = self.dispatch.pick(r.key, n_out);
                    if o >= self.replay.skip_until || o >= self.replay.skip_below[j] {
                        self.builders[j].push(r.ts, r.key, r.value);
                    }
                }
                // A marker: no later row earlier than this is on time (broadcast below).
                if let Some(w) = read.watermark {
                    tracing::trace!(task = %self.id, watermark = w, max_ts = self.max_ts, "watermark marker read");
                    self.max_ts = self.max_ts.max(w);
                }
                // The offset is the log's version (markers take one too).
                self.offset = feed.reader.position().0 - read.rows as u64;
                read.rows as u64
            }
        };
        // Rows replayed after a restore were counted before it.
        let counted = (self.offset + rows).saturating_sub(self.offset.max(self.replay.counted_from));
        self.offset += rows;
        self.stats.rows_in.fetch_add(counted, Ordering::Relaxed);
        self.board.rows_out.fetch_add(counted, Ordering::Relaxed);
        let cap = self.batch_rows / n_out.max(1) + 16;
        for i in 0..n_out {
            if !self.builders[i].is_empty() {
                let b = std::mem::replace(&mut self.builders[i], super::batch_pool::take(cap));
                self.out.push(i, Msg::Rows(Rows::Local(b)));
            }
        }
        let max_ts = self.max_ts;
        self.board.watermark_ms.store(max_ts, Ordering::Relaxed);
        self.out.broadcast(|| Msg::Progress(max_ts));
        self.out.flush()?;
        Ok(Poll::Busy.into())
    }
}

pub(crate) struct AggTask {
    pub(crate) agg: WindowAgg,
    /// Where state past the budget goes: the store (held at a barrier until snapshotted), the
    /// budget, and the folder its instances live in.
    pub(crate) spill: Option<Arc<crate::state::SpillDb>>,
    pub(crate) spill_budget: Option<usize>,
    pub(crate) spill_root: std::path::PathBuf,
    pub(crate) inp: Inputs,
    pub(crate) out: Outputs,
    pub(crate) builders: Vec<Vec<WindowResult>>,
    pub(crate) dispatch: Dispatch,
    pub(crate) ended: bool,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) board: Arc<TaskBoard>,
    /// Rows taken per upstream, and a restore's replay.
    pub(crate) replay: super::replay::AggReplay,
    /// Inputs taken on past their barrier while the agg waits for its last one.
    pub(crate) cuts: super::unaligned::Cuts,
    /// The savepoint whose barrier came (its snapshot writes every window).
    pub(crate) savepoint: Option<CheckpointId>,
    /// Upstreams held back for running ahead in event time.
    pub(crate) align: super::alignment::Alignment,
}

/// Results a poll emits from fired windows before it takes input (whole shards: about a
/// millisecond of sorting and sending at millions of keys).
const FIRE_SLICE: usize = 4096;

impl AggTask {
    /// Holds back the upstreams that run too far ahead in event time (see `alignment.rs`).
    fn align_inputs(&mut self, now: std::time::Instant) {
        let checkpointing = self.cuts.any() || self.inp.any_closed();
        let inp = &mut self.inp;
        self.align.decide(now, checkpointing, |i, held| inp.pause(i, held));
    }

    fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Polled, TaskError> {
        if !self.out.flush()? {
            return Ok(Poll::Blocked.into());
        }
        if self.ended {
            return Ok(Poll::Finished.into());
        }
        self.inp.retry_grants();
        let n_out = self.out.len();
        let dispatch = self.dispatch;
        // A slice of what fired, then input: a window over millions of keys goes out over many
        // polls, and rows and barriers behind it are taken in between (a barrier that cuts the
        // emission finds the rest in the snapshot).
        let mut worked = self.agg.has_fired();
        let builders = &mut self.builders;
        self.agg.emit_fired(FIRE_SLICE, |r| builders[dispatch.pick(r.key, n_out)].push(r))?;
        let mut signal = None;
        let now = std::time::Instant::now();
        self.align_inputs(now);
        for _ in 0..budget {
            if attention.load(Ordering::Relaxed) {
                break;
            }
            let Some((i, m)) = self.inp.next_msg() else { break };
            worked = true;
            match m {
                Msg::Rows(rows) => {
                    let cut = self.cuts.is_cut(i);
                    self.agg.past_cut(cut);
                    let before = if cut { (self.agg.rows(), self.agg.late_rows()) } else { (0, 0) };
                    let again = self.replay.take(i, rows.len() as u64);
                    if again == 0 || again == rows.len() as u64 {
                        let mut adder = if again == 0 { self.agg.batch() } else { self.agg.replay_batch() };
                        match &rows {
                            // Columns as they are: a run of rows in one window goes in at once.
                            Rows::Local(b) => adder.add_columns(&b.ts, &b.key, &b.value),
                            // From another node: the frame's columns, read in place.
                            Rows::Remote(f) => {
                                if let Some(b) = super::channel::received(f) {
                                    adder.add_columns(b.ts_column(), b.key_column(), b.value_column());
                                }
                            }
                        }
                        drop(adder);
                    } else {
                        // Rows a restore sends again, then new ones (see `replay.rs`).
                        let (agg, mut n) = (&mut self.agg, 0);
                        rows.for_each(|t, k, v| {
                            if n < again {
                                agg.replay_add(t, k, v);
                            } else {
                                agg.add(t, k, v);
                            }
                            n += 1;
                        });
                    }
                    if cut {
                        self.cuts.counted(i, self.agg.rows() - before.0, self.agg.late_rows() - before.1);
                        self.stats.rows_past_cuts.fetch_add(rows.len() as u64, Ordering::Relaxed);
                    }
                    if again > 0 {
                        let over = !self.replay.replaying();
                        self.board.replayed(again, over);
                        if over {
                            tracing::info!(task = %self.inp.task(), "the replay is over: fired windows go out");
                            self.agg.hold(false);
                        }
                    }
                    // State past the budget goes to the spill store after each message (tables
                    // grow a shard at a time: the budget is overshot by one shard's growth at
                    // most), never in a snapshot's way (the store says when it is held).
                    self.agg.maybe_spill()?;
                    // Replayed rows were counted before the restore.
                    let n = rows.len() as u64 - again;
                    self.stats.rows_aggregated.fetch_add(n, Ordering::Relaxed);
                    self.board.rows_in.fetch_add(n, Ordering::Relaxed);
                    if let Rows::Local(b) = rows {
                        super::batch_pool::give(b);
                    }
                }
                Msg::Progress(ts) => {
                    self.cuts.observe(&mut self.agg, i, ts);
                    self.align.progress(i, ts, now);
                    self.align_inputs(now);
                }
                Msg::End => {
                    self.align.ended(i);
                    self.cuts.observe(&mut self.agg, i, i64::MAX);
                    signal = Some(Signal::UpstreamEnded { from: self.inp.source_of(i) });
                    break;
                }
                Msg::Results(_) => tracing::error!("agg received window results; ignored"),
                Msg::Trigger { id, trans, savepoint } => {
                    // Every barrier of a checkpoint says whether it is a savepoint: the first
                    // to come tells (one injected after a retrieve-trigger never comes first).
                    if savepoint {
                        self.savepoint = Some(id);
                    }
                    // Stop here: the checkpoint machine decides (close this input, or snapshot)
                    // before anything after the barrier is taken.
                    signal = Some(Signal::Barrier { from: self.inp.source_of(i), id, trans });
                    break;
                }
            }
        }
        for i in 0..n_out {
            if !self.builders[i].is_empty() {
                let rs = std::mem::take(&mut self.builders[i]);
                self.stats.results_emitted.fetch_add(rs.len() as u64, Ordering::Relaxed);
                self.board.rows_out.fetch_add(rs.len() as u64, Ordering::Relaxed);
                // One message (the common case below a few thousand keys) goes as it is.
                if result_chunks(&rs).next().is_none_or(|c| c.len() == rs.len()) {
                    self.out.push(i, Msg::Results(rs));
                } else {
                    for c in result_chunks(&rs) {
                        self.out.push(i, Msg::Results(c.to_vec()));
                    }
                }
            }
        }
        self.board.watermark_ms.store(self.agg.watermark(), Ordering::Relaxed);
        self.board.queued.store(self.inp.queued() as u64, Ordering::Relaxed);
        // A cut input's end waits for the snapshot like its progress (the windows it closes
        // have not fired yet).
        if self.inp.all_ended() && !self.cuts.any() && !self.agg.has_fired() {
            self.ended = true;
            self.stats.late_rows.fetch_add(self.agg.late_rows(), Ordering::Relaxed);
            self.out.broadcast(|| Msg::End);
        }
        self.out.flush()?;
        Ok(Polled { poll: if worked { Poll::Busy } else { Poll::Idle }, signal })
    }
}

/// `rs` (fired windows' results, each window's in key order) cut into the messages an agg
/// sends: each holds the results of one shard of one window (see
/// [`crate::operator::window::WindowTable`]), at most [`RESULTS_PER_MSG`] of them, cut from the
/// shard's first result on. Messages of bounded size keep the sink's work per message short (a
/// control message or a barrier on its worker never waits for one large write), and the cuts
/// depend on the window's content only, wherever a barrier cut the emission, so a replay sends
/// the same messages and the sink writes the same blocks.
pub(crate) fn result_chunks(rs: &[WindowResult]) -> impl Iterator<Item = &[WindowResult]> {
    rs.chunk_by(|a, b| a.start == b.start && shard_of(a.key) == shard_of(b.key)).flat_map(|w| w.chunks(RESULTS_PER_MSG))
}

pub(crate) struct SinkTask {
    pub(crate) id: TaskId,
    pub(crate) stream: StreamId,
    pub(crate) store: Arc<ResultStore>,
    pub(crate) inp: Inputs,
    pub(crate) throttle: Option<std::time::Duration>,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) board: Arc<TaskBoard>,
    /// Results RocksDB held back (its flushes behind), with their upstream: written before any
    /// message after them is taken.
    pub(crate) held: Option<(TaskId, Vec<WindowResult>)>,
}

impl SinkTask {
    /// Writes `rs`; false when RocksDB held them back (kept in `held` for the next poll).
    fn write(&mut self, from: TaskId, rs: Vec<WindowResult>) -> Result<bool, TaskError> {
        let written = self
            .store
            .try_upsert(self.stream, from, &rs)
            .map_err(|source| TaskError::State { task: self.id, source })?;
        if !written {
            self.held = Some((from, rs));
            return Ok(false);
        }
        self.stats.results_written.fetch_add(rs.len() as u64, Ordering::Relaxed);
        self.board.rows_in.fetch_add(rs.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Polled, TaskError> {
        if let Some((from, rs)) = self.held.take()
            && !self.write(from, rs)?
        {
            return Ok(Poll::Blocked.into());
        }
        if self.inp.all_ended() {
            return Ok(Poll::Finished.into());
        }
        self.inp.retry_grants();
        let mut worked = false;
        let mut signal = None;
        for _ in 0..budget {
            if attention.load(Ordering::Relaxed) {
                break;
            }
            let Some((i, m)) = self.inp.next_msg() else { break };
            worked = true;
            if let Msg::Trigger { id, trans, .. } = m {
                signal = Some(Signal::Barrier { from: self.inp.source_of(i), id, trans });
                break;
            }
            if let Msg::End = m {
                signal = Some(Signal::UpstreamEnded { from: self.inp.source_of(i) });
                break;
            }
            if let Msg::Results(rs) = m {
                if let Some(d) = self.throttle {
                    std::thread::sleep(d);
                }
                if !self.write(self.inp.source_of(i), rs)? {
                    break;
                }
            }
        }
        self.board.queued.store(self.inp.queued() as u64, Ordering::Relaxed);
        Ok(Polled { poll: if worked { Poll::Busy } else { Poll::Idle }, signal })
    }
}

/// Any task.
pub(crate) enum Task {
    Source(Box<SourceTask>),
    Agg(Box<AggTask>),
    Sink(Box<SinkTask>),
}

impl Task {
    pub(crate) fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Polled, TaskError> {
        match self {
            Task::Source(t) => t.poll(),
            Task::Agg(t) => t.poll(attention, budget),
            Task::Sink(t) => t.poll(attention, budget),
        }
    }

    /// The task's inputs (aggs and sinks).
    pub(crate) fn inputs(&mut self) -> Option<&mut Inputs> {
        match self {
            Task::Agg(a) => Some(&mut a.inp),
            Task::Sink(s) => Some(&mut s.inp),
            Task::Source(_) => None,
        }
    }

    /// The savepoint the task is taking (sources and aggs).
    pub(crate) fn savepoint(&self) -> Option<CheckpointId> {
        match self {
            Task::Source(s) => s.savepoint,
            Task::Agg(a) => a.savepoint,
            Task::Sink(_) => None,
        }
    }

    /// The task's outputs (sources and aggs).
    pub(crate) fn outputs(&mut self) -> Option<&mut Outputs> {
        match self {
            Task::Source(s) => Some(&mut s.out),
            Task::Agg(a) => Some(&mut a.out),
            Task::Sink(_) => None,
        }
    }
}
