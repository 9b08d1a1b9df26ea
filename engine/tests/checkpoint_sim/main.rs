//! Deterministic simulation of the checkpoint protocol, running the engine's own drivers
//! ([`TaskDriver`], [`CoordDriver`]) through the simulator's implementation of their effect
//! traits (`fx.rs`): one seeded scheduler, model tasks on FIFO data channels (`world.rs`), and a
//! faulty in-memory store that holds snapshots, commit records and the id record through the real
//! codecs.
//!
//! Faults: control messages delayed, reordered, duplicated and lost; data items lost or
//! duplicated on channels between nodes (caught by the sequence check, which restarts the stream
//! from the last commit, as the engine does); crashes of everything, sometimes losing the commit
//! records (the tasks then restore the consensus); the coordinator crashing alone, also right
//! after writing a commit record; store puts that fail, that fail after storing, and store calls
//! that never answer; failed snapshots and uploads; a node partitioned away and back. Topologies
//! mix fixed and shuffle dispatch, levels of one task, and sources that end.
//!
//! Invariants, checked as the run goes: every visible commit is a consistent cut; nothing commits
//! without a successful report from every task; checkpoint ids only grow and no (id, transaction)
//! pair is used twice; no checkpoint starts on an id the store has not reserved; a task told to
//! reset a checkpoint never checkpoints it (or an older one) again; every restore point is a
//! committed checkpoint; no snapshot a commit names is deleted; once faults stop a checkpoint
//! commits within bounded time (or the stream ends), and in quiet moments no task is left
//! checkpointing. At the end: every commit in the store restores, and the sinks' results equal
//! what a reference computes from every source row exactly once, however many crashes happened.
//!
//! `WEIR_SIM_SEEDS=N` runs N seeds per test shard (default 5,000, four shards: 20,000 seeds);
//! `WEIR_SIM_SEED=S` replays seed S alone (a failure prints the seed and the steps before it).

mod fx;
mod world;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use weir_engine::backup::Store;
use weir_engine::backup::commit::decode_commit;
use weir_engine::checkpoint::driver::{CoordDriver, Signal, TaskDriver, UploadRequest};
use weir_engine::checkpoint::{
    CheckpointError, CommitRecord, CoordInput, Coordinator, CoordinatorConfig, Role, TaskInput, TaskMachine, TaskSetup,
    TaskState, UploadDone,
};
use weir_engine::wire::msg::RestoreBasis;
use weir_engine::wire::{CheckpointId, NodeId, Seq, TaskId, TransId, Version};

use fx::{STREAM, SimCoordFx, SimPort, SimTaskFx, coordinator_start};
use world::{Channel, Ctl, FaultyStore, Item, Model, Rng, SimTask, Stats, Topology, snapshot_key};

const TRIGGER_TIMEOUT: u64 = 2_000;
/// Bounded queues, as in the engine: a producer waits while its channel holds this many items.
const CAP: usize = 16;
const READY_RESEND: u64 = 500;
/// The coordinator, as an endpoint of control messages (tasks are 0..n).
pub const COORD: usize = usize::MAX;

/// Everything but the drivers.
pub struct World {
    pub rng: Rng,
    pub now: u64,
    pub faults: bool,
    pub topo: Topology,
    pub setups: Vec<TaskSetup>,
    pub models: Vec<Model>,
    pub closed: Vec<Vec<bool>>,
    pub queued_trigger: Vec<Option<CheckpointId>>,
    pub channels: Vec<Channel>,
    pub chan_of: BTreeMap<(usize, usize), usize>,
    pub ctl: Vec<(u64, Ctl)>,
    pub uploads: Vec<(u64, usize, UploadRequest<Model>)>,
    pub store: Arc<FaultyStore>,
    /// Each task's meta record (survives crashes).
    pub persisted: Vec<Option<(CheckpointId, Version)>>,
    /// The sinks' result store: (source, offset) → value; survives crashes, like the engine's.
    pub results: BTreeMap<(usize, u64), u64>,
    /// Every commit record that became visible in the store.
    pub commits: Vec<CommitRecord>,
    /// Reports the coordinator received, by checkpoint: task → ok.
    pub reports: BTreeMap<CheckpointId, BTreeMap<usize, bool>>,
    /// (id, transaction) pairs of started checkpoints, with the coordinator call that started them.
    pub issued: BTreeMap<(CheckpointId, TransId), u64>,
    pub coord_call: u64,
    pub coord_incarnation: u64,
    pub crash_coordinator: bool,
    /// Node 2 cut off until then.
    pub partition_until: Option<u64>,
    /// Checkpoints the coordinator ended, and when.
    pub ended: Vec<(CheckpointId, u64)>,
    /// Inputs (task, input) whose end of stream arrived, in this incarnation.
    pub ended_inputs: std::collections::BTreeSet<(usize, usize)>,
    /// When the faults stopped.
    pub quiet_since: Option<u64>,
    pub trace: VecDeque<String>,
    pub stats: Stats,
}

impl World {
    pub fn note(&mut self, s: String) {
        if self.trace.len() == 4000 {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("t={} {s}", self.now));
    }

    pub fn empty(&self, i: usize) -> Model {
        Model {
            emitted: 0,
            consumed: vec![0; self.setups[i].upstreams.len()],
            forwarded: vec![0; self.setups[i].downstreams.len()],
            ranks: BTreeMap::new(),
        }
    }

    fn partitioned(&self, a: usize, b: usize) -> bool {
        let node = |i: usize| if i == COORD { NodeId(1) } else { self.topo.node(i) };
        self.partition_until.is_some() && node(a) != node(b)
    }

    /// Posts a control message between endpoints `ends` (sender, receiver), with the faults.
    pub fn post(&mut self, ends: Option<(usize, usize)>, c: Ctl) {
        if let Some((a, b)) = ends
            && self.partitioned(a, b)
        {
            self.stats.lost += 1;
            return;
        }
        if self.faults && self.rng.chance(30) {
            self.stats.lost += 1;
            return;
        }
        let at = self.delay();
        if self.faults && self.rng.chance(30) {
            self.stats.duplicated += 1;
            let at2 = self.delay();
            self.ctl.push((at2, c.clone()));
        }
        self.ctl.push((at, c));
    }

    fn delay(&mut self) -> u64 {
        self.now + 1 + self.rng.below(if self.faults { 400 } else { 50 })
    }

    pub fn push(&mut self, from: usize, to: usize, item: Item) -> Seq {
        let ch = &mut self.channels[self.chan_of[&(from, to)]];
        let seq = Seq(ch.sent);
        ch.sent += 1;
        ch.q.push_back((item, seq));
        seq
    }

    /// A checkpoint starts only on ids the store has reserved, and never on a pair used before.
    pub fn check_issued(&mut self, id: CheckpointId, trans: TransId) {
        let key = weir_engine::backup::commit::ids_key(STREAM);
        let rec = self.store.peek(&key).and_then(|b| weir_engine::backup::commit::decode_ids(&key, &b).ok());
        let rec = rec.unwrap_or_else(|| panic!("checkpoint {id} started without an id record"));
        assert!(id < rec.next_id && trans < rec.next_trans, "{id} {trans} started beyond the reserved {rec:?}");
        let call = self.coord_call;
        match self.issued.get(&(id, trans)) {
            Some(c) => assert_eq!(*c, call, "({id}, {trans}) started twice"),
            None => {
                let highest = self.issued.keys().map(|k| k.0).max();
                assert!(highest.is_none_or(|h| id > h), "checkpoint id went down: {id} after {highest:?}");
                self.issued.insert((id, trans), call);
            }
        }
    }

    /// Nothing commits without a successful report from every task.
    pub fn check_reports(&self, r: &CommitRecord) {
        let got = self.reports.get(&r.id).cloned().unwrap_or_default();
        for i in 0..self.topo.n() {
            assert_eq!(got.get(&i), Some(&true), "commit {} without a report from t{i}", r.id);
        }
    }

    fn snapshot(&self, t: usize, id: CheckpointId) -> (Model, Version) {
        let key = snapshot_key(t, id);
        let b = self.store.peek(&key).unwrap_or_else(|| panic!("commit {id} names {key}, which is not stored"));
        Model::decode(&b).unwrap_or_else(|| panic!("{key} does not decode"))
    }

    /// The committed state of every task equals the reference computed from the source offsets.
    pub fn check_consistent(&self, r: &CommitRecord) {
        let topo = &self.topo;
        let (s_n, a_n) = (topo.sources, topo.aggs);
        // A consensus point's record names no offsets: the sources' snapshots have them.
        let version =
            |s: usize| r.versions.get(&TaskId(s as u32)).copied().unwrap_or_else(|| self.snapshot(s, r.id).1).0;
        for s in 0..s_n {
            assert_eq!(self.snapshot(s, r.id).0.emitted, version(s), "source t{s} differs from its offset in {}", r.id);
        }
        for a in 0..a_n {
            let m = self.snapshot(s_n + a, r.id).0;
            for (input, s) in self.topo.upstreams(s_n + a).into_iter().enumerate() {
                let routed = (0..version(s)).filter(|o| topo.agg_of(s, *o) == a).count() as u64;
                assert_eq!(m.consumed[input], routed, "agg t{} in {} is not a consistent cut", s_n + a, r.id);
            }
        }
        for k in 0..topo.sinks {
            let t = s_n + a_n + k;
            let m = self.snapshot(t, r.id).0;
            for (input, a) in topo.upstreams(t).into_iter().enumerate() {
                let agg = self.snapshot(a, r.id).0;
                let out = topo.downstreams(a).iter().position(|d| *d == t).expect("edge");
                assert_eq!(m.consumed[input], agg.forwarded[out], "sink t{t} in {} is not a consistent cut", r.id);
            }
        }
    }
}

struct Sim {
    w: RefCell<World>,
    tasks: Vec<SimTask>,
    coord: Option<CoordDriver>,
    coord_cfg: CoordinatorConfig,
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
    fn new(seed: u64) -> Self {
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
        let w = World {
            rng,
            now: 0,
            faults: true,
            models: Vec::new(),
            closed: Vec::new(),
            queued_trigger: Vec::new(),
            channels,
            chan_of,
            ctl: Vec::new(),
            uploads: Vec::new(),
            store,
            persisted: vec![None; n],
            results: BTreeMap::new(),
            commits: Vec::new(),
            reports: BTreeMap::new(),
            issued: BTreeMap::new(),
            coord_call: 0,
            coord_incarnation: 0,
            crash_coordinator: false,
            partition_until: None,
            ended: Vec::new(),
            ended_inputs: Default::default(),
            quiet_since: None,
            trace: VecDeque::new(),
            stats: Stats::default(),
            topo,
            setups,
        };
        let mut sim = Sim { w: RefCell::new(w), tasks: Vec::new(), coord: None, coord_cfg, coord_back_at: 0 };
        sim.restart();
        sim
    }

    fn n(&self) -> usize {
        self.w.borrow().topo.n()
    }

    fn now(&self) -> u64 {
        self.w.borrow().now
    }

    /// After every driver call of task `t`: a restore that failed leaves the task waiting (it
    /// asks again); anything else is a bug. A task told to reset never checkpoints that id again.
    fn after_task(&mut self, t: usize, r: Result<(), CheckpointError>) {
        match r {
            Ok(()) => {}
            Err(CheckpointError::Restore { .. }) => assert!(self.tasks[t].driver.uninit()),
            Err(e) => panic!("t{t}: {e}"),
        }
        if let (TaskState::Checkpointing(x), Some(reset)) =
            (self.tasks[t].driver.machine().state(), self.tasks[t].reset_upto)
        {
            assert!(x > reset, "t{t} checkpointing {x} after it was told to reset {reset}");
        }
    }

    /// Crash every task, the coordinator and the channels; sometimes the coordinator's commit
    /// records are lost too. Each task restores when the coordinator names its restore point.
    fn restart(&mut self) {
        let n = self.n();
        {
            let mut w = self.w.borrow_mut();
            if w.faults && !w.store.keys("1/checkpoints/").is_empty() && w.rng.chance(300) {
                w.store.wipe("1/checkpoints/");
                w.stats.records_lost += 1;
                w.note("commit records lost".into());
            }
            w.models = (0..n).map(|i| w.empty(i)).collect();
            w.closed = w.setups.iter().map(|c| vec![false; c.upstreams.len()]).collect();
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
        self.crash_coordinator(0);
    }

    /// Stops the coordinator; it comes back after `down_ms`.
    fn crash_coordinator(&mut self, down_ms: u64) {
        self.coord = None;
        let mut w = self.w.borrow_mut();
        w.coord_incarnation += 1;
        w.crash_coordinator = false;
        self.coord_back_at = w.now + down_ms;
    }

    /// Brings the coordinator back if it is due: it reads the last commit and the id record.
    fn coordinator_up(&mut self) {
        if self.coord.is_some() || self.now() < self.coord_back_at {
            return;
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
        self.coord = Some(CoordDriver::new(Coordinator::new(self.coord_cfg.clone()), STREAM));
        let now = self.now();
        self.coord_input(CoordInput::Start { now, ids, last_commit: last });
    }

    fn coord_input(&mut self, input: CoordInput) {
        let Some(c) = self.coord.as_mut() else { return };
        self.w.borrow_mut().coord_call += 1;
        c.handle(&mut SimCoordFx { w: &self.w }, input);
        if self.w.borrow().crash_coordinator {
            self.w.borrow_mut().stats.coordinator_crashes += 1;
            let d = self.w.borrow_mut().rng.below(500);
            self.crash_coordinator(d);
        }
    }

    fn deliver_ctl(&mut self, c: Ctl) {
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
                if let TaskInput::Reset { failed } = input {
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

    fn source_step(&mut self, s: usize) {
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
            w.push(s, a, Item::Row { s, o });
            w.models[s].emitted += 1;
        }
    }

    /// Moves the front item of channel `ci`, with data faults on channels between nodes.
    fn deliver_data(&mut self, ci: usize) {
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
            Item::Row { s, o } => {
                let mut w = self.w.borrow_mut();
                w.models[to].consumed[input] += 1;
                let (sources, aggs) = (w.topo.sources, w.topo.aggs);
                if to < sources + aggs {
                    let sink = sources + aggs + w.topo.sink_of(to - sources, o);
                    let out = w.topo.downstreams(to).iter().position(|d| *d == sink).expect("edge");
                    w.models[to].forwarded[out] += 1;
                    w.push(to, sink, Item::Row { s, o });
                } else {
                    let rank = w.models[to].ranks.entry((input, s)).or_insert(0);
                    *rank += 1;
                    let v = *rank;
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
    fn end_input(&mut self, t: usize, input: usize) {
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

    fn tick(&mut self) {
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
    fn upload(&mut self, t: usize, job: UploadRequest<Model>) -> (CheckpointId, Result<UploadDone, CheckpointError>) {
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
    fn step(&mut self) {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step_unchecked())) {
            let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{}\n{}", why.unwrap_or_default(), self.describe());
        }
    }

    fn step_unchecked(&mut self) {
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
    }

    /// One of the rarer faults, or a tick.
    fn fault(&mut self) {
        let (faults, r) = {
            let mut w = self.w.borrow_mut();
            let r = w.rng.below(1000);
            (w.faults, r)
        };
        match r {
            _ if !faults => self.tick(),
            0..=9 => self.restart(),
            10..=17 => {
                self.w.borrow_mut().stats.coordinator_crashes += 1;
                let d = self.w.borrow_mut().rng.below(800);
                self.w.borrow_mut().note("coordinator crashes".into());
                self.crash_coordinator(d);
            }
            18..=22 => {
                let started = {
                    let mut w = self.w.borrow_mut();
                    let start = w.partition_until.is_none();
                    if start {
                        let until = w.now + 200 + w.rng.below(1_500);
                        w.partition_until = Some(until);
                        w.stats.partitions += 1;
                        w.note("node 2 partitioned".into());
                    }
                    start
                };
                if started {
                    // The coordinator's transport notices the lost peer.
                    self.coord_input(CoordInput::NodeLost { node: NodeId(2) });
                }
            }
            _ => self.tick(),
        }
    }

    /// In a quiet moment (no faults for a while, nothing in flight), no task is left
    /// checkpointing a checkpoint the coordinator has ended.
    fn check_quiet(&self) {
        let w = self.w.borrow();
        let Some(quiet) = w.quiet_since else { return };
        if !w.ctl.is_empty() || !w.uploads.is_empty() {
            return;
        }
        let Some(c) = &self.coord else { return };
        for (t, task) in self.tasks.iter().enumerate() {
            if let TaskState::Checkpointing(x) = task.driver.machine().state()
                && !task.finished
                && c.coordinator().in_flight() != Some(x)
                // A task that missed the end of a checkpoint notices at its next retrieve.
                && w.ended.iter().any(|(id, at)| *id >= x && *at >= quiet && w.now > at + 2 * TRIGGER_TIMEOUT + 500)
            {
                panic!("t{t} still checkpointing {x}, which ended long ago\n{}", self.describe());
            }
        }
    }

    fn all_finished(&self) -> bool {
        self.tasks.iter().all(|t| t.finished)
    }

    /// The reference: every row of every source exactly once, each valued by its rank among
    /// the rows of its source that took the same agg and sink.
    fn reference(&self) -> BTreeMap<(usize, u64), u64> {
        let w = self.w.borrow();
        let topo = &w.topo;
        let mut rank: BTreeMap<(usize, usize, usize), u64> = BTreeMap::new();
        let mut out = BTreeMap::new();
        for s in 0..topo.sources {
            for o in 0..topo.limit {
                let a = topo.agg_of(s, o);
                let k = topo.sink_of(a, o);
                let r = rank.entry((s, a, k)).or_insert(0);
                *r += 1;
                out.insert((s, o), *r);
            }
        }
        out
    }

    fn describe(&self) -> String {
        let w = self.w.borrow();
        let states: Vec<String> = (0..w.topo.n())
            .map(|t| {
                let m = self.tasks[t].driver.machine();
                format!(
                    "t{t}: {:?} latest {} failed {:?} closed {:?} finished {}",
                    m.state(),
                    m.latest(),
                    m.failed(),
                    w.closed[t],
                    self.tasks[t].finished
                )
            })
            .collect();
        let chans: Vec<String> =
            w.channels.iter().map(|c| format!("{}->{}: {} queued", c.from, c.to, c.q.len())).collect();
        let trace: Vec<String> = w.trace.iter().cloned().collect();
        format!("{:?}\n{}\n{}\nlast steps:\n{}", w.topo, states.join("\n"), chans.join("\n"), trace.join("\n"))
    }
}

fn crc(b: &[u8]) -> u32 {
    b.iter().fold(0u32, |h, x| h.rotate_left(5) ^ u32::from(*x))
}

/// What one seed's run ended with.
struct Outcome {
    commits: usize,
    stats: Stats,
}

fn run(seed: u64) -> Outcome {
    let mut sim = Sim::new(seed);
    let fault_steps = 3_000 + sim.w.borrow_mut().rng.below(3_000);
    for _ in 0..fault_steps {
        sim.step();
    }
    // Faults stop: a checkpoint must commit within bounded simulated time, or the stream end.
    {
        let mut w = sim.w.borrow_mut();
        w.faults = false;
        w.store.set_faults(false);
        w.quiet_since = Some(w.now);
        if w.partition_until.take().is_some() {
            drop(w);
            sim.coord_input(CoordInput::NodeUp { node: NodeId(2) });
        }
    }
    let cfg = sim.coord_cfg.clone();
    let bound = 4 * (cfg.interval_ms + cfg.timeout_ms) + TRIGGER_TIMEOUT;
    let (quiet, committed) = (sim.now(), sim.w.borrow().commits.len());
    while sim.w.borrow().commits.len() < committed + 2 && !sim.all_finished() {
        assert!(sim.now() - quiet <= bound, "no commit within {bound} ms after faults stopped\n{}", sim.describe());
        sim.step();
    }
    // Then the stream runs to its end.
    let quiet = sim.now();
    while !sim.all_finished() {
        assert!(sim.now() - quiet <= 600_000, "the stream did not end\n{}", sim.describe());
        sim.step();
    }
    // Exactly once: every row's result, as if nothing had failed.
    let want = sim.reference();
    let w = sim.w.borrow();
    if w.results != want {
        let missing = want.keys().filter(|k| !w.results.contains_key(k)).count();
        let wrong = want.iter().filter(|(k, v)| w.results.get(k).is_some_and(|g| g != *v)).count();
        panic!("results differ from the reference: {missing} missing, {wrong} wrong\n{}", sim.describe());
    }
    // Every commit left in the store restores: its record decodes and every task's state is there.
    for key in w.store.keys("1/checkpoints/") {
        let r = decode_commit(&key, &w.store.peek(&key).unwrap()).expect("a stored commit record decodes");
        w.check_consistent(&r);
    }
    let mut stats = w.stats;
    let (puts, visible, _) = w.store.counts();
    stats.put_failures = puts;
    stats.visible_despite_error = visible;
    stats.ended_streams = 1;
    Outcome { commits: w.commits.len(), stats }
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    std::panic::catch_unwind(|| run(seed)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

fn shard(index: u64) {
    if let Ok(seed) = std::env::var("WEIR_SIM_SEED") {
        if index == 0 {
            let seed: u64 = seed.parse().expect("WEIR_SIM_SEED is a number");
            if let Err(e) = run_seed(seed) {
                panic!("seed {seed} failed: {e}");
            }
        }
        return;
    }
    let per_shard: u64 = std::env::var("WEIR_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5_000);
    let mut commits = 0;
    for i in 0..per_shard {
        let seed = index * 1_000_000_007 + i;
        match run_seed(seed) {
            Ok(o) => commits += o.commits,
            Err(e) => panic!(
                "seed {seed} failed (replay: WEIR_SIM_SEED={seed} cargo nextest run --release -p weir-engine --test checkpoint_sim): {e}"
            ),
        }
    }
    assert!(commits as u64 >= 2 * per_shard, "{commits} commits over {per_shard} seeds");
}

#[test]
fn simulated_seeds_shard_0() {
    shard(0);
}

#[test]
fn simulated_seeds_shard_1() {
    shard(1);
}

#[test]
fn simulated_seeds_shard_2() {
    shard(2);
}

#[test]
fn simulated_seeds_shard_3() {
    shard(3);
}

#[test]
fn a_seed_replays_exactly() {
    let run = |seed| {
        let mut sim = Sim::new(seed);
        for _ in 0..2_000 {
            sim.step();
        }
        let w = sim.w.borrow();
        (w.now, w.commits.iter().map(|c| c.id).collect::<Vec<_>>(), w.trace.iter().cloned().collect::<Vec<_>>())
    };
    assert_eq!(run(42), run(42));
}

#[test]
fn the_checker_catches_an_inconsistent_commit() {
    // Corrupt one committed snapshot: the consistency check must fail.
    let mut sim = Sim::new(7);
    {
        let mut w = sim.w.borrow_mut();
        w.faults = false;
        w.store.set_faults(false);
    }
    while sim.w.borrow().commits.is_empty() {
        sim.step();
    }
    let w = sim.w.borrow();
    let record = w.commits[0].clone();
    let agg = w.topo.sources;
    let key = snapshot_key(agg, record.id);
    let (mut m, v) = Model::decode(&w.store.peek(&key).unwrap()).unwrap();
    m.consumed[0] += 1;
    weir_engine::backup::Store::delete(&*w.store, &key).unwrap();
    w.store.set_faults(false);
    weir_engine::backup::Store::put(&*w.store, &key, &m.encode(v)).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.check_consistent(&record)));
    assert!(caught.is_err(), "an inconsistent cut went unnoticed");
}

#[test]
fn the_simulation_really_goes_through_faults() {
    let mut t = Stats::default();
    let mut commits = 0;
    for seed in 0..200 {
        let o = run_seed(900_000 + seed).unwrap_or_else(|e| panic!("seed {}: {e}", 900_000 + seed));
        commits += o.commits;
        t.add(&o.stats);
    }
    assert!(commits > 400, "{commits} commits");
    assert!(t.steps > 600_000, "{t:?}");
    for (what, n) in [
        ("restarts", t.restarts),
        ("lost messages", t.lost),
        ("duplicates", t.duplicated),
        ("failed checkpoints", t.failed_checkpoints),
        ("retrieve requests", t.retrieves),
        ("injected triggers", t.injected),
        ("discarded inputs", t.discarded),
        ("upload failures", t.upload_failures),
        ("snapshot failures", t.snapshot_failures),
        ("lost commit records", t.records_lost),
        ("consensus restores", t.consensus_restores),
        ("lost data", t.data_lost),
        ("duplicated data", t.data_duplicated),
        ("detected gaps", t.gaps_detected),
        ("coordinator crashes", t.coordinator_crashes),
        ("crashes right after a commit write", t.crashes_after_commit_write),
        ("store calls that never answer", t.store_hangs),
        ("failed puts", t.put_failures),
        ("puts stored despite an error", t.visible_despite_error),
        ("failed id records", t.id_record_failures),
        ("failed commit writes", t.commit_write_failures),
        ("partitions", t.partitions),
        ("failed restores", t.restore_failures),
        ("source refusals", t.refusals),
        ("streams run to their end", t.ended_streams),
    ] {
        assert!(n > 0, "no {what} in 200 seeds: {t:?}");
    }
}
