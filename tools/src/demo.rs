//! `weir demo`: the transport on its own, end to end in one process. Two nodes on 127.0.0.1 run
//! the authenticated handshake, node 2 streams batch frames to node 1 (which validates and reads
//! every batch in place), then the two play ping-pong with checkpoint triggers. `weir run` runs the
//! whole engine; this stays as a quick check of a machine's network path.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use weir_wire::msg::{CheckpointTrigger, Data};
use weir_wire::transport::{Event, PeerConfig, Transport, TransportConfig};
use weir_wire::{Batch, BufferPool, CheckpointId, Epoch, FrameEncoder, NodeId, Seq, StreamId, TaskId, TransId};

/// Options of `weir demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Batch frames to stream from node 2 to node 1.
    #[arg(long, default_value_t = 20_000)]
    frames: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 4096)]
    rows: usize,
    /// Trigger round trips to time.
    #[arg(long, default_value_t = 20_000)]
    pings: u64,
}

const WAIT: Duration = Duration::from_secs(10);

fn start_pair() -> anyhow::Result<(Transport, Transport)> {
    let secret = b"weir-demo-secret-not-for-production".to_vec();
    let mut a = TransportConfig::new("weir-demo", NodeId(1), secret.clone());
    a.listen = Some("127.0.0.1:0".parse()?);
    a.peers.push(PeerConfig { node: NodeId(2), addr: None });
    let a = Transport::start(a).context("starting node 1")?;
    let mut b = TransportConfig::new("weir-demo", NodeId(2), secret);
    b.peers.push(PeerConfig { node: NodeId(1), addr: a.local_addr() });
    let b = Transport::start(b).context("starting node 2")?;
    for t in [&a, &b] {
        loop {
            match t.events().recv_timeout(WAIT).context("waiting for the handshake")? {
                Event::PeerUp { node, addr } => {
                    tracing::info!(node = %t.node(), peer = %node, %addr, "handshake done");
                    break;
                }
                Event::Refused { reason, .. } => bail!("handshake refused: {reason}"),
                _ => {}
            }
        }
    }
    Ok((a, b))
}

fn batch(rows: usize, seed: u64) -> Batch {
    let mut b = Batch::with_capacity(rows);
    for i in 0..rows as u64 {
        b.push(1_700_000_000_000 + i as i64, (i * 7919 + seed) % 10_000, i as f64);
    }
    b
}

/// Runs the demo and prints its figures.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let (a, b) = start_pair()?;

    // Throughput: node 2 → node 1.
    let frames = args.frames;
    let rows = args.rows;
    let consumer = std::thread::spawn(move || -> anyhow::Result<(Transport, u64, u64)> {
        let (mut n, mut sum) = (0u64, 0u64);
        while n < frames {
            if let Event::Frame { frame, .. } = a.events().recv_timeout(WAIT).context("receiving batches")? {
                let d = frame.access::<Data>()?;
                if d.seq.get() != Seq(n) {
                    bail!("batch {n} arrived as {}", d.seq.get());
                }
                // Read in place: no copy of the columns.
                sum = sum.wrapping_add(d.batch.key_column().iter().map(|k| k.to_native()).sum::<u64>());
                n += 1;
            }
        }
        Ok((a, n, sum))
    });
    let mut tx = b.sender();
    let mut enc = FrameEncoder::with_pool(BufferPool::default());
    let t0 = Instant::now();
    let mut bytes = 0u64;
    for seq in 0..frames {
        let d = Data {
            stream: StreamId(1),
            epoch: Epoch(0),
            from: TaskId(1),
            to: TaskId(2),
            seq: Seq(seq),
            batch: batch(rows, seq),
        };
        let f = enc.encode(&d)?;
        bytes += f.len() as u64;
        tx.send_timeout(NodeId(1), f, WAIT).map_err(|e| anyhow::anyhow!("sending batch {seq}: {e}"))?;
    }
    let (a, received, _) = consumer.join().map_err(|_| anyhow::anyhow!("consumer panicked"))??;
    let secs = t0.elapsed().as_secs_f64();

    // Round trips: node 1 sends a trigger, node 2 answers with one.
    let echo = std::thread::spawn(move || -> anyhow::Result<Transport> {
        let mut tx = b.sender();
        let mut enc = FrameEncoder::new();
        loop {
            match b.events().recv_timeout(WAIT).context("waiting for pings")? {
                Event::Frame { from, frame } => {
                    let t = frame.to_owned::<CheckpointTrigger>()?;
                    let last = t.checkpoint == CheckpointId(u64::MAX);
                    tx.send_timeout(from, enc.encode(&t)?, WAIT).map_err(|e| anyhow::anyhow!("pong: {e}"))?;
                    if last {
                        return Ok(b);
                    }
                }
                Event::PeerDown { reason, .. } => bail!("peer down: {reason}"),
                _ => {}
            }
        }
    });
    let mut tx = a.sender();
    let mut rtts = Vec::with_capacity(args.pings as usize);
    for i in 0..args.pings.max(1) {
        let last = i + 1 == args.pings.max(1);
        let trig = CheckpointTrigger {
            stream: StreamId(1),
            epoch: Epoch(0),
            checkpoint: if last { CheckpointId(u64::MAX) } else { CheckpointId(i) },
            trans: TransId(1),
            from: TaskId(1),
            to: TaskId(2),
            seq: Seq(i),
            savepoint: false,
        };
        let t = Instant::now();
        tx.send_timeout(NodeId(2), enc.encode(&trig)?, WAIT).map_err(|e| anyhow::anyhow!("ping: {e}"))?;
        loop {
            if let Event::Frame { frame, .. } = a.events().recv_timeout(WAIT).context("waiting for a pong")? {
                frame.access::<CheckpointTrigger>()?;
                break;
            }
        }
        rtts.push(t.elapsed());
    }
    let b = echo.join().map_err(|_| anyhow::anyhow!("echo panicked"))??;
    rtts.sort();
    let pct = |p: f64| rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)];

    let mut out = std::io::stdout().lock();
    writeln!(out, "weir demo: two transports on 127.0.0.1, authenticated handshake done")?;
    writeln!(
        out,
        "  batches : {received} frames x {rows} rows, {:.1} MB in {secs:.2} s = {:.2} GB/s, {:.1} M rows/s",
        bytes as f64 / 1e6,
        bytes as f64 / secs / 1e9,
        (received * rows as u64) as f64 / secs / 1e6
    )?;
    writeln!(
        out,
        "  triggers: {} round trips, p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        rtts.len(),
        pct(0.50).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        rtts.last().map_or(0.0, |d| d.as_secs_f64() * 1e6)
    )?;
    drop((a, b));
    Ok(())
}
