//! [`ControlCommits`]: a stream's checkpoint ids and commit point in one key of the control
//! store ([`Keys::checkpoints`]); the commit records stay in the remote store.
//!
//! The key's value, sealed text:
//!
//! ```text
//! weir-checkpoints 1
//! next-id 513
//! next-trans 600
//! writer 9f3a…            (the run of the coordinator that wrote it last)
//! commit 11 5e6f7a8b     (the commits, oldest first, at most [`HISTORY`]: each id and its
//! commit 12 0a1b2c3d      record's CRC32C; none: no commit yet)
//! crc …
//! ```
//!
//! A record the key does not list is no commit: not for a restart, a task going back to an
//! older commit, retention or `weir verify` (a record whose transaction was refused or never
//! ran, or one a deposed coordinator wrote over a listed one).
//!
//! Every write is one transaction that compares the key's revision as this coordinator last read
//! or wrote it, and the fence of its run ([`Fence`]): its node's member key still lives by the
//! lease the run began under, and the placement key is at the revision the run read. A run claims
//! the key when it begins (a write naming it), so the runs before it, on this node or another,
//! can write nothing after; a run whose node lost its lease or whose placement a leader replaced
//! cannot either. Before a commit writes its record to the store it takes the record's id in the
//! key (a fenced write raising `next-id` past it), so a deposed coordinator does not get as far
//! as the store, and no run that begins later writes a record under that id; a record a deposed
//! run paused after that write puts in the store is no commit (the key does not list it).
//!
//! Invariants:
//! - A commit is durable once its record is in the store and the transaction naming it
//!   succeeded. A transaction whose answer was lost is read back: if the key holds what it
//!   wrote (its run's token in it), it landed; a later write that finds a lost write of its own
//!   there goes on from it.
//! - The ids only grow: a commit raises `next-id` past its record's id (a fresh start's or a
//!   fallback's id is not reserved by the coordinator), and a run begins past the point.
//! - Without the key (a cluster's first start, or one whose records were in the store alone),
//!   a coordinator takes the ids and the last commit over from the store's records, writes the
//!   key before anything else, and marks the store (`commit_point::write_control_marker`), so
//!   that the store alone no longer names a last commit.

use std::sync::{Arc, Mutex};

use weir_wire::{CheckpointId, StreamId, TransId};

use super::Keys;
use crate::backup::commit::{CommitWrite, Point, encode_commit, last_commit_in, read_ids, record_crc, write_commit};
use crate::backup::commit_point::{Begin, CommitBook, Marker, PointError, control_marker, write_control_marker};
use crate::backup::{Store, seal, unseal};
use crate::checkpoint::{CommitRecord, IdRecord, RecordKind};
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

    pub(super) fn compares(&self) -> Vec<Compare> {
        vec![
            Compare::LeaseIs(self.member.clone(), self.lease),
            Compare::ModRevision(self.placement.clone(), self.placement_revision),
        ]
    }
}

/// Commits the key lists: the ones a task may go back to when a newer one cannot be restored.
pub const HISTORY: usize = 32;

/// Commit lines a key may hold (a later Weir may list more than [`HISTORY`]).
const MAX_LISTED: usize = 4096;

/// Lost writes remembered (the newest).
const MAX_LOST: usize = 8;

/// Tries of a read the control store failed to answer, before the error stands.
const READ_TRIES: u32 = 3;

/// The key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Value {
    ids: IdRecord,
    /// The run that wrote it last.
    writer: u64,
    /// The commits, oldest first.
    commits: Vec<Point>,
}

impl Value {
    fn point(&self) -> Option<Point> {
        self.commits.last().copied()
    }
}

fn encode(v: &Value) -> Vec<u8> {
    let mut s = format!(
        "weir-checkpoints 1\nnext-id {}\nnext-trans {}\nwriter {:016x}\n",
        v.ids.next_id.0, v.ids.next_trans.0, v.writer
    );
    for p in &v.commits {
        s.push_str(&format!("commit {} {:08x}\n", p.id.0, p.crc));
    }
    seal(s).into_bytes()
}

/// Decodes and checks the key's value (`Corrupt` naming stream `stream`'s key when it is not one
/// Weir wrote).
fn decode(stream: StreamId, key: &str, bytes: &[u8]) -> Result<Value, PointError> {
    let bad = |reason: String| PointError::Corrupt { stream, key: key.into(), reason };
    let body = unseal(key, bytes).map_err(|e| bad(e.to_string()))?;
    let mut lines = body.lines();
    if lines.next() != Some("weir-checkpoints 1") {
        return Err(bad("not a checkpoint key Weir wrote".into()));
    }
    let mut field = |name: &str, radix: u32| -> Result<u64, PointError> {
        let l = lines.next().ok_or_else(|| bad("truncated".into()))?;
        let v = l.strip_prefix(name).and_then(|v| u64::from_str_radix(v, radix).ok());
        v.ok_or_else(|| bad(format!("bad {name}line")))
    };
    let ids =
        IdRecord { next_id: CheckpointId(field("next-id ", 10)?), next_trans: TransId(field("next-trans ", 10)?) };
    let writer = field("writer ", 16)?;
    let mut commits: Vec<Point> = Vec::new();
    for l in lines {
        let p = match l.split(' ').collect::<Vec<_>>()[..] {
            ["commit", id, crc] => Point {
                id: CheckpointId(id.parse().map_err(|_| bad("bad commit id".into()))?),
                crc: u32::from_str_radix(crc, 16).map_err(|_| bad("bad commit crc".into()))?,
            },
            _ => return Err(bad("bad commit line".into())),
        };
        if commits.len() == MAX_LISTED || commits.last().is_some_and(|q| q.id >= p.id) {
            return Err(bad("commits out of order or too many".into()));
        }
        commits.push(p);
    }
    Ok(Value { ids, writer, commits })
}

/// What the book last read or wrote.
#[derive(Debug, Default)]
struct State {
    /// The value and the key's revision (0: missing).
    read: Option<(Value, i64)>,
    /// Writes whose answers were lost and that no read showed landed, or not (the newest last).
    lost: Vec<Vec<u8>>,
}

/// A stream's ids and commit point in the control store.
pub struct ControlCommits {
    control: Arc<dyn ControlStore>,
    stream: StreamId,
    key: String,
    cluster: String,
    /// `None`: a reader, which writes nothing.
    fence: Option<Fence>,
    /// This run's token in the values it writes.
    run: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for ControlCommits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlCommits").field("key", &self.key).field("fence", &self.fence).finish()
    }
}

/// A token no other run draws (the clock's nanoseconds and the book's address).
fn run_token(book: *const ControlCommits) -> u64 {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    ns ^ (book as usize as u64).rotate_left(32) ^ u64::from(std::process::id()).rotate_left(48)
}

impl ControlCommits {
    /// The book of a coordinator whose writes compare `fence`.
    pub fn new(control: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId, fence: Fence) -> Self {
        let mut b = Self::reader(control, keys, stream);
        b.fence = Some(fence);
        b.run = run_token(&b);
        b
    }

    /// A book that only reads (`weir verify`, `weir checkpoints`).
    pub fn reader(control: Arc<dyn ControlStore>, keys: &Keys, stream: StreamId) -> Self {
        Self {
            control,
            stream,
            key: keys.checkpoints(stream),
            cluster: keys.cluster().to_string(),
            fence: None,
            run: 0,
            state: Default::default(),
        }
    }

    fn corrupt(&self, reason: String) -> PointError {
        PointError::Corrupt { stream: self.stream, key: self.key.clone(), reason }
    }

    fn fenced(&self, why: String) -> PointError {
        PointError::Fenced { stream: self.stream, why }
    }

    /// The key's value and revision (`None`: missing), asked again a few times when the store
    /// does not answer (a restore waits on it).
    fn read(&self) -> Result<Option<(Value, i64)>, PointError> {
        let mut tries = 0;
        let got = loop {
            match self.control.get(&self.key) {
                Ok(got) => break got,
                // Each call is bounded by the store's timeout already: no pause between tries.
                Err(e) if e.is_retryable() && tries + 1 < READ_TRIES => tries += 1,
                Err(e) => return Err(e.into()),
            }
        };
        match got {
            None => Ok(None),
            Some(e) => Ok(Some((decode(self.stream, &self.key, &e.value)?, e.mod_revision))),
        }
    }

    /// The key, or why its absence may not be taken as "no commit through it yet": the store
    /// says a control store holds the stream's point (the key was lost, or this is another
    /// cluster's name). A takeover that stopped before its key was written may begin again.
    fn read_or_marker(&self, store: &dyn Store) -> Result<Option<(Value, i64)>, PointError> {
        let read = self.read()?;
        let marker = control_marker(store, self.stream)?;
        if read.is_none()
            && let Some(cluster) = marker.filter(|m| m.held || m.cluster != self.cluster).map(|m| m.cluster)
        {
            let reason = if cluster == self.cluster {
                "missing, though the store says this cluster keeps the stream's commits there: \
                 it must not be deleted (a restart from the store's records alone could reuse ids)"
                    .to_string()
            } else {
                format!("missing: the store says cluster {cluster} keeps the stream's commits (not {})", self.cluster)
            };
            return Err(self.corrupt(reason));
        }
        Ok(read)
    }

    /// Writes `change` of the value as last read, fenced (`put: false`: only checks that it
    /// could). A refusal that shows a lost write of its own landed goes on from it, once.
    fn write(&self, put: bool, change: impl Fn(Value) -> Result<Value, PointError>) -> Result<(), PointError> {
        let Some(fence) = &self.fence else { return Err(self.fenced("a reader writes nothing".into())) };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some((mut cur, mut rev)) = st.read.clone() else {
            return Err(self.fenced("the key was never read".into()));
        };
        for _ in 0..2 {
            let new = Value { writer: self.run, ..change(cur.clone())? };
            let bytes = encode(&new);
            let mut when = fence.compares();
            when.push(Compare::ModRevision(self.key.clone(), rev));
            let ops =
                if put { vec![Op::Put { key: self.key.clone(), value: bytes.clone(), lease: None }] } else { vec![] };
            match self.control.txn(&when, &ops) {
                Ok(o) if o.succeeded => {
                    if put {
                        *st = State { read: Some((new, o.revision)), lost: Vec::new() };
                    }
                    return Ok(());
                }
                Ok(_) => {
                    let stands = self.control.get(&self.key)?;
                    match stands {
                        Some(e) if st.lost.contains(&e.value) => {
                            // A write of its own whose answer was lost landed: go on from there.
                            (cur, rev) = (decode(self.stream, &self.key, &e.value)?, e.mod_revision);
                            *st = State { read: Some((cur.clone(), rev)), lost: Vec::new() };
                        }
                        stands => {
                            let now = stands.map_or(0, |e| e.mod_revision);
                            return Err(self.fenced(self.why_refused(fence, rev, now)));
                        }
                    }
                }
                Err(e) if !put => return Err(e.into()),
                Err(e) => {
                    // It may land later still (a transaction in flight): remembered either way.
                    if !st.lost.contains(&bytes) {
                        if st.lost.len() == MAX_LOST {
                            st.lost.remove(0);
                        }
                        st.lost.push(bytes.clone());
                    }
                    return match self.control.get(&self.key) {
                        Ok(Some(got)) if got.value == bytes => {
                            *st = State { read: Some((new, got.mod_revision)), lost: Vec::new() };
                            Ok(())
                        }
                        Ok(got) if got.as_ref().map_or(0, |g| g.mod_revision) == rev => Err(e.into()),
                        Ok(Some(got)) if st.lost.contains(&got.value) => Err(e.into()),
                        Ok(got) => {
                            let now = got.map_or(0, |g| g.mod_revision);
                            Err(self.fenced(self.why_refused(fence, rev, now)))
                        }
                        Err(_) => Err(e.into()),
                    };
                }
            }
        }
        Err(self.fenced("the checkpoint key changed twice under its write".into()))
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
        let (value, rev, last) = match self.read_or_marker(store)? {
            Some((v, rev)) => {
                let last = last_commit_in(store, self.stream, Some(&v.commits))?.map(|(r, _)| r);
                (v, rev, last)
            }
            None => {
                // The store's records, taken over: its newest commits are listed. The store is
                // marked first, so that from the moment the key exists the store alone names no
                // last commit.
                let ids = read_ids(store, self.stream)?;
                let commits = newest_records(store, self.stream)?;
                let last = last_commit_in(store, self.stream, Some(&commits))?.map(|(r, _)| r);
                let marker = Marker { cluster: self.cluster.clone(), held: false };
                write_control_marker(store, self.stream, &marker)?;
                (Value { ids, writer: 0, commits }, 0, last)
            }
        };
        self.state.lock().unwrap_or_else(|e| e.into_inner()).read = Some((value.clone(), rev));
        // Claimed: the runs before this one write nothing from now on, and a fence that does
        // not hold stops this one before its tasks restore.
        self.write(true, Ok)?;
        // The takeover (this one's, or one that stopped before here) is done.
        if !control_marker(store, self.stream)?.is_some_and(|m| m.held) {
            write_control_marker(store, self.stream, &Marker { cluster: self.cluster.clone(), held: true })?;
        }
        // Past the point whatever the record says (it may be unreadable).
        let past = value.point().map_or(CheckpointId(0), |p| p.id.next());
        Ok(Begin { ids: IdRecord { next_id: value.ids.next_id.max(past), ..value.ids }, last })
    }

    fn reserve(&self, _store: &dyn Store, ids: &IdRecord) -> Result<(), PointError> {
        let ids = *ids;
        self.write(true, |v| Ok(Value { ids: ids.max(v.ids), ..v }))
    }

    fn commit(&self, store: &dyn Store, record: &CommitRecord) -> CommitWrite {
        let point = Point { id: record.id, crc: record_crc(encode_commit(record).as_bytes()) };
        let outcome = |r: Result<(), PointError>| match r {
            Ok(()) => CommitWrite::Durable,
            // A checkpoint in flight across a fallback: the stream went back past it already
            // (any other record older than the point is a coordinator out of step: refused).
            Err(e @ PointError::Stale { .. }) if matches!(record.kind, RecordKind::Commit(_)) => {
                CommitWrite::Failed(e.to_string())
            }
            Err(e) if e.is_retryable() => CommitWrite::Failed(e.to_string()),
            Err(e) => CommitWrite::Refused(e.to_string()),
        };
        // Every record is newer than the point (a consensus or a fallback takes an id of its
        // own, past the checkpoint it goes back to).
        let step = |v: Value| match v.point() {
            // Its own write of this commit, whose answer was lost, landed.
            Some(p) if p == point => Ok(v),
            Some(p) if p.id >= point.id => Err(PointError::Stale { stream: self.stream, id: point.id, point: p.id }),
            _ => {
                let next_id = v.ids.next_id.max(point.id.next());
                let mut commits = v.commits.clone();
                commits.push(point);
                let commits = commits.split_off(commits.len().saturating_sub(HISTORY));
                Ok(Value { ids: IdRecord { next_id, ..v.ids }, commits, ..v })
            }
        };
        // Nothing goes to the store from a coordinator the fence already refuses, and the
        // record's id is taken first (a run that begins after this never uses it again, so no
        // two runs write one record's key).
        let taken = |v: Value| {
            step(v.clone())?;
            Ok(Value { ids: IdRecord { next_id: v.ids.next_id.max(point.id.next()), ..v.ids }, ..v })
        };
        if let Err(e) = self.write(true, taken) {
            return outcome(Err(e));
        }
        match write_commit(store, self.stream, record) {
            CommitWrite::Durable => outcome(self.write(true, step)),
            other => other,
        }
    }

    fn last(&self, store: &dyn Store) -> Result<Option<CommitRecord>, PointError> {
        let read = self.read_or_marker(store)?;
        if self.fence.is_none() {
            // A reader's point is what it read last; a writer's stays what its writes compare.
            self.state.lock().unwrap_or_else(|e| e.into_inner()).read = read.clone();
        }
        let listed = read.map(|(v, _)| v.commits);
        Ok(last_commit_in(store, self.stream, listed.as_deref())?.map(|(r, _)| r))
    }

    fn listed(&self) -> Option<Vec<Point>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &st.read {
            Some((v, _)) => Some(v.commits.clone()),
            // A reader that found no key: the store's records are the commits.
            None if self.fence.is_none() => None,
            // A writer that has not read yet: no record counts.
            None => Some(Vec::new()),
        }
    }

    fn commits(&self, store: &dyn Store) -> Result<Option<Vec<Point>>, PointError> {
        Ok(self.read_or_marker(store)?.map(|(v, _)| v.commits))
    }
}

/// The store's newest [`HISTORY`] commit records that decode, oldest first, as points.
fn newest_records(store: &dyn Store, stream: StreamId) -> Result<Vec<Point>, PointError> {
    let mut out = Vec::new();
    for key in store.list(&format!("{}/checkpoints/", stream.0))?.iter().rev() {
        if out.len() == HISTORY {
            break;
        }
        let bytes = match store.get_at_most(key, crate::backup::MAX_RECORD) {
            Ok(b) => b,
            Err(crate::backup::StoreError::NotFound { .. } | crate::backup::StoreError::TooLarge { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        if let Ok(r) = crate::backup::commit::decode_commit(key, &bytes) {
            out.push(Point { id: r.id, crc: record_crc(&bytes) });
        }
    }
    out.reverse();
    Ok(out)
}
