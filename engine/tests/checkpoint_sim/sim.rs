//! The simulated stream: [`Sim`] holds the world and the drivers, and each step moves rows, delivers
//! a control message, advances the clock or injects a fault.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use weir_engine::backup::Store;
use weir_engine::checkpoint::driver::{CoordDriver, Signal, TaskDriver, UploadRequest};
use weir_engine::checkpoint::{
    CheckpointError, CoordInput, Coordinator, CoordinatorConfig, Role, TaskInput, TaskMachine, TaskSetup, UploadDone,
};
use weir_engine::wire::msg::RestoreBasis;
use weir_engine::wire::{CheckpointId, NodeId, TaskId, Version};

use super::fx::{STREAM, SimCoordFx, SimPort, SimTaskFx, coordinator_start};
use super::store::FaultyStore;
use super::world::{Channel, Ctl, Item, Model, Rng, SimTask, Stats, Topology, World, snapshot_key};
use super::{CAP, READY_RESEND, TRIGGER_TIMEOUT};

pub struct Sim {
    pub w: RefCell<World>,
    pub tasks: Vec<SimTask>,
    pub coord: Option<CoordDriver>,
    pub coord_cfg: CoordinatorConfig,
    /// When a coordinator that is down comes back.
    coord_back_at: u64,
}

/// A driver call for task `t` of the sim: `$body` gets the driver, the port and the effects.
macro_rules! with_task {
    ($sim:expr, $t:expr, |$d:ident, $p:ident, $f:ident| $body:expr) => {{
        let t = $t;
        let w = &$sim.w;
        let $d = &mut $sim.tasks[t].driver;
        let mut $p = SimPort { w, t };
        let mut $f = SimTaskFx { w, t };
        let r: Result<(), CheckpointError> = $body;
        $sim.after_task(t, r);
    }};
}

impl Sim {
    pub fn new(seed: u64) -> Self {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let topo = Topology::random(&mut rng);
        let n = topo.n();
        let id = |i: usize| TaskId(i as u32);
        let setups: Vec<TaskSetup> = (0..n)
            .map(|i| TaskSetup {
                stream: STREAM,
                task: id(i),
                node: topo.node(i),
                role: if i < topo.sources {
                    Role::Source
                } else if i < topo.sources + topo.aggs {
                    Role::Agg
                } else {
                    Role::Sink
                },
                upstreams: topo.upstreams(i).into_iter().map(|u| (id(u), topo.node(u))).collect(),
                downstreams: topo.downstreams(i).into_iter().map(|d| (id(d), topo.node(d))).collect(),
                trigger_timeout_ms: TRIGGER_TIMEOUT,
                ready_resend_ms: READY_RESEND,
                // As the engine's: sinks upsert (see `Item::Row`) and do not hold inputs.
                hold_inputs: i < topo.sources + topo.aggs,
            })
            .collect();
        let mut channels = Vec::new();
        let mut chan_of = BTreeMap::new();
        for i in 0..n {
            for d in topo.downstreams(i) {
                chan_of.insert((i, d), channels.len());
                channels.push(Channel { from: i, to: d, q: VecDeque::new(), sent: 0, expected: 0, stalled_until: 0 });
            }
        }
        let coord_cfg = CoordinatorConfig {
            stream: STREAM,
            tasks: setups.iter().map(|c| (c.task, c.node, c.role)).collect(),
            interval_ms: 300 + rng.below(700),
            min_pause_ms: rng.below(200),
            timeout_ms: 8_000,
            first_delay_ms: rng.below(300),
            tolerable_failures: 3,
            consensus_wait_ms: 1_000,
            store_timeout_ms: 1_500,
        };
        let store = Arc::new(FaultyStore::new(rng.next()));
        store.set_faults(true);
        // Half the seeds keep the commit point and ids in a control store, as a cluster on etcd.
        let control = rng.chance(500).then(|| super::control::Control::new(rng.next()));
        if let Some(c) = &control {
            c.set_faults(true);
        }
        let w = World {
            book: Arc::new(weir_engine::backup::commit_point::StoreCommits::new(STREAM)),
            control,
            rng,
            now: 0,
            faults: true,
            models: Vec::new(),
            closed: Vec::new(),
            cuts: Vec::new(),
            queued_trigger: Vec::new(),
            channels,
            chan_of,
            ctl: Vec::new(),
            uploads: Vec::new(),
            store,
            persisted: vec![None; n],
            results: BTreeMap::new(),
            commits: Vec::new(),
            written: BTreeMap::new(),
            reports: BTreeMap::new(),
            issued: BTreeMap::new(),
            ids_seen: None,
            coord_call: 0,
            coord_incarnation: 0,
            crash_coordinator: false,
            partition_until: None,
            ended: Vec::new(),
            ended_inputs: Default::default(),
            quiet_since: None,
            trace: VecDeque::new(),
            stats: Stats::default(),
            damaged: Default::default(),
            halted: None,
            topo,
            setups,
        };
        let mut sim = Sim { w: RefCell::new(w), tasks: Vec::new(), coord: None, coord_cfg, coord_back_at: 0 };
        sim.restart();
        sim
    }

    pub fn n(&self) -> usize {
        self.w.borrow().topo.n()
    }

    pub fn now(&self) -> u64 {
        self.w.borrow().now
    }

    /// Crash every task, the coordinator and the channels; sometimes the coordinator's commit
    /// records are lost too. Each task restores when the coordinator names its restore point.
    pub fn restart(&mut self) {
        let n = self.n();
        {
            let mut w = self.w.borrow_mut();
            // Not with damage about: lost records and damaged snapshots together can leave no
            // commit to go back to, and the stream rightly halts for good.
            if w.faults && w.damaged.is_empty() && !w.store.keys("1/checkpoints/").is_empty() && w.rng.chance(300) {
                w.store.wipe("1/checkpoints/");
                w.stats.records_lost += 1;
                w.note("commit records lost".into());
            }
            w.models = (0..n).map(|i| w.empty(i)).collect();
            w.closed = w.setups.iter().map(|c| vec![false; c.upstreams.len()]).collect();
            w.cuts = w.setups.iter().map(|c| vec![None; c.upstreams.len()]).collect();
            w.queued_trigger = vec![None; n];
            w.uploads.clear();
            w.ended_inputs.clear();
            for ch in &mut w.channels {
                ch.q.clear();
                ch.sent = 0;
                ch.expected = 0;
                ch.stalled_until = 0;
            }
            // Stale control messages from before the crash stay in flight: the new incarnation
            // must cope with them (store answers belong to the old coordinator and are dropped).
            w.stats.restarts += 1;
            w.note("restart".into());
            w.halted = None;
            w.maybe_damage();
        }
        let (setups, restarts) = (self.w.borrow().setups.clone(), self.w.borrow().stats.restarts);
        self.tasks = setups
            .into_iter()
            .map(|s| SimTask {
                driver: TaskDriver::new(TaskMachine::new(s), restarts),
                finished: false,
                reset_upto: None,
            })
            .collect();
        // As each engine checks before it restores: a node with a damaged task asks to go back.
        let checks = self.w.borrow().node_check();
        for (task, check) in self.tasks.iter_mut().zip(checks) {
            if let Some((id, restorable, reason)) = check {
                task.driver.cannot_restore(id, restorable, reason);
            }
        }
        self.crash_coordinator(0);
    }

    /// Stops the coordinator; it comes back after `down_ms`.
    pub fn crash_coordinator(&mut self, down_ms: u64) {
        self.coord = None;
        let mut w = self.w.borrow_mut();
        w.coord_incarnation += 1;
        w.crash_coordinator = false;
        self.coord_back_at = w.now + down_ms;
    }

    /// Brings the coordinator back if it is due: it reads the last commit and the id record.
    pub fn coordinator_up(&mut self) {
        if self.coord.is_some() || self.now() < self.coord_back_at {
            return;
        }
        {
            // With a control store each run of the coordinator has its own book, fenced by its
            // node's lease and the placement.
            let mut w = self.w.borrow_mut();
            if let Some(book) = w.control.as_mut().map(|c| c.start()) {
                w.book = book;
            }
        }
        let start = coordinator_start(&self.w.borrow());
        let (last, ids) = match start {
            Ok(s) => s,
            Err(e) => {
                let mut w = self.w.borrow_mut();
                w.note(format!("coordinator cannot start: {e}"));
                self.coord_back_at = w.now + 50;
                return;
            }
        };
        self.w
            .borrow_mut()
            .note(format!("coordinator starts: ids {ids:?}, last {:?}", last.as_ref().map(|r| (r.id, r.kind))));
        self.coord = Some(CoordDriver::new(Coordinator::new(self.coord_cfg.clone()), STREAM));
        let now = self.now();
        self.coord_input(CoordInput::Start { now, ids, last_commit: last });
    }

    pub fn coord_input(&mut self, input: CoordInput) {
        let Some(c) = self.coord.as_mut() else { return };
        self.w.borrow_mut().coord_call += 1;
        c.handle(&mut SimCoordFx { w: &self.w }, input);
        if self.w.borrow().crash_coordinator {
            self.w.borrow_mut().stats.coordinator_crashes += 1;
            let d = self.w.borrow_mut().rng.below(500);
            self.crash_coordinator(d);
        }
    }

    pub fn deliver_ctl(&mut self, c: Ctl) {
        match c {
            Ctl::ToCoord(input) => {
                if let (CoordInput::Report { task, report }, Some(c)) = (&input, &self.coord)
                    && c.coordinator().in_flight() == Some(report.id)
                {
                    self.w
                        .borrow_mut()
                        .reports
                        .entry(report.id)
                        .or_default()
                        .insert(task.0 as usize, report.outcome.is_ok());
                }
                self.w.borrow_mut().note(format!("coord <- {input:?}").chars().take(120).collect());
                self.coord_input(input);
            }
            Ctl::StoreDone(n, input) => {
                if n == self.w.borrow().coord_incarnation {
                    self.coord_input(input);
                }
            }
            Ctl::ToTask(t, input) => {
                let ti = t.0 as usize;
                if self.tasks[ti].finished {
                    return;
                }
                if let TaskInput::Reset { failed, .. } = input {
                    let r = &mut self.tasks[ti].reset_upto;
                    *r = Some(r.map_or(failed, |x| x.max(failed)));
                }
                self.w.borrow_mut().note(format!("t{ti} <- {input:?}").chars().take(120).collect());
                let m = self.tasks[ti].driver.machine();
                let before = (m.discarded, m.injected);
                with_task!(self, ti, |d, p, f| d.handle(&mut p, &mut f, input));
                let m = self.tasks[ti].driver.machine();
                let mut w = self.w.borrow_mut();
                w.stats.discarded += m.discarded - before.0;
                w.stats.injected += m.injected - before.1;
            }
            Ctl::Restore(t, point, basis, request) => {
                let ti = t.0 as usize;
                if self.tasks[ti].finished {
                    return;
                }
                let waiting = self.tasks[ti].driver.uninit();
                with_task!(self, ti, |d, p, f| d.restore(&mut p, &mut f, point, basis.clone(), Some(request)));
                if waiting && !self.tasks[ti].driver.uninit() && point.is_some() && basis == RestoreBasis::Consensus {
                    self.w.borrow_mut().stats.consensus_restores += 1;
                }
            }
        }
    }

    pub fn source_step(&mut self, s: usize) {
        if self.tasks[s].finished || self.tasks[s].driver.uninit() {
            return;
        }
        let queued = self.w.borrow_mut().queued_trigger[s].take();
        if let Some(id) = queued {
            let offset = Version(self.w.borrow().models[s].emitted);
            with_task!(self, s, |d, p, f| d.signal(&mut p, &mut f, Signal::ReachedTrigger { id, offset }));
            return;
        }
        let mut w = self.w.borrow_mut();
        let downs = w.topo.downstreams(s);
        if downs.iter().any(|d| w.channels[w.chan_of[&(s, *d)]].q.len() >= CAP) {
            return; // back-pressure
        }
        if w.models[s].emitted >= w.topo.limit {
            for d in downs {
                w.push(s, d, Item::End);
            }
            drop(w);
            self.tasks[s].finished = true;
            return;
        }
        for _ in 0..1 + w.rng.below(4) {
            let o = w.models[s].emitted;
            if o >= w.topo.limit {
                break;
            }
            let a = w.topo.sources + w.topo.agg_of(s, o);
            w.push(s, a, Item::Row { s, o, v: 0 });
            w.models[s].emitted += 1;
        }
    }

    /// Moves the front item of channel `ci`, with data faults on channels between nodes.
    pub fn deliver_data(&mut self, ci: usize) {
        let (from, to) = (self.w.borrow().channels[ci].from, self.w.borrow().channels[ci].to);
        if self.tasks[to].finished || self.tasks[to].driver.uninit() {
            return;
        }
        let input = self.w.borrow().setups[to].upstreams.iter().position(|(u, _)| u.0 as usize == from).expect("edge");
        let (item, seq) = {
            let mut w = self.w.borrow_mut();
            if w.closed[to][input] || w.partitioned(from, to) {
                return;
            }
            let (sources, aggs) = (w.topo.sources, w.topo.aggs);
            let Some((item, seq)) = w.channels[ci].q.front().cloned() else { return };
            if w.channels[ci].stalled_until > w.now {
                return;
            }
            if matches!(item, Item::Trigger { .. }) && w.faults && w.rng.chance(20) {
                // The receiver leaves the barrier in its queue for seconds (a stalled worker): its
                // retrieve finds everything before the barrier here, and injects it.
                let until = w.now + TRIGGER_TIMEOUT + w.rng.below(2 * TRIGGER_TIMEOUT);
                w.channels[ci].stalled_until = until;
                return;
            }
            if let Item::Row { o, .. } = item
                && to < sources + aggs
            {
                let sink = sources + aggs + w.topo.sink_of(to - sources, o);
                if w.channels[w.chan_of[&(to, sink)]].q.len() >= CAP {
                    return; // back-pressure
                }
            }
            let remote = w.topo.node(from) != w.topo.node(to);
            // Loss only with more behind it, so the gap shows at the next frame.
            if remote && w.faults && w.channels[ci].q.len() > 1 && w.rng.chance(2) {
                w.channels[ci].q.pop_front();
                w.stats.data_lost += 1;
                return;
            }
            if remote && w.faults && w.rng.chance(2) {
                w.stats.data_duplicated += 1; // delivered, and left in the queue once more
            } else {
                w.channels[ci].q.pop_front();
            }
            (item, seq)
        };
        {
            let mut w = self.w.borrow_mut();
            if seq.0 != w.channels[ci].expected {
                // The sequence check: data was lost or doubled; the stream restarts from its last
                // commit, as the engine does.
                w.stats.gaps_detected += 1;
                let due = w.channels[ci].expected;
                w.note(format!("gap on {from}->{to}: frame {} where {due} was due", seq.0));
                drop(w);
                self.restart();
                return;
            }
            w.channels[ci].expected += 1;
        }
        match item {
            Item::Row { s, o, v } => {
                let mut w = self.w.borrow_mut();
                w.models[to].consumed[input] += 1;
                let (sources, aggs) = (w.topo.sources, w.topo.aggs);
                if to < sources + aggs {
                    let sink = sources + aggs + w.topo.sink_of(to - sources, o);
                    let out = w.topo.downstreams(to).iter().position(|d| *d == sink).expect("edge");
                    w.models[to].forwarded[out] += 1;
                    let rank = w.models[to].ranks.entry((out, s)).or_insert(0);
                    *rank += 1;
                    let v = *rank;
                    if let Some(c) = &mut w.cuts[to][input] {
                        // Past the barrier of a cut input: left out of the capture, and sent
                        // behind the agg's own barrier.
                        c.consumed += 1;
                        c.forwarded[out] += 1;
                        *c.ranks.entry((out, s)).or_insert(0) += 1;
                        c.withheld.push((sink, Item::Row { s, o, v }));
                        w.stats.rows_past_cuts += 1;
                    } else {
                        w.push(to, sink, Item::Row { s, o, v });
                    }
                } else {
                    w.results.insert((s, o), v); // an upsert, as the result store does
                }
            }
            Item::Trigger { id, trans } => {
                let from = TaskId(from as u32);
                with_task!(self, to, |d, p, f| d.signal(&mut p, &mut f, Signal::Barrier { from, id, trans }));
            }
            Item::End => {
                let from_id = TaskId(from as u32);
                with_task!(self, to, |d, p, f| d.signal(&mut p, &mut f, Signal::UpstreamEnded { from: from_id }));
                self.end_input(to, input);
            }
        }
    }

    /// Input `input` of task `t` ended; a task whose inputs all ended forwards the end, and stops.
    pub fn end_input(&mut self, t: usize, input: usize) {
        let mut w = self.w.borrow_mut();
        w.ended_inputs.insert((t, input));
        let all = (0..w.setups[t].upstreams.len()).all(|i| w.ended_inputs.contains(&(t, i)));
        if all {
            for d in w.topo.downstreams(t) {
                w.push(t, d, Item::End);
            }
            drop(w);
            self.tasks[t].finished = true;
        }
    }

    pub fn tick(&mut self) {
        let (now, healed) = {
            let mut w = self.w.borrow_mut();
            w.now += 1 + w.rng.below(20);
            let healed = w.partition_until.is_some_and(|u| w.now >= u);
            if healed {
                w.partition_until = None;
                w.note("partition healed".into());
            }
            (w.now, healed)
        };
        if healed {
            // The transport reports the peer back, in order after it reported it lost.
            self.coord_input(CoordInput::NodeUp { node: NodeId(2) });
        }
        self.coordinator_up();
        for t in 0..self.n() {
            if !self.tasks[t].finished {
                with_task!(self, t, |d, p, f| d.poll(&mut p, &mut f).map(|_| ()));
            }
        }
        self.coord_input(CoordInput::Tick { now });
        // Due uploads complete (or fail).
        let due: Vec<_> = {
            let mut w = self.w.borrow_mut();
            let (due, keep) = std::mem::take(&mut w.uploads).into_iter().partition(|u| u.0 <= now);
            w.uploads = keep;
            due
        };
        for (_, t, job) in due {
            let result = self.upload(t, job);
            if !self.tasks[t].finished {
                with_task!(self, t, |d, p, f| d.handle(
                    &mut p,
                    &mut f,
                    TaskInput::Uploaded { id: result.0, result: result.1 }
                ));
            }
        }
    }

    /// Stores a snapshot, as the uploader pool does (the store may fail it).
    pub fn upload(
        &mut self,
        t: usize,
        job: UploadRequest<Model>,
    ) -> (CheckpointId, Result<UploadDone, CheckpointError>) {
        let mut w = self.w.borrow_mut();
        let id = job.id;
        let failed = |reason: String| CheckpointError::Upload { task: TaskId(t as u32), id, reason, retryable: true };
        if w.faults && w.rng.chance(15) {
            w.stats.upload_failures += 1;
            return (id, Err(failed("store unreachable".into())));
        }
        let bytes = job.captured.encode(job.version);
        match w.store.put(&snapshot_key(t, id), &bytes) {
            Ok(()) => {
                (id, Ok(UploadDone { manifest_crc: crc(&bytes), bytes: bytes.len() as u64, files: 1, upload_us: 5 }))
            }
            Err(e) => {
                w.stats.upload_failures += 1;
                (id, Err(failed(e.to_string())))
            }
        }
    }

    /// One step; a broken invariant panics with the run's state and its last steps.
    pub fn step(&mut self) {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step_unchecked())) {
            let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{}\n{}", why.unwrap_or_default(), self.describe());
        }
    }

    pub fn step_unchecked(&mut self) {
        self.w.borrow_mut().stats.steps += 1;
        let pick = self.w.borrow_mut().rng.below(20);
        // Data moves much faster than timers fire: most steps move rows, few advance the clock.
        match pick {
            0..=4 => {
                let s = {
                    let mut w = self.w.borrow_mut();
                    let n = w.topo.sources as u64;
                    w.rng.below(n) as usize
                };
                self.source_step(s);
            }
            5..=12 => {
                let ci = {
                    let mut w = self.w.borrow_mut();
                    let busy: Vec<usize> = (0..w.channels.len()).filter(|c| !w.channels[*c].q.is_empty()).collect();
                    (!busy.is_empty()).then(|| busy[w.rng.below(busy.len() as u64) as usize])
                };
                if let Some(ci) = ci {
                    self.deliver_data(ci);
                }
            }
            13..=16 => {
                // Any due control message, in random order (reordering).
                let c = {
                    let mut w = self.w.borrow_mut();
                    let now = w.now;
                    let due: Vec<usize> = (0..w.ctl.len()).filter(|i| w.ctl[*i].0 <= now).collect();
                    (!due.is_empty()).then(|| {
                        let i = due[w.rng.below(due.len() as u64) as usize];
                        w.ctl.swap_remove(i).1
                    })
                };
                if let Some(c) = c {
                    self.deliver_ctl(c);
                }
            }
            17..=18 => self.tick(),
            _ => self.fault(),
        }
        self.check_quiet();
        let halted = self.w.borrow_mut().halted.take();
        if let Some(reason) = halted {
            // What the halt says to do: restart every node.
            let mut w = self.w.borrow_mut();
            w.stats.halts += 1;
            w.note(format!("halted ({reason}): every node restarts"));
            drop(w);
            self.restart();
        }
    }

    pub fn all_finished(&self) -> bool {
        self.tasks.iter().all(|t| t.finished)
    }
}

fn crc(b: &[u8]) -> u32 {
    b.iter().fold(0u32, |h, x| h.rotate_left(5) ^ u32::from(*x))
}
