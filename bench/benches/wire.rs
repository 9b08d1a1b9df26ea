//! Wire benchmarks: encode and validate+access of frames, loopback round trip against a plain TCP
//! ping-pong, and batch throughput over loopback. Results and the command are in docs/benchmarks.md.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use weir_bench::{BATCH_ROWS, data, echo, plain_tcp_echo, transport_pair, trigger};
use weir_wire::frame::decode_one;
use weir_wire::msg::{CheckpointTrigger, Data};
use weir_wire::transport::Event;
use weir_wire::{BufferPool, FrameEncoder, NodeId};

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    let mut enc = FrameEncoder::with_pool(BufferPool::default());
    let trig = trigger(1);
    let batch = data(1, BATCH_ROWS);
    g.bench_function("encode_trigger", |b| b.iter(|| enc.encode(std::hint::black_box(&trig)).unwrap()));
    g.throughput(Throughput::Bytes(batch.batch.column_bytes() as u64));
    g.bench_function("encode_batch_4096", |b| b.iter(|| enc.encode(std::hint::black_box(&batch)).unwrap()));
    g.throughput(Throughput::Elements(1));
    let tf = decode_one(enc.encode(&trig).unwrap().as_bytes(), 1 << 24).unwrap();
    let bf = decode_one(enc.encode(&batch).unwrap().as_bytes(), 1 << 24).unwrap();
    g.bench_function("validate_access_trigger", |b| {
        b.iter(|| std::hint::black_box(&tf).access::<CheckpointTrigger>().unwrap().seq.get())
    });
    g.bench_function("validate_access_batch_4096", |b| {
        b.iter(|| std::hint::black_box(&bf).access::<Data>().unwrap().batch.len())
    });
    g.bench_function("decode_batch_4096_from_bytes", |b| {
        let bytes = enc.encode(&batch).unwrap();
        b.iter(|| decode_one(std::hint::black_box(bytes.as_bytes()), 1 << 24).unwrap().payload_len())
    });
    g.finish();
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_rtt");
    g.measurement_time(Duration::from_secs(5));
    let mut enc = FrameEncoder::with_pool(BufferPool::default());
    let size = enc.encode(&trigger(0)).unwrap().len();

    let (a, b) = transport_pair();
    let responder = echo(b);
    let mut tx = a.sender();
    g.bench_function("transport_trigger", |bch| {
        bch.iter(|| {
            tx.send_timeout(NodeId(2), enc.encode(&trigger(1)).unwrap(), Duration::from_secs(5)).unwrap();
            loop {
                if let Event::Frame { frame, .. } = a.events().recv_timeout(Duration::from_secs(5)).unwrap() {
                    break frame.access::<CheckpointTrigger>().unwrap().seq.get();
                }
            }
        })
    });
    drop(a);
    drop(responder.join());

    let (mut sock, server) = plain_tcp_echo(size);
    let msg = enc.encode(&trigger(1)).unwrap();
    let mut buf = vec![0u8; size];
    g.bench_function("plain_tcp_same_size", |bch| {
        bch.iter(|| {
            sock.write_all(msg.as_bytes()).unwrap();
            sock.read_exact(&mut buf).unwrap();
        })
    });
    drop(sock);
    server.join().unwrap();
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_throughput");
    g.measurement_time(Duration::from_secs(8));
    let (a, b) = transport_pair();
    let frame_len = FrameEncoder::new().encode(&data(0, BATCH_ROWS)).unwrap().len();
    g.throughput(Throughput::Bytes(frame_len as u64));
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let consumer = std::thread::spawn(move || {
        while let Ok(ev) = a.events().recv_timeout(Duration::from_secs(30)) {
            if let Event::PeerDown { .. } = ev {
                break;
            }
            if let Event::Frame { frame, .. } = ev {
                // The receiver validates and reads the batch in place, as the engine will.
                let d = frame.access::<Data>().unwrap();
                std::hint::black_box(d.batch.key_column()[d.batch.len() - 1]);
                counter.fetch_add(1, Ordering::Release);
            }
        }
        a
    });
    let mut tx = b.sender();
    let mut enc = FrameEncoder::with_pool(BufferPool::default());
    let batch = data(1, BATCH_ROWS);
    g.bench_function("batch_4096_frames", |bch| {
        bch.iter_custom(|iters| {
            let start_count = received.load(Ordering::Acquire);
            let t0 = Instant::now();
            for _ in 0..iters {
                tx.send_timeout(NodeId(1), enc.encode(&batch).unwrap(), Duration::from_secs(10)).unwrap();
            }
            while received.load(Ordering::Acquire) < start_count + iters {
                std::thread::yield_now();
            }
            t0.elapsed()
        })
    });
    drop(b);
    drop(consumer.join());
    g.finish();
}

criterion_group!(benches, codec, round_trip, throughput);
criterion_main!(benches);
