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

use std::io::{self, Read};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::msg::{AnyMessage, Check, Kind, Message};

/// The four magic bytes that start every frame.
pub const MAGIC: [u8; 4] = *b"WEIR";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 8;
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
        m.check().map_err(|reason| FrameError::Invalid { kind: M::KIND, reason })?;
        Ok(m)
    }

    /// Validates the payload as whatever its kind says and returns it for matching.
    pub fn message(&self) -> Result<AnyMessage<'_>, FrameError> {
        AnyMessage::access(self.header.kind, &self.payload)
            .map_err(|reason| FrameError::Invalid { kind: self.header.kind, reason })
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

/// Payloads at least this large are read from the socket straight into their own buffer.
const DIRECT_READ_MIN: usize = 8 << 10;
/// Size of the decoder's staging buffer for headers and small frames, once frames may be large.
const STAGING: usize = 64 << 10;
/// A payload buffer starts at most this large and doubles as bytes arrive: a declared length
/// costs nothing until the peer sends the bytes.
const FIRST_ROOM: usize = 64 << 10;

#[derive(Debug)]
struct Pending {
    header: Header,
    /// Its length is the room made so far (zeroed, at least `filled`), never more than
    /// `header.len`: it grows with the bytes that arrive, not with the declared length.
    payload: Payload,
    filled: usize,
}

impl Pending {
    fn new(header: Header) -> Self {
        let first = (header.len as usize).min(FIRST_ROOM);
        Pending { header, payload: Payload::with_capacity(first), filled: 0 }
    }

    fn remaining(&self) -> usize {
        self.header.len as usize - self.filled
    }

    /// Appends bytes (at most `remaining`).
    fn push(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= self.remaining());
        let in_room = (self.payload.len() - self.filled).min(bytes.len());
        self.payload[self.filled..self.filled + in_room].copy_from_slice(&bytes[..in_room]);
        self.payload.extend_from_slice(&bytes[in_room..]);
        self.filled += bytes.len();
    }

    /// The unfilled room to read into, made by doubling what arrived (at least `FIRST_ROOM`,
    /// never past the declared length).
    fn room(&mut self) -> &mut [u8] {
        if self.filled == self.payload.len() {
            let total = self.header.len as usize;
            let len = (self.filled * 2).max(FIRST_ROOM).min(total);
            self.payload.reserve_exact(len - self.payload.len());
            self.payload.resize(len, 0);
        }
        &mut self.payload[self.filled..]
    }
}

/// A streaming frame decoder: accepts the byte stream in any split (down to one byte at a time)
/// and yields verified frames.
///
/// Memory follows the bytes that arrived, not what a header declares: the staging buffer is
/// sized for the largest frame allowed (up to 64 KiB), and a payload buffer doubles as its bytes
/// come in. A decoder made for a handshake ([`FrameDecoder::new`] with a small maximum) therefore
/// costs about that maximum until [`FrameDecoder::set_max_frame`] raises it.
///
/// After it returns an error the stream is out of sync: drop the connection and the decoder.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame: usize,
    staging: Box<[u8]>,
    start: usize,
    end: usize,
    pending: Option<Pending>,
}

fn staging_for(max_frame: usize) -> usize {
    (HEADER_LEN + max_frame).clamp(256, STAGING)
}

impl FrameDecoder {
    /// A decoder that refuses payloads over `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        let staging = vec![0; staging_for(max_frame)].into_boxed_slice();
        Self { max_frame, staging, start: 0, end: 0, pending: None }
    }

    /// The largest payload accepted.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Changes the largest payload accepted from the next header on (a connection raises it once
    /// its peer is authenticated); the staging buffer grows to match.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
        let want = staging_for(max_frame);
        if want > self.staging.len() {
            self.compact();
            let mut bigger = vec![0; want].into_boxed_slice();
            bigger[..self.end].copy_from_slice(&self.staging[..self.end]);
            self.staging = bigger;
        }
    }

    /// Appends bytes received by other means (tests, files).
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            // Large payload bytes go straight to their buffer.
            if self.start == self.end
                && let Some(p) = self.pending.as_mut()
                && p.remaining() > 0
            {
                let n = p.remaining().min(bytes.len());
                p.push(&bytes[..n]);
                bytes = &bytes[n..];
                if p.remaining() == 0 {
                    // Complete: the rest starts a new frame and goes to staging.
                    self.stage(bytes);
                    return;
                }
                continue;
            }
            self.stage(bytes);
            return;
        }
    }

    fn stage(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.compact();
        if self.staging.len() - self.end < bytes.len() {
            let mut bigger = vec![0; (self.end + bytes.len()).next_power_of_two()].into_boxed_slice();
            bigger[..self.end].copy_from_slice(&self.staging[..self.end]);
            self.staging = bigger;
        }
        self.staging[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Reads once from `r` into the right buffer: straight into a large pending payload, otherwise
    /// into the staging buffer. Returns what `read` returned (0 means end of stream).
    pub fn read_from<R: Read + ?Sized>(&mut self, r: &mut R) -> io::Result<usize> {
        if self.start == self.end
            && let Some(p) = self.pending.as_mut()
            && p.remaining() >= DIRECT_READ_MIN
        {
            let n = r.read(p.room())?;
            p.filled += n;
            return Ok(n);
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.staging.len() {
            self.compact();
        }
        let n = r.read(&mut self.staging[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        (self.end - self.start) + self.pending.as_ref().map_or(0, |p| p.filled)
    }

    /// Bytes of memory held for payloads not yet complete (what a slow or hostile peer costs).
    pub fn pending_capacity(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.payload.capacity())
    }

    /// The next complete frame, `None` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        loop {
            if let Some(p) = self.pending.as_mut() {
                let n = p.remaining().min(self.end - self.start);
                p.push(&self.staging[self.start..self.start + n]);
                self.start += n;
                if p.remaining() > 0 {
                    return Ok(None);
                }
                let p = self.pending.take().expect("pending");
                debug_assert_eq!(p.payload.len(), p.filled, "room never passes the declared length");
                let mut prefix = [0u8; 12];
                prefix[0..4].copy_from_slice(&MAGIC);
                prefix[4] = p.header.version;
                prefix[5] = p.header.kind as u8;
                prefix[6..8].copy_from_slice(&p.header.flags.to_le_bytes());
                prefix[8..12].copy_from_slice(&p.header.len.to_le_bytes());
                let computed = frame_crc(&prefix, &p.payload);
                if computed != p.header.crc {
                    return Err(FrameError::Checksum { kind: p.header.kind, expected: p.header.crc, computed });
                }
                return Ok(Some(Frame { header: p.header, payload: p.payload }));
            }
            if self.end - self.start < HEADER_LEN {
                return Ok(None);
            }
            let bytes: &[u8; HEADER_LEN] =
                self.staging[self.start..self.start + HEADER_LEN].try_into().expect("header");
            let header = Header::parse(bytes, self.max_frame)?;
            self.start += HEADER_LEN;
            self.pending = Some(Pending::new(header));
        }
    }
}

/// Decodes exactly one frame from `bytes` (which must hold nothing else).
pub fn decode_one(bytes: &[u8], max_frame: usize) -> Result<Frame, FrameError> {
    let mut d = FrameDecoder::new(max_frame);
    d.feed(bytes);
    match d.next_frame()? {
        Some(f) if d.buffered() == 0 => Ok(f),
        Some(f) => Err(FrameError::Invalid {
            kind: f.kind(),
            reason: format!("{} trailing bytes after the frame", d.buffered()),
        }),
        None => {
            let need = d.pending.as_ref().map_or(HEADER_LEN, |p| HEADER_LEN + p.header.len as usize);
            Err(FrameError::Truncated { have: bytes.len(), need })
        }
    }
}
