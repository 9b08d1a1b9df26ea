//! The drivers: the one interpreter of [`TaskAction`](super::TaskAction)s ([`TaskDriver`]) and the
//! one of [`CoordAction`](super::CoordAction)s ([`CoordDriver`]). They own everything around the
//! pure machines that is still decision logic (clock readings for statistics, the captured state
//! between snapshot and upload, asking for a restore point until answered, turning a trigger
//! response into a safe injection) and reach the world only through small traits:
//!
//! - [`TaskPort`]: the task they drive (close and reopen inputs, queue a source's trigger, capture
//!   state and forward the barrier, restore state). The engine's port is its running task; the
//!   simulator's is a model task on simulated channels.
//! - [`TaskEffects`] and [`CoordEffects`]: messages to other tasks and the coordinator, the
//!   uploader pool, the task's meta record, the coordinator's records in the store, the clock. The
//!   engine implements them with its queues, the transport, the uploader pool and the store; the
//!   simulator with its scheduler and an in-memory store that injects faults.
//!
//! So the code the engine runs is the code the simulator runs; nothing in tests copies it.
//!
//! # One checkpoint, hop by hop
//! 1. The coordinator's timer is due: [`CoordDriver::handle`] feeds a tick to
//!    [`Coordinator::handle`](super::Coordinator::handle), which first reserves ids
//!    ([`CoordEffects::persist_ids`]; the checkpoint starts only once
//!    [`CoordInput::IdsPersisted`](super::CoordInput::IdsPersisted) comes back), then sends a
//!    source request to every source ([`CoordEffects::send_task`]).
//! 2. A source's worker hands it to [`TaskDriver::handle`]; the machine answers
//!    `QueueSourceTrigger` and the driver calls [`TaskPort::queue_source_trigger`]. When the
//!    source's output has drained to that point its poll returns [`Signal::ReachedTrigger`], which
//!    [`TaskDriver::signal`] feeds to the machine: `Snapshot`.
//! 3. [`TaskDriver`] carries out `Snapshot`: [`TaskPort::capture`] copies the state (the only
//!    synchronous part), [`TaskPort::forward_trigger`] puts the barrier on every output, and the
//!    machine hears `SnapshotTaken` and `TriggerDispatched`; it answers `ReopenAllInputs` and
//!    `Upload`, which becomes [`TaskEffects::upload`] with the captured state.
//! 4. Downstream, an agg's or sink's poll stops at the barrier and returns [`Signal::Barrier`];
//!    the machine closes that input (`CloseInput`, [`TaskPort::close_input`]) until every
//!    upstream's barrier is in, then snapshots as in 3. The port may instead cut the input
//!    ([`Hold::Cut`]: an agg with replay snapshots keeps taking it and captures the state at
//!    each cut), so nothing waits for a slower upstream's barrier. A missing barrier is asked for after the
//!    trigger timeout (`SendRetrieveTrigger`); the answer passes through
//!    [`TaskDriver::handle`], which adds the channel's position ([`TaskPort::next_seq`]) so the
//!    machine injects the barrier only when nothing before it is missing.
//! 5. The upload's completion comes back as `Uploaded`. Once a task's snapshot is durable and its
//!    downstream tasks are ready, the machine sends ready upstream, answers the source request and
//!    reports ([`TaskEffects::send_task`], [`TaskEffects::send_coord`]); the driver adds its clock
//!    readings to the report.
//! 6. With every report in, the coordinator writes the commit record
//!    ([`CoordEffects::write_commit`]); on `CommitDurable` it sends update-checkpoint-info; each
//!    task persists the committed id ([`TaskEffects::persist_committed`]) and drops older local
//!    snapshots. A failure anywhere resets every task; nothing a commit may name is deleted.
//! 7. On start, a task with no restore point asks the coordinator
//!    ([`TaskDriver::poll`] sends `Consensus` with [`TaskEffects::read_committed`]) and restores
//!    the answer with [`TaskDriver::restore`] ([`TaskPort::restore`]).

mod coord;
mod task;
#[cfg(test)]
mod tests;

pub use coord::{CoordDriver, CoordEffects};
pub use task::{Hold, RestorePoint, Signal, TaskDriver, TaskEffects, TaskPort, UploadRequest};

/// The two clocks a driver reads.
pub trait Clock {
    /// Microseconds since the epoch: shared by every node (expiry times cross nodes).
    fn wall_us(&self) -> u64;
    /// Microseconds of a monotonic clock, for durations.
    fn mono_us(&self) -> u64;
    /// Milliseconds since the epoch (the machines' time).
    fn now_ms(&self) -> u64 {
        self.wall_us() / 1000
    }
}
