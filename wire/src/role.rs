//! Who may send what: the role a connection proved in its handshake, and the message kinds each
//! role may send.
//!
//! Members prove the cluster secret and may send everything. Clients prove a credential of their
//! own: a name from the cluster's config and a key derived from the cluster secret, the name and
//! the role ([`client_key`]), so a client never holds the cluster secret and a leaked key is worth
//! exactly its role. The transport checks every frame an established connection sends against
//! [`Role::allows`] before the application sees it.
//!
//! Node ids are split: members are `1..=MAX_MEMBER_ID`, and a client credential is accepted only
//! with an id above it, so no client can take a member's place in the peer table.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ids::NodeId;
use crate::msg::Kind;

/// The highest node id a member may have; clients present ids above it.
pub const MAX_MEMBER_ID: u32 = (1 << 31) - 1;

/// Longest client name (bytes).
pub const MAX_CLIENT_NAME: usize = 64;

/// What a connection may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Status, results and producer records: `weir status`, `query`, `verify`.
    Read,
    /// What `weir load` needs: appends, its producer records, status and results.
    Ingest,
    /// Read, and what changes a running cluster: `weir stop`, checkpoint-now.
    Admin,
    /// A node of the cluster (the cluster secret): everything.
    Member,
}

impl Role {
    /// Every role, least privileged first.
    pub const ALL: [Role; 4] = [Role::Read, Role::Ingest, Role::Admin, Role::Member];

    /// Whether a connection of this role may send a frame of `kind` once established.
    pub fn allows(self, kind: Kind) -> bool {
        use Kind::*;
        match self {
            Role::Member => true,
            // Liveness and goodbye are the transport's own, on every link.
            _ if matches!(kind, Heartbeat | Close) => true,
            Role::Read => matches!(kind, StatusReq | ResultsReq | ProducersReq | CatalogReq),
            Role::Ingest => matches!(kind, Ingest | StatusReq | ResultsReq | ProducersReq | CatalogReq),
            Role::Admin => {
                matches!(
                    kind,
                    StatusReq | ResultsReq | ProducersReq | CatalogReq | StopReq | CheckpointNowReq | CatalogChangeReq
                )
            }
        }
    }

    /// The role's name in config files and messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Ingest => "ingest",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }

    /// The client role with this name (`member` is not a client role).
    pub fn client(name: &str) -> Option<Role> {
        match name {
            "read" => Some(Role::Read),
            "ingest" => Some(Role::Ingest),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// Whether `node` is an id this role may present: clients only above [`MAX_MEMBER_ID`]
    /// (whoever proves the cluster secret is trusted with any id but 0; tools holding it present
    /// client ids too).
    pub fn fits(self, node: NodeId) -> bool {
        match self {
            Role::Member => node.0 >= 1,
            _ => node.0 > MAX_MEMBER_ID,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `name` is a valid client name: 1 to 64 bytes of ASCII letters, digits, `-`, `_`, `.`.
pub fn valid_client_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CLIENT_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The key of client `name` with `role`: HMAC-SHA256 of the name and role under the cluster
/// secret. Nodes derive it when a client connects; the client holds only this key.
pub fn client_key(cluster_secret: &[u8], name: &str, role: Role) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(cluster_secret).expect("HMAC takes keys of any length");
    m.update(b"weir-v1-client-key");
    m.update(role.name().as_bytes());
    m.update(&[0]);
    m.update(name.as_bytes());
    m.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_members_send_protocol_frames_and_clients_only_their_requests() {
        for &kind in Kind::ALL {
            assert!(Role::Member.allows(kind));
        }
        for role in [Role::Read, Role::Ingest, Role::Admin] {
            for kind in [Kind::Data, Kind::CheckpointReport, Kind::Restore, Kind::Credit, Kind::Replicate, Kind::Hello]
            {
                assert!(!role.allows(kind), "{role} must not send {kind:?}");
            }
        }
        assert!(!Role::Read.allows(Kind::Ingest) && !Role::Read.allows(Kind::StopReq));
        assert!(!Role::Ingest.allows(Kind::StopReq) && !Role::Ingest.allows(Kind::CheckpointNowReq));
        assert!(!Role::Admin.allows(Kind::Ingest));
        assert!(!Role::Read.allows(Kind::CatalogChangeReq) && !Role::Ingest.allows(Kind::CatalogChangeReq));
        assert!(Role::Admin.allows(Kind::CatalogChangeReq) && Role::Read.allows(Kind::CatalogReq));
        assert!(Role::Ingest.allows(Kind::Ingest) && Role::Admin.allows(Kind::StopReq));
    }

    #[test]
    fn client_keys_differ_by_secret_name_and_role() {
        let k = client_key(b"s", "ops", Role::Read);
        assert_eq!(k, client_key(b"s", "ops", Role::Read));
        assert_ne!(k, client_key(b"t", "ops", Role::Read));
        assert_ne!(k, client_key(b"s", "ops2", Role::Read));
        assert_ne!(k, client_key(b"s", "ops", Role::Admin));
    }

    #[test]
    fn ids_are_split_between_members_and_clients() {
        assert!(Role::Member.fits(NodeId(1)) && !Role::Member.fits(NodeId(0)));
        assert!(Role::Read.fits(NodeId(MAX_MEMBER_ID + 1)) && !Role::Read.fits(NodeId(3)));
        assert!(valid_client_name("ops-1.a_b") && !valid_client_name("") && !valid_client_name("a/b"));
        assert!(!valid_client_name(&"x".repeat(65)));
    }
}
