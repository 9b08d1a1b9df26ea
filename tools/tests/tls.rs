//! A cluster that speaks TLS (`[tls]` in its config), as users run it: `weir node`, `weir load`
//! (its split connection over TLS), `weir status` and `weir verify` all over TLS 1.3; a client
//! speaking plain TCP gets nowhere.

mod util;

use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use util::load::*;
use util::*;

/// A CA and a node certificate naming `weir`, as PEM files in `dir`.
fn certs(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["weir".to_string()]).unwrap().signed_by(&key, &ca_cert, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("node.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("node-key.pem"), key.serialize_pem()).unwrap();
}

#[test]
fn a_tls_cluster_takes_a_load_and_answers_status_and_verify_over_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path());
    let config = adjusted(example("load-one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
        t.insert("tls".into(), toml::Value::Table(toml::Table::new()));
        set(t, &["tls", "ca"], dir.path().join("ca.pem").display().to_string());
        set(t, &["tls", "cert"], dir.path().join("node.pem").display().to_string());
        set(t, &["tls", "key"], dir.path().join("node-key.pem").display().to_string());
        let clients: toml::Value =
            toml::from_str::<toml::Table>("c = [{ name = \"reader\", role = \"read\" }]").unwrap()["c"].clone();
        t.insert("clients".into(), clients);
    });
    let log = dir.path().join("node-1.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    let args = ["--events", "100k", "--rows-per-ms", "100", "--keys", "500", "--batch", "700"];
    let (code, s, err) = summary_of(load(&config, &args), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{s:#} {err}");
    assert_acknowledged(&s, 2, 50_000);
    let want = expected(&s, 2, 50_000);
    wait_for_results(&config, want.len(), &log);
    let out = weir().args(["status", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, text) = verify_ingest(&config);
    assert_eq!(code, Some(0), "{text}");
    // A client credential: over plain TCP no answer; with the CA (and no secret) answered.
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let addr = file["nodes"][0]["addr"].as_str().unwrap().to_string();
    let out = weir().args(["credential", "--config"]).arg(&config).arg("reader").output().unwrap();
    let reader = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let status = |tls: bool| {
        let mut cmd = weir();
        cmd.args(["status", "--node", &addr, "--cluster", "weir-load-one-node", "--timeout", "3s"])
            .env_remove("WEIR_CLUSTER_SECRET")
            .env_remove("WEIR_TLS_CA")
            .env("WEIR_CREDENTIAL", &reader);
        if tls {
            cmd.arg("--tls-ca").arg(dir.path().join("ca.pem"));
        }
        cmd.output().unwrap()
    };
    let out = status(false);
    assert_ne!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let out = status(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    stop(&config, &mut node.0[0]);
}
