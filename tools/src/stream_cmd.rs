//! `weir stream`: the cluster's stream catalog: create a stream from a stream file, list the
//! streams, show one, pause, resume, rescale, stop (at a savepoint) or drop one. A node of the
//! target answers (the first that does); a change is answered once it has taken effect on that
//! node (a created stream runs there, a paused one runs without its tasks, a stopped one too at
//! a savepoint, a dropped one has stopped and its data there is gone). Reading takes the `read`
//! role, changing `admin`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use weir_engine::wire::msg::{
    CatalogChange, CatalogChangeReq, CatalogRefusal, CatalogReq, CatalogRsp, MAX_SPEC_TEXT, MAX_STREAM_NAME, Message,
    StreamEntry, StreamState, valid_stream_name,
};

use crate::client::{Failure, Target};

/// Options of `weir stream`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    weir stream create --config examples/one-node.toml --file examples/stream-meters.toml\n  \
    weir stream list --config examples/one-node.toml\n  \
    weir stream show meters --config examples/one-node.toml --json\n  \
    weir stream pause meters --config examples/one-node.toml\n  \
    weir stream resume meters --config examples/one-node.toml\n  \
    weir stream rescale meters --aggs 5 --config examples/one-node.toml\n  \
    weir stream stop meters --config examples/one-node.toml\n  \
    weir stream drop meters --config examples/one-node.toml\n\n\
    Exit codes: 0 done, 1 not done in time (retryable: list the streams before trying again), \
    2 an error (a refused request, an unreachable cluster).")]
pub struct StreamArgs {
    #[command(subcommand)]
    op: Op,
}

/// What every `weir stream` command takes.
#[derive(clap::Args, Debug)]
struct Common {
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// Print JSON (one object with `streams`).
    #[arg(long)]
    json: bool,
    /// How long to wait for the node's answer, e.g. `1m` (a change takes effect first).
    #[arg(long, default_value = "40s", value_parser = crate::config::parse_duration)]
    timeout: Duration,
}

#[derive(clap::Subcommand, Debug)]
enum Op {
    /// Creates a stream from a stream file (a `[stream]` table, without `id`) and starts it.
    Create {
        /// The stream file (TOML).
        #[arg(long, value_name = "FILE")]
        file: std::path::PathBuf,
        /// Its name (default: the file's `name`).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the streams.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Shows one stream, its spec included.
    Show {
        /// The stream's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Pauses a stream: one more checkpoint, then its tasks stop and free their workers; an
    /// ingest stream's partitions still take appends (they wait in the log).
    Pause {
        /// The stream's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Resumes a paused stream from where it paused.
    Resume {
        /// The stream's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Gives a stream other parallelism: pauses it (a savepoint), restarts it with the new
    /// number of aggs (its window state redistributed by key), and resumes it; a paused stream
    /// stays paused.
    Rescale {
        /// The stream's name.
        name: String,
        /// Agg tasks.
        #[arg(long)]
        aggs: u32,
        /// Sink tasks (only as many as it has: a rescale of the sinks is not built).
        #[arg(long)]
        sinks: Option<u32>,
        #[command(flatten)]
        common: Common,
    },
    /// Stops a stream at a savepoint (Flink's stop-with-savepoint): a pause whose last
    /// checkpoint every agg wrote whole, so `resume` or `rescale` starts it again, at any
    /// parallelism. Without one (an agg still replaying), resumes it and tries again, 3 times.
    Stop {
        /// The stream's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Drops a stream: its tasks stop and its local data goes on every node; its checkpoints
    /// in the store and keys in etcd after `drop_grace`.
    Drop {
        /// The stream's name.
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

impl Op {
    fn common(&self) -> &Common {
        match self {
            Op::Create { common, .. }
            | Op::List { common }
            | Op::Show { common, .. }
            | Op::Pause { common, .. }
            | Op::Resume { common, .. }
            | Op::Rescale { common, .. }
            | Op::Stop { common, .. }
            | Op::Drop { common, .. } => common,
        }
    }
}

/// Runs `weir stream`.
pub fn run(args: &StreamArgs) -> anyhow::Result<ExitCode> {
    let common = args.op.common();
    let (t, timeout) = (common.cluster.target()?, common.timeout);
    let rsp = match &args.op {
        Op::Create { file, name, .. } => {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            if text.len() > MAX_SPEC_TEXT {
                bail!("{} is {} bytes: a stream file holds at most {MAX_SPEC_TEXT}", file.display(), text.len());
            }
            let stream = crate::config::parse_stream_doc(&text).with_context(|| format!("in {}", file.display()))?;
            let Some(name) = name.clone().or(stream.name.clone()) else {
                bail!("{} names no stream: add name = \"...\" to its [stream] table, or pass --name", file.display());
            };
            if !valid_stream_name(&name) {
                bail!(
                    "{name:?} is not a stream name: 1 to {MAX_STREAM_NAME} letters, digits, '-' or '_', starting with a letter"
                );
            }
            crate::settings::spec_of(&stream).with_context(|| format!("in {}", file.display()))?;
            let change = CatalogChange::Create { name, spec: text };
            ask(&t, &CatalogChangeReq { request: 1, change }, timeout)?
        }
        Op::List { .. } => ask(&t, &CatalogReq { request: 1, name: String::new() }, timeout)?,
        Op::Rescale { name, aggs, sinks, common } => rescale(&t, name, *aggs, sinks.unwrap_or(0), common)?,
        Op::Stop { name, common } => stop(&t, name, common.timeout, common.json)?,
        Op::Show { name, .. } => ask(&t, &CatalogReq { request: 1, name: name.clone() }, timeout)?,
        Op::Drop { name, .. } | Op::Pause { name, .. } | Op::Resume { name, .. } => {
            let name = name.clone();
            let change = match &args.op {
                Op::Pause { .. } => CatalogChange::Pause { name },
                Op::Resume { .. } => CatalogChange::Resume { name },
                _ => CatalogChange::Drop { name },
            };
            ask(&t, &CatalogChangeReq { request: 1, change }, timeout)?
        }
    };
    outcome(&args.op, rsp)
}

/// The exit code of answer `rsp`: 0 done, 1 retryable (said on stderr), an error when refused.
fn code_of(rsp: &CatalogRsp) -> anyhow::Result<ExitCode> {
    Ok(match &rsp.refused {
        None => ExitCode::SUCCESS,
        Some(CatalogRefusal::Invalid { reason }) => bail!("node {} refused: {reason}", rsp.node.0),
        Some(CatalogRefusal::Unavailable { reason }) => {
            let mut err = std::io::stderr();
            let _ =
                writeln!(err, "node {}: {reason} (retryable; `weir stream list` shows what took effect)", rsp.node.0);
            ExitCode::from(1)
        }
    })
}

/// Prints the answer `rsp` to `op` (none: not answered, exit 1); the exit code.
fn outcome(op: &Op, rsp: Option<CatalogRsp>) -> anyhow::Result<ExitCode> {
    let common = op.common();
    let Some(rsp) = rsp else { return Ok(ExitCode::from(1)) };
    let code = code_of(&rsp)?;
    let mut out = std::io::stdout().lock();
    if common.json {
        let streams: Vec<Value> = rsp.streams.iter().map(entry_json).collect();
        writeln!(out, "{}", json!({ "node": rsp.node.0, "streams": streams }))?;
    } else {
        match op {
            Op::Show { .. } => rsp.streams.iter().try_for_each(|s| show(&mut out, s))?,
            Op::Create { .. }
            | Op::Drop { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::Rescale { .. }
            | Op::Stop { .. }
                if rsp.refused.is_none() =>
            {
                for s in &rsp.streams {
                    let did = match op {
                        Op::Create { .. } => "created and running",
                        Op::Pause { .. } => "paused",
                        Op::Stop { .. } => &format!(
                            "stopped at a savepoint: `weir stream resume {0}` or `weir stream rescale {0} --aggs N` \
                             starts it again",
                            s.name
                        ),
                        Op::Resume { .. } => "resumed",
                        Op::Rescale { .. } => &format!("{} at {}", state(&s.state), shape(s)),
                        _ => "dropped",
                    };
                    writeln!(out, "stream {} (id {}) {did}", s.name, s.id.0)?;
                }
                if let (true, Op::Drop { name, .. }) = (rsp.streams.is_empty(), op) {
                    writeln!(out, "stream {name} dropped")?;
                }
            }
            _ => table(&mut out, &rsp.streams)?,
        }
    }
    Ok(code)
}

/// `weir stream rescale`: pause (unless paused), rescale, resume (unless it was paused), each
/// step answered once it took effect; the last step's answer, or the refusal that stopped it
/// (after a refused rescale, a stream this command paused is resumed).
#[allow(clippy::print_stdout)]
fn rescale(t: &Target, name: &str, aggs: u32, sinks: u32, common: &Common) -> anyhow::Result<Option<CatalogRsp>> {
    let timeout = common.timeout;
    let say = |line: String| {
        if !common.json {
            println!("{line}");
        }
    };
    let Some(read) = ask(t, &CatalogReq { request: 1, name: name.into() }, timeout)? else { return Ok(None) };
    // The kept stream of the name (one dropped may wait out its grace period beside it).
    let kept = read.streams.iter().find(|s| s.state.is_kept() && read.refused.is_none());
    let Some(entry) = kept else { return Ok(Some(read)) };
    let was_paused = matches!(entry.state, StreamState::Paused { .. });
    let started = std::time::Instant::now();
    let change = |change: CatalogChange| CatalogChangeReq { request: 1, change };
    let paused_note = format!("stream {name} is left paused: `weir stream resume {name}` resumes it");
    let left_paused = || {
        let _ = writeln!(std::io::stderr(), "{paused_note}");
    };
    if !was_paused {
        say(format!("pausing stream {name}: a savepoint, then its tasks stop"));
        let Some(rsp) = ask(t, &change(CatalogChange::Pause { name: name.into() }), timeout)? else { return Ok(None) };
        if rsp.refused.is_some() {
            return Ok(Some(rsp));
        }
        say(format!("paused in {:.1}s", started.elapsed().as_secs_f64()));
    }
    let at = std::time::Instant::now();
    let rescaled = ask(t, &change(CatalogChange::Rescale { name: name.into(), aggs, sinks }), timeout)?;
    let Some(rsp) = rescaled else {
        if !was_paused {
            left_paused();
        }
        return Ok(None);
    };
    match &rsp.refused {
        None => say(format!("rescaled to {aggs} aggs in {:.1}s", at.elapsed().as_secs_f64())),
        // Possibly in the catalog already (not in effect in time): the resume goes on with
        // whichever spec the catalog holds.
        Some(CatalogRefusal::Unavailable { reason }) => say(format!("the rescale may not have taken effect: {reason}")),
        Some(CatalogRefusal::Invalid { .. }) => {}
    }
    if was_paused {
        return Ok(Some(rsp));
    }
    let at = std::time::Instant::now();
    let Some(resumed) = resume(t, name, timeout, &paused_note)? else { return Ok(None) };
    if resumed.refused.is_some() {
        return Ok(Some(resumed));
    }
    if rsp.refused.is_some() {
        say(format!("stream {name} resumed"));
        return Ok(Some(rsp));
    }
    say(format!("resumed in {:.1}s ({:.1}s in all)", at.elapsed().as_secs_f64(), started.elapsed().as_secs_f64()));
    Ok(Some(resumed))
}

/// `weir stream stop`: a stop (a pause answered once its savepoint is there); when the node
/// says the pause has none, a resume and a stop again, at most 3 times in all.
#[allow(clippy::print_stdout)]
fn stop(t: &Target, name: &str, timeout: Duration, json: bool) -> anyhow::Result<Option<CatalogRsp>> {
    let stop = CatalogChangeReq { request: 1, change: CatalogChange::Stop { name: name.into() } };
    let running_note = format!("stream {name} may have been resumed by this command and left running");
    let mut attempt = 1;
    loop {
        let Some(rsp) = ask(t, &stop, timeout)? else { return Ok(None) };
        let missed =
            matches!(&rsp.refused, Some(CatalogRefusal::Invalid { reason }) if reason.starts_with(NO_SAVEPOINT));
        if !missed || attempt == 3 {
            return Ok(Some(rsp));
        }
        attempt += 1;
        if !json {
            println!("stream {name} paused without a savepoint: resuming it to take one");
        }
        let Some(resumed) = resume(t, name, timeout, &running_note)? else { return Ok(None) };
        if resumed.refused.is_some() {
            return Ok(Some(resumed));
        }
        // An agg that restored a checkpoint with replay points takes no savepoint until its
        // replay is over.
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Resumes stream `name`; says `left` on stderr when the resume was not answered or was refused
/// (what the command leaves the stream as).
fn resume(t: &Target, name: &str, timeout: Duration, left: &str) -> anyhow::Result<Option<CatalogRsp>> {
    let req = CatalogChangeReq { request: 1, change: CatalogChange::Resume { name: name.into() } };
    let rsp = ask(t, &req, timeout)?;
    if rsp.as_ref().is_none_or(|r| r.refused.is_some()) {
        let _ = writeln!(std::io::stderr(), "{left}");
    }
    Ok(rsp)
}

/// `weir stop --stream NAME` of a created stream: `weir stream stop NAME`, its outcome printed.
#[allow(clippy::print_stdout)]
pub(crate) fn stop_created(t: &Target, name: &str, timeout: Duration) -> anyhow::Result<ExitCode> {
    let Some(rsp) = stop(t, name, timeout, false)? else { return Ok(ExitCode::from(1)) };
    let code = code_of(&rsp)?;
    if rsp.refused.is_none() {
        println!(
            "stream {name} stopped at a savepoint (the nodes and their other streams go on): `weir stream resume {name}` or `weir stream rescale {name} --aggs N` starts it again"
        );
    }
    Ok(code)
}

/// How a node's refusal of a stop begins when the pause took no savepoint
/// (`tools/src/node/requests.rs`).
pub(crate) const NO_SAVEPOINT: &str = "paused, but not at a savepoint";

/// Sends `req` to the first node of the target that can be reached: `Ok(None)` when it was
/// sent and no answer came (a change may have taken effect: retryable).
fn ask<Q: Message>(t: &Target, req: &Q, timeout: Duration) -> anyhow::Result<Option<CatalogRsp>> {
    let mut why: Vec<String> = Vec::new();
    for addr in &t.nodes {
        let mut c = match crate::client::connected(t, *addr, timeout) {
            Ok(c) => c,
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Unreachable(e)) => {
                why.push(format!("{addr}: {e}"));
                continue;
            }
        };
        // Sent: a refusal is the client's; anything else leaves the change's fate unknown.
        let answer = c.send(req).and_then(|()| c.recv()).map_err(|e| crate::client::failure(*addr, e));
        return match answer {
            Ok(f) => {
                Ok(Some(f.to_owned::<CatalogRsp>().with_context(|| format!("{addr} answered, not with a catalog"))?))
            }
            Err(Failure::Refused(e)) => Err(e),
            Err(Failure::Unreachable(e)) => {
                let mut err = std::io::stderr();
                let _ = writeln!(err, "{addr}: no answer ({e}); `weir stream list` shows whether it took effect");
                Ok(None)
            }
        };
    }
    bail!("no node answered ({})", why.join("; "))
}

fn state(s: &StreamState) -> &'static str {
    match s {
        StreamState::Running => "running",
        StreamState::Dropping { .. } => "dropping",
        StreamState::Paused { .. } => "paused",
    }
}

/// What the spec says in a line: source, parallelism, window (the cluster file's stream: so).
fn shape(s: &StreamEntry) -> String {
    if s.spec.is_empty() {
        return "the cluster file's [stream]".into();
    }
    match crate::config::parse_stream_doc(&s.spec) {
        Ok(f) => format!(
            "{} {}p/{}a/{}s window {}",
            f.source,
            f.partitions,
            f.aggs,
            f.sinks,
            humantime::format_duration(f.window)
        ),
        Err(e) => format!("(spec unreadable: {e})"),
    }
}

fn table(out: &mut impl Write, streams: &[StreamEntry]) -> std::io::Result<()> {
    if streams.is_empty() {
        return writeln!(out, "no streams");
    }
    writeln!(out, "{:<20} {:>5}  {:<9} SHAPE", "NAME", "ID", "STATE")?;
    for s in streams {
        writeln!(out, "{:<20} {:>5}  {:<9} {}", s.name, s.id.0, state(&s.state), shape(s))?;
    }
    Ok(())
}

fn show(out: &mut impl Write, s: &StreamEntry) -> std::io::Result<()> {
    writeln!(out, "stream {} (id {}): {}", s.name, s.id.0, state(&s.state))?;
    writeln!(out, "  created {}", humantime::format_rfc3339_seconds(at(s.created_ms)))?;
    match s.state {
        StreamState::Dropping { since_ms } => {
            writeln!(out, "  dropping since {}", humantime::format_rfc3339_seconds(at(since_ms)))?
        }
        StreamState::Paused { since_ms } => {
            writeln!(out, "  paused since {}", humantime::format_rfc3339_seconds(at(since_ms)))?
        }
        StreamState::Running => {}
    }
    writeln!(out, "  {}", shape(s))?;
    if !s.spec.is_empty() {
        writeln!(out, "  spec:")?;
        for l in s.spec.lines() {
            writeln!(out, "    {l}")?;
        }
    }
    Ok(())
}

fn at(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(ms)
}

fn entry_json(s: &StreamEntry) -> Value {
    let (dropping, paused) = match s.state {
        StreamState::Dropping { since_ms } => (Some(since_ms), None),
        StreamState::Paused { since_ms } => (None, Some(since_ms)),
        StreamState::Running => (None, None),
    };
    json!({
        "name": s.name,
        "id": s.id.0,
        "state": state(&s.state),
        "dropping_since_ms": dropping,
        "paused_since_ms": paused,
        "created_ms": s.created_ms,
        "from_cluster_file": s.spec.is_empty(),
        "spec": s.spec,
    })
}
