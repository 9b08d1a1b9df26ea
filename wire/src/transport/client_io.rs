//! The byte stream under a [`BlockingClient`](super::client::BlockingClient): plain TCP or TLS,
//! and, for a split TLS client, the thread that owns the TLS connection.
//!
//! A TLS connection is one state machine for both directions, so its halves cannot go to two
//! threads as a socket's can. A split TLS client therefore gets a pump: one thread owns the
//! connection on a non-blocking socket under a mio poll, takes frames to send from a channel (a
//! waker says when), and hands received frames to the reader through another. Neither half
//! waits on the other.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use rustls::{ClientConnection, Connection, StreamOwned};

use super::client::ClientError;
use super::tls::{self, TlsConfig};
use crate::frame::{EncodedFrame, Frame, FrameDecoder};

/// Plain TCP or TLS over it, blocking.
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Io::Plain(_) => "Io::Plain",
            Io::Tls(_) => "Io::Tls",
        })
    }
}

impl Io {
    /// Over `sock`: TLS when `tls` says so.
    pub(crate) fn new(sock: TcpStream, tls: Option<&TlsConfig>) -> io::Result<Io> {
        Ok(match tls {
            None => Io::Plain(sock),
            Some(t) => {
                let c = ClientConnection::new(t.client.clone(), t.name.clone()).map_err(io::Error::other)?;
                Io::Tls(Box::new(StreamOwned::new(c, sock)))
            }
        })
    }
}

impl Read for Io {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => s.read(buf),
            Io::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Io {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => s.write(buf),
            Io::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Io::Plain(s) => s.flush(),
            Io::Tls(t) => t.flush(),
        }
    }
}

const SOCK: mio::Token = mio::Token(0);
const WAKE: mio::Token = mio::Token(1);

/// The sending side of a pump: frames to the thread, and a wake-up.
pub(crate) struct PumpTx {
    pub(crate) frames: Sender<EncodedFrame>,
    pub(crate) waker: Arc<mio::Waker>,
}

impl PumpTx {
    /// Queues `frame` for the pump, waiting at most `timeout` for room (the node may have stopped
    /// reading).
    pub(crate) fn send(&self, frame: EncodedFrame, timeout: std::time::Duration) -> io::Result<()> {
        self.frames.send_timeout(frame, timeout).map_err(|e| match e {
            crossbeam_channel::SendTimeoutError::Timeout(_) => io::Error::from(io::ErrorKind::TimedOut),
            crossbeam_channel::SendTimeoutError::Disconnected(_) => {
                io::Error::new(io::ErrorKind::BrokenPipe, "connection closed")
            }
        })?;
        self.waker.wake()
    }
}

impl Drop for PumpTx {
    fn drop(&mut self) {
        // The pump finds its channel closed at once, sends what it holds and ends.
        let _ = self.waker.wake();
    }
}

/// Starts the thread that owns `tls` (with `decoder`'s buffered bytes): frames sent through the
/// returned sender go out, frames that arrive come out of the receiver (an error ends it).
/// Nothing heard for `timeout` (a node sends heartbeats every second) ends the connection with
/// `TimedOut`, as a plain client's read timeout does.
pub(crate) fn pump(
    tls: StreamOwned<ClientConnection, TcpStream>,
    mut decoder: FrameDecoder,
    addr: SocketAddr,
    timeout: std::time::Duration,
) -> Result<(PumpTx, Receiver<Result<Frame, ClientError>>), ClientError> {
    let io = |source| ClientError::Io { addr, source };
    let StreamOwned { conn, sock } = tls;
    let mut conn = Connection::Client(conn);
    sock.set_nonblocking(true).map_err(io)?;
    let mut sock = mio::net::TcpStream::from_std(sock);
    let mut poll = mio::Poll::new().map_err(io)?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE).map_err(io)?);
    poll.registry().register(&mut sock, SOCK, mio::Interest::READABLE | mio::Interest::WRITABLE).map_err(io)?;
    let (out_tx, out_rx) = crossbeam_channel::bounded::<EncodedFrame>(1024);
    let (in_tx, in_rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("weir-client-tls".into())
        .spawn(move || {
            let mut events = mio::Events::with_capacity(8);
            let mut buf = vec![0u8; 64 << 10];
            // A frame rustls took only part of (its buffers are bounded), and how far.
            let mut pending: Option<(EncodedFrame, usize)> = None;
            let end = |e: ClientError| {
                let _ = in_tx.send(Err(e));
            };
            let mut heard = std::time::Instant::now();
            loop {
                // Frames to send, as far as rustls takes them; then the records to the socket.
                loop {
                    let (f, at) = match pending.take() {
                        Some(p) => p,
                        None => match out_rx.try_recv() {
                            Ok(f) => (f, 0),
                            Err(crossbeam_channel::TryRecvError::Empty) => break,
                            // The writer is gone: what it sent goes out (for a second at most),
                            // then the connection ends.
                            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                                let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
                                while conn.wants_write() && std::time::Instant::now() < until {
                                    match tls::flush(&mut conn, &mut sock) {
                                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                            let _ = poll.poll(&mut events, Some(std::time::Duration::from_millis(20)));
                                        }
                                        _ => break,
                                    }
                                }
                                let _ = sock.shutdown(std::net::Shutdown::Both);
                                return end(ClientError::Io { addr, source: io::ErrorKind::BrokenPipe.into() });
                            }
                        },
                    };
                    let n = match conn.writer().write(&f.as_bytes()[at..]) {
                        Ok(n) => n,
                        Err(e) => return end(ClientError::Io { addr, source: e }),
                    };
                    if at + n < f.len() {
                        pending = Some((f, at + n));
                        break;
                    }
                }
                match tls::flush(&mut conn, &mut sock) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return end(ClientError::Io { addr, source: e }),
                }
                // What arrived (and what the decoder held already), as frames.
                loop {
                    match decoder.next_frame() {
                        Ok(Some(f)) => {
                            if in_tx.send(Ok(f)).is_err() {
                                return;
                            }
                            continue;
                        }
                        Ok(None) => {}
                        Err(source) => return end(ClientError::Frame { addr, source }),
                    }
                    match tls::read(&mut conn, &mut sock, &mut buf) {
                        Ok(0) => {
                            return end(ClientError::Io { addr, source: io::ErrorKind::UnexpectedEof.into() });
                        }
                        Ok(n) => {
                            heard = std::time::Instant::now();
                            decoder.feed(&buf[..n]);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return end(ClientError::Io { addr, source: e }),
                    }
                }
                // Room again in rustls's buffers: take on the partly written frame at once.
                if pending.is_some() && !conn.wants_write() {
                    continue;
                }
                let left = timeout.saturating_sub(heard.elapsed());
                if left.is_zero() {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                    return end(ClientError::Io { addr, source: io::ErrorKind::TimedOut.into() });
                }
                if let Err(e) = poll.poll(&mut events, Some(left))
                    && e.kind() != io::ErrorKind::Interrupted
                {
                    return end(ClientError::Io { addr, source: e });
                }
            }
        })
        .map_err(io)?;
    Ok((PumpTx { frames: out_tx, waker }, in_rx))
}
