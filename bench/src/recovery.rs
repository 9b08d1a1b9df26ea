//! `weir-e2e recovery [seconds] [k1,k2,...] [w1,w2,...] [b1,b2,...]`: how long `weir run`
//! takes to come back from `kill -9`, per key count, window length and recovery budget (`off`:
//! no bound), and what the budget costs while it runs.
//!
//! Each case runs the `weir` binary (beside this one, or `WEIR_BIN`) at full speed for
//! `seconds`, kills it with SIGKILL, and runs `weir run --resume` on the same data directory.
//! Before the kill: the median of its status lines' events/s and of their last commit's
//! duration. After: the time from the resume's start to its first status line with new events,
//! and to the first one at 80 % of the rate before the kill (status lines come once a second:
//! the times are upper bounds to a second), and the largest replay a status line showed (the
//! slowest agg's rows; a replay over within a second shows in none).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One status line of `weir run`, and when it came.
#[derive(Debug, Default, Clone)]
struct Line {
    at: Duration,
    rate: f64,
    events: u64,
    last_commit_ms: f64,
    replay_rows: u64,
}

fn parse(line: &str, at: Duration) -> Option<Line> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let before = |w: &str| words.iter().position(|x| *x == w).and_then(|i| i.checked_sub(1)).map(|i| words[i]);
    let rate = before("M")?.parse::<f64>().ok()? * 1e6;
    let events = before("events")?.parse().ok()?;
    let last_commit_ms = words.iter().position(|w| *w == "(last").and_then(|i| words.get(i + 1))?.parse().ok()?;
    let replay_rows = words
        .iter()
        .position(|w| *w == "replaying")
        .and_then(|i| words.get(i + 3))
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    Some(Line { at, rate, events, last_commit_ms, replay_rows })
}

/// The `weir` binary: `WEIR_BIN`, else beside this executable.
pub(crate) fn weir_bin() -> PathBuf {
    std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_exe().expect("this executable").with_file_name("weir"))
}

/// Starts `weir run` with `args`, its status lines sent to the returned queue as they come.
fn start(args: &[String], dir: &Path) -> (Child, mpsc::Receiver<Line>) {
    let mut child = Command::new(weir_bin())
        .arg("run")
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {}: {e} (build it: cargo build --release -p weir-tools)", weir_bin().display())
        });
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(l) = parse(&line, t0.elapsed())
                && tx.send(l).is_err()
            {
                break;
            }
        }
    });
    (child, rx)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// What one case measured.
struct Case {
    rate: f64,
    commit_ms: f64,
    first_new: Option<Duration>,
    full_speed: Option<Duration>,
    replay_rows: u64,
}

fn case(keys: u64, window: &str, budget: &str, seconds: u64) -> Case {
    let dir = tempfile::Builder::new().prefix("weir-recovery").tempdir_in("/var/tmp").expect("temp dir");
    let common = ["--keys", &keys.to_string(), "--window", window, "--recovery-budget", budget].map(String::from);
    let mut args = common.to_vec();
    args.extend(["--duration", "1h"].map(String::from));
    let (mut child, lines) = start(&args, dir.path());
    let deadline = Duration::from_secs(seconds);
    let mut before = Vec::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(30)) {
        let done = l.at >= deadline;
        before.push(l);
        if done {
            break;
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    // The first seconds fill the windows and warm the caches.
    let steady: Vec<&Line> = before.iter().filter(|l| l.at >= Duration::from_secs(5)).collect();
    let rate = median(steady.iter().map(|l| l.rate).collect());
    let commit_ms = median(steady.iter().map(|l| l.last_commit_ms).filter(|ms| *ms > 0.0).collect());

    let mut args = common.to_vec();
    args.extend(["--duration", "2m", "--resume"].map(String::from));
    let (mut child, lines) = start(&args, dir.path());
    let (mut first_new, mut full_speed, mut replay_rows) = (None, None, 0);
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(30)) {
        replay_rows = replay_rows.max(l.replay_rows);
        if first_new.is_none() && l.events > 0 {
            first_new = Some(l.at);
        }
        if full_speed.is_none() && l.rate >= 0.8 * rate {
            full_speed = Some(l.at);
        }
        if full_speed.is_some_and(|t| l.at > t + Duration::from_secs(2)) || l.at > Duration::from_secs(110) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Case { rate, commit_ms, first_new, full_speed, replay_rows }
}

/// Prints the table.
#[allow(clippy::print_stdout)]
pub fn recovery(seconds: u64, keys: &[u64], windows: &[String], budgets: &[String]) {
    println!(
        "weir run at full speed for {seconds} s, kill -9, weir run --resume (status lines once a second: times are upper bounds)"
    );
    println!(
        "{:>10} | {:>6} | {:>6} | {:>12} | {:>10} | {:>13} | {:>14} | {:>22}",
        "keys",
        "window",
        "budget",
        "M events/s",
        "commit p50",
        "first new ev.",
        "at full speed",
        "replay (slowest agg)"
    );
    let secs = |d: Option<Duration>| d.map_or("none".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
    for &k in keys {
        for w in windows {
            for b in budgets {
                let c = case(k, w, b, seconds);
                let replay =
                    if c.replay_rows > 0 { format!("{} M rows", c.replay_rows / 1_000_000) } else { "< 1 s".into() };
                println!(
                    "{:>10} | {:>6} | {:>6} | {:>12.2} | {:>7.1} ms | {:>13} | {:>14} | {:>22}",
                    k,
                    w,
                    b,
                    c.rate / 1e6,
                    c.commit_ms,
                    secs(c.first_new),
                    secs(c.full_speed),
                    replay
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_of_weir_run_parses() {
        let line = "   12.0s    16.20 M events/s       180000000 events     42 window results    11 checkpoints (last  35.2 ms)  rss  900 MiB  replaying 1000 of 5000 rows (20 %) in 1s, about 4s left (the slowest of 2 aggs)";
        let l = parse(line, Duration::from_secs(1)).unwrap();
        assert_eq!((l.rate, l.events, l.last_commit_ms, l.replay_rows), (16.2e6, 180_000_000, 35.2, 5000));
        assert!(parse("weir run: 2 source partitions -> 2 aggs", Duration::ZERO).is_none());
    }
}
