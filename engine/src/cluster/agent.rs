//! The thread that keeps a node a member: it steps the node's [`Member`] every third of the
//! lease's TTL (sooner after an error) and publishes what it saw for the node's supervisor,
//! which reads it without waiting on the control store.
//!
//! Invariant: the published `held_until` only ever comes from the member's own bound (the last
//! successful renewal), so a supervisor that stops the node's tasks once it has passed has
//! stopped them before the store can end the node's lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_wire::NodeId;

use super::{Absence, Member};
use crate::control::{Compare, ControlStore, LeaseId};

/// What the node knows of its membership, as of the agent's last step.
#[derive(Clone, Debug, Default)]
pub struct AgentView {
    /// The node's lease surely lives until then (`None`: it holds none).
    pub held_until: Option<Instant>,
    /// The node's lease.
    pub lease: Option<LeaseId>,
    /// This node leads; its writes carry `fence`.
    pub leader: bool,
    /// The condition the leader's writes carry.
    pub fence: Option<Compare>,
    /// The leading node, as last seen.
    pub leader_node: Option<NodeId>,
    /// While this node leads: the absent nodes and how long they have been absent, as of the
    /// last step.
    pub absent: Absence,
    /// When the last step ran (`None`: none yet).
    pub stepped: Option<Instant>,
    /// Why the last step failed, if it did.
    pub error: Option<String>,
    /// Times this node became the leader.
    pub elections: u64,
    /// Times the node lost its lease (a renewal came too late, or the store ended it).
    pub lease_losses: u64,
}

impl AgentView {
    /// Whether the node's lease surely lives at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t)
    }

    /// Whether this node may act as the leader at `now` (it led at its last step, and its
    /// lease surely lives).
    pub fn leads(&self, now: Instant) -> bool {
        self.leader && self.holds(now)
    }
}

/// A running agent; dropping it leaves the cluster (revokes the lease) and joins the thread.
pub struct Agent {
    view: Arc<Mutex<AgentView>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    store: Arc<dyn ControlStore>,
}

impl Agent {
    /// Starts stepping `member` on `store` with leases of `ttl`.
    pub fn start(store: Arc<dyn ControlStore>, mut member: Member, ttl: Duration) -> std::io::Result<Agent> {
        let view = Arc::new(Mutex::new(AgentView::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, s, st) = (view.clone(), stop.clone(), store.clone());
        let thread = std::thread::Builder::new().name(format!("member-{}", member.node().0)).spawn(move || {
            let mut absence = Absence::default();
            while !s.load(Ordering::Relaxed) {
                let now = Instant::now();
                let stepped = member.step(st.as_ref(), now);
                let mut view = v.lock().unwrap_or_else(|p| p.into_inner());
                let had = view.held_until.is_some_and(|t| Instant::now() < t);
                view.stepped = Some(now);
                let wait = match stepped {
                    Ok(seen) => {
                        if seen.leader && !view.leader {
                            view.elections += 1;
                        }
                        if seen.leader {
                            absence.observe(&seen.absent, now);
                        } else {
                            absence.reset();
                        }
                        view.leader = seen.leader;
                        view.leader_node = seen.leader_node;
                        view.lease = Some(seen.lease);
                        view.error = None;
                        ttl / 3
                    }
                    Err(e) => {
                        view.leader = false;
                        absence.reset();
                        view.error = Some(e.to_string());
                        (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
                    }
                };
                view.fence = member.fence();
                view.absent = absence.clone();
                let lost = had && !member.holds(Instant::now());
                view.held_until = member.held_until();
                if lost {
                    view.lease_losses += 1;
                    tracing::warn!(error = ?view.error, "this node's control-store lease may have ended: it stops acting as a member");
                }
                drop(view);
                let until = Instant::now() + wait;
                while !s.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10).min(wait));
                }
            }
            let _ = member.leave(st.as_ref());
        })?;
        Ok(Agent { view, stop, thread: Some(thread), store })
    }

    /// What the agent saw last.
    pub fn view(&self) -> AgentView {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The control store the agent steps on.
    pub fn store(&self) -> &Arc<dyn ControlStore> {
        &self.store
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
