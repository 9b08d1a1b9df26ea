//! The durable ingest log: per-partition segment files that `weir load` appends to and ingest-log
//! sources read from. See [`log`] for the invariants, `open.rs` for opening and checking a log,
//! [`segment`] for the format, `chain.rs` for the chained checksum a copy is compared by, `producers.rs` for idempotent appends, `reader.rs` and
//! `handle.rs` for reading, and [`ledger`] for what each producer appended.

mod chain;
mod handle;
pub mod in_sync;
#[cfg(test)]
mod in_sync_sim;
pub mod ledger;
pub mod log;
mod open;
mod producers;
mod reader;
mod replica;
pub mod replication;
mod sealed;
pub mod segment;
pub mod service;

pub use handle::LogHandle;
pub use ledger::ProducerRecord;
pub use log::{AppendOutcome, DEDUP_WINDOW, IngestLog, LogConfig, LogError};
pub use reader::{LogRead, LogReader};
pub use service::{AppendFailure, AppendRequest, Appended, IngestObserver, IngestService, SyncPolicy};
