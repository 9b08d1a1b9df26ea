//! Engine parts: the generator, window aggregation and its fixed-point conversion, the ingest
//! log append path, a window agg's checkpoint (the synchronous freeze of its state, at 10,000
//! and 1,000,000 keys, and the background snapshot write and store, and a state file at a
//! million keys), and a sink's result writes.
//! Results and the command are in docs/benchmarks.md.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use weir_engine::backup::{LocalDirStore, upload_snapshot};
use weir_engine::ingest::{IngestLog, LogConfig};
use weir_engine::operator::generator::{Generator, GeneratorSpec};
use weir_engine::operator::window::WindowResult;
use weir_engine::operator::window::{WindowAgg, WindowSpec};
use weir_engine::spec::shuffle;
use weir_engine::state::{ResultStore, write_window_snapshot, write_window_snapshot_with};
use weir_engine::wire::{Batch, CheckpointId, StreamId, TaskId, Version};

const ROWS: usize = 4096;

fn parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(ROWS as u64));
    let spec = GeneratorSpec { rows_per_ms: 10_000, ..GeneratorSpec::default() };
    let generator = Generator::new(spec, 0);
    let mut offset = 0u64;
    let mut batch = Batch::with_capacity(ROWS);
    g.bench_function("generate_4096_rows", |b| {
        b.iter(|| {
            batch.clear();
            generator.fill(offset, ROWS, &mut batch);
            offset += ROWS as u64;
        })
    });

    let mut outs: Vec<Batch> = (0..2).map(|_| Batch::with_capacity(ROWS)).collect();
    g.bench_function("shuffle_4096_rows_to_2", |b| {
        b.iter(|| {
            outs.iter_mut().for_each(Batch::clear);
            for r in batch.rows() {
                outs[shuffle(r.key, 2)].push(r.ts, r.key, r.value);
            }
        })
    });

    // 10,000 and 1,000,000 keys, 1 s tumbling windows, the watermark following the data: the
    // steady state of the end-to-end benchmark, firing included.
    for (name, keys) in [("window_agg_4096_rows_10k_keys", 10_000), ("window_agg_4096_rows_1m_keys", 1_000_000)] {
        let generator = Generator::new(GeneratorSpec { keys, ..spec }, 0);
        let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
        let mut offset = 0u64;
        let mut fired = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut adder = agg.batch();
                for o in offset..offset + ROWS as u64 {
                    let (t, k, v) = generator.row(o);
                    adder.add(t, k, v);
                }
                drop(adder);
                offset += ROWS as u64;
                agg.advance(0, generator.max_ts_before(offset), |_| fired += 1).unwrap();
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("ingest_log");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.measurement_time(Duration::from_secs(5));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = IngestLog::open(dir.path(), LogConfig::default()).expect("log");
    let mut rows = Batch::with_capacity(ROWS);
    generator.fill(0, ROWS, &mut rows);
    g.bench_function("append_4096_rows_no_sync", |b| b.iter(|| log.append(&rows).expect("append")));
    g.bench_function("append_4096_rows_and_fdatasync", |b| {
        b.iter(|| {
            log.append(&rows).expect("append");
            log.sync().expect("sync")
        })
    });
    g.finish();

    // The agg's part of a checkpoint in the end-to-end job: 10,000 keys in one open window.
    let mut g = c.benchmark_group("checkpoint");
    g.measurement_time(Duration::from_secs(5));
    let mut agg = WindowAgg::new(WindowSpec::tumbling(1_000_000), 0, 1);
    for o in 0..400_000u64 {
        let (t, k, v) = generator.row(o);
        agg.add(t, k, v);
    }
    g.bench_function("freeze_state_10k_keys", |b| freeze_after_writes(b, &mut agg, 10_000));
    let copy = agg.freeze();
    assert_eq!(copy.len(), 10_000);
    let mut big = WindowAgg::new(WindowSpec::tumbling(1_000_000), 0, 1);
    for k in 0..1_000_000u64 {
        big.add(1, k, 1.0);
    }
    g.bench_function("freeze_state_1m_keys", |b| freeze_after_writes(b, &mut big, 1_000_000));
    drop(big);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = LocalDirStore::new(dir.path().join("remote"));
    let mut id = 0u64;
    g.bench_function("write_and_store_snapshot_10k_keys", |b| {
        b.iter(|| {
            id += 1;
            let snap = dir.path().join(format!("chk-{id}"));
            write_window_snapshot(&copy, &snap.join(format!("state-{id:020}.sst"))).expect("write");
            upload_snapshot(&store, StreamId(1), TaskId(2), CheckpointId(id), Version(0), &snap).expect("store")
        })
    });
    g.finish();
}

/// The pause's part of a snapshot: every shard written since the last one (as between two
/// checkpoints of a running job), then frozen. Timed: the freeze alone.
fn freeze_after_writes(b: &mut criterion::Bencher<'_>, agg: &mut WindowAgg, keys: u64) {
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for i in 0..iters {
            for k in 0..4096u64 {
                agg.add(1, (k * 7919 + i) % keys, 1.0);
            }
            let t = Instant::now();
            let frozen = agg.freeze();
            total += t.elapsed();
            drop(frozen);
        }
        total
    })
}

/// A sink's writes: one window over 1,000,000 keys, in messages of 512 results of one window in
/// the agg's order, into a result store, the memtable's flush included: on this machine's disk,
/// and on tmpfs (`/dev/shm`, where it exists), which leaves the write path's own cost.
fn result_writes(c: &mut Criterion) {
    let mut g = c.benchmark_group("results");
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(10);
    const KEYS: u64 = 1_000_000;
    g.throughput(Throughput::Elements(KEYS));
    let mut agg = WindowAgg::new(WindowSpec::tumbling(1000), 0, 1);
    for k in 0..KEYS {
        agg.add(1, k, k as f64 / 7.0);
    }
    let mut window: Vec<WindowResult> = Vec::with_capacity(KEYS as usize);
    agg.advance(0, 10_000, |r| window.push(r)).unwrap();
    // A fresh store per sample, dropped after it: what one run of a sink writes, not gigabytes
    // left behind by the samples before (tmpfs first, before the disk's dirty pages).
    let mut bases = Vec::new();
    if std::path::Path::new("/dev/shm").is_dir() {
        bases.push(("write_1m_results_on_tmpfs", std::path::PathBuf::from("/dev/shm")));
    }
    bases.push(("write_1m_results_on_disk", std::env::temp_dir()));
    for (name, base) in &bases {
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                let dir = tempfile::tempdir_in(base).expect("temp dir");
                let store = ResultStore::open(&dir.path().join("results")).expect("open");
                let t = Instant::now();
                for i in 0..iters {
                    let start = i as i64 * 1000;
                    for m in window.chunks(512) {
                        let m: Vec<WindowResult> = m.iter().map(|r| WindowResult { start, ..*r }).collect();
                        store.upsert(StreamId(1), TaskId(2), &m).expect("write");
                    }
                    store.flush().expect("flush");
                }
                t.elapsed()
            })
        });
    }
    g.finish();
}

/// An agg's background snapshot write at a million keys: the benchmark job's state after 2.5 M
/// generator rows in one window (about 920,000 keys over 1,000,000), written as one state file
/// on tmpfs (where it exists): the encoding and the SST writer's own cost, without the disk.
fn state_writes(c: &mut Criterion) {
    let mut g = c.benchmark_group("checkpoint");
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(10);
    let generator =
        Generator::new(GeneratorSpec { keys: 1_000_000, rows_per_ms: 10_000, ..GeneratorSpec::default() }, 0);
    let mut agg = WindowAgg::new(WindowSpec::tumbling(1_000_000), 0, 1);
    {
        let mut adder = agg.batch();
        for o in 0..2_500_000u64 {
            let (t, k, v) = generator.row(o);
            adder.add(t, k, v);
        }
    }
    let frozen = agg.freeze();
    g.throughput(Throughput::Elements(agg.state_len() as u64));
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let dir = tempfile::tempdir_in(base).expect("temp dir");
    let mut n = 0u64;
    // LZ4 as a chain's full file tries it; uncompressed as its deltas go when that did not shrink.
    for (name, lz4) in
        [("write_state_file_1m_keys_on_tmpfs", true), ("write_state_file_1m_keys_on_tmpfs_uncompressed", false)]
    {
        g.bench_function(name, |b| {
            b.iter(|| {
                n += 1;
                let path = dir.path().join(format!("state-{n}.sst"));
                let size = write_window_snapshot_with(&frozen, &path, lz4).expect("write");
                std::fs::remove_file(&path).expect("remove");
                size
            })
        });
    }
    g.finish();
}

/// Values to the agg's fixed point (`to_fixed`, on every row a window sums) at three magnitudes:
/// the generator's (below 1,000), counters of millions to billions, and 10^12 to 10^15 (bytes,
/// microsecond timestamps).
fn fixed_point(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(ROWS as u64));
    for (name, scale) in [("small", 1e3), ("millions", 1e9), ("1e15", 1e15)] {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let values: Vec<f64> = (0..ROWS)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 53) as f64 * scale
            })
            .collect();
        g.bench_function(format!("to_fixed_4096_values_{name}"), |b| {
            b.iter(|| values.iter().fold(0i128, |s, v| s.wrapping_add(weir_engine::operator::window::to_fixed(*v))))
        });
    }
    g.finish();
}

criterion_group!(benches, parts, result_writes, state_writes, fixed_point);
criterion_main!(benches);
