//! The thread that keeps a node a member: it runs a round of the node's [`Member`] every third
//! of the lease's TTL (counted from the round's start; sooner after an error), and publishes
//! what it saw for the node's supervisor, which reads it without waiting on the control store,
//! and into the node's [`Tenure`], which the engine's acknowledgements read.
//!
//! Invariants:
//! - The published `held_until` (and the tenure) only ever come from the member's own bound,
//!   published as soon as the renewal is known, so a supervisor that stops the node's tasks
//!   once it has passed has stopped them before the store can end the node's lease. Each lease
//!   has its own [`Tenure`]: one that ended never holds again, whatever lease comes next.
//! - Absences count only while this node leads under one lease; a failed round neither adds
//!   to them nor clears them while the node still holds that lease.

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
    /// The other nodes that were members at the last round that saw them.
    pub present: Vec<NodeId>,
    /// The node gave up its membership ([`Agent::withhold`]) and takes none until told.
    pub withheld: bool,
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
            withheld: false,
            unreachable: Vec::new(),
            in_sync: Vec::new(),
            in_sync_age_ms: 0,
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
    withheld: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    tenure: Arc<Current>,
}

fn lock(v: &Mutex<AgentView>) -> std::sync::MutexGuard<'_, AgentView> {
    v.lock().unwrap_or_else(|p| p.into_inner())
}

impl Agent {
    /// Starts the rounds of `member` on `store` with leases of `ttl`.
    pub fn start(store: Arc<dyn ControlStore>, member: Member, ttl: Duration) -> std::io::Result<Agent> {
        let stop = Arc::new(AtomicBool::new(false));
        let name = format!("member-{}", member.node().0);
        let mut run = Rounds::new(store, member, ttl, Arc::new(Instant::now));
        let (view, tenure) = (run.view.clone(), run.tenure.clone());
        let s = stop.clone();
        let withheld = Arc::new(AtomicBool::new(false));
        let w = withheld.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let withheld = w.load(Ordering::Acquire);
                let ok = if withheld { run.stand_aside() } else { run.round(started) };
                let wait =
                    if ok { ttl / 3 } else { (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500)) };
                let until = started + wait;
                // A change of `withhold` takes effect at once: a node cut off gives its
                // membership up now, not up to a third of the lease later.
                while !s.load(Ordering::Relaxed) && Instant::now() < until && w.load(Ordering::Acquire) == withheld {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            run.tenure.lock().unwrap_or_else(|p| p.into_inner()).1.set(None);
            let _ = run.member.leave(run.store.as_ref());
        })?;
        Ok(Agent { view, stop, withheld, thread: Some(thread), tenure })
    }

    /// Gives up the node's membership at the next round and takes none while `on` (a node cut
    /// off from the others, `super::reach`); `false` takes one again.
    pub fn withhold(&self, on: bool) {
        if self.withheld.swap(on, Ordering::AcqRel) != on {
            lock(&self.view).withheld = on;
        }
    }

    /// Whether the node withholds its membership.
    pub fn withholding(&self) -> bool {
        self.withheld.load(Ordering::Acquire)
    }

    /// What the agent saw last.
    pub fn view(&self) -> AgentView {
        let mut v = lock(&self.view).clone();
        v.dead = self.dead();
        if v.dead {
            v.held_until = None;
        }
        v
    }

    /// The lease the node holds its membership by at `now`, if it does: what the view says,
    /// without copying it (a node's supervisor asks many times a second).
    pub fn holding(&self, now: Instant) -> Option<LeaseId> {
        let v = lock(&self.view);
        if self.dead() || !v.holds(now) { None } else { v.lease }
    }

    /// The thread ended without being asked to.
    fn dead(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished) && !self.stop.load(Ordering::Relaxed)
    }

    /// The tenure of lease `lease`, for an engine run under it (`None`: the node holds
    /// another lease now, or none).
    pub fn tenure_for(&self, lease: LeaseId) -> Option<Arc<Tenure>> {
        let current = self.tenure.lock().unwrap_or_else(|p| p.into_inner());
        (current.0 == Some(lease)).then(|| current.1.clone())
    }
}

/// The tenure of the node's current lease: a new lease gets a new one, and the old one never
/// holds again (a run started under it stops acknowledging for good).
type Current = Mutex<(Option<LeaseId>, Arc<Tenure>)>;

/// Where an agent's rounds read the time (the agent's thread: the machine's clock; the
/// simulator: a node's own, running at its rate).
pub(crate) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The agent thread's state and its rounds, which the simulator steps itself.
pub(crate) struct Rounds {
    clock: Clock,
    member: Member,
    store: Arc<dyn ControlStore>,
    ttl: Duration,
    view: Arc<Mutex<AgentView>>,
    tenure: Arc<Current>,
    absence: Absence,
    /// The last publication said the node held its membership.
    held: bool,
    /// The node led at its last round that said (a failed round says nothing of it).
    was_leader: bool,
}

impl Rounds {
    pub(crate) fn new(store: Arc<dyn ControlStore>, member: Member, ttl: Duration, clock: Clock) -> Self {
        Rounds {
            clock,
            member,
            store,
            ttl,
            view: Arc::new(Mutex::new(AgentView::default())),
            tenure: Arc::new(Mutex::new((None, Arc::new(Tenure::default())))),
            absence: Absence::default(),
            held: false,
            was_leader: false,
        }
    }

    /// What the rounds saw last ([`Agent::view`]).
    #[cfg(test)]
    pub(crate) fn view(&self) -> AgentView {
        lock(&self.view).clone()
    }

    /// The tenure of the lease the node holds now ([`Agent::tenure_for`]).
    #[cfg(test)]
    pub(crate) fn tenure(&self) -> Arc<Tenure> {
        self.tenure.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// One round at `now`; whether it succeeded.
    pub(crate) fn round(&mut self, now: Instant) -> bool {
        // A bound that ran out during the sleep counts as a loss now.
        self.publish_hold(None);
        let lease_before = self.member.lease();
        let renewed = self.member.renew(self.store.as_ref(), now);
        // The renewal's bound, at once: the survey may take a while.
        self.publish_hold(renewed.as_ref().err());
        let surveyed = renewed.and_then(|()| self.member.survey(self.store.as_ref()));
        if self.member.lease() != lease_before {
            // Absences seen under another lease (and leadership) are not this one's.
            self.absence.reset();
            self.was_leader = false;
        }
        let ok = surveyed.is_ok();
        let mut v = lock(&self.view);
        v.stepped = Some(now);
        match surveyed {
            Ok(seen) => {
                if seen.leader && !self.was_leader {
                    v.elections += 1;
                }
                self.was_leader = seen.leader;
                if seen.leader {
                    self.absence.observe(&seen.absent, now);
                } else {
                    self.absence.reset();
                }
                v.leader = seen.leader;
                v.leader_node = seen.leader_node;
                v.present = seen.present;
                v.error = None;
                v.rounds += 1;
            }
            Err(e) => {
                // What was observed of absences stands while the node holds its lease; it does
                // not act as the leader until a round says it leads.
                if !self.member.holds((self.clock)()) {
                    self.absence.reset();
                    self.was_leader = false;
                }
                v.leader = false;
                v.error = Some(Arc::new(e));
            }
        }
        v.lease = self.member.lease();
        v.fence = self.member.fence().filter(|_| v.leader);
        v.absent = self.absence.clone();
        drop(v);
        // Again: a new lease holds once the survey has written the member key with it.
        self.publish_hold(None);
        ok
    }

    /// A round while the node withholds its membership: it ends its lease (its keys go, and
    /// with them any leadership) and publishes that it holds nothing.
    pub(crate) fn stand_aside(&mut self) -> bool {
        if self.member.lease().is_some() {
            tracing::warn!("this node gives up its membership: it reaches too few of the other members");
            // It stops acting first (the tenure ends now), then the store ends its lease.
            self.member.drop_hold();
            self.publish_hold(None);
            if let Err(e) = self.member.leave(self.store.as_ref()) {
                // The lease ends by itself then; the node holds nothing from now on either way.
                tracing::warn!(error = %e, "cannot end this node's lease now");
            }
            self.absence.reset();
            self.was_leader = false;
        }
        self.publish_hold(None);
        let present = self.member.others_present(self.store.as_ref());
        let mut v = lock(&self.view);
        (v.leader, v.fence, v.lease) = (false, None, None);
        v.absent = Absence::default();
        match present {
            Ok(p) => {
                v.present = p;
                v.error = None;
                true
            }
            Err(e) => {
                v.error = Some(Arc::new(e));
                false
            }
        }
    }

    /// Publishes the member's bound (into the view and the current lease's tenure), and counts
    /// a loss when the node held at the last publication and no longer does.
    fn publish_hold(&mut self, failed: Option<&ControlError>) {
        let until = self.member.held_until();
        let holds = until.is_some_and(|t| (self.clock)() < t);
        {
            let mut current = self.tenure.lock().unwrap_or_else(|p| p.into_inner());
            if current.0 != self.member.lease() {
                current.1.set(None);
                *current = (self.member.lease(), Arc::new(Tenure::default()));
            }
            current.1.set(until);
        }
        let mut v = lock(&self.view);
        v.held_until = until;
        if self.held && !holds {
            v.lease_losses += 1;
            let error = failed.map(ToString::to_string).or_else(|| v.error.as_ref().map(|e| e.to_string()));
            tracing::warn!(?error, ttl = ?self.ttl, "this node's membership may have ended: it stops acting as a member");
        }
        self.held = holds;
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
