//! The engine end to end: generator → window aggregation → sink into the RocksDB result store, on
//! one engine, on two engines connected over 127.0.0.1, and with a slow sink.

mod util;

use std::time::Duration;

use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{Control, Engine, EngineConfig};
use weir_engine::spec::{Placement, SourceKind};
use weir_engine::wire::transport::{PeerConfig, TransportConfig};
use weir_engine::wire::{NodeId, StreamId};

fn run_single(
    spec: &weir_engine::spec::StreamSpec,
    workers: usize,
) -> Vec<weir_engine::operator::window::WindowResult> {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.workers = workers;
    cfg.pin_workers = false;
    let engine = Engine::start(spec, &Placement::single(NodeId(1)), cfg).unwrap();
    // A bounded stream ends by itself: every task finishes once its inputs ended.
    engine.wait().unwrap();
    weir_engine::state::NodeResults::open(dir.path()).unwrap().scan(spec.id).unwrap()
}

#[test]
fn tumbling_windows_on_one_engine_equal_the_reference() {
    let spec = util::bounded_spec(3, 2, 2, 40_000, WindowSpec::tumbling(100));
    let got = run_single(&spec, 2);
    let want = util::reference(&spec);
    assert!(want.len() > 5_000, "{} results", want.len());
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
}

#[test]
fn hopping_windows_on_one_engine_equal_the_reference() {
    let spec = util::bounded_spec(2, 3, 1, 20_000, WindowSpec::hopping(200, 50));
    let got = run_single(&spec, 1);
    assert_eq!(got, util::reference(&spec));
}

fn transport(node: u32, peers: Vec<PeerConfig>) -> TransportConfig {
    let mut t = TransportConfig::new("engine-test", NodeId(node), b"engine-test-secret-0123".to_vec());
    t.listen = Some("127.0.0.1:0".parse().unwrap());
    t.peers = peers;
    t
}

#[test]
fn stream_split_over_two_engines_gives_the_same_results_as_one() {
    let spec = util::bounded_spec(2, 2, 2, 30_000, WindowSpec::tumbling(100));
    let topo = spec.topology();
    let placement = Placement::spread(&topo, &[NodeId(1), NodeId(2)]);
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c1 = EngineConfig::new(NodeId(1), d1.path());
    c1.pin_workers = false;
    // Small credit windows, and different on each node (each grants its own): flow control is
    // exercised.
    c1.remote_credits = 8;
    c1.transport = Some(transport(1, vec![PeerConfig { node: NodeId(2), addr: None }]));
    let e1 = Engine::start(&spec, &placement, c1).unwrap();
    let mut c2 = EngineConfig::new(NodeId(2), d2.path());
    c2.pin_workers = false;
    c2.remote_credits = 3;
    c2.transport = Some(transport(2, vec![PeerConfig { node: NodeId(1), addr: e1.transport_addr() }]));
    let e2 = Engine::start(&spec, &placement, c2).unwrap();
    let (h1, h2) = (std::thread::spawn(move || e1.wait()), std::thread::spawn(move || e2.wait()));
    h1.join().unwrap().unwrap();
    h2.join().unwrap().unwrap();
    let mut got = weir_engine::state::NodeResults::open(d1.path()).unwrap().scan(spec.id).unwrap();
    got.extend(weir_engine::state::NodeResults::open(d2.path()).unwrap().scan(spec.id).unwrap());
    got.sort_by_key(|r| (r.key, r.start));
    assert_eq!(got, util::reference(&spec));
    assert_eq!(got, run_single(&spec, 2));
}

#[test]
fn slow_sink_pushes_back_and_memory_stays_bounded() {
    let mut spec = util::bounded_spec(2, 2, 1, u64::MAX, WindowSpec::tumbling(1));
    if let SourceKind::Generator { limit, .. } = &mut spec.source {
        *limit = None;
    }
    spec.id = StreamId(9);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.pin_workers = false;
    cfg.queue_capacity = 16;
    cfg.sink_throttle = Some(Duration::from_millis(20));
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    let rows = || engine.stats().rows_in.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let (rows_a, rss_a) = (rows(), util::rss_bytes());
    std::thread::sleep(Duration::from_millis(1500));
    let (rows_b, rss_b) = (rows(), util::rss_bytes());
    engine.stop();
    // The sink writes one result batch per 20 ms; sources must have been held back to its pace
    // (unthrottled they generate tens of millions of rows per second).
    assert!(rows_b < 2_000_000, "sources ran ahead of a slow sink: {rows_b} rows");
    assert!(rows_b > rows_a, "the pipeline stalled: {rows_a} -> {rows_b}");
    assert!(rss_b < rss_a + (64 << 20), "memory grew from {rss_a} to {rss_b} bytes");
    engine.wait().unwrap();
}

#[test]
fn paused_source_stops_and_resumes() {
    let mut spec = util::bounded_spec(1, 1, 1, u64::MAX, WindowSpec::tumbling(100));
    if let SourceKind::Generator { limit, .. } = &mut spec.source {
        *limit = None;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.pin_workers = false;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    let rows = || engine.stats().rows_in.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    engine.control(weir_engine::wire::TaskId(0), Control::Pause).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let paused_at = rows();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(rows(), paused_at, "a paused source produced rows");
    engine.control(weir_engine::wire::TaskId(0), Control::Resume).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(rows() > paused_at, "the source did not resume");
    assert!(engine.control(weir_engine::wire::TaskId(99), Control::Pause).is_err());
    engine.stop();
    engine.wait().unwrap();
}

#[test]
fn ingested_rows_are_acknowledged_over_the_network_and_aggregated() {
    use weir_engine::wire::msg::{Ingest, IngestAck, IngestOutcome};
    use weir_engine::wire::{Batch, Version};

    let mut spec = util::bounded_spec(2, 1, 1, 0, WindowSpec::tumbling(10));
    spec.source = SourceKind::IngestLog;
    spec.watermark_delay_ms = 0;
    let dir = tempfile::tempdir().unwrap();
    let (engine, mut client) = util::ingest_engine(&spec, dir.path(), |_| {});
    // Partition p gets rows with ts 0..100 for key p, value 1..; then one row at ts 1000 moves the
    // watermark past every window of the first rows.
    let mut next = [0u64; 2];
    let producer = 0xabc;
    let ingest = |partition: u32, request: u64, seq: u64, batch: Batch| Ingest {
        stream: spec.id,
        partition,
        request,
        producer,
        seq,
        batch,
        idle_watermark_ms: None,
        description: None,
    };
    let half = |p: u32, base: i64| {
        let mut b = Batch::default();
        for t in base..base + 50 {
            b.push(t, p as u64, 1.0);
        }
        b
    };
    for (req, p) in [(1u64, 0u32), (2, 1), (3, 0), (4, 1)] {
        let base = if req <= 2 { 0 } else { 50 };
        client.send(&ingest(p, req, (req - 1) / 2, half(p, base))).unwrap();
        let ack = client.recv().unwrap().to_owned::<IngestAck>().unwrap();
        assert_eq!(ack.request, req);
        let n = next[p as usize];
        assert_eq!(ack.outcome, IngestOutcome::Durable { first: Version(n), last: Version(n + 49), duplicate: false });
        next[p as usize] += 50;
    }
    // The first batch sent again (as after a lost ack): its original versions, stored once (the
    // results below count each row once).
    client.send(&ingest(0, 5, 0, half(0, 0))).unwrap();
    let ack = client.recv().unwrap().to_owned::<IngestAck>().unwrap();
    assert_eq!(ack.outcome, IngestOutcome::Durable { first: Version(0), last: Version(49), duplicate: true });
    // A gap is refused, and says so.
    client.send(&ingest(1, 6, 5, half(1, 0))).unwrap();
    match client.recv().unwrap().to_owned::<IngestAck>().unwrap().outcome {
        IngestOutcome::Rejected { reason, retryable: false } => {
            assert!(reason.contains("expected 2") && reason.contains("gap"), "{reason}")
        }
        other => panic!("a gap was not refused: {other:?}"),
    }
    for p in 0..2u32 {
        let mut b = Batch::default();
        b.push(1000, 7, 0.0);
        client.send(&ingest(p, 10 + p as u64, 2, b)).unwrap();
        assert!(matches!(
            client.recv().unwrap().to_owned::<IngestAck>().unwrap().outcome,
            IngestOutcome::Durable { duplicate: false, .. }
        ));
    }
    client.send(&ingest(9, 99, 0, Batch::default())).unwrap();
    assert!(matches!(client.recv().unwrap().to_owned::<IngestAck>().unwrap().outcome, IngestOutcome::Rejected { .. }));
    // 2 keys × 10 windows of 10 rows each.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.stats().results_written.load(std::sync::atomic::Ordering::Relaxed) < 20 {
        assert!(std::time::Instant::now() < deadline, "results did not arrive");
        std::thread::sleep(Duration::from_millis(10));
    }
    let results = engine.results().scan(spec.id).unwrap();
    assert_eq!(results.len(), 20);
    assert!(results.iter().all(|r| r.count == 10 && r.sum == 10.0 && r.key < 2));
    engine.stop();
    engine.wait().unwrap();
}

/// CPU time (user + system) the engine's worker threads have used so far: only this engine's
/// threads, so tests running beside it in the same process do not count.
fn cpu_time(engine: &Engine) -> Duration {
    let tids = engine.worker_threads();
    assert_eq!(tids.len(), 2, "both workers run");
    let ticks: u64 = tids
        .iter()
        .map(|tid| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        })
        .sum();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

#[test]
fn idle_workers_park_instead_of_spinning() {
    let mut spec = util::bounded_spec(2, 2, 1, 0, WindowSpec::tumbling(10));
    spec.source = SourceKind::IngestLog; // nothing is ingested: every task idles
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(NodeId(1), dir.path());
    cfg.pin_workers = false;
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_time(&engine);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time(&engine) - before;
    // Two spinning workers would burn about 2 s of CPU in this second (less when tests beside
    // this one take the cores: a quarter of it still shows spinning).
    assert!(used < Duration::from_millis(250), "idle workers used {used:?} of CPU in 1 s");
    // And work still gets through promptly.
    let svc = engine.ingest().unwrap();
    let mut b = weir_engine::wire::Batch::default();
    b.push(5, 1, 1.0);
    b.push(100, 1, 1.0);
    for p in 0..2 {
        svc.requests()
            .send(weir_engine::ingest::AppendRequest {
                partition: p,
                batch: b.clone(),
                from: None,
                watermark: None,
                describe: None,
                token: weir_engine::runtime::IngestToken {
                    node: NodeId(0),
                    stream: spec.id,
                    request: p as u64,
                    epoch: weir_engine::wire::Epoch(0),
                },
            })
            .unwrap();
    }
    let t0 = std::time::Instant::now();
    while engine.stats().results_written.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "no result after ingest");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(t0.elapsed() < Duration::from_millis(500), "woke up slowly: {:?}", t0.elapsed());
    engine.stop();
    engine.wait().unwrap();
}

#[test]
fn a_partition_without_rows_stops_holding_back_the_watermark_after_idle_after() {
    use weir_engine::ingest::AppendRequest;
    use weir_engine::runtime::IngestToken;
    use weir_engine::wire::Batch;

    // Two partitions; rows come to partition 0 only, with event times near the wall clock.
    let mut spec = util::bounded_spec(2, 1, 1, 0, WindowSpec::tumbling(100));
    spec.source = SourceKind::IngestLog;
    let run = |idle_after: Option<Duration>, wait: Duration| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = EngineConfig::new(NodeId(1), dir.path());
        cfg.pin_workers = false;
        cfg.idle_after = idle_after;
        let engine = Engine::start(&spec, &Placement::single(NodeId(1)), cfg).unwrap();
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let start = now_ms - now_ms % 100 - 1000;
        let mut b = Batch::default();
        for i in 0..500 {
            b.push(start + i, (i % 7) as u64, 1.0); // 5 windows of 100 ms, 7 keys
        }
        let token = IngestToken { node: NodeId(0), stream: spec.id, request: 1, epoch: weir_engine::wire::Epoch(0) };
        let req = AppendRequest { partition: 0, batch: b, from: None, watermark: None, describe: None, token };
        engine.ingest().unwrap().requests().send(req).unwrap();
        let t0 = std::time::Instant::now();
        while t0.elapsed() < wait && engine.stats().results_written.load(std::sync::atomic::Ordering::Relaxed) < 35 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let results = engine.results().scan(spec.id).unwrap();
        engine.stop();
        engine.wait().unwrap();
        results
    };
    // Idle partitions close every window: partition 1 never sent a row, and partition 0's rows
    // all came at once (its own marker closes its last window).
    let results = run(Some(Duration::from_millis(200)), Duration::from_secs(20));
    assert_eq!(results.len(), 35, "5 windows x 7 keys");
    assert_eq!(results.iter().map(|r| r.count).sum::<u64>(), 500);
    // Without idleness, partition 1 holds the watermark: nothing closes.
    assert!(run(None, Duration::from_secs(1)).is_empty());
}

#[test]
fn ledgers_larger_than_a_frame_are_answered_in_pages_that_add_up_to_all_of_them() {
    use weir_engine::wire::Batch;
    use weir_engine::wire::msg::{Ingest, IngestAck, IngestOutcome, ProducersCursor, ProducersReq, ProducersRsp};

    let mut spec = util::bounded_spec(2, 1, 1, 0, WindowSpec::tumbling(10));
    spec.source = SourceKind::IngestLog;
    let dir = tempfile::tempdir().unwrap();
    let (engine, mut client) = util::ingest_engine(&spec, dir.path(), |_| {});
    // 160 producers with 60 KiB descriptions each, over both partitions: 9.4 MiB of ledgers,
    // more than half a frame.
    let producers = 160u64;
    for p in 0..producers {
        let mut b = Batch::default();
        b.push(p as i64, p, 1.0);
        let description = format!("{p:08}").repeat(60 << 7).into_bytes();
        let req = Ingest {
            stream: spec.id,
            partition: (p % 2) as u32,
            request: p,
            producer: 0x1000 + p,
            seq: 0,
            batch: b,
            idle_watermark_ms: None,
            description: Some(description),
        };
        client.send(&req).unwrap();
        let ack = client.recv().unwrap().to_owned::<IngestAck>().unwrap();
        assert!(matches!(ack.outcome, IngestOutcome::Durable { .. }), "{:?}", ack.outcome);
    }
    let (mut seen, mut pages, mut from) = (Vec::new(), 0, ProducersCursor::default());
    loop {
        client.send(&ProducersReq { request: 1, stream: spec.id, from }).unwrap();
        let frame = client.recv().unwrap();
        assert!(frame.payload_len() < 6 << 20, "a page of {} bytes", frame.payload_len());
        let rsp = frame.to_owned::<ProducersRsp>().unwrap();
        assert!(rsp.error.is_empty(), "{}", rsp.error);
        pages += 1;
        for part in &rsp.partitions {
            for r in &part.producers {
                assert_eq!(r.description.len(), 60 << 10);
                assert_eq!(r.description[..8], format!("{:08}", r.producer - 0x1000).into_bytes()[..]);
                seen.push((part.partition, r.producer));
            }
        }
        match rsp.next {
            Some(n) => {
                assert!(n > from);
                from = n;
            }
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    seen.sort();
    let want: Vec<(u32, u64)> = {
        let mut w: Vec<_> = (0..producers).map(|p| ((p % 2) as u32, 0x1000 + p)).collect();
        w.sort();
        w
    };
    assert_eq!(seen, want, "pages skipped or repeated producers");
    engine.stop();
    engine.wait().unwrap();
}

#[test]
fn a_source_far_ahead_in_event_time_waits_while_a_slower_one_sends_and_goes_on_once_it_is_idle() {
    use weir_engine::wire::{Batch, TaskId};

    let mut spec = util::bounded_spec(2, 1, 1, 0, WindowSpec::tumbling(1000));
    spec.source = SourceKind::IngestLog;
    spec.watermark_delay_ms = 0;
    // 100 ms of partition 0's event time per batch: what its channel holds is under a second.
    spec.batch_rows = 1000;
    let dir = tempfile::tempdir().unwrap();
    let (engine, mut client) = util::ingest_engine(&spec, dir.path(), |_| {});
    let mut request = 0;
    let mut send = |partition: u32, seq: u64, batch: Batch| {
        request += 1;
        ingest_durable(&mut client, spec.id, (partition, request, 0xa11, seq), batch);
    };
    let source0 = || {
        let st = engine.status();
        st.tasks.iter().find(|t| t.task == TaskId(0)).and_then(|t| t.watermark_ms).unwrap_or(i64::MIN)
    };
    // Partition 1: 100 ms of event time every 20 ms for two seconds, as a live feed would.
    // Partition 0: a minute of event time (10 rows per ms) within the first 10 steps of it.
    let mut ahead = Vec::new();
    for s in 0..100u64 {
        let mut b = Batch::default();
        for t in (s as i64 * 100)..(s as i64 + 1) * 100 {
            b.push(t, 100, 1.0);
        }
        send(1, s, b);
        // In entries of 100 ms: a source reads an entry whole.
        for piece in (s * 60..(s + 1) * 60).filter(|_| s < 10) {
            let mut b = Batch::default();
            for t in (piece as i64 * 100)..(piece as i64 + 1) * 100 {
                (0..10).for_each(|k| b.push(t, k, 1.0));
            }
            send(0, piece, b);
        }
        std::thread::sleep(Duration::from_millis(20));
        if s >= 10 {
            ahead.push(source0() - (s as i64 + 1) * 100);
        }
    }
    // The drift (a second), plus what its channel holds (8 batches of 100 ms) and a batch.
    let most = ahead.iter().max().copied().unwrap();
    assert!(most <= 3000, "partition 0's source ran {most} ms ahead of partition 1's (all: {ahead:?})");
    // Partition 1 idle: partition 0 goes on to its end.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while source0() < 59_999 {
        assert!(std::time::Instant::now() < deadline, "partition 0 stayed held at {}", source0());
        std::thread::sleep(Duration::from_millis(20));
    }
    engine.stop();
    engine.wait().unwrap();
}

#[test]
fn a_source_restored_onto_a_log_that_lost_the_rows_its_checkpoint_read_fails_naming_the_partition() {
    use weir_engine::runtime::CheckpointSettings;
    use weir_engine::wire::Batch;

    let mut spec = util::bounded_spec(2, 1, 1, 0, WindowSpec::tumbling(1000));
    spec.source = SourceKind::IngestLog;
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut cfg = EngineConfig::new(NodeId(1), dir.path());
        cfg.pin_workers = false;
        cfg.transport = Some(transport(1, vec![]));
        cfg.checkpoint = Some(CheckpointSettings::every(50, dir.path().join("remote")));
        cfg
    };
    let engine = Engine::start(&spec, &Placement::single(NodeId(1)), config()).unwrap();
    let mut client = weir_engine::wire::transport::client::BlockingClient::connect(
        engine.transport_addr().expect("listening"),
        "engine-test",
        NodeId(900),
        b"engine-test-secret-0123",
        Duration::from_secs(10),
    )
    .unwrap();
    for p in 0..2u32 {
        let mut batch = Batch::default();
        (0..100).for_each(|t| batch.push(t, u64::from(p), 1.0));
        ingest_durable(&mut client, spec.id, (p, u64::from(p), 7, 0), batch);
    }
    // A commit after both sources read their rows.
    let read_all = |e: &Engine| e.status().tasks.iter().filter(|t| t.task.0 < 2).all(|t| t.rows_out == 100);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !read_all(&engine) {
        assert!(std::time::Instant::now() < deadline, "the sources did not read their rows");
        std::thread::sleep(Duration::from_millis(10));
    }
    let commits = |e: &Engine| e.checkpoints().map_or(0, |l| l.totals().0);
    let before = commits(&engine);
    while commits(&engine) < before + 2 {
        assert!(std::time::Instant::now() < deadline, "no commit after the rows were read");
        std::thread::sleep(Duration::from_millis(10));
    }
    engine.stop();
    engine.wait().unwrap();
    // Partition 1's log is lost (its disk, or its only copy's node); the checkpoint stays.
    std::fs::remove_dir_all(weir_engine::ingest::service::partition_dir(&dir.path().join("ingest"), 1)).unwrap();
    // The restore fails at the start (or, restoring later, the run).
    let e = match Engine::start(&spec, &Placement::single(NodeId(1)), config()) {
        Err(e) => e.to_string(),
        Ok(engine) => {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let failure = loop {
                if let Some(f) = engine.failure() {
                    break f;
                }
                assert!(std::time::Instant::now() < deadline, "a source restored past the end of its log, silently");
                std::thread::sleep(Duration::from_millis(20));
            };
            engine.stop();
            let _ = engine.wait();
            failure
        }
    };
    assert!(e.contains("partition 1's log") && e.contains("up to 100") && e.contains("task t1"), "{e}");
    // Partition 0's log, whole, is not the one named.
    assert!(!e.contains("partition 0"), "{e}");
}

/// Sends `batch` to `partition` as producer `producer`'s `seq`-th batch and asserts it durable.
fn ingest_durable(
    client: &mut weir_engine::wire::transport::client::BlockingClient,
    stream: StreamId,
    (partition, request, producer, seq): (u32, u64, u64, u64),
    batch: weir_engine::wire::Batch,
) {
    use weir_engine::wire::msg::{Ingest, IngestAck, IngestOutcome};
    let m = Ingest { stream, partition, request, producer, seq, batch, idle_watermark_ms: None, description: None };
    client.send(&m).unwrap();
    let ack = client.recv().unwrap().to_owned::<IngestAck>().unwrap();
    assert!(matches!(ack.outcome, IngestOutcome::Durable { .. }), "{:?}", ack.outcome);
}
