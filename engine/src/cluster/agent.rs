//! The thread that keeps a node a member: it runs a round of the node's [`Member`] every third
//! of the lease's TTL (counted from the round's start; sooner after an error), and publishes
//! what it saw for the node's supervisor, which reads it without waiting on the control store,
//! and into the node's [`Tenure`], which the engine's acknowledgements read.
//!
//! Invariants:
//! - The published `held_until` (and the tenure) only ever come from the member's own bound,
//!   published as soon as the renewal is known, so a supervisor that stops the node's tasks
//!   once it has passed has stopped them before the store can end the node's lease.
//! - Absences count only while this node leads under one lease; a failed round neither adds
//!   to them nor clears them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_wire::NodeId;

use super::{Absence, Member, Tenure};
use crate::control::{Compare, ControlError, ControlStore, LeaseId};

/// What the node knows of its membership, as of the agent's last round.
#[derive(Clone, Debug, Default)]
pub struct AgentView {
    /// The node surely holds its membership until then (`None`: it holds none).
    pub held_until: Option<Instant>,
    /// The node's lease.
    pub lease: Option<LeaseId>,
    /// This node leads; its writes carry `fence`.
    pub leader: bool,
    /// The condition the leader's writes carry.
    pub fence: Option<Compare>,
    /// The leading node, as last seen.
    pub leader_node: Option<NodeId>,
    /// While this node leads: the absent nodes and since when.
    pub absent: Absence,
    /// When the last round started (`None`: none yet).
    pub stepped: Option<Instant>,
    /// Why the last round failed, if it did (`ControlError::is_retryable` says whether the
    /// agent can expect better).
    pub error: Option<Arc<ControlError>>,
    /// The agent's thread ended (it panicked): the node can no longer hold its membership.
    pub dead: bool,
    /// Rounds that succeeded.
    pub rounds: u64,
    /// Times this node became the leader.
    pub elections: u64,
    /// Times the node lost its membership (a renewal came too late, or the store ended it).
    pub lease_losses: u64,
}

impl AgentView {
    /// What status says of it at `now`, for a node that last read placement version
    /// `placement` and whose placement writes were refused `fenced_writes` times.
    pub fn info(&self, now: Instant, placement: u32, fenced_writes: u64) -> weir_wire::msg::MemberInfo {
        weir_wire::msg::MemberInfo {
            leader: self.leader_node.unwrap_or(NodeId(0)),
            lease_left_ms: self.held_until.map_or(0, |t| t.saturating_duration_since(now).as_millis() as u64),
            placement,
            elections: self.elections,
            lease_losses: self.lease_losses,
            fenced_writes,
            error: self.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
        }
    }

    /// Whether the node holds its membership at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t)
    }

    /// Whether this node may act as the leader at `now` (it led at its last round, and holds).
    pub fn leads(&self, now: Instant) -> bool {
        self.leader && self.fence.is_some() && self.holds(now)
    }
}

/// A running agent; dropping it leaves the cluster (revokes the lease) and joins the thread.
pub struct Agent {
    view: Arc<Mutex<AgentView>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    tenure: Arc<Tenure>,
}

fn lock(v: &Mutex<AgentView>) -> std::sync::MutexGuard<'_, AgentView> {
    v.lock().unwrap_or_else(|p| p.into_inner())
}

impl Agent {
    /// Starts the rounds of `member` on `store` with leases of `ttl`.
    pub fn start(store: Arc<dyn ControlStore>, member: Member, ttl: Duration) -> std::io::Result<Agent> {
        let view = Arc::new(Mutex::new(AgentView::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let tenure = Arc::new(Tenure::default());
        let name = format!("member-{}", member.node().0);
        let mut run =
            Rounds { member, store, ttl, view: view.clone(), tenure: tenure.clone(), absence: Absence::default() };
        let s = stop.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let ok = run.round(started);
                let wait =
                    if ok { ttl / 3 } else { (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500)) };
                let until = started + wait;
                while !s.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            run.tenure.set(None);
            let _ = run.member.leave(run.store.as_ref());
        })?;
        Ok(Agent { view, stop, thread: Some(thread), tenure })
    }

    /// What the agent saw last.
    pub fn view(&self) -> AgentView {
        let mut v = lock(&self.view).clone();
        v.dead = self.thread.as_ref().is_none_or(JoinHandle::is_finished) && !self.stop.load(Ordering::Relaxed);
        if v.dead {
            v.held_until = None;
        }
        v
    }

    /// The node's tenure, for the engine.
    pub fn tenure(&self) -> Arc<Tenure> {
        self.tenure.clone()
    }
}

/// The agent thread's state.
struct Rounds {
    member: Member,
    store: Arc<dyn ControlStore>,
    ttl: Duration,
    view: Arc<Mutex<AgentView>>,
    tenure: Arc<Tenure>,
    absence: Absence,
}

impl Rounds {
    /// One round at `now`; whether it succeeded.
    fn round(&mut self, now: Instant) -> bool {
        let had = self.member.holds(now);
        let lease_before = self.member.lease();
        let renewed = self.member.renew(self.store.as_ref(), now);
        // The renewal's bound, at once: the survey may take a while.
        self.publish_hold(had, &renewed);
        let surveyed = renewed.and_then(|()| self.member.survey(self.store.as_ref()));
        let mut v = lock(&self.view);
        v.stepped = Some(now);
        let lease_changed = self.member.lease() != lease_before;
        match surveyed {
            Ok(seen) => {
                if seen.leader && !v.leader {
                    v.elections += 1;
                }
                if seen.leader && !lease_changed {
                    self.absence.observe(&seen.absent, now);
                } else if seen.leader {
                    self.absence.reset();
                    self.absence.observe(&seen.absent, now);
                } else {
                    self.absence.reset();
                }
                v.leader = seen.leader;
                v.leader_node = seen.leader_node;
                v.error = None;
                v.rounds += 1;
            }
            Err(e) => {
                // Leadership is unknown this round; what was observed of absences stands.
                v.leader = self.member.leads(Instant::now());
                if !v.leader {
                    self.absence.reset();
                }
                v.error = Some(Arc::new(e));
            }
        }
        v.lease = self.member.lease();
        v.fence = self.member.fence().filter(|_| v.leader);
        v.absent = self.absence.clone();
        drop(v);
        // Again: a new lease holds once the survey has written the member key with it.
        self.publish_hold(false, &Ok(()));
        lock(&self.view).error.is_none()
    }

    /// Publishes the member's bound, and counts a loss when it held (`had`) and no longer does.
    fn publish_hold(&self, had: bool, renewed: &Result<(), ControlError>) {
        let until = self.member.held_until();
        self.tenure.set(until);
        let mut v = lock(&self.view);
        let lost = had && until.is_none_or(|t| Instant::now() >= t);
        v.held_until = until;
        if lost {
            v.lease_losses += 1;
            let error =
                renewed.as_ref().err().map(ToString::to_string).or_else(|| v.error.as_ref().map(|e| e.to_string()));
            tracing::warn!(?error, ttl = ?self.ttl, "this node's membership may have ended: it stops acting as a member");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
