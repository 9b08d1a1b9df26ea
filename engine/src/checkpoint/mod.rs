//! The checkpoint protocol (after `streamCheckpoint.c` and the notes on the rest of that engine),
//! as pure state machines: [`task::TaskMachine`] for every task and [`coordinator::Coordinator`]
//! for the stream. Each takes one input (a message, an I/O completion or a tick) and returns the
//! actions to carry out; neither has a clock, a lock or any I/O of its own. The runtime drives them
//! at the edge; the deterministic simulator (`engine/tests/checkpoint_sim.rs`) drives them under
//! delays, reordering, loss, duplication, crashes and store failures.

pub mod coordinator;
pub mod task;

pub use coordinator::{CommitRecord, CoordAction, CoordInput, Coordinator, CoordinatorConfig, ID_BLOCK};
pub use task::{
    Discard, Report, Role, SourceAnswer, TaskAction, TaskInput, TaskMachine, TaskSetup, TaskState, UploadDone,
};

#[cfg(test)]
mod tests;
