//! The handshake on a connection: hello, challenge, auth, welcome, then established (the proofs
//! are in `transport/handshake.rs`).
//!
//! Invariant: before the peer's proof is verified, a connection changes nothing beyond itself (no
//! incarnation is taken, no event but a refusal is reported) and tells the peer nothing beyond what
//! its next handshake step needs (not this node's cluster name when the peer named another one).
//! The acceptor proves its key first, over the dialer's nonce; the dialer acts on the acceptor's
//! incarnation only after checking that proof, and the acceptor on the dialer's only after `Auth`.
//!
//! Incarnations are processes: a member that restarts takes a greater one. A member proving an
//! incarnation below the newest its node proved here is an older process of it (one paused, say,
//! while a new one took its place) and is refused ([`CloseCode::Stale`]); one proving a greater
//! incarnation than its established connection's replaces that connection, reported as the
//! peer's loss and return (its process restarted: whatever it ran is gone).

use super::*;
use crate::role::{Role, client_key};

/// Largest frame a read or admin client may send (its requests are a few dozen bytes).
const CLIENT_REQUEST_MAX: usize = 64 << 10;

impl EventLoop {
    /// The key a dialer naming `client` must prove, and the role it gets (`None`: no such client).
    fn key_for(&self, client: &str) -> Option<(Role, Vec<u8>)> {
        if client.is_empty() {
            return Some((Role::Member, self.cfg.secret.clone()));
        }
        let role = *self.cfg.clients.get(client)?;
        Some((role, client_key(&self.cfg.secret, client, role).to_vec()))
    }

    pub(super) fn on_hello(&mut self, token: Token, frame: &Frame) -> bool {
        let hello = match frame.to_owned::<Hello>() {
            Ok(h) => h,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Hello: {e}")),
        };
        if hello.cluster != self.cfg.cluster {
            // Not this node's name: a caller without the secret learns nothing from the refusal.
            let reason = format!("this node is not in cluster {}", untrusted(&hello.cluster));
            return self.refuse(token, CloseCode::ClusterMismatch, reason);
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            let reason = format!("peer speaks protocol {}, this node {}", hello.protocol_version, PROTOCOL_VERSION);
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if hello.node == self.cfg.node {
            return self.refuse(
                token,
                CloseCode::ProtocolViolation,
                format!("peer claims this node's id {}", hello.node),
            );
        }
        // Before the name is looked up: the answer must not tell which names exist.
        if !hello.client.is_empty() && !Role::Read.fits(hello.node) {
            let reason = format!("a client credential is proven with a node id above {}", crate::role::MAX_MEMBER_ID);
            return self.refuse(token, CloseCode::ProtocolViolation, reason);
        }
        if hello.client.is_empty() && !Role::Member.fits(hello.node) {
            return self.refuse(token, CloseCode::ProtocolViolation, "node id 0 is nobody's".to_string());
        }
        let keyed = self.key_for(&hello.client);
        let acceptor_nonce = match proof::nonce() {
            Ok(n) => n,
            Err(e) => return self.refuse(token, CloseCode::Shutdown, format!("no randomness: {e}")),
        };
        // An unknown client gets a challenge under a key nobody holds: its failure then looks like
        // a wrong key's, and the refusal does not say which names exist.
        let key = match &keyed {
            Some((_, k)) => k.clone(),
            None => match proof::nonce() {
                Ok(n) => n.to_vec(),
                Err(e) => return self.refuse(token, CloseCode::Shutdown, format!("no randomness: {e}")),
            },
        };
        let dialer_incarnation = if hello.client.is_empty() { hello.incarnation } else { 0 };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            client: &hello.client,
            dialer: hello.node,
            acceptor: self.cfg.node,
            dialer_incarnation,
            acceptor_incarnation: self.cfg.incarnation,
            dialer_nonce: &hello.nonce,
            acceptor_nonce: &acceptor_nonce,
        };
        let challenge = Challenge {
            node: self.cfg.node,
            protocol_version: PROTOCOL_VERSION,
            incarnation: self.cfg.incarnation,
            nonce: acceptor_nonce,
            proof: proof::prove(&key, Side::Acceptor, &t),
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.dialer = Some(hello.node);
            c.phase = Phase::AwaitAuth(Box::new(Awaiting {
                peer: hello.node,
                client: hello.client,
                keyed,
                dialer_incarnation,
                dialer_nonce: hello.nonce,
                acceptor_nonce,
            }));
        }
        self.queue_control(token, &challenge);
        self.flush(token);
        true
    }

    pub(super) fn on_challenge(&mut self, token: Token, frame: &Frame, dialer_nonce: [u8; NONCE_LEN]) -> bool {
        let ch = match frame.to_owned::<Challenge>() {
            Ok(c) => c,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Challenge: {e}")),
        };
        let target = self.conns.get(&token).and_then(|c| c.target);
        if ch.protocol_version != PROTOCOL_VERSION {
            let reason =
                format!("peer {} speaks protocol {}, this node {}", ch.node, ch.protocol_version, PROTOCOL_VERSION);
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if target.is_some_and(|t| t != ch.node) {
            let reason = format!("dialed {:?} but {} answered", target, ch.node);
            return self.refuse(token, CloseCode::ProtocolViolation, reason);
        }
        let t = Transcript {
            cluster: &self.cfg.cluster,
            client: "",
            dialer: self.cfg.node,
            acceptor: ch.node,
            dialer_incarnation: self.cfg.incarnation,
            acceptor_incarnation: ch.incarnation,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &ch.nonce,
        };
        if !proof::verify(&self.cfg.secret, Side::Acceptor, &t, &ch.proof) {
            let reason = format!("peer {} could not prove the cluster secret", ch.node);
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        // Proven: its incarnation is the peer's own.
        if let Some(seen) = self.replaced(ch.node, ch.incarnation) {
            return self.stale(token, ch.node, ch.incarnation, seen);
        }
        let auth = Auth { proof: proof::prove(&self.cfg.secret, Side::Dialer, &t) };
        if let Some(c) = self.conns.get_mut(&token) {
            c.phase = Phase::AwaitWelcome { peer: ch.node, incarnation: ch.incarnation };
        }
        self.queue_control(token, &auth);
        self.flush(token);
        true
    }

    pub(super) fn on_auth(&mut self, token: Token, frame: &Frame, a: Awaiting) -> bool {
        let auth = match frame.to_owned::<Auth>() {
            Ok(a) => a,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Auth: {e}")),
        };
        let who = if a.client.is_empty() { "the cluster secret".to_string() } else { format!("client {}", a.client) };
        let Some((role, key)) = a.keyed else {
            return self.refuse(token, CloseCode::AuthFailed, format!("peer {} could not prove {who}", a.peer));
        };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            client: &a.client,
            dialer: a.peer,
            acceptor: self.cfg.node,
            dialer_incarnation: a.dialer_incarnation,
            acceptor_incarnation: self.cfg.incarnation,
            dialer_nonce: &a.dialer_nonce,
            acceptor_nonce: &a.acceptor_nonce,
        };
        if !proof::verify(&key, Side::Dialer, &t, &auth.proof) {
            return self.refuse(token, CloseCode::AuthFailed, format!("peer {} could not prove {who}", a.peer));
        }
        // Proven: no longer a stranger, whatever follows.
        self.authenticated(token);
        // Under TLS a member also presents a certificate of the cluster's CA (checked by rustls).
        let certified =
            self.conns.get(&token).and_then(|c| c.tls.as_ref()).is_none_or(|t| t.peer_certificates().is_some());
        if role == Role::Member && !certified {
            let reason = format!("peer {} proved the cluster secret but presented no certificate", a.peer);
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        // Proven: only now may its incarnation replace an older process's connection.
        if role == Role::Member
            && let Some(seen) = self.replaced(a.peer, a.dialer_incarnation)
        {
            return self.stale(token, a.peer, a.dialer_incarnation, seen);
        }
        self.queue_control(token, &Welcome { role: role.name().to_string() });
        let incarnation = if role == Role::Member { a.dialer_incarnation } else { 0 };
        self.established(token, a.peer, role, incarnation)
    }

    pub(super) fn on_welcome(&mut self, token: Token, frame: &Frame, peer: NodeId, incarnation: u64) -> bool {
        if let Err(e) = frame.access::<Welcome>() {
            return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Welcome: {e}"));
        }
        // The acceptor proved the cluster secret in its challenge: a member.
        self.established(token, peer, Role::Member, incarnation)
    }

    /// Refuses member `peer`'s connection at `theirs`: a newer process of it proved `seen`
    /// here. Only after the peer proved its key.
    fn stale(&mut self, token: Token, peer: NodeId, theirs: u64, seen: u64) -> bool {
        let reason = format!("node {peer} at incarnation {theirs} was replaced by a newer process at {seen}");
        self.refuse(token, CloseCode::Stale, reason)
    }

    /// The newest incarnation `peer` proved here, when `theirs` is below it (an older process).
    fn replaced(&self, peer: NodeId, theirs: u64) -> Option<u64> {
        self.peers.get(&peer).map(|p| p.incarnation).filter(|seen| theirs < *seen)
    }

    /// The handshake on `token` completed with `peer` in `role`, a member at `incarnation` (0
    /// for a client). False if this connection lost to another.
    pub(super) fn established(&mut self, token: Token, peer: NodeId, role: Role, incarnation: u64) -> bool {
        self.shared.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        let client = role != Role::Member;
        if client {
            if self.clients >= self.cfg.max_clients {
                let reason = format!("this node serves {} clients already: try again later", self.clients);
                return self.refuse(token, CloseCode::Busy, reason);
            }
            // One id, one credential: a connection with another role may not take its place.
            let old = self.peers.get(&peer).and_then(|p| p.conn).and_then(|t| self.conns.get(&t));
            if old.is_some_and(|c| !matches!(c.phase, Phase::Established { role: r, .. } if r == role)) {
                return self.refuse(token, CloseCode::ProtocolViolation, format!("node id {peer} is taken"));
            }
        }
        let me = self.cfg.node;
        // Requests of read and admin clients are small: a large frame from one is refused.
        let max_frame = match role {
            Role::Read | Role::Admin => CLIENT_REQUEST_MAX.min(self.cfg.max_frame),
            Role::Ingest | Role::Member => self.cfg.max_frame,
        };
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        conn.phase = Phase::Established { peer, role };
        conn.decoder.set_max_frame(max_frame);
        conn.client_slot = client;
        if conn.dialer.is_none() {
            conn.dialer = Some(me);
        }
        let new_dialer = conn.dialer;
        let addr = conn.addr;
        if client {
            self.clients += 1;
        }
        if !self.peers.contains_key(&peer) {
            // A node we were not told about (a client, or a peer that dials us): give it a queue.
            let (tx, rx) = crossbeam_channel::bounded(self.cfg.send_queue);
            if let Ok(mut q) = self.shared.queues.write() {
                q.insert(peer, tx);
            }
            let now = Instant::now();
            let p = Peer {
                configured: false,
                addr: None,
                rx,
                conn: None,
                dialing: None,
                next_dial: now,
                backoff: self.cfg.reconnect_min,
                incarnation: 0,
                left_in_order: false,
            };
            self.peers.insert(peer, p);
        }
        let p = self.peers.get_mut(&peer).expect("peer inserted above");
        if p.dialing == Some(token) {
            p.dialing = None;
        }
        if incarnation < p.incarnation {
            // Another connection proved a newer process while this one finished its handshake.
            let seen = p.incarnation;
            return self.stale(token, peer, incarnation, seen);
        }
        // A new process of a node seen before: whatever the old one ran is gone. Its loss is
        // reported before the new one's arrival, unless it was already (the old connection
        // broke without a goodbye). What is queued for it stays: frames of runs the new process
        // joins go with it, and its router drops an earlier run's.
        let restarted = p.incarnation > 0 && p.incarnation < incarnation;
        let (old, in_order) = (p.incarnation, std::mem::take(&mut p.left_in_order));
        p.incarnation = incarnation;
        if restarted {
            let report = p.conn.is_some() || in_order;
            let reason = format!("node {peer} restarted (incarnation {incarnation})");
            if let Some(conn) = p.conn.take() {
                // Taken out first: the old connection's end is no loss of the peer to book. The
                // old process hears it was replaced.
                let why = format!("node {peer} at incarnation {old} was replaced by a newer process at {incarnation}");
                self.end(conn, Ending::tell(CloseCode::Stale, why));
            }
            if report {
                tracing::info!(node = %me, %peer, %reason, "peer down");
                self.emit(Event::PeerDown { node: peer, reason, orderly: false });
            }
        }
        let p = self.peers.get_mut(&peer).expect("peer");
        if let Some(old) = p.conn {
            let old_dialer = self.conns.get(&old).and_then(|c| c.dialer);
            // Same dialer: the newer connection wins (the old one is stale). Otherwise the
            // connection dialed by the lower node id wins, on both ends alike.
            let keep_new = old_dialer == new_dialer || new_dialer.map(|n| n.0) < old_dialer.map(|n| n.0);
            let (loser, winner) = if keep_new { (old, token) } else { (token, old) };
            self.peers.get_mut(&peer).expect("peer").conn = Some(winner);
            let ending = Ending::tell(CloseCode::Replaced, format!("another connection to {peer} replaces this one"));
            self.end(loser, ending);
            if !keep_new {
                return false;
            }
            tracing::debug!(node = %me, %peer, %addr, "connection replaced");
            self.flush(token);
            return true;
        }
        p.conn = Some(token);
        p.backoff = self.cfg.reconnect_min;
        if p.configured {
            tracing::info!(node = %me, %peer, %addr, "peer up");
        } else {
            tracing::debug!(node = %me, client = %peer, %role, %addr, "client connected");
        }
        self.emit(Event::PeerUp { node: peer, addr });
        self.flush(token);
        true
    }
}
