//! The `weir` command. Libraries never print or install a logger; this binary does both.

mod demo;
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
    /// Two transports on 127.0.0.1 in this process: handshake, batch throughput and round trips.
    Demo(demo::DemoArgs),
}

fn main() -> anyhow::Result<()> {
    // `WEIR_LOG` (or `RUST_LOG`) selects what is logged, e.g. `WEIR_LOG=weir_wire=debug`.
    let filter = EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match Cli::parse().command {
        Command::Run(args) => run::run(&args),
        Command::Demo(args) => demo::run(&args),
    }
}
