//! Moving a lost node's tasks to the others: the decision, and its one write.
//!
//! A node is lost when it has been without a member key longer than `restart.move_after`, as
//! the elected leader sees it ([`super::Absence`]). The decider writes the next placement version ([`super::PlacementBook`]), then fails
//! its stream, restarting at the epoch `version << 32`: the others hear of the later run,
//! restart, read the new version and restore the moved tasks from the checkpoint store.
//!
//! Invariants: the version is stored before any node runs it, and every node starts from the
//! newest version, so all members of one incarnation run one placement. A source of an ingest
//! log moves only to a node that keeps a copy of that log (`replicas = 2`) and, with in-sync
//! sets ([`super::ControlInSync`]), that the partition's set names in for that very primary
//! (the move's transaction compares the key as read); a lost node that keeps the only copy
//! known to hold every acknowledged row has nothing moved, and the stream waits for it.

use std::time::Duration;

use weir_wire::{NodeId, StreamId};

use super::{BookError, PlacementBook, Versioned};
use super::{ControlInSync, InSyncRecord, PlacementRecord};
use crate::control::Compare;
use crate::spec::{Placement, StreamSpec, Topology};

/// The placement a stream runs at, and how to move its lost nodes' tasks.
pub struct Mover {
    stream: StreamId,
    topology: Topology,
    placement: Placement,
    read: Versioned,
    replicas: u8,
    /// The sources read ingest logs (which live on the nodes that keep them), not a generator.
    ingest: bool,
    /// The last failure logged (each different one is logged once).
    warned: Option<String>,
    /// The partitions' in-sync sets (`None`: a copy always holds every acknowledged row).
    in_sync: Option<ControlInSync>,
}

/// A move that was stored: why, and the incarnation the stream restarts at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// One line: who was lost and where their tasks went.
    pub reason: String,
    /// The new version's first incarnation.
    pub incarnation: u64,
}

impl Mover {
    /// For `spec` running `placement`, read as `read`, keeping `replicas` copies of each ingest
    /// partition (with 2, a lost node's sources go where their copies are).
    pub fn new(spec: &StreamSpec, placement: &Placement, read: Versioned, replicas: u8) -> Self {
        let topology = spec.topology();
        let ingest = matches!(spec.source, crate::spec::SourceKind::IngestLog);
        Self {
            stream: spec.id,
            topology,
            placement: placement.clone(),
            read,
            replicas,
            ingest,
            warned: None,
            in_sync: None,
        }
    }

    /// Reads each partition's in-sync set before a source moves to its copy.
    pub fn with_in_sync(mut self, in_sync: ControlInSync) -> Self {
        self.in_sync = Some(in_sync);
        self
    }

    /// The partitions whose ingest log has no copy among `to` with every acknowledged row once
    /// the nodes of `lost` are gone, each with why: their sources cannot move (a source started
    /// on a log without its rows would skip them), so nothing moves and the stream waits for
    /// the node. Empty for a generator stream.
    pub fn stranded(&self, lost: &[(NodeId, Duration)], to: &[NodeId]) -> Vec<(u32, String)> {
        self.sources(lost, to).0
    }

    /// [`Self::stranded`], and what the move's transaction must compare: each in-sync key it
    /// read, at the revision it read.
    pub(super) fn sources(&self, lost: &[(NodeId, Duration)], to: &[NodeId]) -> (Vec<(u32, String)>, Vec<Compare>) {
        let mut read = Vec::new();
        if !self.ingest {
            return (Vec::new(), read);
        }
        let gone: Vec<NodeId> = lost.iter().map(|(n, _)| *n).collect();
        let to: Vec<NodeId> = to.iter().copied().filter(|n| !gone.contains(n)).collect();
        let stranded = self
            .topology
            .tasks
            .iter()
            .filter_map(|t| match t.kind {
                crate::spec::TaskKind::Source { partition } => Some((partition, self.placement.node_of(t.id))),
                _ => None,
            })
            .filter(|(_, n)| gone.contains(n))
            .filter_map(|(p, n)| {
                let copy = (self.replicas >= 2).then(|| self.placement.ingest_follower(&self.topology, p)).flatten();
                let Some(c) = copy.filter(|c| to.contains(c)) else {
                    return Some((p, format!("partition {p}'s ingest log is only on node {}", n.0)));
                };
                let set = self.in_sync.as_ref()?;
                match set.read(p) {
                    Ok((r, rev)) if InSyncRecord::holds_all(r.as_ref(), n, c) => {
                        read.push(Compare::ModRevision(set.key(p), rev));
                        None
                    }
                    Ok(_) => Some((
                        p,
                        format!(
                            "partition {p}'s copy on node {} is not known to hold every row node {} acknowledged (its in-sync set)",
                            c.0, n.0
                        ),
                    )),
                    Err(_) => Some((p, format!("partition {p}'s in-sync set cannot be read"))),
                }
            })
            .collect();
        (stranded, read)
    }

    /// The nodes the placement gives tasks.
    pub fn nodes(&self) -> std::collections::BTreeSet<NodeId> {
        self.placement.nodes(&self.topology)
    }

    /// The next version when the nodes of `lost` (with how long they have been away) are gone
    /// and their tasks go to `to`; `None` when no node of `lost` has tasks or `to` is empty.
    pub fn decide(&self, lost: &[(NodeId, Duration)], to: &[NodeId]) -> Option<PlacementRecord> {
        let nodes = self.nodes();
        let lost: Vec<&(NodeId, Duration)> = lost.iter().filter(|(n, _)| nodes.contains(n)).collect();
        let gone: Vec<NodeId> = lost.iter().map(|(n, _)| *n).collect();
        let to: Vec<NodeId> = to.iter().copied().filter(|n| !gone.contains(n)).collect();
        if gone.is_empty() || to.is_empty() {
            return None;
        }
        let moved = self.placement.moved_with_replicas(&self.topology, &gone, &to, self.replicas);
        let tasks: Vec<String> = self
            .placement
            .tasks_of(&self.topology)
            .into_iter()
            .filter(|(_, n)| gone.contains(n))
            .map(|(t, _)| format!("{} to node {}", t.0, moved.node_of(t).0))
            .collect();
        let who: Vec<String> = lost
            .iter()
            .map(|(n, d)| {
                let d = Duration::from_secs(d.as_secs());
                format!("node {} has been down for {}", n.0, humantime::format_duration(d))
            })
            .collect();
        let why = format!("{}: its tasks move to the other nodes (task {})", who.join(", "), tasks.join(", task "));
        Some(PlacementRecord::new(self.read.version() + 1, &self.topology, &moved, gone, &why))
    }

    /// Decides and stores the move of `lost`'s tasks to `to` in `book` (as the leader fenced by
    /// `fence`, on a control store). `None` when there is nothing to move, or the write failed
    /// (logged once; the caller tries again at its next check).
    pub fn check(
        &mut self,
        book: &dyn PlacementBook,
        lost: &[(NodeId, Duration)],
        to: &[NodeId],
        fence: Option<&Compare>,
    ) -> Option<Moved> {
        let record = self.decide(lost, to)?;
        let (stranded, read) = self.sources(lost, to);
        if !stranded.is_empty() {
            let parts: Vec<String> = stranded.into_iter().map(|(_, why)| why).collect();
            let text = format!("{}: nothing moves; the stream waits for the node", parts.join(", "));
            if self.warned.as_ref() != Some(&text) {
                tracing::warn!(reason = %text, "a lost node's partition has no other copy known to hold all its rows");
                self.warned = Some(text);
            }
            return None;
        }
        let version = record.version;
        let fence = fence?;
        let mut when = vec![fence.clone()];
        when.extend(read);
        match book.write(self.stream, &self.read, &record, &when) {
            // The stored record's reason: an earlier try of this move may have landed unanswered.
            Ok(stored) => {
                tracing::warn!(placement = version, reason = %stored.reason, "moving the tasks of a lost node");
                Some(Moved { reason: stored.reason, incarnation: u64::from(version) << 32 })
            }
            // Another leader moved on: the stream restarts at the version that stands.
            Err(BookError::Refused { stands: Some(v), .. }) if v > self.read.version() => {
                let reason = format!("placement version {v} stands (written by another leader)");
                tracing::warn!(placement = v, "a newer placement stands: restarting at it");
                Some(Moved { reason, incarnation: u64::from(v) << 32 })
            }
            Err(e) => {
                let text = e.to_string();
                if self.warned.as_ref() != Some(&text) {
                    tracing::warn!(placement = version, error = %text, "cannot store the placement that moves a lost node's tasks");
                    self.warned = Some(text);
                }
                None
            }
        }
    }
}
