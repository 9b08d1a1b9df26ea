//! The mio transport between real sockets on 127.0.0.1: delivery, misbehaving peers, restarts and
//! refused handshakes. Every wait is bounded (`util::WAIT`); every test stops its transports.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use util::{CLUSTER, SECRET, WAIT, config, pair, wait_for};
use weir_wire::frame::{FrameDecoder, FrameEncoder, HEADER_LEN};
use weir_wire::msg::*;
use weir_wire::transport::client::{BlockingClient, ClientError};
use weir_wire::transport::{Event, PeerConfig, SendError, Transport, TransportError, TransportStats};
use weir_wire::*;

fn recv_data(t: &Transport) -> (NodeId, Frame) {
    match wait_for(t, |e| matches!(e, Event::Frame { .. })) {
        Event::Frame { from, frame } => (from, frame),
        _ => unreachable!(),
    }
}

#[test]
fn two_transports_exchange_100k_frames_in_order() {
    const N: u64 = 100_000;
    let (a, b) = pair();
    let mut tx = b.sender();
    let producer = thread::spawn(move || {
        let mut enc = FrameEncoder::new();
        for seq in 0..N {
            let f = enc.encode(&util::data(seq, 16)).unwrap();
            tx.send_timeout(NodeId(1), f, WAIT).expect("queue drains");
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 0u64;
    while next < N {
        let left = deadline.saturating_duration_since(Instant::now());
        match a.events().recv_timeout(left).expect("frames keep coming") {
            Event::Frame { from, frame } => {
                assert_eq!(from, NodeId(2));
                let d = frame.access::<Data>().unwrap();
                assert_eq!(d.seq.get(), Seq(next), "frames out of order or lost");
                assert_eq!(d.batch.len(), 16);
                next += 1;
            }
            Event::PeerDown { reason, .. } => panic!("link dropped: {reason}"),
            _ => {}
        }
    }
    producer.join().unwrap();
    assert_eq!(TransportStats::get(&a.stats().frames_in), N);
    assert_eq!(TransportStats::get(&a.stats().bad_frames), 0);
}

#[test]
fn frames_flow_both_ways() {
    let (a, b) = pair();
    let mut enc = FrameEncoder::new();
    a.sender().try_send(NodeId(2), enc.encode(&util::trigger()).unwrap()).unwrap();
    b.sender().try_send(NodeId(1), enc.encode(&util::data(5, 3)).unwrap()).unwrap();
    let (from, f) = recv_data(&b);
    assert_eq!(from, NodeId(1));
    assert_eq!(f.to_owned::<CheckpointTrigger>().unwrap(), util::trigger());
    let (from, f) = recv_data(&a);
    assert_eq!(from, NodeId(2));
    assert_eq!(f.to_owned::<Data>().unwrap(), util::data(5, 3));
}

#[test]
fn garbage_peer_is_disconnected_while_a_good_peer_keeps_working() {
    let (a, b) = pair();
    let addr = a.local_addr().unwrap();
    // An authenticated peer that then sends a frame with a broken checksum.
    let mut bad = BlockingClient::connect(addr, CLUSTER, NodeId(66), SECRET, WAIT).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(66), .. }));
    let mut frame = FrameEncoder::new().encode(&util::trigger()).unwrap().as_bytes().to_vec();
    let last = frame.len() - 1;
    frame[last] ^= 0x01;
    bad.send_raw(&frame).unwrap();
    match wait_for(&a, |e| matches!(e, Event::PeerDown { node: NodeId(66), .. })) {
        Event::PeerDown { reason, .. } => assert!(reason.contains("checksum"), "{reason}"),
        _ => unreachable!(),
    }
    // The bad peer was told why.
    match bad.recv() {
        Err(ClientError::Closed { code: CloseCode::BadFrame, message, .. }) => assert!(message.contains("checksum")),
        other => panic!("expected a BadFrame close, got {other:?}"),
    }
    // An unauthenticated peer that sends plain garbage.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // It is told why and hung up on; a stranger's refusal is no event for the application.
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let mut told = Vec::new();
    let _ = raw.read_to_end(&mut told);
    let mut d = FrameDecoder::new(1 << 20);
    d.feed(&told);
    assert_eq!(d.next_frame().unwrap().expect("a close frame").to_owned::<Close>().unwrap().code, CloseCode::BadFrame);
    // Meanwhile the good peer is unaffected, both ways.
    let mut enc = FrameEncoder::new();
    for seq in 0..100 {
        b.sender().send_timeout(NodeId(1), enc.encode(&util::data(seq, 4)).unwrap(), WAIT).unwrap();
    }
    for seq in 0..100 {
        let (from, f) = recv_data(&a);
        assert_eq!((from, f.access::<Data>().unwrap().seq.get()), (NodeId(2), Seq(seq)));
    }
    a.sender().try_send(NodeId(2), enc.encode(&util::trigger()).unwrap()).unwrap();
    assert_eq!(recv_data(&b).0, NodeId(1));
    assert_eq!(TransportStats::get(&a.stats().bad_frames), 2);
}

#[test]
fn invalid_payload_with_valid_checksum_closes_only_that_connection() {
    let (a, _b) = pair();
    let mut bad = BlockingClient::connect(a.local_addr().unwrap(), CLUSTER, NodeId(67), SECRET, WAIT).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(67), .. }));
    // A Data frame whose batch columns differ in length: header and CRC are right, content is not.
    let mut d = util::data(0, 8);
    d.batch.key.pop();
    bad.send(&d).unwrap();
    match wait_for(&a, |e| matches!(e, Event::PeerDown { node: NodeId(67), .. })) {
        Event::PeerDown { reason, .. } => assert!(reason.contains("differ in length"), "{reason}"),
        _ => unreachable!(),
    }
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::Frame { .. })), "invalid frame was delivered");
}

/// Node 1 at incarnation `a` listening, node 2 at `b` dialing it.
fn members(a: u64, b: u64) -> (Transport, Transport) {
    let mut a_cfg = config(1);
    a_cfg.incarnation = a;
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.incarnation = b;
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    (a, Transport::start(b_cfg).unwrap())
}

#[test]
fn a_member_that_restarts_replaces_its_connection_and_its_older_process_is_refused() {
    // Incarnations are processes: members at different ones connect.
    let (a, b) = members(5, 4);
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    wait_for(&b, |e| matches!(e, Event::PeerUp { node: NodeId(1), .. }));
    // A new process of node 2 (the old one still connected, as a paused one would be).
    let mut c_cfg = config(2);
    c_cfg.incarnation = 6;
    c_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let c = Transport::start(c_cfg).unwrap();
    // Node 1 hears the old process lost, then the new one up.
    match wait_for(&a, |e| matches!(e, Event::PeerDown { node: NodeId(2), .. })) {
        Event::PeerDown { reason, orderly, .. } => {
            assert!(reason.contains("restarted (incarnation 6)") && !orderly, "{reason}");
        }
        _ => unreachable!(),
    }
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    wait_for(&c, |e| matches!(e, Event::PeerUp { node: NodeId(1), .. }));
    // The old process redials and is refused from now on, once it proved its key.
    match wait_for(&b, |e| matches!(e, Event::Refused { .. })) {
        Event::Refused { code, by_peer, reason, .. } => {
            assert_eq!((code, by_peer), (CloseCode::Stale, true), "{reason}");
        }
        _ => unreachable!(),
    }
    // The new process's connection stays; node 1 loses node 2 no more.
    thread::sleep(Duration::from_millis(300));
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::PeerDown { .. } | Event::PeerUp { .. })));
    assert!(b.events().try_iter().all(|e| !matches!(e, Event::PeerUp { .. })));
    // A client (incarnation 0) is served whatever the members' incarnations.
    let client = BlockingClient::connect(a.local_addr().unwrap(), CLUSTER, NodeId(90), SECRET, WAIT);
    assert!(client.is_ok(), "{:?}", client.err());
}

#[test]
fn a_member_that_left_in_good_order_and_comes_back_as_a_new_process_is_reported_lost_once() {
    let (a, b) = members(5, 4);
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    b.shutdown();
    match wait_for(&a, |e| matches!(e, Event::PeerDown { node: NodeId(2), .. })) {
        Event::PeerDown { orderly, .. } => assert!(orderly, "a goodbye is no loss"),
        _ => unreachable!(),
    }
    // Its new process: whatever the old one ran is gone, which its peer hears before it is up.
    let mut c_cfg = config(2);
    c_cfg.incarnation = 6;
    c_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let _c = Transport::start(c_cfg).unwrap();
    match wait_for(&a, |e| matches!(e, Event::PeerDown { .. } | Event::PeerUp { .. })) {
        Event::PeerDown { reason, orderly, .. } => assert!(reason.contains("restarted") && !orderly, "{reason}"),
        e => panic!("the new process came up before the old one's loss was reported: {e:?}"),
    }
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    thread::sleep(Duration::from_millis(300));
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::PeerDown { .. })), "reported lost twice");
}

#[test]
fn restarted_peer_is_reconnected() {
    let (a, b) = pair();
    let b_addr = a.local_addr().unwrap();
    // a (node 1) is dialed by b (node 2); restart a on the same address: b must dial again.
    a.shutdown();
    match wait_for(&b, |e| matches!(e, Event::PeerDown { .. })) {
        Event::PeerDown { node, reason, .. } => {
            assert_eq!(node, NodeId(1));
            assert!(reason.contains("Shutdown"), "{reason}");
        }
        _ => unreachable!(),
    }
    let mut cfg = config(1);
    cfg.listen = Some(b_addr);
    cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a2 = Transport::start(cfg).unwrap();
    wait_for(&b, |e| matches!(e, Event::PeerUp { node: NodeId(1), .. }));
    wait_for(&a2, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    b.sender().send_timeout(NodeId(1), FrameEncoder::new().encode(&util::trigger()).unwrap(), WAIT).unwrap();
    assert_eq!(recv_data(&a2).0, NodeId(2));
    // And the other way round: the dialing side restarts and comes back by itself.
    let b_cfg_addr = a2.local_addr();
    b.shutdown();
    wait_for(&a2, |e| matches!(e, Event::PeerDown { node: NodeId(2), .. }));
    let mut cfg = config(2);
    cfg.listen = None;
    cfg.peers.push(PeerConfig { node: NodeId(1), addr: b_cfg_addr });
    let b2 = Transport::start(cfg).unwrap();
    wait_for(&a2, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    a2.sender().send_timeout(NodeId(2), FrameEncoder::new().encode(&util::trigger()).unwrap(), WAIT).unwrap();
    assert_eq!(recv_data(&b2).0, NodeId(1));
}

#[test]
fn frames_queued_while_the_peer_is_down_are_delivered_after_it_connects() {
    let mut a_cfg = config(1);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut tx = a.sender();
    let mut enc = FrameEncoder::new();
    for seq in 0..10 {
        tx.try_send(NodeId(2), enc.encode(&util::data(seq, 1)).unwrap()).unwrap();
    }
    let mut b_cfg = config(2);
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    for seq in 0..10 {
        assert_eq!(recv_data(&b).1.access::<Data>().unwrap().seq.get(), Seq(seq));
    }
}

/// A frame queued just before shutdown for a peer that is not connected (a node that sends a
/// stop on and exits, its peer just started) still reaches it when the shutdown names it: the
/// shutting transport dials at once, whatever its backoff, or waits for the peer to dial it.
#[test]
fn frames_queued_for_an_unconnected_peer_are_delivered_while_the_transport_shuts_down() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // Node 2 dials node 1, which is not up yet; its next try would come only after a minute.
    let one = free();
    let mut cfg = config(2);
    cfg.listen = None;
    cfg.reconnect_min = Duration::from_secs(60);
    cfg.reconnect_max = Duration::from_secs(60);
    cfg.shutdown_drain = WAIT;
    cfg.peers.push(PeerConfig { node: NodeId(1), addr: Some(one) });
    let dialer = Transport::start(cfg).unwrap();
    thread::sleep(Duration::from_millis(200)); // its first dial is refused
    let mut enc = FrameEncoder::new();
    dialer.sender().try_send(NodeId(1), enc.encode(&util::data(7, 1)).unwrap()).unwrap();
    let mut cfg = config(1);
    cfg.listen = Some(one);
    cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let listener = Transport::start(cfg).unwrap();
    let stopping = thread::spawn(move || dialer.shutdown_delivering(&[NodeId(1)]));
    let (from, frame) = recv_data(&listener);
    assert_eq!((from, frame.access::<Data>().unwrap().seq.get()), (NodeId(2), Seq(7)));
    stopping.join().unwrap();
    // Node 1 waits for node 2 to dial it.
    let mut cfg = config(1);
    cfg.shutdown_drain = WAIT;
    cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let waiting = Transport::start(cfg).unwrap();
    let addr = waiting.local_addr();
    waiting.sender().try_send(NodeId(2), enc.encode(&util::data(8, 1)).unwrap()).unwrap();
    let stopping = thread::spawn(move || waiting.shutdown_delivering(&[NodeId(2)]));
    thread::sleep(Duration::from_millis(200)); // node 1 is draining before node 2 starts
    let mut cfg = config(2);
    cfg.listen = None;
    cfg.peers.push(PeerConfig { node: NodeId(1), addr });
    let late = Transport::start(cfg).unwrap();
    let (from, frame) = recv_data(&late);
    assert_eq!((from, frame.access::<Data>().unwrap().seq.get()), (NodeId(1), Seq(8)));
    stopping.join().unwrap();
}

#[test]
fn wrong_secret_is_refused_on_both_sides() {
    let mut a_cfg = config(1);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.secret = b"a-different-secret-of-this-node".to_vec();
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    match wait_for(&b, |e| matches!(e, Event::Refused { .. })) {
        Event::Refused { code, by_peer, reason, node, .. } => {
            assert_eq!((code, by_peer, node), (CloseCode::AuthFailed, false, Some(NodeId(1))));
            assert!(reason.contains("secret"), "{reason}");
        }
        _ => unreachable!(),
    }
    // The acceptor never heard a proof: a stranger, no event and no handshake.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(TransportStats::get(&a.stats().handshakes), 0);
    // Nothing got through, and a data frame queued for the peer stays queued.
    let f = FrameEncoder::new().encode(&util::trigger()).unwrap();
    b.sender().try_send(NodeId(1), f).unwrap();
    thread::sleep(Duration::from_millis(200));
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::Frame { .. } | Event::PeerUp { .. })));
    // The blocking client is refused the same way.
    let err = BlockingClient::connect(a.local_addr().unwrap(), CLUSTER, NodeId(9), b"not-the-cluster-secret", WAIT)
        .unwrap_err();
    assert!(matches!(err, ClientError::Handshake { .. }), "{err}");
}

#[test]
fn wrong_cluster_is_refused_on_both_sides() {
    let a = Transport::start(config(1)).unwrap();
    let mut b_cfg = config(2);
    b_cfg.cluster = "another-cluster".into();
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    match wait_for(&b, |e| matches!(e, Event::Refused { .. })) {
        Event::Refused { code, by_peer, reason, .. } => {
            assert_eq!((code, by_peer), (CloseCode::ClusterMismatch, true));
            assert!(reason.contains("another-cluster") && !reason.contains(CLUSTER), "{reason}");
        }
        _ => unreachable!(),
    }
    assert!(TransportStats::get(&a.stats().refused) >= 1);
}

#[test]
fn other_protocol_version_is_refused_with_a_reason() {
    let a = Transport::start(config(1)).unwrap();
    let mut raw = TcpStream::connect(a.local_addr().unwrap()).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let mut hello = FrameEncoder::new()
        .encode(&Hello {
            cluster: CLUSTER.into(),
            node: NodeId(5),
            protocol_version: 9,
            incarnation: 0,
            nonce: [0; 32],
            client: String::new(),
        })
        .unwrap()
        .as_bytes()
        .to_vec();
    let future = weir_wire::PROTOCOL_VERSION + 1;
    hello[4] = future; // a future protocol version in the header
    raw.write_all(&hello).unwrap();
    // The node answered with a Close frame saying why, then hung up.
    let mut bytes = Vec::new();
    let _ = raw.read_to_end(&mut bytes);
    let mut d = FrameDecoder::new(1 << 20);
    d.feed(&bytes);
    let close = d.next_frame().unwrap().expect("a close frame").to_owned::<Close>().unwrap();
    assert_eq!(close.code, CloseCode::VersionMismatch);
    assert!(close.message.contains(&format!("version {future}")), "{}", close.message);
    assert!(bytes.len() >= HEADER_LEN);
}

#[test]
fn silent_peer_is_declared_dead() {
    let a = Transport::start(config(1)).unwrap();
    // Authenticates, then never sends anything again (no heartbeats).
    let _silent = BlockingClient::connect(a.local_addr().unwrap(), CLUSTER, NodeId(7), SECRET, WAIT).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(7), .. }));
    let t0 = Instant::now();
    match wait_for(&a, |e| matches!(e, Event::PeerDown { .. })) {
        Event::PeerDown { node, reason, .. } => {
            assert_eq!(node, NodeId(7));
            assert!(reason.contains("no frame"), "{reason}");
        }
        _ => unreachable!(),
    }
    assert!(t0.elapsed() >= Duration::from_millis(700), "declared dead too early: {:?}", t0.elapsed());
}

#[test]
fn heartbeats_keep_an_idle_link_alive() {
    let (a, b) = pair();
    thread::sleep(Duration::from_millis(2500)); // well past dead_after (1 s) with no traffic
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::PeerDown { .. })));
    assert!(b.events().try_iter().all(|e| !matches!(e, Event::PeerDown { .. })));
    b.sender().try_send(NodeId(1), FrameEncoder::new().encode(&util::trigger()).unwrap()).unwrap();
    assert_eq!(recv_data(&a).0, NodeId(2));
}

#[test]
fn heartbeats_carry_the_senders_task_summaries() {
    let summary = TaskHeartbeat {
        stream: StreamId(3),
        epoch: Epoch(3),
        task: TaskId(9),
        latest: Some(CheckpointId(41)),
        latest_version: Version(4096),
        latest_ts_ms: 1_700_000_000_000,
        active: Some(CheckpointId(42)),
        failed: Some(CheckpointId(40)),
    };
    let mut a_cfg = config(1);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let s = summary.clone();
    b_cfg.heartbeat_tasks = Some(std::sync::Arc::new(move || vec![s.clone()]));
    let _b = Transport::start(b_cfg).unwrap();
    match wait_for(&a, |e| matches!(e, Event::Heartbeat { .. })) {
        Event::Heartbeat { from, tasks } => assert_eq!((from, tasks), (NodeId(2), vec![summary])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn full_send_queue_hands_the_frame_back() {
    let mut cfg = config(1);
    cfg.send_queue = 8;
    cfg.peers.push(PeerConfig { node: NodeId(2), addr: None }); // never connects
    let a = Transport::start(cfg).unwrap();
    let mut tx = a.sender();
    let mut enc = FrameEncoder::new();
    for seq in 0..8 {
        tx.try_send(NodeId(2), enc.encode(&util::data(seq, 1)).unwrap()).unwrap();
    }
    let frame = enc.encode(&util::data(8, 1)).unwrap();
    let len = frame.len();
    match tx.try_send(NodeId(2), frame) {
        Err(e @ SendError::Full(_)) => {
            assert!(e.is_retryable());
            let back = e.into_frame();
            assert_eq!(back.len(), len);
            assert_eq!(decode_back(&back).seq, Seq(8));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    let t0 = Instant::now();
    let frame = enc.encode(&util::data(9, 1)).unwrap();
    assert!(matches!(tx.send_timeout(NodeId(2), frame, Duration::from_millis(100)), Err(SendError::Full(_))));
    assert!(t0.elapsed() >= Duration::from_millis(90));
    let frame = enc.encode(&util::data(9, 1)).unwrap();
    assert!(matches!(tx.try_send(NodeId(99), frame), Err(SendError::UnknownPeer(_))));
}

fn decode_back(f: &EncodedFrame) -> Data {
    frame::decode_one(f.as_bytes(), 1 << 20).unwrap().to_owned::<Data>().unwrap()
}

#[test]
fn bad_config_is_refused_with_the_field_named() {
    let mut c = config(1);
    c.secret = b"short".to_vec();
    assert!(matches!(Transport::start(c), Err(TransportError::Config { field: "secret", .. })));
    let mut c = config(1);
    c.dead_after = c.heartbeat_interval;
    assert!(matches!(Transport::start(c), Err(TransportError::Config { field: "dead_after", .. })));
    let mut c = config(1);
    c.peers.push(PeerConfig { node: NodeId(1), addr: None });
    assert!(matches!(Transport::start(c), Err(TransportError::Config { field: "peers", .. })));
    // An address in use is an I/O error, and retryable.
    let a = Transport::start(config(1)).unwrap();
    let mut c = config(2);
    c.listen = a.local_addr();
    let err = Transport::start(c).unwrap_err();
    assert!(matches!(err, TransportError::Io { .. }) && err.is_retryable(), "{err}");
}

#[test]
fn simultaneous_dials_settle_on_one_connection() {
    // Both sides dial each other; exactly one connection survives and traffic flows.
    let mut a_cfg = config(1);
    let mut b_cfg = config(2);
    let la = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let lb = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr_a, addr_b) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    drop((la, lb));
    a_cfg.listen = Some(addr_a);
    b_cfg.listen = Some(addr_b);
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: Some(addr_b) });
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: Some(addr_a) });
    let a = Transport::start(a_cfg).unwrap();
    let b = Transport::start(b_cfg).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { .. }));
    wait_for(&b, |e| matches!(e, Event::PeerUp { .. }));
    thread::sleep(Duration::from_millis(500));
    let mut enc = FrameEncoder::new();
    for seq in 0..50 {
        a.sender().send_timeout(NodeId(2), enc.encode(&util::data(seq, 2)).unwrap(), WAIT).unwrap();
    }
    let mut got = 0;
    let deadline = Instant::now() + WAIT;
    while got < 50 && Instant::now() < deadline {
        if let Ok(Event::Frame { frame, .. }) = b.events().recv_timeout(Duration::from_millis(100)) {
            assert_eq!(frame.access::<Data>().unwrap().seq.get(), Seq(got));
            got += 1;
        }
    }
    assert_eq!(got, 50);
    assert_eq!(TransportStats::get(&a.stats().bad_frames), 0);
}

#[test]
fn slow_consumer_pushes_back_on_the_sender_without_losing_frames() {
    let mut a_cfg = config(1);
    a_cfg.event_queue = 16;
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.send_queue = 32;
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    wait_for(&b, |e| matches!(e, Event::PeerUp { .. }));
    // Node 1's application reads nothing: node 2's queue must fill up and refuse, not grow.
    let mut tx = b.sender();
    let mut enc = FrameEncoder::new();
    let mut accepted = 0u64;
    let deadline = Instant::now() + WAIT;
    loop {
        match tx.try_send(NodeId(1), enc.encode(&util::data(accepted, 2048)).unwrap()) {
            Ok(()) => accepted += 1,
            Err(SendError::Full(_)) => {
                // Full can be momentary while the network thread drains; it must persist.
                thread::sleep(Duration::from_millis(200));
                match tx.try_send(NodeId(1), enc.encode(&util::data(accepted, 2048)).unwrap()) {
                    Ok(()) => accepted += 1,
                    Err(SendError::Full(_)) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "sender never saw back-pressure after {accepted} frames");
    }
    // Bounded: the queue, the socket buffers and one staging read, not everything sent.
    assert!(accepted < 2000, "{accepted} frames of 48 KiB accepted with nobody reading");
    // Longer than dead_after (1 s) without reading: the held-back link must not be declared dead.
    thread::sleep(Duration::from_millis(1500));
    // Now read: every accepted frame arrives, in order.
    for seq in 0..accepted {
        let (_, f) = recv_data(&a);
        assert_eq!(f.access::<Data>().unwrap().seq.get(), Seq(seq));
    }
}

#[test]
fn disconnected_client_is_forgotten_and_served_again_when_it_returns() {
    let a = Transport::start(config(1)).unwrap();
    let addr = a.local_addr().unwrap();
    let mut tx = a.sender();
    let mut enc = FrameEncoder::new();
    let mut client = BlockingClient::connect(addr, CLUSTER, NodeId(70), SECRET, WAIT).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(70), .. }));
    tx.try_send(NodeId(70), enc.encode(&util::trigger()).unwrap()).unwrap();
    assert_eq!(client.recv().unwrap().to_owned::<CheckpointTrigger>().unwrap(), util::trigger());
    drop(client);
    wait_for(&a, |e| matches!(e, Event::PeerDown { node: NodeId(70), .. }));
    assert!(matches!(tx.try_send(NodeId(70), enc.encode(&util::trigger()).unwrap()), Err(SendError::UnknownPeer(_))));
    let mut client = BlockingClient::connect(addr, CLUSTER, NodeId(70), SECRET, WAIT).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(70), .. }));
    tx.try_send(NodeId(70), enc.encode(&util::data(3, 3)).unwrap()).unwrap();
    assert_eq!(client.recv().unwrap().to_owned::<Data>().unwrap(), util::data(3, 3));
}
