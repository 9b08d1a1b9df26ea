//! `weir load --measure-results`: event-to-result latency, from each event's acknowledgement to
//! the moment its window's results are readable from the nodes.
//!
//! A watcher thread reads every node's result stores every [`POLL`], from a couple of windows
//! before the newest it has seen (blocks sort by window start, so a read starts there:
//! [`weir_engine::state::page_from_window`]), and notes when each window first shows in each
//! store. A window is readable once it shows in every store that holds it: the latest of those
//! times. Each acknowledged batch notes when its ack came and how many of its rows fall in each
//! window (the first window to close that holds the row); at the end every row's latency is
//! its window's readable time less its ack time, into an HdrHistogram (µs). The resolution is
//! the poll interval; the reads cost the nodes a little (a few windows of results per store and
//! poll).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use weir_engine::operator::generator::Generator;
use weir_engine::operator::window::WindowSpec;
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{ResultsReq, ResultsRsp};
use weir_engine::wire::transport::client::BlockingClient;

use super::Plan;
use crate::client::Target;

/// How often the watcher reads the stores.
pub const POLL: Duration = Duration::from_millis(50);

/// When each window showed in each store: (node, store) → window start → first seen.
type Seen = HashMap<(SocketAddr, u32), BTreeMap<i64, Instant>>;

/// The watcher and what the load's batches noted.
pub struct Measure {
    window: WindowSpec,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Per window start: (ack time, rows of the window in that batch).
    acks: BTreeMap<i64, Vec<(Instant, u64)>>,
}

impl Measure {
    /// Starts watching `nodes`' result stores of `stream`.
    pub fn start(target: Arc<Target>, nodes: Vec<SocketAddr>, stream: StreamId, window: WindowSpec) -> Measure {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("weir-load-results".into())
            .spawn(move || watch(&target, &nodes, stream, window, &seen2, &stop2))
            .expect("spawn the results watcher");
        Measure { window, seen, stop, thread: Some(thread), acks: BTreeMap::new() }
    }

    /// The first window to close that holds a row at `ts`.
    fn window_of(&self, ts: i64) -> i64 {
        let w = self.window;
        w.last_start(ts.saturating_sub(w.size_ms)).saturating_add(w.slide_ms)
    }

    /// Batch `seq` of partition `p` (`rows` rows) was acknowledged at `at`.
    pub fn acked(&mut self, plan: &Plan, p: u32, seq: u64, rows: u64, at: Instant) {
        let g = Generator::new(plan.generator, p);
        let from = seq * plan.batch as u64;
        let mut per: BTreeMap<i64, u64> = BTreeMap::new();
        for o in from..from + rows {
            *per.entry(self.window_of(g.row(o).0)).or_default() += 1;
        }
        for (w, n) in per {
            self.acks.entry(w).or_default().push((at, n));
        }
    }

    /// Waits (up to `limit`) until every window the load's rows fall in is readable, then stops
    /// watching; the latency of every row whose window became readable, and how many windows
    /// did not in time.
    pub fn finish(mut self, limit: Duration) -> (Histogram<u64>, usize) {
        let deadline = Instant::now() + limit;
        let wanted: Vec<i64> = self.acks.keys().copied().collect();
        while Instant::now() < deadline && !wanted.iter().all(|w| self.readable(*w).is_some()) {
            std::thread::sleep(POLL);
        }
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        let mut missing = 0;
        for (w, acks) in &self.acks {
            let Some(ready) = self.readable(*w) else {
                missing += 1;
                continue;
            };
            for (at, n) in acks {
                let us = ready.saturating_duration_since(*at).as_micros() as u64;
                h.record_n(us.clamp(1, 3_600_000_000), *n).expect("within bounds");
            }
        }
        (h, missing)
    }

    /// When window `w` showed in every store that holds it (`None`: in none yet).
    fn readable(&self, w: i64) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.values().filter_map(|m| m.get(&w)).max().copied()
    }
}

/// The watcher's loop: every store of every node, from two windows before the newest seen, on a
/// connection per node kept open (opened again after a failure).
fn watch(
    t: &Target,
    nodes: &[SocketAddr],
    stream: StreamId,
    window: WindowSpec,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) {
    let mut newest: Option<i64> = None;
    let mut conns: HashMap<SocketAddr, BlockingClient> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let from = newest.map(|n| n.saturating_sub(2 * window.size_ms.max(window.slide_ms)));
        for &addr in nodes {
            if let Err(e) = read_node(t, &mut conns, addr, stream, from, seen, &mut newest) {
                tracing::debug!(%addr, error = %e, "results watcher: read failed; again next poll");
                conns.remove(&addr);
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Reads `addr`'s stores from window `from` on, noting when each window first showed.
fn read_node(
    t: &Target,
    conns: &mut HashMap<SocketAddr, BlockingClient>,
    addr: SocketAddr,
    stream: StreamId,
    from: Option<i64>,
    seen: &Mutex<Seen>,
    newest: &mut Option<i64>,
) -> Result<(), String> {
    let c = match conns.entry(addr) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(crate::client::connect(t, addr, Duration::from_secs(5)).map_err(|e| e.to_string())?)
        }
    };
    let mut store = 0u32;
    let mut after = from.map(|f| weir_engine::state::page_from_window(stream, f)).unwrap_or_default();
    loop {
        let req =
            ResultsReq { request: 1, stream, store, after: std::mem::take(&mut after), max: crate::results::PAGE };
        c.send(&req).map_err(|e| e.to_string())?;
        let rsp = c.recv().map_err(|e| e.to_string())?.to_owned::<ResultsRsp>().map_err(|e| e.to_string())?;
        if !rsp.error.is_empty() {
            return Err(rsp.error);
        }
        let now = Instant::now();
        {
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            let m = s.entry((addr, store)).or_default();
            for r in &rsp.results {
                m.entry(r.start).or_insert(now);
                *newest = Some(newest.map_or(r.start, |n| n.max(r.start)));
            }
        }
        match rsp.next {
            Some(n) => after = n,
            None if store + 1 < rsp.stores => {
                store += 1;
                after = from.map(|f| weir_engine::state::page_from_window(stream, f)).unwrap_or_default();
            }
            None => return Ok(()),
        }
    }
}
