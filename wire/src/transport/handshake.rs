//! Proof of a shared key: HMAC-SHA256 challenge-response.
//!
//! The key is the cluster secret for members, a client's derived key (`role::client_key`) for a
//! client. The dialer sends a nonce in `Hello`; the acceptor answers with its own nonce and a proof
//! over both; the dialer checks it and answers with its proof in `Auth`; the acceptor checks that
//! and says `Welcome`. Each side proves the key over a fresh nonce chosen by the other, so a
//! recorded handshake cannot be replayed, and the two proofs are domain-separated so one cannot
//! stand in for the other. The proofs cover both identities, the client name and both
//! incarnations, so what either side acts on (a newer process replaces an older one's connection) is exactly
//! what the other proved. Proofs are compared in constant time (`Mac::verify_slice`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ids::NodeId;
use crate::msg::NONCE_LEN;

type HmacSha256 = Hmac<Sha256>;

/// Which side's proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Acceptor,
    Dialer,
}

/// What both proofs are computed over.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transcript<'a> {
    pub cluster: &'a str,
    /// Empty for a member.
    pub client: &'a str,
    pub dialer: NodeId,
    pub acceptor: NodeId,
    pub dialer_incarnation: u64,
    pub acceptor_incarnation: u64,
    pub dialer_nonce: &'a [u8; NONCE_LEN],
    pub acceptor_nonce: &'a [u8; NONCE_LEN],
}

fn mac(secret: &[u8], side: Side, t: &Transcript<'_>) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(match side {
        Side::Acceptor => b"weir-v1-acceptor",
        Side::Dialer => b"weir-v1-dialer\0\0",
    });
    m.update(&(t.cluster.len() as u32).to_le_bytes());
    m.update(t.cluster.as_bytes());
    m.update(&(t.client.len() as u32).to_le_bytes());
    m.update(t.client.as_bytes());
    m.update(&t.dialer.0.to_le_bytes());
    m.update(&t.acceptor.0.to_le_bytes());
    m.update(&t.dialer_incarnation.to_le_bytes());
    m.update(&t.acceptor_incarnation.to_le_bytes());
    m.update(t.dialer_nonce);
    m.update(t.acceptor_nonce);
    m
}

/// The proof `side` sends.
pub(crate) fn prove(secret: &[u8], side: Side, t: &Transcript<'_>) -> [u8; NONCE_LEN] {
    mac(secret, side, t).finalize().into_bytes().into()
}

/// Whether `proof` is `side`'s proof for this transcript (constant-time comparison).
pub(crate) fn verify(secret: &[u8], side: Side, t: &Transcript<'_>, proof: &[u8]) -> bool {
    mac(secret, side, t).verify_slice(proof).is_ok()
}

/// A fresh random nonce.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(a: &'a [u8; 32], b: &'a [u8; 32]) -> Transcript<'a> {
        Transcript {
            cluster: "c",
            client: "",
            dialer: NodeId(1),
            acceptor: NodeId(2),
            dialer_incarnation: 3,
            acceptor_incarnation: 4,
            dialer_nonce: a,
            acceptor_nonce: b,
        }
    }

    #[test]
    fn proof_verifies_only_with_the_same_secret_side_and_nonces() {
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        let p = prove(b"secret", Side::Dialer, &t(&a, &b));
        assert!(verify(b"secret", Side::Dialer, &t(&a, &b), &p));
        assert!(!verify(b"other", Side::Dialer, &t(&a, &b), &p));
        assert!(!verify(b"secret", Side::Acceptor, &t(&a, &b), &p), "proofs are side-separated");
        assert!(!verify(b"secret", Side::Dialer, &t(&b, &a), &p), "nonces are bound");
        assert!(!verify(b"secret", Side::Dialer, &t(&a, &b), &p[..31]));
        let newer = Transcript { dialer_incarnation: 9, ..t(&a, &b) };
        assert!(!verify(b"secret", Side::Dialer, &newer, &p), "incarnations are bound");
        let client = Transcript { client: "ops", ..t(&a, &b) };
        assert!(!verify(b"secret", Side::Dialer, &client, &p), "the client name is bound");
    }
}
