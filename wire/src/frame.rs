//! Frames: a fixed header followed by one rkyv-archived message.
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"WEIR"
//!      4     1  protocol version (PROTOCOL_VERSION)
//!      5     1  kind (msg::Kind)
//!      6     2  flags (none defined; unknown bits are refused)
//!      8     4  payload length, bytes (at most the configured maximum)
//!     12     4  CRC32C over bytes 0..12 of the header, then the payload
//!     16     …  payload: the rkyv archive of the message, root at the end
//! ```
//! All integers are little-endian.
//!
//! This module owns three invariants:
//! - a payload is stored in a 16-byte aligned buffer of its own, so the archive can be read in
//!   place ([`Frame::access`]) without copying it again;
//! - nothing reads a payload before [`rkyv::access`] (bytecheck) and the message's own [`Check`]
//!   accepted it: the only way to a message is through [`Frame::access`] or [`Frame::message`];
//! - the decoder never allocates more than the configured maximum frame size for one frame, and
//!   a payload's buffer grows with the bytes that arrive (doubling), never with the declared
//!   length: a hostile length field costs nothing until its bytes are sent.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::msg::{AnyMessage, Check, Kind, Message};

/// The four magic bytes that start every frame.
pub const MAGIC: [u8; 4] = *b"WEIR";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 18;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Default maximum payload size: 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
/// Largest payload accepted before the peer is authenticated: the handshake's messages (and a
/// `Close` with its reason) fit, nothing else does.
pub const HANDSHAKE_MAX_FRAME: usize = 2 << 10;

/// Payload buffer alignment: enough for every archived type.
pub type Payload = AlignedVec<16>;

/// Why bytes were refused as a frame. Every variant is fatal for the connection that carried the
/// bytes (the stream is out of sync or untrustworthy); none is retryable on that connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not `WEIR`.
    #[error("bad magic {found:02x?}, expected {MAGIC:02x?}")]
    BadMagic {
        /// What arrived.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {found}, this node speaks {supported}")]
    UnsupportedVersion {
        /// Version in the header.
        found: u8,
        /// Version this build speaks.
        supported: u8,
    },
    /// Unknown message kind.
    #[error("unknown message kind {kind}")]
    UnknownKind {
        /// Kind byte in the header.
        kind: u8,
    },
    /// Flag bits this version does not define.
    #[error("unknown flags {flags:#06x}")]
    UnknownFlags {
        /// Flags in the header.
        flags: u16,
    },
    /// Payload length over the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Declared (or encoded) payload length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// Header or payload corrupted in transit.
    #[error("checksum mismatch on {kind:?} frame: header says {expected:#010x}, bytes give {computed:#010x}")]
    Checksum {
        /// Kind in the header.
        kind: Kind,
        /// CRC in the header.
        expected: u32,
        /// CRC of the bytes received.
        computed: u32,
    },
    /// The payload is not a valid archive of its kind (bytecheck or a message invariant failed).
    #[error("invalid {kind:?} payload: {reason}")]
    Invalid {
        /// Kind in the header.
        kind: Kind,
        /// What validation said.
        reason: String,
    },
    /// A frame of another kind was expected here.
    #[error("expected a {expected:?} frame, got {found:?}")]
    WrongKind {
        /// What the caller asked for.
        expected: Kind,
        /// What the frame is.
        found: Kind,
    },
    /// The bytes end inside a frame.
    #[error("truncated frame: {have} bytes, {need} needed")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the header announced (or a header's length).
        need: usize,
    },
    /// A message could not be serialized.
    #[error("cannot encode {kind:?}: {reason}")]
    Encode {
        /// Kind being encoded.
        kind: Kind,
        /// Serializer's error.
        reason: String,
    },
}

impl FrameError {
    /// Frame errors are never worth retrying on the same connection.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Protocol version.
    pub version: u8,
    /// Message kind.
    pub kind: Kind,
    /// Flags (zero in this version).
    pub flags: u16,
    /// Payload length.
    pub len: u32,
    /// CRC32C over header bytes 0..12 and the payload.
    pub crc: u32,
}

impl Header {
    /// Parses and checks a header: magic, version, kind, flags and length against `max_frame`.
    pub fn parse(bytes: &[u8; HEADER_LEN], max_frame: usize) -> Result<Header, FrameError> {
        let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        let version = bytes[4];
        if version != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion { found: version, supported: PROTOCOL_VERSION });
        }
        let kind = Kind::from_u8(bytes[5]).ok_or(FrameError::UnknownKind { kind: bytes[5] })?;
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(FrameError::UnknownFlags { flags });
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if len as usize > max_frame {
            return Err(FrameError::TooLarge { len: len as usize, max: max_frame });
        }
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        Ok(Header { version, kind, flags, len, crc })
    }

    fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = self.version;
        out[5] = self.kind as u8;
        out[6..8].copy_from_slice(&self.flags.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.crc.to_le_bytes());
    }
}

fn frame_crc(header_prefix: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header_prefix), payload)
}

/// A received frame whose header and checksum are verified. Its payload is reached only through
/// validating accessors.
#[derive(Debug)]
pub struct Frame {
    header: Header,
    payload: Payload,
}

impl Frame {
    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The message kind.
    pub fn kind(&self) -> Kind {
        self.header.kind
    }

    /// Payload length in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }

    /// Validates the payload as `M` and returns the archived message, read in place.
    pub fn access<M: Message>(&self) -> Result<&M::Archived, FrameError>
    where
        M::Archived:
            rkyv::Portable + for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>,
    {
        if self.header.kind != M::KIND {
            return Err(FrameError::WrongKind { expected: M::KIND, found: self.header.kind });
        }
        let m = rkyv::access::<M::Archived, rancor::Error>(&self.payload)
            .map_err(|e| FrameError::Invalid { kind: M::KIND, reason: e.to_string() })?;
        m.check().map_err(|e| FrameError::Invalid { kind: M::KIND, reason: e.to_string() })?;
        Ok(m)
    }

    /// Validates the payload as whatever its kind says and returns it for matching.
    pub fn message(&self) -> Result<AnyMessage<'_>, FrameError> {
        AnyMessage::access(self.header.kind, &self.payload)
            .map_err(|e| FrameError::Invalid { kind: self.header.kind, reason: e.to_string() })
    }

    /// Validates and deserializes the payload into an owned `M`.
    pub fn to_owned<M: Message>(&self) -> Result<M, FrameError>
    where
        M::Archived: rkyv::Portable
            + for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
            + rkyv::Deserialize<M, rkyv::api::high::HighDeserializer<rancor::Error>>,
    {
        let archived = self.access::<M>()?;
        rkyv::deserialize::<M, rancor::Error>(archived)
            .map_err(|e| FrameError::Invalid { kind: M::KIND, reason: e.to_string() })
    }
}

/// A shared pool of aligned buffers that encoded frames return to when dropped, so a steady stream
/// of frames stops allocating.
#[derive(Clone, Debug)]
pub struct BufferPool {
    bufs: Arc<ArrayQueue<Payload>>,
    max_keep: usize,
}

impl BufferPool {
    /// A pool holding up to `count` buffers of at most `max_keep` bytes of capacity each.
    pub fn new(count: usize, max_keep: usize) -> Self {
        Self { bufs: Arc::new(ArrayQueue::new(count.max(1))), max_keep }
    }

    fn take(&self) -> Payload {
        self.bufs.pop().unwrap_or_default()
    }

    fn give(&self, mut buf: Payload) {
        if buf.capacity() <= self.max_keep {
            buf.clear();
            let _ = self.bufs.push(buf);
        }
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new(256, 4 << 20)
    }
}

/// An encoded frame (header and payload in one aligned buffer), ready to be written.
#[derive(Debug)]
pub struct EncodedFrame {
    buf: Payload,
    pool: Option<BufferPool>,
}

impl EncodedFrame {
    /// The frame's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Total length in bytes (header included).
    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the frame is empty (never true for an encoded frame).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The message kind.
    pub fn kind(&self) -> Kind {
        Kind::from_u8(self.buf[5]).expect("encoder writes known kinds")
    }
}

impl Drop for EncodedFrame {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.buf));
        }
    }
}

/// Encodes messages into frames, reusing its serializer arena and (optionally) pooled buffers.
///
/// One encoder per thread: it is cheap, `Send`, and not shared.
pub struct FrameEncoder {
    arena: rkyv::ser::allocator::Arena,
    pool: Option<BufferPool>,
    max_frame: usize,
}

impl std::fmt::Debug for FrameEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameEncoder")
            .field("pooled", &self.pool.is_some())
            .field("max_frame", &self.max_frame)
            .finish()
    }
}

impl Default for FrameEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameEncoder {
    /// An encoder that allocates a fresh buffer per frame.
    pub fn new() -> Self {
        Self { arena: rkyv::ser::allocator::Arena::new(), pool: None, max_frame: DEFAULT_MAX_FRAME }
    }

    /// An encoder that takes its buffers from `pool` (frames give them back when dropped).
    pub fn with_pool(pool: BufferPool) -> Self {
        Self { pool: Some(pool), ..Self::new() }
    }

    /// Refuse to encode payloads larger than `max` (the receiver would refuse them anyway).
    pub fn max_frame(mut self, max: usize) -> Self {
        self.max_frame = max;
        self
    }

    /// Encodes `msg` into a frame.
    pub fn encode<M: Message>(&mut self, msg: &M) -> Result<EncodedFrame, FrameError> {
        let mut buf = self.pool.as_ref().map(BufferPool::take).unwrap_or_default();
        self.encode_into(msg, &mut buf)?;
        Ok(EncodedFrame { buf, pool: self.pool.clone() })
    }

    /// Encodes `msg` into `out` (cleared first), header included.
    pub fn encode_into<M: Message>(&mut self, msg: &M, out: &mut Payload) -> Result<(), FrameError> {
        out.clear();
        out.extend_from_slice(&[0u8; HEADER_LEN]);
        // The payload starts at offset 16, a multiple of every archived alignment, so the archive
        // laid out here is byte-identical to one serialized on its own.
        let writer = std::mem::take(out);
        *out = rkyv::api::high::to_bytes_in_with_alloc::<_, _, rancor::Error>(msg, writer, self.arena.acquire())
            .map_err(|e| FrameError::Encode { kind: M::KIND, reason: e.to_string() })?;
        let len = out.len() - HEADER_LEN;
        if len > self.max_frame {
            return Err(FrameError::TooLarge { len, max: self.max_frame });
        }
        let mut header = Header { version: PROTOCOL_VERSION, kind: M::KIND, flags: 0, len: len as u32, crc: 0 };
        header.write(&mut out[..HEADER_LEN]);
        let (head, payload) = out.split_at(HEADER_LEN);
        header.crc = frame_crc(&head[..12], payload);
        header.write(&mut out[..HEADER_LEN]);
        Ok(())
    }
}

mod decoder;
pub use decoder::{FrameDecoder, decode_one};
