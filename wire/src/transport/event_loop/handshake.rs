//! The handshake on a connection: hello, challenge, proof, then established (the proofs are in
//! `transport/handshake.rs`).

use super::*;

impl EventLoop {
    pub(super) fn on_hello(&mut self, token: Token, frame: &Frame) -> bool {
        let hello = match frame.to_owned::<Hello>() {
            Ok(h) => h,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Hello: {e}")),
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.dialer = Some(hello.node);
        }
        if hello.cluster != self.cfg.cluster {
            let reason = format!(
                "peer {} is in cluster {:?}, this node is in {:?}",
                hello.node, hello.cluster, self.cfg.cluster
            );
            return self.refuse(token, CloseCode::ClusterMismatch, reason);
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            let reason = format!(
                "peer {} speaks protocol {}, this node {}",
                hello.node, hello.protocol_version, PROTOCOL_VERSION
            );
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if hello.node == self.cfg.node {
            return self.refuse(
                token,
                CloseCode::ProtocolViolation,
                format!("peer claims this node's id {}", hello.node),
            );
        }
        if self.cfg.clients_only && hello.incarnation > 0 {
            // The incarnation to restart at, if the peer's is newer.
            if let Some(theirs) = self.newer(hello.incarnation) {
                self.emit(Event::NewerIncarnation { node: hello.node, incarnation: theirs });
            }
            let reason = format!("node {} is restarting its stream and serves clients only", self.cfg.node);
            return self.refuse(token, CloseCode::Restarting, reason);
        }
        // A newer dialer: this node is stale, hears so, and refuses until it has restarted. (An
        // older dialer gets the challenge, sees this node's incarnation there and hangs up.)
        if let Some(theirs) = self.newer(hello.incarnation) {
            return self.stale(token, hello.node, theirs);
        }
        let acceptor_nonce = match proof::nonce() {
            Ok(n) => n,
            Err(e) => return self.refuse(token, CloseCode::Shutdown, format!("no randomness: {e}")),
        };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: hello.node,
            acceptor: self.cfg.node,
            dialer_nonce: &hello.nonce,
            acceptor_nonce: &acceptor_nonce,
        };
        let challenge = Challenge {
            cluster: self.cfg.cluster.clone(),
            node: self.cfg.node,
            protocol_version: PROTOCOL_VERSION,
            incarnation: self.cfg.incarnation,
            nonce: acceptor_nonce,
            proof: proof::prove(&self.cfg.secret, Side::Acceptor, &t),
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.phase = Phase::AwaitAuth { peer: hello.node, dialer_nonce: hello.nonce, acceptor_nonce };
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
        if ch.cluster != self.cfg.cluster {
            let reason =
                format!("peer {} is in cluster {:?}, this node is in {:?}", ch.node, ch.cluster, self.cfg.cluster);
            return self.refuse(token, CloseCode::ClusterMismatch, reason);
        }
        if ch.protocol_version != PROTOCOL_VERSION {
            let reason =
                format!("peer {} speaks protocol {}, this node {}", ch.node, ch.protocol_version, PROTOCOL_VERSION);
            return self.refuse(token, CloseCode::VersionMismatch, reason);
        }
        if target.is_some_and(|t| t != ch.node) {
            let reason = format!("dialed {:?} but {} answered", target, ch.node);
            return self.refuse(token, CloseCode::ProtocolViolation, reason);
        }
        if let Some(theirs) = self.newer(ch.incarnation) {
            return self.stale(token, ch.node, theirs);
        }
        if self.cfg.incarnation > 0 && ch.incarnation > 0 && ch.incarnation < self.cfg.incarnation {
            let reason = format!(
                "peer {} runs at incarnation {}, this node at {}: the peer restarts",
                ch.node, ch.incarnation, self.cfg.incarnation
            );
            return self.refuse(token, CloseCode::Stale, reason);
        }
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: self.cfg.node,
            acceptor: ch.node,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &ch.nonce,
        };
        if !proof::verify(&self.cfg.secret, Side::Acceptor, &t, &ch.proof) {
            let reason = format!("peer {} could not prove the cluster secret", ch.node);
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        let auth = Auth { proof: proof::prove(&self.cfg.secret, Side::Dialer, &t) };
        self.queue_control(token, &auth);
        self.established(token, ch.node)
    }

    pub(super) fn on_auth(
        &mut self,
        token: Token,
        frame: &Frame,
        peer: NodeId,
        dialer_nonce: [u8; NONCE_LEN],
        acceptor_nonce: [u8; NONCE_LEN],
    ) -> bool {
        let auth = match frame.to_owned::<Auth>() {
            Ok(a) => a,
            Err(e) => return self.refuse(token, CloseCode::ProtocolViolation, format!("expected Auth: {e}")),
        };
        let t = Transcript {
            cluster: &self.cfg.cluster,
            dialer: peer,
            acceptor: self.cfg.node,
            dialer_nonce: &dialer_nonce,
            acceptor_nonce: &acceptor_nonce,
        };
        if !proof::verify(&self.cfg.secret, Side::Dialer, &t, &auth.proof) {
            let reason = format!("peer {peer} could not prove the cluster secret");
            return self.refuse(token, CloseCode::AuthFailed, reason);
        }
        self.established(token, peer)
    }

    /// `peer` runs at `theirs`, above this node: it reports so (the engine restarts at it) and
    /// refuses the connection.
    fn stale(&mut self, token: Token, peer: NodeId, theirs: u64) -> bool {
        self.emit(Event::NewerIncarnation { node: peer, incarnation: theirs });
        let reason = format!(
            "peer {peer} runs at incarnation {theirs}, this node at {}: this node restarts",
            self.cfg.incarnation
        );
        self.refuse(token, CloseCode::Stale, reason)
    }

    /// `theirs`, when both ends are members and the peer's incarnation is above this node's.
    fn newer(&self, theirs: u64) -> Option<u64> {
        (self.cfg.incarnation > 0 && theirs > self.cfg.incarnation).then_some(theirs)
    }

    /// The handshake on `token` completed with `peer`. False if this connection lost to another.
    pub(super) fn established(&mut self, token: Token, peer: NodeId) -> bool {
        self.shared.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        let me = self.cfg.node;
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        conn.phase = Phase::Established { peer };
        if conn.dialer.is_none() {
            conn.dialer = Some(me);
        }
        let new_dialer = conn.dialer;
        let addr = conn.addr;
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
            };
            self.peers.insert(peer, p);
        }
        let p = self.peers.get_mut(&peer).expect("peer inserted above");
        if p.dialing == Some(token) {
            p.dialing = None;
        }
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
            tracing::debug!(node = %me, client = %peer, %addr, "client connected");
        }
        self.emit(Event::PeerUp { node: peer, addr });
        self.flush(token);
        true
    }
}
