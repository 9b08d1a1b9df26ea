//! The `weir` command. Libraries never print or install a logger; this binary does both.

mod checkpoints;
mod demo;
mod remote;
mod run;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

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
    /// What a remote store holds: list, show, verify and collect checkpoints.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Two transports on 127.0.0.1 in this process: handshake, batch throughput and round trips.
    Demo(demo::DemoArgs),
}

/// Exit codes: 0 success, 1 a finding (damage `weir checkpoints verify` found), 2 an error.
fn main() -> std::process::ExitCode {
    // `WEIR_LOG` (or `RUST_LOG`) selects what is logged, e.g. `WEIR_LOG=weir_wire=debug`.
    let filter = EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let result = match Cli::parse().command {
        Command::Run(args) => run::run(&args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Checkpoints(args) => checkpoints::run(&args),
        Command::Demo(args) => demo::run(&args).map(|()| std::process::ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| {
        use std::io::Write;
        // The whole chain of causes, without a backtrace.
        let _ = writeln!(std::io::stderr(), "Error: {e:#}");
        std::process::ExitCode::from(2)
    })
}
