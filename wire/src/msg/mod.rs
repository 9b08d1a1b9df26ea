//! Every message of the Weir protocol, one rkyv type each.
//!
//! A frame carries exactly one message; its kind byte ([`Kind`]) says which type the payload is
//! archived as. Field names follow the seed (`streamCheckpoint.c`) and the reference notes, with
//! what Weir adds: sequence numbers on channel messages (so a lost frame is a detected gap),
//! checksums and statistics in reports, and outcomes that say *why* a request was not acted on.
//!
//! Kind numbers are part of the wire format: never renumber, only append.

use crate::batch::Batch;
use crate::ids::{CheckpointId, Epoch, NodeId, Seq, StreamId, TaskId, TransId, Version};

/// Length of handshake nonces and HMAC-SHA256 proofs.
pub const NONCE_LEN: usize = 32;

/// One rkyv message type (the derives every message shares).
macro_rules! archived {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
    };
    ($(#[$m:meta])* pub enum $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum $name { $($body)* }
    };
}

mod catalog;
mod checkpoint;
mod connection;
mod data;
mod ops;
mod replication;

pub use catalog::*;
use catalog::{check_catalog_change, check_catalog_req, check_catalog_rsp};
pub use checkpoint::*;
pub use connection::*;
pub use data::*;
pub use ops::*;
pub use replication::*;

/// Longest cluster name a `Hello` may carry (bytes).
pub const MAX_CLUSTER_NAME: usize = 128;

/// A message that breaks an invariant bytecheck cannot check, or (from
/// [`AnyMessage::access`]) that is not a valid archive of its kind. Fatal for the frame: the
/// sender is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// Columns of one message of different lengths.
    #[error("{what} columns differ in length: {lens:?}")]
    Columns { what: &'static str, lens: Vec<usize> },
    /// A `Hello`'s cluster name past [`MAX_CLUSTER_NAME`].
    #[error("cluster name of {len} bytes (at most {MAX_CLUSTER_NAME})")]
    ClusterName { len: usize },
    /// A `Hello`'s client name of characters or a length no client has.
    #[error("client name is not 1 to 64 letters, digits, '-', '_' or '.'")]
    ClientName,
    /// Bytecheck refused the payload.
    #[error("{0}")]
    Archive(String),
}

fn check_hello(m: &ArchivedHello) -> Result<(), CheckError> {
    if m.cluster.len() > MAX_CLUSTER_NAME {
        return Err(CheckError::ClusterName { len: m.cluster.len() });
    }
    if !m.client.is_empty() && !crate::role::valid_client_name(&m.client) {
        return Err(CheckError::ClientName);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Kinds.

/// Per-message validation beyond what bytecheck checks (invariants between fields).
pub trait Check {
    /// `Err` names the broken invariant.
    fn check(&self) -> Result<(), CheckError> {
        Ok(())
    }
}

/// A message type: which frame kind carries it.
pub trait Message:
    rkyv::Archive<Archived: Check>
    + for<'a> rkyv::Serialize<
        rkyv::api::high::HighSerializer<
            rkyv::util::AlignedVec<16>,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rkyv::rancor::Error,
        >,
    >
{
    /// Frame kind of this message.
    const KIND: Kind;
}

macro_rules! kinds {
    ($( $num:literal => $ty:ident $({ $checker:expr })? ),* $(,)?) => {
        /// Frame kind: which message type the payload is archived as.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Kind { $( #[doc = concat!("[`", stringify!($ty), "`]")] $ty = $num ),* }

        impl Kind {
            /// Every kind, in wire order.
            pub const ALL: &'static [Kind] = &[$(Kind::$ty),*];

            /// The kind with this wire number.
            pub fn from_u8(n: u8) -> Option<Kind> {
                match n { $($num => Some(Kind::$ty),)* _ => None }
            }

            /// Name of the message type.
            pub fn name(self) -> &'static str {
                match self { $(Kind::$ty => stringify!($ty)),* }
            }
        }

        $(
            impl Message for $ty { const KIND: Kind = Kind::$ty; }
            kinds!(@check $ty $({ $checker })?);
        )*

        /// A validated payload of any kind, borrowed from its frame.
        #[derive(Debug)]
        pub enum AnyMessage<'a> { $( #[doc = concat!("[`", stringify!($ty), "`]")] $ty(&'a rkyv::Archived<$ty>) ),* }

        impl<'a> AnyMessage<'a> {
            /// Validates `payload` as message `kind`.
            pub fn access(kind: Kind, payload: &'a [u8]) -> Result<AnyMessage<'a>, CheckError> {
                match kind {
                    $(Kind::$ty => {
                        let m = rkyv::access::<rkyv::Archived<$ty>, rkyv::rancor::Error>(payload)
                            .map_err(|e| CheckError::Archive(e.to_string()))?;
                        m.check()?;
                        Ok(AnyMessage::$ty(m))
                    })*
                }
            }

            /// The kind.
            pub fn kind(&self) -> Kind {
                match self { $(AnyMessage::$ty(_) => Kind::$ty),* }
            }
        }
    };
    (@check $ty:ident { $checker:expr }) => {
        impl Check for rkyv::Archived<$ty> {
            fn check(&self) -> Result<(), CheckError> { ($checker)(self) }
        }
    };
    (@check $ty:ident) => {
        impl Check for rkyv::Archived<$ty> {}
    };
}

kinds! {
    1 => Hello { |m: &ArchivedHello| check_hello(m) },
    2 => Challenge,
    3 => Auth,
    4 => Heartbeat,
    5 => Close,
    6 => Welcome,
    10 => Ingest { |m: &ArchivedIngest| m.batch.check() },
    11 => IngestAck,
    12 => Data { |m: &ArchivedData| m.batch.check() },
    13 => Watermark,
    14 => WindowResults { |m: &ArchivedWindowResults| m.check_columns() },
    15 => EndOfStream,
    16 => Credit,
    17 => Replicate,
    18 => ReplicateAck,
    20 => CheckpointSourceReq,
    21 => CheckpointSourceRsp,
    22 => CheckpointTrigger,
    23 => CheckpointReady,
    24 => CheckpointReadyRsp,
    25 => RetrieveTriggerReq,
    26 => TriggerRsp,
    27 => CheckpointReport,
    28 => UpdateCheckpointInfo,
    29 => TaskReset,
    30 => ConsensusReq,
    31 => Restore,
    32 => CannotRestoreReq,
    33 => RunFailed,
    40 => StatusReq,
    41 => StatusRsp,
    42 => CheckpointNowReq,
    43 => CheckpointNowRsp,
    44 => StopReq,
    45 => StopRsp,
    46 => ResultsReq,
    47 => ResultsRsp,
    48 => ProducersReq,
    49 => ProducersRsp,
    50 => CatalogReq { |m: &ArchivedCatalogReq| check_catalog_req(m) },
    51 => CatalogRsp { |m: &ArchivedCatalogRsp| check_catalog_rsp(m) },
    52 => CatalogChangeReq { |m: &ArchivedCatalogChangeReq| check_catalog_change(m) },
}
