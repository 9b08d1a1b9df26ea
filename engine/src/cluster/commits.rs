//! [`ControlCommits`]: a stream's checkpoint ids and commit point in one key of the control
//! store ([`Keys::checkpoints`]); the commit records stay in the remote store.
//!
//! The key's value, sealed text:
//!
//! ```text
//! weir-checkpoints 1
//! next-id 513
//! next-trans 600
//! commit 12 0a1b2c3d     (the last commit's id and its record's CRC32C; absent: none yet)
//! crc …
//! ```
//!
//! Every write is one transaction that compares the key's revision as this coordinator last read
//! or wrote it, and the fence of its run ([`Fence`]): its node's member key still lives by the
//! lease the run began under, and the placement key is at the revision the run read. So a
//! coordinator whose node lost its lease, whose placement a leader replaced, or beside which
//! another coordinator wrote, writes nothing: its commit is no commit, and its run ends.
//!
//! Invariants:
//! - A commit is durable once its record is in the store and the transaction naming it
//!   succeeded. A transaction whose answer was lost is read back: if the key holds what it
//!   wrote, it landed; a later write that finds its own lost write there takes it as landed.
//! - Without the key (a cluster's first start, or one whose records were in the store alone),
//!   a coordinator takes the ids and the last commit from the store and writes the key before
//!   it starts (only if it is still missing): a reader that finds no key reads the store's
//!   records, as no coordinator has committed through the key yet.

use std::sync::{Arc, Mutex};

use weir_wire::{CheckpointId, StreamId, TransId};

use super::Keys;
use crate::backup::commit::{CommitWrite, Point, encode_commit, last_commit_upto, read_ids, record_crc, write_commit};
use crate::backup::commit_point::{Begin, CommitBook, PointError};
use crate::backup::{Store, seal, unseal};
use crate::checkpoint::{CommitRecord, IdRecord};
use crate::control::{Compare, ControlStore, LeaseId, Op};

/// What a coordinator's writes compare besides the key's own revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// Its node's member key ...
    pub member: String,
    /// ... and the lease it must still live by (the run's membership).
    pub lease: LeaseId,
    /// The stream's placement key ...
    pub placement: String,
    /// ... at the revision the run read (0: missing, the config file's placement).
    pub placement_revision: i64,
}

impl Fence {
    /// The fence of node `member`'s run under `lease` of `stream`'s placement read at `revision`.
    pub fn new(keys: &Keys, stream: StreamId, member: weir_wire::NodeId, lease: LeaseId, revision: i64) -> Self {
        Self { member: keys.member(member), lease, placement: keys.placement(stream), placement_revision: revision }
    }

    fn compares(&self) -> Vec<Compare> {
        vec![
            Compare::LeaseIs(self.member.clone(), self.lease),
            Compare::ModRevision(self.placement.clone(), self.placement_revision),
        ]
    }
}

/// The key's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Value {
    ids: IdRecord,
    point: Option<Point>,
}

fn encode(v: &Value) -> Vec<u8> {
    let mut s = format!("weir-checkpoints 1\nnext-id {}\nnext-trans {}\n", v.ids.next_id.0, v.ids.next_trans.0);
    if let Some(p) = v.point {
        s.push_str(&format!("commit {} {:08x}\n", p.id.0, p.crc));
    }
    seal(s).into_bytes()
}

fn decode(key: &str, bytes: &[u8]) -> Result<Value, String> {
    let body = unseal(key, bytes).map_err(|e| e.to_string())?;
    let mut lines = body.lines();
    if lines.next() != Some("weir-checkpoints 1") {
        return Err("not a checkpoint key Weir wrote".into());
    }
    let mut field = |name: &str| -> Result<u64, String> {
        let l = lines.next().ok_or("truncated")?;
        l.strip_prefix(name).and_then(|v| v.parse().ok()).ok_or_else(|| format!("bad {name}line"))
    };
    let ids = IdRecord { next_id: CheckpointId(field("next-id ")?), next_trans: TransId(field("next-trans ")?) };
    let point = match lines.next() {
        None => None,
        Some(l) => {
            let p: Vec<&str> = l.split(' ').collect();
            match p[..] {
                ["commit", id, crc] => Some(Point {
                    id: CheckpointId(id.parse().map_err(|_| "bad commit id")?),
                    crc: u32::from_str_radix(crc, 16).map_err(|_| "bad commit crc")?,
                }),
                _ => return Err("bad commit line".into()),
            }
        }
    };
    if lines.next().is_some() {
        return Err("trailing lines".into());
    }
    Ok(Value { ids, point })
}

/// What the book last read or wrote.
#[derive(Debug, Default)]
struct State {
    /// The value and the key's revision (0: missing).
    read: Option<(Value, i64)>,
    /// A write whose answer was lost and that no read showed landed.
    lost: Option<Vec<u8>>,
}

/// A stream's ids and commit point in the control store.
pub struct ControlCommits {
    control: Arc<dyn ControlStore>,
    stream: StreamId,
    key: String,
    /// `None`: a reader, which writes nothing.
    fence: Option<Fence>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ControlCommits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlCommits").field("key", &self.key).field("fence", &self.fence).finish()
    }
}

impl ControlCommits {
    /// The book of a coordinator whose writes compare `fence`.
    pub fn new(control: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId, fence: Fence) -> Self {
        Self { control, stream, key: keys.checkpoints(stream), fence: Some(fence), state: Default::default() }
    }

    /// A book that only reads (`weir verify`, status).
    pub fn reader(control: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId) -> Self {
        Self { control, stream, key: keys.checkpoints(stream), fence: None, state: Default::default() }
    }

    /// The key's value and revision (`None`: missing).
    fn read(&self) -> Result<Option<(Value, i64)>, PointError> {
        match self.control.get(&self.key)? {
            None => Ok(None),
            Some(e) => match decode(&self.key, &e.value) {
                Ok(v) => Ok(Some((v, e.mod_revision))),
                Err(reason) => Err(PointError::Corrupt { stream: self.stream, key: self.key.clone(), reason }),
            },
        }
    }

    /// Writes `change` of the value as last read, fenced; on a refusal that shows a lost write
    /// of its own landed, once more after it.
    fn write(&self, change: impl Fn(Value) -> Result<Value, String>) -> Result<(), PointError> {
        let Some(fence) = &self.fence else {
            return Err(PointError::Fenced {
                stream: self.stream,
                why: "a reader of the checkpoint key writes nothing".into(),
            });
        };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some((mut cur, mut rev)) = st.read else {
            return Err(PointError::Fenced { stream: self.stream, why: "the checkpoint key was never read".into() });
        };
        for _ in 0..2 {
            let new = change(cur).map_err(|why| PointError::Fenced { stream: self.stream, why })?;
            let bytes = encode(&new);
            let mut when = fence.compares();
            when.push(Compare::ModRevision(self.key.clone(), rev));
            let put = Op::Put { key: self.key.clone(), value: bytes.clone(), lease: None };
            match self.control.txn(&when, &[put]) {
                Ok(o) if o.succeeded => {
                    *st = State { read: Some((new, o.revision)), lost: None };
                    return Ok(());
                }
                Ok(_) => {
                    let stands = self.control.get(&self.key)?;
                    match stands {
                        Some(e) if st.lost.as_ref() == Some(&e.value) => {
                            // Its own earlier write landed after all: go on from there.
                            let v = decode(&self.key, &e.value).map_err(|reason| PointError::Corrupt {
                                stream: self.stream,
                                key: self.key.clone(),
                                reason,
                            })?;
                            (cur, rev) = (v, e.mod_revision);
                            *st = State { read: Some((cur, rev)), lost: None };
                        }
                        stands => {
                            let now = stands.map_or(0, |e| e.mod_revision);
                            return Err(PointError::Fenced {
                                stream: self.stream,
                                why: self.why_refused(fence, rev, now),
                            });
                        }
                    }
                }
                Err(e) => {
                    return match self.control.get(&self.key) {
                        Ok(Some(got)) if got.value == bytes => {
                            *st = State { read: Some((new, got.mod_revision)), lost: None };
                            Ok(())
                        }
                        Ok(got) if got.as_ref().map_or(0, |g| g.mod_revision) == rev => Err(e.into()),
                        Ok(got) => {
                            let now = got.map_or(0, |g| g.mod_revision);
                            Err(PointError::Fenced { stream: self.stream, why: self.why_refused(fence, rev, now) })
                        }
                        Err(_) => {
                            st.lost = Some(bytes);
                            Err(e.into())
                        }
                    };
                }
            }
        }
        Err(PointError::Fenced { stream: self.stream, why: "the checkpoint key changed twice under its write".into() })
    }

    /// Says which part of the fence stopped a write (best effort: the store may fail again).
    fn why_refused(&self, fence: &Fence, expected: i64, now: i64) -> String {
        let member = self.control.get(&fence.member);
        let placement = self.control.get(&fence.placement);
        match (member, placement) {
            (Ok(m), _) if m.as_ref().and_then(|m| m.lease) != Some(fence.lease) => {
                "this node's lease in the control store ended: it no longer coordinates".into()
            }
            (_, Ok(p)) if p.as_ref().map_or(0, |p| p.mod_revision) != fence.placement_revision => format!(
                "the stream's placement changed since this run began (revision {} now {})",
                fence.placement_revision,
                p.map_or(0, |p| p.mod_revision)
            ),
            (Ok(_), Ok(_)) => {
                format!("another coordinator wrote the checkpoint key (revision {expected} now {now})")
            }
            _ => "the control store refused the write (its lease, placement or checkpoint key changed)".into(),
        }
    }
}

impl CommitBook for ControlCommits {
    fn begin(&self, store: &dyn Store) -> Result<Begin, PointError> {
        let (value, rev, last) = match self.read()? {
            Some((v, rev)) => {
                let last = last_commit_upto(store, self.stream, v.point)?;
                (v, rev, last.map(|(r, _)| r))
            }
            None => {
                // The store's records, taken over: the key is written before anything else, so
                // from now on a record the key does not name is no commit.
                let ids = read_ids(store, self.stream)?;
                let last = last_commit_upto(store, self.stream, None)?;
                let point = last.as_ref().map(|(r, crc)| Point { id: r.id, crc: *crc });
                let value = Value { ids, point };
                self.state.lock().unwrap_or_else(|e| e.into_inner()).read = Some((value, 0));
                self.write(Ok)?;
                return Ok(Begin { ids, last: last.map(|(r, _)| r) });
            }
        };
        self.state.lock().unwrap_or_else(|e| e.into_inner()).read = Some((value, rev));
        Ok(Begin { ids: value.ids, last })
    }

    fn reserve(&self, _store: &dyn Store, ids: &IdRecord) -> Result<(), PointError> {
        let ids = *ids;
        self.write(|v| {
            Ok(Value {
                ids: IdRecord {
                    next_id: ids.next_id.max(v.ids.next_id),
                    next_trans: ids.next_trans.max(v.ids.next_trans),
                },
                ..v
            })
        })
    }

    fn commit(&self, store: &dyn Store, record: &CommitRecord) -> CommitWrite {
        match write_commit(store, self.stream, record) {
            CommitWrite::Durable => {}
            other => return other,
        }
        let point = Point { id: record.id, crc: record_crc(encode_commit(record).as_bytes()) };
        let moved = self.write(|v| match v.point {
            // Its own write of this commit, whose answer was lost, landed.
            Some(p) if p == point => Ok(v),
            Some(p) if p.id >= point.id => Err(format!("commit {} is not newer than the last, {}", point.id, p.id)),
            _ => Ok(Value { point: Some(point), ..v }),
        });
        match moved {
            Ok(()) => CommitWrite::Durable,
            Err(e) if e.is_retryable() => CommitWrite::Failed(e.to_string()),
            Err(e) => CommitWrite::Fenced(e.to_string()),
        }
    }

    fn last(&self, store: &dyn Store) -> Result<Option<CommitRecord>, PointError> {
        let read = self.read()?;
        if self.fence.is_none() {
            // A reader's point is what it read last; a writer's stays what its writes compare.
            self.state.lock().unwrap_or_else(|e| e.into_inner()).read = read;
        }
        let point = match read {
            Some((v, _)) => match v.point {
                Some(p) => Some(p),
                None => return Ok(None),
            },
            None => None,
        };
        Ok(last_commit_upto(store, self.stream, point)?.map(|(r, _)| r))
    }

    fn point(&self) -> Option<CheckpointId> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.read {
            Some((v, _)) => Some(v.point.map_or(CheckpointId(0), |p| p.id)),
            // A reader that found no key: the store's records are the commits.
            None if self.fence.is_none() => None,
            // A writer that has not read yet: no record counts.
            None => Some(CheckpointId(0)),
        }
    }
}
