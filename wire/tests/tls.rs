//! TLS 1.3 on every link, between real sockets on 127.0.0.1: members with certificates of the
//! cluster's CA exchange frames in order both ways, clients verify the node and prove their
//! credential inside, and whoever lacks the right certificate or speaks plain TCP is refused.

mod util;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use util::{CLUSTER, SECRET, WAIT, config, wait_for};
use weir_wire::frame::FrameEncoder;
use weir_wire::msg::*;
use weir_wire::role::{MAX_MEMBER_ID, Role};
use weir_wire::transport::client::{BlockingClient, ClientError, Credential};
use weir_wire::transport::tls::TlsConfig;
use weir_wire::transport::{Event, PeerConfig, Transport};
use weir_wire::*;

const NAME: &str = "weir-test-node";

/// A CA and one node certificate signed by it, as PEM files in `dir`: (ca, cert, key).
fn certs(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![NAME.to_string()]).unwrap().signed_by(&key, &ca_cert, &ca_key).unwrap();
    let paths =
        (dir.join(format!("{tag}-ca.pem")), dir.join(format!("{tag}-cert.pem")), dir.join(format!("{tag}-key.pem")));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

fn member_tls(p: &(PathBuf, PathBuf, PathBuf)) -> TlsConfig {
    TlsConfig::member(&p.0, &p.1, &p.2, NAME).unwrap()
}

#[test]
fn members_over_tls_exchange_frames_in_order_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let p = certs(dir.path(), "c");
    let mut a_cfg = config(1);
    a_cfg.tls = Some(member_tls(&p));
    a_cfg.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a_cfg).unwrap();
    let mut b_cfg = config(2);
    b_cfg.tls = Some(member_tls(&p));
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b_cfg).unwrap();
    wait_for(&a, |e| matches!(e, Event::PeerUp { node: NodeId(2), .. }));
    wait_for(&b, |e| matches!(e, Event::PeerUp { node: NodeId(1), .. }));
    let mut enc = FrameEncoder::new();
    let (mut sa, mut sb) = (a.sender(), b.sender());
    for seq in 0..5_000u64 {
        // Large and small frames, so records and frames do not line up.
        let rows = if seq % 100 == 0 { 20_000 } else { 8 };
        sb.send_timeout(NodeId(1), enc.encode(&util::data(seq, rows)).unwrap(), WAIT).unwrap();
        sa.send_timeout(NodeId(2), enc.encode(&util::data(seq, 8)).unwrap(), WAIT).unwrap();
    }
    for (t, from) in [(&a, NodeId(2)), (&b, NodeId(1))] {
        for seq in 0..5_000u64 {
            match wait_for(t, |e| matches!(e, Event::Frame { .. })) {
                Event::Frame { from: f, frame } => {
                    assert_eq!((f, frame.access::<Data>().unwrap().seq.get()), (from, Seq(seq)));
                }
                _ => unreachable!(),
            }
        }
    }
}

#[test]
fn a_client_over_tls_proves_its_credential_and_its_split_halves_carry_frames() {
    let dir = tempfile::tempdir().unwrap();
    let p = certs(dir.path(), "c");
    let mut a_cfg = config(1);
    a_cfg.tls = Some(member_tls(&p));
    a_cfg.clients.insert("loader".into(), Role::Ingest);
    let a = Transport::start(a_cfg).unwrap();
    let addr = a.local_addr().unwrap();
    let tls = TlsConfig::client(&p.0, NAME).unwrap();
    let cred = Credential::derive(SECRET, "loader", Role::Ingest);
    let me = NodeId(MAX_MEMBER_ID + 3);
    let c = BlockingClient::connect_with(addr, CLUSTER, me, &cred, Some(&tls), WAIT).unwrap();
    assert_eq!(c.role(), "ingest");
    let (mut w, mut r) = c.split().unwrap();
    let batch = |i: u64| Ingest {
        stream: StreamId(1),
        partition: 0,
        request: i,
        producer: 1,
        seq: i,
        batch: util::batch(if i % 50 == 0 { 30_000 } else { 10 }),
        idle_watermark_ms: None,
        description: None,
    };
    for i in 0..2_000u64 {
        w.send(&batch(i)).unwrap();
    }
    let mut sender = a.sender();
    let mut enc = FrameEncoder::new();
    for i in 0..2_000u64 {
        match wait_for(&a, |e| matches!(e, Event::Frame { .. })) {
            Event::Frame { from, frame } => {
                assert_eq!((from, frame.access::<Ingest>().unwrap().request.to_native()), (me, i));
            }
            _ => unreachable!(),
        }
        let ack = IngestAck {
            stream: StreamId(1),
            partition: 0,
            request: i,
            outcome: IngestOutcome::Durable { first: Version(i), last: Version(i), duplicate: false },
        };
        sender.send_timeout(me, enc.encode(&ack).unwrap(), WAIT).unwrap();
    }
    for i in 0..2_000u64 {
        let f = r.recv().unwrap();
        assert_eq!(f.to_owned::<IngestAck>().unwrap().request, i);
    }
    w.shutdown();
    assert!(r.recv().is_err(), "the reader ends with the writer");
}

#[test]
fn without_the_clusters_certificate_or_tls_nobody_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let p = certs(dir.path(), "c");
    let other = certs(dir.path(), "other");
    let mut a_cfg = config(1);
    a_cfg.tls = Some(member_tls(&p));
    a_cfg.clients.insert("reader".into(), Role::Read);
    let a = Transport::start(a_cfg).unwrap();
    let addr = a.local_addr().unwrap();
    // A member's secret over TLS but without a certificate: refused after its proof.
    let client_tls = TlsConfig::client(&p.0, NAME).unwrap();
    match BlockingClient::connect_with(
        addr,
        CLUSTER,
        NodeId(9),
        &Credential::Secret(SECRET.to_vec()),
        Some(&client_tls),
        WAIT,
    ) {
        Err(ClientError::Closed { code: CloseCode::AuthFailed, message, .. }) => {
            assert!(message.contains("no certificate"), "{message}")
        }
        other => panic!("a member without a certificate: {other:?}"),
    }
    // A client that trusts another CA refuses the node; plain TCP gets nowhere.
    let wrong_ca = TlsConfig::client(&other.0, NAME).unwrap();
    let reader = Credential::derive(SECRET, "reader", Role::Read);
    assert!(
        BlockingClient::connect_with(addr, CLUSTER, NodeId(MAX_MEMBER_ID + 4), &reader, Some(&wrong_ca), WAIT).is_err()
    );
    assert!(
        BlockingClient::connect_as(addr, CLUSTER, NodeId(MAX_MEMBER_ID + 5), &reader, Duration::from_secs(2)).is_err()
    );
    // A member whose certificate comes from another CA is refused by the TLS handshake.
    let mut b_cfg = config(2);
    b_cfg.tls = Some(member_tls(&other));
    b_cfg.peers.push(PeerConfig { node: NodeId(1), addr: Some(addr) });
    let b = Transport::start(b_cfg).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.events().try_iter().all(|e| !matches!(e, Event::PeerUp { .. } | Event::Frame { .. })));
    assert!(b.events().try_iter().all(|e| !matches!(e, Event::PeerUp { .. })));
    // The right credential with the right CA is served.
    BlockingClient::connect_with(addr, CLUSTER, NodeId(MAX_MEMBER_ID + 6), &reader, Some(&client_tls), WAIT).unwrap();
}
