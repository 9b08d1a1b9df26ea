//! The checkpoint protocol (after `streamCheckpoint.c` and the notes on the rest of that engine).
//!
//! - [`task::TaskMachine`] for every task and [`coordinator::Coordinator`] for the stream: pure
//!   state machines. Each takes one input (a message, an I/O completion or a tick) and returns the
//!   actions to carry out; neither has a clock, a lock or any I/O of its own.
//! - [`driver`]: the one interpreter of those actions, written against small effect traits. The
//!   engine (`runtime/checkpointing/`) implements the traits with its queues, transport, uploader
//!   pool and store; the deterministic simulator (`engine/tests/checkpoint_sim/`) with its
//!   scheduler and a faulty in-memory store, so both run the same driver. Its module doc walks one
//!   checkpoint hop by hop.
//! - [`CheckpointError`]: what can go wrong around the machines, retryable or fatal.

pub mod coordinator;
pub mod driver;
mod error;
mod failure;
pub mod task;

pub use coordinator::{
    CommitRecord, CoordAction, CoordInput, Coordinator, CoordinatorConfig, ID_BLOCK, IdRecord, RecordKind, Shape,
};
pub use error::CheckpointError;
pub use failure::{CheckpointFailure, TaskFailure};
pub use task::{
    Discard, Report, Role, SourceAnswer, TaskAction, TaskInput, TaskMachine, TaskSetup, TaskState, UploadDone,
};

#[cfg(test)]
mod tests;
