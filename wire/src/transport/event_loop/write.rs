//! Writing: control frames first, then the peer queue, in vectored writes until `WouldBlock`.

use super::*;

impl EventLoop {
    // -----------------------------------------------------------------------------------------
    // Writing.

    pub(super) fn queue_control<M: Message>(&mut self, token: Token, msg: &M) {
        match self.encoder.encode(msg) {
            Ok(f) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.control.push_back(f);
                }
            }
            Err(e) => tracing::error!(node = %self.cfg.node, error = %e, "cannot encode control frame"),
        }
    }

    pub(super) fn flush_established(&mut self) {
        let tokens: Vec<Token> = self.peers.values().filter_map(|p| p.conn).collect();
        for t in tokens {
            self.flush(t);
        }
    }

    /// Writes queued frames on `token` until the socket would block or nothing is left.
    pub(super) fn flush(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else { return };
        if matches!(conn.phase, Phase::Connecting) {
            return;
        }
        // TLS records already made (handshake replies, a frame's tail) go first.
        if let Some(tls) = conn.tls.as_deref_mut() {
            match super::super::tls::flush(tls, &mut conn.stream) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return self.end(token, Ending::quiet(format!("write failed: {e}"))),
            }
        }
        let rx = match conn.phase {
            Phase::Established { peer, .. } => self.peers.get(&peer).filter(|p| p.conn == Some(token)).map(|p| &p.rx),
            _ => None,
        };
        let stats = &self.shared.stats;
        let result = loop {
            // Refill the write batch: control frames first, then the peer's data queue.
            let mut bytes: usize = conn.out.iter().map(EncodedFrame::len).sum();
            while conn.out.len() < WRITE_BATCH_FRAMES && bytes < WRITE_BATCH_BYTES {
                let next = match conn.control.pop_front() {
                    Some(f) => Some(f),
                    None => rx.and_then(|rx| rx.try_recv().ok()),
                };
                match next {
                    Some(f) => {
                        bytes += f.len();
                        conn.out.push_back(f);
                    }
                    None => break,
                }
            }
            if conn.out.is_empty() {
                break Ok(());
            }
            let mut slices = [IoSlice::new(&[]); WRITE_BATCH_FRAMES];
            let mut n = 0;
            for (i, f) in conn.out.iter().enumerate() {
                slices[i] = IoSlice::new(if i == 0 { &f.as_bytes()[conn.written..] } else { f.as_bytes() });
                n = i + 1;
            }
            let wrote = match conn.tls.as_deref_mut() {
                None => conn.stream.write_vectored(&slices[..n]),
                Some(tls) => super::super::tls::write(tls, &mut conn.stream, &slices[..n]),
            };
            match wrote {
                Ok(0) => break Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")),
                Ok(mut w) => {
                    stats.bytes_out.fetch_add(w as u64, Ordering::Relaxed);
                    while w > 0 {
                        let rest = conn.out[0].len() - conn.written;
                        if w >= rest {
                            w -= rest;
                            conn.written = 0;
                            conn.out.pop_front();
                            stats.frames_out.fetch_add(1, Ordering::Relaxed);
                        } else {
                            conn.written += w;
                            w = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = result {
            let reason = format!("write failed: {e}");
            self.end(token, Ending::quiet(reason));
        }
    }
}
