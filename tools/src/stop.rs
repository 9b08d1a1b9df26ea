//! `weir stop`: stops a stream on every node of its cluster; with `--checkpoint`, after one
//! final committed checkpoint (Flink's stop-with-savepoint), so that the nodes, started again
//! (an upgrade, say), resume from it; a paused stream computes nothing and stops at once, at its
//! last commit.
//!
//! Every node of the target is asked (a node asked sends the request on to the stream's other
//! nodes too, which is what `--node` relies on); each `weir node` process then stops its tasks
//! and exits 0. The command returns once nothing listens on any target node's port, asking again
//! any node that answers (one that could not be reached at first may have missed the request), and
//! exits 1 if one still answers, or can neither be reached nor be seen gone, after `--wait`. Between the final commit and the stop the stream
//! may go on a little: what it writes then is written again, identically, after the restart
//! (results are upserts of the same blocks).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use weir_engine::wire::msg::{
    CheckpointNowOutcome, CheckpointNowReq, CheckpointNowRsp, CheckpointOutcome, StopReq, StopRsp,
};
use weir_engine::wire::{CheckpointId, StreamId};

use crate::client::{Failure, Target};

/// Options of `weir stop`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    weir stop --config examples/three-node.toml --checkpoint   final checkpoint, then stop every node\n  \
    WEIR_CLUSTER_SECRET=... weir stop --node 10.0.0.5:7101 --cluster lab --stream 1")]
pub struct StopArgs {
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// The stream: its name or id (default: the one of `--config`, else 1). A created stream
    /// (`weir stream create`) stops alone, at a savepoint, as `weir stream stop` does (its
    /// savepoint is implied, `--wait` does not apply, `--timeout` is the answer's, at least 40
    /// s; exit 1: not answered in time); for the cluster file's stream each node asked stops
    /// with every stream on it.
    #[arg(long, value_name = "NAME|ID", value_parser = crate::client::parse_stream_ref)]
    stream: Option<crate::client::StreamRef>,
    /// Stop only once one more checkpoint has committed (a paused stream stops at once, at its
    /// last commit).
    #[arg(long)]
    checkpoint: bool,
    /// How long the final checkpoint may take, e.g. `2m`.
    #[arg(long, default_value = "60s", value_parser = crate::config::parse_duration)]
    timeout: Duration,
    /// How long to wait until no node listens any more, e.g. `1m` (exit code 1 if one still
    /// answers then, or can neither be reached nor be seen gone).
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration)]
    wait: Duration,
}

const ASK: Duration = Duration::from_secs(5);

fn fail(f: Failure) -> anyhow::Error {
    match f {
        Failure::Refused(e) => e,
        Failure::Unreachable(why) => anyhow::anyhow!(why),
    }
}

/// The stream's coordinator among the target's nodes, and its newest committed checkpoint.
fn coordinator(t: &Target, stream: StreamId) -> anyhow::Result<(SocketAddr, Option<CheckpointId>)> {
    for addr in &t.nodes {
        let Ok(rsp) = crate::client::status_of(t, *addr, Some(stream), ASK)? else { continue };
        if rsp.streams.iter().any(|s| s.stream == stream) {
            let last = rsp
                .checkpoints
                .iter()
                .filter(|c| c.stream == stream && c.outcome == CheckpointOutcome::Committed)
                .map(|c| c.checkpoint)
                .max();
            return Ok((*addr, last));
        }
    }
    bail!("none of {:?} coordinates stream {}: name its coordinator with --node (or use --config)", t.nodes, stream.0)
}

/// Whether the catalog pauses `stream` (`weir stream pause`).
fn paused(t: &Target, stream: StreamId) -> anyhow::Result<bool> {
    let entry = crate::client::catalog_entry(t, &crate::client::StreamRef::Id(stream.0), ASK)?;
    Ok(entry.is_some_and(|e| matches!(e.state, weir_engine::wire::msg::StreamState::Paused { .. })))
}

/// Starts a checkpoint on the coordinator and waits for it to commit; returns it.
#[allow(clippy::print_stdout)]
fn final_checkpoint(t: &Target, stream: StreamId, limit: Duration) -> anyhow::Result<CheckpointId> {
    let (coord, before) = coordinator(t, stream)?;
    let rsp = crate::client::request(t, coord, &CheckpointNowReq { request: 1, stream }, ASK).map_err(fail)?;
    let rsp = rsp.to_owned::<CheckpointNowRsp>().context("the coordinator's answer")?;
    match rsp.outcome {
        CheckpointNowOutcome::Accepted => {}
        CheckpointNowOutcome::NotCoordinator { coordinator } => {
            bail!("{coord} does not coordinate stream {}: node {coordinator} does", stream.0)
        }
        CheckpointNowOutcome::Refused { reason } => bail!("no final checkpoint: {reason}"),
    }
    println!("final checkpoint of stream {} requested from {coord}", stream.0);
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
        let Ok(s) = crate::client::status_of(t, coord, Some(stream), ASK)? else { continue };
        let newer = |id: CheckpointId| before.is_none_or(|b| id > b);
        for c in s.checkpoints.iter().filter(|c| c.stream == stream && newer(c.checkpoint)) {
            match &c.outcome {
                CheckpointOutcome::Committed => return Ok(c.checkpoint),
                // A checkpoint that fails is followed by the next; the manual one may be that one.
                CheckpointOutcome::Failed { reason } => println!("chk-{} failed: {reason}", c.checkpoint.0),
                CheckpointOutcome::InProgress => {}
            }
        }
    }
    bail!(
        "no checkpoint of stream {} committed within {}: nothing was stopped",
        stream.0,
        humantime::format_duration(limit)
    )
}

/// What a node said to the stop request.
enum Took {
    /// It stops (and, asked first, told these peers).
    Stopping { node: u32, peers: Vec<u32> },
    /// It could not be reached: down, or cut off from this client.
    Unreachable(String),
}

/// Sends the stop to `addr`: a node that runs the stream stops it and exits; asked first, it
/// tells its peers too (they are asked here as well: a peer between two runs of the stream
/// would miss the word of mouth).
fn ask(t: &Target, addr: SocketAddr, stream: StreamId) -> anyhow::Result<Took> {
    match crate::client::request(t, addr, &StopReq { request: 1, stream, forwarded: false }, ASK) {
        Ok(f) => {
            let rsp = f.to_owned::<StopRsp>().context("the node's answer")?;
            if !rsp.stopping {
                bail!("{addr} (node {}) does not run stream {}", rsp.node.0, stream.0);
            }
            Ok(Took::Stopping { node: rsp.node.0, peers: rsp.peers.iter().map(|p| p.0).collect() })
        }
        Err(Failure::Refused(e)) => Err(e),
        Err(Failure::Unreachable(why)) => Ok(Took::Unreachable(why)),
    }
}

/// Runs `weir stop`: asks every node, then waits until none listens any more.
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn run(args: &StopArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    // A created stream stops alone, at a savepoint; the cluster file's stops its nodes. A
    // stream the catalog does not list (or no node could read it) stops nothing.
    if let Some(r) = &args.stream {
        match crate::client::catalog_entry(&t, r, ASK)? {
            Some(e) if !e.spec.is_empty() => {
                return crate::stream_cmd::stop_created(&t, &e.name, args.timeout.max(Duration::from_secs(40)));
            }
            Some(_) => {}
            None => {
                let named = match r {
                    crate::client::StreamRef::Id(id) => id.to_string(),
                    crate::client::StreamRef::Name(n) => n.clone(),
                };
                bail!("no node lists stream {named} in the cluster's catalog: nothing was stopped")
            }
        }
    }
    let named = args.stream.as_ref().map(|r| crate::client::stream_id(&t, r, ASK)).transpose()?;
    let stream = StreamId(named.or(t.file.as_ref().map(|f| f.stream.id)).unwrap_or(1));
    let last = match args.checkpoint {
        // A paused stream computes nothing: it stops at its last commit (its pause's, unless
        // that one timed out).
        true if paused(&t, stream)? => {
            println!("stream {} is paused: nothing to checkpoint, it stops at its last commit", stream.0);
            None
        }
        true => Some(final_checkpoint(&t, stream, args.timeout)?),
        false => None,
    };
    let ids = t.node_ids();
    let mut nodes: Vec<Node> = t.nodes.iter().map(|a| Node::new(*a, ids.get(a).copied())).collect();
    let mut told: Vec<u32> = Vec::new();
    let mut why = Vec::new();
    for n in &mut nodes {
        match ask(&t, n.addr, stream)? {
            Took::Stopping { node, peers } => {
                n.took(node);
                told.extend(peers);
            }
            Took::Unreachable(w) => why.push(format!("{}: {w}", n.addr)),
        }
    }
    if !nodes.iter().any(|n| n.took) {
        bail!("no node took the stop request: {}", why.join("; "));
    }
    // A node that a peer told stops as if asked: it may be gone before this client asks it.
    for n in nodes.iter_mut().filter(|n| !n.took && n.id.is_some_and(|id| told.contains(&id))) {
        n.took = true;
    }
    let asked: Vec<&Node> = nodes.iter().filter(|n| n.took).collect();
    let asked = list(&asked);
    // Peers the nodes told that this client cannot ask itself (`--node`): named, not waited for.
    let known: Vec<u32> = nodes.iter().filter_map(|n| n.id).collect();
    told.retain(|p| !known.contains(p));
    told.sort_unstable();
    told.dedup();
    let also = match told.as_slice() {
        [] => String::new(),
        [one] => format!(" (which told node {one})"),
        many => format!(" (which told nodes {})", many.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
    };
    let after = last.map_or_else(String::new, |c| format!(" after chk-{} committed", c.0));
    println!("stopping stream {} on {asked}{also}{after}", stream.0);
    wait_for_exit(&t, stream, &mut nodes, args.wait);
    let gone: Vec<&Node> = nodes.iter().filter(|n| n.gone && n.took).collect();
    let idle: Vec<&Node> = nodes.iter().filter(|n| n.gone && !n.took).collect();
    if !gone.is_empty() {
        println!("stopped: {} no longer listening (exited)", list(&gone));
    }
    if !idle.is_empty() {
        println!("{} not running (nothing listens on its port)", list(&idle));
    }
    let left: Vec<&Node> = nodes.iter().filter(|n| !n.gone).collect();
    for n in &left {
        match n.answered {
            true => {
                eprintln!("{} still runs {} after the stop request", n.name(), humantime::format_duration(args.wait))
            }
            false => eprintln!("{} could not be reached, so it may still run (down, or cut off from here)", n.name()),
        }
    }
    Ok(if left.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `nodes 1, 2, 3`, `node 1`, or addresses for nodes whose id is not known.
fn list(nodes: &[&Node]) -> String {
    match nodes.iter().map(|n| n.id).collect::<Option<Vec<u32>>>() {
        Some(ids) if ids.len() == 1 => format!("node {}", ids[0]),
        Some(ids) => format!("nodes {}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
        None => nodes.iter().map(|n| n.name()).collect::<Vec<_>>().join(", "),
    }
}

/// One node of the target, as `weir stop` sees it.
struct Node {
    addr: SocketAddr,
    id: Option<u32>,
    /// It answered that it stops.
    took: bool,
    /// It answered a connection at least once since the first request.
    answered: bool,
    /// Its port refused connections since then (`None`: it did not at the last poll).
    refused_since: Option<Instant>,
    /// Nothing listens on its port any more, for long enough.
    gone: bool,
    asked_at: Instant,
}

impl Node {
    fn new(addr: SocketAddr, id: Option<u32>) -> Self {
        Node { addr, id, took: false, answered: false, refused_since: None, gone: false, asked_at: Instant::now() }
    }

    fn took(&mut self, id: u32) {
        (self.took, self.answered, self.id) = (true, true, Some(id));
    }

    fn name(&self) -> String {
        match self.id {
            Some(id) => format!("node {id}"),
            None => self.addr.to_string(),
        }
    }
}

/// Waits at most `limit` until nothing listens on any node's port: its connections are refused
/// for a second or more (a node keeps listening between two runs of its stream).
/// Any node that answers is asked again once a second (one that could not be reached may have
/// missed the first request). A port that neither answers nor
/// refuses (a node down, or cut off from here) is not taken as gone.
fn wait_for_exit(t: &Target, stream: StreamId, nodes: &mut [Node], limit: Duration) {
    const POLL: Duration = Duration::from_millis(200);
    const GONE: Duration = Duration::from_secs(1);
    const AGAIN: Duration = Duration::from_secs(1);
    let t0 = Instant::now();
    while t0.elapsed() < limit && nodes.iter().any(|n| !n.gone) {
        for n in nodes.iter_mut().filter(|n| !n.gone) {
            match std::net::TcpStream::connect_timeout(&n.addr, Duration::from_secs(1)) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    let since = *n.refused_since.get_or_insert_with(Instant::now);
                    n.gone = since.elapsed() >= GONE;
                }
                Err(_) => n.refused_since = None,
                Ok(probe) => {
                    drop(probe);
                    n.refused_since = None;
                    n.answered = true;
                    if n.asked_at.elapsed() >= AGAIN {
                        n.asked_at = Instant::now();
                        if let Ok(Took::Stopping { node, .. }) = ask(t, n.addr, stream) {
                            n.took(node);
                        }
                    }
                }
            }
        }
        std::thread::sleep(POLL);
    }
}
