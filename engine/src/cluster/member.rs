//! A node's membership in the cluster: one lease in the control store, held by renewing it,
//! by which live both its member key (the others see it as a member while that key exists)
//! and, when it wins, the leader key of the election of the node that decides placement.
//!
//! Invariant: [`Member::holds`] is true only while the lease surely lives in the store (the
//! last successful renewal's send time plus the TTL, less the election's margin) and the
//! member key was written with that very lease, so a node that stops acting as soon as it
//! turns false has stopped before the store ends its keys, and never acts while the others
//! cannot see it as a member.

use std::time::{Duration, Instant};

use weir_wire::NodeId;

use super::Keys;
use crate::control::{Compare, ControlError, ControlStore, Election, LeaseId, Op, Role};

/// Member keys one survey reads at most (a bound on what the store's answer may allocate).
const MAX_MEMBERS: usize = 4096;

/// What one [`Member::step`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// This node leads: it decides placement until its next step (or [`Member::leads`]).
    pub leader: bool,
    /// The leading node, when one leads.
    pub leader_node: Option<NodeId>,
    /// The cluster's other nodes without a member key: their lease ended, or they never
    /// started.
    pub absent: Vec<NodeId>,
    /// The cluster's other nodes with a member key (the live others).
    pub present: Vec<NodeId>,
    /// This node's lease.
    pub lease: LeaseId,
}

/// One node of the cluster as a member.
#[derive(Debug)]
pub struct Member {
    node: NodeId,
    others: Vec<NodeId>,
    keys: Keys,
    election: Election,
    /// The lease the member key was last seen or written with.
    keyed: Option<LeaseId>,
    role: Option<Role>,
}

impl Member {
    /// Node `node` of a cluster of `nodes`, with leases of `ttl` (whole seconds, at least 2).
    pub fn new(keys: Keys, node: NodeId, nodes: &[NodeId], ttl: Duration) -> Self {
        let election = Election::new(keys.leader(), node.0.to_string(), ttl);
        let others = nodes.iter().copied().filter(|n| *n != node).collect();
        Self { node, others, keys, election, keyed: None, role: None }
    }

    /// The node.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// First half of a round at `now`: renews the lease (or takes a new one) and stands in the
    /// election. On an error nothing is known of this round; [`Self::holds`] still tells how
    /// long the lease surely lives.
    pub fn renew(&mut self, store: &dyn ControlStore, now: Instant) -> Result<(), ControlError> {
        self.role = None;
        self.role = Some(self.election.step(store, now)?);
        Ok(())
    }

    /// Second half: keeps the member key under the current lease and reads the others'.
    pub fn survey(&mut self, store: &dyn ControlStore) -> Result<MemberView, ControlError> {
        let (Some(role), Some(lease)) = (self.role.clone(), self.election.lease()) else {
            return Err(ControlError::Refused {
                endpoint: String::new(),
                op: "survey",
                reason: "no renewal succeeded this round".into(),
            });
        };
        let prefix = self.keys.members();
        let listed = store.list(&prefix, MAX_MEMBERS)?;
        if listed.len() >= MAX_MEMBERS {
            // Members past the limit would read as absent.
            return Err(ControlError::Refused {
                endpoint: String::new(),
                op: "survey",
                reason: format!("more than {MAX_MEMBERS} keys under {prefix}"),
            });
        }
        // A key names a node exactly as written (not "01" or "+1" for node 1).
        let node_of = |k: &str| -> Option<NodeId> {
            let rest = k.strip_prefix(&prefix)?;
            rest.parse::<u32>().ok().filter(|n| n.to_string() == rest).map(NodeId)
        };
        let present: Vec<(NodeId, Option<LeaseId>)> =
            listed.iter().filter_map(|(k, e)| node_of(k).map(|n| (n, e.lease))).collect();
        if !present.contains(&(self.node, Some(lease))) {
            // Gone (or under another lease): the node does not hold until it is written again.
            self.keyed = None;
            let key = self.keys.member(self.node);
            store.txn(&[], &[Op::Put { key, value: self.node.0.to_string().into_bytes(), lease: Some(lease) }])?;
        }
        self.keyed = Some(lease);
        let (live, absent): (Vec<NodeId>, Vec<NodeId>) =
            self.others.iter().copied().partition(|n| present.iter().any(|(p, _)| p == n));
        let (leader, leader_node) = match role {
            Role::Leader { .. } => (true, Some(self.node)),
            Role::Follower { leader } => (false, leader.and_then(|l| l.parse().ok()).map(NodeId)),
        };
        Ok(MemberView { leader, leader_node, absent, present: live, lease })
    }

    /// Stops holding at once, before the lease ends in the store ([`Self::leave`] ends it).
    pub fn drop_hold(&mut self) {
        self.keyed = None;
    }

    /// The other nodes with a member key now: a read, holding nothing (a node that gave up its
    /// membership still sees whether the others live).
    pub fn others_present(&self, store: &dyn ControlStore) -> Result<Vec<NodeId>, ControlError> {
        let prefix = self.keys.members();
        let listed = store.list(&prefix, MAX_MEMBERS)?;
        let named =
            |k: &str| k.strip_prefix(&prefix).and_then(|r| r.parse::<u32>().ok().filter(|n| n.to_string() == r));
        Ok(self.others.iter().copied().filter(|n| listed.iter().any(|(k, _)| named(k) == Some(n.0))).collect())
    }

    /// A whole round: [`Self::renew`], then [`Self::survey`].
    pub fn step(&mut self, store: &dyn ControlStore, now: Instant) -> Result<MemberView, ControlError> {
        self.renew(store, now)?;
        self.survey(store)
    }

    /// Until when the node surely holds its membership (`None`: it does not): its lease lives
    /// and its member key was written with it.
    pub fn held_until(&self) -> Option<Instant> {
        let lease = self.election.lease()?;
        (self.keyed == Some(lease)).then(|| self.election.held_until()).flatten()
    }

    /// Whether the node holds its membership at `now`: while it does not, it must not run
    /// tasks or acknowledge appends.
    pub fn holds(&self, now: Instant) -> bool {
        self.held_until().is_some_and(|t| now < t)
    }

    /// The lease, once granted.
    pub fn lease(&self) -> Option<LeaseId> {
        self.election.lease()
    }

    /// Whether the node may act as the leader at `now`.
    pub fn leads(&self, now: Instant) -> bool {
        self.election.leads(now) && self.holds(now)
    }

    /// The condition the leader's writes carry (`None` unless it leads).
    pub fn fence(&self) -> Option<Compare> {
        self.election.fence()
    }

    /// Leaves the cluster now (a clean stop): the lease, the member key and, if this node led,
    /// the leadership go at once.
    pub fn leave(&mut self, store: &dyn ControlStore) -> Result<(), ControlError> {
        self.keyed = None;
        self.election.resign(store)
    }
}
