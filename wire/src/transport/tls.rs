//! Optional TLS 1.3 on every link (rustls), under the handshake of `handshake.rs`: TLS keeps what
//! crosses the network private and whole; the key proven inside it still says who the peer is
//! and what it may do.
//!
//! Members present a certificate of the cluster's CA both ways (mutual authentication); clients
//! present none and verify the node's. Certificates name the cluster's `server_name`, not an
//! address, so one certificate per node serves wherever it runs. The network thread drives TLS
//! through [`read`] and [`write`] on a non-blocking socket: TLS records pending on the socket go
//! out before more plaintext is taken, so a full socket still pushes back on the sender.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, Connection, RootCertStore, ServerConfig};

/// Why TLS settings could not be built (fatal: fix the files).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM item of its kind.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which file (`ca`, `cert`, `key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the settings (a key that does not match its certificate, say).
    #[error("TLS settings: {0}")]
    Rustls(String),
}

/// What TLS a transport speaks: built once, shared by every connection.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Option<Arc<ServerConfig>>,
    pub(crate) client: Arc<ClientConfig>,
    pub(crate) name: ServerName<'static>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").field("server_name", &self.name).field("member", &self.server.is_some()).finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &Path) -> Result<RootCertStore, TlsError> {
    let bad = |reason: String| TlsError::File { what: "ca", path: ca.to_path_buf(), reason };
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
        roots.add(c.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    Ok(roots)
}

fn name(server_name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(server_name.to_string()).map_err(|e| TlsError::Rustls(format!("server name: {e}")))
}

impl TlsConfig {
    /// A member's: it presents `cert` (with `key`) to peers and clients, and to the peers it
    /// dials; it trusts certificates of `ca` named `server_name`.
    pub fn member(ca: &Path, cert: &Path, key: &Path, server_name: &str) -> Result<TlsConfig, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect())
            .map_err(|e| TlsError::File { what: "cert", path: cert.to_path_buf(), reason: e.to_string() })?;
        let private = |what| {
            PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
                what,
                path: key.to_path_buf(),
                reason: e.to_string(),
            })
        };
        let roots = Arc::new(roots(ca)?);
        let rustls = |e: rustls::Error| TlsError::Rustls(e.to_string());
        // Clients present no certificate (they prove a credential inside); members must, which
        // the handshake checks once it knows which the peer claims to be.
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), private("key")?)
            .map_err(rustls)?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private("key")?)
            .map_err(rustls)?;
        Ok(TlsConfig { server: Some(Arc::new(server)), client: Arc::new(client), name: name(server_name)? })
    }

    /// A client's: it trusts nodes' certificates of `ca` named `server_name` and presents none.
    pub fn client(ca: &Path, server_name: &str) -> Result<TlsConfig, TlsError> {
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .with_root_certificates(roots(ca)?)
            .with_no_client_auth();
        Ok(TlsConfig { server: None, client: Arc::new(client), name: name(server_name)? })
    }

    /// A client connection to a node.
    pub(crate) fn dial(&self) -> io::Result<Connection> {
        let c = rustls::ClientConnection::new(self.client.clone(), self.name.clone()).map_err(io::Error::other)?;
        Ok(Connection::Client(c))
    }

    /// A server connection for a peer or client that dialed us (members only).
    pub(crate) fn accept(&self) -> Option<io::Result<Connection>> {
        let server = self.server.as_ref()?;
        Some(rustls::ServerConnection::new(server.clone()).map(Connection::Server).map_err(io::Error::other))
    }
}

/// Writes the TLS records pending on `tls` to `sock` (`WouldBlock` when the socket is full).
pub(crate) fn flush(tls: &mut Connection, sock: &mut impl Write) -> io::Result<()> {
    while tls.wants_write() {
        tls.write_tls(sock)?;
    }
    Ok(())
}

/// Reads plaintext through `tls` from `sock` into `buf`: what rustls holds already, else what
/// the socket has (handshake replies go out on the way). `Ok(0)` at the end of the stream.
pub(crate) fn read(tls: &mut Connection, sock: &mut (impl Read + Write), buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match tls.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if tls.read_tls(sock)? == 0 {
            return Ok(0);
        }
        tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match flush(tls, sock) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes plaintext through `tls` to `sock`: the records already pending first (`WouldBlock` if
/// they cannot all go), then as much of `bufs` as rustls takes, sent on at once.
pub(crate) fn write(tls: &mut Connection, sock: &mut impl Write, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    flush(tls, sock)?;
    let n = tls.writer().write_vectored(bufs)?;
    match flush(tls, sock) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    if n == 0 && bufs.iter().any(|b| !b.is_empty()) { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
}
