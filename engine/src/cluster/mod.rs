//! The cluster's control logic on the control store ([`crate::control`]): who is a member, who
//! decides, and where each task runs. Pure where it can be (the store behind its trait, time
//! passed in), so the same code runs on etcd in `weir node` and in process in tests; the
//! simulator does not drive it yet.
//!
//! - [`Member`]: a node's membership (a key living by its lease) and its candidacy in the
//!   election of the node that decides placement; it says when the node's own lease may have
//!   ended, so that the node stops acting before another can take its place.
//! - [`Absence`]: how long each node has been without a member key, as the leader saw it.
//! - [`PlacementBook`]: where the placement's versions ([`PlacementRecord`]) are kept: guarded
//!   writes to one key of the control store ([`ControlBook`], fenced by the leader's lease).
//!   A cluster of several nodes has a control store; one node alone has nothing to move.
//! - [`Agent`]: the thread that steps a node's [`Member`] and publishes what it saw, and the
//!   [`Tenure`] of each lease, which the engine reads before it acknowledges an append.
//! - [`Mover`]: which lost node's tasks move where (never a source away from its log's only
//!   copy), and the one write that moves them.
//! - [`ControlCommits`]: a stream's checkpoint ids and commit point in one key, written in
//!   transactions fenced by the coordinator's lease and the placement its run began under.
//! - [`ControlInSync`]: each ingest partition's in-sync set (whether the follower's copy holds
//!   every acknowledged row), written by the partition's primary under the same fence.
//! - [`reach`]: whether a node that reaches the control store is cut off from most of the other
//!   members (it then gives up its membership, [`Agent::withhold`], so that its tasks move).
//! - [`Supervisor`]: what a node does between runs of its stream (restart after the strategy's
//!   delay, wait for a lease, stop, give up) and its incarnations.
//!
//! Invariants: a node acts as a member (runs tasks, acknowledges appends) only while
//! [`Member::holds`]; only the elected leader writes placement, and the store refuses its write
//! once it is deposed, the placement changed since it read it, or a node it moves is a member
//! again.

mod absence;
mod agent;
mod book;
pub mod catalog;
mod commits;
mod in_sync;
mod in_sync_view;
mod member;
mod mover;
pub mod reach;
pub mod record;
pub mod supervisor;
mod tenure;

#[cfg(test)]
mod agent_tests;
#[cfg(test)]
mod commit_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use absence::Absence;
pub use agent::{Agent, AgentView};
pub use book::{BookError, ControlBook, PlacementBook, Versioned};
pub use commits::{ControlCommits, Fence, HISTORY};
pub use in_sync::{ControlInSync, InSyncRecord};
pub use in_sync_view::InSyncView;
pub use member::{Member, MemberView};
pub use mover::{Moved, Mover};
pub use record::PlacementRecord;
pub use supervisor::{RestartPolicy, RunEnd, Supervisor};
pub use tenure::Tenure;

use weir_wire::{NodeId, StreamId};

/// What a node tells of its membership in status answers (engine or not).
pub trait MemberStatus: Send + Sync + std::fmt::Debug {
    /// The node's membership now.
    fn member_info(&self) -> weir_wire::msg::MemberInfo;
}

/// The cluster's keys in the control store, all under `/weir/<cluster>/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys of cluster `cluster` (its name in the config file).
    pub fn new(cluster: &str) -> Self {
        Self { prefix: format!("/weir/{cluster}/") }
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        self.prefix.trim_start_matches("/weir/").trim_end_matches('/')
    }

    /// The election of the node that decides placement; its value names the leader.
    pub fn leader(&self) -> String {
        format!("{}leader", self.prefix)
    }

    /// The stream catalog (`catalog.rs`): one key, the whole catalog.
    pub fn catalog(&self) -> String {
        format!("{}catalog", self.prefix)
    }

    /// Where the member keys are.
    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }

    /// Node `node`'s membership: it exists while the node's lease lives.
    pub fn member(&self, node: NodeId) -> String {
        format!("{}{}", self.members(), node.0)
    }

    /// The prefix of every key of stream `stream` (placement, in-sync sets, checkpoint ids).
    pub fn stream_prefix(&self, stream: StreamId) -> String {
        format!("{}streams/{}/", self.prefix, stream.0)
    }

    /// Stream `stream`'s placement: the newest version's record.
    pub fn placement(&self, stream: StreamId) -> String {
        format!("{}streams/{}/placement", self.prefix, stream.0)
    }

    /// Stream `stream`'s partition `partition`'s in-sync set ([`ControlInSync`]).
    pub fn in_sync(&self, stream: StreamId, partition: u32) -> String {
        format!("{}{partition}", self.in_sync_prefix(stream))
    }

    /// The prefix of stream `stream`'s in-sync keys ([`Self::in_sync`]).
    pub fn in_sync_prefix(&self, stream: StreamId) -> String {
        format!("{}streams/{}/in-sync/", self.prefix, stream.0)
    }

    /// Stream `stream`'s checkpoint ids reserved and last commit ([`ControlCommits`]).
    pub fn checkpoints(&self, stream: StreamId) -> String {
        format!("{}streams/{}/checkpoints", self.prefix, stream.0)
    }
}
