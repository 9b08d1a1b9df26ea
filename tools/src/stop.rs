//! `weir stop`: stops a stream on every node of its cluster; with `--checkpoint`, after one
//! final committed checkpoint (Flink's stop-with-savepoint), so that the nodes, started again
//! (an upgrade, say), resume from it.
//!
//! The node asked sends the request on to every other node of the stream; each `weir node`
//! process then stops its tasks and exits 0. Between the final commit and the stop the stream
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

/// Runs `weir stop`.
#[allow(clippy::print_stdout)]
pub fn run(args: &StopArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    let stream = StreamId(args.stream.or(t.file.as_ref().map(|f| f.stream.id)).unwrap_or(1));
    let last = if args.checkpoint { Some(final_checkpoint(&t, stream, args.timeout)?) } else { None };
    let mut errors = Vec::new();
    for addr in &t.nodes {
        match crate::client::request(&t, *addr, &StopReq { request: 1, stream, forwarded: false }, ASK) {
            Ok(f) => {
                let rsp = f.to_owned::<StopRsp>().context("the node's answer")?;
                if !rsp.stopping {
                    bail!("{addr} (node {}) does not run stream {}", rsp.node.0, stream.0);
                }
                let mut peers: Vec<String> = rsp.peers.iter().map(|p| p.0.to_string()).collect();
                // The node tells the nodes that run the stream's tasks; the others (idle: their
                // tasks moved away) are told here, if they answer.
                let told: Vec<u32> = rsp.peers.iter().map(|p| p.0).chain([rsp.node.0]).collect();
                let ids = t.node_ids();
                for other in t.nodes.iter().filter(|a| *a != addr) {
                    if ids.get(other).is_some_and(|id| told.contains(id)) {
                        continue;
                    }
                    let req = StopReq { request: 1, stream, forwarded: true };
                    if let Ok(f) = crate::client::request(&t, *other, &req, ASK)
                        && let Ok(r) = f.to_owned::<StopRsp>()
                        && r.stopping
                    {
                        peers.push(r.node.0.to_string());
                    }
                }
                let after = last.map_or_else(String::new, |c| format!(" after chk-{} committed", c.0));
                println!(
                    "stopping stream {} on node {}{}{after}",
                    stream.0,
                    rsp.node.0,
                    if peers.is_empty() { String::new() } else { format!(" and nodes {}", peers.join(", ")) }
                );
                return Ok(ExitCode::SUCCESS);
            }
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Unreachable(why)) => errors.push(why),
        }
    }
    bail!("no node took the stop request: {}", errors.join("; "))
}
