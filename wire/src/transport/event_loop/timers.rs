//! Events to the application (bounded backlog), timers (redials, heartbeats, dead peers) and
//! how a connection ends.

use super::*;

/// Refusals of unauthenticated connections are summed into one log line this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

impl EventLoop {
    // -----------------------------------------------------------------------------------------
    // Events to the application.

    pub(super) fn emit(&mut self, ev: Event) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(ev);
            return;
        }
        match self.events.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(ev)) => self.backlog.push_back(ev),
            Err(TrySendError::Disconnected(_)) => {} // the application is gone; shutdown follows
        }
    }

    pub(super) fn deliver_backlog(&mut self) {
        while let Some(ev) = self.backlog.pop_front() {
            match self.events.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    self.backlog.push_front(ev);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.backlog.clear();
                    break;
                }
            }
        }
        // Room again: resume the connections we stopped reading, frames already buffered first.
        let paused: Vec<Token> = self.conns.iter().filter(|(_, c)| c.read_paused).map(|(t, _)| *t).collect();
        for t in paused {
            if !self.backlog.is_empty() {
                return;
            }
            if let Some(c) = self.conns.get_mut(&t) {
                c.read_paused = false;
                c.last_recv = Instant::now();
            }
            if self.drain_frames(t) {
                self.on_readable(t);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Timers and endings.

    pub(super) fn timers(&mut self, now: Instant) {
        // Accept counts of seconds gone by are forgotten (the map holds recent addresses only).
        self.accepts.retain(|_, (since, _)| now.duration_since(*since) < Duration::from_secs(2));
        if self.quiet_refusals > 0 && now.duration_since(self.last_refusal_log) >= REFUSAL_LOG_EVERY {
            tracing::warn!(
                node = %self.cfg.node,
                refused = self.quiet_refusals,
                handshaking = self.handshaking,
                "refused connections that did not prove a key or came over the handshake caps"
            );
            self.quiet_refusals = 0;
            self.last_refusal_log = now;
        }
        let due: Vec<(NodeId, SocketAddr)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.conn.is_none() && p.dialing.is_none() && p.next_dial <= now)
            // Shutting down, only a peer named to receive its frames is worth a connection.
            .filter(|(n, p)| {
                !self.shared.shutdown.load(Ordering::Acquire) || (self.deliver_to.contains(n) && !p.rx.is_empty())
            })
            .filter_map(|(n, p)| p.addr.map(|a| (*n, a)))
            .collect();
        for (n, a) in due {
            self.dial(n, a);
        }
        let mut ends = Vec::new();
        let mut beats = Vec::new();
        for (t, c) in &self.conns {
            match c.phase {
                Phase::Established { .. } => {
                    // While we hold reading back, the peer's heartbeats sit unread in the socket:
                    // silence then is ours, not the peer's.
                    if !c.read_paused && now.duration_since(c.last_recv) > self.cfg.dead_after {
                        let silent = now.duration_since(c.last_recv);
                        let reason = format!("no frame from {} for {} ms", c.addr, silent.as_millis());
                        ends.push((*t, Ending::tell(CloseCode::Timeout, reason)));
                    } else if now.duration_since(c.last_heartbeat) >= self.cfg.heartbeat_interval {
                        beats.push(*t);
                    }
                }
                Phase::Closing { until } => {
                    if now >= until {
                        ends.push((*t, Ending::quiet("closed")));
                    }
                }
                _ => {
                    if now.duration_since(c.started) > self.cfg.handshake_timeout {
                        let reason = format!("handshake with {} not done in {:?}", c.addr, self.cfg.handshake_timeout);
                        ends.push((
                            *t,
                            Ending { code: CloseCode::Timeout, reason, notify: true, refused: None, orderly: false },
                        ));
                    }
                }
            }
        }
        for (t, e) in ends {
            self.end(t, e);
        }
        if !beats.is_empty() {
            let tasks = self.cfg.heartbeat_tasks.as_ref().map(|f| f()).unwrap_or_default();
            let hb = Heartbeat { node: self.cfg.node, sent_at_ms: now_ms(), tasks };
            for t in beats {
                if let Some(c) = self.conns.get_mut(&t) {
                    c.last_heartbeat = now;
                }
                self.queue_control(t, &hb);
                self.flush(t);
            }
        }
    }

    /// Ends connection `token`: tells the peer why (if asked), reports, and schedules a redial.
    pub(super) fn end(&mut self, token: Token, ending: Ending) {
        let node = self.cfg.node;
        let Some(conn) = self.conns.get_mut(&token) else { return };
        if let Phase::Closing { .. } = conn.phase {
            // Already told the peer; now really drop it.
            self.drop_conn(token);
            return;
        }
        let addr = conn.addr;
        let was_client = std::mem::take(&mut conn.client_slot);
        let peer = match &conn.phase {
            Phase::Established { peer, .. } | Phase::AwaitWelcome { peer, .. } => Some(*peer),
            Phase::AwaitAuth(a) => Some(a.peer),
            _ => conn.target.or(conn.dialer.filter(|d| *d != node)),
        };
        // A connection that dialed us and never proved its key: nobody we know (unless it only
        // checked that the port answers).
        let stranger = conn.counted && !conn.port_check;
        if was_client {
            // No longer served: its slot is free while its Close goes out.
            self.clients -= 1;
        }
        let was_established = matches!(conn.phase, Phase::Established { .. });
        if stranger {
            // Anyone can cause these, as often as they like: counted, summed into one log line
            // now and then, and nothing for the application.
            self.quiet_refusals += 1;
            self.shared.stats.strangers.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%node, %addr, code = ?ending.code, reason = %ending.reason, "stranger's connection ended");
        } else if let Some(by_peer) = ending.refused {
            if by_peer {
                self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            if ending.code == CloseCode::Stale {
                // Expected for a moment after a node's process was replaced.
                tracing::info!(%node, ?peer, %addr, by_peer, reason = %ending.reason, "handshake refused");
            } else {
                tracing::warn!(%node, ?peer, %addr, code = ?ending.code, by_peer, reason = %ending.reason, "handshake refused");
            }
            self.emit(Event::Refused {
                addr,
                node: peer,
                code: ending.code.clone(),
                by_peer,
                reason: ending.reason.clone(),
            });
        } else if matches!(ending.code, CloseCode::BadFrame | CloseCode::ProtocolViolation | CloseCode::Timeout) {
            tracing::warn!(%node, ?peer, %addr, code = ?ending.code, reason = %ending.reason, "closing connection");
        } else {
            tracing::debug!(%node, ?peer, %addr, reason = %ending.reason, "connection closed");
        }
        let conn = self.conns.get_mut(&token).expect("present");
        if ending.notify {
            // Drop unsent data (its queue keeps the rest), say why, and linger briefly so the peer
            // can read it before the socket goes.
            // A partly written frame must be finished first, or the peer could not parse the Close.
            let head = if conn.written > 0 { conn.out.pop_front() } else { None };
            conn.out.clear();
            match head {
                Some(h) => conn.out.push_back(h),
                None => conn.written = 0,
            }
            conn.control.clear();
            conn.phase = Phase::Closing { until: Instant::now() + LINGER };
            // Bounded so a peer still in its handshake (frames of at most 2 KiB) can read it.
            let mut message = ending.reason.clone();
            if message.len() > 1024 {
                let mut cut = 1024;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            let close = Close { code: ending.code.clone(), message };
            // (Under TLS the Close frame says goodbye; no close_notify follows it.)
            self.queue_control(token, &close);
            self.flush(token);
            if let Some(c) = self.conns.get_mut(&token) {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
        } else {
            self.drop_conn(token);
        }
        // Peer bookkeeping.
        let Some(peer) = peer else { return };
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if p.dialing == Some(token) {
            p.dialing = None;
            if p.conn.is_none() {
                self.schedule_redial(peer);
            }
        } else if p.conn == Some(token) {
            p.conn = None;
            let redial = p.addr.is_some();
            let forget = !redial && !p.configured;
            if redial {
                self.schedule_redial(peer);
            } else if forget {
                // A client (or an unlisted node) went away: drop its queue so that many short-lived
                // clients do not accumulate. Senders holding the old queue see it closed and look
                // the node up again. Before the event: whoever hears of it finds the node gone.
                self.peers.remove(&peer);
                if let Ok(mut q) = self.shared.queues.write() {
                    q.remove(&peer);
                }
            }
            if was_established {
                if forget {
                    // Clients come and go with every command: not news for the node's log.
                    tracing::debug!(%node, client = %peer, reason = %ending.reason, "client gone");
                } else {
                    tracing::info!(%node, %peer, reason = %ending.reason, "peer down");
                }
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.left_in_order = ending.orderly;
                }
                self.emit(Event::PeerDown { node: peer, reason: ending.reason, orderly: ending.orderly });
            }
        }
    }

    /// As shutdown begins: how long what is queued may still take to leave. A second for
    /// connected peers; [`TransportConfig::shutdown_drain`] if the application named peers to
    /// deliver to, which are dialed on the next timer pass if not connected, backoff forgotten.
    pub(super) fn drain_for(&mut self, now: Instant) -> Duration {
        self.deliver_to = std::mem::take(&mut *self.shared.deliver_to.lock().unwrap_or_else(|e| e.into_inner()));
        self.deliver_to.retain(|n| self.peers.get(n).is_some_and(|p| p.configured || p.conn.is_some()));
        if self.deliver_to.is_empty() {
            return Duration::from_secs(1);
        }
        for n in &self.deliver_to {
            if let Some(p) = self.peers.get_mut(n).filter(|p| p.conn.is_none() && p.addr.is_some()) {
                p.next_dial = now;
                p.backoff = self.cfg.reconnect_min;
            }
        }
        self.cfg.shutdown_drain.max(Duration::from_secs(1))
    }

    /// Whether a frame still waits for a peer that may yet take it: a connected one, or one
    /// named at shutdown (dialed, or expected to dial us).
    pub(super) fn queued(&self) -> bool {
        self.peers.iter().any(|(n, p)| {
            let conn = p.conn.and_then(|t| self.conns.get(&t));
            let pending = !p.rx.is_empty()
                || conn.is_some_and(|c| {
                    !c.out.is_empty() || !c.control.is_empty() || c.tls.as_ref().is_some_and(|t| t.wants_write())
                });
            pending && (conn.is_some() || self.deliver_to.contains(n))
        })
    }

    /// Says goodbye on every connection (what was queued had its chance: [`Self::queued`]).
    pub(super) fn close_all(&mut self) {
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for t in tokens {
            let handshaking = self.conns.get(&t).is_some_and(|c| !matches!(c.phase, Phase::Closing { .. }));
            if handshaking {
                self.end(t, Ending::tell(CloseCode::Shutdown, "node shutting down"));
            }
        }
        // Give Close frames a moment to leave; sockets close when dropped.
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline && self.conns.values().any(|c| !c.out.is_empty()) {
            let tokens: Vec<Token> = self.conns.keys().copied().collect();
            for t in tokens {
                self.flush(t);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.conns.clear();
    }
}
