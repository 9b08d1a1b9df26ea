//! `weir-engine`: the dataflow engine that the checkpoint protocol protects.
//!
//! It will own, layer on layer (see `DESIGN.md` in the shared docs and `docs/architecture.md`):
//! the dataflow graph and pinned workers with per-task queues, the operators (generator and
//! ingest-log sources, window aggregation, sink), RocksDB state, the checkpoint protocol in
//! `checkpoint/` (task and coordinator state machines), the uploader pool in `backup/`, and the
//! node that wires them. For now it exposes the wire layer it is built on; every protocol type the
//! engine speaks comes from there, never from a copy here.

pub use weir_wire as wire;
