//! The streams of a `weir node`: the stream catalog and one supervisor ([`StreamRunner`]) per
//! stream of it, each on a thread of its own.
//!
//! The catalog is etcd's in a cluster (one key every node reads) and a file of the data
//! directory for a node alone; a cluster file's `[stream]` seeds it the first time. The node
//! reads it every half second and makes what runs here match it: a stream created anywhere
//! starts here, a dropped one stops, its local data goes, and it leaves the catalog. Clients'
//! catalog requests come from the node's router ([`CatalogCall`]); a change is answered once it
//! has taken effect here, or as retryable after [`TAKE_EFFECT`].
//!
//! Invariants: at most one supervisor per stream id; nothing is removed from disk but the data
//! of a stream the catalog, read successfully, says is dropped (or no longer lists, its id
//! below the next to assign).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use weir_engine::cluster::catalog::{self, CatalogError, CatalogStore};
use weir_engine::runtime::{CatalogCall, Standing, StandingPhase};
use weir_engine::wire::StreamId;
use weir_engine::wire::msg::{Catalog, CatalogChange, CatalogRefusal, CatalogRsp, StreamEntry, StreamState};

use super::stream::{NodeParts, StreamRunner};

/// How long a change may take to take effect on the node asked before it answers retryable.
pub const TAKE_EFFECT: Duration = Duration::from_secs(30);

/// How often the node reads the catalog.
const READ_EVERY: Duration = Duration::from_millis(500);

/// Where stream `entry` keeps its data on a node whose data directory is `root`: the cluster
/// file's stream (an empty spec text) at the root, as a node of one stream always has; every
/// other under `streams/<id>`.
pub fn stream_dir(root: &Path, entry: &StreamEntry) -> PathBuf {
    if entry.spec.is_empty() { root.to_path_buf() } else { root.join("streams").join(entry.id.0.to_string()) }
}

/// What a stream of the root keeps there (the rest of the root is the node's).
const ROOT_STREAM_DATA: [&str; 3] = ["tasks", "ingest", "incarnation"];

/// A supervisor running here.
struct Run {
    entry: StreamEntry,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<ExitCode>>,
}

/// A client's change waiting to take effect here.
struct Pending {
    from: weir_engine::wire::NodeId,
    request: u64,
    stream: StreamId,
    /// `true`: until it has started here; `false`: until it has stopped and its data is gone.
    start: bool,
    until: Instant,
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
    /// The catalog as last read.
    catalog: Catalog,
    /// The first error a stream's supervisor ended with (its restart strategy gave up, the
    /// node was replaced), for the exit code.
    failure: Option<anyhow::Error>,
}

impl Streams {
    pub fn new(parts: Arc<NodeParts>, store: Box<dyn CatalogStore>, calls: Receiver<CatalogCall>) -> Self {
        Streams {
            parts,
            store,
            calls,
            runs: BTreeMap::new(),
            ended: BTreeMap::new(),
            pending: Vec::new(),
            catalog: catalog::empty(),
            failure: None,
        }
    }

    /// Seeds the catalog with the cluster file's stream if it was never written, reads it, and
    /// removes what earlier drops left on this node's disk.
    pub fn open(&mut self) -> anyhow::Result<()> {
        let file = &self.parts.file;
        let (name, id) = (file.stream_name(), StreamId(file.stream.id));
        let now = now_ms();
        let seeded = catalog::change(self.store.as_ref(), |c| {
            Ok((c.streams.is_empty() && c.next_id == 1 && id.0 >= 1)
                .then(|| catalog::seed(&name, id, "", now))
                .transpose()?
                .map(|c| (c, ())))
        });
        if let Err(e) = seeded {
            anyhow::bail!("reading the stream catalog: {e}");
        }
        let (c, _) = self.store.read().map_err(|e| anyhow::anyhow!("reading the stream catalog: {e}"))?;
        self.catalog = c;
        self.sweep();
        Ok(())
    }

    /// Runs the catalog's streams until the node stops (a signal in `stop`, `weir stop`, a
    /// newer process of the node), or, with `--exit-when-done`, until every stream ended here;
    /// `Err` when the last stream running here ended with one.
    pub fn serve(mut self, stop: &AtomicBool) -> anyhow::Result<ExitCode> {
        let mut read = Instant::now();
        self.reconcile();
        loop {
            let node_stops = stop.load(Ordering::Relaxed)
                || self.parts.base.stop_requested.load(Ordering::Acquire)
                || self.parts.node.replaced().is_some()
                || self.parts.control.fatal().is_some();
            if node_stops {
                for r in self.runs.values() {
                    r.stop.store(true, Ordering::Relaxed);
                }
            }
            self.reap();
            // A node whose last stream's restart strategy gave up exits 2, as a node of one
            // stream always has; one whose streams were dropped stays a node.
            let done = self.parts.exit_when_done && !self.ended.is_empty();
            if self.runs.is_empty() && (node_stops || done || self.failure.is_some()) {
                return match self.failure.take() {
                    Some(e) => Err(e),
                    None => Ok(ExitCode::SUCCESS),
                };
            }
            if read.elapsed() >= READ_EVERY {
                read = Instant::now();
                match self.store.read() {
                    Ok((c, _)) => {
                        self.catalog = c;
                        self.reconcile();
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
            let running = e.state == StreamState::Running;
            match self.runs.get(&e.id) {
                Some(r) if !running => r.stop.store(true, Ordering::Relaxed),
                Some(_) => {}
                None if running && !self.ended.contains_key(&e.id) => self.start(e),
                None => {}
            }
        }
        for (id, r) in &self.runs {
            if !entries.iter().any(|e| e.id == *id) {
                r.stop.store(true, Ordering::Relaxed);
            }
        }
        self.sweep();
    }

    /// Starts `entry`'s supervisor; a stream that cannot (a bad spec, its data directory) is
    /// logged and counted as ended with that error.
    fn start(&mut self, entry: &StreamEntry) {
        let parts = self.parts.clone();
        let runner = parts.file.stream_of(entry).and_then(|stream| {
            let mut base = parts.base.clone();
            base.data_dir = stream_dir(&parts.base.data_dir, entry);
            crate::settings::apply_stream(&mut base, &stream);
            let runner = StreamRunner::new(&stream, &parts.file, &base)?;
            // The node's metrics are the cluster file's stream's.
            Ok(if entry.spec.is_empty() { runner.with_metrics() } else { runner })
        });
        let runner = match runner {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(stream = %entry.name, error = %format!("{e:#}"), "the stream cannot run on this node");
                self.ended.insert(entry.id, Err(format!("{e:#}")));
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
        let (p, s) = (parts.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("stream-{}", entry.id.0))
            .spawn(move || runner.run(&p, template, &s));
        match thread {
            Ok(thread) => {
                tracing::info!(stream = %entry.name, id = entry.id.0, "stream supervisor started");
                self.runs.insert(entry.id, Run { entry: entry.clone(), stop, thread });
            }
            Err(e) => {
                parts.node.stand(entry.id, None);
                self.ended.insert(entry.id, Err(format!("starting its supervisor thread: {e}")));
            }
        }
    }

    /// Collects the supervisors that have ended.
    fn reap(&mut self) {
        let done: Vec<StreamId> = self.runs.iter().filter(|(_, r)| r.thread.is_finished()).map(|(id, _)| *id).collect();
        for id in done {
            let Some(r) = self.runs.remove(&id) else { continue };
            let ended = r.thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("its supervisor panicked")));
            let dropped = !self.catalog.streams.iter().any(|e| e.id == id && e.state == StreamState::Running);
            let ended = match ended {
                Ok(_) => Ok(()),
                Err(e) if dropped => {
                    tracing::warn!(stream = %r.entry.name, error = %format!("{e:#}"), "the dropped stream ended with an error");
                    Ok(())
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::error!(stream = %r.entry.name, error = %msg, "the stream stopped on this node");
                    self.failure.get_or_insert(e);
                    Err(msg)
                }
            };
            if dropped {
                self.parts.node.stand(id, None);
            }
            self.ended.insert(id, ended);
        }
        self.sweep();
    }

    /// Removes the local data of dropped streams whose supervisor has ended, then their
    /// entries (what other nodes hold of them, they remove as they see the entry gone).
    fn sweep(&mut self) {
        let root = self.parts.base.data_dir.clone();
        let mut gone = Vec::new();
        for e in &self.catalog.streams {
            if matches!(e.state, StreamState::Dropping { .. }) && !self.runs.contains_key(&e.id) {
                match remove_stream_data(&root, e) {
                    Ok(()) => gone.push(e.id),
                    Err(err) => {
                        tracing::warn!(stream = %e.name, error = %err, "cannot remove the dropped stream's data")
                    }
                }
            }
        }
        for id in gone {
            match catalog::change(self.store.as_ref(), |c| Ok(catalog::forget(c, id).map(|c| (c, ())))) {
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
        // Streams another node removed from the catalog, or removed before this node started.
        if let Ok(dirs) = std::fs::read_dir(root.join("streams")) {
            for d in dirs.flatten() {
                let Some(id) = d.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
                let (id, listed) = (StreamId(id), self.catalog.streams.iter().any(|e| e.id.0 == id));
                if !listed && id.0 < self.catalog.next_id && !self.runs.contains_key(&id) {
                    tracing::info!(stream = id.0, "removing the data of a stream the catalog no longer lists");
                    if let Err(e) = std::fs::remove_dir_all(d.path()) {
                        tracing::warn!(stream = id.0, error = %e, "cannot remove the data of a dropped stream");
                    }
                }
            }
        }
    }

    fn on_call(&mut self, call: CatalogCall) {
        let node = self.parts.node.id();
        match call {
            CatalogCall::Read { from, request, name } => {
                let rsp = match self.store.read() {
                    Ok((c, _)) => {
                        let streams: Vec<StreamEntry> =
                            c.streams.into_iter().filter(|s| name.is_empty() || s.name == name).collect();
                        let refused = (streams.is_empty() && !name.is_empty()).then(|| CatalogRefusal::Invalid {
                            reason: format!("no stream named {name} (`weir stream list` shows them)"),
                        });
                        CatalogRsp { request, node, streams, refused }
                    }
                    Err(e) => refusal(request, node, &e),
                };
                self.parts.node.answer(from, &rsp);
            }
            CatalogCall::Change { from, request, change } => {
                let done = match change {
                    CatalogChange::Create { name, spec } => self.create(&name, &spec),
                    CatalogChange::Drop { name } => {
                        let now = now_ms();
                        catalog::change(self.store.as_ref(), |c| catalog::drop_stream(c, &name, now).map(Some))
                            .map(|d| d.map(|(c, e)| (c, e, false)))
                    }
                };
                match done {
                    Ok(Some((c, entry, start))) => {
                        tracing::info!(stream = %entry.name, id = entry.id.0, from = %from, create = start, "stream catalog changed");
                        self.catalog = c;
                        self.reconcile();
                        let until = Instant::now() + TAKE_EFFECT;
                        self.pending.push(Pending { from, request, stream: entry.id, start, until });
                        self.answer_pending();
                    }
                    Ok(None) => {}
                    Err(e) => self.parts.node.answer(from, &refusal(request, node, &e)),
                }
            }
        }
    }

    /// Creates stream `name` from `spec` (checked as this node would run it).
    fn create(&mut self, name: &str, spec: &str) -> Result<Option<(Catalog, StreamEntry, bool)>, CatalogError> {
        let invalid = |e: anyhow::Error| CatalogError::Invalid { reason: format!("{e:#}") };
        let stream = crate::config::parse_stream_doc(spec).map_err(invalid)?;
        if stream.name.as_deref().is_some_and(|n| n != name) {
            return Err(CatalogError::Invalid {
                reason: format!(
                    "the spec names the stream {:?}, the request {name:?}",
                    stream.name.unwrap_or_default()
                ),
            });
        }
        // Checked with the id it would take (a spec that names nodes this file lacks, say).
        let probe = StreamEntry {
            id: StreamId(self.catalog.next_id),
            name: name.into(),
            state: StreamState::Running,
            spec: spec.into(),
            created_ms: 0,
        };
        self.parts.file.stream_of(&probe).and_then(|s| crate::settings::spec_of(&s)).map_err(invalid)?;
        let now = now_ms();
        catalog::change(self.store.as_ref(), |c| catalog::create(c, name, spec, now).map(Some))
            .map(|d| d.map(|(c, e)| (c, e, true)))
    }

    /// Answers the changes that have taken effect here, or ran out of time.
    fn answer_pending(&mut self) {
        let node = self.parts.node.id();
        let mut still = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let entry = self.catalog.streams.iter().find(|e| e.id == p.stream);
            let done = if p.start {
                self.parts.node.attached(p.stream) || self.ended.contains_key(&p.stream)
            } else {
                !self.runs.contains_key(&p.stream) && entry.is_none()
            };
            if let Some(Err(why)) = self.ended.get(&p.stream).filter(|_| p.start) {
                let reason = format!("the stream was created but cannot run on node {node}: {why}");
                let rsp = CatalogRsp {
                    request: p.request,
                    node,
                    streams: entry.cloned().into_iter().collect(),
                    refused: Some(CatalogRefusal::Invalid { reason }),
                };
                self.parts.node.answer(p.from, &rsp);
            } else if done {
                let rsp = CatalogRsp {
                    request: p.request,
                    node,
                    streams: entry.cloned().into_iter().collect(),
                    refused: None,
                };
                self.parts.node.answer(p.from, &rsp);
            } else if Instant::now() >= p.until {
                let what = if p.start { "start" } else { "stop" };
                let reason = format!("the stream did not {what} on node {node} within {}s", TAKE_EFFECT.as_secs());
                let rsp = CatalogRsp {
                    request: p.request,
                    node,
                    streams: entry.cloned().into_iter().collect(),
                    refused: Some(CatalogRefusal::Unavailable { reason }),
                };
                self.parts.node.answer(p.from, &rsp);
            } else {
                still.push(p);
            }
        }
        self.pending = still;
    }
}

/// Removes what stream `entry` keeps on a node whose data directory is `root`.
fn remove_stream_data(root: &Path, entry: &StreamEntry) -> std::io::Result<()> {
    let dir = stream_dir(root, entry);
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    if dir == root {
        for name in ROOT_STREAM_DATA {
            let p = root.join(name);
            gone(if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) })?;
        }
        Ok(())
    } else {
        gone(std::fs::remove_dir_all(dir))
    }
}

fn refusal(request: u64, node: weir_engine::wire::NodeId, e: &CatalogError) -> CatalogRsp {
    let reason = e.to_string();
    let refused =
        if e.is_retryable() { CatalogRefusal::Unavailable { reason } } else { CatalogRefusal::Invalid { reason } };
    CatalogRsp { request, node, streams: Vec::new(), refused: Some(refused) }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
