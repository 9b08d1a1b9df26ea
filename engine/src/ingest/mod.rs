//! The durable ingest log: per-partition segment files that `weir load` appends to and ingest-log
//! sources read from. See [`log`] for the invariants and [`segment`] for the format.

pub mod log;
pub mod segment;
pub mod service;

pub use log::{IngestLog, LogConfig, LogError, LogHandle, LogReader};
pub use service::{AppendRequest, Appended, IngestService, SyncPolicy};
