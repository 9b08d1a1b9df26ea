//! What a node keeps on disk of the catalog's streams: where each stream's data lives, its
//! removal once dropped, and the catalog's high-water mark.
//!
//! Invariants: nothing is removed but the data of a stream a catalog at or above the
//! high-water mark says is dropped, or no longer lists though its id is below the next to
//! assign. The high-water mark (`<data_dir>/catalog-next`, the largest next id any catalog
//! read here had, with the catalog's lineage) only grows: a catalog below it, or of another
//! lineage, was lost or reset, and the node acts on nothing it says (it would re-assign ids
//! whose data, checkpoints and placement still exist, and drop streams it does not list).

use std::path::{Path, PathBuf};

use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{Catalog, StreamEntry};

/// Where stream `entry` keeps its data on a node whose data directory is `root`: the cluster
/// file's stream (an empty spec text) at the root, as a node of one stream always has; every
/// other under `streams/<id>`.
pub fn stream_dir(root: &Path, entry: &StreamEntry) -> PathBuf {
    if entry.spec.is_empty() { root.to_path_buf() } else { root.join("streams").join(entry.id.0.to_string()) }
}

/// What the cluster file's stream keeps at the root (the rest of the root is the node's).
const ROOT_STREAM_DATA: [&str; 3] = ["tasks", "ingest", "incarnation"];

/// Removes what stream `entry` keeps on a node whose data directory is `root`.
pub fn remove_stream_data(root: &Path, entry: &StreamEntry) -> std::io::Result<()> {
    let dir = stream_dir(root, entry);
    if dir == root { remove_root_stream(root) } else { gone(std::fs::remove_dir_all(dir)) }
}

fn remove_root_stream(root: &Path) -> std::io::Result<()> {
    for name in ROOT_STREAM_DATA {
        let p = root.join(name);
        gone(if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) })?;
    }
    Ok(())
}

/// A removal of what is not there is done.
fn gone(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The ids of the streams with a directory under `<root>/streams`.
pub fn local_ids(root: &Path) -> Vec<StreamId> {
    let Ok(dirs) = std::fs::read_dir(root.join("streams")) else { return Vec::new() };
    dirs.flatten().filter_map(|d| d.file_name().to_str().and_then(|n| n.parse().ok()).map(StreamId)).collect()
}

/// Removes the data of streams `c` no longer lists (dropped while this node was away, or
/// forgotten by another node first), except those of `running` (the streams whose supervisor
/// has not ended here): directories under `streams/`, and the root's stream data when no entry
/// is the cluster file's stream.
pub fn remove_unlisted(root: &Path, c: &Catalog, running: &[&StreamEntry]) {
    for id in local_ids(root) {
        if id.0 < c.next_id && !c.streams.iter().any(|e| e.id == id) && !running.iter().any(|e| e.id == id) {
            tracing::info!(stream = id.0, "removing the data of a stream the catalog no longer lists");
            if let Err(e) = gone(std::fs::remove_dir_all(root.join("streams").join(id.0.to_string()))) {
                tracing::warn!(stream = id.0, error = %e, "cannot remove the data of a dropped stream");
            }
        }
    }
    let file_stream = c.streams.iter().chain(running.iter().copied()).any(|e| e.spec.is_empty());
    if !file_stream && ROOT_STREAM_DATA.iter().any(|n| root.join(n).exists()) {
        tracing::info!("removing the data of the cluster file's stream: the catalog no longer lists it");
        if let Err(e) = remove_root_stream(root) {
            tracing::warn!(error = %e, "cannot remove the data of the cluster file's dropped stream");
        }
    }
}

/// The catalog a node has seen: its lineage and the largest next id it had.
pub struct HighWater {
    path: PathBuf,
    /// 0: no catalog seen here yet.
    lineage: u64,
    next: u64,
}

impl HighWater {
    /// The mark of the node whose data directory is `root` (none: no catalog was read here).
    pub fn open(root: &Path) -> anyhow::Result<HighWater> {
        let path = root.join("catalog-next");
        let bad = |t: &str| anyhow::anyhow!("{} holds {t:?}, not a lineage and a stream id", path.display());
        let (lineage, next) = match std::fs::read_to_string(&path) {
            Ok(t) => {
                let mut w = t.split_whitespace().map(str::parse::<u64>);
                match (w.next(), w.next(), w.next()) {
                    (Some(Ok(l)), Some(Ok(n)), None) => (l, n),
                    _ => return Err(bad(&t)),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, 1),
            Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        };
        Ok(HighWater { path, lineage, next })
    }

    /// Whether this node has seen a catalog.
    pub fn seen(&self) -> bool {
        self.lineage != 0
    }

    /// The next id the catalog must at least have.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Why `c` is not the catalog this node has seen (another lineage, or one that went back),
    /// if it is not.
    pub fn check(&self, c: &Catalog) -> Result<(), String> {
        let after = "it was lost and written anew, or reset";
        let what = "this node acts on nothing it says until it is restored (or catalog-next and streams/ are \
                    removed from the data directory, to start over)";
        if self.lineage != 0 && c.lineage != self.lineage {
            return Err(format!(
                "the stream catalog is not the one this node has seen (lineage {:x}, not {:x}): {after}; {what}",
                c.lineage, self.lineage
            ));
        }
        if c.next_id < self.next {
            return Err(format!(
                "the stream catalog went back (its next id is {}, this node has seen {}): {after}; {what}",
                c.next_id, self.next
            ));
        }
        Ok(())
    }

    /// Takes `c` in: `Err` (why) when it is not the catalog seen here ([`HighWater::check`]);
    /// raises the mark to it otherwise.
    pub fn take(&mut self, c: &Catalog) -> Result<(), String> {
        self.check(c)?;
        if c.next_id > self.next || c.lineage != self.lineage {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            crate::failover::replace(dir, &self.path, &format!("{} {}\n", c.lineage, c.next_id))
                .map_err(|e| format!("{e:#}"))?;
            (self.lineage, self.next) = (c.lineage, c.next_id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use weir_engine::wire::msg::StreamState;

    use super::*;

    fn entry(id: u64, spec: &str) -> StreamEntry {
        StreamEntry {
            id: StreamId(id),
            name: format!("s{id}"),
            state: StreamState::Running,
            spec: spec.into(),
            created_ms: 0,
        }
    }

    fn catalog(lineage: u64, next_id: u64, streams: Vec<StreamEntry>) -> Catalog {
        Catalog { lineage, next_id, streams }
    }

    #[test]
    fn a_catalog_that_went_back_or_of_another_lineage_is_refused_and_the_mark_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut mark = HighWater::open(dir.path()).unwrap();
        assert!(!mark.seen() && mark.next() == 1);
        mark.take(&catalog(7, 5, vec![])).unwrap();
        let mut again = HighWater::open(dir.path()).unwrap();
        assert!(again.seen() && again.next() == 5);
        let e = again.take(&catalog(7, 2, vec![entry(1, "")])).unwrap_err();
        assert!(e.contains("went back"), "{e}");
        // A catalog written anew that has caught up is still another one.
        let e = again.take(&catalog(8, 9, vec![])).unwrap_err();
        assert!(e.contains("not the one this node has seen"), "{e}");
        again.take(&catalog(7, 6, vec![])).unwrap();
        assert_eq!(HighWater::open(dir.path()).unwrap().next(), 6);
        std::fs::write(dir.path().join("catalog-next"), "6\n").unwrap();
        assert!(HighWater::open(dir.path()).is_err(), "a damaged mark is an error, not a fresh start");
    }

    #[test]
    fn only_unlisted_streams_below_the_next_id_lose_their_data() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for id in [2, 3, 4, 9] {
            std::fs::create_dir_all(root.join("streams").join(id.to_string()).join("tasks")).unwrap();
        }
        std::fs::create_dir_all(root.join("tasks/0")).unwrap();
        std::fs::write(root.join("incarnation"), "4\n").unwrap();
        std::fs::write(root.join("process"), "4\n").unwrap();
        // 2 is listed, 3 runs here still, 4 is gone from the catalog, 9 is past its next id.
        let c = catalog(7, 8, vec![entry(1, ""), entry(2, "x")]);
        remove_unlisted(root, &c, &[&entry(3, "x")]);
        let mut left: Vec<u64> = local_ids(root).into_iter().map(|i| i.0).collect();
        left.sort();
        assert_eq!(left, [2, 3, 9]);
        assert!(root.join("tasks").exists(), "the file's stream is listed: its data stays");
        // The file's stream dropped: the root's stream data goes, the node's stays.
        let c = catalog(7, 8, vec![entry(2, "x")]);
        remove_unlisted(root, &c, &[&entry(1, "")]);
        assert!(root.join("tasks").exists(), "its supervisor still runs: its data stays");
        remove_unlisted(root, &c, &[]);
        assert!(!root.join("tasks").exists() && !root.join("incarnation").exists());
        assert!(root.join("process").exists(), "the node's own files stay");
    }
}
