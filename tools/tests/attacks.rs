//! A running `weir node` against clients that should not get far: strangers without the secret
//! (claiming newer incarnations, guessing cluster names, declaring maximal frames from a thousand
//! connections) and clients with a credential of a lesser role. The node keeps its stream, its
//! memory and its answers; every refusal says why.

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use util::*;
use weir_engine::wire::frame::{FrameEncoder, HEADER_LEN, MAGIC};
use weir_engine::wire::msg::{Auth, CloseCode, Hello, Kind};
use weir_engine::wire::role::{MAX_MEMBER_ID, Role};
use weir_engine::wire::transport::client::{BlockingClient, ClientError, Credential};
use weir_engine::wire::{NodeId, PROTOCOL_VERSION};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn hello(cluster: &str, incarnation: u64) -> Vec<u8> {
    let h = Hello {
        cluster: cluster.into(),
        node: NodeId(2),
        protocol_version: PROTOCOL_VERSION,
        incarnation,
        nonce: [9; 32],
        client: String::new(),
    };
    FrameEncoder::new().encode(&h).unwrap().as_bytes().to_vec()
}

/// A frame header declaring a payload of `len` bytes (which never come).
fn declared(len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&MAGIC);
    h.push(PROTOCOL_VERSION);
    h.push(Kind::Hello as u8);
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

fn drain(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
}

#[test]
fn strangers_neither_restart_nor_exhaust_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node, rx, addr) = one_node_committing(dir.path());
    let addr: SocketAddr = addr.parse().unwrap();
    let pid = node.0[0].id();
    let before = rss_kib(pid);

    // Hellos that claim newer incarnations, with a made-up proof; cluster names guessed.
    for incarnation in [2, 1000, u64::MAX] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello("weir-one-node", incarnation)).unwrap();
        let _ = s.write_all(FrameEncoder::new().encode(&Auth { proof: [1; 32] }).unwrap().as_bytes());
        drain(s);
    }
    for guess in ["weir", "prod", "weir-one-node-2"] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello(guess, 5)).unwrap();
        drain(s);
    }

    // A thousand connections, each declaring a 16 MiB frame and sending nothing more.
    let mut peak = before;
    let mut held = Vec::new();
    for wave in 0..4 {
        for _ in 0..250 {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(&declared(16 << 20));
                held.push(s);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        peak = peak.max(rss_kib(pid));
        if wave % 2 == 1 {
            held.clear();
        }
    }
    drop(held);
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(grew_mib < 64, "resident memory grew by {grew_mib} MiB under 1,000 strangers ({before} KiB before)");

    // The stream kept running: new commits, no restart, and clients are served again.
    while rx.try_recv().is_ok() {}
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    let t0 = Instant::now();
    let out = loop {
        let out = weir().args(["status", "--json", "--config"]).arg(&config).output().unwrap();
        if out.status.success() || t0.elapsed() > Duration::from_secs(20) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodes"][0]["streams"][0]["healthy"].as_bool(), Some(true), "{v}");
    // A loaded machine may not have closed a window by the last commit yet: verify says so and
    // to try again, as a user would.
    let t0 = Instant::now();
    let (code, out, err) = loop {
        let (code, out, err) = verify(&config, &[]);
        if !err.contains("try again later") || t0.elapsed() > Duration::from_secs(30) {
            break (code, out, err);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(code, Some(0), "{out} {err}");
    let lines: Vec<String> = rx.try_iter().map(|l| strip_ansi(&l)).collect();
    assert!(!lines.iter().any(|l| l.contains("restart")), "the node restarted: {lines:#?}");
}

#[test]
fn a_client_credential_gets_its_role_and_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        let clients: toml::Value = toml::from_str::<toml::Table>(
            "c = [{ name = \"reader\", role = \"read\" }, { name = \"ops\", role = \"admin\" }, \
             { name = \"loader\", role = \"ingest\" }]",
        )
        .unwrap()["c"]
            .clone();
        t.insert("clients".into(), clients);
    });
    let mut node = Nodes(vec![spawn_piped(&config)]);
    let rx = lines_of(&mut node.0[0]);
    line_with(&rx, "checkpoint committed", Duration::from_secs(30));
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = file["nodes"][0]["addr"].as_str().unwrap().to_string();

    let credential = |name: &str| {
        let out = weir().args(["credential", "--config"]).arg(&config).arg(name).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let reader = credential("reader");
    let out = weir().args(["credential", "--config"]).arg(&config).arg("nobody").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no client \"nobody\""));

    // Read: status answers, with the credential from the environment and no secret anywhere.
    let client = |cred: &str, args: &[&str]| {
        weir()
            .args(args)
            .args(["--node", &addr, "--cluster", "weir-one-node"])
            .env_remove("WEIR_CLUSTER_SECRET")
            .env("WEIR_CREDENTIAL", cred)
            .output()
            .unwrap()
    };
    let out = client(&reader, &["status"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // ... but it may not stop the stream.
    let out = client(&reader, &["stop"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("may not send StopReq"), "{err}");
    // It may read the stream catalog, not change it.
    let out = client(&reader, &["stream", "drop", "bench"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("may not send CatalogChangeReq"), "{err}");
    let out = client(&reader, &["stream", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listed.contains("bench"), "{listed}");

    // Every member's message on a read or ingest link is refused, and nothing reaches the node.
    let addr: SocketAddr = addr.parse().unwrap();
    for (name, role) in [("reader", Role::Read), ("loader", Role::Ingest)] {
        let cred = Credential::parse(&credential(name)).unwrap();
        for kind in [
            Kind::Data,
            Kind::CheckpointReport,
            Kind::Restore,
            Kind::Credit,
            Kind::StopReq,
            Kind::Ingest,
            Kind::CatalogChangeReq,
        ] {
            let mut c =
                BlockingClient::connect_as(addr, "weir-one-node", NodeId(MAX_MEMBER_ID + 5), &cred, WAIT).unwrap();
            // One byte no message accepts, under a correct checksum: an allowed kind fails
            // validation, a forbidden one is refused before its payload is looked at.
            let mut frame = declared(1);
            frame[5] = kind as u8;
            frame.push(0xff);
            let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[..12]), &frame[HEADER_LEN..]);
            frame[12..16].copy_from_slice(&crc.to_le_bytes());
            c.send_raw(&frame).unwrap();
            match c.recv() {
                Err(ClientError::Closed { code, .. }) => {
                    let want = if role.allows(kind) { CloseCode::BadFrame } else { CloseCode::Forbidden };
                    assert_eq!(code, want, "{role} sending {kind:?}");
                }
                other => panic!("{role} sending {kind:?}: {other:?}"),
            }
        }
    }
    // A wrong key is refused like a wrong secret.
    let forged = Credential::derive(b"not-the-secret", "ops", Role::Admin).to_token().unwrap();
    let out = client(&forged, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused this client"));

    // Admin may stop it.
    let out = client(&credential("ops"), &["stop"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exit_within(&mut node.0[0], Duration::from_secs(30), "the node after an admin's stop").success());
}

const WAIT: Duration = Duration::from_secs(10);
