//! A blocking, single-connection client for tools and tests (`weir load`, `weir status`): dials a
//! node, runs the same authenticated handshake as the transport, then sends and receives frames on
//! a plain `std` socket. Nodes talk to each other through [`Transport`](super::Transport) instead.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::client_io::{self, Io, PumpTx};
use super::handshake::{self, Side, Transcript};
use super::tls::TlsConfig;
use crate::frame::{
    EncodedFrame, Frame, FrameDecoder, FrameEncoder, FrameError, HANDSHAKE_MAX_FRAME, PROTOCOL_VERSION,
};
use crate::ids::NodeId;
use crate::msg::{Auth, Challenge, Close, CloseCode, Heartbeat, Hello, Kind, Message, Welcome};
use crate::role::{Role, valid_client_name};

/// What a client proves in its handshake.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// The cluster secret: a member's rights.
    Secret(Vec<u8>),
    /// A client credential: its name and key ([`client_key`](crate::role::client_key) of the name
    /// and role, handed out by whoever holds the cluster secret).
    Client {
        /// The name the cluster's config lists with a role.
        name: String,
        /// The derived key.
        key: [u8; 32],
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Secret(_) => f.write_str("Credential::Secret(<redacted>)"),
            Credential::Client { name, .. } => write!(f, "Credential::Client({name}, <redacted>)"),
        }
    }
}

/// Why a credential string was refused (fatal: fix the string).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Not `NAME:KEY`.
    #[error("a credential is NAME:KEY (64 hex digits), as `weir credential` prints it")]
    Shape,
    /// The name is not a client name.
    #[error("client name {name:?} is not 1 to 64 letters, digits, '-', '_' or '.'")]
    Name {
        /// The name given.
        name: String,
    },
    /// The key is not 64 hex digits.
    #[error("the key of client {name:?} is not 64 hex digits")]
    Key {
        /// The name given.
        name: String,
    },
}

impl Credential {
    /// The credential of client `name` with `role`, derived from the cluster secret.
    pub fn derive(cluster_secret: &[u8], name: &str, role: Role) -> Credential {
        Credential::Client { name: name.to_string(), key: crate::role::client_key(cluster_secret, name, role) }
    }

    /// Parses `NAME:KEY` (the key in hex), as [`Credential::to_token`] writes it.
    pub fn parse(s: &str) -> Result<Credential, CredentialError> {
        let (name, hex) = s.trim().split_once(':').ok_or(CredentialError::Shape)?;
        if !valid_client_name(name) {
            return Err(CredentialError::Name { name: name.chars().take(64).collect() });
        }
        let bad = || CredentialError::Key { name: name.to_string() };
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut key = [0u8; 32];
        for (i, k) in key.iter_mut().enumerate() {
            *k = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Credential::Client { name: name.to_string(), key })
    }

    /// `NAME:KEY` for a client credential (`None` for the cluster secret).
    pub fn to_token(&self) -> Option<String> {
        match self {
            Credential::Secret(_) => None,
            Credential::Client { name, key } => {
                let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                Some(format!("{name}:{hex}"))
            }
        }
    }

    fn parts(&self) -> (&str, &[u8]) {
        match self {
            Credential::Secret(s) => ("", s),
            Credential::Client { name, key } => (name, key),
        }
    }
}

/// Errors of the blocking client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed (retryable: the node may be restarting).
    #[error("i/o with {addr}: {source}")]
    Io {
        /// The node.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The node sent bytes that are not a valid frame (fatal for this connection).
    #[error("bad frame from {addr}: {source}")]
    Frame {
        /// The node.
        addr: SocketAddr,
        /// What was wrong.
        #[source]
        source: FrameError,
    },
    /// The node refused or closed the connection, saying why.
    #[error("{addr} closed the connection: {code:?}: {message}")]
    Closed {
        /// The node.
        addr: SocketAddr,
        /// Reason code.
        code: CloseCode,
        /// Detail.
        message: String,
    },
    /// The handshake went wrong on our side (wrong secret, cluster, unexpected frame).
    #[error("handshake with {addr} failed: {reason}")]
    Handshake {
        /// The node.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

impl ClientError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Io { .. } => true,
            ClientError::Closed { code, .. } => matches!(code, CloseCode::Shutdown | CloseCode::Timeout),
            ClientError::Frame { .. } | ClientError::Handshake { .. } => false,
        }
    }
}

/// An authenticated connection to one node.
#[derive(Debug)]
pub struct BlockingClient {
    stream: Io,
    addr: SocketAddr,
    peer: NodeId,
    /// This client's id in its `Hello` (its heartbeats carry it).
    me: NodeId,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    /// The role the node granted (its `Welcome`).
    role: String,
    /// What bounds a read or a write.
    timeout: Duration,
}

impl BlockingClient {
    /// Dials `addr` and proves the cluster secret as node `me` of `cluster`. `timeout` bounds the
    /// connect and every later read and write (of the split halves too).
    pub fn connect(
        addr: SocketAddr,
        cluster: &str,
        me: NodeId,
        secret: &[u8],
        timeout: Duration,
    ) -> Result<BlockingClient, ClientError> {
        Self::connect_as(addr, cluster, me, &Credential::Secret(secret.to_vec()), timeout)
    }

    /// Dials `addr` and proves `cred` as node `me` of `cluster` (a client credential needs an id
    /// above [`MAX_MEMBER_ID`](crate::role::MAX_MEMBER_ID)). `timeout` bounds the connect and
    /// every later read.
    pub fn connect_as(
        addr: SocketAddr,
        cluster: &str,
        me: NodeId,
        cred: &Credential,
        timeout: Duration,
    ) -> Result<BlockingClient, ClientError> {
        Self::connect_with(addr, cluster, me, cred, None, timeout)
    }

    /// [`BlockingClient::connect_as`] over TLS when `tls` is given (a node of a cluster that
    /// speaks it: [`TlsConfig::client`] with the cluster's CA).
    pub fn connect_with(
        addr: SocketAddr,
        cluster: &str,
        me: NodeId,
        cred: &Credential,
        tls: Option<&TlsConfig>,
        timeout: Duration,
    ) -> Result<BlockingClient, ClientError> {
        let (client, key) = cred.parts();
        let io = |source| ClientError::Io { addr, source };
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut c = BlockingClient {
            stream: Io::new(stream, tls).map_err(io)?,
            addr,
            peer: NodeId(0),
            me,
            decoder: FrameDecoder::new(HANDSHAKE_MAX_FRAME),
            encoder: FrameEncoder::new(),
            role: String::new(),
            timeout,
        };
        let dialer_nonce = handshake::nonce().map_err(io)?;
        c.send(&Hello {
            cluster: cluster.to_string(),
            node: me,
            protocol_version: PROTOCOL_VERSION,
            incarnation: 0,
            nonce: dialer_nonce,
            client: client.to_string(),
        })?;
        let frame = c.recv()?;
        let ch = frame
            .to_owned::<Challenge>()
            .map_err(|e| ClientError::Handshake { addr, reason: format!("expected Challenge: {e}") })?;
        let t = Transcript {
            cluster,
            client,
            dialer: me,
            acceptor: ch.node,
            dialer_incarnation: 0,
            acceptor_incarnation: ch.incarnation,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &ch.nonce,
        };
        if !handshake::verify(key, Side::Acceptor, &t, &ch.proof) {
            let what =
                if client.is_empty() { "the cluster secret".to_string() } else { format!("client {client}'s key") };
            let reason = format!("node {} could not prove {what} of cluster {cluster:?}", ch.node);
            let _ = c.send(&Close { code: CloseCode::AuthFailed, message: reason.clone() });
            return Err(ClientError::Handshake { addr, reason });
        }
        c.send(&Auth { proof: handshake::prove(key, Side::Dialer, &t) })?;
        let welcome = c.recv()?;
        let role = welcome
            .to_owned::<Welcome>()
            .map_err(|e| ClientError::Handshake { addr, reason: format!("expected Welcome: {e}") })?
            .role;
        c.role = role;
        c.peer = ch.node;
        c.decoder.set_max_frame(crate::frame::DEFAULT_MAX_FRAME);
        Ok(c)
    }

    /// The node at the other end.
    pub fn peer(&self) -> NodeId {
        self.peer
    }

    /// The role the node granted this client (`member`, `read`, `ingest`, `admin`).
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Encodes and sends one message.
    pub fn send<M: Message>(&mut self, msg: &M) -> Result<(), ClientError> {
        let frame = self.encoder.encode(msg).map_err(|source| ClientError::Frame { addr: self.addr, source })?;
        self.send_frame(&frame)
    }

    /// Sends an encoded frame.
    pub fn send_frame(&mut self, frame: &EncodedFrame) -> Result<(), ClientError> {
        self.send_raw(frame.as_bytes())
    }

    /// Writes raw bytes (for tests that play a misbehaving peer).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
            .map_err(|source| ClientError::Io { addr: self.addr, source })
    }

    /// The next frame other than a heartbeat. A `Close` from the node becomes `ClientError::Closed`.
    /// Each heartbeat of the node is answered with one: a node ends a connection silent past its
    /// `dead_after`, and an answer may take longer than that to come (a stop waits for a
    /// savepoint).
    pub fn recv(&mut self) -> Result<Frame, ClientError> {
        let addr = self.addr;
        loop {
            match self.decoder.next_frame().map_err(|source| ClientError::Frame { addr, source })? {
                Some(f) if f.kind() == Kind::Heartbeat => {
                    let sent_at_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    self.send(&Heartbeat { node: self.me, sent_at_ms, tasks: Vec::new() })?;
                    continue;
                }
                Some(f) if f.kind() == Kind::Close => {
                    let close = f.to_owned::<Close>().map_err(|source| ClientError::Frame { addr, source })?;
                    return Err(ClientError::Closed { addr, code: close.code, message: close.message });
                }
                Some(f) => return Ok(f),
                None => {}
            }
            let n = self.decoder.read_from(&mut self.stream).map_err(|source| ClientError::Io { addr, source })?;
            if n == 0 {
                let source = io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed");
                return Err(ClientError::Io { addr, source });
            }
        }
    }
}

/// The sending half of a [`BlockingClient`] (see [`BlockingClient::split`]).
#[derive(Debug)]
pub struct ClientWriter {
    out: Out,
    addr: SocketAddr,
    encoder: FrameEncoder,
}

enum Out {
    Plain(TcpStream),
    Tls(PumpTx, TcpStream, Duration),
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if matches!(self, Out::Plain(_)) { "Out::Plain" } else { "Out::Tls" })
    }
}

/// The receiving half of a [`BlockingClient`].
#[derive(Debug)]
pub struct ClientReader {
    inner: In,
}

#[derive(Debug)]
enum In {
    Plain(BlockingClient),
    Tls { frames: crossbeam_channel::Receiver<Result<Frame, ClientError>>, addr: SocketAddr },
}

impl BlockingClient {
    /// Two halves that send and receive on their own threads (a client with many requests in
    /// flight, as `weir load`). Shutting the writer down ends the reader's `recv`. Under TLS a
    /// thread of its own drives the connection between them (`client_io`).
    pub fn split(self) -> Result<(ClientWriter, ClientReader), ClientError> {
        let addr = self.addr;
        let io = |source| ClientError::Io { addr, source };
        let encoder = FrameEncoder::new();
        match self.stream {
            Io::Plain(ref s) => {
                let stream = s.try_clone().map_err(io)?;
                Ok((ClientWriter { out: Out::Plain(stream), addr, encoder }, ClientReader { inner: In::Plain(self) }))
            }
            Io::Tls(tls) => {
                let sock = tls.sock.try_clone().map_err(io)?;
                let (tx, frames) = client_io::pump(*tls, self.decoder, addr, self.timeout)?;
                Ok((
                    ClientWriter { out: Out::Tls(tx, sock, self.timeout), addr, encoder },
                    ClientReader { inner: In::Tls { frames, addr } },
                ))
            }
        }
    }
}

impl ClientWriter {
    /// Encodes and sends one message.
    pub fn send<M: Message>(&mut self, msg: &M) -> Result<(), ClientError> {
        let addr = self.addr;
        let frame = self.encoder.encode(msg).map_err(|source| ClientError::Frame { addr, source })?;
        let sent = match &mut self.out {
            Out::Plain(s) => s.write_all(frame.as_bytes()),
            Out::Tls(tx, _, timeout) => tx.send(frame, *timeout),
        };
        sent.map_err(|source| ClientError::Io { addr, source })
    }

    /// Closes the connection both ways (the reader's `recv` returns an error; under TLS the pump
    /// sees the socket end and stops).
    pub fn shutdown(&self) {
        let (Out::Plain(s) | Out::Tls(_, s, _)) = &self.out;
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

impl ClientReader {
    /// The next frame other than a heartbeat (as [`BlockingClient::recv`]).
    pub fn recv(&mut self) -> Result<Frame, ClientError> {
        match &mut self.inner {
            In::Plain(c) => c.recv(),
            In::Tls { frames, addr } => loop {
                let addr = *addr;
                let f = frames
                    .recv()
                    .unwrap_or_else(|_| Err(ClientError::Io { addr, source: io::ErrorKind::UnexpectedEof.into() }))?;
                match f.kind() {
                    Kind::Heartbeat => continue,
                    Kind::Close => {
                        let close = f.to_owned::<Close>().map_err(|source| ClientError::Frame { addr, source })?;
                        return Err(ClientError::Closed { addr, code: close.code, message: close.message });
                    }
                    _ => return Ok(f),
                }
            },
        }
    }
}
