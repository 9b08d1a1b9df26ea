//! `weir-engine`: the dataflow engine that the checkpoint protocol protects.
//!
//! Layers (see `docs/architecture.md`):
//! - [`operator`]: the generator source and window aggregation, pure and deterministic.
//! - [`state`]: RocksDB per task, local snapshots, and the result store the sinks write.
//! - [`ingest`]: the durable per-partition ingest log.
//! - [`runtime`]: pinned workers, per-task queues, local and remote channels, and the edge that
//!   runs the checkpoint protocol on them.
//! - [`checkpoint`]: the protocol as pure state machines (task and coordinator).
//! - [`backup`]: the store interface, the local-directory store, snapshot upload and download.
//! - `sys`: the one module with `unsafe` code (a scheduling-class call, a prefetch hint, the
//!   hardware's float truncation and the window tables' memory).
//!
//! Every protocol type comes from [`wire`] (`weir-wire`), never from a copy here.

pub use weir_wire as wire;

pub mod backup;
pub mod checkpoint;
pub mod cluster;
pub mod control;
pub mod direct_io;
pub mod ingest;
pub mod operator;
pub mod private_fs;
pub mod reference;
pub mod runtime;
pub mod spec;
mod spec_error;
pub mod state;
mod sys;
pub use sys::lower_priority;
