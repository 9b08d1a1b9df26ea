//! The benchmark job on timely-dataflow, the yardstick of the key-count benchmarks: what the same job costs on an
//! engine that keeps no state durable at all.
//!
//! The job, as Weir runs it in `weir-e2e keys`: two workers (threads of one process), each a
//! generator partition producing Weir's own generator rows (`operator::generator`, the same
//! `(seed, partition, offset)` function, 10,000 rows per millisecond of event time), exchanged by
//! key to a tumbling event-time window operator that keeps count, sum, min and max per (window,
//! key) in hash maps and emits a window's results once the input frontier passes its end, into a
//! sink that only counts them. Sums are `f64` (Weir's are exact fixed point); nothing is
//! checkpointed.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Capability, Inspect, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use weir_engine::operator::generator::{Generator, GeneratorSpec};

/// What a run did.
#[derive(Clone, Copy, Debug)]
pub struct TimelyRun {
    /// Rows the window operators aggregated.
    pub events: u64,
    /// Window results the sinks counted.
    pub results: u64,
    /// From the start of generation to the end of the drain.
    pub secs: f64,
}

impl TimelyRun {
    /// Events per second.
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

#[derive(Clone, Copy)]
struct Acc {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

/// A row as the job sends it: (key, event time in ms, value).
type Row = (u64, u64, f64);

/// Rows a worker sends per step: one millisecond of its partition's event time.
const ROWS_PER_MS: u64 = 10_000;

/// Runs the job with `keys` keys and `window_ms` windows on `workers` threads for `seconds`, then
/// drains what is in flight.
pub fn run(keys: u64, window_ms: u64, workers: usize, seconds: f64) -> TimelyRun {
    let events = Arc::new(AtomicU64::new(0));
    let results = Arc::new(AtomicU64::new(0));
    let (e, r) = (events.clone(), results.clone());
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(seconds);
    let config = timely::Config::process(workers);
    timely::execute(config, move |worker| {
        let index = worker.index();
        let spec = GeneratorSpec { keys, rows_per_ms: ROWS_PER_MS, ..GeneratorSpec::default() };
        let generator = Generator::new(spec, index as u32);
        let ts0 = spec.ts_start as u64;
        let mut input: InputHandle<u64, CapacityContainerBuilder<Vec<Row>>> = InputHandle::new();
        let probe = ProbeHandle::new();
        let (aggregated, counted) = (Rc::new(Cell::new(0u64)), Rc::new(Cell::new(0u64)));
        let (agg2, cnt2) = (aggregated.clone(), counted.clone());
        worker.dataflow::<u64, _, _>(|scope| {
            input
                .to_stream(scope)
                .unary_frontier(Exchange::new(|r: &Row| r.0), "Window", move |_cap, _info| {
                    let mut windows: BTreeMap<u64, (Capability<u64>, FxHashMap<u64, Acc>)> = BTreeMap::new();
                    move |(input, frontier), output| {
                        input.for_each(|cap, data| {
                            let Some(cap) = cap.retain_least(output.output_index()) else { return };
                            agg2.set(agg2.get() + data.len() as u64);
                            // Rows come in event-time order: one window lookup per run of rows.
                            let mut rows = data.iter().peekable();
                            while let Some(&&(_, ts, _)) = rows.peek() {
                                let start = ts - ts % window_ms;
                                let (_, state) = windows
                                    .entry(start)
                                    .or_insert_with(|| (cap.delayed(&start.max(*cap.time())), FxHashMap::default()));
                                while let Some(&(key, _, v)) = rows.next_if(|r| r.1 - r.1 % window_ms == start) {
                                    let a = state.entry(key).or_insert(Acc {
                                        count: 0,
                                        sum: 0.0,
                                        min: f64::INFINITY,
                                        max: f64::NEG_INFINITY,
                                    });
                                    a.count += 1;
                                    a.sum += v;
                                    a.min = a.min.min(v);
                                    a.max = a.max.max(v);
                                }
                            }
                        });
                        // Windows the frontier has passed fire, oldest first.
                        while let Some((&start, _)) = windows.first_key_value() {
                            if frontier.less_equal(&(start + window_ms)) {
                                break;
                            }
                            let (_, (cap, state)) = windows.pop_first().expect("a window");
                            let mut session = output.session(&cap);
                            for (key, a) in state {
                                session.give((key, start, a.count, a.sum, a.min, a.max));
                            }
                        }
                    }
                })
                .container::<Vec<_>>()
                .inspect(move |_| cnt2.set(cnt2.get() + 1))
                .probe_with(&probe);
        });
        let mut offset = 0u64;
        let mut batch = Vec::with_capacity(ROWS_PER_MS as usize);
        input.advance_to(ts0);
        while Instant::now() < until {
            for o in offset..offset + ROWS_PER_MS {
                let (ts, key, v) = generator.row(o);
                batch.push((key, ts as u64, v));
            }
            offset += ROWS_PER_MS;
            input.send_batch(&mut batch);
            batch.clear();
            input.advance_to(ts0 + offset / ROWS_PER_MS);
            // The output frontier trails the input by the open window (its results wait for its
            // end): beyond that, at most 100 ms of event time in flight, or the input waits.
            while probe.less_than(&input.time().saturating_sub(window_ms + 100)) {
                worker.step();
            }
            worker.step();
        }
        drop(input);
        while worker.step() {}
        e.fetch_add(aggregated.get(), Ordering::Relaxed);
        r.fetch_add(counted.get(), Ordering::Relaxed);
    })
    .expect("timely workers");
    TimelyRun {
        events: events.load(Ordering::Relaxed),
        results: results.load(Ordering::Relaxed),
        secs: t0.elapsed().as_secs_f64(),
    }
}
