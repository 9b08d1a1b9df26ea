//! End-to-end benchmark harness: runs whole pipelines and prints their figures.
//!
//! ```text
//! cargo run --release -p weir-bench --bin weir-e2e -- pipeline [seconds] [workers]
//! cargo run --release -p weir-bench --bin weir-e2e -- two-nodes [seconds] [tls]
//! cargo run --release -p weir-bench --bin weir-e2e -- ingest [seconds]
//! cargo run --release -p weir-bench --bin weir-e2e -- checkpoints [seconds] [runs]
//! cargo run --release -p weir-bench --bin weir-e2e -- jitter [seconds]
//! source scripts/services && cargo run --release -p weir-bench --bin weir-e2e -- backup [seconds] [runs]
//! cargo run --release -p weir-bench --bin weir-e2e -- keys [seconds] [k1,k2,...] [rounds]
//! cargo run --release -p weir-bench --bin weir-e2e -- agg [k1,k2,...]
//! source scripts/services && cargo run --release -p weir-bench --bin weir-e2e -- restore [keys]
//! cargo run --release -p weir-bench --bin weir-e2e -- streams [seconds]
//! ```
//!
//! `pipeline`: generator → tumbling 1 s windows (count/sum/min/max/avg) → sink, 10,000 keys, one
//! node, as fast as possible. Prints events per second each second, peak and final RSS.
//! `two-nodes`: the same pipeline spread over two engines (one worker each, unpinned) connected
//! over 127.0.0.1: half the source → agg edges and one agg → sink edge are remote channels.
//! `ingest`: appends 4,096-row batches to one partition's ingest log with group commit every
//! 10 ms, counting only acknowledged (durable) rows.
//! `checkpoints`: the same pipeline with checkpoints every second against runs without, `runs`
//! times, each run with checkpoints between two without; pause and trigger-to-commit figures.
//! `jitter`: one thread pinned to each core spins reading the clock and counts the gaps: how
//! often, and how long, the machine takes a core away from a busy thread (nothing else of Weir
//! runs meanwhile). A pause figure cannot be better than this machine lets it be.
//!
//! `keys`: the job at several key counts on Weir (checkpoints every second) and on
//! timely-dataflow (`weir_bench::keys`, `weir_bench::timely_job`), `rounds` times each
//! (default 1), alternately, with the medians of the rounds.
//!
//! `agg`: 40 million generator rows through one window agg (1 s tumbling windows, firing
//! included) per key count, best of three runs, in ns per row: the agg's hot path without the
//! rest of the engine.
//!
//! `restore`: restore times of one agg checkpoint of `keys` keys (default 4,000,000), from the
//! node's snapshot, `file://` and S3 (`weir_bench::restore`).
//!
//! `streams`: one stream's throughput alone, beside nine idle ones and beside one at full
//! speed on one `weir node`; create-to-first-commit, pause and resume times
//! (`weir_bench::streams`).
//!
//! `backup`: the remote store's figures against the S3 server of `scripts/services`
//! (`weir_bench::backup`).
//!
//! `WEIR_E2E_QUEUE=N` and `WEIR_E2E_CREDITS=N` set the local queue size and the remote credit
//! window (defaults: the engine's, 16 and 64).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weir_engine::ingest::{AppendRequest, IngestService, LogConfig, SyncPolicy};
use weir_engine::runtime::{CheckpointSettings, Engine};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::msg::{CheckpointOutcome, CheckpointStats, TaskCheckpointStats};
use weir_engine::wire::{Batch, NodeId, StreamId};

fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn pipeline(seconds: u64, workers: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    // Two sources, two aggs, one sink: with two workers each runs a source and an agg.
    let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
    // Event time advances about as fast as the wall clock at the target rate (10,000 rows per
    // millisecond per partition), so 1 s windows fire about once a second per key.
    if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
        g.rows_per_ms = 10_000;
    }
    let mut cfg = weir_bench::engine_config(NodeId(1), dir.path());
    cfg.workers = workers;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).expect("engine");
    let t0 = Instant::now();
    let mut last = (t0, 0u64);
    let mut rates = Vec::new();
    for s in 1..=seconds {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        let rows = engine.stats().rows_aggregated.load(Ordering::Relaxed);
        let rate = (rows - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        let (rss, _) = rss_kib();
        println!("t={s:>3}s  {:>7.2} M events/s  rss {:>6} MiB", rate / 1e6, rss / 1024);
        rates.push(rate);
        last = (now, rows);
    }
    let total = engine.stats().rows_aggregated.load(Ordering::Relaxed);
    let results = engine.stats().results_written.load(Ordering::Relaxed);
    engine.stop();
    let (rss, peak) = rss_kib();
    drop(engine.wait());
    let steady: Vec<f64> = rates.iter().skip(1).copied().collect();
    let mean = steady.iter().sum::<f64>() / steady.len().max(1) as f64;
    println!(
        "pipeline: {workers} workers, {seconds} s: mean {:.2} M events/s (after the first second), {total} events, \
         {results} window results written; rss {} MiB, peak rss {} MiB",
        mean / 1e6,
        rss / 1024,
        peak / 1024
    );
}

/// Throughput with checkpoints every second next to the same run without, in one process run
/// after the other, plus pause and trigger-to-commit figures.
fn checkpoints(seconds: u64, pairs: usize) {
    let run = |with: bool| -> (f64, Vec<u64>, Vec<Duration>, usize, Vec<CheckpointStats>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
        if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
            g.rows_per_ms = 10_000;
        }
        let mut cfg = weir_bench::engine_config(NodeId(1), dir.path());
        if with {
            cfg.checkpoint = Some(CheckpointSettings::every(1000, dir.path().join("remote")));
        }
        let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).expect("engine");
        std::thread::sleep(Duration::from_secs(1));
        let (t0, r0) = (Instant::now(), engine.stats().rows_aggregated.load(Ordering::Relaxed));
        std::thread::sleep(Duration::from_secs(seconds));
        let rate = (engine.stats().rows_aggregated.load(Ordering::Relaxed) - r0) as f64 / t0.elapsed().as_secs_f64();
        let stats = engine.checkpoints().map(|l| l.finished()).unwrap_or_default();
        let (pauses, commits, failed) = match engine.checkpoints() {
            Some(log) => (
                log.pauses_us(),
                log.finished()
                    .iter()
                    .filter(|c| c.outcome == CheckpointOutcome::Committed)
                    .map(|c| Duration::from_micros(c.duration_us))
                    .collect(),
                log.totals().1 as usize,
            ),
            None => (Vec::new(), Vec::new(), 0),
        };
        engine.stop();
        drop(engine.wait());
        (rate, pauses, commits, failed, stats)
    };
    // Off, on, off, …, on, off: each run with checkpoints is compared with the mean of the runs
    // without on either side of it, which cancels the shared machine's drift (its speed wanders
    // by ±12 % over tens of seconds); the median of the ratios is the figure.
    let (mut off, mut on) = (vec![run(false).0], Vec::new());
    let (mut pauses, mut commits, mut failed, mut stats) = (Vec::new(), Vec::new(), 0, Vec::new());
    for _ in 0..pairs {
        let (rate, p, c, f, st) = run(true);
        on.push(rate);
        pauses.extend(p);
        commits.extend(c);
        failed += f;
        stats.extend(st);
        off.push(run(false).0);
    }
    let mut ratios: Vec<f64> = on.iter().enumerate().map(|(i, r)| r / ((off[i] + off[i + 1]) / 2.0)).collect();
    ratios.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (off, on) = (mean(&off), mean(&on));
    pauses.sort();
    commits.sort();
    let pct =
        |v: &[u64], p: f64| v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(0);
    let med = commits.get(commits.len() / 2).copied().unwrap_or_default();
    let each: Vec<String> = ratios.iter().map(|r| format!("{:.1}", r * 100.0)).collect();
    println!(
        "checkpoints every 1 s, {seconds} s runs, off/on alternating ({} off, {pairs} on): off {:.2} M events/s, \
         on {:.2} M events/s; on / neighbouring offs: {:.1} % (median; runs {} %)",
        pairs + 1,
        off / 1e6,
        on / 1e6,
        ratios[ratios.len() / 2] * 100.0,
        each.join(", ")
    );
    println!(
        "  per-task pause (alignment + synchronous snapshot): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} task checkpoints ({} over 5 ms)",
        pct(&pauses, 0.5) as f64 / 1e3,
        pct(&pauses, 0.99) as f64 / 1e3,
        pauses.last().copied().unwrap_or(0) as f64 / 1e3,
        pauses.len(),
        pauses.iter().filter(|p| **p > 5_000).count()
    );
    println!(
        "  trigger to commit: median {:.1} ms, max {:.1} ms over {} commits ({failed} failed)",
        med.as_secs_f64() * 1e3,
        commits.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        commits.len()
    );
    breakdown(&stats);
}

/// Where the time of a committed checkpoint goes, per task: medians over the checkpoints of when
/// the barrier reached it and when it reported (ms after the coordinator started the checkpoint),
/// its alignment, synchronous snapshot and background (state write, RocksDB checkpoint, upload).
fn breakdown(stats: &[CheckpointStats]) {
    let committed: Vec<&CheckpointStats> = stats.iter().filter(|c| c.outcome == CheckpointOutcome::Committed).collect();
    let Some(first) = committed.first() else { return };
    let pause = |c: &CheckpointStats| c.tasks.iter().map(|e| e.stats.align_us + e.stats.snapshot_us).max().unwrap_or(0);
    let slowest = committed.iter().max_by_key(|c| c.duration_us);
    let longest_pause = committed.iter().max_by_key(|c| pause(c));
    for (what, c) in [("slowest", slowest), ("longest pause", longest_pause)] {
        let Some(slow) = c else { continue };
        println!("  {what}: {} in {:.1} ms", slow.checkpoint, slow.duration_us as f64 / 1e3);
        for e in &slow.tasks {
            let s = &e.stats;
            let start_us = slow.started_at_ms as f64 * 1e3;
            println!(
                "    {:>8}  barrier in {:>7.2} | align {:>6.2} | snapshot {:>6.2} | background {:>6.2} | reported {:>7.2}",
                e.task.to_string(),
                (s.trigger_at_us as f64 - start_us) / 1e3,
                s.align_us as f64 / 1e3,
                s.snapshot_us as f64 / 1e3,
                s.upload_us as f64 / 1e3,
                (s.reported_at_us as f64 - start_us) / 1e3
            );
        }
    }
    // The longest pauses, split: which part of a pause grows tells alignment from copying.
    let mut longest: Vec<(u64, String, &TaskCheckpointStats, f64)> = committed
        .iter()
        .flat_map(|c| {
            let start_us = c.started_at_ms as f64 * 1e3;
            c.tasks.iter().map(move |e| {
                let s = &e.stats;
                (
                    s.align_us + s.snapshot_us,
                    format!("{} {}", c.checkpoint, e.task),
                    s,
                    s.trigger_at_us as f64 - start_us,
                )
            })
        })
        .collect();
    longest.sort_by_key(|l| std::cmp::Reverse(l.0));
    let top: Vec<String> = longest
        .iter()
        .take(5)
        .map(|(_, what, s, at)| {
            format!(
                "{what} (in {:.2}, align {:.2}, snapshot {:.2})",
                at / 1e3,
                s.align_us as f64 / 1e3,
                s.snapshot_us as f64 / 1e3
            )
        })
        .collect();
    println!("  longest pauses (ms): {}", top.join("; "));
    println!(
        "  per task, medians (ms): barrier in | alignment | snapshot | background | reported (after the start) | max pause"
    );
    for e in &first.tasks {
        let mut cols: [Vec<f64>; 5] = Default::default();
        let mut max_pause = 0f64;
        for c in &committed {
            let start_us = c.started_at_ms as f64 * 1e3;
            if let Some(t) = c.tasks.iter().find(|t| t.task == e.task) {
                let s = &t.stats;
                cols[0].push((s.trigger_at_us as f64 - start_us) / 1e3);
                cols[1].push(s.align_us as f64 / 1e3);
                cols[2].push(s.snapshot_us as f64 / 1e3);
                cols[3].push(s.upload_us as f64 / 1e3);
                cols[4].push((s.reported_at_us as f64 - start_us) / 1e3);
                max_pause = max_pause.max((s.align_us + s.snapshot_us) as f64 / 1e3);
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let m: Vec<f64> = cols.iter_mut().map(med).collect();
        println!(
            "    {:>8}  {:>6.2} | {:>6.2} | {:>6.2} | {:>6.2} | {:>6.2} | {:>6.2}",
            e.task.to_string(),
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            max_pause
        );
    }
}

/// A CA and a node certificate naming `weir` in `dir`, as the member TLS of both nodes.
fn bench_tls(dir: &std::path::Path) -> weir_engine::wire::transport::tls::TlsConfig {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["weir".to_string()])
        .expect("params")
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("certificate");
    let (ca_path, cert_path, key_path) = (dir.join("ca.pem"), dir.join("node.pem"), dir.join("key.pem"));
    std::fs::write(&ca_path, ca_cert.pem()).expect("write");
    std::fs::write(&cert_path, cert.pem()).expect("write");
    std::fs::write(&key_path, key.serialize_pem()).expect("write");
    weir_engine::wire::transport::tls::TlsConfig::member(&ca_path, &cert_path, &key_path, "weir").expect("TLS")
}

fn two_nodes(seconds: u64, tls: bool) {
    use weir_engine::wire::transport::{PeerConfig, TransportConfig};
    let (d1, d2) = (tempfile::tempdir().expect("temp dir"), tempfile::tempdir().expect("temp dir"));
    let tls = tls.then(|| bench_tls(d1.path()));
    let mut spec = StreamSpec::generator(StreamId(1), 2, 2, 1);
    if let SourceKind::Generator { spec: g, .. } = &mut spec.source {
        g.rows_per_ms = 10_000;
    }
    let placement = Placement::spread(&spec.topology(), &[NodeId(1), NodeId(2)]);
    let config = |node: u32, dir: &std::path::Path, peer: PeerConfig| {
        let mut t = TransportConfig::new("bench", NodeId(node), b"weir-bench-two-nodes".to_vec());
        t.listen = Some("127.0.0.1:0".parse().expect("addr"));
        t.peers = vec![peer];
        t.tls = tls.clone();
        let mut cfg = weir_bench::engine_config(NodeId(node), dir);
        cfg.workers = 1;
        cfg.pin_workers = false;
        cfg.transport = Some(t);
        cfg
    };
    let e1 = Engine::start(&spec, &placement, config(1, d1.path(), PeerConfig { node: NodeId(2), addr: None }))
        .expect("engine 1");
    let peer = PeerConfig { node: NodeId(1), addr: e1.transport_addr() };
    let e2 = Engine::start(&spec, &placement, config(2, d2.path(), peer)).expect("engine 2");
    let rows =
        || e1.stats().rows_aggregated.load(Ordering::Relaxed) + e2.stats().rows_aggregated.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    let (t0, r0) = (Instant::now(), rows());
    std::thread::sleep(Duration::from_secs(seconds));
    let rate = (rows() - r0) as f64 / t0.elapsed().as_secs_f64();
    e1.stop();
    e2.stop();
    drop(e1.wait());
    drop(e2.wait());
    let over = if tls.is_some() { "TLS 1.3 over 127.0.0.1" } else { "127.0.0.1" };
    println!("two nodes over {over}, one worker each, {seconds} s: {:.2} M events/s", rate / 1e6);
}

fn ingest(seconds: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (tx, acks) = crossbeam_channel::unbounded();
    let svc = IngestService::start(
        dir.path(),
        1,
        LogConfig::default(),
        SyncPolicy::GroupCommit(Duration::from_millis(10)),
        tx,
    )
    .expect("ingest");
    let mut batch = Batch::with_capacity(4096);
    for i in 0..4096u64 {
        batch.push(1_700_000_000_000 + i as i64, i % 10_000, i as f64);
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(seconds);
    let (mut sent, mut acked_rows) = (0u64, 0u64);
    while Instant::now() < deadline {
        // Keep the writer's queue full; count what comes back durable.
        while sent < 64 + acked_rows / 4096 {
            svc.requests()
                .send(AppendRequest {
                    partition: 0,
                    batch: batch.clone(),
                    from: None,
                    watermark: None,
                    describe: None,
                    token: sent,
                })
                .expect("send");
            sent += 1;
        }
        if let Ok(a) = acks.recv_timeout(Duration::from_millis(100))
            && let Ok(Some((first, last))) = a.result
        {
            acked_rows += last.0 - first.0 + 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "ingest: group commit 10 ms, 4096-row batches: {:.2} M events/s acknowledged durable ({acked_rows} rows in {secs:.1} s, {:.0} MB/s)",
        acked_rows as f64 / secs / 1e6,
        acked_rows as f64 * 24.0 / secs / 1e6
    );
}

fn jitter(seconds: u64) {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let threads: Vec<_> = cores
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                core_affinity::set_for_current(c);
                let end = Instant::now() + Duration::from_secs(seconds);
                let (mut last, mut over1, mut over5, mut max) = (Instant::now(), 0u32, 0u32, Duration::ZERO);
                loop {
                    let now = Instant::now();
                    let gap = now - last;
                    last = now;
                    over1 += u32::from(gap > Duration::from_millis(1));
                    over5 += u32::from(gap > Duration::from_millis(5));
                    max = max.max(gap);
                    if now > end {
                        break (c.id, over1, over5, max);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let (core, over1, over5, max) = t.join().expect("jitter thread");
        println!(
            "jitter, core {core}, {seconds} s: {over1} gaps over 1 ms, {over5} over 5 ms, longest {:.2} ms",
            max.as_secs_f64() * 1e3
        );
    }
}

/// `k1,k2,...` (underscores allowed), else 10k, 100k, 1M, 4M.
fn key_counts(list: Option<&String>) -> Vec<u64> {
    match list {
        Some(list) => list.split(',').filter_map(|k| k.trim().replace('_', "").parse().ok()).collect(),
        None => vec![10_000, 100_000, 1_000_000, 4_000_000],
    }
}

/// `agg`: ns per row through one agg, best of three.
fn agg(keys: &[u64]) {
    use weir_engine::operator::generator::{Generator, GeneratorSpec};
    use weir_engine::operator::window::{WindowAgg, WindowSpec};
    const ROWS: u64 = 40_000_000;
    const BATCH: u64 = 4096;
    // Best of three runs: ns per row of what `make` returns, fed the generator's rows a batch at
    // a time as a source fills them (`Generator::fill`), with the offset after each batch.
    fn best_of_three<F: FnMut(&weir_wire::Batch, u64)>(g: &Generator, mut make: impl FnMut() -> F) -> f64 {
        (0..3)
            .map(|_| {
                let (mut f, mut b, mut o) = (make(), weir_wire::Batch::with_capacity(BATCH as usize), 0);
                let t = Instant::now();
                while o < ROWS {
                    b.clear();
                    g.fill(o, BATCH as usize, &mut b);
                    o += BATCH;
                    f(&b, o);
                }
                t.elapsed().as_nanos() as f64 / ROWS as f64
            })
            .fold(f64::INFINITY, f64::min)
    }
    for &k in keys {
        let generator = Generator::new(GeneratorSpec { keys: k, rows_per_ms: 10_000, ..GeneratorSpec::default() }, 0);
        let g = &generator;
        // The agg as the engine feeds it (columns, `RowAdder::add_columns`), firing as it goes.
        let weir_ns = best_of_three(g, || {
            let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
            move |b, o| {
                agg.batch().add_columns(&b.ts, &b.key, &b.value);
                let mut results = 0u64;
                agg.advance(0, g.max_ts_before(o), |_| results += 1).unwrap();
                std::hint::black_box(results);
            }
        });
        // The generator alone, to tell the tables' own cost.
        let gen_ns = best_of_three(g, || {
            |b, _| {
                std::hint::black_box(b.len());
            }
        });
        // The timely job's table (`timely_job`): an `FxHashMap` of f64 sums per window.
        let fx_ns = best_of_three(g, || {
            const EMPTY: [f64; 4] = [0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY];
            let mut windows = std::collections::BTreeMap::<i64, rustc_hash::FxHashMap<u64, [f64; 4]>>::new();
            move |b, o| {
                for ((ts, key), v) in b.ts.iter().zip(&b.key).zip(&b.value) {
                    let a = windows.entry(ts - ts % 1000).or_default().entry(*key).or_insert(EMPTY);
                    a[0] += 1.0;
                    a[1] += v;
                    a[2] = a[2].min(*v);
                    a[3] = a[3].max(*v);
                }
                let wm = g.max_ts_before(o);
                while windows.first_key_value().is_some_and(|(s, _)| s + 1000 <= wm) {
                    std::hint::black_box(windows.pop_first().map(|w| w.1.len()));
                }
            }
        });
        println!("{k:>10} keys: {weir_ns:.1} ns per row ({gen_ns:.1} of them the generator's); FxHashMap: {fx_ns:.1}");
    }
}

fn main() {
    // The engine's log on stderr when asked (`WEIR_LOG=debug`): where a run's time went.
    if let Ok(filter) = std::env::var("WEIR_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    match args.get(1).map(String::as_str) {
        Some("pipeline") => pipeline(num(2, 10), num(3, 2) as usize),
        Some("ingest") => ingest(num(2, 5)),
        Some("two-nodes") => two_nodes(num(2, 5), args.get(3).is_some_and(|a| a == "tls")),
        Some("checkpoints") => checkpoints(num(2, 5), num(3, 10) as usize),
        Some("jitter") => jitter(num(2, 20)),
        Some("backup") => weir_bench::backup::backup(num(2, 10), num(3, 3) as usize),
        Some("keys") => weir_bench::keys::keys(
            &key_counts(args.get(3)),
            num(2, 10),
            num(4, 1) as usize,
            match args.get(5).map(String::as_str) {
                None | Some("full") => false,
                Some("replay") => true,
                Some(other) => {
                    eprintln!("weir-e2e keys: snapshots are `full` or `replay`, not `{other}`");
                    std::process::exit(2);
                }
            },
        ),
        Some("agg") => agg(&key_counts(args.get(2))),
        Some("restore") => weir_bench::restore::restore(num(2, 4_000_000)),
        Some("recovery") => {
            let list = |i: usize, d: &str| -> Vec<String> {
                args.get(i).map_or(d, String::as_str).split(',').map(|s| s.trim().to_string()).collect()
            };
            weir_bench::recovery::recovery(
                num(2, 30),
                &args.get(3).map_or_else(|| vec![10_000, 1_000_000], |_| key_counts(args.get(3))),
                &list(4, "1s,60s,1h"),
                &list(5, "5s,off"),
            )
        }
        Some("streams") => weir_bench::streams::streams(num(2, 10)),
        _ => {
            eprintln!(
                "usage: weir-e2e pipeline [seconds] [workers] | two-nodes [seconds] [tls] | ingest [seconds] | checkpoints [seconds] [runs] | jitter [seconds] | backup [seconds] [runs] | keys [seconds] [k1,k2,...] [rounds] [full|replay] | agg [k1,k2,...] | restore [keys] | recovery [seconds] [k1,k2,...] [w1,w2,...] [b1,b2,...] | streams [seconds]   (WEIR_LOG=weir_engine=debug: the engine's log on stderr)"
            );
            std::process::exit(2);
        }
    }
}
