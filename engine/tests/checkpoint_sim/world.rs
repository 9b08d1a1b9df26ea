//! The simulated world the drivers run in: a seeded random source, the topology and its routing,
//! model tasks on FIFO channels, the control-message scheduler, and a faulty in-memory store that
//! holds the remote state (snapshots, commit records, the id record) through the real codecs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use weir_engine::backup::commit_point::CommitBook;

use super::store::FaultyStore;
use weir_engine::checkpoint::driver::UploadRequest;
use weir_engine::checkpoint::driver::{RestorePoint, TaskDriver};
use weir_engine::checkpoint::{CommitRecord, TaskSetup};
use weir_engine::checkpoint::{CoordInput, TaskInput};
use weir_engine::wire::msg::RestoreBasis;
use weir_engine::wire::{CheckpointId, NodeId, Seq, TaskId, TransId, Version};

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// How one level sends to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Each task to one downstream (`i % n`).
    Fixed,
    /// Each row by its offset.
    Shuffle,
}

/// The shape of the simulated stream.
#[derive(Clone, Debug)]
pub struct Topology {
    pub sources: usize,
    pub aggs: usize,
    pub sinks: usize,
    pub source_dispatch: Dispatch,
    pub agg_dispatch: Dispatch,
    /// Rows each source emits before it ends.
    pub limit: u64,
}

impl Topology {
    pub fn random(rng: &mut Rng) -> Self {
        let sources = 1 + rng.below(3) as usize;
        let source_dispatch = if rng.chance(300) { Dispatch::Fixed } else { Dispatch::Shuffle };
        // Fixed dispatch needs every downstream to have an upstream.
        let max_aggs = if source_dispatch == Dispatch::Fixed { sources } else { 3 };
        let aggs = 1 + rng.below(max_aggs as u64) as usize;
        let agg_dispatch = if rng.chance(300) { Dispatch::Fixed } else { Dispatch::Shuffle };
        let max_sinks = if agg_dispatch == Dispatch::Fixed { aggs.min(2) } else { 2 };
        let sinks = 1 + rng.below(max_sinks as u64) as usize;
        Topology { sources, aggs, sinks, source_dispatch, agg_dispatch, limit: 300 + rng.below(1_200) }
    }

    pub fn n(&self) -> usize {
        self.sources + self.aggs + self.sinks
    }

    /// The agg (index within its level) that row `o` of source `s` goes to.
    pub fn agg_of(&self, s: usize, o: u64) -> usize {
        match self.source_dispatch {
            Dispatch::Fixed => s % self.aggs,
            Dispatch::Shuffle => ((o + s as u64) % self.aggs as u64) as usize,
        }
    }

    /// The sink (index within its level) that agg `a` sends row `o` to.
    pub fn sink_of(&self, a: usize, o: u64) -> usize {
        match self.agg_dispatch {
            Dispatch::Fixed => a % self.sinks,
            Dispatch::Shuffle => (o % self.sinks as u64) as usize,
        }
    }

    /// Downstream task indices of task `i`.
    pub fn downstreams(&self, i: usize) -> Vec<usize> {
        let (s, a) = (self.sources, self.aggs);
        if i < s {
            match self.source_dispatch {
                Dispatch::Fixed => vec![s + i % a],
                Dispatch::Shuffle => (s..s + a).collect(),
            }
        } else if i < s + a {
            match self.agg_dispatch {
                Dispatch::Fixed => vec![s + a + (i - s) % self.sinks],
                Dispatch::Shuffle => (s + a..self.n()).collect(),
            }
        } else {
            Vec::new()
        }
    }

    /// Upstream task indices of task `i`, in input order.
    pub fn upstreams(&self, i: usize) -> Vec<usize> {
        (0..self.n()).filter(|u| self.downstreams(*u).contains(&i)).collect()
    }

    pub fn node(&self, i: usize) -> NodeId {
        NodeId(1 + (i % 2) as u32)
    }
}

/// Model state of a task: what it has consumed and emitted (the "operator state").
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    /// Source: rows emitted.
    pub emitted: u64,
    /// Rows consumed per input.
    pub consumed: Vec<u64>,
    /// Agg: rows forwarded per output.
    pub forwarded: Vec<u64>,
    /// Agg: rows forwarded per (output, source): each result's value is its rank there, so a
    /// row counted twice or missed shifts every later result (a sink upserts the values, as the
    /// result store does: a value is fixed where it is computed).
    pub ranks: BTreeMap<(usize, usize), u64>,
}

fn list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn parse_list(s: &str) -> Option<Vec<u64>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',').map(|v| v.parse().ok()).collect()
}

impl Model {
    pub fn encode(&self, version: Version) -> Vec<u8> {
        let ranks: Vec<String> = self.ranks.iter().map(|((i, s), n)| format!("{i}:{s}:{n}")).collect();
        format!("{}|{}|{}|{}|{}", version.0, self.emitted, list(&self.consumed), list(&self.forwarded), ranks.join(","))
            .into_bytes()
    }

    pub fn decode(b: &[u8]) -> Option<(Model, Version)> {
        let s = std::str::from_utf8(b).ok()?;
        let p: Vec<&str> = s.split('|').collect();
        if p.len() != 5 {
            return None;
        }
        let mut ranks = BTreeMap::new();
        for r in p[4].split(',').filter(|r| !r.is_empty()) {
            let q: Vec<u64> = r.split(':').map(|v| v.parse().ok()).collect::<Option<_>>()?;
            ranks.insert((q[0] as usize, q[1] as usize), q[2]);
        }
        let m = Model { emitted: p[1].parse().ok()?, consumed: parse_list(p[2])?, forwarded: parse_list(p[3])?, ranks };
        Some((m, Version(p[0].parse().ok()?)))
    }
}

/// Key of task `t`'s snapshot of checkpoint `id` in the store.
pub fn snapshot_key(t: usize, id: CheckpointId) -> String {
    format!("1/tasks/{t}/chk-{}/state", id.0)
}

#[derive(Clone, Debug)]
pub enum Item {
    /// Row `o` of source `s`; `v` its value once an agg computed it (0 before).
    Row {
        s: usize,
        o: u64,
        v: u64,
    },
    Trigger {
        id: CheckpointId,
        trans: TransId,
    },
    End,
}

/// Control traffic and completions, delivered at a time.
#[derive(Clone, Debug)]
pub enum Ctl {
    ToTask(TaskId, TaskInput),
    ToCoord(CoordInput),
    /// The coordinator's restore point for a task, answering its request.
    Restore(TaskId, Option<RestorePoint>, RestoreBasis, u64),
    /// A store write's answer to coordinator incarnation `n`.
    StoreDone(u64, CoordInput),
}

pub struct Channel {
    pub from: usize,
    pub to: usize,
    pub q: VecDeque<(Item, Seq)>,
    pub sent: u64,
    /// The next sequence number the receiver expects.
    pub expected: u64,
    /// The receiver takes nothing from it before then.
    pub stalled_until: u64,
}

/// What a run went through, to show the faults really happen.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub steps: u64,
    pub restarts: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub failed_checkpoints: u64,
    pub retrieves: u64,
    pub injected: u64,
    pub discarded: u64,
    pub upload_failures: u64,
    pub snapshot_failures: u64,
    pub records_lost: u64,
    pub consensus_restores: u64,
    pub fresh_records: u64,
    pub data_lost: u64,
    pub data_duplicated: u64,
    pub gaps_detected: u64,
    pub coordinator_crashes: u64,
    pub crashes_after_commit_write: u64,
    pub store_hangs: u64,
    pub put_failures: u64,
    pub visible_despite_error: u64,
    pub id_record_failures: u64,
    pub commit_write_failures: u64,
    pub partitions: u64,
    pub restore_failures: u64,
    pub restores_from_store: u64,
    pub refusals: u64,
    pub ended_streams: u64,
    pub damaged_snapshots: u64,
    pub fallbacks: u64,
    pub halts: u64,
    pub fenced_writes: u64,
    pub control_txn_cut: u64,
    pub control_txn_lost: u64,
    pub control_reads_failed: u64,
    pub cut_inputs: u64,
    pub rows_past_cuts: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        add!(
            steps,
            restarts,
            lost,
            duplicated,
            failed_checkpoints,
            retrieves,
            injected,
            discarded,
            upload_failures,
            snapshot_failures,
            records_lost,
            consensus_restores,
            fresh_records,
            data_lost,
            data_duplicated,
            gaps_detected,
            coordinator_crashes,
            crashes_after_commit_write,
            store_hangs,
            put_failures,
            visible_despite_error,
            id_record_failures,
            commit_write_failures,
            partitions,
            restore_failures,
            restores_from_store,
            refusals,
            ended_streams,
            damaged_snapshots,
            cut_inputs,
            rows_past_cuts,
            fallbacks,
            halts,
            fenced_writes,
            control_txn_cut,
            control_txn_lost,
            control_reads_failed
        );
    }
}

/// A simulated task: its driver and what it did.
pub struct SimTask {
    pub driver: TaskDriver<Model>,
    /// Ended for good (sent its end of stream downstream): it takes nothing any more.
    pub finished: bool,
    /// The highest checkpoint this incarnation was told to reset: it must never checkpoint an id
    /// at or below it again.
    pub reset_upto: Option<CheckpointId>,
}

/// Everything but the drivers.
pub struct World {
    pub rng: Rng,
    pub now: u64,
    pub faults: bool,
    pub topo: Topology,
    pub setups: Vec<TaskSetup>,
    pub models: Vec<Model>,
    pub closed: Vec<Vec<bool>>,
    /// Per task and input: taken on past its barrier ([`Hold::Cut`](weir_engine::checkpoint::driver::Hold)).
    pub cuts: Vec<Vec<Option<super::cuts::Cut>>>,
    pub queued_trigger: Vec<Option<CheckpointId>>,
    pub channels: Vec<Channel>,
    pub chan_of: BTreeMap<(usize, usize), usize>,
    pub ctl: Vec<(u64, Ctl)>,
    pub uploads: Vec<(u64, usize, UploadRequest<Model>)>,
    pub store: Arc<FaultyStore>,
    /// Where the coordinator reserves ids and commits: the store alone, or a control store.
    pub book: Arc<dyn CommitBook>,
    /// The seed's control store, when its commit point is kept there.
    pub control: Option<super::control::Control>,
    /// Each task's meta record (survives crashes).
    pub persisted: Vec<Option<(CheckpointId, Version)>>,
    /// The sinks' result store: (source, offset) → value; survives crashes, like the engine's.
    pub results: BTreeMap<(usize, u64), u64>,
    /// Every commit record that became visible in the store.
    pub commits: Vec<CommitRecord>,
    /// Every record a coordinator wrote (or tried to), by id: one record per id, ever.
    pub written: BTreeMap<CheckpointId, CommitRecord>,
    /// Reports the coordinator received, by checkpoint: task → ok.
    pub reports: BTreeMap<CheckpointId, BTreeMap<usize, bool>>,
    /// (id, transaction) pairs of started checkpoints, with the coordinator call that started them.
    pub issued: BTreeMap<(CheckpointId, TransId), u64>,
    /// The id record as last seen after a reservation: it never goes back.
    pub ids_seen: Option<weir_engine::checkpoint::IdRecord>,
    pub coord_call: u64,
    pub coord_incarnation: u64,
    pub crash_coordinator: bool,
    /// Node 2 cut off until then.
    pub partition_until: Option<u64>,
    /// Checkpoints the coordinator ended, and when.
    pub ended: Vec<(CheckpointId, u64)>,
    /// Inputs (task, input) whose end of stream arrived, in this incarnation.
    pub ended_inputs: BTreeSet<(usize, usize)>,
    /// When the faults stopped.
    pub quiet_since: Option<u64>,
    pub trace: VecDeque<String>,
    pub stats: Stats,
    /// (task, checkpoint) snapshots damaged everywhere: restoring one fails as damaged.
    pub damaged: BTreeSet<(usize, CheckpointId)>,
    /// Why the coordinator halted the stream (every node restarts then).
    pub halted: Option<String>,
}

impl World {
    /// Faults stop: the scheduler's, the store's and the control store's.
    pub fn faults_off(&mut self) {
        self.faults = false;
        self.store.set_faults(false);
        if let Some(c) = &self.control {
            c.set_faults(false);
        }
    }

    /// The commits the control store lists (`None`: the store's records are the commits).
    pub fn listed(&self) -> Option<Vec<weir_engine::backup::commit::Point>> {
        self.control.as_ref().map(|c| c.listed(&self.store))
    }

    /// The newest commit id the control store names (`None`: the store's records are the
    /// commits; id 0: none yet).
    pub fn point(&self) -> Option<CheckpointId> {
        self.listed().map(|l| l.last().map_or(CheckpointId(0), |p| p.id))
    }

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

    pub fn partitioned(&self, a: usize, b: usize) -> bool {
        let node = |i: usize| if i == super::COORD { NodeId(1) } else { self.topo.node(i) };
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

    pub fn delay(&mut self) -> u64 {
        self.now + 1 + self.rng.below(if self.faults { 400 } else { 50 })
    }

    pub fn push(&mut self, from: usize, to: usize, item: Item) -> Seq {
        let ch = &mut self.channels[self.chan_of[&(from, to)]];
        let seq = Seq(ch.sent);
        ch.sent += 1;
        ch.q.push_back((item, seq));
        seq
    }
}
