//! `weir-wire`: the protocol every Weir node speaks.
//!
//! - [`ids`]: newtype identifiers (`NodeId`, `TaskId`, `CheckpointId`, …).
//! - [`batch`]: the columnar batch, read in place on the receiving side.
//! - [`msg`]: one rkyv type per protocol message and the frame [`Kind`](msg::Kind) that carries it.
//! - [`role`]: who may send which message kinds, and client credentials.
//! - [`frame`]: the fixed header, the encoder and the streaming, validating decoder.
//! - [`transport`]: the mio event loop that carries frames between nodes, with the authenticated
//!   handshake, heartbeats, reconnects and bounded send queues.
//!
//! This crate depends on nothing else of Weir; `weir-engine` builds on it.

pub mod batch;
pub mod frame;
pub mod ids;
pub mod msg;
pub mod role;
pub mod transport;

pub use batch::{Batch, Native, Row};
pub use frame::{BufferPool, EncodedFrame, Frame, FrameDecoder, FrameEncoder, FrameError, PROTOCOL_VERSION};
pub use ids::{CheckpointId, Epoch, NodeId, Seq, StreamId, TaskId, TransId, Version};
pub use msg::{AnyMessage, Kind, Message};
pub use role::Role;
