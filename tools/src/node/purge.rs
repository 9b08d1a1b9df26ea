//! The removal of dropped streams' checkpoints (every object under `<id>/` in the remote store)
//! and control keys (`/weir/<cluster>/streams/<id>/` in etcd) once a drop's grace period is
//! over ([`Purges`], driven by `Streams::sweep`), each on a thread of its own, so that a slow
//! store never holds up the catalog loop.
//!
//! Invariants: a purge starts only once the grace period is over both on the wall clock of the
//! node that took the drop (`since_ms`) and on this node's monotonic clock since it first saw
//! the drop (a skewed clock does not shorten it); at most one purge per stream runs here; a
//! failed one is tried again after [`RETRY`], a done one is not done again. A purge thread holds
//! only the store and etcd handles, never the node. Several nodes purging at once is harmless: a
//! delete of what is gone is no error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_engine::cluster::Keys;
use weir_engine::control::ControlStore;
use weir_engine::runtime::CheckpointSettings;
use weir_engine::wire::StreamId;

/// How long a failed purge waits before it is tried again.
const RETRY: Duration = Duration::from_secs(10);

type Outcome = Result<(usize, usize), String>;

/// What a purge removes from: the remote store (none without checkpoints) and etcd (none
/// without it).
#[derive(Clone)]
pub(super) struct Targets {
    pub checkpoint: Option<CheckpointSettings>,
    pub etcd: Option<(Arc<dyn ControlStore>, Keys)>,
}

/// The purges of a node.
pub(super) struct Purges {
    targets: Targets,
    grace: Duration,
    /// When this node first saw each drop.
    seen: BTreeMap<StreamId, Instant>,
    running: BTreeMap<StreamId, JoinHandle<Outcome>>,
    retry_at: BTreeMap<StreamId, Instant>,
    /// Purged: their entries may go.
    purged: BTreeSet<StreamId>,
    /// Streams no longer in the catalog whose run wound down here after their purge: purged
    /// again (what the run uploaded meanwhile) until that is done.
    orphans: BTreeSet<StreamId>,
}

impl Purges {
    pub fn new(targets: Targets, grace: Duration) -> Self {
        Purges {
            targets,
            grace,
            seen: BTreeMap::new(),
            running: BTreeMap::new(),
            retry_at: BTreeMap::new(),
            purged: BTreeSet::new(),
            orphans: BTreeSet::new(),
        }
    }

    /// Notes the drop of `id` (taken at `since_ms`, another node's wall clock maybe) as seen
    /// now, if it was not, and says whether its grace period is over: on that clock and on this
    /// node's since it first saw the drop.
    pub fn seen_and_due(&mut self, id: StreamId, since_ms: u64, now_ms: u64) -> bool {
        let first = *self.seen.entry(id).or_insert_with(Instant::now);
        since_ms.saturating_add(self.grace.as_millis() as u64) <= now_ms && first.elapsed() >= self.grace
    }

    /// Starts removing `id`'s checkpoints and keys, unless that is done, under way or waits to
    /// be tried again.
    pub fn start(&mut self, id: StreamId) {
        let waits = self.retry_at.get(&id).is_some_and(|at| Instant::now() < *at);
        if self.purged.contains(&id) || self.running.contains_key(&id) || waits {
            return;
        }
        let targets = self.targets.clone();
        match std::thread::Builder::new().name(format!("purge-{}", id.0)).spawn(move || purge(&targets, id)) {
            Ok(h) => {
                self.running.insert(id, h);
            }
            Err(e) => {
                tracing::warn!(stream = id.0, error = %e, "cannot start the dropped stream's purge");
                self.retry_at.insert(id, Instant::now() + RETRY);
            }
        }
    }

    /// Purges `id` again: it has left the catalog, but a run of it wound down here after it was
    /// purged.
    pub fn again(&mut self, id: StreamId) {
        self.purged.remove(&id);
        self.orphans.insert(id);
        self.start(id);
    }

    /// Collects the purges that ended (a failed one waits [`RETRY`]), retries the orphans', and
    /// says which streams are purged: their entries may go.
    pub fn poll(&mut self) -> Vec<StreamId> {
        let ended: Vec<StreamId> = self.running.iter().filter(|(_, h)| h.is_finished()).map(|(id, _)| *id).collect();
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
                    self.orphans.remove(&id);
                    self.purged.insert(id);
                }
                Err(why) => {
                    let after = humantime::format_duration(RETRY);
                    tracing::warn!(stream = id.0, error = %why, "cannot remove the dropped stream's checkpoints yet; trying again in {after}");
                    self.retry_at.insert(id, Instant::now() + RETRY);
                }
            }
        }
        let orphans: Vec<StreamId> = self.orphans.iter().copied().collect();
        orphans.into_iter().for_each(|id| self.start(id));
        self.purged.iter().copied().filter(|id| !self.orphans.contains(id)).collect()
    }

    /// Keeps only what concerns the streams `listed` (the catalog's), the orphans and the
    /// purges under way.
    pub fn retain(&mut self, listed: &BTreeSet<StreamId>) {
        let keep = |id: &StreamId| listed.contains(id) || self.orphans.contains(id) || self.running.contains_key(id);
        let keep: BTreeSet<StreamId> =
            self.seen.keys().chain(self.retry_at.keys()).chain(self.purged.iter()).copied().filter(keep).collect();
        self.seen.retain(|id, _| keep.contains(id));
        self.retry_at.retain(|id, _| keep.contains(id));
        self.purged.retain(|id| keep.contains(id));
    }
}

/// Removes `id`'s objects from the remote store and its keys from etcd: how many of each.
fn purge(t: &Targets, id: StreamId) -> Outcome {
    let objects = match &t.checkpoint {
        Some(ck) => weir_engine::backup::purge::remove_stream(ck.open_store().as_ref(), id).map_err(|e| e.to_string()),
        None => Ok(0),
    };
    let keys = match &t.etcd {
        Some((store, keys)) => {
            weir_engine::cluster::catalog::remove_stream_keys(store.as_ref(), keys, id).map_err(|e| e.to_string())
        }
        None => Ok(0),
    };
    match (objects, keys) {
        (Ok(objects), Ok(keys)) => Ok((objects, keys)),
        (objects, keys) => Err([objects.err(), keys.err()].into_iter().flatten().collect::<Vec<_>>().join("; ")),
    }
}
