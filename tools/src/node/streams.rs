//! The streams of a `weir node`: the stream catalog and one supervisor ([`StreamRunner`]) per
//! stream of it, each on a thread of its own.
//!
//! The catalog is etcd's in a cluster (one key every node reads) and a file of the data
//! directory for a node alone; a cluster file's `[stream]` seeds it the first time. The node
//! reads it every half second and makes what runs here match it: a stream created anywhere
//! starts here, a paused or resumed one switches its run (`wish.rs`), a dropped one stops and
//! its local data goes; after the drop's grace period its checkpoints and keys go (`purge.rs`)
//! and it leaves the catalog. Clients'
//! catalog requests come from the node's router ([`CatalogCall`]); a change is answered once it
//! has taken effect here, or as retryable after [`TAKE_EFFECT`].
//!
//! Invariants: at most one supervisor per stream id; the node acts on a catalog only once it
//! has read it successfully and it is not below the node's high-water mark (`local.rs`), so a
//! lost or reset catalog neither stops streams nor removes data; once stopping, the node takes
//! no change and answers every change it holds.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use weir_engine::cluster::catalog::{self, CatalogError, CatalogStore};
use weir_engine::runtime::{CatalogCall, Standing, StandingPhase};
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{Catalog, StreamEntry, StreamState};

#[path = "requests.rs"]
mod requests;

use super::local::{self, HighWater};
use super::purge::{Purges, Targets};
use super::stream::{NodeParts, StreamRunner};
use super::wish::Wish;

/// How long a change may take to take effect on the node asked before it answers retryable.
pub const TAKE_EFFECT: Duration = Duration::from_secs(30);

/// How often the node reads the catalog.
const READ_EVERY: Duration = Duration::from_millis(500);

/// A supervisor running here.
struct Run {
    entry: StreamEntry,
    stop: Arc<AtomicBool>,
    wish: Arc<Wish>,
    thread: JoinHandle<anyhow::Result<ExitCode>>,
}

/// A client's change waiting to take effect here.
struct Pending {
    from: weir_engine::wire::NodeId,
    request: u64,
    stream: StreamId,
    effect: Effect,
    until: Instant,
}

/// What a change waits for on the node asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// The created stream has started here.
    Start,
    /// The dropped stream has stopped and its data here is gone.
    Gone,
    /// The stream runs paused (`true`) or with its tasks (`false`) here.
    Paused(bool),
    /// The stream runs paused here, and its last commit is a savepoint (`weir stream stop`).
    Stopped,
    /// The stream's supervisor runs its new spec here (a rescale).
    Respec,
}

/// The node's streams: the catalog and the supervisors running here.
pub(super) struct Streams {
    parts: Arc<NodeParts>,
    store: Box<dyn CatalogStore>,
    calls: Receiver<CatalogCall>,
    runs: BTreeMap<StreamId, Run>,
    /// Streams whose supervisor ended here, and how (not started again while the catalog keeps
    /// them running: the node stopped them, or their restart strategy gave up).
    ended: BTreeMap<StreamId, Result<(), String>>,
    pending: Vec<Pending>,
    /// The catalog as last taken in.
    catalog: Catalog,
    mark: HighWater,
    /// Why the catalog last read was not taken in (logged once).
    refused: Option<String>,
    /// Why the node exits 2: the last error a stream's supervisor ended with (its restart
    /// strategy gave up; the cluster file's stream could not start), unless the stream was
    /// dropped since; or the node was replaced, or lost the control store for good.
    failure: Option<(Option<StreamId>, anyhow::Error)>,
    /// The node stops: no change is taken, no stream started.
    stopping: bool,
    /// Dropped streams whose local data is gone here (their entries wait out the grace period).
    cleared: std::collections::BTreeSet<StreamId>,
    /// Streams whose supervisor stops for a new spec (a rescale): started again once ended.
    respec: std::collections::BTreeSet<StreamId>,
    /// The removal of dropped streams' checkpoints and control keys.
    purges: Purges,
}

impl Streams {
    pub fn new(
        parts: Arc<NodeParts>,
        store: Box<dyn CatalogStore>,
        calls: Receiver<CatalogCall>,
    ) -> anyhow::Result<Self> {
        let purging = Targets { checkpoint: parts.base.checkpoint.clone(), etcd: parts.control.store_and_keys() };
        let drop_grace = parts.file.drop_grace;
        let mark = HighWater::open(&parts.base.data_dir)?;
        Ok(Streams {
            parts,
            store,
            calls,
            runs: BTreeMap::new(),
            ended: BTreeMap::new(),
            pending: Vec::new(),
            catalog: catalog::empty(),
            mark,
            refused: None,
            failure: None,
            stopping: false,
            cleared: Default::default(),
            respec: Default::default(),
            purges: Purges::new(purging, drop_grace),
        })
    }

    /// Reads the catalog (again while the control store does not answer, until `stop`), seeding
    /// it with the cluster file's stream if it was never written: `false` when the node
    /// stopped first. A catalog missing where this node has seen one, or holds data of its
    /// streams, was lost: the node does not start (a new one would re-assign the ids whose
    /// data, checkpoints and placement still exist, and drop every stream it lacks).
    pub fn open(&mut self, stop: &AtomicBool) -> anyhow::Result<bool> {
        let file = &self.parts.file;
        let (name, id) = (file.stream_name(), StreamId(file.stream.id));
        let root = self.parts.base.data_dir.clone();
        let held: Vec<u64> = local::local_ids(&root).iter().map(|i| i.0).collect();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if let Some(why) = self.parts.node.replaced() {
                anyhow::bail!("node {}: a newer process of this node runs ({why}): this one stops", self.parts.me.id);
            }
            if let Some(fatal) = self.parts.control.fatal() {
                anyhow::bail!("{fatal}");
            }
            let read = self.store.read().and_then(|(c, rev)| {
                if rev != 0 {
                    return Ok(Some(c));
                }
                if self.mark.seen() || !held.is_empty() {
                    return Err(CatalogError::Invalid {
                        reason: format!(
                            "it is gone, but this node has seen one (its next stream id was {}) and holds data of \
                             streams {held:?} under {}: restore it (etcd's key, or <data_dir>/catalog), or remove \
                             catalog-next and streams/ from the data directory to start over",
                            self.mark.next(),
                            root.display()
                        ),
                    });
                }
                let seeded = catalog::seed(lineage()?, &name, id, "", now_ms())?;
                Ok(self.store.write(0, &seeded)?.then_some(seeded))
            });
            match read {
                Ok(Some(c)) => {
                    self.take(c);
                    if let Some(why) = &self.refused {
                        anyhow::bail!("{why}");
                    }
                    // The node said it starts the file's stream: not so when the catalog dropped it.
                    if !self.catalog.streams.iter().any(|e| e.id == id && e.state.is_kept()) {
                        self.parts.node.stand(id, None);
                    }
                    return Ok(true);
                }
                Ok(None) => {} // another node seeded it first: read again
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "cannot read the stream catalog yet; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => anyhow::bail!("reading the stream catalog: {e}"),
            }
        }
    }

    /// Takes catalog `c` in and makes what runs here match it, unless it is not the catalog
    /// this node has seen (`local::HighWater`; then nothing changes here, and changes are
    /// refused).
    fn take(&mut self, c: Catalog) {
        match self.mark.take(&c) {
            Ok(()) => {
                self.refused = None;
                self.catalog = c;
                self.reconcile();
            }
            Err(why) => {
                if self.refused.as_ref() != Some(&why) {
                    tracing::error!(reason = %why, "refusing the stream catalog");
                }
                self.refused = Some(why);
            }
        }
    }

    /// Runs the catalog's streams until the node stops (a signal in `stop`, `weir stop`, a
    /// newer process of the node), or, with `--exit-when-done`, until every stream ended here;
    /// `Err` when the last stream running here ended with one.
    pub fn serve(mut self, stop: &AtomicBool) -> anyhow::Result<ExitCode> {
        let mut read = Instant::now();
        loop {
            let node = &self.parts.node;
            if let Some(why) = node.replaced() {
                let e =
                    anyhow::anyhow!("node {}: a newer process of this node runs ({why}): this one stops", node.id());
                self.failure.get_or_insert((None, e));
            }
            if let Some(fatal) = self.parts.control.fatal() {
                self.failure.get_or_insert((None, anyhow::anyhow!("{fatal}")));
            }
            let replaced = self.failure.as_ref().is_some_and(|(s, _)| s.is_none());
            // `weir stop` reaches every supervisor itself (their engines and standings share its
            // flag, and each says why it stopped); a signal or a newer process is told here.
            let signal = stop.load(Ordering::Relaxed) || replaced;
            let asked = self.parts.base.stop_requested.load(Ordering::Acquire);
            if !self.stopping && (signal || asked) {
                self.stopping = true;
            }
            if signal {
                for r in self.runs.values() {
                    r.stop.store(true, Ordering::Relaxed);
                }
            }
            self.reap();
            // A node whose last stream failed for good exits 2, as a node of one stream always
            // has; one whose streams were dropped stays a node.
            let done = self.parts.exit_when_done && !self.ended.is_empty();
            if self.runs.is_empty() && (self.stopping || done || self.failure.is_some()) {
                self.answer_all();
                return match self.failure.take() {
                    Some((_, e)) => Err(e),
                    None => Ok(ExitCode::SUCCESS),
                };
            }
            // A supervisor whose run a peer's later run ended asks for a read at once: a pause or
            // resume elsewhere may be why.
            // Every request is taken: one read, begun after them, answers them all.
            let asked: Vec<StreamId> =
                self.runs.iter().filter(|(_, r)| r.wish.wants_read()).map(|(id, _)| *id).collect();
            if (!asked.is_empty() || read.elapsed() >= READ_EVERY) && !self.stopping {
                read = Instant::now();
                match self.store.read() {
                    Ok((c, _)) => {
                        self.take(c);
                        if self.refused.is_none() {
                            asked.iter().filter_map(|id| self.runs.get(id)).for_each(|r| r.wish.read());
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the stream catalog; what runs stays as it is"),
                }
            }
            self.answer_pending();
            match self.calls.recv_timeout(Duration::from_millis(50)) {
                Ok(call) => self.on_call(call),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Starts the streams the catalog runs that do not run here, stops those it drops, and
    /// removes the data of dropped streams no supervisor holds any more.
    fn reconcile(&mut self) {
        let entries = self.catalog.streams.clone();
        for e in &entries {
            let running = e.state.is_kept();
            match self.runs.get(&e.id) {
                Some(r) if !running && !r.stop.swap(true, Ordering::Relaxed) => {
                    tracing::info!(stream = %e.name, id = e.id.0, "the stream is dropped: stopping it on this node");
                }
                Some(r) if running && r.entry.spec != e.spec => {
                    if !r.stop.swap(true, Ordering::Relaxed) {
                        tracing::info!(stream = %e.name, id = e.id.0, "the stream's spec changed (a rescale): starting it again on this node");
                    }
                    self.respec.insert(e.id);
                }
                Some(r) if running => {
                    let paused = matches!(e.state, StreamState::Paused { .. });
                    if r.wish.set_paused(paused) {
                        let what = if paused { "paused" } else { "resumed" };
                        tracing::info!(stream = %e.name, id = e.id.0, "the stream is {what}");
                    }
                }
                Some(_) => {}
                None if running && !self.stopping && !self.ended.contains_key(&e.id) => self.start(e),
                None => {}
            }
        }
        for (id, r) in &self.runs {
            if !entries.iter().any(|e| e.id == *id) && !r.stop.swap(true, Ordering::Relaxed) {
                tracing::info!(stream = %r.entry.name, id = id.0, "the catalog no longer lists the stream: stopping it on this node");
            }
        }
        self.sweep();
    }

    /// Starts `entry`'s supervisor; a stream that cannot (a bad spec, its data directory) is
    /// logged and counted as ended with that error (the node's failure for the cluster file's
    /// stream, whose config the node was started with).
    fn start(&mut self, entry: &StreamEntry) {
        let parts = self.parts.clone();
        let runner = parts.file.stream_of(entry).and_then(|stream| {
            let mut base = parts.base.clone();
            base.data_dir = local::stream_dir(&parts.base.data_dir, entry);
            crate::settings::apply_stream(&mut base, &stream);
            let runner = StreamRunner::new(&stream, &parts.file, &base)?;
            // Each stream's metrics are labelled with its id.
            Ok(match &parts.board {
                Some(b) => runner.with_metrics(b.stream(entry.id.0, &entry.name)),
                None => runner,
            })
        });
        let runner = match runner {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(stream = %entry.name, error = %format!("{e:#}"), "the stream cannot run on this node");
                self.ended.insert(entry.id, Err(format!("{e:#}")));
                if entry.spec.is_empty() {
                    self.failure = Some((Some(entry.id), e));
                }
                return;
            }
        };
        let template = Standing {
            phase: StandingPhase::Starting,
            incarnation: runner.incarnation(),
            restarts: Vec::new(),
            info: runner.spec().info(),
            member: parts.control.member_status(),
            stop: parts.base.stop_requested.clone(),
            since: Instant::now(),
        };
        parts.node.stand(entry.id, Some(template.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let wish = Arc::new(Wish::new(matches!(entry.state, StreamState::Paused { .. })));
        let (p, s, w) = (parts.clone(), stop.clone(), wish.clone());
        let thread = std::thread::Builder::new()
            .name(format!("stream-{}", entry.id.0))
            .spawn(move || runner.run(&p, template, &s, &w));
        match thread {
            Ok(thread) => {
                tracing::info!(stream = %entry.name, id = entry.id.0, "stream supervisor started");
                self.runs.insert(entry.id, Run { entry: entry.clone(), stop, wish, thread });
            }
            Err(e) => {
                parts.node.stand(entry.id, None);
                self.ended.insert(entry.id, Err(format!("starting its supervisor thread: {e}")));
            }
        }
    }

    /// Collects the supervisors that have ended.
    fn reap(&mut self) {
        let (mut reaped, mut restart) = (false, false);
        let done: Vec<StreamId> = self.runs.iter().filter(|(_, r)| r.thread.is_finished()).map(|(id, _)| *id).collect();
        for id in done {
            let Some(r) = self.runs.remove(&id) else { continue };
            let ended = r.thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("its supervisor panicked")));
            let dropped = !self.catalog.streams.iter().any(|e| e.id == id && e.state.is_kept());
            if self.respec.remove(&id) && !dropped && !self.stopping {
                if let Err(e) = ended {
                    tracing::warn!(stream = %r.entry.name, error = %format!("{e:#}"), "the stream's old spec ended with an error");
                }
                restart = true;
                continue;
            }
            let ended = match ended {
                Ok(_) => Ok(()),
                Err(e) if dropped => {
                    tracing::warn!(stream = %r.entry.name, error = %format!("{e:#}"), "the dropped stream ended with an error");
                    Ok(())
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::error!(stream = %r.entry.name, error = %msg, "the stream stopped on this node");
                    // The node's exit code only when no other stream runs here (a stream's
                    // failure leaves the others running).
                    if self.runs.is_empty() && !self.failure.as_ref().is_some_and(|(s, _)| s.is_none()) {
                        self.failure = Some((Some(id), e));
                    }
                    Err(msg)
                }
            };
            if dropped {
                self.parts.node.stand(id, None);
                // Purged already while this run still wound down: what it uploaded since goes too.
                if !self.catalog.streams.iter().any(|e| e.id == id) && self.refused.is_none() {
                    self.purges.again(id);
                }
            } else if let Some(b) = &self.parts.board {
                b.stream(id.0, &r.entry.name).set_phase(crate::metrics::Phase::Stopped);
            }
            self.ended.insert(id, ended);
            reaped = true;
        }
        if restart {
            self.reconcile();
        }
        if reaped {
            self.sweep();
        }
    }

    /// Removes the local data of dropped streams whose supervisor has ended (every node its
    /// own, as it sees the drop); once a drop's grace period is over, the stream's objects in
    /// the remote store and keys in etcd (whichever node comes first; again is harmless), then
    /// its entry.
    fn sweep(&mut self) {
        let (root, now) = (self.parts.base.data_dir.clone(), now_ms());
        for e in &self.catalog.streams {
            let StreamState::Dropping { since_ms } = e.state else { continue };
            if self.runs.contains_key(&e.id) {
                continue;
            }
            match local::remove_stream_data(&root, e) {
                Ok(()) => {
                    if self.cleared.insert(e.id) {
                        tracing::info!(stream = %e.name, id = e.id.0, "the dropped stream's data on this node is gone");
                    }
                    // Not on a catalog this node refuses (a lost one written anew may reuse ids),
                    // nor as the node stops.
                    if self.refused.is_none() && !self.stopping && self.purges.seen_and_due(e.id, since_ms, now) {
                        self.purges.start(e.id);
                    }
                }
                Err(err) => tracing::warn!(stream = %e.name, error = %err, "cannot remove the dropped stream's data"),
            }
        }
        for id in self.purges.poll() {
            let mark = &self.mark;
            let forgot = catalog::change(self.store.as_ref(), |c| {
                mark.check(c).map_err(|reason| CatalogError::Unavailable { reason })?;
                Ok(catalog::forget(c, id).map(|c| (c, ())))
            });
            match forgot {
                Ok(Some((c, ()))) => {
                    tracing::info!(stream = id.0, "dropped stream removed from the catalog");
                    self.catalog = c;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(stream = id.0, error = %e, "cannot remove the dropped stream from the catalog")
                }
            }
        }
        // What this node keeps of streams gone from the catalog goes: purge state, metrics.
        let listed: std::collections::BTreeSet<StreamId> = self.catalog.streams.iter().map(|e| e.id).collect();
        self.purges.retain(&listed);
        if let Some(b) = &self.parts.board {
            let kept: std::collections::BTreeSet<u64> = self
                .catalog
                .streams
                .iter()
                .filter(|e| e.state.is_kept() || self.runs.contains_key(&e.id))
                .map(|e| e.id.0)
                .collect();
            b.retain(&kept);
        }
        // Streams another node removed from the catalog, or removed before this node started.
        let running: Vec<&StreamEntry> = self.runs.values().map(|r| &r.entry).collect();
        local::remove_unlisted(&root, &self.catalog, &running);
        // A failure of a stream dropped since is no reason to exit 2.
        if let Some((Some(id), _)) = &self.failure
            && !self.catalog.streams.iter().any(|e| e.id == *id && e.state.is_kept())
        {
            self.failure = None;
        }
    }
}

/// A new catalog's lineage: random, not 0.
fn lineage() -> Result<u64, CatalogError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| CatalogError::Unavailable { reason: format!("drawing a lineage: {e}") })?;
    Ok(u64::from_le_bytes(b).max(1))
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
