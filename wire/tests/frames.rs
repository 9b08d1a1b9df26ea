//! Frame codec: roundtrips of every message type, zero-copy batches, and every corruption class.

mod util;

use proptest::prelude::*;
use weir_wire::frame::{FrameDecoder, FrameEncoder, FrameError, HEADER_LEN, decode_one};
use weir_wire::msg::*;
use weir_wire::*;

const MAX: usize = weir_wire::frame::DEFAULT_MAX_FRAME;

fn encode<M: Message>(m: &M) -> Vec<u8> {
    FrameEncoder::new().encode(m).unwrap().as_bytes().to_vec()
}

/// Encodes, decodes whole and one byte at a time, and compares with the original.
macro_rules! roundtrip {
    ($($name:ident: $ty:ident = $value:expr;)*) => {
        $(
            #[test]
            fn $name() {
                let value: $ty = $value;
                let bytes = encode(&value);
                let frame = decode_one(&bytes, MAX).unwrap();
                assert_eq!(frame.kind(), Kind::$ty);
                assert_eq!(frame.to_owned::<$ty>().unwrap(), value);
                assert!(matches!(frame.message().unwrap(), AnyMessage::$ty(_)));
                let mut d = FrameDecoder::new(MAX);
                let mut got = Vec::new();
                for b in &bytes {
                    d.feed(std::slice::from_ref(b));
                    while let Some(f) = d.next_frame().unwrap() {
                        got.push(f);
                    }
                }
                assert_eq!(got.len(), 1);
                assert_eq!(got[0].to_owned::<$ty>().unwrap(), value);
            }
        )*

        #[test]
        fn every_kind_has_a_roundtrip_test() {
            let tested = [$(Kind::$ty),*];
            for k in Kind::ALL {
                assert!(tested.contains(k), "no roundtrip test for {k:?}");
            }
        }
    };
}

roundtrip! {
    roundtrip_hello: Hello = Hello { cluster: "c1".into(), node: NodeId(4), protocol_version: 1, incarnation: 3, nonce: [7; 32], client: "ops".into() };
    roundtrip_challenge: Challenge = Challenge {
        node: NodeId(5), protocol_version: 1, incarnation: 2, nonce: [1; 32], proof: [2; 32],
    };
    roundtrip_auth: Auth = Auth { proof: [9; 32] };
    roundtrip_welcome: Welcome = Welcome { role: "read".into() };
    roundtrip_heartbeat: Heartbeat = Heartbeat {
        node: NodeId(1),
        sent_at_ms: 123,
        tasks: vec![TaskHeartbeat {
            stream: StreamId(1), task: TaskId(2), latest: Some(CheckpointId(3)), latest_version: Version(4),
            epoch: Epoch(3),
            latest_ts_ms: 5, active: Some(CheckpointId(4)), failed: None,
        }],
    };
    roundtrip_close: Close = Close { code: CloseCode::AuthFailed, message: "wrong secret".into() };
    roundtrip_ingest: Ingest = Ingest { stream: StreamId(1), partition: 3, request: 99, producer: 0xfeed, seq: 7, batch: util::batch(100), idle_watermark_ms: Some(-5), description: Some(b"{}".to_vec()) };
    roundtrip_ingest_ack: IngestAck = IngestAck {
        stream: StreamId(1), partition: 3, request: 99,
        outcome: IngestOutcome::Durable { first: Version(10), last: Version(109), duplicate: true },
    };
    roundtrip_ingest_ack_not_here: IngestAck = IngestAck {
        stream: StreamId(1), partition: 3, request: 100,
        outcome: IngestOutcome::NotHere { reason: "partition 3 is on node 2".into() },
    };
    roundtrip_data: Data = util::data(17, 4096);
    roundtrip_watermark: Watermark = Watermark {
        stream: StreamId(1), epoch: Epoch(0), from: TaskId(1), to: TaskId(2), seq: Seq(5), watermark_ms: -3,
    };
    roundtrip_window_results: WindowResults = WindowResults {
        stream: StreamId(1), epoch: Epoch(0), from: TaskId(3), to: TaskId(5), seq: Seq(9), key: vec![1, 2], start: vec![0, 1000],
        count: vec![3, 4], sum: vec![1.5, -2.0], min: vec![0.0, -1.0], max: vec![1.0, 0.5],
    };
    roundtrip_end_of_stream: EndOfStream = EndOfStream { stream: StreamId(1), epoch: Epoch(0), from: TaskId(3), to: TaskId(5), seq: Seq(10) };
    roundtrip_replicate: Replicate = Replicate {
        stream: StreamId(2), partition: 1, at: Version(4096), log_first: Version(0), log_first_chain: 0x0c4a_1234, reset: false,
        entries: vec![1, 2, 3, 4], producers: vec![ReplicaProducer { producer: 0xfeed, description: b"{}".to_vec(), first: Version(0), ended: Some(9), rows: 7, batches: 2 }],
        session: 0x5e55_1011,
    };
    roundtrip_replicate_ack: ReplicateAck = ReplicateAck {
        stream: StreamId(2), partition: 1, next: Version(8192), error: "out of step".into(),
        session: 0x5e55_1011, chain: Some(0xdead_beef),
    };
    roundtrip_credit: Credit = Credit { stream: StreamId(1), epoch: Epoch(0), from: TaskId(3), to: TaskId(5), credits: 16 };
    roundtrip_checkpoint_source_req: CheckpointSourceReq = CheckpointSourceReq {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), trans: TransId(9), task: TaskId(1), node: NodeId(2),
        kind: TriggerKind::Manual, expire_at_ms: 1000,
    };
    roundtrip_checkpoint_source_rsp: CheckpointSourceRsp = CheckpointSourceRsp {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), trans: TransId(9), task: TaskId(1), node: NodeId(2),
        outcome: SourceOutcome::AlreadyCompleted { latest: CheckpointId(9) },
    };
    roundtrip_checkpoint_source_rsp_not_restored: CheckpointSourceRsp = CheckpointSourceRsp {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), trans: TransId(9), task: TaskId(1), node: NodeId(2),
        outcome: SourceOutcome::NotRestored,
    };
    roundtrip_checkpoint_trigger: CheckpointTrigger = util::trigger();
    roundtrip_checkpoint_ready: CheckpointReady = CheckpointReady {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), trans: TransId(9), downstream: TaskId(5),
        downstream_node: NodeId(2), upstream: TaskId(1), upstream_node: NodeId(1),
    };
    roundtrip_checkpoint_ready_rsp: CheckpointReadyRsp = CheckpointReadyRsp {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), upstream: TaskId(1), downstream: TaskId(5),
    };
    roundtrip_retrieve_trigger_req: RetrieveTriggerReq = RetrieveTriggerReq {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), upstream: TaskId(1), upstream_node: NodeId(1),
        downstream: TaskId(5), downstream_node: NodeId(2),
    };
    roundtrip_trigger_rsp: TriggerRsp = TriggerRsp {
        stream: StreamId(1), epoch: Epoch(0), checkpoint: CheckpointId(8), trans: TransId(9), upstream: TaskId(1),
        downstream: TaskId(5), code: TriggerRspCode::InProgress, trigger_seq: Seq(77),
    };
    roundtrip_checkpoint_report: CheckpointReport = CheckpointReport {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), node: NodeId(2), checkpoint: CheckpointId(8), trans: TransId(9),
        outcome: ReportOutcome::Failed { reason: "upload failed".into() }, version: Version(1234),
        checkpoint_ts_ms: 99, manifest_crc: 0xdead_beef, stats: util::stats(),
    };
    roundtrip_update_checkpoint_info: UpdateCheckpointInfo = UpdateCheckpointInfo {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), checkpoint: CheckpointId(8), trans: TransId(9), version: Version(1),
        checkpoint_ts_ms: 2,
    };
    roundtrip_task_reset: TaskReset = TaskReset {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), failed: CheckpointId(8), trans: TransId(9), reason: "timeout".into(),
    };
    roundtrip_consensus_req: ConsensusReq = ConsensusReq {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), node: NodeId(2), latest: Some(CheckpointId(7)),
        request: 12,
    };
    roundtrip_cannot_restore_req: CannotRestoreReq = CannotRestoreReq {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), node: NodeId(2), checkpoint: CheckpointId(7),
        restorable: vec![CheckpointId(6), CheckpointId(4)], reason: "corrupt object 1/tasks/5/sst/x".into(), request: 12,
    };
    roundtrip_run_failed: RunFailed = RunFailed {
        stream: StreamId(1), epoch: Epoch(9), reason: "channel 2 -> 5: expected 7, got 9: data lost".into(),
    };
    roundtrip_restore_fallback: Restore = Restore {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), checkpoint: Some(CheckpointId(6)), basis: RestoreBasis::Fallback,
        version: None, request: 12,
    };
    roundtrip_restore: Restore = Restore {
        stream: StreamId(1), epoch: Epoch(0), task: TaskId(5), checkpoint: Some(CheckpointId(7)), basis: RestoreBasis::Consensus,
        version: Some(Version(70)), request: 12,
    };
    roundtrip_status_req: StatusReq = StatusReq { request: 5, stream: Some(StreamId(3)) };
    roundtrip_checkpoint_now_req: CheckpointNowReq = CheckpointNowReq { request: 6, stream: StreamId(2) };
    roundtrip_checkpoint_now_rsp: CheckpointNowRsp = CheckpointNowRsp {
        request: 6, node: NodeId(2), outcome: CheckpointNowOutcome::NotCoordinator { coordinator: NodeId(1) },
    };
    roundtrip_stop_req: StopReq = StopReq { request: 8, stream: StreamId(2), forwarded: true };
    roundtrip_stop_rsp: StopRsp = StopRsp { request: 8, node: NodeId(3), stopping: true, peers: vec![NodeId(1), NodeId(2)] };
    roundtrip_results_req: ResultsReq = ResultsReq {
        request: 9, stream: StreamId(2), store: 1, after: vec![0, 1, 2, 255], max: 4096,
    };
    roundtrip_producers_req: ProducersReq = ProducersReq { request: 4, stream: StreamId(2), from: ProducersCursor { partition: 1, producer: 7 } };
    roundtrip_producers_rsp: ProducersRsp = ProducersRsp {
        request: 4, node: NodeId(2),
        partitions: vec![PartitionProducers {
            partition: 3, durable: Version(1001),
            producers: vec![ProducerInfo { producer: 0xfeed, description: b"{\"seed\":1}".to_vec(), first: Version(0), rows: 1000, batches: 1, ended: Some(5000) }],
        }],
        next: Some(ProducersCursor { partition: 3, producer: 1 }),
        error: String::new(),
    };
    roundtrip_catalog_req: CatalogReq = CatalogReq { request: 11, name: "meters".into() };
    roundtrip_catalog_change_req: CatalogChangeReq = CatalogChangeReq {
        request: 12, change: CatalogChange::Create { name: "meters".into(), spec: "partitions = 4\n".into() },
    };
    roundtrip_catalog_pause_req: CatalogChangeReq = CatalogChangeReq { request: 13, change: CatalogChange::Pause { name: "meters".into() } };
    roundtrip_catalog_resume_req: CatalogChangeReq = CatalogChangeReq { request: 14, change: CatalogChange::Resume { name: "meters".into() } };
    roundtrip_catalog_rescale_req: CatalogChangeReq = CatalogChangeReq {
        request: 15, change: CatalogChange::Rescale { name: "meters".into(), aggs: 5, sinks: 0 },
    };
    roundtrip_catalog_stop_req: CatalogChangeReq = CatalogChangeReq { request: 16, change: CatalogChange::Stop { name: "meters".into() } };
    roundtrip_catalog_paused_rsp: CatalogRsp = CatalogRsp {
        request: 13, node: NodeId(1),
        streams: vec![StreamEntry {
            id: StreamId(3), name: "meters".into(), state: StreamState::Paused { since_ms: 98 },
            spec: String::new(), created_ms: 5,
        }],
        refused: None,
    };
    roundtrip_catalog_rsp: CatalogRsp = CatalogRsp {
        request: 12, node: NodeId(2),
        streams: vec![StreamEntry {
            id: StreamId(3), name: "meters".into(), state: StreamState::Dropping { since_ms: 99 },
            spec: "partitions = 4\n".into(), created_ms: 5,
        }],
        refused: Some(CatalogRefusal::Unavailable { reason: "etcd".into() }),
    };
    roundtrip_results_rsp: ResultsRsp = ResultsRsp {
        request: 9, node: NodeId(3), stores: 2,
        results: vec![ResultRow { key: 7, start: -1000, count: 3, sum: 1.5, min: -0.5, max: 1e300 }],
        next: Some(vec![9, 9]), error: String::new(),
    };
    roundtrip_status_rsp: StatusRsp = StatusRsp {
        request: 5, node: NodeId(1), uptime_ms: 1000,
        tasks: vec![TaskStatus {
            stream: StreamId(1), task: TaskId(1), state: TaskState::Checkpointing, latest: Some(CheckpointId(3)),
            active: Some(CheckpointId(4)), failed: Some(CheckpointId(2)), rows_in: 10, rows_out: 9, watermark_ms: Some(-7), queued: 3,
            replay_rows: 40, replayed: 12, replay_ms: 900,
        }],
        checkpoints: vec![CheckpointStats {
            stream: StreamId(1), checkpoint: CheckpointId(3), started_at_ms: 1, duration_us: 12_000,
            outcome: CheckpointOutcome::Committed, upload_bytes: 4096, max_align_us: 100, max_snapshot_us: 900,
            tasks: vec![TaskCheckpointEntry { task: TaskId(1), stats: util::stats() }], savepoint: true,
        }],
        streams: vec![StreamHealth {
            stream: StreamId(1), healthy: false, consecutive_failures: 4, committed: 10, failed: 6,
            not_started: 2, interval_ms: 1_000, cause: "no checkpoint could start: reserving ids in rsync://h/m: denied".into(),
        }],
        incarnation: 3,
        restarts: vec![RestartInfo { at_ms: 17, incarnation: 3, reason: "node 2 lost".into() }],
        stream: Some(StreamInfo {
            stream: StreamId(2), name: "ingest".into(), ingest: true, partitions: 3, aggs: 3, sinks: 3, first_agg_task: 3,
            window_ms: 1000, slide_ms: 1000, watermark_delay_ms: 0,
        }),
        peers: vec![PeerLink { node: NodeId(2), up: false, since_ms: 17, reason: "reset".into() }],
        restarting: true,
        idle: true,
        paused: true,
        member: Some(MemberInfo {
            leader: NodeId(2), lease_left_ms: 2_400, placement: 3, elections: 1, lease_losses: 2, fenced_writes: 1,
            error: "keep-alive failed".into(), withheld: true, unreachable: vec![NodeId(1), NodeId(3)],
            in_sync: vec![InSyncEntry { partition: 2, primary: NodeId(3), follower: NodeId(1), in_sync: true }],
            in_sync_age_ms: 1_200,
        }),
        logs: vec![LogStatus {
            partition: 2, source: true, first: Version(4_800), end: Version(9_000), readable: Version(8_800),
            bytes: 5 << 20, follower: NodeId(3), in_sync: 4,
        }],
    };
}

#[test]
fn received_batch_is_read_in_place_without_copying_columns() {
    let bytes = encode(&util::data(1, 4096));
    let frame = decode_one(&bytes, MAX).unwrap();
    let data = frame.access::<Data>().unwrap();
    let payload = {
        let AnyMessage::Data(d) = frame.message().unwrap() else { panic!("data") };
        d as *const _ as usize
    };
    // The columns live inside the frame's own payload buffer: nothing was copied out.
    let start = payload - frame.payload_len();
    let end = payload + 64;
    for col in [
        data.batch.ts_column().as_ptr() as usize,
        data.batch.key_column().as_ptr() as usize,
        data.batch.value_column().as_ptr() as usize,
    ] {
        assert!(col >= start && col < end, "column outside the payload buffer");
    }
    assert_eq!(data.batch.len(), 4096);
    assert_eq!(data.batch.row(10), util::batch(4096).rows().nth(10).unwrap());
}

#[test]
fn wrong_kind_is_refused() {
    let frame = decode_one(&encode(&util::trigger()), MAX).unwrap();
    assert!(matches!(
        frame.access::<Data>(),
        Err(FrameError::WrongKind { expected: Kind::Data, found: Kind::CheckpointTrigger })
    ));
}

#[test]
fn every_single_bit_flip_is_rejected() {
    let bytes = encode(&util::trigger());
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(decode_one(&b, MAX).is_err(), "flip of bit {bit} went unnoticed");
    }
}

#[test]
fn every_truncation_is_incomplete_not_a_frame() {
    let bytes = encode(&util::data(1, 100));
    for len in 0..bytes.len() {
        let mut d = FrameDecoder::new(MAX);
        d.feed(&bytes[..len]);
        assert!(d.next_frame().unwrap().is_none(), "prefix of {len} bytes produced a frame");
        assert!(matches!(decode_one(&bytes[..len], MAX), Err(FrameError::Truncated { .. })));
    }
}

#[test]
fn oversized_length_is_refused_from_the_header_alone() {
    let mut bytes = encode(&util::trigger());
    bytes[8..12].copy_from_slice(&(2u32 << 30).to_le_bytes());
    let mut d = FrameDecoder::new(MAX);
    d.feed(&bytes[..HEADER_LEN]);
    assert!(matches!(d.next_frame(), Err(FrameError::TooLarge { len, max: MAX }) if len == 2 << 30));
    // A smaller configured maximum applies too.
    let big = encode(&util::data(1, 4096));
    assert!(matches!(decode_one(&big, 1024), Err(FrameError::TooLarge { .. })));
    assert!(matches!(
        FrameEncoder::new().max_frame(1024).encode(&util::data(1, 4096)),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn wrong_magic_is_refused() {
    let mut bytes = encode(&util::trigger());
    bytes[0..4].copy_from_slice(b"HTTP");
    assert!(matches!(decode_one(&bytes, MAX), Err(FrameError::BadMagic { found }) if &found == b"HTTP"));
}

#[test]
fn wrong_version_is_refused() {
    let mut bytes = encode(&util::trigger());
    bytes[4] = PROTOCOL_VERSION + 1;
    assert!(matches!(
        decode_one(&bytes, MAX),
        Err(FrameError::UnsupportedVersion { found, supported: PROTOCOL_VERSION }) if found == PROTOCOL_VERSION + 1
    ));
}

#[test]
fn unknown_kind_and_flags_are_refused() {
    let mut bytes = encode(&util::trigger());
    bytes[5] = 0xEE;
    assert!(matches!(decode_one(&bytes, MAX), Err(FrameError::UnknownKind { kind: 0xEE })));
    let mut bytes = encode(&util::trigger());
    bytes[6] = 1;
    assert!(matches!(decode_one(&bytes, MAX), Err(FrameError::UnknownFlags { flags: 1 })));
}

#[test]
fn valid_checksum_over_invalid_payload_fails_validation() {
    // Out-of-range relative pointers: a Data archive whose vectors point outside the buffer.
    let mut payload = FrameEncoder::new().encode(&util::data(1, 8)).unwrap().as_bytes()[HEADER_LEN..].to_vec();
    let n = payload.len();
    for b in &mut payload[n - 40..n - 8] {
        *b = 0xFF;
    }
    let frame = decode_one(&util::forge(Kind::Data, &payload), MAX).expect("header and checksum are fine");
    assert!(matches!(frame.access::<Data>(), Err(FrameError::Invalid { kind: Kind::Data, .. })));
    assert!(frame.message().is_err());
    // An invalid enum discriminant.
    let mut close =
        FrameEncoder::new().encode(&Close { code: CloseCode::Shutdown, message: String::new() }).unwrap().as_bytes()
            [HEADER_LEN..]
            .to_vec();
    // The root object sits at the end; its first field is the discriminant of `code`.
    let root = close.len() - std::mem::size_of::<ArchivedClose>();
    close[root] = 0xEE;
    let frame = decode_one(&util::forge(Kind::Close, &close), MAX).unwrap();
    assert!(frame.message().is_err());
    // Too short for the root object.
    let frame = decode_one(&util::forge(Kind::CheckpointTrigger, &[0u8; 3]), MAX).unwrap();
    assert!(frame.access::<CheckpointTrigger>().is_err());
}

#[test]
fn batch_with_columns_of_different_length_fails_validation() {
    let mut d = util::data(1, 10);
    d.batch.value.pop();
    let frame = decode_one(&encode(&d), MAX).unwrap();
    match frame.access::<Data>() {
        Err(FrameError::Invalid { reason, .. }) => assert!(reason.contains("differ in length"), "{reason}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn many_frames_decode_identically_byte_at_a_time_and_whole() {
    let mut enc = FrameEncoder::new();
    let mut stream = Vec::new();
    for i in 0..50 {
        stream.extend_from_slice(enc.encode(&util::data(i, (i as usize * 37) % 300)).unwrap().as_bytes());
        stream.extend_from_slice(enc.encode(&util::trigger()).unwrap().as_bytes());
    }
    let whole = {
        let mut d = FrameDecoder::new(MAX);
        d.feed(&stream);
        std::iter::from_fn(|| d.next_frame().unwrap()).map(|f| f.to_owned_any()).collect::<Vec<_>>()
    };
    let mut d = FrameDecoder::new(MAX);
    let mut single = Vec::new();
    for b in &stream {
        d.feed(std::slice::from_ref(b));
        while let Some(f) = d.next_frame().unwrap() {
            single.push(f.to_owned_any());
        }
    }
    assert_eq!(whole.len(), 100);
    assert_eq!(whole, single);
}

/// Owned comparison form of a decoded frame, for equality checks in tests.
trait ToOwnedAny {
    fn to_owned_any(&self) -> (Kind, Option<Data>, Option<CheckpointTrigger>);
}

impl ToOwnedAny for Frame {
    fn to_owned_any(&self) -> (Kind, Option<Data>, Option<CheckpointTrigger>) {
        (self.kind(), self.to_owned::<Data>().ok(), self.to_owned::<CheckpointTrigger>().ok())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_batches_roundtrip(rows in prop::collection::vec((any::<i64>(), any::<u64>(), any::<f64>()), 0..3000)) {
        let mut b = Batch::with_capacity(rows.len());
        for (t, k, v) in &rows {
            b.push(*t, *k, *v);
        }
        let d = Data { stream: StreamId(9), epoch: Epoch(0), from: TaskId(1), to: TaskId(2), seq: Seq(3), batch: b.clone() };
        let frame = decode_one(&encode(&d), MAX).unwrap();
        let a = frame.access::<Data>().unwrap();
        prop_assert_eq!(a.batch.len(), rows.len());
        for (i, r) in a.batch.rows().enumerate() {
            prop_assert_eq!(r.ts, rows[i].0);
            prop_assert_eq!(r.key, rows[i].1);
            prop_assert_eq!(r.value.to_bits(), rows[i].2.to_bits());
        }
        let back = frame.to_owned::<Data>().unwrap();
        prop_assert_eq!(back.batch.ts, b.ts);
    }

    #[test]
    fn random_splits_give_the_same_frames(cuts in prop::collection::vec(1usize..500, 1..40)) {
        let mut enc = FrameEncoder::new();
        let mut stream = Vec::new();
        for i in 0..8 {
            stream.extend_from_slice(enc.encode(&util::data(i, 50 * i as usize)).unwrap().as_bytes());
        }
        let mut d = FrameDecoder::new(MAX);
        let mut seqs = Vec::new();
        let mut pos = 0;
        let mut ci = 0;
        while pos < stream.len() {
            let n = cuts[ci % cuts.len()].min(stream.len() - pos);
            d.feed(&stream[pos..pos + n]);
            pos += n;
            ci += 1;
            while let Some(f) = d.next_frame().unwrap() {
                seqs.push(f.access::<Data>().unwrap().seq.get().0);
            }
        }
        prop_assert_eq!(seqs, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_declared_length_costs_only_the_bytes_that_arrive(len in 0u32..(16 << 20), sent in 0usize..300_000, step in 1usize..70_000) {
        let mut header = util::forge(Kind::Data, &[])[..HEADER_LEN].to_vec();
        header[8..12].copy_from_slice(&len.to_le_bytes());
        let mut d = FrameDecoder::new(16 << 20);
        d.feed(&header);
        prop_assert!(d.next_frame().unwrap().is_none() || len == 0);
        let sent = sent.min(len as usize);
        let chunk = vec![0u8; step];
        let mut fed = 0;
        // In pieces, through both ways in by turns: `feed` and `read_from`.
        for turn in 0.. {
            if fed >= sent {
                break;
            }
            let n = step.min(sent - fed);
            if turn % 2 == 0 {
                d.feed(&chunk[..n]);
            } else {
                let mut r: &[u8] = &chunk[..n];
                while !r.is_empty() && d.read_from(&mut r).unwrap() > 0 {}
            }
            fed += n;
            let _ = d.next_frame();
            prop_assert!(d.pending_capacity() <= (4 * fed).max(64 << 10), "{} bytes held for {}", d.pending_capacity(), fed);
        }
    }

    #[test]
    fn random_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut d = FrameDecoder::new(1 << 16);
        d.feed(&bytes);
        while let Ok(Some(f)) = d.next_frame() {
            let _ = f.message();
        }
    }

    #[test]
    fn random_payloads_with_valid_checksums_never_panic(kind_idx in 0usize..64, payload in prop::collection::vec(any::<u8>(), 0..512)) {
        let kind = Kind::ALL[kind_idx % Kind::ALL.len()];
        let frame = decode_one(&util::forge(kind, &payload), MAX).unwrap();
        if let Ok(m) = frame.message() {
            prop_assert_eq!(m.kind(), kind);
        }
    }

    #[test]
    fn random_corruption_of_a_valid_stream_never_panics(pos in 0usize..2000, val in any::<u8>()) {
        let bytes = encode(&util::data(3, 60));
        let mut b = bytes.clone();
        let p = pos % b.len();
        b[p] = val;
        match decode_one(&b, MAX) {
            Ok(f) => {
                // Only an unchanged byte can yield a frame, and it must equal the original.
                prop_assert_eq!(b, bytes);
                prop_assert!(f.access::<Data>().is_ok());
            }
            Err(_) => prop_assert_ne!(b, bytes),
        }
    }
}
