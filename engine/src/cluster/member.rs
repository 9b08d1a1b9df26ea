//! A node's membership in the cluster: one lease in the control store, held by renewing it,
//! by which live both its member key (the others see it as a member while that key exists)
//! and, when it wins, the leader key of the election of the node that decides placement.
//!
//! Invariant: [`Member::holds`] is true only while the lease surely lives in the store (the
//! last successful renewal's send time plus the TTL, less the election's margin), so a node
//! that stops acting as soon as it turns false has stopped before the store ends its keys and
//! before any other node can be given its tasks.

use std::time::{Duration, Instant};

use weir_wire::NodeId;

use super::Keys;
use crate::control::{Compare, ControlError, ControlStore, Election, LeaseId, Op, Role};

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
}

impl Member {
    /// Node `node` of a cluster of `nodes`, with leases of `ttl` (whole seconds, at least 2).
    pub fn new(keys: Keys, node: NodeId, nodes: &[NodeId], ttl: Duration) -> Self {
        let election = Election::new(keys.leader(), node.0.to_string(), ttl);
        let others = nodes.iter().copied().filter(|n| *n != node).collect();
        Self { node, others, keys, election }
    }

    /// The node.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// One round at `now`: renews the lease (or takes a new one), stands in the election,
    /// keeps the member key and reads the others'. On an error nothing is known of this round;
    /// [`Self::holds`] still tells how long the lease surely lives.
    pub fn step(&mut self, store: &dyn ControlStore, now: Instant) -> Result<MemberView, ControlError> {
        let role = self.election.step(store, now)?;
        let lease = self.election.lease().expect("a step that succeeded holds a lease");
        let put = Op::Put {
            key: self.keys.member(self.node),
            value: self.node.0.to_string().into_bytes(),
            lease: Some(lease),
        };
        store.txn(&[], &[put])?;
        let mut absent = Vec::new();
        for n in &self.others {
            if store.get(&self.keys.member(*n))?.is_none() {
                absent.push(*n);
            }
        }
        let (leader, leader_node) = match role {
            Role::Leader { .. } => (true, Some(self.node)),
            Role::Follower { leader } => (false, leader.and_then(|l| l.parse().ok()).map(NodeId)),
        };
        Ok(MemberView { leader, leader_node, absent, lease })
    }

    /// Whether the node's lease surely lives at `now`: while it does not, the node must not
    /// run tasks or acknowledge appends.
    pub fn holds(&self, now: Instant) -> bool {
        self.election.holds(now)
    }

    /// Until when the node's lease surely lives (`None`: it holds none).
    pub fn held_until(&self) -> Option<Instant> {
        self.election.held_until()
    }

    /// Whether the node may act as the leader at `now`.
    pub fn leads(&self, now: Instant) -> bool {
        self.election.leads(now)
    }

    /// The condition the leader's writes carry (`None` unless it leads).
    pub fn fence(&self) -> Option<Compare> {
        self.election.fence()
    }

    /// Leaves the cluster now (a clean stop): the lease, the member key and, if this node led,
    /// the leadership go at once.
    pub fn leave(&mut self, store: &dyn ControlStore) -> Result<(), ControlError> {
        self.election.resign(store)
    }
}
