//! `weir checkpoints`: what a remote store holds. `list` the committed checkpoints (time, size,
//! files, source offsets), `show` one in detail, `verify` every file of one against its manifest,
//! `gc` the garbage on demand (with `--dry-run`). Exit codes: 0 success, 1 damage found (verify),
//! 2 an error (a store that cannot be read, a checkpoint that does not exist, bad arguments).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use weir_engine::backup::commit::Point;
use weir_engine::backup::commit_point::CommitBook;
use weir_engine::backup::inspect::{CheckpointInfo, checkpoint_info, list_commits_in, verify_checkpoint};
use weir_engine::backup::retention::{CollectOptions, Collector};
use weir_engine::checkpoint::{CommitRecord, RecordKind};
use weir_engine::cluster::{ControlCommits, Keys};
use weir_engine::control::EtcdControl;
use weir_engine::wire::{CheckpointId, StreamId};

use crate::remote::RemoteArgs;

/// Options of `weir checkpoints`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  weir checkpoints list --remote s3://lab/weir --s3-endpoint http://127.0.0.1:9000
  weir checkpoints verify 42 --remote rsync://weir@backup/checkpoints/lab1
  weir checkpoints gc --remote file:///srv/weir --keep 2 --dry-run
  weir checkpoints gc --remote s3://lab/weir --etcd http://10.0.0.5:2379 --cluster lab --keep 3")]
pub struct CheckpointsArgs {
    #[command(subcommand)]
    what: What,
    #[command(flatten)]
    remote: RemoteArgs,
    /// The stream.
    #[arg(long, default_value_t = 1, global = true)]
    stream: u64,
    /// Print JSON instead of a table (for scripts).
    #[arg(long, global = true)]
    json: bool,
    /// The cluster's etcd, when its control is there (`[control] etcd`, comma-separated): the
    /// commit etcd names is the last; newer records are no commits (`list` leaves them out,
    /// `gc` keeps them).
    #[arg(long, value_delimiter = ',', value_name = "URLS", global = true, requires = "cluster")]
    etcd: Vec<String>,
    /// The cluster's name in etcd (the config file's `cluster`).
    #[arg(long, global = true, requires = "etcd")]
    cluster: Option<String>,
}

impl CheckpointsArgs {
    /// The commits etcd lists (`None`: every record in the store is one). Without `--etcd`, a
    /// stream whose commit point etcd holds is refused: the store alone would count records
    /// etcd does not.
    fn listed(&self, store: &dyn weir_engine::backup::Store, stream: StreamId) -> anyhow::Result<Option<Vec<Point>>> {
        if let What::Gc { keep, .. } = &self.what
            && self.cluster.is_some()
            && *keep > weir_engine::cluster::HISTORY
        {
            anyhow::bail!("--keep {keep} with --etcd: etcd lists the last {} commits", weir_engine::cluster::HISTORY);
        }
        let Some(cluster) = &self.cluster else {
            // The store's records, unless it says etcd holds the stream's commits.
            return Ok(weir_engine::backup::commit_point::StoreCommits::new(stream).commits(store)?);
        };
        let etcd = EtcdControl::connect(&self.etcd, std::time::Duration::from_secs(2))
            .with_context(|| format!("cannot reach etcd at {}", self.etcd.join(",")))?;
        let book = ControlCommits::reader(std::sync::Arc::new(etcd), &Keys::new(cluster), stream);
        book.commits(store).with_context(|| format!("reading stream {stream}'s commit point in etcd"))
    }
}

#[derive(clap::Subcommand, Debug)]
enum What {
    /// The committed checkpoints, oldest first: time, size, files, source offsets.
    List,
    /// One checkpoint: each task's manifest and files.
    Show {
        /// Checkpoint id.
        id: u64,
    },
    /// Reads every file of a checkpoint and checks its size and checksum (exit 1 on damage).
    Verify {
        /// Checkpoint id.
        id: u64,
    },
    /// Deletes what no kept checkpoint needs: older commits, their files, failed leftovers.
    Gc {
        /// Commits to keep.
        #[arg(long, default_value_t = 3)]
        keep: usize,
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// The stream is not running: files no kept checkpoint names go now (otherwise they
        /// go at a later pass, as a checkpoint in flight may be uploading them).
        #[arg(long)]
        stopped: bool,
    },
}

/// `2026-12-01 12:00:00.123 UTC` from milliseconds since the epoch.
fn utc(ms: u64) -> String {
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}.{milli:03} UTC")
}

fn kind(r: &CommitRecord) -> String {
    match r.kind {
        RecordKind::Commit(t) => format!("commit (transaction {})", t.0),
        RecordKind::Consensus(to) => format!("back to {to} (the tasks' consensus: its record was lost)"),
        RecordKind::Fresh => "start from nothing".into(),
        RecordKind::Fallback(to) => format!("back to {to} (damaged after it)"),
    }
}

fn offsets(r: &CommitRecord) -> String {
    r.versions.iter().map(|(t, v)| format!("{t}@{}", v.0)).collect::<Vec<_>>().join(" ")
}

pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// What an agg's replay point asks of a restore, for people: where its replay starts, how many
/// rows it sends again, and which windows the snapshot writes instead.
fn replay_line(r: &weir_engine::backup::ReplayPoint) -> String {
    let rows: u64 = r.taken.iter().map(|(a, b)| b.saturating_sub(*a)).sum();
    let from =
        if r.resume { format!("resuming a replay at chk-{}", r.from.0) } else { format!("from chk-{}", r.from.0) };
    let mut line = match rows {
        0 => "nothing to replay".to_string(),
        _ => format!("replay {from}: {rows} rows again"),
    };
    if !r.written.is_empty() || !r.partial.is_empty() {
        line.push_str(&format!("; windows written: {}", r.written.len() + r.partial.len()));
        if !r.partial.is_empty() {
            line.push_str(&format!(" ({} partly rebuilt)", r.partial.len()));
        }
    }
    line
}

fn replay_json(r: &weir_engine::backup::ReplayPoint) -> serde_json::Value {
    json!({
        "from": r.from.0,
        "resume": r.resume,
        "rows": r.taken.iter().map(|(a, b)| b.saturating_sub(*a)).sum::<u64>(),
        "written": r.written,
        "partial": r.partial,
    })
}

fn info_json(i: &CheckpointInfo) -> serde_json::Value {
    let r = &i.record;
    json!({
        "id": r.id.0,
        "kind": kind(r),
        "committed_at_ms": r.ts,
        "bytes": i.bytes(),
        "files": i.files(),
        "offsets": r.versions.iter().map(|(t, v)| (t.to_string(), json!(v.0))).collect::<serde_json::Map<_, _>>(),
        "tasks": i.tasks.iter().map(|(t, m)| match m {
            Ok(m) => json!({"task": t.0, "version": m.version.0, "files": m.files.iter().map(|f| json!({
                "name": f.name, "key": f.key, "size": f.size, "crc32c": format!("{:08x}", f.crc)
            })).collect::<Vec<_>>(), "replay": m.replay.as_ref().map(replay_json)}),
            Err(e) => json!({"task": t.0, "error": e.to_string()}),
        }).collect::<Vec<_>>(),
    })
}

/// Runs `weir checkpoints`.
pub fn run(args: &CheckpointsArgs) -> anyhow::Result<ExitCode> {
    let url = args.remote.remote.as_deref().context("--remote URL (or WEIR_REMOTE) names the store")?;
    let store = args.remote.open(url)?;
    let stream = StreamId(args.stream);
    let mut out = std::io::stdout().lock();
    match &args.what {
        What::List => {
            let mut rows = Vec::new();
            let listed = args.listed(store.as_ref(), stream)?;
            let commits =
                list_commits_in(store.as_ref(), stream, listed.as_deref()).with_context(|| format!("listing {url}"))?;
            for r in commits {
                rows.push(checkpoint_info(store.as_ref(), stream, r.id).with_context(|| format!("reading {}", r.id))?);
            }
            if args.json {
                let v: Vec<_> = rows.iter().map(info_json).collect();
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            if rows.is_empty() {
                writeln!(out, "no committed checkpoints of stream {stream} in {url}")?;
                return Ok(ExitCode::SUCCESS);
            }
            writeln!(out, "{:>8}  {:<27}  {:>10}  {:>6}  {:<26}  offsets", "id", "committed", "size", "files", "kind")?;
            for i in &rows {
                let r = &i.record;
                writeln!(
                    out,
                    "{:>8}  {:<27}  {:>10}  {:>6}  {:<26}  {}",
                    r.id.0,
                    utc(r.ts),
                    mib(i.bytes()),
                    i.files(),
                    kind(r),
                    offsets(r)
                )?;
            }
        }
        What::Show { id } => {
            let i = checkpoint_info(store.as_ref(), stream, CheckpointId(*id))
                .with_context(|| format!("reading checkpoint {id} of stream {stream} in {url}"))?;
            if args.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&info_json(&i))?)?;
                return Ok(ExitCode::SUCCESS);
            }
            let r = &i.record;
            writeln!(out, "checkpoint {} of stream {stream}: {}, committed {}", r.id.0, kind(r), utc(r.ts))?;
            writeln!(out, "  {} in {} files; source offsets {}", mib(i.bytes()), i.files(), offsets(r))?;
            for (t, m) in &i.tasks {
                match m {
                    Ok(m) => {
                        writeln!(out, "  task {t}: version {}, {} files", m.version.0, m.files.len())?;
                        if let Some(r) = &m.replay {
                            writeln!(out, "    {}", replay_line(r))?;
                        }
                        for f in &m.files {
                            writeln!(out, "    {:>12}  {:08x}  {}", f.size, f.crc, f.key)?;
                        }
                    }
                    Err(e) => writeln!(out, "  task {t}: {e}")?,
                }
            }
        }
        What::Verify { id } => {
            let v = verify_checkpoint(store.as_ref(), stream, CheckpointId(*id))
                .with_context(|| format!("verifying checkpoint {id} of stream {stream} in {url}"))?;
            if args.json {
                let damage: Vec<_> = v.damage.iter().map(|d| json!({"key": d.key, "reason": d.reason})).collect();
                let j =
                    json!({"id": id, "files": v.files, "bytes": v.bytes, "ok": v.damage.is_empty(), "damage": damage});
                writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
            } else if v.damage.is_empty() {
                writeln!(out, "checkpoint {id}: {} files, {} verified: ok", v.files, mib(v.bytes))?;
            } else {
                writeln!(out, "checkpoint {id}: {} files ok, {} damaged:", v.files, v.damage.len())?;
                for d in &v.damage {
                    writeln!(out, "  {}: {}", d.key, d.reason)?;
                }
            }
            return Ok(if v.damage.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        What::Gc { keep, dry_run, stopped } => {
            let listed = args.listed(store.as_ref(), stream)?;
            let opts =
                CollectOptions { keep: *keep, dry_run: *dry_run, stopped: *stopped, listed, ahead_runs_below: 0 };
            let c = Collector::new()
                .collect_with(store.as_ref(), stream, opts)
                .with_context(|| format!("collecting {url}"))?;
            if args.json {
                let j = json!({
                    "dry_run": dry_run, "kept": c.kept.iter().map(|i| i.0).collect::<Vec<_>>(),
                    "commits_deleted": c.commits_deleted, "objects_deleted": c.objects_deleted,
                    "deleted": c.deleted, "unnamed_kept": c.pending,
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            let verb = if *dry_run { "would delete" } else { "deleted" };
            for k in &c.deleted {
                writeln!(out, "  {verb} {k}")?;
            }
            let kept: Vec<String> = c.kept.iter().map(|i| i.0.to_string()).collect();
            writeln!(
                out,
                "{verb} {} commit records and {} other objects; kept checkpoints {}",
                c.commits_deleted,
                c.objects_deleted,
                if kept.is_empty() { "none".into() } else { kept.join(", ") }
            )?;
            if c.pending > 0 {
                writeln!(
                    out,
                    "{} files no kept checkpoint names stay until a later pass (or pass --stopped)",
                    c.pending
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_times_are_civil_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(super::utc(1_796_126_400_123), "2026-12-01 12:00:00.123 UTC");
    }
}
