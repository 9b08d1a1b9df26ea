//! Accepting and dialing connections, and the caps on connections still in their handshake:
//! how many in all and per address group, how many new ones a second, which stranger makes
//! room. Invariant: `handshaking` and `handshaking_by_ip` count exactly the connections whose
//! `counted` is set; `authenticated` and `drop_conn` are the only places that clear it.

use super::*;

/// The address a handshake cap counts `ip` under: itself for IPv4, its /64 for IPv6 (one host
/// has a whole /64 to dial from).
fn addr_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

impl EventLoop {
    pub(super) fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else { return };
            match listener.accept() {
                Ok((stream, addr)) => {
                    let ip = addr_group(addr.ip());
                    let from_ip = self.handshaking_by_ip.get(&ip).copied().unwrap_or(0);
                    let now = Instant::now();
                    let second = self.accepts.entry(ip).or_insert((now, 0));
                    if now.duration_since(second.0) >= Duration::from_secs(1) {
                        *second = (now, 0);
                    }
                    second.1 += 1;
                    if from_ip >= self.cfg.max_handshaking_per_addr || second.1 > self.cfg.max_accepts_per_addr_per_sec
                    {
                        // Refused at once: dropping the socket costs nothing, a Close would.
                        self.shared.stats.over_cap.fetch_add(1, Ordering::Relaxed);
                        self.quiet_refusals += 1;
                        drop(stream);
                        continue;
                    }
                    if self.handshaking >= self.cfg.max_handshaking {
                        // Full: the oldest stranger makes room, so that strangers who hold their
                        // slots cannot keep a member that redials out.
                        self.shared.stats.over_cap.fetch_add(1, Ordering::Relaxed);
                        self.quiet_refusals += 1;
                        let oldest = self.conns.iter().filter(|(_, c)| c.counted).min_by_key(|(_, c)| c.started);
                        if let Some(t) = oldest.map(|(t, _)| *t) {
                            self.drop_conn(t);
                        }
                    }
                    let _ = stream.set_nodelay(true);
                    if let Some(token) = self.add_conn(stream, addr, Phase::AwaitHello, None) {
                        self.handshaking += 1;
                        *self.handshaking_by_ip.entry(ip).or_insert(0) += 1;
                        if let Some(c) = self.conns.get_mut(&token) {
                            c.counted = true;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: log and let the next readiness hint retry.
                    tracing::warn!(node = %self.cfg.node, error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    pub(super) fn add_conn(
        &mut self,
        mut stream: TcpStream,
        addr: SocketAddr,
        phase: Phase,
        target: Option<NodeId>,
    ) -> Option<Token> {
        let token = Token(self.next_token);
        self.next_token += 1;
        if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
            tracing::warn!(node = %self.cfg.node, %addr, error = %e, "cannot register connection");
            return None;
        }
        let now = Instant::now();
        let dialer = if target.is_some() { Some(self.cfg.node) } else { None };
        let tls = match &self.cfg.tls {
            None => None,
            Some(t) => {
                let made = if target.is_some() { Some(t.dial()) } else { t.accept() };
                match made {
                    Some(Ok(c)) => Some(Box::new(c)),
                    Some(Err(e)) => {
                        tracing::warn!(node = %self.cfg.node, %addr, error = %e, "cannot start TLS");
                        let _ = self.poll.registry().deregister(&mut stream);
                        return None;
                    }
                    None => None,
                }
            }
        };
        self.conns.insert(
            token,
            Conn {
                stream,
                tls,
                addr,
                phase,
                dialer,
                target,
                // Handshake-sized until the peer is authenticated (`established` raises it).
                decoder: FrameDecoder::new(HANDSHAKE_MAX_FRAME),
                control: VecDeque::new(),
                out: VecDeque::new(),
                written: 0,
                started: now,
                last_recv: now,
                last_heartbeat: now,
                read_paused: false,
                counted: false,
                client_slot: false,
                discarded: 0,
                heard: false,
                port_check: false,
            },
        );
        Some(token)
    }

    pub(super) fn dial(&mut self, node: NodeId, addr: SocketAddr) {
        match TcpStream::connect(addr) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let token = self.add_conn(stream, addr, Phase::Connecting, Some(node));
                if let Some(p) = self.peers.get_mut(&node) {
                    p.dialing = token;
                }
                tracing::debug!(node = %self.cfg.node, peer = %node, %addr, "dialing");
            }
            Err(e) => {
                tracing::debug!(node = %self.cfg.node, peer = %node, %addr, error = %e, "dial failed");
                self.schedule_redial(node);
            }
        }
    }

    pub(super) fn schedule_redial(&mut self, node: NodeId) {
        let max = self.cfg.reconnect_max;
        if let Some(p) = self.peers.get_mut(&node) {
            p.dialing = None;
            // Up to +25% jitter so peers that lost each other together do not redial in lockstep.
            let jitter = proof::nonce().map_or(0, |n| n[0] as u32) % 64;
            let delay = p.backoff + p.backoff * jitter / 256;
            p.next_dial = Instant::now() + delay;
            p.backoff = (p.backoff * 2).min(max);
        }
    }

    /// `token` proved its key: it no longer counts against the handshake caps.
    pub(super) fn authenticated(&mut self, token: Token) {
        let ip = self.conns.get_mut(&token).and_then(|c| std::mem::take(&mut c.counted).then_some(c.addr.ip()));
        if let Some(ip) = ip {
            self.uncount(ip);
        }
    }

    pub(super) fn uncount(&mut self, ip: IpAddr) {
        let ip = addr_group(ip);
        self.handshaking -= 1;
        if let Some(n) = self.handshaking_by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.handshaking_by_ip.remove(&ip);
            }
        }
    }

    /// Removes `token`'s connection for good.
    pub(super) fn drop_conn(&mut self, token: Token) {
        if let Some(mut conn) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            if conn.counted {
                self.uncount(conn.addr.ip());
            }
            if conn.client_slot {
                self.clients -= 1;
            }
        }
    }
}
