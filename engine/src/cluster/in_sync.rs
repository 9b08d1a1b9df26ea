//! Each ingest partition's in-sync set in the control store, as Kafka's ISR: whether the
//! follower's copy of a partition holds every row its primary acknowledged.
//!
//! One key per partition, `/weir/<cluster>/streams/<id>/in-sync/<partition>`: the primary, the
//! follower and whether the follower is in the set, sealed text with a CRC. Only the primary
//! of the placement that stands writes it, in a transaction fenced as the commit point is
//! ([`Fence`]: its member key still lives by its run's lease, the placement key is at the
//! revision its run read) and compared with the key's revision as just read.
//!
//! Invariants:
//! - A primary acknowledges an append on its own sync alone only once the key says its follower
//!   is out (a write that landed, read back when its answer was lost); until then, and from
//!   the moment it asks the follower back in, appends wait for the follower.
//! - So a follower the key names as in the set holds every acknowledged row, and one named out
//!   may lack some: the leader moves a lost primary's source to its follower only when the key
//!   does not say the follower is out ([`InSyncRecord::strands`]). A missing key, or one written
//!   under another placement (another primary or follower), says nothing is out: its primary
//!   waited for its follower.
//! - The primary's writes end with its lease (the fence), and a move needs that lease to have
//!   ended, so what the leader reads when it decides is the key's last value.

use std::sync::Arc;

use weir_wire::{NodeId, StreamId};

use super::{BookError, Fence, Keys};
use crate::backup::{StoreError, seal, unseal};
use crate::control::{Compare, ControlStore, Op};

/// A partition's in-sync set as one key holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InSyncRecord {
    /// The node of the partition's source (its log is the partition).
    pub primary: NodeId,
    /// The node keeping the copy.
    pub follower: NodeId,
    /// Whether the copy holds every row the primary acknowledged.
    pub in_sync: bool,
}

impl InSyncRecord {
    /// Whether a lost `primary`'s source must not move to `follower`: this record says the
    /// copy there left the set (the primary acknowledged rows it may lack).
    pub fn strands(record: Option<&InSyncRecord>, primary: NodeId, follower: NodeId) -> bool {
        record.is_some_and(|r| r.primary == primary && r.follower == follower && !r.in_sync)
    }

    fn encode(&self) -> String {
        seal(format!(
            "weir-in-sync 1\nprimary {}\nfollower {}\nin-sync {}\n",
            self.primary.0,
            self.follower.0,
            u8::from(self.in_sync)
        ))
    }

    fn decode(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
        let body = unseal(key, bytes)?;
        let mut lines = body.lines();
        match lines.next() {
            Some("weir-in-sync 1") => {}
            Some(l) if l.starts_with("weir-in-sync ") => {
                return Err(bad(&format!("written by a newer Weir ({l}; this one reads weir-in-sync 1)")));
            }
            _ => return Err(bad("not an in-sync record")),
        }
        let (mut primary, mut follower, mut in_sync) = (None, None, None);
        for l in lines {
            let (word, rest) = l.split_once(' ').ok_or_else(|| bad("a line without a value"))?;
            let n: u32 = rest.parse().map_err(|_| bad("bad number"))?;
            match word {
                "primary" => primary = Some(NodeId(n)),
                "follower" => follower = Some(NodeId(n)),
                "in-sync" if n <= 1 => in_sync = Some(n == 1),
                _ => return Err(bad("unknown line")),
            }
        }
        match (primary, follower, in_sync) {
            (Some(primary), Some(follower), Some(in_sync)) => Ok(Self { primary, follower, in_sync }),
            _ => Err(bad("primary, follower or in-sync missing")),
        }
    }
}

/// A stream's in-sync keys.
pub struct ControlInSync {
    store: Arc<dyn ControlStore>,
    keys: Keys,
    stream: StreamId,
    /// The writing primary's fence (`None`: a reader, the leader).
    fence: Option<Fence>,
}

impl std::fmt::Debug for ControlInSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlInSync").field("stream", &self.stream).field("writes", &self.fence.is_some()).finish()
    }
}

impl ControlInSync {
    /// The keys of `stream`, written by the run that `fence` stands for.
    pub fn new(store: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId, fence: Fence) -> Self {
        Self { store, keys: keys.clone(), stream, fence: Some(fence) }
    }

    /// The keys of `stream`, read only.
    pub fn reader(store: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId) -> Self {
        Self { store, keys: keys.clone(), stream, fence: None }
    }

    /// Partition `partition`'s record, if any.
    pub fn read(&self, partition: u32) -> Result<Option<InSyncRecord>, BookError> {
        Ok(self.read_entry(partition)?.map(|(r, _)| r))
    }

    fn read_entry(&self, partition: u32) -> Result<Option<(InSyncRecord, i64)>, BookError> {
        let key = self.keys.in_sync(self.stream, partition);
        match self.store.get(&key)? {
            None => Ok(None),
            Some(e) => Ok(Some((InSyncRecord::decode(&key, &e.value)?, e.mod_revision))),
        }
    }

    /// Writes `record` as partition `partition`'s set: `Ok` once the key holds it (written now,
    /// or found there when the answer was lost), an error when it may not.
    pub fn set(&self, partition: u32, record: InSyncRecord) -> Result<(), BookError> {
        let Some(fence) = &self.fence else {
            return Err(BookError::Refused { version: 0, why: "a reader writes no in-sync set".into(), stands: None });
        };
        let key = self.keys.in_sync(self.stream, partition);
        let revision = self.read_entry(partition)?.map_or(0, |(_, rev)| rev);
        let mut when = fence.compares();
        when.push(Compare::ModRevision(key.clone(), revision));
        let put = Op::Put { key, value: record.encode().into_bytes(), lease: None };
        let tried = self.store.txn(&when, &[put]);
        match tried {
            Ok(o) if o.succeeded => Ok(()),
            Err(e) if !e.is_retryable() => Err(e.into()),
            // Refused or unanswered: it stands if the key holds it now.
            _ => match self.read(partition)? {
                Some(now) if now == record => Ok(()),
                _ => match tried {
                    Err(e) => Err(e.into()),
                    Ok(_) => Err(BookError::Refused {
                        version: 0,
                        why: format!(
                            "partition {partition}'s in-sync set not written: this node's lease ended, the \
                             placement changed, or another write came first"
                        ),
                        stands: None,
                    }),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::MemControl;

    fn rec(in_sync: bool) -> InSyncRecord {
        InSyncRecord { primary: NodeId(2), follower: NodeId(3), in_sync }
    }

    #[test]
    fn an_in_sync_record_roundtrips_and_a_damaged_one_is_refused() {
        for r in [rec(true), rec(false)] {
            assert_eq!(InSyncRecord::decode("k", r.encode().as_bytes()).unwrap(), r);
        }
        let damaged = rec(true).encode().replace("in-sync 1", "in-sync 0");
        assert!(InSyncRecord::decode("k", damaged.as_bytes()).is_err());
        let newer = seal("weir-in-sync 2\n".into());
        assert!(InSyncRecord::decode("k", newer.as_bytes()).unwrap_err().to_string().contains("newer Weir"));
        let two = seal("weir-in-sync 1\nprimary 1\nfollower 2\nin-sync 2\n".into());
        assert!(InSyncRecord::decode("k", two.as_bytes()).is_err());
    }

    #[test]
    fn only_a_follower_the_record_names_out_under_the_same_primary_strands_a_move() {
        let (p, f) = (NodeId(2), NodeId(3));
        assert!(!InSyncRecord::strands(None, p, f), "no record: the primary waited for its follower");
        assert!(!InSyncRecord::strands(Some(&rec(true)), p, f));
        assert!(InSyncRecord::strands(Some(&rec(false)), p, f));
        // Written under another placement: another primary or follower.
        assert!(!InSyncRecord::strands(Some(&rec(false)), NodeId(1), f));
        assert!(!InSyncRecord::strands(Some(&rec(false)), p, NodeId(1)));
    }

    #[test]
    fn the_set_is_written_under_the_primarys_fence_and_refused_once_its_lease_ended() {
        let store = Arc::new(MemControl::new());
        let keys = Keys::new("c");
        let lease = store.grant(std::time::Duration::from_secs(5)).unwrap();
        let member = Op::Put { key: keys.member(NodeId(2)), value: b"m".to_vec(), lease: Some(lease) };
        store.txn(&[], &[member]).unwrap();
        let fence = Fence::new(&keys, StreamId(1), NodeId(2), lease, 0);
        let isr = ControlInSync::new(store.clone(), &keys, StreamId(1), fence);
        assert_eq!(isr.read(0).unwrap(), None);
        isr.set(0, rec(false)).unwrap();
        assert_eq!(isr.read(0).unwrap(), Some(rec(false)));
        isr.set(0, rec(true)).unwrap();
        isr.set(0, rec(true)).unwrap(); // again: it stands
        let reader = ControlInSync::reader(store.clone(), &keys, StreamId(1));
        assert_eq!(reader.read(0).unwrap(), Some(rec(true)));
        assert!(reader.set(0, rec(false)).is_err(), "a reader writes nothing");
        store.revoke(lease).unwrap();
        let e = isr.set(0, rec(false)).unwrap_err().to_string();
        assert!(e.contains("not written"), "{e}");
        assert_eq!(reader.read(0).unwrap(), Some(rec(true)), "a deposed primary's write refused");
    }
}
