//! The removal of dropped streams' checkpoints (every object under `<id>/` in the remote store)
//! and control keys (`/weir/<cluster>/streams/<id>/` in etcd) once a drop's grace period is
//! over ([`Purges`], asked by `Streams::sweep`), each on a thread of its own, so that a slow
//! store never holds up the catalog loop.
//!
//! Invariants: a purge starts only once the grace period is over both on the wall clock of the
//! node that took the drop (`since_ms`) and on this node's monotonic clock since it first saw
//! the drop (a skewed clock does not shorten it); at most one purge per stream runs here; a
//! purge that failed is tried again after [`RETRY`]. Several nodes purging at once is harmless:
//! a delete of what is gone is no error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_engine::wire::StreamId;

use super::stream::NodeParts;

/// How long a failed purge waits before it is tried again.
const RETRY: Duration = Duration::from_secs(10);

type Outcome = Result<(usize, usize), String>;

/// The purges of a node.
pub(super) struct Purges {
    parts: Arc<NodeParts>,
    /// When this node first saw each drop.
    seen: BTreeMap<StreamId, Instant>,
    running: BTreeMap<StreamId, JoinHandle<Outcome>>,
    retry_at: BTreeMap<StreamId, Instant>,
}

impl Purges {
    pub fn new(parts: Arc<NodeParts>) -> Self {
        Purges { parts, seen: BTreeMap::new(), running: BTreeMap::new(), retry_at: BTreeMap::new() }
    }

    /// Whether the grace period of the drop of `id` (taken at `since_ms`, another node's wall
    /// clock maybe) is over: on that clock and on this node's since it first saw the drop.
    pub fn due(&mut self, id: StreamId, since_ms: u64, now_ms: u64) -> bool {
        let grace = self.parts.file.drop_grace;
        let first = *self.seen.entry(id).or_insert_with(Instant::now);
        since_ms.saturating_add(grace.as_millis() as u64) <= now_ms && first.elapsed() >= grace
    }

    /// Starts removing `id`'s checkpoints and keys, unless a purge of it runs or waits to be
    /// tried again.
    pub fn start(&mut self, id: StreamId) {
        if self.running.contains_key(&id) || self.retry_at.get(&id).is_some_and(|at| Instant::now() < *at) {
            return;
        }
        let parts = self.parts.clone();
        let spawned = std::thread::Builder::new().name(format!("purge-{}", id.0)).spawn(move || purge(&parts, id));
        match spawned {
            Ok(h) => {
                self.running.insert(id, h);
            }
            Err(e) => {
                tracing::warn!(stream = id.0, error = %e, "cannot start the dropped stream's purge");
                self.retry_at.insert(id, Instant::now() + RETRY);
            }
        }
    }

    /// The streams whose purge has ended well since the last call (their entries may go); a
    /// failed one waits [`RETRY`] before it may start again.
    pub fn done(&mut self) -> Vec<StreamId> {
        let ended: Vec<StreamId> = self.running.iter().filter(|(_, h)| h.is_finished()).map(|(id, _)| *id).collect();
        let mut ok = Vec::new();
        for id in ended {
            let Some(h) = self.running.remove(&id) else { continue };
            match h.join().unwrap_or_else(|_| Err("the purge panicked".into())) {
                Ok((objects, keys)) => {
                    tracing::info!(
                        stream = id.0,
                        objects,
                        keys,
                        "the dropped stream's checkpoints and control keys are gone"
                    );
                    self.retry_at.remove(&id);
                    ok.push(id);
                }
                Err(why) => {
                    let after = humantime::format_duration(RETRY);
                    tracing::warn!(stream = id.0, error = %why, "cannot remove the dropped stream's checkpoints yet; trying again in {after}");
                    self.retry_at.insert(id, Instant::now() + RETRY);
                }
            }
        }
        ok
    }

    /// `id` has left the catalog: nothing of it is kept here but a purge under way.
    pub fn forget(&mut self, id: StreamId) {
        self.seen.remove(&id);
        self.retry_at.remove(&id);
    }
}

/// Removes `id`'s objects from the remote store and its keys from etcd: how many of each.
fn purge(parts: &NodeParts, id: StreamId) -> Outcome {
    let objects = match &parts.base.checkpoint {
        Some(ck) => weir_engine::backup::purge::remove_stream(ck.open_store().as_ref(), id).map_err(|e| e.to_string()),
        None => Ok(0),
    };
    let keys = parts.control.remove_stream_keys(id).map_err(|e| e.to_string());
    match (objects, keys) {
        (Ok(objects), Ok(keys)) => Ok((objects, keys)),
        (objects, keys) => Err([objects.err(), keys.err()].into_iter().flatten().collect::<Vec<_>>().join("; ")),
    }
}
