//! The ahead record: which files a run of a stream stored ahead of its checkpoints, one record
//! per task, run and node (`<stream>/ahead/<task>/<incarnation>-<node>.weir`, sealed). The
//! upload-ahead thread writes it; retention reads it and keeps every file it names.

use weir_wire::{NodeId, StreamId, TaskId};

use super::super::{StoreError, seal, unseal};

/// Who writes an ahead record: one run of the stream (its epoch, which is its nodes'
/// incarnation unless the run sets one) on one node. Each writer
/// has a key of its own, so a run that lost its task without knowing it (paused while the task
/// moved) cannot overwrite the record of the task's new node, which would let retention delete
/// files that node's checkpoints skip as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AheadWriter {
    /// The run's epoch (every node of a run has the same; a newer run a higher one).
    pub incarnation: u64,
    /// The node.
    pub node: NodeId,
}

/// The key of task `task`'s ahead record written by `writer`.
pub fn ahead_record_key(stream: StreamId, task: TaskId, writer: AheadWriter) -> String {
    format!("{}/ahead/{}/{}-{}.weir", stream.0, task.0, writer.incarnation, writer.node.0)
}

/// The incarnation of the run that wrote the ahead record at `key` (0 for a key not of that
/// shape: a record of one key per task, which no running Weir writes).
pub fn record_incarnation(key: &str) -> u64 {
    key.rsplit('/').next().and_then(|f| f.split_once('-')).and_then(|(i, _)| i.parse().ok()).unwrap_or(0)
}

const RECORD_HEAD: &str = "weir ahead 1\n";

/// An ahead record naming `keys`.
pub fn encode_record(keys: &[String]) -> String {
    let mut text = String::from(RECORD_HEAD);
    for k in keys {
        text.push_str("key ");
        text.push_str(k);
        text.push('\n');
    }
    seal(text)
}

/// The keys an ahead record names.
pub fn decode_record(key: &str, bytes: &[u8]) -> Result<Vec<String>, StoreError> {
    let body = unseal(key, bytes)?;
    let bad = |reason: &str| StoreError::Corrupt { key: key.into(), reason: reason.into() };
    let rest = body.strip_prefix(RECORD_HEAD).ok_or_else(|| bad("not an ahead record of format 1"))?;
    rest.lines()
        .map(|l| {
            let k = l.strip_prefix("key ").ok_or_else(|| bad("bad line"))?;
            super::super::check_key(key, k)?;
            Ok(k.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: StreamId = StreamId(1);
    const T: TaskId = TaskId(4);

    #[test]
    fn each_run_and_node_writes_a_record_of_its_own_whose_key_names_its_incarnation() {
        let old = AheadWriter { incarnation: 3 << 32, node: NodeId(1) };
        let new = AheadWriter { incarnation: (4 << 32) + 1, node: NodeId(2) };
        let (a, b) = (ahead_record_key(S, T, old), ahead_record_key(S, T, new));
        assert_ne!(a, b, "a paused old owner's record is not the new owner's");
        assert!(a.starts_with("1/ahead/4/") && b.starts_with("1/ahead/4/"), "{a} {b}");
        assert_eq!(record_incarnation(&a), 3 << 32);
        assert_eq!(record_incarnation(&b), (4 << 32) + 1);
        assert_eq!(record_incarnation("1/ahead/4.weir"), 0, "one key per task: the oldest");
    }

    #[test]
    fn an_ahead_record_reads_back_and_a_damaged_one_is_refused() {
        let keys = vec!["1/tasks/4/sst/000001-0000abcd.sst".to_string(), "1/tasks/4/sst/2-1.sst".to_string()];
        let text = encode_record(&keys);
        assert_eq!(decode_record("k", text.as_bytes()).unwrap(), keys);
        assert_eq!(decode_record("k", encode_record(&[]).as_bytes()).unwrap(), Vec::<String>::new());
        let damaged = text.replace("abcd", "abce");
        assert!(matches!(decode_record("k", damaged.as_bytes()), Err(StoreError::Corrupt { .. })));
        let other = seal("weir ahead 2\n".into());
        let e = decode_record("k", other.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("format 1"), "{e}");
    }
}
