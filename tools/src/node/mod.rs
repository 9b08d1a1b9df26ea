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
//! decide. This module starts the node's shared parts (its [`Node`], metrics, cluster control and
//! probes) and one supervisor per stream, each on a thread of its own (`stream.rs`: it starts
//! runs, waits between them and logs), so that a stream's failures and restarts leave the
//! others running. Every log line names the node.

mod local;
mod purge;
mod stream;
mod streams;
mod wish;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use weir_engine::cluster::catalog::{CatalogStore, FileCatalog};
use weir_engine::runtime::{Node, Standing, StandingPhase};
use weir_engine::wire::{NodeId, StreamId};

use crate::config::{ClusterFile, NodeEntry};
use stream::NodeParts;
use streams::Streams;

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

/// Runs the node until a signal, `weir stop`, the end of its bounded streams
/// (`--exit-when-done`), or until the last stream running on it failed in a way its restart
/// strategy gives up on (exit code 2).
pub fn run(args: &NodeArgs) -> anyhow::Result<ExitCode> {
    let (file, me) = load(args)?;
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
            Some(board)
        }
        None => None,
    };
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
    if let (Some(b), Some(m)) = (&board, control.member_status()) {
        b.set_member(m);
    }
    let store: Box<dyn CatalogStore> = match control.catalog() {
        Some(c) => Box::new(c),
        None => Box::new(FileCatalog::new(&base.data_dir)),
    };
    // The node's network side, for the process's life: its incarnation is above every earlier
    // process's, so peers drop what they still held of those.
    let mut transport = base.transport.take().context("a node has a transport")?;
    transport.incarnation = crate::failover::next_process(&base.data_dir)?;
    // Until the catalog is read, the node says it is starting the file's stream (the stream it
    // runs unless the catalog dropped it).
    let starting = Standing {
        phase: StandingPhase::Starting,
        incarnation: crate::failover::last(&base.data_dir)?,
        restarts: Vec::new(),
        info: crate::settings::spec_of(&file.stream)?.info(),
        member: control.member_status(),
        stop: base.stop_requested.clone(),
        since: std::time::Instant::now(),
    };
    let node = Node::start_standing(transport, StreamId(file.stream.id), starting)
        .with_context(|| format!("starting node {}", me.id))?;
    let node = Arc::new(node);
    let calls = node.serve_catalog();
    let parts =
        Arc::new(NodeParts { file, me, node, base, exit_when_done: args.exit_when_done, board, control, prober });
    let mut streams = Streams::new(parts, store, calls)?;
    if !streams.open(&stop)? {
        return Ok(ExitCode::SUCCESS);
    }
    streams.serve(&stop)
}
