//! Helpers shared by the wire integration tests: sample messages, transports on 127.0.0.1 with
//! short timers, and bounded waits for events.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use weir_wire::msg::*;
use weir_wire::transport::{Event, PeerConfig, Transport, TransportConfig};
use weir_wire::{Batch, CheckpointId, Epoch, NodeId, Seq, StreamId, TaskId, TransId};

pub const CLUSTER: &str = "test-cluster";
pub const SECRET: &[u8] = b"0123456789abcdef-test-secret";
/// Upper bound for any single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// A batch of `rows` deterministic rows.
pub fn batch(rows: usize) -> Batch {
    let mut b = Batch::with_capacity(rows);
    for i in 0..rows {
        b.push(1_700_000_000_000 + i as i64, (i % 977) as u64, i as f64 * 0.5);
    }
    b
}

pub fn data(seq: u64, rows: usize) -> Data {
    Data { stream: StreamId(1), epoch: Epoch(0), from: TaskId(2), to: TaskId(3), seq: Seq(seq), batch: batch(rows) }
}

pub fn trigger() -> CheckpointTrigger {
    CheckpointTrigger {
        stream: StreamId(1),
        epoch: Epoch(0),
        checkpoint: CheckpointId(42),
        trans: TransId(7),
        from: TaskId(2),
        to: TaskId(3),
        seq: Seq(1000),
        savepoint: true,
    }
}

pub fn stats() -> TaskCheckpointStats {
    TaskCheckpointStats {
        trigger_at_us: 1_700_000_000_123_000,
        align_us: 250,
        snapshot_us: 1200,
        upload_bytes: 1 << 20,
        upload_us: 30_000,
        files: 12,
        reported_at_us: 1_700_000_000_160_000,
    }
}

/// Config for `node` listening on a free loopback port, with fast timers for tests.
pub fn config(node: u32) -> TransportConfig {
    let mut c = TransportConfig::new(CLUSTER, NodeId(node), SECRET);
    c.listen = Some("127.0.0.1:0".parse().unwrap());
    c.heartbeat_interval = Duration::from_millis(100);
    c.dead_after = Duration::from_millis(1000);
    c.handshake_timeout = Duration::from_millis(1000);
    c.reconnect_min = Duration::from_millis(20);
    c.reconnect_max = Duration::from_millis(200);
    c
}

/// Node 1 listens; node 2 dials it. Returns both once each saw the other come up.
pub fn pair() -> (Transport, Transport) {
    let mut a_cfg = config(1);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    wait_for(&b, |e| matches!(e, Event::PeerUp { node: NodeId(1), .. }));
    (a, b)
}

/// The first event matching `pred` within [`WAIT`]; panics with what was seen otherwise.
pub fn wait_for(t: &Transport, mut pred: impl FnMut(&Event) -> bool) -> Event {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match t.events().recv_timeout(left) {
            Ok(e) if pred(&e) => return e,
            Ok(e) => seen.push(format!("{e:?}")),
            Err(_) => panic!("node {}: expected event not seen within {WAIT:?}; saw {seen:#?}", t.node()),
        }
    }
}

/// A frame of `kind` with `payload` under a correct checksum, whatever the payload means.
pub fn forge(kind: Kind, payload: &[u8]) -> Vec<u8> {
    use weir_wire::frame::{HEADER_LEN, MAGIC};
    let mut f = Vec::with_capacity(HEADER_LEN + payload.len());
    f.extend_from_slice(&MAGIC);
    f.push(weir_wire::PROTOCOL_VERSION);
    f.push(kind as u8);
    f.extend_from_slice(&0u16.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&f[..12]), payload);
    f.extend_from_slice(&crc.to_le_bytes());
    f.extend_from_slice(payload);
    f
}
