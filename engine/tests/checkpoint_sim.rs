//! Deterministic simulation of the checkpoint protocol: one seeded scheduler drives the task and
//! coordinator state machines of a small pipeline (sources → aggs → sinks) with random delays,
//! reordering, duplication and loss of control messages (data channels stay FIFO), crashes with a
//! restore from the last commit, crashes that also lose the coordinator's commit records (the
//! tasks then restore the consensus: the minimum of their latest committed ids), and store
//! failures. Invariants are checked after every step:
//!
//! - every commit is a consistent cut: each task's committed state equals what a reference
//!   computes from exactly the source offsets recorded in that commit;
//! - nothing commits without a successful report from every task for that checkpoint;
//! - checkpoint ids only grow;
//! - no task is left checkpointing an id at or below one it was told to reset;
//! - every restore point is a committed checkpoint (or a start from nothing);
//! - once faults stop, a checkpoint commits within bounded simulated time.
//!
//! `WEIR_SIM_SEEDS=N` runs N seeds per test shard (default 5,000, four shards: 20,000 seeds);
//! `WEIR_SIM_SEED=S` replays seed S alone (a failure prints the seed and the steps before it).

use std::collections::{BTreeMap, VecDeque};

use weir_engine::checkpoint::*;
use weir_wire::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// Model state of a task: what it has consumed and emitted (the "operator state").
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    /// Source: rows emitted. Agg: rows consumed per source. Sink: rows consumed per agg.
    emitted: u64,
    consumed: Vec<u64>,
    /// Agg: rows forwarded per sink.
    forwarded: Vec<u64>,
}

#[derive(Clone, Debug)]
enum Item {
    /// A row from source `s` with offset `o`.
    Row {
        s: usize,
        o: u64,
    },
    Trigger {
        id: CheckpointId,
        trans: TransId,
        seq: Seq,
    },
}

#[derive(Clone, Debug)]
enum Ctl {
    ToTask(TaskId, TaskInput),
    ToCoord(CoordInput),
}

struct Channel {
    from: TaskId,
    to: TaskId,
    q: VecDeque<(Item, Seq)>,
    sent: u64,
    delivered: u64,
}

struct Sim {
    rng: Rng,
    now: u64,
    sources: usize,
    aggs: usize,
    sinks: usize,
    machines: Vec<TaskMachine>,
    models: Vec<Model>,
    closed: Vec<Vec<bool>>,
    channels: Vec<Channel>,
    /// Channel index by (from, to).
    chan_of: BTreeMap<(u32, u32), usize>,
    coord: Coordinator,
    ctl: Vec<(u64, Ctl)>,
    /// Pending uploads: (due time, task, id).
    uploads: Vec<(u64, usize, CheckpointId)>,
    /// Sources with a queued trigger to reach.
    queued_trigger: Vec<Option<CheckpointId>>,
    snapshots: BTreeMap<(usize, CheckpointId), Model>,
    /// Reports the coordinator received, by checkpoint: task → ok.
    reports: BTreeMap<CheckpointId, BTreeMap<u32, bool>>,
    commits: Vec<CommitRecord>,
    durable_commit: Option<CommitRecord>,
    /// Each task's latest committed id in its own meta file (survives crashes and lost records).
    persisted: Vec<CheckpointId>,
    next_id_meta: CheckpointId,
    highest_id: CheckpointId,
    faults: bool,
    trace: VecDeque<String>,
    config: Vec<TaskSetup>,
    coord_cfg: CoordinatorConfig,
    stats: Stats,
}

/// What a run went through, to show the faults really happen.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    steps: u64,
    restarts: u64,
    lost: u64,
    duplicated: u64,
    failed_checkpoints: u64,
    retrieves: u64,
    injected: u64,
    discarded: u64,
    store_failures: u64,
    /// Restarts that lost the coordinator's commit records, and how many of those restored a
    /// consensus checkpoint (not a start from nothing).
    records_lost: u64,
    consensus_restores: u64,
}

const TRIGGER_TIMEOUT: u64 = 2_000;
/// Bounded queues, as in the engine: a producer waits while its channel holds this many items.
const CAP: usize = 16;
const READY_RESEND: u64 = 500;

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let sources = 1 + rng.below(3) as usize;
        let aggs = 1 + rng.below(3) as usize;
        let sinks = 1 + rng.below(2) as usize;
        let n = sources + aggs + sinks;
        let id = |i: usize| TaskId(i as u32);
        let node = |i: usize| NodeId(1 + (i % 2) as u32);
        let mut config = Vec::new();
        for i in 0..n {
            let (role, ups, downs): (Role, Vec<usize>, Vec<usize>) = if i < sources {
                (Role::Source, vec![], (sources..sources + aggs).collect())
            } else if i < sources + aggs {
                (Role::Agg, (0..sources).collect(), (sources + aggs..n).collect())
            } else {
                (Role::Sink, (sources..sources + aggs).collect(), vec![])
            };
            config.push(TaskSetup {
                stream: StreamId(1),
                task: id(i),
                node: node(i),
                role,
                upstreams: ups.iter().map(|u| (id(*u), node(*u))).collect(),
                downstreams: downs.iter().map(|d| (id(*d), node(*d))).collect(),
                trigger_timeout_ms: TRIGGER_TIMEOUT,
                ready_resend_ms: READY_RESEND,
            });
        }
        let mut channels = Vec::new();
        let mut chan_of = BTreeMap::new();
        for c in &config {
            for (d, _) in &c.downstreams {
                chan_of.insert((c.task.0, d.0), channels.len());
                channels.push(Channel { from: c.task, to: *d, q: VecDeque::new(), sent: 0, delivered: 0 });
            }
        }
        let coord_cfg = CoordinatorConfig {
            stream: StreamId(1),
            tasks: config.iter().map(|c| (c.task, c.node, c.role)).collect(),
            interval_ms: 300 + rng.below(700),
            min_pause_ms: rng.below(200),
            timeout_ms: 8_000,
            first_delay_ms: rng.below(300),
            tolerable_failures: 3,
            consensus_wait_ms: 1_000,
        };
        let mut sim = Sim {
            rng,
            now: 0,
            sources,
            aggs,
            sinks,
            machines: Vec::new(),
            models: Vec::new(),
            closed: Vec::new(),
            channels,
            chan_of,
            coord: Coordinator::new(coord_cfg.clone()),
            ctl: Vec::new(),
            uploads: Vec::new(),
            queued_trigger: Vec::new(),
            snapshots: BTreeMap::new(),
            reports: BTreeMap::new(),
            commits: Vec::new(),
            durable_commit: None,
            persisted: vec![CheckpointId(0); n],
            next_id_meta: CheckpointId(1),
            highest_id: CheckpointId(0),
            faults: true,
            trace: VecDeque::new(),
            config,
            coord_cfg,
            stats: Stats::default(),
        };
        sim.restart();
        sim
    }

    fn n(&self) -> usize {
        self.sources + self.aggs + self.sinks
    }

    fn note(&mut self, s: String) {
        if self.trace.len() == 4000 {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("t={} {s}", self.now));
    }

    /// An empty model of task `i`.
    fn empty(&self, i: usize) -> Model {
        Model {
            emitted: 0,
            consumed: vec![0; self.config[i].upstreams.len()],
            forwarded: vec![0; self.config[i].downstreams.len()],
        }
    }

    /// Crash every task, the coordinator and the channels; sometimes the coordinator's commit
    /// records are lost too. Each task restores when the coordinator names its restore point.
    fn restart(&mut self) {
        let n = self.n();
        if self.faults && self.durable_commit.is_some() && self.rng.chance(300) {
            self.durable_commit = None;
            self.stats.records_lost += 1;
            self.note("commit records lost".into());
        }
        let commit = self.durable_commit.clone();
        self.machines = self.config.iter().cloned().map(TaskMachine::new).collect();
        self.models = (0..n).map(|i| self.empty(i)).collect();
        self.closed = self.config.iter().map(|c| vec![false; c.upstreams.len()]).collect();
        self.queued_trigger = vec![None; n];
        self.uploads.clear();
        for ch in &mut self.channels {
            ch.q.clear();
            ch.sent = 0;
            ch.delivered = 0;
        }
        // Stale control messages from before the crash stay in flight: the new incarnation must
        // cope with them.
        self.coord = Coordinator::new(self.coord_cfg.clone());
        let start = CoordInput::Start { now: self.now, next_id: self.next_id_meta, last_commit: commit.clone() };
        let acts = self.coord.handle(start);
        self.coord_actions(acts);
        if commit.is_none() {
            // The tasks ask with what their meta files say (the requests may be lost, late or
            // doubled like any control message).
            for i in 0..n {
                self.send_coord(CoordInput::Consensus { task: TaskId(i as u32), latest: self.persisted[i] });
            }
        }
        self.stats.restarts += 1;
        self.note("restart".into());
    }

    fn delay(&mut self) -> u64 {
        self.now + 1 + self.rng.below(if self.faults { 400 } else { 50 })
    }

    fn send(&mut self, to: TaskId, input: TaskInput) {
        self.post(Ctl::ToTask(to, input));
    }

    fn send_coord(&mut self, input: CoordInput) {
        self.post(Ctl::ToCoord(input));
    }

    fn post(&mut self, c: Ctl) {
        if self.faults && self.rng.chance(30) {
            self.stats.lost += 1;
            return; // lost
        }
        let at = self.delay();
        if self.faults && self.rng.chance(30) {
            self.stats.duplicated += 1;
            let at2 = self.delay();
            self.ctl.push((at2, c.clone())); // duplicated
        }
        self.ctl.push((at, c));
    }

    fn coord_actions(&mut self, acts: Vec<CoordAction>) {
        for a in acts {
            match a {
                CoordAction::PersistNextId(id) => self.next_id_meta = id,
                CoordAction::SendSourceReq { task, id, trans, expire_at, .. } => {
                    assert!(id >= self.highest_id, "checkpoint id went down: {id} after {}", self.highest_id);
                    self.highest_id = id;
                    self.send(task, TaskInput::SourceReq { id, trans, expire_at });
                }
                CoordAction::WriteCommit(record) => {
                    // Nothing commits without a successful report from every task.
                    let got = self.reports.get(&record.id).cloned().unwrap_or_default();
                    for i in 0..self.n() {
                        assert_eq!(
                            got.get(&(i as u32)),
                            Some(&true),
                            "commit {} without a report from t{i}",
                            record.id
                        );
                    }
                    if self.faults && self.rng.chance(50) {
                        // The coordinator's own write: its outcome always comes back (never lost).
                        let acts =
                            self.coord.handle(CoordInput::CommitFailed { id: record.id, reason: "store down".into() });
                        self.coord_actions(acts);
                    } else {
                        self.check_consistent(&record);
                        if let Some(last) = &self.durable_commit {
                            assert!(record.id > last.id, "commit ids must grow");
                        }
                        self.durable_commit = Some(record.clone());
                        self.commits.push(record.clone());
                        self.note(format!("commit {}", record.id));
                        let acts = self.coord.handle(CoordInput::CommitDurable { id: record.id });
                        self.coord_actions(acts);
                    }
                }
                CoordAction::SendUpdate { task, id, version, ts, .. } => {
                    self.send(task, TaskInput::Update { id, version, ts })
                }
                CoordAction::SendReset { task, failed, .. } => self.send(task, TaskInput::Reset { failed }),
                CoordAction::SendRestore { task, id, version, .. } => {
                    // A task restored already ignores another answer (a doubled request), as the
                    // runtime does.
                    let t = task.0 as usize;
                    if self.machines[t].state() != TaskState::Uninit {
                        continue;
                    }
                    self.models[t] = match id {
                        Some(id) => {
                            assert!(
                                self.commits.iter().any(|c| c.id == id),
                                "{task} told to restore {id}, which never committed"
                            );
                            self.snapshots[&(t, id)].clone()
                        }
                        None => self.empty(t),
                    };
                    if t == 0 && id.is_some() && self.durable_commit.as_ref().is_none_or(|c| Some(c.id) != id) {
                        self.stats.consensus_restores += 1;
                    }
                    let acts = self.machines[t].handle(TaskInput::Restored { id, version });
                    self.task_actions(t, acts);
                }
                CoordAction::Finished { outcome: Err(_), .. } => self.stats.failed_checkpoints += 1,
                CoordAction::Finished { .. } | CoordAction::Health { .. } | CoordAction::RejectedReport { .. } => {}
            }
        }
    }

    /// The committed state of every task equals the reference computed from the source offsets.
    fn check_consistent(&self, r: &CommitRecord) {
        let (s_n, a_n) = (self.sources, self.aggs);
        let version = |s: usize| r.versions.get(&TaskId(s as u32)).copied().unwrap_or(Version(0)).0;
        // Rows of source s with offset < v routed to agg a: offsets o with (o + s) % A == a.
        let routed =
            |s: usize, v: u64, a: usize| (0..v).filter(|o| (o + s as u64) % a_n as u64 == a as u64).count() as u64;
        for s in 0..s_n {
            let m = &self.snapshots[&(s, r.id)];
            assert_eq!(m.emitted, version(s), "source t{s} state differs from its recorded offset in {}", r.id);
        }
        for a in 0..a_n {
            let m = &self.snapshots[&(s_n + a, r.id)];
            for s in 0..s_n {
                assert_eq!(
                    m.consumed[s],
                    routed(s, version(s), a),
                    "agg t{} in {} is not a consistent cut",
                    s_n + a,
                    r.id
                );
            }
        }
        for k in 0..self.sinks {
            let m = &self.snapshots[&(s_n + a_n + k, r.id)];
            for a in 0..a_n {
                let agg = &self.snapshots[&(s_n + a, r.id)];
                assert_eq!(
                    m.consumed[a],
                    agg.forwarded[k],
                    "sink t{} in {} is not a consistent cut",
                    s_n + a_n + k,
                    r.id
                );
            }
        }
    }

    fn push(&mut self, from: usize, to: TaskId, item: Item) -> Seq {
        let ci = self.chan_of[&(from as u32, to.0)];
        let ch = &mut self.channels[ci];
        let seq = Seq(ch.sent);
        ch.sent += 1;
        ch.q.push_back((item, seq));
        seq
    }

    fn task_actions(&mut self, t: usize, acts: Vec<TaskAction>) {
        let me = TaskId(t as u32);
        for a in acts {
            match a {
                TaskAction::Discarded(_) => self.stats.discarded += 1,
                TaskAction::QueueSourceTrigger { id, .. } => self.queued_trigger[t] = Some(id),
                TaskAction::CloseInput(i) => self.closed[t][i] = true,
                TaskAction::ReopenInput(i) => self.closed[t][i] = false,
                TaskAction::ReopenAllInputs => self.closed[t].iter_mut().for_each(|c| *c = false),
                TaskAction::Snapshot { id, trans, .. } => {
                    let fail = self.faults && self.rng.chance(20);
                    let result = if fail { Err("disk full".to_string()) } else { Ok(()) };
                    if result.is_ok() {
                        self.snapshots.insert((t, id), self.models[t].clone());
                        let downs = self.config[t].downstreams.clone();
                        let mut dispatched = Vec::new();
                        for (d, _) in downs {
                            let seq = self.push(t, d, Item::Trigger { id, trans, seq: Seq(0) });
                            let ci = self.chan_of[&(t as u32, d.0)];
                            if let Some((Item::Trigger { seq: s, .. }, _)) = self.channels[ci].q.back_mut() {
                                *s = seq;
                            }
                            dispatched.push((d, seq));
                        }
                        let acts = self.machines[t].handle(TaskInput::SnapshotTaken { id, result });
                        self.task_actions(t, acts);
                        for (to, seq) in dispatched {
                            let acts = self.machines[t].handle(TaskInput::TriggerDispatched { to, seq });
                            self.task_actions(t, acts);
                        }
                    } else {
                        let acts = self.machines[t].handle(TaskInput::SnapshotTaken { id, result });
                        self.task_actions(t, acts);
                    }
                }
                TaskAction::InjectTrigger { .. } => self.stats.injected += 1,
                TaskAction::Upload { id } => {
                    let due = self.now + 1 + self.rng.below(300);
                    self.uploads.push((due, t, id));
                }
                TaskAction::SendReady { to, id, .. } => self.send(to, TaskInput::Ready { from: me, id }),
                TaskAction::SendReadyRsp { to, id } => self.send(to, TaskInput::ReadyRsp { from: me, id }),
                TaskAction::SendRetrieveTrigger { to, id, .. } => {
                    self.stats.retrieves += 1;
                    self.send(to, TaskInput::RetrieveTrigger { from: me, id })
                }
                TaskAction::SendTriggerRsp { to, id, trans, code, trigger_seq } => {
                    // The receiver fills in how far its channel got when the answer arrives.
                    self.send(
                        to,
                        TaskInput::TriggerRsp { from: me, id, trans, code, trigger_seq, next_seq: Seq(u64::MAX) },
                    )
                }
                TaskAction::SendSourceRsp { .. } => {}
                TaskAction::SendReport(r) => {
                    self.send_coord(CoordInput::Report { task: me, report: r });
                }
                TaskAction::PersistCommitted { id, .. } => self.persisted[t] = id,
                TaskAction::DeleteSnapshotsBefore(_) | TaskAction::DropSnapshot(_) => {}
            }
        }
    }

    fn deliver_ctl(&mut self, c: Ctl) {
        match c {
            Ctl::ToCoord(input) => {
                if let CoordInput::Report { task, report } = &input
                    && self.coord.in_flight() == Some(report.id)
                {
                    self.reports.entry(report.id).or_default().insert(task.0, report.outcome.is_ok());
                }
                self.note(format!("coord <- {input:?}").chars().take(120).collect());
                let acts = self.coord.handle(input);
                self.coord_actions(acts);
            }
            Ctl::ToTask(t, mut input) => {
                let ti = t.0 as usize;
                if let TaskInput::TriggerRsp { from, next_seq, .. } = &mut input {
                    let ci = self.chan_of[&(from.0, t.0)];
                    *next_seq = Seq(self.channels[ci].delivered);
                }
                let reset = if let TaskInput::Reset { failed } = input { Some(failed) } else { None };
                self.note(format!("t{ti} <- {input:?}").chars().take(120).collect());
                let acts = self.machines[ti].handle(input);
                self.task_actions(ti, acts);
                if let (Some(failed), TaskState::Checkpointing(x)) = (reset, self.machines[ti].state()) {
                    assert!(x > failed, "t{ti} still checkpointing {x} after a reset of {failed}");
                }
            }
        }
    }

    fn source_step(&mut self, s: usize) {
        if let Some(id) = self.queued_trigger[s].take() {
            let offset = Version(self.models[s].emitted);
            let acts = self.machines[s].handle(TaskInput::SourceReachedTrigger { id, offset });
            self.task_actions(s, acts);
            return;
        }
        if self.machines[s].state() == TaskState::Uninit {
            return;
        }
        let downs = self.config[s].downstreams.clone();
        if downs.iter().any(|(d, _)| self.channels[self.chan_of[&(s as u32, d.0)]].q.len() >= CAP) {
            return; // back-pressure
        }
        for _ in 0..1 + self.rng.below(4) {
            let o = self.models[s].emitted;
            let a = (o + s as u64) % self.aggs as u64;
            let to = TaskId((self.sources + a as usize) as u32);
            self.push(s, to, Item::Row { s, o });
            self.models[s].emitted += 1;
        }
    }

    fn deliver_data(&mut self, ci: usize) {
        let (from, to) = (self.channels[ci].from, self.channels[ci].to);
        let t = to.0 as usize;
        let input = self.config[t].upstreams.iter().position(|(u, _)| *u == from).expect("upstream");
        if self.closed[t][input] || self.machines[t].state() == TaskState::Uninit {
            return;
        }
        if let Some((Item::Row { o, .. }, _)) = self.channels[ci].q.front()
            && t < self.sources + self.aggs
        {
            let k = (o % self.sinks as u64) as usize;
            let sink = (self.sources + self.aggs + k) as u32;
            if self.channels[self.chan_of[&(t as u32, sink)]].q.len() >= CAP {
                return; // back-pressure
            }
        }
        let Some((item, _)) = self.channels[ci].q.pop_front() else { return };
        self.channels[ci].delivered += 1;
        match item {
            Item::Row { s, o } => {
                self.models[t].consumed[input] += 1;
                if t < self.sources + self.aggs {
                    // An agg forwards each row to sink o % K.
                    let k = (o % self.sinks as u64) as usize;
                    self.models[t].forwarded[k] += 1;
                    let sink = TaskId((self.sources + self.aggs + k) as u32);
                    let _ = s;
                    self.push(t, sink, Item::Row { s: t, o });
                }
            }
            Item::Trigger { id, trans, .. } => {
                let acts = self.machines[t].handle(TaskInput::Trigger { from, id, trans });
                self.task_actions(t, acts);
            }
        }
    }

    fn tick(&mut self) {
        self.now += 1 + self.rng.below(20);
        let now = self.now;
        for t in 0..self.n() {
            let acts = self.machines[t].handle(TaskInput::Tick { now });
            self.task_actions(t, acts);
        }
        let acts = self.coord.handle(CoordInput::Tick { now });
        self.coord_actions(acts);
        // Due uploads complete (or fail).
        let due: Vec<_> = self.uploads.iter().filter(|u| u.0 <= now).copied().collect();
        self.uploads.retain(|u| u.0 > now);
        for (_, t, id) in due {
            let fail = self.faults && self.rng.chance(20);
            self.stats.store_failures += fail as u64;
            let result = if fail {
                Err("store unreachable".to_string())
            } else {
                Ok(UploadDone { manifest_crc: 1, bytes: 10, files: 1, upload_us: 5 })
            };
            let acts = self.machines[t].handle(TaskInput::Uploaded { id, result });
            self.task_actions(t, acts);
        }
    }

    fn step(&mut self) {
        self.stats.steps += 1;
        // Data moves much faster than timers fire: most steps move rows, few advance the clock.
        match self.rng.below(20) {
            0..=4 => {
                let s = self.rng.below(self.sources as u64) as usize;
                self.source_step(s);
            }
            5..=12 => {
                let busy: Vec<usize> = (0..self.channels.len()).filter(|c| !self.channels[*c].q.is_empty()).collect();
                if !busy.is_empty() {
                    let ci = busy[self.rng.below(busy.len() as u64) as usize];
                    self.deliver_data(ci);
                }
            }
            13..=16 => {
                // Any due control message, in random order (reordering).
                let due: Vec<usize> = (0..self.ctl.len()).filter(|i| self.ctl[*i].0 <= self.now).collect();
                if !due.is_empty() {
                    let i = due[self.rng.below(due.len() as u64) as usize];
                    let (_, c) = self.ctl.swap_remove(i);
                    self.deliver_ctl(c);
                }
            }
            17..=18 => self.tick(),
            _ => {
                if self.faults && self.rng.chance(10) {
                    self.restart();
                } else {
                    self.tick();
                }
            }
        }
    }
}

fn run_seed(seed: u64) -> Result<(usize, Stats), String> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sim = Sim::new(seed);
        let fault_steps = 3_000 + sim.rng.below(3_000);
        let mut steps = 0u64;
        while steps < fault_steps {
            sim.step();
            steps += 1;
        }
        // Faults stop: a checkpoint must commit within bounded simulated time.
        sim.faults = false;
        let committed = sim.commits.len();
        let quiet_start = sim.now;
        let bound = 4 * (sim.coord_cfg.interval_ms + sim.coord_cfg.timeout_ms) + TRIGGER_TIMEOUT;
        while sim.commits.len() < committed + 2 {
            if sim.now - quiet_start > bound {
                let trace: Vec<String> = sim.trace.iter().cloned().collect();
                let states: Vec<String> = (0..sim.n())
                    .map(|t| {
                        format!(
                            "t{t}: {:?} latest {} failed {:?} closed {:?} queued {:?}\n    {:?}",
                            sim.machines[t].state(),
                            sim.machines[t].latest(),
                            sim.machines[t].failed(),
                            sim.closed[t],
                            sim.queued_trigger[t],
                            sim.machines[t]
                        )
                    })
                    .collect();
                let chans: Vec<String> =
                    sim.channels.iter().map(|c| format!("{}->{}: {} queued", c.from, c.to, c.q.len())).collect();
                panic!(
                    "no commit within {bound} ms after faults stopped\n{}\n{}\nlast steps:\n{}",
                    states.join("\n"),
                    chans.join("\n"),
                    trace.join("\n")
                );
            }
            sim.step();
            steps += 1;
        }
        let _ = steps;
        (sim.commits.len(), sim.stats)
    }));
    outcome.map_err(|e| {
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
            Ok((c, _)) => commits += c,
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
        (sim.now, sim.commits.iter().map(|c| c.id).collect::<Vec<_>>(), sim.trace.iter().cloned().collect::<Vec<_>>())
    };
    assert_eq!(run(42), run(42));
}

#[test]
fn the_checker_catches_an_inconsistent_commit() {
    // Corrupt one committed snapshot: the consistency check must fail.
    let mut sim = Sim::new(7);
    sim.faults = false;
    while sim.commits.is_empty() {
        sim.step();
    }
    let record = sim.commits[0].clone();
    let agg = sim.sources;
    sim.snapshots.get_mut(&(agg, record.id)).unwrap().consumed[0] += 1;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.check_consistent(&record)));
    assert!(caught.is_err(), "an inconsistent cut went unnoticed");
}

#[test]
fn the_simulation_really_goes_through_faults() {
    let mut total = Stats::default();
    let mut commits = 0;
    for seed in 0..200 {
        let (c, s) = run_seed(900_000 + seed).unwrap_or_else(|e| panic!("seed {}: {e}", 900_000 + seed));
        commits += c;
        total.steps += s.steps;
        total.restarts += s.restarts;
        total.lost += s.lost;
        total.duplicated += s.duplicated;
        total.failed_checkpoints += s.failed_checkpoints;
        total.retrieves += s.retrieves;
        total.injected += s.injected;
        total.discarded += s.discarded;
        total.store_failures += s.store_failures;
        total.records_lost += s.records_lost;
        total.consensus_restores += s.consensus_restores;
    }
    let t = total;
    assert!(commits > 400, "{commits} commits");
    assert!(t.steps > 600_000, "{t:?}");
    for (what, n) in [
        ("restarts", t.restarts),
        ("lost messages", t.lost),
        ("duplicates", t.duplicated),
        ("failed checkpoints", t.failed_checkpoints),
        ("retrieve requests", t.retrieves),
        ("discarded inputs", t.discarded),
        ("store failures", t.store_failures),
        ("lost commit records", t.records_lost),
        ("consensus restores", t.consensus_restores),
    ] {
        assert!(n > 0, "no {what} in 200 seeds: {t:?}");
    }
}
