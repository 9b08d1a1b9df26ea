//! Removes everything a dropped stream has in the remote store: every object under its id's
//! prefix (`<id>/`: commit records, checkpoint folders, shared SST files, upload-ahead records,
//! ingest floors, the coordinator's ids). Ids are never reused, so nothing of another stream is
//! under it, and a stream created again under the dropped one's name has another id.

use weir_wire::StreamId;

use super::{Store, StoreError};

/// The prefix of every object of `stream` in the store.
fn stream_prefix(stream: StreamId) -> String {
    format!("{}/", stream.0)
}

/// Deletes every object of `stream` from `store`: how many there were. Safe to call again after
/// an error, or from several nodes at once (a delete of what is gone is no error).
pub fn remove_stream(store: &dyn Store, stream: StreamId) -> Result<usize, StoreError> {
    let keys = store.list(&stream_prefix(stream))?;
    store.delete_many(&keys)?;
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::LocalDirStore;

    #[test]
    fn a_dropped_streams_objects_go_and_no_other_streams() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        for key in ["2/checkpoints/1.commit", "2/tasks/3/chk-1/MANIFEST.weir", "20/checkpoints/1.commit", "12/x"] {
            store.put(key, b"x").unwrap();
        }
        assert_eq!(remove_stream(&store, StreamId(2)).unwrap(), 2);
        assert_eq!(store.list("").unwrap(), ["12/x", "20/checkpoints/1.commit"]);
        assert_eq!(remove_stream(&store, StreamId(2)).unwrap(), 0, "again: nothing left");
    }
}
