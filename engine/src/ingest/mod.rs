//! The durable ingest log: per-partition segment files that `weir load` appends to and ingest-log
//! sources read from. See [`log`] for the invariants, [`segment`] for the format, `producers.rs`
//! for idempotent appends, `reader.rs` for reading, and [`ledger`] for what each producer appended.

pub mod ledger;
pub mod log;
mod producers;
mod reader;
mod replica;
pub mod replication;
pub mod segment;
pub mod service;

pub use ledger::ProducerRecord;
pub use log::{AppendOutcome, DEDUP_WINDOW, IngestLog, LogConfig, LogError, LogHandle};
pub use reader::{LogRead, LogReader};
pub use service::{AppendFailure, AppendRequest, Appended, IngestObserver, IngestService, SyncPolicy};
