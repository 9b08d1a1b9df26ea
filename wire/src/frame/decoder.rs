//! The streaming decoder: bytes from a socket (in any split) to verified frames. Memory follows
//! the bytes that arrived, never what a header declares.

use std::io::{self, Read};

use super::*;

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
