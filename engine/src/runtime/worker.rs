//! A worker thread and the tasks it owns. Each [`Cell`] is one task with its control queue and
//! its checkpoint side; the worker polls its cells in turn, control messages first, and parks
//! when none can make progress.
//!
//! Invariants: a task belongs to exactly one worker, so nothing here takes a lock; what a task's
//! poll returns as a [`Signal`](crate::checkpoint::driver::Signal) reaches its checkpoint driver
//! before the task is polled again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_utils::sync::Parker;

use super::board::TaskBoard;
use super::checkpointing::port::TaskCheckpointing;
use super::control::Control;
use super::shared::Shared;
use super::task::{self, Poll, Task, TaskError};
use crate::checkpoint::driver::RestorePoint;

/// A task with its control queue (and its checkpoint side), as a worker holds it.
pub(crate) struct Cell {
    pub(crate) task: Task,
    pub(crate) control: crossbeam_channel::Receiver<Control>,
    pub(crate) paused: bool,
    pub(crate) ckpt: Option<Box<TaskCheckpointing>>,
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
                        ck.handle(&mut self.task, input)?;
                    }
                }
                Control::Restore { checkpoint, version, basis, request } => {
                    if let Some(ck) = self.ckpt.as_mut() {
                        let point = checkpoint.map(|id| RestorePoint { id, version, manifest_crc: None });
                        ck.restore(&mut self.task, point, basis, Some(request))?;
                    }
                }
            }
        }
        Ok(false)
    }

    /// Whether the task is between a checkpoint's start and its snapshot.
    pub(crate) fn aligning(&self) -> bool {
        self.ckpt.as_ref().is_some_and(|c| c.driver.aligning())
    }

    /// Handles control messages, then does at most `budget` messages of data work (cut short
    /// when `attention` rises).
    pub(crate) fn poll(&mut self, attention: &AtomicBool, budget: usize) -> Result<Poll, TaskError> {
        if self.handle_control()? {
            return Ok(Poll::Finished);
        }
        if let Some(ck) = self.ckpt.as_mut()
            && !ck.poll(&mut self.task)?
        {
            // No data before the restore point is known: it decides where sources start.
            self.publish();
            return Ok(Poll::Idle);
        }
        if self.paused {
            return Ok(Poll::Idle);
        }
        let p = self.task.poll(attention, budget)?;
        if let Some(ck) = self.ckpt.as_mut() {
            if let Some(s) = p.signal {
                ck.signal(&mut self.task, s)?;
            }
            self.publish();
        }
        Ok(p.poll)
    }

    /// Shows the checkpoint machine's state on the task's status board.
    fn publish(&self) {
        if let Some(m) = self.ckpt.as_ref().map(|c| c.driver.machine()) {
            self.board.publish(m);
        }
    }
}

/// Stops the engine when its worker panics (the panic is then reported by `Engine::wait`), so the
/// other workers do not wait for tasks that are gone.
pub(crate) struct PanicGuard<'a> {
    pub(crate) worker: usize,
    pub(crate) shared: &'a Shared,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.fail(format!("worker {} panicked", self.worker));
        }
    }
}

/// A worker's loop over its tasks until they finish or the engine stops.
pub(crate) fn run(
    mut tasks: Vec<Cell>,
    parker: Parker,
    attention: &AtomicBool,
    shared: &Shared,
) -> Result<(), TaskError> {
    let mut finished = vec![false; tasks.len()];
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut busy = false;
        for i in 0..tasks.len() {
            // Control messages first, for every task of this worker (see `ControlHandle`).
            if attention.swap(false, Ordering::AcqRel) {
                for (j, t) in tasks.iter_mut().enumerate() {
                    if !finished[j] && t.handle_control()? {
                        finished[j] = true;
                    }
                }
            }
            if finished[i] {
                continue;
            }
            // While a checkpoint runs, a task shares its worker in small steps with one that is
            // in the middle of it: the barrier, not the bulk of the data, is what it waits for.
            let engine_aligning = shared.aligning.load(Ordering::Relaxed) > 0;
            let budget =
                if engine_aligning && tasks.iter().enumerate().any(|(j, t)| j != i && !finished[j] && t.aligning()) {
                    task::SHARED_BUDGET
                } else {
                    task::BUDGET
                };
            let p = match tasks[i].poll(attention, budget) {
                Ok(p) => p,
                // Stopping: other workers drop their tasks, so channels close under us.
                Err(_) if shared.stop.load(Ordering::Acquire) => return Ok(()),
                Err(e) => return Err(e),
            };
            // Let the engine's other threads (coordinator, uploaders, network) run now if they
            // are waiting for this core, instead of after the scheduler's time slice: a few
            // milliseconds each time, on every hop of a checkpoint. A no-op when none waits. Not
            // while a checkpoint aligns: then the pipeline itself is what the checkpoint waits
            // for; not after a poll that found nothing to do, which held the core for
            // microseconds (on a node of many idle streams those yields were most of their cost).
            // A blocked task may have flushed part of its output and woken its consumer, which
            // may wait for this core.
            if !engine_aligning && matches!(p, Poll::Busy | Poll::Blocked) {
                std::thread::yield_now();
            }
            match p {
                Poll::Busy => busy = true,
                Poll::Finished => {
                    if !finished[i] {
                        tasks[i].board.finish();
                    }
                    finished[i] = true;
                }
                Poll::Idle | Poll::Blocked => {}
            }
        }
        if finished.iter().all(|f| *f) {
            return Ok(());
        }
        if !busy {
            // Woken by new input, freed room or credit; the timeout covers rate limits and grants
            // that had to wait for the transport.
            parker.park_timeout(Duration::from_millis(2));
        }
    }
}
