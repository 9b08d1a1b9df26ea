//! What a stream is: its typed specification, the task graph derived from it, and the placement
//! of tasks on nodes.
//!
//! Task ids are fixed by the spec: sources `0..P`, aggs `B..B+A`, sinks `B+A..B+A+S`, where `B`
//! ([`StreamSpec::first_agg_task`]) is `P` until a rescale moves it past every id the stream
//! used: a task id is never reused, so no file of an old task can pass for a new one's.
//! Every source feeds every agg and every agg feeds every sink, by key hash (shuffle); with one
//! downstream the dispatch is fixed.

use std::collections::BTreeMap;

use weir_wire::{NodeId, StreamId, TaskId};

use crate::operator::generator::GeneratorSpec;
use crate::operator::window::WindowSpec;
pub use crate::spec_error::SpecError;

/// Where a stream's rows come from.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceKind {
    /// The deterministic generator (benchmarks, `weir run`).
    Generator {
        /// Generator settings.
        spec: GeneratorSpec,
        /// Rows per partition, then the source ends; `None` runs until stopped.
        limit: Option<u64>,
        /// Rows per second per partition (wall clock); `None` is as fast as possible.
        rate: Option<u64>,
    },
    /// The node's durable ingest log (fed by `weir load`).
    IngestLog,
}

/// Aggregates a stream computes (all are kept; this selects what is shown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregate {
    /// Rows.
    Count,
    /// Sum.
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average.
    Avg,
}

/// Tasks a stream has at most (sources, aggs and sinks together): a spec, a commit record or a
/// catalog change that names more is refused before anything is sized by it.
pub const MAX_TASKS: u32 = 4096;

/// A stream's specification.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamSpec {
    /// Stream id.
    pub id: StreamId,
    /// Human-readable name.
    pub name: String,
    /// Source kind.
    pub source: SourceKind,
    /// Source partitions (one source task each).
    pub partitions: u32,
    /// Rows per batch a source emits.
    pub batch_rows: usize,
    /// Agg tasks.
    pub agg_parallelism: u32,
    /// Window shape.
    pub window: WindowSpec,
    /// Watermark delay (ms): how much disorder is tolerated before rows count as late.
    pub watermark_delay_ms: i64,
    /// Aggregates shown.
    pub aggregates: Vec<Aggregate>,
    /// Sink tasks.
    pub sink_parallelism: u32,
    /// The id of the first agg task (`None`: right after the sources).
    pub first_agg_task: Option<u32>,
}

impl StreamSpec {
    /// The stream's shape as status reports it.
    pub fn info(&self) -> weir_wire::msg::StreamInfo {
        weir_wire::msg::StreamInfo {
            stream: self.id,
            name: self.name.clone(),
            ingest: matches!(self.source, SourceKind::IngestLog),
            partitions: self.partitions,
            aggs: self.agg_parallelism,
            sinks: self.sink_parallelism,
            first_agg_task: self.agg_base(),
            window_ms: self.window.size_ms,
            slide_ms: self.window.slide_ms,
            watermark_delay_ms: self.watermark_delay_ms,
        }
    }

    /// A generator stream with the benchmark shape: 10,000 keys, 1 s tumbling windows.
    pub fn generator(id: StreamId, partitions: u32, aggs: u32, sinks: u32) -> Self {
        Self {
            id,
            name: format!("stream-{}", id.0),
            source: SourceKind::Generator { spec: GeneratorSpec::default(), limit: None, rate: None },
            partitions,
            batch_rows: 4096,
            agg_parallelism: aggs,
            window: WindowSpec::tumbling(1000),
            watermark_delay_ms: 0,
            aggregates: vec![Aggregate::Count, Aggregate::Sum, Aggregate::Min, Aggregate::Max, Aggregate::Avg],
            sink_parallelism: sinks,
            first_agg_task: None,
        }
    }

    /// The id of the first agg task.
    pub fn agg_base(&self) -> u32 {
        self.first_agg_task.unwrap_or(self.partitions)
    }

    /// Checks the spec; the error names the field.
    pub fn validate(&self) -> Result<(), SpecError> {
        let (partitions, aggs, sinks) = (self.partitions, self.agg_parallelism, self.sink_parallelism);
        if partitions == 0 || aggs == 0 || sinks == 0 {
            return Err(SpecError::Parallelism { partitions, aggs, sinks });
        }
        if u64::from(partitions) + u64::from(aggs) + u64::from(sinks) > u64::from(MAX_TASKS) {
            return Err(SpecError::TooManyTasks { partitions, aggs, sinks });
        }
        if let Some(first) = self.first_agg_task
            && (first < partitions || u64::from(first) + u64::from(aggs) + u64::from(sinks) > u64::from(u32::MAX))
        {
            return Err(SpecError::FirstAggTask { first, partitions });
        }
        if self.batch_rows == 0 || self.batch_rows > 1 << 20 {
            return Err(SpecError::BatchRows(self.batch_rows));
        }
        if self.watermark_delay_ms < 0 {
            return Err(SpecError::WatermarkDelay(self.watermark_delay_ms));
        }
        self.window.validate()?;
        if let SourceKind::Generator { spec, rate, .. } = &self.source {
            spec.validate()?;
            if *rate == Some(0) {
                return Err(SpecError::ZeroRate);
            }
        }
        Ok(())
    }

    /// The task graph.
    pub fn topology(&self) -> Topology {
        let (p, a, s) = (self.partitions, self.agg_parallelism, self.sink_parallelism);
        let ids = |from: u32, n: u32| (from..from + n).map(TaskId).collect::<Vec<_>>();
        let b = self.agg_base();
        let (sources, aggs, sinks) = (ids(0, p), ids(b, a), ids(b + a, s));
        let mut tasks = Vec::new();
        for (i, t) in sources.iter().enumerate() {
            let kind = TaskKind::Source { partition: i as u32 };
            let dispatch = Dispatch::for_downstreams(aggs.len());
            tasks.push(TaskDesc { id: *t, kind, upstreams: vec![], downstreams: aggs.clone(), dispatch });
        }
        for (i, t) in aggs.iter().enumerate() {
            let kind = TaskKind::Agg { index: i as u32 };
            let dispatch = Dispatch::for_downstreams(sinks.len());
            tasks.push(TaskDesc { id: *t, kind, upstreams: sources.clone(), downstreams: sinks.clone(), dispatch });
        }
        for (i, t) in sinks.iter().enumerate() {
            let kind = TaskKind::Sink { index: i as u32 };
            tasks.push(TaskDesc {
                id: *t,
                kind,
                upstreams: aggs.clone(),
                downstreams: vec![],
                dispatch: Dispatch::Fixed,
            });
        }
        Topology { stream: self.id, tasks }
    }
}

/// The role of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// Reads partition `partition`.
    Source {
        /// Partition.
        partition: u32,
    },
    /// Window aggregation.
    Agg {
        /// Index among the aggs.
        index: u32,
    },
    /// Writes results.
    Sink {
        /// Index among the sinks.
        index: u32,
    },
}

/// One task of the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDesc {
    /// Id.
    pub id: TaskId,
    /// Role.
    pub kind: TaskKind,
    /// Tasks it reads from, in input-index order.
    pub upstreams: Vec<TaskId>,
    /// Tasks it writes to, in output-index order.
    pub downstreams: Vec<TaskId>,
    /// How a row picks its downstream.
    pub dispatch: Dispatch,
}

/// How rows are routed to downstream tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Everything to the single downstream (or none, for a sink).
    Fixed,
    /// By key hash over the downstreams, so each key always reaches the same task.
    Shuffle,
}

impl Dispatch {
    /// For a task with `n` downstreams.
    pub fn for_downstreams(n: usize) -> Self {
        if n > 1 { Dispatch::Shuffle } else { Dispatch::Fixed }
    }

    /// The output index of a row with `key`, among `n`.
    #[inline]
    pub fn pick(self, key: u64, n: usize) -> usize {
        match self {
            Dispatch::Fixed => 0,
            Dispatch::Shuffle => shuffle(key, n),
        }
    }
}

/// A stream's task graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Stream.
    pub stream: StreamId,
    /// Tasks in id order.
    pub tasks: Vec<TaskDesc>,
}

impl Topology {
    /// The task with id `t`.
    pub fn task(&self, t: TaskId) -> Option<&TaskDesc> {
        self.tasks.binary_search_by_key(&t, |d| d.id).ok().map(|i| &self.tasks[i])
    }

    /// The source task of `partition`.
    pub fn source_of(&self, partition: u32) -> Option<TaskId> {
        self.tasks.iter().find(|t| t.kind == TaskKind::Source { partition }).map(|t| t.id)
    }
}

/// Which node runs each task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    nodes: BTreeMap<TaskId, NodeId>,
    default: NodeId,
}

impl Placement {
    /// Every task on `node`.
    pub fn single(node: NodeId) -> Self {
        Self { nodes: BTreeMap::new(), default: node }
    }

    /// Tasks spread over `nodes` by task id, round robin within each level so every node gets
    /// sources, aggs and sinks.
    pub fn spread(topology: &Topology, nodes: &[NodeId]) -> Self {
        let mut p = Self::single(nodes[0]);
        let mut counters = [0usize; 3];
        for t in &topology.tasks {
            let level = match t.kind {
                TaskKind::Source { .. } => 0,
                TaskKind::Agg { .. } => 1,
                TaskKind::Sink { .. } => 2,
            };
            p.nodes.insert(t.id, nodes[counters[level] % nodes.len()]);
            counters[level] += 1;
        }
        p
    }

    /// Puts task `t` on `node`.
    pub fn assign(&mut self, t: TaskId, node: NodeId) {
        self.nodes.insert(t, node);
    }

    /// The node of task `t`.
    pub fn node_of(&self, t: TaskId) -> NodeId {
        self.nodes.get(&t).copied().unwrap_or(self.default)
    }

    /// Every task of `topology` with its node, in task order.
    pub fn tasks_of(&self, topology: &Topology) -> Vec<(TaskId, NodeId)> {
        topology.tasks.iter().map(|t| (t.id, self.node_of(t.id))).collect()
    }

    /// The nodes that run at least one task of `topology`.
    pub fn nodes(&self, topology: &Topology) -> std::collections::BTreeSet<NodeId> {
        topology.tasks.iter().map(|t| self.node_of(t.id)).collect()
    }

    /// The node that keeps a copy of `partition`'s ingest log when the stream keeps two: the
    /// next node after the partition's source's, in id order, among the nodes this placement
    /// gives tasks (wrapping around); `None` when it gives tasks to one node only.
    pub fn ingest_follower(&self, topology: &Topology, partition: u32) -> Option<NodeId> {
        let primary = self.node_of(topology.source_of(partition)?);
        let nodes = self.nodes(topology);
        nodes.range(NodeId(primary.0 + 1)..).next().or_else(|| nodes.iter().next()).copied().filter(|n| *n != primary)
    }

    /// As [`Self::moved`]; with `replicas` of 2, the source of a partition whose node is gone
    /// goes to the node that keeps the copy of its ingest log, when that node is in `to`.
    pub fn moved_with_replicas(&self, topology: &Topology, gone: &[NodeId], to: &[NodeId], replicas: u8) -> Placement {
        let mut pinned = BTreeMap::new();
        if replicas >= 2 {
            for t in &topology.tasks {
                if let TaskKind::Source { partition } = t.kind
                    && gone.contains(&self.node_of(t.id))
                    && let Some(f) = self.ingest_follower(topology, partition).filter(|f| to.contains(f))
                {
                    pinned.insert(t.id, f);
                }
            }
        }
        self.moved_pinned(topology, gone, to, &pinned)
    }

    /// This placement with the tasks of the `gone` nodes moved to the nodes in `to` (which
    /// must not be empty): each moved task goes to the node with the fewest tasks of its level
    /// (sources, aggs, sinks), then the fewest tasks in all, then the lowest id, so the
    /// survivors share the work evenly and every node computes the same placement.
    pub fn moved(&self, topology: &Topology, gone: &[NodeId], to: &[NodeId]) -> Placement {
        self.moved_pinned(topology, gone, to, &BTreeMap::new())
    }

    fn moved_pinned(
        &self,
        topology: &Topology,
        gone: &[NodeId],
        to: &[NodeId],
        pinned: &BTreeMap<TaskId, NodeId>,
    ) -> Placement {
        assert!(!to.is_empty(), "tasks move to at least one node");
        let mut p = Placement { nodes: self.tasks_of(topology).into_iter().collect(), default: self.default };
        let level = |k: TaskKind| match k {
            TaskKind::Source { .. } => 0,
            TaskKind::Agg { .. } => 1,
            TaskKind::Sink { .. } => 2,
        };
        let mut load: BTreeMap<NodeId, ([usize; 3], usize)> = to.iter().map(|n| (*n, ([0; 3], 0))).collect();
        for t in &topology.tasks {
            if let Some(l) = load.get_mut(&p.node_of(t.id)) {
                l.0[level(t.kind)] += 1;
                l.1 += 1;
            }
        }
        for t in &topology.tasks {
            if !gone.contains(&p.node_of(t.id)) {
                continue;
            }
            let lv = level(t.kind);
            let (node, l) = match pinned.get(&t.id) {
                Some(n) => load.iter_mut().find(|(m, _)| *m == n).expect("pinned to a survivor"),
                None => load.iter_mut().min_by_key(|(n, l)| (l.0[lv], l.1, **n)).expect("not empty"),
            };
            l.0[lv] += 1;
            l.1 += 1;
            p.nodes.insert(t.id, *node);
        }
        if gone.contains(&p.default) {
            p.default = to[0];
        }
        p
    }
}

/// Index of the downstream that a row with `key` goes to, among `n`.
#[inline]
pub fn shuffle(key: u64, n: usize) -> usize {
    // Multiplicative hash, then the high bits: fast and well spread for sequential keys.
    (((key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) * n as u64) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_connects_every_level_to_the_next() {
        let t = StreamSpec::generator(StreamId(1), 3, 2, 1).topology();
        assert_eq!(t.tasks.len(), 6);
        assert_eq!(t.task(TaskId(0)).unwrap().downstreams, vec![TaskId(3), TaskId(4)]);
        assert_eq!(t.task(TaskId(4)).unwrap().upstreams, vec![TaskId(0), TaskId(1), TaskId(2)]);
        assert_eq!(t.task(TaskId(5)).unwrap().kind, TaskKind::Sink { index: 0 });
        assert_eq!(t.task(TaskId(0)).unwrap().dispatch, Dispatch::Shuffle);
        assert_eq!(t.task(TaskId(3)).unwrap().dispatch, Dispatch::Fixed);
        assert_eq!(Dispatch::Fixed.pick(12345, 1), 0);
        let p = Placement::spread(&t, &[NodeId(1), NodeId(2)]);
        assert_eq!(p.node_of(TaskId(0)), NodeId(1));
        assert_eq!(p.node_of(TaskId(1)), NodeId(2));
        assert_eq!(p.node_of(TaskId(3)), NodeId(1));
        assert_eq!(p.node_of(TaskId(4)), NodeId(2));
    }

    #[test]
    fn a_rescaled_stream_numbers_its_aggs_and_sinks_past_every_id_it_used() {
        let mut spec = StreamSpec::generator(StreamId(1), 3, 2, 1);
        spec.first_agg_task = Some(6);
        spec.validate().unwrap();
        let t = spec.topology();
        let ids: Vec<u32> = t.tasks.iter().map(|d| d.id.0).collect();
        assert_eq!(ids, vec![0, 1, 2, 6, 7, 8]);
        assert_eq!(t.task(TaskId(0)).unwrap().downstreams, vec![TaskId(6), TaskId(7)]);
        assert_eq!(t.task(TaskId(8)).unwrap().kind, TaskKind::Sink { index: 0 });
        assert_eq!(t.task(TaskId(8)).unwrap().upstreams, vec![TaskId(6), TaskId(7)]);
        assert!(t.task(TaskId(3)).is_none() && t.task(TaskId(9)).is_none());
        assert_eq!(spec.info().first_agg_task, 6);
        spec.first_agg_task = Some(2);
        assert_eq!(spec.validate(), Err(SpecError::FirstAggTask { first: 2, partitions: 3 }));
        spec.first_agg_task = None;
        spec.agg_parallelism = MAX_TASKS;
        assert_eq!(spec.validate(), Err(SpecError::TooManyTasks { partitions: 3, aggs: MAX_TASKS, sinks: 1 }));
    }

    #[test]
    fn a_lost_nodes_tasks_move_to_the_least_loaded_survivor_of_each_level() {
        let t = StreamSpec::generator(StreamId(1), 3, 3, 3).topology();
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        let p = Placement::spread(&t, &[n1, n2, n3]);
        let m = p.moved(&t, &[n3], &[n1, n2]);
        assert!(m.nodes(&t).iter().all(|n| *n != n3), "{m:?}");
        // Tasks of the other nodes stay where they were.
        for (task, node) in p.tasks_of(&t) {
            if node != n3 {
                assert_eq!(m.node_of(task), node);
            }
        }
        // Each level had one task per node: node 3's goes to the survivor with fewer in all.
        let per_node = |n: NodeId| m.tasks_of(&t).iter().filter(|(_, x)| *x == n).count();
        assert_eq!((per_node(n1), per_node(n2)), (5, 4), "{m:?}");
        // The same inputs give the same placement on every node.
        assert_eq!(m, p.moved(&t, &[n3], &[n1, n2]));
        // Nothing to move: the same placement.
        assert_eq!(m.moved(&t, &[n3], &[n1, n2]).tasks_of(&t), m.tasks_of(&t));
    }

    #[test]
    fn shuffle_spreads_keys_evenly() {
        let mut counts = [0u32; 4];
        for k in 0..10_000 {
            counts[shuffle(k, 4)] += 1;
        }
        assert!(counts.iter().all(|c| (2300..2700).contains(c)), "{counts:?}");
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = StreamSpec::generator(StreamId(1), 1, 1, 1);
        assert!(s.validate().is_ok());
        s.agg_parallelism = 0;
        assert!(s.validate().is_err());
        let mut s = StreamSpec::generator(StreamId(1), 1, 1, 1);
        s.window = WindowSpec::hopping(1000, 300);
        assert!(s.validate().unwrap_err().to_string().contains("window"));
    }
}
