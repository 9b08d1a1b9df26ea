//! `weir node`'s side of the restart strategy and incarnations
//! ([`weir_engine::cluster::supervisor`] decides): the strategy from the config file, and, kept
//! in the node's data directory, the last incarnation (epoch) its stream started at and the
//! last process's incarnation.
//!
//! Invariant: each file is replaced atomically before anything runs at what it records.

use std::path::{Path, PathBuf};

use anyhow::Context;
use weir_engine::cluster::supervisor::{RestartPolicy, Strategy};

use crate::config::RestartFile;

/// The policy the config file describes (validated already).
pub fn policy(f: &RestartFile) -> RestartPolicy {
    let strategy = match f.strategy.as_str() {
        "none" => Strategy::None,
        "exponential-backoff" => Strategy::Backoff { first: f.delay, max: f.max_delay.max(f.delay) },
        _ => Strategy::FixedDelay(f.delay),
    };
    RestartPolicy { strategy, max_restarts: f.max_restarts, window: f.window }
}

/// Where a node keeps the last incarnation it started its stream at.
fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("incarnation")
}

/// The last incarnation the node started at (0: never).
pub fn last(data_dir: &Path) -> anyhow::Result<u64> {
    read(&path(data_dir))
}

/// Where a node keeps the incarnation of its last process.
fn process_path(data_dir: &Path) -> PathBuf {
    data_dir.join("process")
}

/// The incarnation of this process of the node, recorded: above the last one recorded and at
/// least the time in ms (so a node whose data directory was lost still comes back above the
/// process its peers knew, unless the clock went back as well).
pub fn next_process(data_dir: &Path) -> anyhow::Result<u64> {
    let last = read(&process_path(data_dir))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let next = (last + 1).max(now);
    write(data_dir, &process_path(data_dir), next)?;
    Ok(next)
}

/// Records that the node starts its stream at `incarnation` (atomically, and durably before
/// any peer hears of it).
pub fn record(data_dir: &Path, incarnation: u64) -> anyhow::Result<()> {
    write(data_dir, &path(data_dir), incarnation)
}

/// The number `p` holds (0: no file).
fn read(p: &Path) -> anyhow::Result<u64> {
    match std::fs::read_to_string(p) {
        Ok(t) => t.trim().parse().with_context(|| format!("{} holds {:?}, not an incarnation", p.display(), t.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

/// Replaces `p` (in `data_dir`) with `n`, atomically and durably.
fn write(data_dir: &Path, p: &Path, n: u64) -> anyhow::Result<()> {
    replace(data_dir, p, &format!("{n}\n"))
}

/// Replaces `p` (in `dir`) with `text`, atomically and durably: a crash leaves the old text or
/// the new.
pub fn replace(dir: &Path, p: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = p.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, p)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("writing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_config_files_strategy_becomes_the_policy() {
        let f: RestartFile = toml::from_str(
            "strategy = \"exponential-backoff\"\ndelay = \"1s\"\nmax_delay = \"5s\"\nmax_restarts = 4\nwindow = \"1m\"",
        )
        .unwrap();
        let p = policy(&f);
        let backoff = Strategy::Backoff { first: Duration::from_secs(1), max: Duration::from_secs(5) };
        assert_eq!(p, RestartPolicy { strategy: backoff, max_restarts: 4, window: Duration::from_secs(60) });
    }

    #[test]
    fn the_last_incarnation_reads_back_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last(dir.path()).unwrap(), 0);
        record(dir.path(), 1).unwrap();
        assert_eq!(last(dir.path()).unwrap(), 1);
        std::fs::write(dir.path().join("incarnation"), "seven").unwrap();
        let e = last(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not an incarnation"), "{e}");
    }
}
