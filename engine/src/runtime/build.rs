//! Builds one local task of a stream from its place in the topology and the node's parts (its
//! config, ingest service, result stores): the source's feed, the agg's window state and replay
//! counts, the sink's store. Which queues and credits it gets is [`super::plan`]'s.

use std::sync::Arc;

use weir_wire::Batch;

use super::channel::{Inputs, Outputs};
use super::task::{AggTask, Feed, SinkTask, SourceTask, Task};
use super::{EngineConfig, EngineStats, IngestToken, alignment, board, checkpointing, log_feed, replay, unaligned};
use crate::ingest::IngestService;
use crate::operator::generator::Generator;
use crate::operator::window::WindowAgg;
use crate::spec::{SourceKind, StreamSpec, TaskDesc, TaskKind};
use crate::state::ResultStore;

/// What a node's tasks are built from.
pub(super) struct Parts<'a> {
    pub(super) spec: &'a StreamSpec,
    pub(super) cfg: &'a EngineConfig,
    pub(super) ingest: Option<&'a Arc<IngestService<IngestToken>>>,
    pub(super) stats: &'a Arc<EngineStats>,
    pub(super) board: &'a Arc<board::TaskBoard>,
    /// The task's result store, for a sink.
    pub(super) sink_store: Option<Arc<ResultStore>>,
    /// Aggs on this node (they share the state budget).
    pub(super) aggs_here: usize,
}

/// Task `t` reading `inp` and writing `out`.
pub(super) fn task(t: &TaskDesc, p: &Parts<'_>, inp: Inputs, out: Outputs) -> Task {
    match t.kind {
        TaskKind::Source { partition } => {
            let feed = match &p.spec.source {
                SourceKind::Generator { spec: g, limit, rate } => Feed::Generator {
                    generator: Generator::new(*g, partition),
                    limit: *limit,
                    rate: *rate,
                    started: None,
                },
                SourceKind::IngestLog => {
                    let svc = p.ingest.expect("ingest service");
                    let log = svc.log(partition).expect("partition log");
                    let idle = p.cfg.idle_after.map(|after| log_feed::IdleTimer {
                        after,
                        requests: svc.requests().clone(),
                        stream: p.spec.id,
                        partition,
                        last_data: std::time::Instant::now(),
                        last_marker: None,
                    });
                    Feed::Log(log_feed::LogFeed {
                        reader: log.reader(weir_wire::Version(0)),
                        log: log.clone(),
                        partition,
                        idle,
                    })
                }
            };
            let n = t.downstreams.len();
            Task::Source(Box::new(SourceTask {
                id: t.id,
                feed,
                offset: 0,
                batch_rows: p.spec.batch_rows,
                dispatch: t.dispatch,
                out,
                builders: (0..n).map(|_| Batch::with_capacity(p.spec.batch_rows / n + 16)).collect(),
                max_ts: i64::MIN,
                scratch: Batch::default(),
                ended: false,
                stats: p.stats.clone(),
                board: p.board.clone(),
                queued_trigger: None,
                savepoint: None,
                replay: Default::default(),
            }))
        }
        TaskKind::Agg { .. } => Task::Agg(Box::new(AggTask {
            agg: WindowAgg::new(p.spec.window, p.spec.watermark_delay_ms, t.upstreams.len()),
            spill: None,
            spill_budget: p.cfg.state_budget.map(|b| b / p.aggs_here.max(1)),
            spill_root: checkpointing::restore::task_dir(&p.cfg.data_dir, t.id).join("spill"),
            inp,
            builders: vec![Vec::new(); t.downstreams.len()],
            dispatch: t.dispatch,
            out,
            ended: false,
            stats: p.stats.clone(),
            board: p.board.clone(),
            replay: replay::AggReplay::new(
                p.cfg.checkpoint.as_ref().is_some_and(|c| c.replay),
                t.upstreams.len(),
                p.cfg.checkpoint.as_ref().and_then(|c| c.recovery_budget),
            ),
            cuts: unaligned::Cuts::new(t.upstreams.len()),
            savepoint: None,
            align: alignment::Alignment::new(t.upstreams.len(), alignment::drift_for(p.spec.window.slide_ms)),
        })),
        TaskKind::Sink { .. } => Task::Sink(Box::new(SinkTask {
            id: t.id,
            stream: p.spec.id,
            store: p.sink_store.clone().expect("a sink's result store"),
            inp,
            throttle: p.cfg.sink_throttle,
            stats: p.stats.clone(),
            board: p.board.clone(),
            held: None,
        })),
    }
}
