//! What `weir node` does when its stream fails: the restart strategy (pure: restart times in,
//! a delay or "failed" out) and the node's incarnation, kept in its data directory.
//!
//! Why incarnations: after a failure every node restarts its stream from the last commit, and
//! frames of a stream that has not restarted yet must never reach one that has (their channel
//! sequence numbers would read as lost data, or worse, be taken as new). Each start of a node's
//! stream runs at an incarnation above any the node used before (so a node that was killed and
//! comes back is newer than the stream its peers still run) and at least the newest a peer was
//! seen at; members only connect at the same incarnation, and the older end restarts at the
//! newer one. The cluster converges on the highest.
//!
//! Invariant: the incarnation file is replaced atomically before the engine starts at it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::config::RestartFile;

/// The strategy, from the config file.
#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    /// The same delay before every restart.
    FixedDelay(Duration),
    /// `first`, doubling with each restart within the window, up to `max`.
    Backoff { first: Duration, max: Duration },
    /// No restart: the first failure fails the stream.
    None,
}

/// Restarts allowed within a window, and the delay before each.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    strategy: Strategy,
    max_restarts: u32,
    window: Duration,
}

impl RestartPolicy {
    /// The policy the config file describes (validated already).
    pub fn new(f: &RestartFile) -> Self {
        let strategy = match f.strategy.as_str() {
            "none" => Strategy::None,
            "exponential-backoff" => Strategy::Backoff { first: f.delay, max: f.max_delay.max(f.delay) },
            _ => Strategy::FixedDelay(f.delay),
        };
        Self { strategy, max_restarts: f.max_restarts, window: f.window }
    }

    /// The delay before the next restart, given when earlier restarts happened (`past`, in ms
    /// on any clock `now_ms` shares), or why there is none: the stream has failed.
    pub fn next(&self, past: &[u64], now_ms: u64) -> Result<Duration, String> {
        let window_ms = self.window.as_millis() as u64;
        let recent = past.iter().filter(|t| now_ms.saturating_sub(**t) < window_ms).count() as u32;
        match &self.strategy {
            Strategy::None => Err("the restart strategy is \"none\"".into()),
            _ if recent >= self.max_restarts => Err(format!(
                "{recent} restarts within {} already (restart.max_restarts = {})",
                humantime::format_duration(self.window),
                self.max_restarts
            )),
            Strategy::FixedDelay(d) => Ok(*d),
            Strategy::Backoff { first, max } => Ok(first.saturating_mul(1u32 << recent.min(20)).min(*max)),
        }
    }
}

/// Restarts `weir status` lists: the last ones.
const RESTARTS_KEPT: usize = 20;

/// Adds `r` to the node's restarts, keeping the last ones.
pub fn remember(restarts: &mut Vec<weir_engine::wire::msg::RestartInfo>, r: weir_engine::wire::msg::RestartInfo) {
    restarts.push(r);
    if restarts.len() > RESTARTS_KEPT {
        restarts.remove(0);
    }
}

/// Where a node keeps the last incarnation it started its stream at.
fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("incarnation")
}

/// The last incarnation the node started at (0: never).
pub fn last(data_dir: &Path) -> anyhow::Result<u64> {
    let p = path(data_dir);
    match std::fs::read_to_string(&p) {
        Ok(t) => t.trim().parse().with_context(|| format!("{} holds {:?}, not an incarnation", p.display(), t.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

/// Records that the node starts its stream at `incarnation` (atomically, and durably before
/// any peer hears of it).
pub fn record(data_dir: &Path, incarnation: u64) -> anyhow::Result<()> {
    let p = path(data_dir);
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let tmp = p.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{incarnation}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &p)?;
        std::fs::File::open(data_dir)?.sync_all()
    };
    write().with_context(|| format!("writing {}", p.display()))
}

/// The incarnation of the next start: above the last one, and at least `newer` (a peer's).
pub fn next(last: u64, newer: Option<u64>) -> u64 {
    (last + 1).max(newer.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(strategy: &str, max_restarts: u32) -> RestartPolicy {
        let f: RestartFile = toml::from_str(&format!(
            "strategy = {strategy:?}\ndelay = \"1s\"\nmax_delay = \"5s\"\nmax_restarts = {max_restarts}\nwindow = \"1m\""
        ))
        .unwrap();
        RestartPolicy::new(&f)
    }

    #[test]
    fn fixed_delay_restarts_until_the_window_holds_max_restarts() {
        let p = policy("fixed-delay", 3);
        assert_eq!(p.next(&[], 100_000), Ok(Duration::from_secs(1)));
        assert_eq!(p.next(&[90_000, 95_000], 100_000), Ok(Duration::from_secs(1)));
        let err = p.next(&[90_000, 95_000, 99_000], 100_000).unwrap_err();
        assert!(err.contains("3 restarts within 1m"), "{err}");
        // Restarts older than the window do not count.
        assert_eq!(p.next(&[1_000, 2_000, 99_000], 100_000), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn backoff_doubles_with_recent_restarts_up_to_the_maximum() {
        let p = policy("exponential-backoff", 100);
        let delays: Vec<u64> = (0..5).map(|n| p.next(&vec![99_000; n], 100_000).unwrap().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(p.next(&[1_000; 4], 100_000), Ok(Duration::from_secs(1)), "old restarts reset the backoff");
    }

    #[test]
    fn strategy_none_fails_the_stream_at_once() {
        assert!(policy("none", 10).next(&[], 0).is_err());
    }

    #[test]
    fn incarnations_grow_past_the_last_and_reach_a_newer_peer() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last(dir.path()).unwrap(), 0);
        record(dir.path(), next(0, None)).unwrap();
        assert_eq!(last(dir.path()).unwrap(), 1);
        assert_eq!(next(1, Some(7)), 7);
        assert_eq!(next(7, Some(3)), 8);
        std::fs::write(dir.path().join("incarnation"), "seven").unwrap();
        let e = last(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not an incarnation"), "{e}");
    }
}
