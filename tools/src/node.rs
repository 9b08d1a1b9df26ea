//! `weir node`: one member of a cluster, from the cluster's config file.
//!
//! The node listens for peers and clients at its address for as long as it runs (one [`Node`],
//! at an incarnation above its earlier processes'), dials the peers with lower ids (the others
//! dial it), and starts its share of the stream on it (the tasks the placement puts on it). It
//! runs until SIGTERM or Ctrl-C (then it stops its tasks, abandons a checkpoint in flight, and
//! exits 0) or until `weir stop` asks (the same). A bounded stream that has ended on it leaves it
//! serving status and results (for `weir verify`), or, with `--exit-when-done`, it exits 0.
//! When the stream fails (a lost peer, a gap, a failure on another of its nodes, a later run
//! elsewhere) the node stops that run and starts the next from the last commit, at a greater
//! epoch (its incarnation), as the restart strategy allows, its connections untouched; when the
//! strategy allows no more, the node exits 2. Between runs the node says why it runs none (a
//! [`Standing`]: restarting, idle or fenced). What to do after a run is [`Supervisor`]'s to
//! decide; this file starts runs, waits between them and logs. Every log line names the node.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use weir_engine::cluster::supervisor::{Next, Waited};
use weir_engine::cluster::{RunEnd, Supervisor};
use weir_engine::runtime::{Engine, Node, Standing, StandingPhase};
use weir_engine::spec::{Placement, StreamSpec};
use weir_engine::wire::msg::RestartInfo;
use weir_engine::wire::{Epoch, NodeId};

use crate::config::{ClusterFile, NodeEntry};

/// Options of `weir node`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example, three nodes on this machine (one terminal each):\n  \
    weir node --config examples/three-node.toml --node-id 1\n  \
    weir node --config examples/three-node.toml --node-id 2\n  \
    weir node --config examples/three-node.toml --node-id 3\n\n\
    Environment: WEIR_CLUSTER_SECRET (the secret, if the file has none), WEIR_<KEY> and \
    WEIR_<TABLE>__<KEY> override the file (WEIR_CHECKPOINT__INTERVAL=2s), WEIR_LOG selects logs.")]
pub struct NodeArgs {
    /// The cluster's config file (TOML), the same for every node.
    #[arg(long, value_name = "FILE")]
    config: std::path::PathBuf,
    /// Which of the file's nodes this is (may be left out when it lists one).
    #[arg(long, env = "WEIR_NODE_ID", value_name = "N")]
    node_id: Option<u32>,
    /// Exit (code 0) once a bounded stream has ended on this node, instead of serving status
    /// and results until stopped.
    #[arg(long)]
    exit_when_done: bool,
}

/// The cluster file with the environment applied, and this node's entry.
pub fn load(args: &NodeArgs) -> anyhow::Result<(ClusterFile, NodeEntry)> {
    let file = crate::config::load(&args.config, std::env::vars())?;
    file.validate().with_context(|| format!("in {}", args.config.display()))?;
    let me = file.node(args.node_id)?.clone();
    Ok((file, me))
}

/// Runs the node until a signal, `weir stop`, the end of a bounded stream (`--exit-when-done`),
/// or a failure the restart strategy gives up on (exit code 2).
pub fn run(args: &NodeArgs) -> anyhow::Result<ExitCode> {
    let (file, me) = load(args)?;
    let spec = crate::settings::stream_spec(&file)?;
    let file_placement = crate::settings::placement(&file, &spec);
    let info = spec.info();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing the signal handler")?;
    }
    // Once: it opens the remote store.
    let mut base = crate::settings::engine_config(&file, &me)?;
    let board = match me.metrics {
        Some(addr) => {
            let board = crate::metrics::Board::new(me.id);
            crate::metrics_http::serve(addr, board.clone())?;
            base.ingest_observer = Some(board.ingest());
            Some(board)
        }
        None => None,
    };
    let data_dir = base.data_dir.clone();
    let control = crate::placement::Control::open(&file, NodeId(me.id))?;
    // With etcd, whether this node reaches the others (a node on the smaller side of a split
    // gives up its membership).
    let prober = match &file.control {
        Some(_) if !file.restart.move_after.is_zero() => {
            Some(crate::probe::Prober::start(&file, NodeId(me.id)).context("starting the probes of the other nodes")?)
        }
        _ => None,
    };
    if let Some(p) = &prober {
        control.show_probes(p.view());
    }
    // Only a stream with two copies of each partition has in-sync sets.
    if file.stream.ingest.replicas >= 2 {
        control.show_in_sync(spec.id)?;
    }
    let member = control.member_status();
    if let (Some(b), Some(m)) = (&board, &member) {
        b.set_member(m.clone());
    }
    let mut sup = Supervisor::new(crate::failover::policy(&file.restart), crate::failover::last(&data_dir)?);
    // The node's network side, for the process's life: its incarnation is above every earlier
    // process's, so peers drop what they still held of those. Until the first run attaches it
    // says it is starting the stream.
    let mut transport = base.transport.take().context("a node has a transport")?;
    transport.incarnation = crate::failover::next_process(&data_dir)?;
    let starting = Standing {
        phase: StandingPhase::Starting,
        incarnation: sup.incarnation(),
        restarts: Vec::new(),
        info,
        member: member.clone(),
        stop: base.stop_requested.clone(),
        since: std::time::Instant::now(),
    };
    let node = Node::start_standing(transport, spec.id, starting.clone())
        .with_context(|| format!("starting node {}", me.id))?;
    let node = Arc::new(node);
    // Whether an engine of the stream has started on this node: until one has, an error
    // starting it is the config's or the machine's, and stops the node.
    let mut ran = false;
    let standing = Between { node: &node, base: &base, stop: &stop, spec: &spec, template: starting };
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
            if let Some(b) = &board {
                b.set_phase(crate::metrics::Phase::Restarting);
            }
            let after = file.restart.move_after;
            let mut tick = || {
                if let Some(p) = &prober {
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
        let current = control.current_placement(&spec, &file_placement);
        let tenure = control.tenure_for(held);
        if control.membership() != Some(held) || tenure.as_ref().is_some_and(Option::is_none) {
            continue;
        }
        let (ended, result) = match current {
            Ok((read, placement)) if placement.nodes(&spec.topology()).contains(&NodeId(me.id)) => {
                sup.heard(node.newest_epoch(spec.id).map(|e| e.0));
                let incarnation = sup.start(read.version());
                node.stand(spec.id, Some(standing.standing(StandingPhase::Starting, incarnation, sup.restarts())));
                crate::failover::record(&data_dir, incarnation)?;
                let mut cfg = base.clone();
                cfg.failover = true;
                cfg.restarts = sup.restarts().to_vec();
                cfg.links = node.links();
                cfg.epoch = Some(Epoch(incarnation));
                cfg.tenure = tenure.flatten();
                cfg.member_status = control.member_status();
                cfg.commits = control.commit_book(&spec, held, &read);
                // A lag of zero: the copy is never written out, and appends always wait for it.
                let lag = Some(file.stream.ingest.in_sync_lag).filter(|l| !l.is_zero()).unwrap_or(Duration::MAX);
                cfg.in_sync = control.in_sync(&spec, held, &read).map(|book| weir_engine::runtime::InSync {
                    book,
                    lag,
                    may_leave: control.may_leave(),
                });
                match Engine::start_on(&node, &spec, &placement, cfg) {
                    Ok(engine) => {
                        ran = true;
                        log_start(&spec, &placement, &me, &engine, &data_dir, incarnation);
                        let watch = control.watch(&spec, &placement, read, &file);
                        let how = Watching {
                            stop: &stop,
                            exit_when_done: args.exit_when_done,
                            stream: &spec.name,
                            control: &control,
                            held,
                            board: board.as_deref(),
                            reach: prober.as_ref().map(|p| (p, file.restart.move_after)),
                            node: &node,
                        };
                        let ended = supervise(&engine, &how, watch);
                        engine.stop();
                        if let Some(b) = &board {
                            b.engine_ended();
                        }
                        (ended, engine.wait())
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
                tracing::info!(
                    stream = %spec.name, placement = version, incarnation = at, nodes = %runs.join(","),
                    "node idle: its tasks moved to the other nodes while it was away"
                );
                if let Some(b) = &board {
                    b.set_phase(crate::metrics::Phase::Idle);
                }
                // An idle leader still moves a lost node's tasks (to itself, maybe).
                let mut watch = control.watch(&spec, &placement, read, &file);
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
        let forced = stop_asked && matches!(ended, RunEnd::Failed { .. } | RunEnd::Fenced { .. });
        if let (true, Err(e)) = (forced, &result) {
            tracing::warn!(error = %e, "the stream failed as it was asked to stop");
        }
        let why = match &ended {
            RunEnd::Failed { why, .. } | RunEnd::Fenced { why } => why.clone(),
            _ => String::new(),
        };
        match sup.ended(ended, stop_asked, now_ms()) {
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
                if let Some(b) = &board {
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
                anyhow::bail!("node {}: the stream failed ({why}) and is not restarted: {gave_up}", me.id);
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
    board: Option<&'a crate::metrics::Board>,
    /// The probes of the other nodes, and how long they may be unreachable before the node
    /// gives up its membership (`restart.move_after`; with etcd).
    reach: Option<(&'a crate::probe::Prober, Duration)>,
    node: &'a Node,
}

/// Watches the engine until it should stop, and says why: also when the node no longer holds
/// the membership it started under (it must run nothing then). On the node that decides,
/// `watch` moves the tasks of a node lost for too long to the others (which restarts the
/// stream).
fn supervise(engine: &Engine, how: &Watching<'_>, mut watch: Option<crate::placement::Watch<'_>>) -> RunEnd {
    let Watching { stop, exit_when_done, stream, control, held, board, reach, node } = *how;
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
        "node started"
    );
}
