//! `weir stop`: stops a stream on every node of its cluster; with `--checkpoint`, after one
//! final committed checkpoint (Flink's stop-with-savepoint), so that the nodes, started again
//! (an upgrade, say), resume from it.
//!
//! Every node of the target is asked (a node asked sends the request on to the stream's other
//! nodes too, which is what `--node` relies on); each `weir node` process then stops its tasks
//! and exits 0. The command returns once every node that took the request has exited, asking
//! again any that still answers (a node that was restarting its stream may have missed it), and
//! exits 1 if one still runs after `--wait`. Between the final commit and the stop the stream
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
    /// The stream (default: the one of `--config`, else 1).
    #[arg(long)]
    stream: Option<u64>,
    /// Stop only once one more checkpoint has committed.
    #[arg(long)]
    checkpoint: bool,
    /// How long the final checkpoint may take, e.g. `2m`.
    #[arg(long, default_value = "60s", value_parser = crate::config::parse_duration)]
    timeout: Duration,
    /// How long to wait for the nodes to exit once they took the request (exit code 1 if one
    /// still runs then).
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
        let Ok(rsp) = crate::client::status(t, *addr, ASK)? else { continue };
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
        let Ok(s) = crate::client::status(t, coord, ASK)? else { continue };
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

/// Runs `weir stop`: asks every node, then waits until each that took the request has exited.
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn run(args: &StopArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    let stream = StreamId(args.stream.or(t.file.as_ref().map(|f| f.stream.id)).unwrap_or(1));
    let last = if args.checkpoint { Some(final_checkpoint(&t, stream, args.timeout)?) } else { None };
    let mut stopping: Vec<(SocketAddr, u32)> = Vec::new();
    let mut told: Vec<u32> = Vec::new();
    let mut unreachable: Vec<(SocketAddr, String)> = Vec::new();
    for addr in &t.nodes {
        match ask(&t, *addr, stream)? {
            Took::Stopping { node, peers } => {
                stopping.push((*addr, node));
                told.extend(peers);
            }
            Took::Unreachable(why) => unreachable.push((*addr, why)),
        }
    }
    if stopping.is_empty() {
        let why: Vec<String> = unreachable.iter().map(|(a, w)| format!("{a}: {w}")).collect();
        bail!("no node took the stop request: {}", why.join("; "));
    }
    let after = last.map_or_else(String::new, |c| format!(" after chk-{} committed", c.0));
    let mut asked: Vec<u32> = stopping.iter().map(|(_, n)| *n).collect();
    let names = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    // Peers the nodes told and this client cannot ask itself (`--node`): named, not waited for.
    told.retain(|p| !asked.contains(p));
    told.sort_unstable();
    told.dedup();
    let also = if told.is_empty() { String::new() } else { format!(" (which told nodes {})", names(&told)) };
    println!("stopping stream {} on nodes {}{also}{after}", stream.0, names(&asked));
    for (addr, why) in &unreachable {
        eprintln!("warning: {addr} could not be reached, so it was not asked to stop: {why}");
    }
    let still = wait_for_exit(&t, stream, &stopping, args.wait);
    if !still.is_empty() {
        eprintln!("nodes {} still run {} after the stop request", names(&still), humantime::format_duration(args.wait));
        return Ok(ExitCode::FAILURE);
    }
    asked.sort_unstable();
    println!("stopped: nodes {} have exited", names(&asked));
    Ok(ExitCode::SUCCESS)
}

/// Waits at most `limit` until every node of `nodes` has exited (it no longer answers, twice in
/// a row: a node between two runs of the stream is briefly unreachable too); asks again any node
/// that still answers, once a second (one that restarted its stream meanwhile may have missed the
/// first request). Returns the nodes that still answer.
fn wait_for_exit(t: &Target, stream: StreamId, nodes: &[(SocketAddr, u32)], limit: Duration) -> Vec<u32> {
    const POLL: Duration = Duration::from_millis(200);
    const AGAIN: Duration = Duration::from_secs(1);
    let t0 = Instant::now();
    // Per node: consecutive polls without an answer, and when it was last asked.
    let mut quiet: Vec<u32> = vec![0; nodes.len()];
    let mut asked_at: Vec<Instant> = vec![t0; nodes.len()];
    loop {
        for (i, (addr, _)) in nodes.iter().enumerate() {
            if quiet[i] >= 2 {
                continue;
            }
            match crate::client::connect(t, *addr, POLL) {
                Err(_) => quiet[i] += 1,
                Ok(c) => {
                    quiet[i] = 0;
                    drop(c);
                    if asked_at[i].elapsed() >= AGAIN {
                        asked_at[i] = Instant::now();
                        // Its answer (or none) changes nothing: the next polls tell.
                        let _ = ask(t, *addr, stream);
                    }
                }
            }
        }
        let running: Vec<u32> = nodes.iter().zip(&quiet).filter(|(_, q)| **q < 2).map(|((_, n), _)| *n).collect();
        if running.is_empty() || t0.elapsed() >= limit {
            return running;
        }
        std::thread::sleep(POLL);
    }
}
