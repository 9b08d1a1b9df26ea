//! Peers without the secret, and clients with less than a member's rights, against a real
//! transport on 127.0.0.1: what they may not do changes nothing, costs little and is refused with
//! a reason. Every wait is bounded (`util::WAIT`).

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use util::{CLUSTER, SECRET, WAIT, config};
use weir_wire::frame::{FrameDecoder, FrameEncoder, HANDSHAKE_MAX_FRAME, HEADER_LEN};
use weir_wire::msg::*;
use weir_wire::role::{MAX_MEMBER_ID, Role};
use weir_wire::transport::client::{BlockingClient, ClientError, Credential};
use weir_wire::transport::{Event, Transport, TransportStats};
use weir_wire::*;

/// The frames a raw socket got before the node hung up.
fn frames_until_eof(raw: &mut TcpStream) -> Vec<Frame> {
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let mut bytes = Vec::new();
    let _ = raw.read_to_end(&mut bytes);
    let mut d = FrameDecoder::new(1 << 20);
    d.feed(&bytes);
    std::iter::from_fn(|| d.next_frame().ok().flatten()).collect()
}

fn hello(cluster: &str, node: u32, incarnation: u64, client: &str) -> Vec<u8> {
    let h = Hello {
        cluster: cluster.into(),
        node: NodeId(node),
        protocol_version: weir_wire::PROTOCOL_VERSION,
        incarnation,
        nonce: [3; 32],
        client: client.into(),
    };
    FrameEncoder::new().encode(&h).unwrap().as_bytes().to_vec()
}

fn member_at(incarnation: u64) -> Transport {
    let mut c = config(1);
    c.incarnation = incarnation;
    c.clients.insert("reader".into(), Role::Read);
    c.clients.insert("loader".into(), Role::Ingest);
    c.clients.insert("ops".into(), Role::Admin);
    Transport::start(c).unwrap()
}

fn client_id(n: u32) -> NodeId {
    NodeId(MAX_MEMBER_ID + n)
}

#[test]
fn a_hello_claiming_a_newer_incarnation_without_the_secret_replaces_nothing() {
    let a = member_at(3);
    // The real node 2, connected.
    let mut real = config(2);
    real.incarnation = 3;
    real.peers.push(weir_wire::transport::PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let _real = Transport::start(real).unwrap();
    util::wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    for claimed in [4, 99, u64::MAX] {
        let mut raw = TcpStream::connect(a.local_addr().unwrap()).unwrap();
        raw.write_all(&hello(CLUSTER, 2, claimed, "")).unwrap();
        // The node answers with its challenge; a proof without the secret is refused.
        raw.write_all(FrameEncoder::new().encode(&Auth { proof: [0; 32] }).unwrap().as_bytes()).unwrap();
        let frames = frames_until_eof(&mut raw);
        let close = frames.last().expect("a close frame").to_owned::<Close>().unwrap();
        assert_eq!(close.code, CloseCode::AuthFailed, "{}", close.message);
    }
    // Only refusals were reported: the real node 2 was neither lost nor replaced.
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if let Ok(e) = a.events().recv_timeout(Duration::from_millis(50)) {
            let fine = matches!(e, Event::Refused { code: CloseCode::AuthFailed, .. } | Event::Heartbeat { .. });
            assert!(fine, "unexpected event {e:?}");
        }
    }
    assert_eq!(TransportStats::get(&a.stats().handshakes), 1, "only the real node's");
}

#[test]
fn a_wrong_cluster_name_is_refused_without_naming_the_right_one() {
    let a = member_at(1);
    let mut raw = TcpStream::connect(a.local_addr().unwrap()).unwrap();
    raw.write_all(&hello("guess\n\u{1b}[31m", 2, 0, "")).unwrap();
    let frames = frames_until_eof(&mut raw);
    let close = frames[0].to_owned::<Close>().unwrap();
    assert_eq!(close.code, CloseCode::ClusterMismatch);
    assert!(!close.message.contains(CLUSTER), "the refusal names the cluster: {}", close.message);
    assert!(!close.message.contains('\n') && !close.message.contains('\u{1b}'), "unescaped: {:?}", close.message);
}

#[test]
fn a_declared_maximal_frame_before_the_handshake_is_refused_and_allocates_nothing() {
    // The decoder of a handshaking connection refuses the header outright.
    let mut d = FrameDecoder::new(HANDSHAKE_MAX_FRAME);
    let header = util::forge(Kind::Hello, &[])[..HEADER_LEN].to_vec();
    let mut big = header.clone();
    big[8..12].copy_from_slice(&(16u32 << 20).to_le_bytes());
    d.feed(&big);
    assert!(matches!(d.next_frame(), Err(FrameError::TooLarge { .. })));
    // An authenticated one holds memory only for the bytes that came.
    let mut d = FrameDecoder::new(16 << 20);
    d.feed(&big);
    assert!(d.next_frame().unwrap().is_none());
    assert!(d.pending_capacity() <= 64 << 10, "{} bytes held for nothing", d.pending_capacity());
    d.feed(&vec![0u8; 1 << 20]);
    assert!(d.next_frame().unwrap().is_none());
    assert!(d.pending_capacity() <= 4 << 20, "{} bytes held for 1 MiB", d.pending_capacity());

    // On the wire: the node closes the connection at once, saying why.
    let a = member_at(1);
    let mut raw = TcpStream::connect(a.local_addr().unwrap()).unwrap();
    raw.write_all(&big).unwrap();
    let close = frames_until_eof(&mut raw)[0].to_owned::<Close>().unwrap();
    assert_eq!(close.code, CloseCode::BadFrame);
    assert!(close.message.contains("exceeds the maximum"), "{}", close.message);
}

#[test]
fn handshaking_connections_over_the_cap_are_closed_at_once() {
    let mut c = config(1);
    c.max_handshaking_per_addr = 4;
    c.handshake_timeout = Duration::from_secs(3);
    let a = Transport::start(c).unwrap();
    let addr = a.local_addr().unwrap();
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Let the node accept the four before the fifth arrives.
    let deadline = Instant::now() + WAIT;
    let mut over = TcpStream::connect(addr).unwrap();
    over.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 16];
    let n = over.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the fifth connection was served");
    assert!(Instant::now() < deadline);
    assert!(TransportStats::get(&a.stats().over_cap) >= 1);
    drop(held);
    // Once the strangers are gone, a client with the secret is served again.
    let deadline = Instant::now() + WAIT;
    loop {
        match BlockingClient::connect(addr, CLUSTER, NodeId(70), SECRET, WAIT) {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("not served after the strangers left: {e}"),
        }
    }
}

#[test]
fn clients_prove_their_own_key_and_get_its_role() {
    let a = member_at(1);
    let addr = a.local_addr().unwrap();
    for (name, role) in [("reader", Role::Read), ("loader", Role::Ingest), ("ops", Role::Admin)] {
        let cred = Credential::derive(SECRET, name, role);
        let c = BlockingClient::connect_as(addr, CLUSTER, client_id(7), &cred, WAIT).unwrap();
        assert_eq!(c.role(), role.name());
    }
    // The right name with another role's key, an unknown name, and a member's id are refused.
    let wrong_role = Credential::derive(SECRET, "reader", Role::Admin);
    let unknown = Credential::derive(SECRET, "nobody", Role::Admin);
    for cred in [wrong_role, unknown] {
        match BlockingClient::connect_as(addr, CLUSTER, client_id(8), &cred, WAIT) {
            Err(ClientError::Handshake { .. }) | Err(ClientError::Closed { code: CloseCode::AuthFailed, .. }) => {}
            other => panic!("{cred:?} was not refused: {other:?}"),
        }
    }
    let reader = Credential::derive(SECRET, "reader", Role::Read);
    match BlockingClient::connect_as(addr, CLUSTER, NodeId(2), &reader, WAIT) {
        Err(ClientError::Closed { code: CloseCode::ProtocolViolation, .. }) => {}
        other => panic!("a client took a member's id: {other:?}"),
    }
    let token = reader.to_token().unwrap();
    assert_eq!(Credential::parse(&token).unwrap(), reader);
    assert!(!format!("{reader:?}").contains(&token[7..]), "the key is in Debug output");
}

#[test]
fn every_message_kind_on_every_client_role_is_accepted_only_if_the_role_allows_it() {
    let a = member_at(1);
    let addr = a.local_addr().unwrap();
    let transport_kinds = [Kind::Hello, Kind::Challenge, Kind::Auth, Kind::Welcome, Kind::Heartbeat, Kind::Close];
    for (name, role) in [("reader", Role::Read), ("loader", Role::Ingest), ("ops", Role::Admin)] {
        let cred = Credential::derive(SECRET, name, role);
        for &kind in Kind::ALL.iter().filter(|k| !transport_kinds.contains(k)) {
            let mut c = BlockingClient::connect_as(addr, CLUSTER, client_id(9), &cred, WAIT).unwrap();
            // A payload no kind accepts: an allowed kind fails validation, a forbidden one is
            // refused before its payload is looked at.
            c.send_raw(&util::forge(kind, &[0xff])).unwrap();
            let code = match c.recv() {
                Err(ClientError::Closed { code, .. }) => code,
                other => panic!("{role} sending {kind:?}: expected a close, got {other:?}"),
            };
            let want = if role.allows(kind) { CloseCode::BadFrame } else { CloseCode::Forbidden };
            assert_eq!(code, want, "{role} sending {kind:?}");
        }
    }
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::Frame { .. })), "a refused frame was delivered");
}

#[test]
fn when_the_handshake_slots_are_full_the_oldest_stranger_makes_room() {
    let mut c = config(1);
    c.max_handshaking = 4;
    c.handshake_timeout = Duration::from_secs(5);
    let a = Transport::start(c).unwrap();
    let addr = a.local_addr().unwrap();
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Time for the node to accept them all (its network thread accepts as they come).
    std::thread::sleep(Duration::from_millis(500));
    // Strangers hold every slot; a client with the secret still gets in, and the first stranger
    // is gone.
    BlockingClient::connect(addr, CLUSTER, NodeId(70), SECRET, WAIT).unwrap();
    let mut first = held.into_iter().next().unwrap();
    first.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(first.read(&mut [0u8; 16]).unwrap_or(0), 0, "the oldest stranger was kept");
    assert!(TransportStats::get(&a.stats().over_cap) >= 1);
}

#[test]
fn a_client_credential_with_a_members_id_is_refused_alike_for_known_and_unknown_names() {
    let a = member_at(1);
    let addr = a.local_addr().unwrap();
    let mut answers = Vec::new();
    for name in ["reader", "nobody"] {
        let cred = Credential::derive(SECRET, name, Role::Read);
        match BlockingClient::connect_as(addr, CLUSTER, NodeId(2), &cred, WAIT) {
            Err(ClientError::Closed { code, message, .. }) => answers.push((code, message)),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(answers[0], answers[1], "the refusal tells which names exist");
    assert_eq!(answers[0].0, CloseCode::ProtocolViolation);
}

#[test]
fn clients_are_capped_and_a_read_client_sends_small_frames_and_no_task_summaries() {
    let mut c = config(1);
    c.clients.insert("reader".into(), Role::Read);
    c.max_clients = 1;
    let a = Transport::start(c).unwrap();
    let addr = a.local_addr().unwrap();
    let cred = Credential::derive(SECRET, "reader", Role::Read);
    let mut first = BlockingClient::connect_as(addr, CLUSTER, client_id(11), &cred, WAIT).unwrap();
    match BlockingClient::connect_as(addr, CLUSTER, client_id(12), &cred, WAIT) {
        Err(ClientError::Closed { code: CloseCode::Busy, .. }) => {}
        other => panic!("a second client past the cap: {other:?}"),
    }
    // Its heartbeat's task summaries are not taken as a member's.
    let hb = Heartbeat {
        node: client_id(11),
        sent_at_ms: 1,
        tasks: vec![TaskHeartbeat {
            stream: StreamId(1),
            epoch: Epoch(3),
            task: TaskId(0),
            latest: Some(CheckpointId(99)),
            latest_version: Version(1),
            latest_ts_ms: 1,
            active: None,
            failed: None,
        }],
    };
    first.send(&hb).unwrap();
    // A frame over a read client's limit (64 KiB) closes its connection.
    first.send_raw(&util::forge(Kind::StatusReq, &vec![0u8; 100 << 10])).unwrap();
    match first.recv() {
        Err(ClientError::Closed { code: CloseCode::BadFrame, message, .. }) => {
            assert!(message.contains("exceeds the maximum"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if let Ok(e) = a.events().recv_timeout(Duration::from_millis(50)) {
            assert!(!matches!(e, Event::Heartbeat { .. } | Event::Frame { .. }), "{e:?}");
        }
    }
    // Its slot is free again, at once.
    BlockingClient::connect_as(addr, CLUSTER, client_id(13), &cred, WAIT).unwrap();
}

#[test]
fn new_connections_from_one_address_are_limited_per_second() {
    let mut c = config(1);
    c.max_handshaking = 2_000;
    c.max_handshaking_per_addr = 2_000;
    c.max_accepts_per_addr_per_sec = 10;
    let a = Transport::start(c).unwrap();
    let addr = a.local_addr().unwrap();
    let t0 = Instant::now();
    let held: Vec<TcpStream> = (0..60).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    // However long the connects took, at most 10 a started second got through.
    let seconds = t0.elapsed().as_secs() + 2;
    let least = (held.len() as u64).saturating_sub(10 * seconds);
    let deadline = Instant::now() + WAIT;
    while TransportStats::get(&a.stats().over_cap) < least.max(1) {
        assert!(Instant::now() < deadline, "{} closed over the rate", TransportStats::get(&a.stats().over_cap));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(held);
    // The next second, a client is served.
    std::thread::sleep(Duration::from_millis(1100));
    BlockingClient::connect(addr, CLUSTER, NodeId(71), SECRET, WAIT).unwrap();
}

#[test]
fn a_port_check_is_not_a_stranger_and_a_connection_that_sends_garbage_is() {
    let a = member_at(1);
    let strangers = || TransportStats::get(&a.stats().strangers);
    // Connected and closed without a byte, as a health checker or another node's probe does.
    for _ in 0..3 {
        drop(TcpStream::connect(a.local_addr().unwrap()).unwrap());
    }
    // Then one that sends garbage: the node hangs up on it, and counts it.
    let mut raw = TcpStream::connect(a.local_addr().unwrap()).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let _ = frames_until_eof(&mut raw);
    let t0 = Instant::now();
    while strangers() == 0 {
        assert!(t0.elapsed() < WAIT, "the garbage was not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Connections end in order on one thread: the port checks, first, were not counted.
    assert_eq!(strangers(), 1);
}
