//! Who may connect and how, as the cluster file says: the secret (never printed), client
//! credentials with their roles, and the TLS files.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;
use weir_engine::wire::role::Role;
use weir_engine::wire::transport::tls::TlsConfig;

use super::ClusterFile;

/// TLS: the cluster's CA, and a node's certificate and key (PEM files; relative paths from the
/// config file's directory). Nodes need all three; clients only `ca`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    /// The CA that signs every node's certificate.
    pub ca: PathBuf,
    /// This node's certificate (chain), signed by `ca`, naming `server_name`.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The name every node's certificate carries (default `"weir"`).
    #[serde(default = "default_server_name")]
    pub server_name: String,
}

fn default_server_name() -> String {
    "weir".into()
}

impl TlsFile {
    /// A node's TLS: its certificate and key, trusting the CA.
    pub fn member(&self) -> anyhow::Result<TlsConfig> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            bail!("[tls]: a node needs `cert` and `key` besides `ca`");
        };
        Ok(TlsConfig::member(&self.ca, cert, key, &self.server_name)?)
    }

    /// A client's TLS: trusting the CA, presenting no certificate.
    pub fn client(&self) -> anyhow::Result<TlsConfig> {
        Ok(TlsConfig::client(&self.ca, &self.server_name)?)
    }
}

/// A string that is never printed: `Debug` says `<redacted>`.
#[derive(Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A client credential the nodes accept.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// Its name (1 to 64 letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// `"read"` (status, query, verify), `"ingest"` (weir load) or `"admin"` (read, stop,
    /// checkpoint-now).
    pub role: String,
}

impl ClusterFile {
    /// The client credentials the nodes accept, by name.
    pub fn client_roles(&self) -> anyhow::Result<HashMap<String, Role>> {
        let mut roles = HashMap::new();
        for c in &self.clients {
            if !weir_engine::wire::role::valid_client_name(&c.name) {
                bail!("clients: {:?} is not 1 to 64 letters, digits, '-', '_' or '.'", c.name);
            }
            let role = Role::client(&c.role).with_context(|| {
                format!("clients: {} has role {:?}: \"read\", \"ingest\" or \"admin\"", c.name, c.role)
            })?;
            if roles.insert(c.name.clone(), role).is_some() {
                bail!("clients: {} is listed twice", c.name);
            }
        }
        Ok(roles)
    }
}
