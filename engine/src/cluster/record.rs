//! A stream's placement record: where a cluster runs its tasks once it has moved the tasks of a
//! lost node to the others. Version 0 is the config file's placement and has no record; each
//! move writes the next version into the control store's one placement key
//! ([`super::ControlBook`]), sealed text with its own checksum, like the commit records.
//!
//! Invariant: a record names a node for every task of the stream, exactly:
//! [`PlacementRecord::placement`] refuses one whose tasks do not match the topology's.

use std::collections::BTreeMap;

use weir_wire::{NodeId, TaskId};

use crate::backup::{StoreError, seal, unseal};
use crate::spec::{Placement, Topology};

/// One version of a stream's placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRecord {
    /// Version (1 and up; 0 is the config file's placement).
    pub version: u32,
    /// The node of every task.
    pub tasks: BTreeMap<TaskId, NodeId>,
    /// The nodes whose tasks this version moved away.
    pub moved: Vec<NodeId>,
    /// Why (one line).
    pub reason: String,
    /// When it was written (ms since the epoch).
    pub ts: u64,
}

/// A placement record written for another topology than the stream's. Fatal: the record or
/// the configuration is another stream's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("placement version {version} names {named} tasks, the stream has {tasks}: it was written for another topology")]
pub struct PlacementMismatch {
    /// The record's version.
    pub version: u32,
    /// Tasks it names.
    pub named: usize,
    /// Tasks the stream has.
    pub tasks: usize,
}

impl PlacementRecord {
    /// The record of `placement` as version `version`.
    pub fn new(version: u32, topology: &Topology, placement: &Placement, moved: Vec<NodeId>, reason: &str) -> Self {
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let tasks = placement.tasks_of(topology).into_iter().collect();
        Self { version, tasks, moved, reason: reason.replace('\n', " "), ts }
    }

    /// The placement it records, checked against `topology`: every task of it, and no other,
    /// has a node.
    pub fn placement(&self, topology: &Topology) -> Result<Placement, PlacementMismatch> {
        let want: Vec<TaskId> = topology.tasks.iter().map(|t| t.id).collect();
        let have: Vec<TaskId> = self.tasks.keys().copied().collect();
        if want != have {
            return Err(PlacementMismatch { version: self.version, named: have.len(), tasks: want.len() });
        }
        let first = self.tasks.values().min().copied().unwrap_or(NodeId(0));
        let mut p = Placement::single(first);
        for (t, n) in &self.tasks {
            p.assign(*t, *n);
        }
        Ok(p)
    }
}

/// Encodes a record (text, with a CRC line).
pub fn encode_placement(r: &PlacementRecord) -> String {
    let mut s = format!("weir-placement 1\nversion {}\nts {}\n", r.version, r.ts);
    for n in &r.moved {
        s.push_str(&format!("moved {}\n", n.0));
    }
    for (t, n) in &r.tasks {
        s.push_str(&format!("task {} {}\n", t.0, n.0));
    }
    s.push_str(&format!("reason {}\n", r.reason.replace('\n', " ")));
    seal(s)
}

/// Decodes and checks a record read from `key` (named in errors).
pub fn decode_placement(key: &str, bytes: &[u8]) -> Result<PlacementRecord, StoreError> {
    let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
    let body = unseal(key, bytes)?;
    let mut lines = body.lines();
    match lines.next() {
        Some("weir-placement 1") => {}
        Some(l) if l.starts_with("weir-placement ") => {
            return Err(bad(&format!("written by a newer Weir ({l}; this one reads weir-placement 1)")));
        }
        _ => return Err(bad("not a placement record")),
    }
    let mut r = PlacementRecord { version: 0, tasks: BTreeMap::new(), moved: Vec::new(), reason: String::new(), ts: 0 };
    let (mut version, mut ts) = (None, None);
    for l in lines {
        let (word, rest) = l.split_once(' ').unwrap_or((l, ""));
        let nums: Vec<Option<u64>> = rest.split(' ').map(|v| v.parse().ok()).collect();
        let n = |i: usize| nums.get(i).copied().flatten().ok_or_else(|| bad("bad number"));
        match word {
            "version" => version = Some(u32::try_from(n(0)?).map_err(|_| bad("bad version"))?),
            "ts" => ts = Some(n(0)?),
            "moved" => r.moved.push(NodeId(n(0)? as u32)),
            "task" => {
                if r.tasks.insert(TaskId(n(0)? as u32), NodeId(n(1)? as u32)).is_some() {
                    return Err(bad("a task named twice"));
                }
            }
            "reason" => r.reason = rest.to_string(),
            _ => return Err(bad("unknown line")),
        }
    }
    match (version, ts) {
        (Some(v), Some(ts)) => Ok(PlacementRecord { version: v, ts, ..r }),
        _ => Err(bad("version or ts missing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::StreamSpec;
    use weir_wire::StreamId;

    fn three_node() -> (Topology, Placement) {
        let t = StreamSpec::generator(StreamId(1), 3, 3, 3).topology();
        let p = Placement::spread(&t, &[NodeId(1), NodeId(2), NodeId(3)]);
        (t.clone(), p.moved(&t, &[NodeId(3)], &[NodeId(1), NodeId(2)]))
    }

    #[test]
    fn a_placement_record_roundtrips_and_gives_back_its_placement() {
        let (t, p) = three_node();
        let r = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "node 3 has been down for 30s\nreally");
        let back = decode_placement("k", encode_placement(&r).as_bytes()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.reason, "node 3 has been down for 30s really");
        assert_eq!(back.placement(&t).unwrap().tasks_of(&t), p.tasks_of(&t));
    }

    #[test]
    fn a_damaged_or_foreign_placement_record_is_refused() {
        let (t, p) = three_node();
        let r = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "why");
        let text = encode_placement(&r).replace("task 0 1\n", "task 0 2\n");
        assert!(matches!(decode_placement("k", text.as_bytes()), Err(StoreError::Corrupt { .. })));
        // For another topology.
        let bigger = StreamSpec::generator(StreamId(1), 4, 3, 3).topology();
        let e = r.placement(&bigger).unwrap_err().to_string();
        assert!(e.contains("names 9 tasks, the stream has 10"), "{e}");
        // From a newer Weir.
        let newer = seal("weir-placement 2\nversion 1\nts 0\n".into());
        let e = decode_placement("k", newer.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("newer Weir"), "{e}");
    }
}
