//! Shared set-up for Weir's benchmarks: sample messages, a connected pair of transports on
//! 127.0.0.1, an echo responder, and the plain blocking-TCP baseline the transport is measured
//! against. Benchmarks themselves live in `benches/`.

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub mod backup;
pub mod keys;
pub mod recovery;
pub mod restore;
pub mod streams;
pub mod timely_job;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use weir_wire::msg::{CheckpointTrigger, Data};
use weir_wire::transport::{Event, PeerConfig, Transport, TransportConfig};
use weir_wire::{Batch, CheckpointId, Epoch, NodeId, Seq, StreamId, TaskId, TransId};

/// The engine's defaults for the end-to-end benchmarks, with `WEIR_E2E_QUEUE` and
/// `WEIR_E2E_CREDITS` overriding the local queue size and the remote credit window (to compare
/// settings with the same command).
pub fn engine_config(node: NodeId, dir: &std::path::Path) -> weir_engine::runtime::EngineConfig {
    let mut cfg = weir_engine::runtime::EngineConfig::new(node, dir);
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    if let Some(q) = var("WEIR_E2E_QUEUE") {
        cfg.queue_capacity = q;
    }
    if let Some(c) = var("WEIR_E2E_CREDITS") {
        cfg.remote_credits = c;
    }
    cfg
}

/// Rows in the benchmark batch (a typical engine batch).
pub const BATCH_ROWS: usize = 4096;

/// A checkpoint trigger as sent on a data channel.
pub fn trigger(seq: u64) -> CheckpointTrigger {
    CheckpointTrigger {
        stream: StreamId(1),
        epoch: Epoch(0),
        checkpoint: CheckpointId(1),
        trans: TransId(1),
        from: TaskId(1),
        to: TaskId(2),
        seq: Seq(seq),
        savepoint: false,
    }
}

/// A data frame with `rows` rows of pseudo-random content.
pub fn data(seq: u64, rows: usize) -> Data {
    let mut b = Batch::with_capacity(rows);
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seq;
    for i in 0..rows {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.push(1_700_000_000_000 + i as i64, x % 10_000, (x >> 11) as f64 / (1u64 << 53) as f64);
    }
    Data { stream: StreamId(1), epoch: Epoch(0), from: TaskId(1), to: TaskId(2), seq: Seq(seq), batch: b }
}

fn config(node: u32) -> TransportConfig {
    let mut c = TransportConfig::new("bench", NodeId(node), b"bench-secret-0123456789".to_vec());
    c.listen = Some("127.0.0.1:0".parse().expect("address"));
    c
}

/// Two connected transports: node 1 (listens) and node 2 (dials node 1).
pub fn transport_pair() -> (Transport, Transport) {
    let mut a_cfg = config(1);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).expect("start node 1");
    let mut b_cfg = config(2);
    b_cfg.listen = None;
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).expect("start node 2");
    for t in [&a, &b] {
        loop {
            match t.events().recv_timeout(Duration::from_secs(10)).expect("peer comes up") {
                Event::PeerUp { .. } => break,
                Event::Refused { reason, .. } => panic!("handshake refused: {reason}"),
                _ => {}
            }
        }
    }
    (a, b)
}

/// Echoes every frame `t` receives back to its sender (as a frame of the same kind and size) until
/// the transport shuts down. Returns the transport when done.
pub fn echo(t: Transport) -> JoinHandle<Transport> {
    thread::spawn(move || {
        let mut tx = t.sender();
        let mut enc = weir_wire::FrameEncoder::new();
        while let Ok(ev) = t.events().recv_timeout(Duration::from_secs(30)) {
            if let Event::PeerDown { .. } = ev {
                break;
            }
            if let Event::Frame { from, frame } = ev {
                let Ok(trig) = frame.to_owned::<CheckpointTrigger>() else { break };
                let reply = enc.encode(&trig).expect("encode");
                if tx.send_timeout(from, reply, Duration::from_secs(5)).is_err() {
                    break;
                }
            }
        }
        t
    })
}

/// A plain blocking TCP ping-pong pair (the baseline): returns the client socket; a thread echoes
/// every `size`-byte message back until the client closes.
pub fn plain_tcp_echo(size: usize) -> (TcpStream, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut buf = vec![0u8; size];
        while s.read_exact(&mut buf).is_ok() {
            if s.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let client = TcpStream::connect(addr).expect("connect");
    client.set_nodelay(true).expect("nodelay");
    (client, server)
}
