//! The coordinator's records in the store: commit records (`<stream>/checkpoints/<id>.commit`)
//! and the id record (`<stream>/coordinator/ids`), both sealed text with their own checksum.
//!
//! Invariants:
//! - [`write_commit`] reports a commit durable only when the record reads back as written, and
//!   failed only when it is not there: a put that reported an error although the object became
//!   visible (a lost answer, a failed sync after the rename) counts as durable, since a restart
//!   would restore it.
//! - [`read_ids`] returns the default record only when there is none; an unreadable or damaged
//!   record is an error (starting again at id 1 would reuse ids).

use weir_wire::{CheckpointId, StreamId, TaskId, TransId, Version};

use super::{Store, StoreError, seal, unseal};
use crate::checkpoint::{CommitRecord, IdRecord, RecordKind, Shape};

/// Key of the commit record of `id`.
pub fn commit_key(stream: StreamId, id: CheckpointId) -> String {
    format!("{}/checkpoints/{:020}.commit", stream.0, id.0)
}

/// Key of the coordinator's id record.
pub fn ids_key(stream: StreamId) -> String {
    format!("{}/coordinator/ids", stream.0)
}

/// Encodes a commit record (text, with a CRC line).
pub fn encode_commit(r: &CommitRecord) -> String {
    let kind = match r.kind {
        RecordKind::Commit(t) => format!("trans {}", t.0),
        // A consensus of the format 2 days, which took the chosen checkpoint's own id.
        RecordKind::Consensus(to) if to == r.id => "consensus".into(),
        RecordKind::Consensus(to) => format!("consensus {}", to.0),
        RecordKind::Fresh => "fresh".into(),
        RecordKind::Fallback(to) => format!("fallback {}", to.0),
    };
    // The oldest format that can say it: an older Weir refuses a record it cannot read (skipping
    // it loudly as damaged) rather than misreading it, and reads every other record. Format 4
    // names a consensus's checkpoint apart from the record's id (format 2's consensus record
    // took the checkpoint's own id).
    let format = match r.kind {
        // Format 5 names the stream's aggs and sinks, and a savepoint.
        RecordKind::Commit(_) if r.shape.is_some() || r.savepoint => 5,
        RecordKind::Commit(_) | RecordKind::Fresh => 2,
        RecordKind::Consensus(to) if to == r.id => 2,
        RecordKind::Fallback(_) => 3,
        RecordKind::Consensus(_) => 4,
    };
    let mut s = format!("weir-commit {format}\nid {}\n{kind}\nts {}\n", r.id.0, r.ts);
    for (t, v) in &r.versions {
        s.push_str(&format!("version {} {}\n", t.0, v.0));
    }
    for (t, c) in &r.manifests {
        s.push_str(&format!("manifest {} {c:08x}\n", t.0));
    }
    if let Some(shape) = &r.shape {
        s.push_str(&format!("shape {} {} {}\n", shape.first_agg.0, shape.aggs, shape.sinks));
    }
    if r.savepoint {
        s.push_str("savepoint\n");
    }
    seal(s)
}

/// Decodes and checks a commit record.
pub fn decode_commit(key: &str, bytes: &[u8]) -> Result<CommitRecord, StoreError> {
    let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
    let body = unseal(key, bytes)?;
    let mut lines = body.lines();
    // Formats 1 and 2 wrote a consensus under the id of the checkpoint it chose (format 1 as
    // transaction 0): it reads as a consensus record pointing at its own id.
    let format = match lines.next() {
        Some("weir-commit 1") => 1,
        Some("weir-commit 2") => 2,
        Some("weir-commit 3") => 3,
        Some("weir-commit 4") => 4,
        Some("weir-commit 5") => 5,
        _ => return Err(bad("not a commit record")),
    };
    let (mut id, mut kind, mut ts) = (None, None, None);
    // The chosen checkpoint of a consensus in format 1 or 2: the record's id, read after.
    let mut own_point = false;
    let mut r = CommitRecord::fresh(CheckpointId(1), 0);
    for l in lines {
        let p: Vec<&str> = l.split(' ').collect();
        let n = |i: usize| p.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| bad("bad number"));
        match p[0] {
            "id" => id = Some(CheckpointId(n(1)?)),
            "trans" | "consensus" | "fresh" | "fallback" if kind.is_some() => return Err(bad("two kinds")),
            "trans" if format == 1 && n(1)? == 0 => {
                own_point = true;
                kind = Some(RecordKind::Consensus(CheckpointId(0)));
            }
            "trans" => kind = Some(RecordKind::Commit(TransId(n(1)?))),
            "consensus" if format == 2 && p.len() == 1 => {
                own_point = true;
                kind = Some(RecordKind::Consensus(CheckpointId(0)));
            }
            "consensus" if format >= 4 => kind = Some(RecordKind::Consensus(CheckpointId(n(1)?))),
            "fresh" if format >= 2 => kind = Some(RecordKind::Fresh),
            "fallback" if format >= 3 => kind = Some(RecordKind::Fallback(CheckpointId(n(1)?))),
            "ts" => ts = Some(n(1)?),
            "version" => {
                r.versions.insert(TaskId(n(1)? as u32), Version(n(2)?));
            }
            "shape" if format >= 5 => {
                let m = |i: usize| n(i).and_then(|v| u32::try_from(v).map_err(|_| bad("bad number")));
                let shape = Shape { first_agg: TaskId(m(1)?), aggs: m(2)?, sinks: m(3)? };
                let (a, s) = (u64::from(shape.aggs), u64::from(shape.sinks));
                if a == 0
                    || s == 0
                    || a + s > u64::from(crate::spec::MAX_TASKS)
                    || u64::from(shape.first_agg.0) + a + s > u64::from(u32::MAX)
                {
                    return Err(bad("a shape out of range"));
                }
                r.shape = Some(shape);
            }
            "savepoint" if format >= 5 => r.savepoint = true,
            "manifest" => {
                let crc = p.get(2).and_then(|c| u32::from_str_radix(c, 16).ok()).ok_or_else(|| bad("bad crc"))?;
                r.manifests.insert(TaskId(n(1)? as u32), crc);
            }
            _ => return Err(bad("unknown line")),
        }
    }
    match (id, kind, ts) {
        (Some(id), Some(_), Some(ts)) if own_point => Ok(CommitRecord { id, kind: RecordKind::Consensus(id), ts, ..r }),
        (Some(id), Some(RecordKind::Consensus(to)), Some(_)) if to >= id => Err(bad("a consensus at or above its id")),
        (Some(id), Some(kind), Some(ts)) => Ok(CommitRecord { id, kind, ts, ..r }),
        _ => Err(bad("id, kind or ts missing")),
    }
}

/// The last durable commit of `stream` in `store` (the highest id whose record verifies).
pub fn last_commit(store: &dyn Store, stream: StreamId) -> Result<Option<CommitRecord>, StoreError> {
    Ok(last_commit_in(store, stream, None)?.map(|(r, _)| r))
}

/// A commit a control store lists: its id and the checksum of its record's bytes
/// ([`record_crc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// The commit's id.
    pub id: CheckpointId,
    /// CRC32C of its record as stored.
    pub crc: u32,
}

/// The checksum a [`Point`] names a record by.
pub fn record_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The id in a commit record's key (`<stream>/checkpoints/<id>.commit`).
pub fn id_of_key(key: &str) -> Option<CheckpointId> {
    key.rsplit('/').next()?.strip_suffix(".commit")?.parse().ok().map(CheckpointId)
}

/// Whether the record `bytes` stored under `key` is one `listed` names (id and checksum).
pub fn is_listed(listed: &[Point], key: &str, bytes: &[u8]) -> bool {
    let Some(id) = id_of_key(key) else { return false };
    listed.iter().any(|p| p.id == id && p.crc == record_crc(bytes))
}

/// The last commit of `stream` among those `listed` (`None`: every record in the store), with
/// its record's checksum: the newest listed one whose record is there as listed and decodes.
/// A record a control store does not list is no commit (one whose commit it refused, one in
/// flight, or one a deposed coordinator wrote over a listed one).
pub fn last_commit_in(
    store: &dyn Store,
    stream: StreamId,
    listed: Option<&[Point]>,
) -> Result<Option<(CommitRecord, u32)>, StoreError> {
    let keys = match listed {
        Some(l) => l.iter().rev().map(|p| commit_key(stream, p.id)).collect(),
        None => store.list(&format!("{}/checkpoints/", stream.0))?.into_iter().rev().collect::<Vec<_>>(),
    };
    for key in keys {
        let bytes = match store.get_at_most(&key, super::MAX_RECORD) {
            Ok(b) => b,
            Err(e @ StoreError::TooLarge { .. }) => {
                tracing::error!(%key, error = %e, "skipping a commit record no Weir wrote");
                continue;
            }
            Err(StoreError::NotFound { .. }) if listed.is_some() => {
                tracing::error!(%key, "a commit record the control store lists is missing: going back to the one before");
                continue;
            }
            Err(e) => return Err(e),
        };
        if listed.is_some_and(|l| !is_listed(l, &key, &bytes)) {
            // Replaced (or damaged) since it was committed: the previous one is still a restore point.
            tracing::error!(%key, "skipping a commit record that is not the one committed");
            continue;
        }
        match decode_commit(&key, &bytes) {
            Ok(r) => return Ok(Some((r, record_crc(&bytes)))),
            // A damaged record is skipped, loudly: the previous one is still a restore point.
            Err(e) => tracing::error!(%key, error = %e, "skipping a damaged commit record"),
        }
    }
    Ok(None)
}

/// What became of a commit record's write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitWrite {
    /// The record is in the store, as written.
    Durable,
    /// The record is not in the store, or not committed (retryable: the next checkpoint tries
    /// again).
    Failed(String),
    /// The record may not be committed by this coordinator (`commit_point`'s fence, or a
    /// record older than the point): fatal for its run.
    Refused(String),
}

/// Writes the commit record, and reads it back when the put reports an error: the record may
/// be visible although the put failed, and a visible record is a restore point.
pub fn write_commit(store: &dyn Store, stream: StreamId, record: &CommitRecord) -> CommitWrite {
    let key = commit_key(stream, record.id);
    let text = encode_commit(record);
    let Err(put) = store.put(&key, text.as_bytes()) else { return CommitWrite::Durable };
    match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(bytes) if bytes == text.as_bytes() => {
            tracing::warn!(%key, error = %put, "the commit record's write reported an error, but it is stored");
            CommitWrite::Durable
        }
        Ok(_) | Err(StoreError::NotFound { .. }) => CommitWrite::Failed(put.to_string()),
        // Neither written for sure nor absent for sure: the commit fails here, and whatever it
        // names stays (a reset deletes no snapshot a commit may name).
        Err(get) => CommitWrite::Failed(format!("{put}; reading it back: {get}")),
    }
}

/// The commit record of checkpoint `id` (`None` when there is none: a point the tasks' consensus
/// chose has no record of its own id).
pub fn read_commit(store: &dyn Store, stream: StreamId, id: CheckpointId) -> Result<Option<CommitRecord>, StoreError> {
    let key = commit_key(stream, id);
    match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(bytes) => decode_commit(&key, &bytes).map(Some),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Encodes the id record.
pub fn encode_ids(r: &IdRecord) -> String {
    seal(format!("weir-ids 1\nnext-id {}\nnext-trans {}\n", r.next_id.0, r.next_trans.0))
}

/// Decodes and checks the id record.
pub fn decode_ids(key: &str, bytes: &[u8]) -> Result<IdRecord, StoreError> {
    let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
    let body = unseal(key, bytes)?;
    let mut lines = body.lines();
    if lines.next() != Some("weir-ids 1") {
        return Err(bad("not an id record"));
    }
    let mut field = |name: &str| -> Result<u64, StoreError> {
        let l = lines.next().ok_or_else(|| bad("truncated"))?;
        l.strip_prefix(name).and_then(|v| v.trim().parse().ok()).ok_or_else(|| bad("bad field"))
    };
    Ok(IdRecord { next_id: CheckpointId(field("next-id ")?), next_trans: TransId(field("next-trans ")?) })
}

/// The coordinator's id record: the default when there is none, an error when it cannot be read.
pub fn read_ids(store: &dyn Store, stream: StreamId) -> Result<IdRecord, StoreError> {
    let key = ids_key(stream);
    match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(bytes) => decode_ids(&key, &bytes),
        Err(StoreError::NotFound { .. }) => Ok(IdRecord::default()),
        Err(e) => Err(e),
    }
}

/// Writes the id record durably.
pub fn write_ids(store: &dyn Store, stream: StreamId, r: &IdRecord) -> Result<(), StoreError> {
    store.put(&ids_key(stream), encode_ids(r).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::LocalDirStore;

    fn rec(id: u64) -> CommitRecord {
        CommitRecord {
            id: CheckpointId(id),
            kind: RecordKind::Commit(TransId(id)),
            versions: Default::default(),
            manifests: Default::default(),
            ts: 0,
            shape: None,
            savepoint: false,
        }
    }

    #[test]
    fn commit_records_roundtrip_and_damage_is_refused() {
        let r = CommitRecord {
            id: CheckpointId(12),
            kind: RecordKind::Commit(TransId(5)),
            versions: [(TaskId(0), Version(4096)), (TaskId(1), Version(77))].into_iter().collect(),
            manifests: [(TaskId(0), 0xdead_beef), (TaskId(2), 7)].into_iter().collect(),
            ts: 1_700_000_000_000,
            shape: None,
            savepoint: false,
        };
        let text = encode_commit(&r);
        assert!(text.starts_with("weir-commit 2\n"), "what an older Weir reads stays in its format");
        assert_eq!(decode_commit("k", text.as_bytes()).unwrap(), r);
        let shaped = CommitRecord {
            shape: Some(Shape { first_agg: TaskId(9), aggs: 5, sinks: 2 }),
            savepoint: true,
            ..r.clone()
        };
        let text5 = encode_commit(&shaped);
        assert!(text5.starts_with("weir-commit 5\n"), "{text5}");
        assert_eq!(decode_commit("k", text5.as_bytes()).unwrap(), shaped);
        let shape = shaped.shape.unwrap();
        assert_eq!(shape.agg_tasks().collect::<Vec<_>>(), (9..14).map(TaskId).collect::<Vec<_>>());
        assert_eq!(shape.sink_tasks().collect::<Vec<_>>(), vec![TaskId(14), TaskId(15)]);
        for bad in ["shape 9 0 2", "shape 9 5000 2", "shape 4294967295 5 2", "shape 9 99999999999 2"] {
            let text = seal(format!("weir-commit 5\nid 12\ntrans 5\nts 1\n{bad}\nsavepoint\n"));
            assert!(decode_commit("k", text.as_bytes()).is_err(), "{bad}");
        }
        // A commit that is no savepoint names no shape: an older Weir reads it.
        assert!(
            encode_commit(&CommitRecord { savepoint: false, shape: None, ..shaped }).starts_with("weir-commit 2\n")
        );
        let edited = text.replace("version 0 4096", "version 0 4097");
        assert!(matches!(decode_commit("k", edited.as_bytes()), Err(StoreError::Corrupt { .. })));
        assert!(decode_commit("k", &text.as_bytes()[..text.len() - 3]).is_err());
        let without_id = seal("weir-commit 2\ntrans 5\nts 1\n".into());
        assert!(decode_commit("k", without_id.as_bytes()).is_err(), "a record without an id is not id 0");
        let two_kinds = seal("weir-commit 2\nid 3\ntrans 5\nfresh\nts 1\n".into());
        assert!(decode_commit("k", two_kinds.as_bytes()).is_err(), "a commit and a fresh start at once");
        for r in [
            CommitRecord::consensus(CheckpointId(42), CheckpointId(3), 9),
            CommitRecord::fresh(CheckpointId(40), 9),
            CommitRecord::fallback(CheckpointId(41), CheckpointId(3), 9),
        ] {
            assert_eq!(decode_commit("k", encode_commit(&r).as_bytes()).unwrap(), r);
        }
    }

    #[test]
    fn only_a_fallback_record_needs_format_3_and_older_formats_cannot_say_it() {
        let fallback = encode_commit(&CommitRecord::fallback(CheckpointId(41), CheckpointId(3), 9));
        assert!(fallback.starts_with("weir-commit 3\n"), "{fallback}");
        assert!(encode_commit(&rec(4)).starts_with("weir-commit 2\n"), "what format 2 says stays format 2");
        let in_2 = seal("weir-commit 2\nid 41\nfallback 3\nts 1\n".into());
        assert!(decode_commit("k", in_2.as_bytes()).is_err(), "format 2 has no fallback records");
        let future = seal("weir-commit 5\nid 41\nts 1\n".into());
        assert!(decode_commit("k", future.as_bytes()).is_err(), "a newer format is refused, not misread");
    }

    #[test]
    fn a_consensus_record_has_an_id_of_its_own_in_format_4_and_an_older_one_points_at_its_id() {
        let consensus = encode_commit(&CommitRecord::consensus(CheckpointId(42), CheckpointId(3), 9));
        assert!(consensus.starts_with("weir-commit 4\n"), "format 3 readers would take the id for the point");
        let in_2 = seal("weir-commit 2\nid 7\nconsensus\nts 1\n".into());
        let old = CommitRecord::consensus(CheckpointId(7), CheckpointId(7), 1);
        assert_eq!(decode_commit("k", in_2.as_bytes()).unwrap(), old);
        assert_eq!(encode_commit(&old), in_2, "an older consensus is written back as it was");
        for bad in [
            "weir-commit 2\nid 7\nconsensus 3\nts 1\n",
            "weir-commit 3\nid 7\nconsensus 3\nts 1\n",
            "weir-commit 4\nid 7\nconsensus\nts 1\n",
            "weir-commit 4\nid 7\nconsensus 7\nts 1\n",
            "weir-commit 4\nid 7\nconsensus 9\nts 1\n",
        ] {
            assert!(decode_commit("k", seal(bad.into()).as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_format_1_record_still_reads() {
        let commit = seal("weir-commit 1\nid 7\ntrans 5\nts 1\nversion 0 10\n".into());
        let r = decode_commit("k", commit.as_bytes()).unwrap();
        assert_eq!(
            (r.id, r.kind, r.versions.get(&TaskId(0))),
            (CheckpointId(7), RecordKind::Commit(TransId(5)), Some(&Version(10)))
        );
        let consensus = seal("weir-commit 1\nid 7\ntrans 0\nts 1\n".into());
        assert_eq!(
            decode_commit("k", consensus.as_bytes()).unwrap(),
            CommitRecord::consensus(CheckpointId(7), CheckpointId(7), 1)
        );
        let fresh_in_1 = seal("weir-commit 1\nid 7\nfresh\nts 1\n".into());
        assert!(decode_commit("k", fresh_in_1.as_bytes()).is_err(), "format 1 has no fresh records");
    }

    #[test]
    fn the_last_commit_skips_a_damaged_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        store.put(&commit_key(StreamId(1), CheckpointId(1)), encode_commit(&rec(1)).as_bytes()).unwrap();
        store.put(&commit_key(StreamId(1), CheckpointId(2)), encode_commit(&rec(2)).as_bytes()).unwrap();
        assert_eq!(last_commit(&store, StreamId(1)).unwrap().map(|r| r.id), Some(CheckpointId(2)));
        store.put(&commit_key(StreamId(1), CheckpointId(2)), b"garbage").unwrap();
        assert_eq!(last_commit(&store, StreamId(1)).unwrap().map(|r| r.id), Some(CheckpointId(1)));
        assert_eq!(last_commit(&store, StreamId(9)).unwrap(), None);
    }

    /// A store whose puts store the object and then report an error (a lost answer), or fail
    /// outright.
    fn lossy(dir: &std::path::Path, store_then_fail: bool) -> crate::backup::test_store::HookedStore {
        crate::backup::test_store::HookedStore::new(LocalDirStore::new(dir), move |inner, key, bytes| {
            if store_then_fail {
                inner.put(key, bytes)?;
            }
            Err(StoreError::Unavailable { op: "put", key: key.into(), reason: "connection reset".into() })
        })
    }

    #[test]
    fn a_commit_record_stored_despite_an_error_counts_as_durable() {
        let dir = tempfile::tempdir().unwrap();
        let stored = lossy(&dir.path().join("a"), true);
        assert_eq!(write_commit(&stored, StreamId(1), &rec(3)), CommitWrite::Durable);
        assert_eq!(last_commit(&stored, StreamId(1)).unwrap(), Some(rec(3)));
        let lost = lossy(&dir.path().join("b"), false);
        assert!(
            matches!(write_commit(&lost, StreamId(1), &rec(3)), CommitWrite::Failed(w) if w.contains("connection reset"))
        );
        assert_eq!(last_commit(&lost, StreamId(1)).unwrap(), None);
    }

    #[test]
    fn a_damaged_id_record_is_an_error_not_a_start_at_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        assert_eq!(read_ids(&store, StreamId(1)).unwrap(), IdRecord::default(), "no record: start at 1");
        let r = IdRecord { next_id: CheckpointId(513), next_trans: TransId(600) };
        write_ids(&store, StreamId(1), &r).unwrap();
        assert_eq!(read_ids(&store, StreamId(1)).unwrap(), r);
        store.put(&ids_key(StreamId(1)), b"513").unwrap();
        assert!(matches!(read_ids(&store, StreamId(1)), Err(StoreError::Corrupt { .. })));
    }
}
