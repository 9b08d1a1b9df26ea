//! Placement records in the store (`<stream>/placement/<version:020>`): where a cluster runs a
//! stream's tasks once it has moved the tasks of a lost node to the survivors. Version 0 is the
//! config file's placement and has no record; each move writes the next version, sealed text
//! with its own checksum, like the commit records beside it.
//!
//! Invariants:
//! - A record is never replaced: [`write_placement`] refuses a version that is stored with
//!   other contents. Only the coordinator's node writes records, one version at a time.
//! - [`latest_placement`] never skips a damaged record (unlike a damaged commit record, whose
//!   predecessor is still a valid restore point): nodes that read different versions would run
//!   different placements, so a damaged latest record is an error naming its key.
//! - A record names a node for every task of the stream, exactly: [`PlacementRecord::placement`]
//!   refuses one whose tasks do not match the topology's.

use std::collections::BTreeMap;

use weir_wire::{NodeId, StreamId, TaskId};

use super::{Store, StoreError, seal, unseal};
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

/// Key of placement version `version`.
pub fn placement_key(stream: StreamId, version: u32) -> String {
    format!("{}/placement/{version:020}", stream.0)
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

/// Decodes and checks a record stored under `key` (whose version it must be).
pub fn decode_placement(key: &str, bytes: &[u8]) -> Result<PlacementRecord, StoreError> {
    let r = decode_placement_text(key, bytes)?;
    if key.ends_with(&format!("{:020}", r.version)) {
        Ok(r)
    } else {
        Err(StoreError::Corrupt { key: key.into(), reason: "its version is not the one of its key".into() })
    }
}

/// Decodes and checks a record kept where its version is not part of the name (`key`: where it
/// was read, for errors): the control store's one placement key.
pub fn decode_placement_text(key: &str, bytes: &[u8]) -> Result<PlacementRecord, StoreError> {
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

/// The newest placement record of `stream`, if any.
pub fn latest_placement(store: &dyn Store, stream: StreamId) -> Result<Option<PlacementRecord>, StoreError> {
    let keys = store.list(&format!("{}/placement/", stream.0))?;
    match keys.last() {
        Some(key) => Ok(Some(decode_placement(key, &store.get_at_most(key, super::MAX_RECORD)?)?)),
        None => Ok(None),
    }
}

/// Stores `record` as its version and returns the record that stands for it: `record`, or the
/// same decision (the same node for every task, the same nodes moved) stored by an earlier try,
/// whose reason and time stay. That try may have landed and answered an error (a store that
/// applied the write and lost the reply): its retry, decided again a moment later with another
/// reason's text and time, must find it rather than be refused for ever. A version stored with
/// another decision is refused, never replaced.
pub fn write_placement(
    store: &dyn Store,
    stream: StreamId,
    record: &PlacementRecord,
) -> Result<PlacementRecord, StoreError> {
    let key = placement_key(stream, record.version);
    let text = encode_placement(record);
    match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(old) if old == text.as_bytes() => return Ok(record.clone()),
        Ok(old) => {
            let stored = decode_placement(&key, &old)?;
            if stored.tasks == record.tasks && stored.moved == record.moved {
                return Ok(stored);
            }
            return Err(StoreError::Corrupt {
                key,
                reason: "another placement of this version is stored already; records are never replaced".into(),
            });
        }
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    store.put(&key, text.as_bytes())?;
    Ok(record.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::LocalDirStore;
    use crate::spec::StreamSpec;

    fn three_node() -> (Topology, Placement) {
        let t = StreamSpec::generator(StreamId(1), 3, 3, 3).topology();
        let p = Placement::spread(&t, &[NodeId(1), NodeId(2), NodeId(3)]);
        (t.clone(), p.moved(&t, &[NodeId(3)], &[NodeId(1), NodeId(2)]))
    }

    #[test]
    fn a_placement_record_roundtrips_and_gives_back_its_placement() {
        let (t, p) = three_node();
        let r = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "node 3 has been down for 30s\nreally");
        let key = placement_key(StreamId(1), 1);
        let back = decode_placement(&key, encode_placement(&r).as_bytes()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.reason, "node 3 has been down for 30s really");
        assert_eq!(back.placement(&t).unwrap().tasks_of(&t), p.tasks_of(&t));
    }

    #[test]
    fn a_damaged_or_foreign_placement_record_is_refused() {
        let (t, p) = three_node();
        let r = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "why");
        let key = placement_key(StreamId(1), 1);
        let text = encode_placement(&r).replace("task 0 1\n", "task 0 2\n");
        assert!(matches!(decode_placement(&key, text.as_bytes()), Err(StoreError::Corrupt { .. })));
        // Under another version's key.
        let other = placement_key(StreamId(1), 2);
        let e = decode_placement(&other, encode_placement(&r).as_bytes()).unwrap_err().to_string();
        assert!(e.contains("not the one of its key"), "{e}");
        // For another topology.
        let bigger = StreamSpec::generator(StreamId(1), 4, 3, 3).topology();
        let e = r.placement(&bigger).unwrap_err().to_string();
        assert!(e.contains("names 9 tasks, the stream has 10"), "{e}");
        // From a newer Weir.
        let newer = seal("weir-placement 2\nversion 1\nts 0\n".into());
        let e = decode_placement(&key, newer.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("newer Weir"), "{e}");
    }

    #[test]
    fn the_latest_placement_is_the_highest_version_and_records_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        assert_eq!(latest_placement(&store, StreamId(1)).unwrap(), None);
        let (t, p) = three_node();
        let one = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "first");
        write_placement(&store, StreamId(1), &one).unwrap();
        write_placement(&store, StreamId(1), &one).unwrap(); // a retry
        let mut two = PlacementRecord::new(2, &t, &p, vec![NodeId(2)], "second");
        two.ts = one.ts + 1;
        write_placement(&store, StreamId(1), &two).unwrap();
        assert_eq!(latest_placement(&store, StreamId(1)).unwrap(), Some(two));
        // Another decision for a stored version is refused.
        let e = write_placement(&store, StreamId(1), &PlacementRecord { moved: vec![NodeId(1)], ..one.clone() })
            .unwrap_err();
        assert!(e.to_string().contains("never replaced"), "{e}");
        // The same decision, told again: the stored record stands.
        let again = PlacementRecord { reason: "other".into(), ts: one.ts + 5, ..one.clone() };
        assert_eq!(write_placement(&store, StreamId(1), &again).unwrap(), one);
        // A damaged latest record is an error, not a silent fall back to an older version.
        assert_eq!(latest_placement(&store, StreamId(1)).unwrap().map(|r| r.version), Some(2));
        store.put(&placement_key(StreamId(1), 3), b"garbage").unwrap();
        assert!(latest_placement(&store, StreamId(1)).is_err());
    }

    #[test]
    fn a_placement_write_that_landed_but_answered_an_error_is_found_by_its_retry() {
        use crate::backup::test_store::HookedStore;
        let dir = tempfile::tempdir().unwrap();
        // Every put is applied, and answers an error (a reply lost after the write).
        let store = HookedStore::new(LocalDirStore::new(dir.path()), |s, k, b| {
            s.put(k, b)?;
            Err(StoreError::Unavailable { op: "put", key: k.into(), reason: "connection reset".into() })
        });
        let (t, p) = three_node();
        let first = PlacementRecord::new(1, &t, &p, vec![NodeId(3)], "node 3 has been down for 2s");
        assert!(write_placement(&store, StreamId(1), &first).is_err());
        // The retry decides the same move a moment later, in other words.
        let retry =
            PlacementRecord { reason: "node 3 has been down for 3s".into(), ts: first.ts + 1000, ..first.clone() };
        assert_eq!(write_placement(&store, StreamId(1), &retry).unwrap(), first);
        assert_eq!(latest_placement(&store, StreamId(1)).unwrap(), Some(first));
    }
}
