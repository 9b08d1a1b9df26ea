//! How others reach a task: [`Control`] commands through the task's control queue, handled
//! before its data, and the [`ControlHandle`] that queues them and gets the owning worker's
//! attention.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;
use crossbeam_utils::sync::Unparker;

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
        /// Source offset (none: the one in the checkpoint's manifest).
        version: Option<weir_wire::Version>,
        /// How it was chosen.
        basis: weir_wire::msg::RestoreBasis,
        /// The task's request it answers (an answer to an earlier start is ignored).
        request: u64,
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
