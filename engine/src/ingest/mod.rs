//! The durable ingest log: per-partition segment files that `weir load` appends to and ingest-log
//! sources read from. See [`log`] for the invariants, [`segment`] for the format, and `producers.rs` for idempotent
//! appends.

pub mod log;
mod producers;
pub mod segment;
pub mod service;

pub use log::{AppendOutcome, DEDUP_WINDOW, IngestLog, LogConfig, LogError, LogHandle, LogRead, LogReader};
pub use service::{AppendRequest, Appended, IngestService, SyncPolicy};
