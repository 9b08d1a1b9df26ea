//! One node's share of a load: the partitions whose source runs on it, on one connection, with
//! a bounded number of batches in flight.
//!
//! A batch is (partition, sequence number); its rows are a pure function of the load's
//! parameters and the batch, so a batch sent again is the same batch. Batches stay in flight
//! until the node acknowledges them as durable: a lost connection, a refusal that may succeed
//! later (a full queue, a restarting node) or a gap behind a batch not acknowledged yet puts
//! them back to be sent again, in order (on the same connection, or the next). The node stores each batch once (appends are
//! idempotent per producer and partition), so the load ends with exactly its rows, each once.
//!
//! Invariants: per partition, batches are sent in sequence order on a connection; an entry of
//! `flight` is either on the current connection (`request` set) or waiting to be sent again.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use weir_engine::operator::generator::Generator;
use weir_engine::wire::msg::{Ingest, IngestAck, IngestOutcome};
use weir_engine::wire::transport::client::{ClientError, ClientWriter};
use weir_engine::wire::{Batch, Kind};

use super::Plan;
use crate::client::Target;

/// What the drivers tell the main thread.
pub enum Report {
    /// Batch `seq` of `partition` is durable: its rows, its latency from its scheduled send
    /// time, when its ack came.
    Acked { partition: u32, seq: u64, rows: u64, latency: Duration, at: Instant },
    /// A driver finished: every batch of its partitions durable (`Ok`), or why not.
    Done { node: SocketAddr, result: Result<Vec<Acked>, String> },
}

/// What one partition ended with.
pub struct Acked {
    pub partition: u32,
    /// Rows acknowledged.
    pub rows: u64,
    /// The versions they were stored from and to: `first..=last`, ascending.
    pub versions: Option<(u64, u64)>,
}

/// Counters the progress line shows.
#[derive(Default)]
pub struct Counters {
    pub sent_rows: AtomicU64,
    pub sent_bytes: AtomicU64,
    pub retries: AtomicU64,
    pub duplicates: AtomicU64,
    pub reconnects: AtomicU64,
}

struct Flight {
    scheduled: Instant,
    /// The request it went out as on the current connection; `None`: to be sent (again).
    request: Option<u64>,
    /// Not before this (after a refusal that may succeed later).
    not_before: Instant,
    /// The partition's end-of-load marker (no rows), not a batch.
    marker: bool,
    /// When it went out as `request`.
    sent: Instant,
}

/// One node's share of the load.
pub struct Driver {
    pub node: SocketAddr,
    pub partitions: Vec<u32>,
    pub plan: Arc<Plan>,
    pub target: Arc<Target>,
    pub counters: Arc<Counters>,
    pub reports: Sender<Report>,
    pub stop: Arc<AtomicBool>,
}

/// A node that has been unreachable this long is asked about again: its partitions may have
/// moved (their sources to the node keeping their logs' copies).
const REROUTE_AFTER: Duration = Duration::from_secs(1);

/// Batches a partition sends in total (`None`: until the duration ends).
fn batches_of(plan: &Plan, p: u32) -> Option<u64> {
    plan.rows_of(p).map(|rows| rows.div_ceil(plan.batch as u64))
}

impl Driver {
    /// Runs the share on its own thread.
    pub fn spawn(self) -> JoinHandle<()> {
        std::thread::Builder::new()
            .name(format!("weir-load-{}", self.node))
            .spawn(move || {
                let node = self.node;
                let reports = self.reports.clone();
                let result = self.run();
                let _ = reports.send(Report::Done { node, result });
            })
            .expect("spawn a load driver")
    }

    fn run(self) -> Result<Vec<Acked>, String> {
        let plan = &*self.plan;
        let m = self.partitions.len() as u64;
        // This node's share of the rate: batches are scheduled round robin over its partitions.
        let gap = plan
            .rate
            .map(|r| Duration::from_secs_f64(plan.batch as f64 * plan.partitions as f64 / (r as f64 * m as f64)));
        let mut flight: BTreeMap<(u32, u64), Flight> = BTreeMap::new();
        let mut requests: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut next_request = 1u64;
        // The k-th batch of the share goes to partition k % m, as its batch k / m.
        let mut k = 0u64;
        let mut done_scheduling = false;
        let mut marked = false;
        // Batches of partition `p` scheduled once `k` batches of the share were.
        let index: HashMap<u32, u64> = self.partitions.iter().enumerate().map(|(i, &p)| (p, i as u64)).collect();
        let scheduled_of = |p: u32, k: u64| {
            let i = index[&p];
            let n = k / m + u64::from(k % m > i);
            batches_of(plan, p).map_or(n, |total| n.min(total))
        };
        let mut acked: BTreeMap<u32, Acked> =
            self.partitions.iter().map(|&p| (p, Acked { partition: p, rows: 0, versions: None })).collect();
        let mut order: BTreeMap<u32, super::order::Order> = BTreeMap::new();
        let mut conn: Option<(ClientWriter, Receiver<Result<IngestAck, String>>)> = None;
        let mut down_since: Option<Instant> = None;
        // The last batch acknowledged (or the start): a node that takes connections and answers
        // nothing ends the load after its timeout, as one that refuses them does.
        let mut progress = Instant::now();
        // The node the partitions are sent to: where their sources run, which changes when a
        // lost node's sources move to the node keeping their logs' copies.
        let mut node = self.node;
        let mut asked_owners: Option<Instant> = None;
        let mut moved = false;
        let mut batch = Batch::with_capacity(plan.batch);
        loop {
            let now = Instant::now();
            if self.stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            // Stop scheduling at the end of the duration or of every partition's batches.
            while !done_scheduling {
                let (p, seq) = (self.partitions[(k % m) as usize], k / m);
                let scheduled = match gap {
                    Some(g) => plan.start + g.mul_f64(k as f64),
                    None => now,
                };
                let past_end = plan.duration.is_some_and(|d| scheduled >= plan.start + d);
                let all_sent = self.partitions.iter().all(|&q| batches_of(plan, q).is_some_and(|n| k / m >= n));
                if past_end || all_sent {
                    done_scheduling = true;
                    break;
                }
                if batches_of(plan, p).is_some_and(|n| seq >= n) {
                    k += 1; // this partition has sent all it has
                    continue;
                }
                if scheduled > now || flight.len() >= plan.in_flight {
                    break;
                }
                flight.insert((p, seq), Flight { scheduled, request: None, not_before: now, marker: false, sent: now });
                k += 1;
            }
            if done_scheduling && flight.is_empty() {
                if !marked {
                    // The load is over: each partition says so with a watermark marker (it takes
                    // the next sequence number's place, and no row), so its last windows close.
                    marked = true;
                    for &p in &self.partitions {
                        let seq = scheduled_of(p, k);
                        flight.insert(
                            (p, seq),
                            Flight { scheduled: now, request: None, not_before: now, marker: true, sent: now },
                        );
                    }
                    continue;
                }
                if let Some((w, _)) = &conn {
                    w.shutdown();
                }
                return Ok(acked.into_values().collect());
            }
            // Partitions that moved (the node said so, or it has been unreachable a while) go to
            // the node their sources run on now, with every batch not yet acknowledged.
            let unreachable = down_since.is_some_and(|d| d.elapsed() >= REROUTE_AFTER);
            if (moved || unreachable) && asked_owners.is_none_or(|t| t.elapsed() >= REROUTE_AFTER) {
                asked_owners = Some(now);
                moved = false;
                if let Some(to) = self.owner_now()?
                    && to != node
                {
                    tracing::info!(from = %node, %to, partitions = ?self.partitions, "partitions moved: sending there");
                    if let Some((w, _)) = conn.take() {
                        w.shutdown();
                    }
                    for f in flight.values_mut() {
                        f.request = None;
                        f.not_before = now;
                    }
                    requests.clear();
                    node = to;
                    down_since = down_since.map(|_| now);
                }
            }
            // Connect (again).
            if conn.is_none() {
                match self.connect(node) {
                    Ok(c) => {
                        if down_since.take().is_some() {
                            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        conn = Some(c);
                    }
                    Err((e, retryable)) => {
                        let since = *down_since.get_or_insert(now);
                        if !retryable || since.elapsed() > plan.timeout {
                            return Err(format!("{node}: {e}"));
                        }
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            }
            // Send what waits, in (partition, sequence) order.
            let (w, acks) = conn.as_mut().expect("connected");
            let mut lost = None;
            // A partition's batches go in sequence order: none passes an earlier one that waits
            // to go again.
            let mut held: Option<u32> = None;
            for (&(p, seq), f) in flight.iter_mut() {
                if held == Some(p) || f.request.is_some() {
                    continue;
                }
                if f.not_before > now {
                    held = Some(p);
                    continue;
                }
                if f.marker {
                    batch.clear();
                } else {
                    fill(plan, p, seq, &mut batch);
                }
                let request = next_request;
                next_request += 1;
                let msg = Ingest {
                    stream: plan.stream,
                    partition: p,
                    request,
                    producer: plan.producer,
                    seq,
                    batch: batch.clone(),
                    idle_watermark_ms: f.marker.then(|| idle_watermark(plan, p, acked[&p].rows)),
                    // The ledger keeps what the rows are a function of (`weir verify` reads it).
                    description: (seq == 0).then(|| plan.description.clone()),
                };
                if let Err(e) = w.send(&msg) {
                    lost = Some(e.to_string());
                    break;
                }
                f.request = Some(request);
                f.sent = now;
                requests.insert(request, (p, seq));
                self.counters.sent_rows.fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.counters.sent_bytes.fetch_add(batch.column_bytes() as u64, Ordering::Relaxed);
            }
            // Acks until the next batch is due (or a little while, with nothing due).
            let due = match (gap, done_scheduling) {
                (Some(g), false) => (plan.start + g.mul_f64(k as f64)).saturating_duration_since(Instant::now()),
                _ => Duration::from_millis(20),
            };
            // An answer the node could not deliver is never sent again: a batch waiting far
            // longer than any node takes to answer means the connection is no use.
            let silent = plan_silence(&self.plan);
            if lost.is_none() && flight.values().any(|f| f.request.is_some() && now.duration_since(f.sent) > silent) {
                let silence = humantime::format_duration(silent);
                if progress.elapsed() > self.plan.timeout {
                    return Err(format!("{node}: no batch acknowledged in {silence}"));
                }
                lost = Some(format!("no answer to a batch in {silence}"));
            }
            let first = match lost {
                Some(e) => Some(Err(e)),
                None => match acks.recv_timeout(due.min(Duration::from_millis(20))) {
                    Ok(a) => Some(a),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Err("connection closed".into())),
                },
            };
            let more = std::iter::from_fn(|| acks.try_recv().ok());
            for ack in first.into_iter().chain(more) {
                let ack = match ack {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::info!(%node, error = %e, "connection lost; batches in flight go again");
                        // In order: a batch refused a moment ago must not wait behind later ones.
                        for f in flight.values_mut() {
                            f.request = None;
                            f.not_before = Instant::now();
                        }
                        requests.clear();
                        conn = None;
                        down_since = Some(Instant::now());
                        break;
                    }
                };
                let Some((p, seq)) = requests.remove(&ack.request) else { continue };
                if flight.get(&(p, seq)).is_some_and(|f| f.marker) {
                    // The marker is a courtesy: a node that refuses it only closes the last
                    // windows later (its own idle timer, when it has one).
                    if !matches!(ack.outcome, IngestOutcome::Marked { .. }) {
                        tracing::warn!(%node, partition = p, outcome = ?ack.outcome, "end-of-load marker not stored");
                    }
                    flight.remove(&(p, seq));
                    continue;
                }
                match ack.outcome {
                    IngestOutcome::Durable { first, last, duplicate } => {
                        progress = Instant::now();
                        let f = flight.remove(&(p, seq)).expect("in flight");
                        let rows = last.0 - first.0 + 1;
                        let a = acked.get_mut(&p).expect("own partition");
                        a.rows += rows;
                        // Batches are stored in sequence order (idle markers or other
                        // producers' rows may sit between them); a new one after every batch
                        // acknowledged before. A batch sent again is acknowledged with its
                        // original versions, maybe after later batches' acks.
                        let o = order.entry(p).or_default();
                        o.acked(seq, first.0, last.0).map_err(|e| format!("partition {p}: {e}"))?;
                        if let Some((lo, hi)) = a.versions
                            && !duplicate
                            && first.0 <= hi
                        {
                            return Err(format!(
                                "partition {p}: new batch {seq} stored at {}..={}, not after {hi} ({lo}..={hi} acknowledged)",
                                first.0, last.0
                            ));
                        }
                        a.versions =
                            Some(a.versions.map_or((first.0, last.0), |(lo, hi)| (lo.min(first.0), hi.max(last.0))));
                        o.forget_below(flight.range((p, 0)..(p, u64::MAX)).next().map_or(seq + 1, |((_, s), _)| *s));
                        if duplicate {
                            self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                        let at = Instant::now();
                        let latency = at.saturating_duration_since(f.scheduled);
                        let _ = self.reports.send(Report::Acked { partition: p, seq, rows, latency, at });
                    }
                    IngestOutcome::Marked { .. } => {
                        return Err(format!("{node} answered batch {seq} as a marker"));
                    }
                    IngestOutcome::NotHere { .. } | IngestOutcome::Rejected { .. } => {
                        let (reason, retryable, here) = match ack.outcome {
                            IngestOutcome::NotHere { reason } => (reason, true, false),
                            IngestOutcome::Rejected { reason, retryable } => (reason, retryable, true),
                            _ => unreachable!("matched above"),
                        };
                        // A refusal behind an earlier batch of the partition not acknowledged yet
                        // (a gap: it goes again, or its answer is on its way) is that batch's
                        // consequence: this one goes again after it.
                        let behind = flight.range((p, 0)..(p, seq)).next().is_some();
                        if !(retryable || behind) {
                            return Err(format!("{node} refused batch {seq} of partition {p}: {reason}"));
                        }
                        moved |= !here;
                        self.counters.retries.fetch_add(1, Ordering::Relaxed);
                        let f = flight.get_mut(&(p, seq)).expect("in flight");
                        f.request = None;
                        f.not_before = Instant::now() + Duration::from_millis(50);
                        tracing::debug!(%node, partition = p, seq, %reason, "batch goes again");
                    }
                }
            }
        }
    }

    /// The one node the driver's partitions' sources run on now, as the nodes say (`None`: not
    /// known yet, e.g. while they restart). Partitions that went to different nodes end the
    /// load: one connection carries them.
    fn owner_now(&self) -> Result<Option<SocketAddr>, String> {
        let (owners, _) = super::owners_now(&self.target, self.plan.stream, self.plan.partitions)
            .map_err(|e| format!("{}: {e:#}", self.node))?;
        let mine: Vec<Option<SocketAddr>> = self.partitions.iter().map(|&p| owners[p as usize]).collect();
        match mine.first().copied().flatten() {
            Some(first) if mine.iter().all(|o| *o == Some(first)) => Ok(Some(first)),
            Some(_) if mine.iter().all(Option::is_some) => Err(format!(
                "partitions {:?} moved to different nodes ({mine:?}): run the load again to send to each",
                self.partitions
            )),
            _ => Ok(None),
        }
    }

    /// An authenticated connection, with a thread that forwards its acknowledgements.
    #[allow(clippy::type_complexity)]
    fn connect(&self, node: SocketAddr) -> Result<(ClientWriter, Receiver<Result<IngestAck, String>>), (String, bool)> {
        let t = &self.target;
        let c = crate::client::connect(t, node, self.plan.ack_timeout).map_err(|e| refused(&e))?;
        let (w, mut r) = c.split().map_err(|e| refused(&e))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name("weir-load-acks".into())
            .spawn(move || {
                loop {
                    let got = r.recv().map_err(|e| e.to_string()).and_then(|f| match f.kind() {
                        Kind::IngestAck => f.to_owned::<IngestAck>().map_err(|e| format!("bad ack: {e}")),
                        k => Err(format!("unexpected {k:?}")),
                    });
                    let end = got.is_err();
                    if tx.send(got).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|e| (e.to_string(), false))?;
        Ok((w, rx))
    }
}

/// A connection's failure, and whether trying again may succeed (a wrong credential never does).
fn refused(e: &ClientError) -> (String, bool) {
    use weir_engine::wire::msg::CloseCode;
    match e {
        ClientError::Handshake { .. } => {
            (format!("{e} ({})", crate::client::refusal_hint(&CloseCode::AuthFailed)), false)
        }
        ClientError::Closed { code: code @ (CloseCode::AuthFailed | CloseCode::Forbidden), .. } => {
            (format!("{e} ({})", crate::client::refusal_hint(code)), false)
        }
        _ => (e.to_string(), true),
    }
}

/// The watermark of partition `p`'s end-of-load marker after its `rows`: past every row the load
/// sent on it and at least the wall clock, rounded up to the end of the last window holding its
/// last row when the load knows the stream's window (`--config`), so that window closes too.
fn idle_watermark(plan: &Plan, p: u32, rows: u64) -> i64 {
    let g = Generator::new(plan.generator, p);
    let wall_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let last = g.max_ts_before(rows);
    let closed = plan.window.map_or(last + 1, |w| w.last_start(last).saturating_add(w.size_ms));
    closed.max(wall_ms)
}

/// The rows of batch `seq` of partition `p`: rows `seq * batch ..` of the partition's generator.
pub fn fill(plan: &Plan, p: u32, seq: u64, out: &mut Batch) {
    out.clear();
    let from = seq * plan.batch as u64;
    let n = plan.rows_of(p).map_or(plan.batch as u64, |total| (total - from).min(plan.batch as u64));
    Generator::new(plan.generator, p).fill(from, n as usize, out);
}

/// How long a batch may wait for its answer before its connection is taken as lost: well
/// beyond what a node takes to acknowledge through a follower that left its in-sync set.
fn plan_silence(plan: &Plan) -> Duration {
    plan.ack_timeout.saturating_mul(3).max(Duration::from_secs(30))
}
