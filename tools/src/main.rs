//! The `weir` command. Libraries never print or install a logger; this binary does both.

mod checkpoints;
mod client;
mod config;
mod credential;
mod demo;
mod failover;
mod load;
mod loads;
mod logging;
mod metrics;
mod metrics_http;
mod node;
mod placement;
mod probe;
mod query;
mod remote;
mod report;
mod results;
mod run;
mod settings;
mod status;
mod status_streams;
mod stop;
mod stream_cmd;
mod verify;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "weir", version, about = "Weir: a distributed stream engine with exactly-once checkpoints")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The embedded default: a whole stream in this process, with a live status line.
    Run(run::RunArgs),
    /// One member of a cluster, from the cluster's config file.
    Node(node::NodeArgs),
    /// The traffic generator: rows into an ingest-log stream, with exactly-once acks and latency.
    Load(load::LoadArgs),
    /// A stream's window results from every node (table, `--csv` or `--json` lines), streamed.
    Query(query::QueryArgs),
    /// What the nodes of a cluster report: nodes, tasks, health, recent checkpoints.
    Status(status::StatusArgs),
    /// Stops a stream on every node (with `--checkpoint`, after a final committed checkpoint).
    Stop(stop::StopArgs),
    /// The cluster's streams: create one from a stream file, list, show, drop.
    Stream(stream_cmd::StreamArgs),
    /// Compares a stream's results on every node with the expected ones: a generator's (a
    /// running stream's up to its last commit) or the rows every `weir load` sent.
    Verify(verify::VerifyArgs),
    /// An HTML page with plots of a load (its `--hdr-log`) and the checkpoints during it.
    Report(report::ReportArgs),
    /// What a remote store holds: list, show, verify and collect checkpoints.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Two transports on 127.0.0.1 in this process: handshake, batch throughput and round trips.
    Demo(demo::DemoArgs),
    /// A client's own credential (NAME:KEY) for the role the config gives it, instead of the
    /// cluster secret.
    Credential(credential::CredentialArgs),
}

/// Exit codes: 0 success, 1 a finding (damage `weir checkpoints verify` found, a node `weir status`
/// asked did not answer), 2 an error.
fn main() -> std::process::ExitCode {
    let command = Cli::parse().command;
    let mut run_log = None;
    match &command {
        // A node names itself in every line (and the stream in a stream's); it knows its id once
        // the config is read.
        Command::Node(args) => {
            if let Ok((_, me)) = node::load(args) {
                logging::init_prefixed(format!("node={}", me.id));
            }
        }
        Command::Run(args) => run_log = logging::init_run(args.data_dir()),
        Command::Load(_) => logging::init_quiet(),
        _ => logging::init(),
    }
    let result = match command {
        Command::Run(args) => run::run(&args, run_log.as_deref()),
        Command::Node(args) => node::run(&args),
        Command::Load(args) => load::run(&args),
        Command::Query(args) => query::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Stop(args) => stop::run(&args),
        Command::Stream(args) => stream_cmd::run(&args),
        Command::Verify(args) => verify::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Checkpoints(args) => checkpoints::run(&args),
        Command::Demo(args) => demo::run(&args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Credential(args) => credential::run(&args),
    };
    result.unwrap_or_else(|e| {
        use std::io::Write;
        // The whole chain of causes, without a backtrace.
        let _ = writeln!(std::io::stderr(), "Error: {e:#}");
        std::process::ExitCode::from(2)
    })
}
