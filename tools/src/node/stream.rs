//! One stream's supervisor on a `weir node` ([`StreamRunner`]): it starts the stream's runs
//! on the node's [`Node`], watches each ([`supervise`]), and between runs waits as the restart
//! strategy says ([`Supervisor`] decides), the node saying meanwhile why the stream runs none (a
//! [`Standing`]). A stream's runs and restarts touch no other stream of the node.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use weir_engine::cluster::supervisor::{Next, Waited};
use weir_engine::cluster::{RunEnd, Supervisor};
use weir_engine::runtime::{Engine, EngineConfig, Node, Standing, StandingPhase};
use weir_engine::spec::{Placement, StreamSpec};
use weir_engine::wire::msg::RestartInfo;
use weir_engine::wire::{Epoch, NodeId};

use super::wish::{Now, Switch, Wish};
use crate::config::{ClusterFile, NodeEntry, StreamFile};

/// What the streams of a node share: its config, network side, metrics and cluster control.
pub(super) struct NodeParts {
    pub file: ClusterFile,
    pub me: NodeEntry,
    pub node: Arc<Node>,
    /// The node's engine config (its root data directory).
    pub base: EngineConfig,
    pub exit_when_done: bool,
    pub board: Option<Arc<crate::metrics::Board>>,
    pub control: crate::placement::Control,
    pub prober: Option<crate::probe::Prober>,
}

/// One stream's supervisor on a node: it starts the stream's runs, waits between them and says
/// meanwhile why none runs, until the node stops or the restart strategy gives up.
pub(super) struct StreamRunner {
    stream: StreamFile,
    spec: StreamSpec,
    file_placement: Placement,
    /// The stream's own engine config (its data directory).
    base: EngineConfig,
    sup: Supervisor,
    /// Where its runs' metrics go (the node's metrics, labelled with the stream).
    metrics: Option<crate::metrics::StreamMetrics>,
}

impl StreamRunner {
    /// The supervisor of `stream` (a `[stream]` table), its data under `base`'s data directory.
    pub fn new(stream: &StreamFile, file: &ClusterFile, base: &EngineConfig) -> anyhow::Result<StreamRunner> {
        let spec = crate::settings::spec_of(stream)?;
        let file_placement = crate::settings::placement_of(file, stream, &spec);
        let mut base = base.clone();
        base.transport = None;
        let sup = Supervisor::new(crate::failover::policy(&file.restart), crate::failover::last(&base.data_dir)?);
        Ok(StreamRunner { stream: stream.clone(), spec, file_placement, base, sup, metrics: None })
    }

    /// Its runs feed `metrics` (and its ingest writer does).
    pub fn with_metrics(mut self, metrics: crate::metrics::StreamMetrics) -> Self {
        self.base.ingest_observer = Some(metrics.ingest());
        StreamRunner { metrics: Some(metrics), ..self }
    }

    pub fn spec(&self) -> &StreamSpec {
        &self.spec
    }

    /// The incarnation the stream's next run starts above.
    pub fn incarnation(&self) -> u64 {
        self.sup.incarnation()
    }

    /// Supervises the stream until `stop` (the node stops, or the stream is dropped) or `weir
    /// stop` (`Ok`), or until the restart strategy gives up on it or it cannot start (`Err`);
    /// `template`: what the node said of it as it started.
    /// `wish`: whether the catalog pauses it (a paused run: no tasks, its partitions still take
    /// appends).
    pub fn run(
        mut self,
        parts: &NodeParts,
        template: Standing,
        stop: &AtomicBool,
        wish: &Wish,
    ) -> anyhow::Result<ExitCode> {
        let NodeParts { file, me, node, exit_when_done, control, prober, .. } = parts;
        let metrics = self.metrics.take();
        let board = metrics.as_ref();
        let (exit_when_done, prober) = (*exit_when_done, prober.as_ref());
        let (spec, base, sup) = (&self.spec, &self.base, &mut self.sup);
        let data_dir = &base.data_dir;
        // Only a stream with two copies of each partition has in-sync sets.
        if self.stream.ingest.replicas >= 2 {
            control.show_in_sync(spec.id)?;
        }
        // Whether an engine of the stream has started on this node: until one has, an error
        // starting it is the config's or the machine's, and stops the node.
        let mut ran = false;
        let standing = Between { node, base, stop, spec, template };
        loop {
            if let Some(fatal) = control.fatal() {
                anyhow::bail!("{fatal}");
            }
            if let Some(why) = node.replaced() {
                anyhow::bail!("node {}: a newer process of this node runs ({why}): this one stops", me.id);
            }
            if !control.holds() {
                // Not a member (no lease in etcd yet, or lost): run nothing until it is one again.
                tracing::warn!(stream = %spec.name, reason = %control.why_not(), "waiting to hold a lease in etcd before running the stream");
                if let Some(b) = board {
                    b.set_phase(crate::metrics::Phase::Restarting);
                }
                let after = file.restart.move_after;
                let mut tick = || {
                    if let Some(p) = prober {
                        control.check_reach(&p.links(), now_ms(), after);
                    }
                    (control.holds() || control.fatal().is_some()).then_some(WaitEnd::Restart(None))
                };
                let Some(newer) = standing.wait(sup.incarnation(), sup.restarts(), Mode::Fenced, &mut tick) else {
                    return Ok(ExitCode::SUCCESS);
                };
                sup.woke(Waited::Lease, newer);
                continue;
            }
            // The membership this run holds, taken before the placement is read: a placement read
            // under another (or none) may be one the cluster has replaced since.
            let Some(held) = control.membership() else { continue };
            let current = control.current_placement(spec, &self.file_placement);
            let tenure = control.tenure_for(held);
            if control.membership() != Some(held) || tenure.as_ref().is_some_and(Option::is_none) {
                continue;
            }
            let (ended, result) = match current {
                Ok((read, placement)) if placement.nodes(&spec.topology()).contains(&NodeId(me.id)) => {
                    sup.heard(node.newest_epoch(spec.id).map(|e| e.0));
                    let incarnation = sup.start(read.version());
                    node.stand(spec.id, Some(standing.standing(StandingPhase::Starting, incarnation, sup.restarts())));
                    crate::failover::record(data_dir, incarnation)?;
                    let mut cfg = base.clone();
                    cfg.failover = true;
                    cfg.restarts = sup.restarts().to_vec();
                    cfg.links = node.links();
                    cfg.epoch = Some(Epoch(incarnation));
                    cfg.tenure = tenure.flatten();
                    cfg.member_status = control.member_status();
                    cfg.paused = wish.paused();
                    let paused = cfg.paused;
                    cfg.commits = control.commit_book(spec, held, &read);
                    // A lag of zero: the copy is never written out, and appends always wait for it.
                    let lag = Some(self.stream.ingest.in_sync_lag).filter(|l| !l.is_zero()).unwrap_or(Duration::MAX);
                    cfg.in_sync = control.in_sync(spec, held, &read).map(|book| weir_engine::runtime::InSync {
                        book,
                        lag,
                        may_leave: control.may_leave(),
                    });
                    match Engine::start_on(node, spec, &placement, cfg) {
                        Ok(engine) => {
                            ran = true;
                            wish.set_now(if paused { Now::Paused } else { Now::Running });
                            log_start(spec, &placement, me, &engine, data_dir, incarnation);
                            let watch = control.watch(spec, &placement, read, file);
                            let how = Watching {
                                stop,
                                exit_when_done,
                                stream: &spec.name,
                                control,
                                held,
                                board,
                                reach: prober.map(|p| (p, file.restart.move_after)),
                                node,
                                wish,
                            };
                            let mut switch = Switch::new(&engine, wish);
                            let ended = supervise(&engine, &how, watch, &mut switch);
                            engine.stop();
                            if let Some(b) = board {
                                b.engine_ended();
                            }
                            let result = engine.wait();
                            wish.set_now(Now::Nothing);
                            (switch.ended(ended, wish), result)
                        }
                        // A restart that cannot start (the store unreachable, say) is one more failure
                        // for the strategy; the first start's errors are the config's or the machine's,
                        // except etcd's (busy, or the placement changed as the run began).
                        Err(e) if ran || e.is_control() => {
                            let what = if ran { "restart" } else { "start" };
                            (RunEnd::Failed { why: format!("{what} failed: {e}"), newer: None }, Ok(()))
                        }
                        Err(e) => return Err(e).with_context(|| format!("starting node {}", me.id)),
                    }
                }
                Ok((read, placement)) => {
                    // Idle: the cluster moved this node's tasks away while it was gone.
                    let version = read.version();
                    sup.heard(node.newest_epoch(spec.id).map(|e| e.0));
                    let at = sup.idle_at(version);
                    let runs: Vec<String> = placement.nodes(&spec.topology()).iter().map(|n| n.0.to_string()).collect();
                    let why = if version == 0 {
                        "node idle: the placement puts no task of the stream on it"
                    } else {
                        "node idle: its tasks moved to the other nodes while it was away"
                    };
                    let nodes = runs.join(",");
                    tracing::info!(stream = %spec.name, placement = version, incarnation = at, nodes, "{why}");
                    if let Some(b) = board {
                        b.set_phase(crate::metrics::Phase::Idle);
                    }
                    // An idle leader still moves a lost node's tasks (to itself, maybe).
                    let mut watch = control.watch(spec, &placement, read, file);
                    let mut tick = || {
                        let moved = watch.as_mut()?.check()?;
                        Some(WaitEnd::Restart(Some(moved.incarnation)))
                    };
                    let Some(newer) = standing.wait(at, sup.restarts(), Mode::Idle, &mut tick) else {
                        return Ok(ExitCode::SUCCESS);
                    };
                    sup.woke(Waited::Idle, newer);
                    continue;
                }
                // A placement etcd did not answer for (busy, or a new leader of its own) is read
                // again after the strategy's delay, before the first start too; one that cannot
                // be used (it names a node the file does not list) stops the node until an engine
                // has started.
                Err(e) if ran || unanswered(&e) => {
                    let what = if ran { "restart" } else { "start" };
                    (RunEnd::Failed { why: format!("{what} failed: {e:#}"), newer: None }, Ok(()))
                }
                Err(e) => return Err(e).with_context(|| format!("starting node {}", me.id)),
            };
            // A stop that came while the run ended for another reason, or failed to start, still
            // stops the node: it was answered "stopping".
            let stop_asked = base.stop_requested.load(Ordering::Acquire);
            let forced =
                stop_asked && matches!(ended, RunEnd::Failed { .. } | RunEnd::Fenced { .. } | RunEnd::Switched { .. });
            if let (true, Err(e)) = (forced, &result) {
                tracing::warn!(error = %e, "the stream failed as it was asked to stop");
            }
            let why = match &ended {
                RunEnd::Failed { why, .. } | RunEnd::Fenced { why } => why.clone(),
                _ => String::new(),
            };
            // A run ended by a peer's switch failed for that reason alone.
            let followed = matches!(ended, RunEnd::Switched { newer: Some(_) });
            match sup.ended(ended, stop_asked, now_ms()) {
                Next::Continue { incarnation } => {
                    if let (false, Err(e)) = (followed, result) {
                        tracing::warn!(stream = %spec.name, error = %e, "the run ended with an error as it switched");
                    }
                    if stop.load(Ordering::Relaxed) {
                        tracing::info!(stream = %spec.name, reason = "signal", "node stopped");
                        return Ok(ExitCode::SUCCESS);
                    }
                    let what = if wish.paused() { "pausing" } else { "resuming" };
                    tracing::info!(stream = %spec.name, incarnation, "{what} the stream on this node");
                }
                Next::Exit(reason) => {
                    if !forced {
                        result.with_context(|| format!("node {}", me.id))?;
                    }
                    tracing::info!(stream = %spec.name, reason, "node stopped");
                    return Ok(ExitCode::SUCCESS);
                }
                Next::AwaitLease => {
                    tracing::warn!(stream = %spec.name, reason = %why, "stopped the stream: this node's lease in etcd may have ended");
                }
                Next::Restart { delay, incarnation } => {
                    tracing::warn!(
                        stream = %spec.name, reason = %why, incarnation, delay = %humantime::format_duration(delay),
                        "the stream failed; restarting it from the last commit"
                    );
                    if let Some(b) = board {
                        b.restarted();
                        b.set_phase(crate::metrics::Phase::Restarting);
                    }
                    let Some(newer) = standing.wait(incarnation, sup.restarts(), Mode::Restarting(delay), &mut || None)
                    else {
                        return Ok(ExitCode::SUCCESS);
                    };
                    sup.woke(Waited::Restart, newer);
                }
                Next::GiveUp { why, gave_up } => {
                    tracing::error!(stream = %spec.name, reason = %why, "the stream failed and is not restarted: {gave_up}");
                    anyhow::bail!(
                        "node {}: stream {} failed ({why}) and is not restarted: {gave_up}",
                        me.id,
                        spec.name
                    );
                }
            }
        }
    }
}

/// Why the node runs no engine.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// The restart strategy's delay before the next run.
    Restarting(Duration),
    /// No task of the stream is placed on the node; it waits for a later run elsewhere.
    Idle,
    /// The node holds no lease in etcd: it runs nothing until it holds one again.
    Fenced,
}

/// How a wait between runs ended.
enum WaitEnd {
    /// Start the stream (at least at the epoch a peer was seen in): the delay is over, or
    /// (idle) a later run started elsewhere.
    Restart(Option<u64>),
    /// A signal or `weir stop` came first.
    Stopped(&'static str),
}

/// What a node needs to wait between runs and answer clients meanwhile.
struct Between<'a> {
    node: &'a Node,
    base: &'a weir_engine::runtime::EngineConfig,
    stop: &'a AtomicBool,
    spec: &'a StreamSpec,
    /// What the node said as it started: the stream's shape, membership and stop flag.
    template: Standing,
}

impl Between<'_> {
    /// What the node says of the stream while it runs none.
    fn standing(&self, phase: StandingPhase, incarnation: u64, restarts: &[RestartInfo]) -> Standing {
        let since = std::time::Instant::now();
        Standing { phase, incarnation, restarts: restarts.to_vec(), since, ..self.template.clone() }
    }

    /// Waits at `incarnation` in `mode` until `tick` (called every 20 ms) or the mode ends it,
    /// the node saying meanwhile why it runs nothing: `Some` of a later run seen elsewhere, to
    /// start again; `None` once a signal or `weir stop` came (logged).
    fn wait(
        &self,
        incarnation: u64,
        restarts: &[RestartInfo],
        mode: Mode,
        tick: &mut dyn FnMut() -> Option<WaitEnd>,
    ) -> Option<Option<u64>> {
        let (phase, until) = match mode {
            Mode::Restarting(delay) => (StandingPhase::Restarting, Some(std::time::Instant::now() + delay)),
            Mode::Idle => (StandingPhase::Idle, None),
            Mode::Fenced => (StandingPhase::Fenced, None),
        };
        self.node.stand(self.spec.id, Some(self.standing(phase, incarnation, restarts)));
        let ended = loop {
            let later = self.node.newest_epoch(self.spec.id).map(|e| e.0).filter(|e| *e > incarnation);
            if self.stop.load(Ordering::Relaxed) {
                break WaitEnd::Stopped("signal");
            }
            if self.base.stop_requested.load(Ordering::Acquire) {
                break WaitEnd::Stopped("weir stop");
            }
            if until.is_some_and(|u| std::time::Instant::now() >= u)
                || (phase == StandingPhase::Idle && later.is_some())
            {
                break WaitEnd::Restart(later);
            }
            if let Some(w) = tick() {
                break w;
            }
            if self.node.replaced().is_some() {
                break WaitEnd::Restart(None); // the node's loop stops it
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match ended {
            WaitEnd::Restart(newer) => Some(newer),
            WaitEnd::Stopped(reason) => {
                tracing::info!(stream = %self.spec.name, reason, "node stopped");
                None
            }
        }
    }
}

/// What [`supervise`] watches besides the engine.
struct Watching<'a> {
    stop: &'a AtomicBool,
    exit_when_done: bool,
    stream: &'a str,
    control: &'a crate::placement::Control,
    /// The membership the run started under.
    held: crate::placement::Membership,
    board: Option<&'a crate::metrics::StreamMetrics>,
    /// The probes of the other nodes, and how long they may be unreachable before the node
    /// gives up its membership (`restart.move_after`; with etcd).
    reach: Option<(&'a crate::probe::Prober, Duration)>,
    node: &'a Node,
    /// Whether the catalog pauses the stream.
    wish: &'a Wish,
}

/// Watches the engine until it should stop, and says why: also when the node no longer holds
/// the membership it started under (it must run nothing then). On the node that decides,
/// `watch` moves the tasks of a node lost for too long to the others (which restarts the
/// stream).
fn supervise(
    engine: &Engine,
    how: &Watching<'_>,
    mut watch: Option<crate::placement::Watch<'_>>,
    switch: &mut Switch,
) -> RunEnd {
    let Watching { stop, exit_when_done, stream, control, held, board, reach, node, wish } = *how;
    let mut ended = false;
    let mut measured: Option<std::time::Instant> = None;
    let mut reached: Option<std::time::Instant> = None;
    loop {
        // Whether this node is on the smaller side of a split, five times a second.
        if let Some((prober, after)) =
            reach.filter(|_| reached.is_none_or(|r| r.elapsed() >= Duration::from_millis(200)))
        {
            reached = Some(std::time::Instant::now());
            control.check_reach(&prober.links(), now_ms(), after);
        }
        // The metrics' snapshot, twice a second.
        if let Some(b) = board.filter(|_| measured.is_none_or(|m| m.elapsed() >= Duration::from_millis(500))) {
            measured = Some(std::time::Instant::now());
            b.update(engine.status(), engine.stats());
        }
        if stop.load(Ordering::Relaxed) {
            return RunEnd::Signal;
        }
        if let Some(why) = node.replaced() {
            return RunEnd::Failed { why: format!("a newer process of this node runs ({why})"), newer: None };
        }
        if engine.stop_requested() {
            return RunEnd::StopRequested;
        }
        if control.membership() != Some(held) {
            return RunEnd::Fenced { why: control.why_not() };
        }
        if let Some(why) = engine.failure() {
            return RunEnd::Failed { why, newer: engine.newer_epoch().map(|e| e.0) };
        }
        if !ended && engine.is_finished() {
            ended = true;
            if exit_when_done {
                return RunEnd::Done;
            }
            // A bounded stream's results stay readable (`weir verify`, `weir status`).
            tracing::info!(stream, "stream ended on this node; serving status and results until stopped");
        }
        if let Some(end) = switch.poll(engine, wish, stream) {
            return end;
        }
        // Once the local tasks have ended there is nothing left to move for.
        if let Some(w) = watch.as_mut().filter(|_| !ended)
            && let Some(moved) = w.check()
        {
            return RunEnd::Failed { why: moved.reason, newer: Some(moved.incarnation) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether reading the placement failed because etcd did not answer (retryable).
fn unanswered(e: &anyhow::Error) -> bool {
    e.downcast_ref::<weir_engine::cluster::BookError>().is_some_and(weir_engine::cluster::BookError::is_retryable)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn log_start(
    spec: &StreamSpec,
    placement: &Placement,
    me: &NodeEntry,
    engine: &Engine,
    data_dir: &std::path::Path,
    incarnation: u64,
) {
    let local: Vec<String> = spec
        .topology()
        .tasks
        .iter()
        .filter(|t| placement.node_of(t.id) == NodeId(me.id))
        .map(|t| t.id.0.to_string())
        .collect();
    tracing::info!(
        stream = %spec.name,
        addr = %engine.transport_addr().map_or_else(|| me.addr.to_string(), |a| a.to_string()),
        data_dir = %data_dir.display(),
        tasks = %local.join(","),
        incarnation,
        paused = engine.is_paused(),
        "node started"
    );
}
