//! A node's Prometheus metrics: its `/metrics` endpoint after a `weir load`, and a real
//! Prometheus server (Debian's `prometheus`, installed by `scripts/install-deps`) that scrapes it
//! on 127.0.0.1 and answers a query for one of its series through its HTTP API.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

/// `GET path` on `addr`: the status line and the body.
fn get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut c = TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    c.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

/// The value of the sample `name` (with any labels) in an exposition, summed over its labels.
fn sample(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn metrics_addr(config: &Path) -> String {
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    t["nodes"][0]["metrics"].as_str().unwrap().to_string()
}

#[test]
fn prometheus_scrapes_a_node_and_answers_a_query_for_its_ingest_rows() {
    let prometheus = Command::new("prometheus").arg("--version").output();
    assert!(
        prometheus.is_ok_and(|o| o.status.success()),
        "no `prometheus` binary: run scripts/install-deps (Debian's prometheus package)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = adjusted(example("load-one-node.toml"), dir.path(), |t| {
        set(t, &["checkpoint", "interval"], "200ms");
    });
    let metrics = metrics_addr(&config);
    let log = dir.path().join("node.log");
    let mut node = Nodes(vec![start(&config, 1, &log, &[])]);
    let out = weir()
        .args(["load", "--config"])
        .arg(&config)
        .args(["--events", "100k", "--rows-per-ms", "100", "--keys", "100", "--timeout", "30s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The endpoint itself: every row acknowledged once, sources that read them, commits.
    let t0 = Instant::now();
    let text = loop {
        let (status, body) = get(&metrics, "/metrics").unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        let read = sample(&body, "weir_task_rows_in_total").unwrap_or(0.0);
        let committed = body.contains(r#"weir_checkpoints_total{stream="2",outcome="committed"}"#)
            && sample(&body, "weir_checkpoint_duration_seconds_count").unwrap_or(0.0) > 0.0;
        if read >= 100_000.0 && committed {
            break body;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "metrics never showed the load:\n{body}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(sample(&text, "weir_ingest_rows_total"), Some(100_000.0), "{text}");
    assert!(sample(&text, "weir_ingest_ack_latency_seconds_count").unwrap() >= 100.0, "{text}");
    // Every stream's metrics carry its id; its name is in weir_stream_info.
    assert_eq!(sample(&text, r#"weir_node_state{stream="2",state="running"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"weir_stream_info{stream="2",name="ingest"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"weir_ingest_rows_total{stream="2"}"#), Some(100_000.0), "{text}");
    // Every agg's watermark passed the load's rows (the end-of-load marker closed its windows).
    let ts_start =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as f64) - 60_000.0;
    let marks: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("weir_task_watermark_ms{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(marks.len() >= 4 && marks.iter().all(|w| *w > ts_start), "watermarks: {marks:?}\n{text}");
    assert!(text.contains("weir_task_input_queue{"), "{text}");
    assert!(sample(&text, "weir_agg_rows_past_cuts_total").is_some(), "{text}");
    assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    assert_eq!(get(&metrics, "/nothing").unwrap().0, "HTTP/1.1 404 Not Found");

    // Slow clients hold connections open, a header line a second, for as long as the test runs
    // (four: on 127.0.0.1 they share Prometheus's address and its cap of eight): the endpoint
    // serves others meanwhile.
    let stop_slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let (stop, metrics) = (stop_slow.clone(), metrics.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut c) = TcpStream::connect(&metrics) else { return };
                    let mut w = c.write_all(b"GET /metrics HTTP/1.1\r\n");
                    while w.is_ok() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_secs(1));
                        w = c.write_all(b"X-Slow: 1\r\n");
                    }
                }
            })
        })
        .collect();
    let (status, _) = get(&metrics, "/metrics").unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK", "a scrape beside slow clients");

    // A real Prometheus scrapes it every second; its query API returns the series.
    let port = free_ports(1)[0];
    let yml = dir.path().join("prometheus.yml");
    std::fs::write(
        &yml,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let prom_log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let prom = Command::new("prometheus")
        .arg(format!("--config.file={}", yml.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(prom_log)
        .spawn()
        .unwrap();
    let _prom = Nodes(vec![prom]);
    let api = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    loop {
        if let Ok((status, body)) = get(&api, "/api/v1/query?query=weir_ingest_rows_total")
            && status.ends_with("200 OK")
        {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["status"], "success", "{body}");
            if let Some(r) = v["data"]["result"].as_array().and_then(|r| r.first()) {
                assert_eq!(r["metric"]["job"], "weir", "{body}");
                assert_eq!(r["value"][1], "100000", "{body}");
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "Prometheus never returned the series:\n{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Prometheus kept scraping every second beside the slow clients for 30 s: at least 25
    // successful scrapes in those 30 s (its own `up` series).
    std::thread::sleep(Duration::from_secs(30));
    let (_, body) = get(&api, "/api/v1/query?query=sum_over_time(up%7Bjob%3D%22weir%22%7D%5B30s%5D)").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ups: f64 = v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    assert!(ups >= 25.0, "{ups} successful scrapes in 30 s beside slow clients: {body}");
    stop_slow.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    let out = weir().args(["stop", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exit_within(&mut node.0[0], Duration::from_secs(30), "node").success());
}
