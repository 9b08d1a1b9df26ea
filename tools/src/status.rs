//! `weir status`: what every node of a cluster reports: whether it is up, its tasks with their
//! state and counters, and, from the coordinator, the stream's health and its recent checkpoints
//! with their per-phase durations. Clients authenticate with a client credential (the `read` role suffices) or the cluster secret.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use weir_engine::wire::msg::{CheckpointOutcome, CheckpointStats, StatusRsp, TaskState};

#[path = "status_json.rs"]
mod json_out;
use json_out::to_json;

/// Options of `weir status`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    weir status --config examples/three-node.toml            every node of the file\n  \
    weir status --node 127.0.0.1:7101 --config examples/three-node.toml --watch\n  \
    weir status --config examples/one-node.toml --stream meters   one stream of the catalog\n  \
    WEIR_CLUSTER_SECRET=... weir status --node 10.0.0.5:7101 --cluster lab --json\n\n\
    Exit codes: 0 every node asked answered, 1 a node did not, 2 an error (a refused secret).")]
pub struct StatusArgs {
    #[command(flatten)]
    cluster: crate::client::ClusterArgs,
    /// Only this stream: its name or id (default: each node's first stream, with every
    /// stream's tasks).
    #[arg(long, value_name = "NAME|ID", value_parser = crate::client::parse_stream_ref)]
    stream: Option<crate::client::StreamRef>,
    /// Print JSON (one object; the fields are documented in docs/cluster.md).
    #[arg(long)]
    json: bool,
    /// Refresh in place every second until Ctrl-C.
    #[arg(long)]
    watch: bool,
    /// With `--watch`: also append each refresh to FILE as one JSON line (`at_ms` and the
    /// `--json` object's `nodes`), a status log for later analysis.
    #[arg(long, value_name = "FILE", requires = "watch")]
    status_log: Option<std::path::PathBuf>,
    /// How long to wait for each node, e.g. `2s`.
    #[arg(long, default_value = "3s", value_parser = crate::config::parse_duration)]
    timeout: Duration,
}

/// What one node said, or why it said nothing.
enum Answer {
    Up(Box<StatusRsp>),
    Down(String),
}

fn state(s: &TaskState) -> &'static str {
    match s {
        TaskState::Uninit => "waiting",
        TaskState::Ready => "running",
        TaskState::Checkpointing => "checkpointing",
        TaskState::Paused => "paused",
        TaskState::Stopped => "stopped",
    }
}

/// An agg's replay under way: how far, and the time left at its pace so far.
pub fn replay_progress(t: &weir_engine::wire::msg::TaskStatus) -> String {
    let rate = t.replayed as f64 / (t.replay_ms.max(1) as f64 / 1e3);
    let left = if t.replayed == 0 {
        "time left unknown yet".to_string()
    } else {
        let secs = (t.replay_rows - t.replayed) as f64 / rate;
        format!("about {} left", humantime::format_duration(Duration::from_secs(secs.ceil() as u64)))
    };
    format!(
        "{} of {} rows ({:.0} %) in {}, {left}",
        t.replayed,
        t.replay_rows,
        t.replayed as f64 * 100.0 / t.replay_rows as f64,
        humantime::format_duration(Duration::from_millis(t.replay_ms / 100 * 100)),
    )
}

fn outcome(o: &CheckpointOutcome) -> String {
    match o {
        CheckpointOutcome::InProgress => "in progress".into(),
        CheckpointOutcome::Committed => "committed".into(),
        CheckpointOutcome::Failed { reason } => format!("failed: {reason}"),
    }
}

/// The slowest task's background part (state write, local checkpoint, upload), µs.
fn upload_us(c: &CheckpointStats) -> u64 {
    c.tasks.iter().map(|t| t.stats.upload_us).max().unwrap_or(0)
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

/// Node ids by address, from the config file (a down node says nothing of itself).
type Ids = std::collections::HashMap<SocketAddr, u32>;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn ago(at_ms: u64) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(now_ms().saturating_sub(at_ms) / 1000))
}

/// When the nodes that answered last saw node `id` go (ms), which one, and why.
fn lost_since(answers: &[(SocketAddr, Answer)], id: u32) -> Option<(u64, u32, String)> {
    answers
        .iter()
        .filter_map(|(_, a)| if let Answer::Up(r) = a { Some(r) } else { None })
        .flat_map(|r| r.peers.iter().map(move |p| (r.node.0, p)))
        .filter(|(_, p)| p.node.0 == id && !p.up && p.since_ms > 0)
        .map(|(by, p)| (p.since_ms, by, p.reason.clone()))
        .max_by_key(|l| l.0)
}

/// What a node says of its stream's restarts, after its uptime (which counts from the last).
fn restarts(r: &StatusRsp) -> String {
    let Some(last) = r.restarts.last() else { return String::new() };
    let ago = ago(last.at_ms);
    let n = r.restarts.len();
    format!(
        " (incarnation {}; {n} restart{}, the last {ago} ago: {})",
        r.incarnation,
        if n == 1 { "" } else { "s" },
        last.reason
    )
}

/// The cluster's control on etcd, as the nodes that answered see it: who leads, the placement
/// version, each node's lease.
fn control(out: &mut String, answers: &[(SocketAddr, Answer)]) {
    use std::fmt::Write;
    let members: Vec<(u32, &weir_engine::wire::msg::MemberInfo)> = answers
        .iter()
        .filter_map(|(_, a)| match a {
            Answer::Up(r) => r.member.as_ref().map(|m| (r.node.0, m)),
            Answer::Down(_) => None,
        })
        .collect();
    let Some(newest) = members.iter().max_by_key(|(_, m)| m.placement) else { return };
    let leader = members.iter().find(|(_, m)| m.leader.0 != 0).map(|(_, m)| m.leader.0);
    let leases: Vec<String> = members
        .iter()
        .map(|(n, m)| match m.lease_left_ms {
            0 if m.error.is_empty() => format!("node {n} none"),
            0 => format!("node {n} none ({})", m.error),
            ms => format!("node {n} {:.1}s", ms as f64 / 1e3),
        })
        .collect();
    let _ = writeln!(
        out,
        "\netcd: {}, placement version {}; leases left: {}",
        leader.map_or("no leader known".to_string(), |l| format!("node {l} leads (it moves a lost node's tasks)")),
        newest.1.placement,
        leases.join(", ")
    );
    // The sets as etcd holds them: the leader's read, else any node's (all read the same keys).
    let sets =
        members.iter().filter(|(_, m)| !m.in_sync.is_empty()).max_by_key(|(n, m)| (leader == Some(*n), m.placement));
    if let Some((_, m)) = sets {
        let _ = writeln!(out, "{}", in_sync_line(m));
    }
    for (n, m) in &members {
        let unreachable: Vec<String> = m.unreachable.iter().map(|u| u.0.to_string()).collect();
        let mut said = Vec::new();
        if m.withheld {
            said.push("gave up its membership: it reaches etcd but not most of the other nodes".to_string());
        }
        if !unreachable.is_empty() {
            said.push(format!("its probes reach no transport port of node {}", unreachable.join(", ")));
        }
        if !said.is_empty() {
            let _ = writeln!(out, "node {n} {}", said.join("; "));
        }
    }
}

/// The in-sync sets as node `m` last read them from etcd, and how stale that read is.
fn in_sync_line(m: &weir_engine::wire::msg::MemberInfo) -> String {
    let sets: Vec<String> = m
        .in_sync
        .iter()
        .map(|e| match e.in_sync {
            true => format!("p{} {}+{}", e.partition, e.primary.0, e.follower.0),
            false => format!("p{} {} (copy on {} out)", e.partition, e.primary.0, e.follower.0),
        })
        .collect();
    let stale = match m.in_sync_age_ms {
        ms if ms >= 3_000 => format!(" (read {:.0}s ago: etcd has not answered since)", ms as f64 / 1e3),
        _ => String::new(),
    };
    format!("in-sync sets (source node+copy node): {}{stale}", sets.join(", "))
}

fn to_text(answers: &[(SocketAddr, Answer)], ids: &Ids) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    // The stream the answers are about, when they agree (with several streams a node answers
    // for its lowest unless `--stream` names one).
    let shown: Vec<_> = answers
        .iter()
        .filter_map(|(_, a)| match a {
            Answer::Up(r) => r.stream.as_ref(),
            Answer::Down(_) => None,
        })
        .collect();
    if let Some(i) = shown.first().filter(|i| shown.iter().all(|o| o.stream == i.stream)) {
        let _ = writeln!(out, "stream {} (id {})", i.name, i.stream.0);
    }
    let _ = writeln!(out, "{:<6} {:<22} {:<6} since or why", "node", "addr", "state");
    for (addr, a) in answers {
        let _ = match a {
            Answer::Up(r) if r.restarting => {
                let what = if r.restarts.is_empty() { "starting" } else { "restarting" };
                writeln!(out, "{:<6} {:<22} {:<6} {what} its stream{}", r.node.0, addr, "up", restarts(r))
            }
            Answer::Up(r) if r.idle => writeln!(
                out,
                "{:<6} {:<22} {:<6} idle for {}: its tasks moved to the other nodes (placement version {}){}",
                r.node.0,
                addr,
                "up",
                humantime::format_duration(Duration::from_secs(r.uptime_ms / 1000)),
                r.incarnation >> 32,
                restarts(r)
            ),
            Answer::Up(r) if r.paused => writeln!(
                out,
                "{:<6} {:<22} {:<6} stream paused (this paused run up for {}): its tasks do not run{}",
                r.node.0,
                addr,
                "up",
                humantime::format_duration(Duration::from_secs(r.uptime_ms / 1000)),
                restarts(r)
            ),
            Answer::Up(r) => writeln!(
                out,
                "{:<6} {:<22} {:<6} for {}{}",
                r.node.0,
                addr,
                "up",
                humantime::format_duration(Duration::from_secs(r.uptime_ms / 1000)),
                restarts(r)
            ),
            Answer::Down(why) => {
                let id = ids.get(addr).map_or("?".to_string(), |i| i.to_string());
                let lost =
                    ids.get(addr).and_then(|i| lost_since(answers, *i)).map_or(String::new(), |(at, by, why)| {
                        format!("since {} ago (node {by} lost it: {why}); ", ago(at))
                    });
                writeln!(out, "{:<6} {:<22} {:<6} {lost}{why}", id, addr, "down")
            }
        };
    }
    control(&mut out, answers);
    let _ = writeln!(
        out,
        "\n{:<7} {:<5} {:<6} {:<14} {:>14} {:>14} {:>10} {:>10}",
        "stream", "task", "node", "state", "rows in", "rows out", "committed", "failed"
    );
    for (_, a) in answers {
        if let Answer::Up(r) = a {
            for t in &r.tasks {
                let id = |c: Option<weir_engine::wire::CheckpointId>| c.map_or("-".into(), |c| format!("chk-{}", c.0));
                let _ = writeln!(
                    out,
                    "{:<7} {:<5} {:<6} {:<14} {:>14} {:>14} {:>10} {:>10}",
                    t.stream.0,
                    t.task.0,
                    r.node.0,
                    state(&t.state),
                    t.rows_in,
                    t.rows_out,
                    id(t.latest),
                    id(t.failed)
                );
            }
        }
    }
    for (_, a) in answers {
        let Answer::Up(r) = a else { continue };
        for t in r.tasks.iter().filter(|t| t.replay_rows > t.replayed) {
            let _ = writeln!(
                out,
                "task {} on node {}: replaying its open windows' rows, {}",
                t.task.0,
                r.node.0,
                replay_progress(t)
            );
        }
    }
    logs(&mut out, answers);
    // A paused stream has no coordinator: nothing to say then.
    if !answers.iter().any(|(_, a)| matches!(a, Answer::Up(r) if !r.streams.is_empty() || r.paused)) {
        let _ = writeln!(
            out,
            "\nno node asked coordinates a stream: if the coordinator (on the lowest node running tasks) is down, the stream waits \
             for it and nothing commits (the other nodes keep their data; with etcd, until the elected node moves \
             its tasks)"
        );
    }
    for (_, a) in answers {
        let Answer::Up(r) = a else { continue };
        for s in &r.streams {
            let _ = writeln!(
                out,
                "\nstream {} (coordinated by node {}, {}): {}, {} checkpoints committed, {} failed{} in the {} since that node started it{}",
                s.stream.0,
                r.node.0,
                match s.interval_ms {
                    0 => "checkpoints on request only".to_string(),
                    ms => format!("a checkpoint every {}", humantime::format_duration(Duration::from_millis(ms))),
                },
                if s.healthy { "healthy" } else { "UNHEALTHY" },
                s.committed,
                s.failed,
                if s.not_started > 0 { format!(" and {} could not start", s.not_started) } else { String::new() },
                humantime::format_duration(Duration::from_secs(r.uptime_ms / 1000)),
                if s.consecutive_failures > 0 {
                    format!(", {} in a row without a commit; first cause: {}", s.consecutive_failures, s.cause)
                } else {
                    String::new()
                }
            );
        }
        if !r.checkpoints.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<12} {:>12} {:>12} {:>12} {:>12} {:>12}  outcome",
                "checkpoint", "end to end", "alignment", "snapshot", "upload", "bytes"
            );
            for c in r.checkpoints.iter().rev().take(10) {
                let _ = writeln!(
                    out,
                    "{:<12} {:>12} {:>12} {:>12} {:>12} {:>12}  {}",
                    format!("chk-{}", c.checkpoint.0),
                    ms(c.duration_us),
                    ms(c.max_align_us),
                    ms(c.max_snapshot_us),
                    ms(upload_us(c)),
                    c.upload_bytes,
                    outcome(&c.outcome)
                );
            }
        }
    }
    out
}

/// The ingest logs each node holds: what they span, their size on disk, and for a source's
/// log whether its copy holds everything.
fn logs(out: &mut String, answers: &[(SocketAddr, Answer)]) {
    use std::fmt::Write;
    let mut rows: Vec<(u32, u32, &weir_engine::wire::msg::LogStatus)> = answers
        .iter()
        .filter_map(|(_, a)| match a {
            Answer::Up(r) => Some(r.logs.iter().map(move |l| (l.partition, r.node.0, l))),
            Answer::Down(_) => None,
        })
        .flatten()
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by_key(|(p, n, l)| (*p, !l.source, *n));
    let _ =
        writeln!(out, "\n{:<10} {:<6} {:<7} {:>27} {:>10}  copy", "partition", "node", "log", "versions", "on disk");
    for (p, node, l) in rows {
        let copy = match (l.source, l.follower.0) {
            (false, _) => String::new(),
            (true, 0) => "none (one copy)".into(),
            (true, f) => {
                let behind = match l.end.0.saturating_sub(l.readable.0) {
                    0 => String::new(),
                    n => format!(", {n} versions behind"),
                };
                match l.in_sync {
                    4 => format!("on node {f}, out of the in-sync set (appends acknowledged on this node alone)"),
                    3 => format!("on node {f}, out of the in-sync set{behind}"),
                    2 => format!("on node {f}, in-sync set not known yet{behind}"),
                    _ if behind.is_empty() => format!("on node {f}, in sync"),
                    _ => format!("on node {f}{behind}"),
                }
            }
        };
        let line = format!(
            "{:<10} {:<6} {:<7} {:>27} {:>10}  {copy}",
            p,
            node,
            if l.source { "source" } else { "copy" },
            format!("{}..{}", l.first.0, l.end.0),
            crate::checkpoints::mib(l.bytes),
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Asks the nodes, prints what they said.
#[allow(clippy::print_stdout)]
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let t = args.cluster.target()?;
    let stream = match &args.stream {
        Some(r) => Some(weir_engine::wire::StreamId(crate::client::stream_id(&t, r, args.timeout)?)),
        None => None,
    };
    // An id the catalog does not list names no stream (a catalog no node answers with says
    // nothing: the nodes' answers say why).
    if let Some(id) = stream
        && crate::status_streams::catalog(&t, args.timeout).is_some_and(|c| !c.iter().any(|e| e.id == id))
    {
        anyhow::bail!("no stream {} in the catalog (`weir stream list` shows them)", id.0);
    }
    let mut log = match &args.status_log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| anyhow::anyhow!("cannot open the status log {}: {e}", p.display()))?,
        ),
        None => None,
    };
    loop {
        let answers: Vec<(SocketAddr, Answer)> = t
            .nodes
            .iter()
            .map(|a| {
                crate::client::status_of(&t, *a, stream, args.timeout)
                    .map(|r| (*a, r.map_or_else(Answer::Down, |s| Answer::Up(Box::new(s)))))
            })
            .collect::<anyhow::Result<_>>()?;
        let all_up = answers.iter().all(|(_, a)| matches!(a, Answer::Up(_)));
        let ids: Ids = t.node_ids();
        // Several streams, none named: each stream's line first.
        let overview = match stream {
            None => crate::status_streams::overview(&t, args.timeout)?,
            Some(_) => None,
        };
        let text = if args.json {
            let mut v = to_json(&answers, &ids);
            if let Some(rows) = &overview {
                v["catalog"] = crate::status_streams::json(rows, &ids);
            }
            serde_json::to_string_pretty(&v)?
        } else {
            let first = overview.as_deref().map(|rows| crate::status_streams::text(rows, &ids) + "\n");
            first.unwrap_or_default() + &to_text(&answers, &ids)
        };
        if let Some(f) = &mut log {
            let mut line = to_json(&answers, &ids);
            line["at_ms"] = serde_json::json!(now_ms());
            // One write per line (`writeln!` on a file writes piece by piece): a reader or a
            // kill never sees half a line.
            let line = format!("{line}\n");
            f.write_all(line.as_bytes()).map_err(|e| anyhow::anyhow!("cannot write the status log: {e}"))?;
        }
        if args.watch {
            // Home and clear: the table is redrawn in place.
            print!("\x1b[H\x1b[2J{text}");
            std::io::stdout().flush()?;
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        println!("{text}");
        return Ok(if all_up { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
