//! What a node does between runs of its stream, as a pure state machine: how a run ended and
//! the time in, what to do next out (restart after a delay, wait for a lease, stop, give up),
//! with the node's incarnation and restart history. `weir node` drives it: it starts the
//! engine, waits without one, records incarnations in its data directory, reads placement and
//! membership; this module decides.
//!
//! Why incarnations: after a failure every node restarts its stream from the last commit, and
//! frames of a stream that has not restarted yet must never reach one that has (their channel
//! sequence numbers would read as lost data, or worse, be taken as new). Each start of a node's
//! stream runs at an incarnation (the run's epoch, which every message between its tasks
//! carries) above any the node used before (so a node that was killed and comes back is newer
//! than the stream its peers still run) and at least the newest run a peer was seen in; a node
//! whose run hears of a later one elsewhere restarts at it. The cluster converges on the
//! highest. The incarnations of placement version `v` start at `v << 32`, so the nodes of one
//! run run one placement.
//!
//! Invariants: the incarnation never goes down; a start is at or above the floor of the
//! placement it runs; only failures of the stream count against the restart strategy (a lost
//! lease does not); a stop that was asked for stops the node whatever else ended the run.

use std::time::Duration;

use weir_wire::msg::RestartInfo;

/// The restart strategy.
#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    /// The same delay before every restart.
    FixedDelay(Duration),
    /// `first`, doubling with each restart within the window, up to `max`.
    Backoff {
        /// The first delay.
        first: Duration,
        /// The longest.
        max: Duration,
    },
    /// No restart: the first failure fails the stream.
    None,
}

/// Restarts allowed within a window, and the delay before each.
#[derive(Clone, Debug, PartialEq)]
pub struct RestartPolicy {
    /// The strategy.
    pub strategy: Strategy,
    /// Restarts allowed within `window`.
    pub max_restarts: u32,
    /// The window restarts count in.
    pub window: Duration,
}

/// Why the strategy allows no more restarts (fatal: the node exits).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GaveUp {
    /// The strategy is "none".
    #[error("the restart strategy is \"none\"")]
    NoRestarts,
    /// The window holds as many restarts as allowed.
    #[error("{recent} restarts within {window} already (restart.max_restarts = {max})")]
    TooMany {
        /// Restarts within the window.
        recent: u32,
        /// The window, for people.
        window: String,
        /// `max_restarts`.
        max: u32,
    },
}

impl RestartPolicy {
    /// The delay before the next restart, given when earlier restarts happened (`past`, in ms
    /// on any clock `now_ms` shares), or why there is none.
    pub fn next(&self, past: &[u64], now_ms: u64) -> Result<Duration, GaveUp> {
        let window_ms = self.window.as_millis() as u64;
        let recent = past.iter().filter(|t| now_ms.saturating_sub(**t) < window_ms).count() as u32;
        match &self.strategy {
            Strategy::None => Err(GaveUp::NoRestarts),
            _ if recent >= self.max_restarts => Err(GaveUp::TooMany {
                recent,
                window: humantime::format_duration(self.window).to_string(),
                max: self.max_restarts,
            }),
            Strategy::FixedDelay(d) => Ok(*d),
            Strategy::Backoff { first, max } => Ok(first.saturating_mul(1u32 << recent.min(20)).min(*max)),
        }
    }
}

/// The first incarnation of placement `version`.
pub fn placement_floor(version: u32) -> u64 {
    u64::from(version) << 32
}

/// The incarnation of the next start: above the last one, and at least `newer` (a peer's).
pub fn next_incarnation(last: u64, newer: Option<u64>) -> u64 {
    (last + 1).max(newer.unwrap_or(0))
}

/// How a run of the stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// SIGTERM or Ctrl-C.
    Signal,
    /// `weir stop`.
    StopRequested,
    /// A bounded stream ended here (and the node was to exit then).
    Done,
    /// The stream failed here (why), maybe because a peer runs a later run (epoch); a run that
    /// could not start counts as one.
    Failed {
        /// Why.
        why: String,
        /// The later run's epoch, when that is why.
        newer: Option<u64>,
    },
    /// The node stopped holding its lease in the control store (why): it runs nothing until it
    /// holds one again.
    Fenced {
        /// Why, as the control store's side says.
        why: String,
    },
    /// The catalog paused or resumed the stream: the run of the other kind starts at once (at
    /// least at `newer`, a peer's run that switched first). No failure: the strategy does not
    /// count it.
    Switched {
        /// The later run a peer was seen in, when there was one.
        newer: Option<u64>,
    },
}

/// What the node does after a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Exit 0 (why, for the log).
    Exit(&'static str),
    /// Wait until the node holds a lease again, then start at the (newer) incarnation.
    AwaitLease,
    /// Wait `delay` (or until a peer is seen at a newer incarnation), then start again at
    /// `incarnation`.
    Restart {
        /// The strategy's delay (none when a peer already runs a newer incarnation).
        delay: Duration,
        /// The incarnation of the next start.
        incarnation: u64,
    },
    /// Start the next run now, at `incarnation` (the stream was paused or resumed).
    Continue {
        /// The incarnation of the next start.
        incarnation: u64,
    },
    /// The strategy allows no more restarts: exit 2.
    GiveUp {
        /// Why the last run failed.
        why: String,
        /// Why there is no restart.
        gave_up: GaveUp,
    },
}

/// How the node waited without an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// For a lease.
    Lease,
    /// Idle: the cluster moved its tasks away.
    Idle,
    /// The restart delay.
    Restart,
}

/// Restarts `weir status` lists: the last ones.
const RESTARTS_KEPT: usize = 20;

/// A node's incarnation and restarts across the runs of its stream.
#[derive(Clone, Debug)]
pub struct Supervisor {
    policy: RestartPolicy,
    incarnation: u64,
    /// The newest incarnation a peer was seen at.
    seen: Option<u64>,
    restarts: Vec<RestartInfo>,
    /// When the failures that counted against the strategy restarted the stream (ms).
    restart_times: Vec<u64>,
}

impl Supervisor {
    /// A node whose last recorded incarnation is `last` (0: never started).
    pub fn new(policy: RestartPolicy, last: u64) -> Self {
        Self {
            policy,
            incarnation: next_incarnation(last, None),
            seen: None,
            restarts: Vec::new(),
            restart_times: Vec::new(),
        }
    }

    /// The incarnation the node is at.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The last restarts, oldest first.
    pub fn restarts(&self) -> &[RestartInfo] {
        &self.restarts
    }

    /// A run of the stream at `epoch` was seen elsewhere (on a node that runs no run of it, or
    /// before a start): the next start is at least there, so it joins that run rather than one
    /// its peers would leave at once.
    pub fn heard(&mut self, epoch: Option<u64>) {
        self.seen = self.seen.max(epoch);
        self.incarnation = self.incarnation.max(epoch.unwrap_or(0));
    }

    /// A run starts under placement `version`: the incarnation it runs at (to record before it
    /// starts).
    pub fn start(&mut self, version: u32) -> u64 {
        self.incarnation = self.incarnation.max(placement_floor(version));
        self.incarnation
    }

    /// The incarnation an idle node (placement `version` has none of its tasks) answers at.
    pub fn idle_at(&self, version: u32) -> u64 {
        self.seen.unwrap_or(0).max(placement_floor(version))
    }

    /// A wait without an engine ended, a peer seen at `newer` meanwhile or not.
    pub fn woke(&mut self, waited: Waited, newer: Option<u64>) {
        self.seen = self.seen.max(newer);
        match waited {
            // Nothing ran meanwhile: no newer incarnation of its own (the last stop took one).
            Waited::Lease => self.incarnation = self.incarnation.max(self.seen.unwrap_or(0)),
            Waited::Idle => self.incarnation = next_incarnation(self.incarnation, self.seen),
            Waited::Restart => {
                self.incarnation = self.incarnation.max(newer.unwrap_or(0));
                if let Some(r) = self.restarts.last_mut() {
                    r.incarnation = self.incarnation;
                }
            }
        }
    }

    /// A run ended as `end` at `now_ms`; `stop_requested`: `weir stop` asked this node to stop
    /// (it was answered "stopping", so it stops whatever else ended the run).
    pub fn ended(&mut self, end: RunEnd, stop_requested: bool, now_ms: u64) -> Next {
        let (why, newer) = match end {
            RunEnd::Failed { .. } | RunEnd::Fenced { .. } | RunEnd::Switched { .. } if stop_requested => {
                return Next::Exit("weir stop");
            }
            RunEnd::Signal => return Next::Exit("signal"),
            RunEnd::StopRequested => return Next::Exit("weir stop"),
            RunEnd::Done => return Next::Exit("stream ended"),
            RunEnd::Fenced { why } => {
                // Not a failure of the stream: the next start waits for a lease, at a newer
                // incarnation, and does not count against the strategy.
                self.incarnation = next_incarnation(self.incarnation, self.seen);
                let r = RestartInfo {
                    at_ms: now_ms,
                    incarnation: self.incarnation,
                    reason: format!("lost its lease: {why}"),
                };
                self.remember(r);
                return Next::AwaitLease;
            }
            RunEnd::Switched { newer } => {
                self.seen = self.seen.max(newer);
                self.incarnation = next_incarnation(self.incarnation, self.seen);
                return Next::Continue { incarnation: self.incarnation };
            }
            RunEnd::Failed { why, newer } => (why, newer),
        };
        self.seen = self.seen.max(newer);
        match self.policy.next(&self.restart_times, now_ms) {
            Ok(delay) => {
                // A newer incarnation comes from a node that has waited its delay already (or
                // decided a move): waiting again would only stack the delays.
                let delay = if newer.is_some() { Duration::ZERO } else { delay };
                self.incarnation = next_incarnation(self.incarnation, newer);
                self.restart_times.push(now_ms);
                self.remember(RestartInfo { at_ms: now_ms, incarnation: self.incarnation, reason: why });
                Next::Restart { delay, incarnation: self.incarnation }
            }
            Err(gave_up) => Next::GiveUp { why, gave_up },
        }
    }

    fn remember(&mut self, r: RestartInfo) {
        self.restarts.push(r);
        if self.restarts.len() > RESTARTS_KEPT {
            self.restarts.remove(0);
        }
    }
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
