//! The node's answers to clients' catalog requests ([`CatalogCall`]): reads at once, changes
//! once they have taken effect here ([`Streams`] runs them).

use std::time::{Duration, Instant};

use weir_engine::cluster::catalog::{self, CatalogError};
use weir_engine::runtime::{CatalogCall, StandingPhase};
use weir_engine::wire::msg::{Catalog, CatalogChange, CatalogRefusal, CatalogRsp, StreamEntry, StreamState};
use weir_engine::wire::{NodeId, StreamId};

use super::{Effect, Pending, Streams, TAKE_EFFECT, now_ms};
use crate::node::wish::{FINAL_CHECKPOINT, Now};

impl Streams {
    pub(super) fn on_call(&mut self, call: CatalogCall) {
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
                    Err(e) => return self.refuse(from, request, refusal(&e)),
                };
                self.parts.node.answer(from, &rsp);
            }
            CatalogCall::Change { from, request, .. } if self.stopping || self.refused.is_some() => {
                let reason = match &self.refused {
                    Some(why) => why.clone(),
                    None => format!("node {node} is stopping"),
                };
                self.refuse(from, request, CatalogRefusal::Unavailable { reason });
            }
            CatalogCall::Change { from, request, change } => {
                let done = match change {
                    CatalogChange::Create { name, spec } => self.create(&name, &spec),
                    CatalogChange::Drop { name } => {
                        let now = now_ms();
                        self.change(|c| catalog::drop_stream(c, &name, now))
                            .map(|d| d.map(|(c, e)| (c, e, Effect::Gone)))
                    }
                    CatalogChange::Pause { .. } | CatalogChange::Stop { .. }
                        if self.parts.base.checkpoint.is_none() =>
                    {
                        Err(CatalogError::Invalid {
                            reason:
                                "the cluster takes no checkpoints ([checkpoint] in its file): a paused stream would \
                                 lose its state"
                                    .into(),
                        })
                    }
                    CatalogChange::Rescale { name, aggs, sinks } => self.rescale(&name, aggs, sinks),
                    CatalogChange::Pause { ref name } | CatalogChange::Resume { ref name } => {
                        let (now, pause) = (now_ms(), matches!(change, CatalogChange::Pause { .. }));
                        self.change(|c| catalog::set_paused(c, name, pause, now))
                            .map(|d| d.map(|(c, e)| (c, e, Effect::Paused(pause))))
                    }
                    // A pause (none if paused already) whose answer waits for its savepoint.
                    CatalogChange::Stop { ref name } => self
                        .change(|c| catalog::set_paused(c, name, true, now_ms()))
                        .map(|d| d.map(|(c, e)| (c, e, Effect::Stopped))),
                };
                match done {
                    Ok(Some((c, entry, effect))) => {
                        tracing::info!(stream = %entry.name, id = entry.id.0, from = %from, effect = ?effect, "stream catalog changed");
                        self.take(c);
                        let until = Instant::now() + TAKE_EFFECT;
                        self.pending.push(Pending { from, request, stream: entry.id, effect, until });
                        self.answer_pending();
                    }
                    Ok(None) => {}
                    Err(e) => self.refuse(from, request, refusal(&e)),
                }
            }
        }
    }

    /// Makes change `f` to the catalog this node has seen.
    fn change(
        &self,
        f: impl Fn(&Catalog) -> Result<(Catalog, StreamEntry), CatalogError>,
    ) -> Result<Option<(Catalog, StreamEntry)>, CatalogError> {
        let mark = &self.mark;
        catalog::change(self.store.as_ref(), |c| {
            seen(mark, c)?;
            f(c).map(Some)
        })
    }

    /// Creates stream `name` from `spec` (checked as this node would run it).
    fn create(&mut self, name: &str, spec: &str) -> Result<Option<(Catalog, StreamEntry, Effect)>, CatalogError> {
        let invalid = |e: anyhow::Error| CatalogError::Invalid { reason: format!("{e:#}") };
        // The request's name is the stream's, whatever the spec's `name` says.
        crate::config::parse_stream_doc(spec).map_err(invalid)?;
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
        self.change(|c| catalog::create(c, name, spec, now)).map(|d| d.map(|(c, e)| (c, e, Effect::Start)))
    }

    /// Gives the paused stream `name` `aggs` aggs and `sinks` sinks (0: as it has), once its last
    /// commit is a savepoint (only one restores at other parallelism).
    fn rescale(
        &mut self,
        name: &str,
        aggs: u32,
        sinks: u32,
    ) -> Result<Option<(Catalog, StreamEntry, Effect)>, CatalogError> {
        let invalid = |reason: String| CatalogError::Invalid { reason };
        let entry = self.catalog.streams.iter().find(|e| e.name == name && e.state.is_kept()).cloned();
        let entry = entry.ok_or_else(|| invalid(format!("no stream named {name} (`weir stream list` shows them)")))?;
        if entry.spec.is_empty() {
            return Err(invalid(format!(
                "stream {name} is the cluster file's own ([stream] table): a rescale of it is not built; create                  streams with `weir stream create` to rescale them"
            )));
        }
        let old = crate::config::parse_stream_doc(&entry.spec).map_err(|e| invalid(format!("{e:#}")))?;
        if sinks != 0 && sinks != old.sinks {
            return Err(invalid(format!("a rescale of the sinks is not built: --sinks stays {}", old.sinks)));
        }
        if self.parts.base.state_budget.is_some() {
            let why = "the cluster spills window state (state_budget): a rescale of spilled state is not built";
            return Err(invalid(why.into()));
        }
        if !matches!(entry.state, StreamState::Paused { .. }) {
            return Err(invalid(format!("stream {name} runs: pause it first (`weir stream rescale` does)")));
        }
        self.savepoint_last(&entry)?;
        let text = crate::config::rescaled_doc(&entry.spec, aggs, sinks).map_err(|e| invalid(format!("{e:#}")))?;
        let probe = StreamEntry { spec: text.clone(), ..entry.clone() };
        self.parts
            .file
            .stream_of(&probe)
            .and_then(|s| crate::settings::spec_of(&s))
            .map_err(|e| invalid(format!("{e:#}")))?;
        // Made on the spec the text was computed from: one changed meanwhile is tried again.
        self.change(|c| catalog::set_spec(c, name, &entry.spec, &text)).map(|d| d.map(|(c, e)| (c, e, Effect::Respec)))
    }

    /// Refuses unless stream `entry`'s last commit is a savepoint whose aggs all wrote their
    /// windows (none names rows to replay).
    fn savepoint_last(&self, entry: &StreamEntry) -> Result<(), CatalogError> {
        let Some(ck) = &self.parts.base.checkpoint else {
            return Err(CatalogError::Invalid {
                reason: "the cluster takes no checkpoints: nothing to rescale from".into(),
            });
        };
        let book: std::sync::Arc<dyn weir_engine::backup::commit_point::CommitBook> =
            match self.parts.control.store_and_keys() {
                Some((store, keys)) => {
                    std::sync::Arc::new(weir_engine::cluster::ControlCommits::reader(store, &keys, entry.id))
                }
                None => std::sync::Arc::new(weir_engine::backup::commit_point::StoreCommits::new(entry.id)),
            };
        let store = ck.open_store();
        let unavailable = |e: String| CatalogError::Unavailable {
            reason: format!("reading stream {}'s last commit: {e}", entry.name),
        };
        let invalid = |reason: String| CatalogError::Invalid { reason };
        match book.last(store.as_ref()).map_err(|e| unavailable(e.to_string()))? {
            Some(r) if r.savepoint => {
                for t in r.shape.iter().flat_map(|s| s.agg_tasks()) {
                    let crc = r.manifests.get(&t).copied();
                    let m = weir_engine::backup::fetch_manifest(store.as_ref(), entry.id, t, r.id, crc)
                        .map_err(|e| unavailable(format!("agg {t}'s manifest: {e}")))?;
                    if m.replay.is_some() {
                        let (id, name) = (r.id.0, &entry.name);
                        return Err(invalid(format!(
                            "savepoint chk-{id} of stream {name}: agg {t} names windows to replay"
                        )));
                    }
                }
                Ok(())
            }
            Some(r) => Err(invalid(format!(
                "stream {}'s last commit (chk-{}) is no savepoint (it paused without one, as when an agg still replayed \
                 after a restore or the savepoint took longer than 10 s): resume it and pause it again once it has \
                 caught up",
                entry.name, r.id.0
            ))),
            None => {
                Err(invalid(format!("stream {} has no commit: resume it until one commits, then rescale", entry.name)))
            }
        }
    }

    /// Answers every change still waiting, and every call still queued, as retryable: the
    /// node stops.
    pub(super) fn answer_all(&mut self) {
        let reason = format!("node {} is stopping", self.parts.node.id());
        let waiting = std::mem::take(&mut self.pending).into_iter().map(|p| (p.from, p.request));
        let queued: Vec<_> = self
            .calls
            .try_iter()
            .map(|c| match c {
                CatalogCall::Read { from, request, .. } | CatalogCall::Change { from, request, .. } => (from, request),
            })
            .collect();
        for (from, request) in waiting.chain(queued) {
            self.refuse(from, request, CatalogRefusal::Unavailable { reason: reason.clone() });
        }
    }

    /// Answers `request` of client `from` with a refusal.
    fn refuse(&self, from: NodeId, request: u64, refused: CatalogRefusal) {
        let node = self.parts.node.id();
        self.parts.node.answer(from, &CatalogRsp { request, node, streams: Vec::new(), refused: Some(refused) });
    }

    /// Answers the changes that have taken effect here, or ran out of time.
    pub(super) fn answer_pending(&mut self) {
        let node = self.parts.node.id();
        let mut still = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let entry = self.catalog.streams.iter().find(|e| e.id == p.stream);
            // Waiting with no task here (the placement puts none on this node, or it is no
            // member now): the stream's other nodes run it.
            let waits =
                matches!(self.parts.node.standing_phase(p.stream), Some(StandingPhase::Idle | StandingPhase::Fenced));
            let done = match p.effect {
                Effect::Start => self.parts.node.attached(p.stream) || waits || self.ended.contains_key(&p.stream),
                // Its data here is gone (its entry waits out the grace period).
                Effect::Gone => {
                    !self.runs.contains_key(&p.stream) && (entry.is_none() || self.cleared.contains(&p.stream))
                }
                // A node with no task of the stream cannot see its savepoint being taken: it
                // answers a stop once the coordinator has committed one or given up.
                Effect::Stopped if waits => {
                    let settled = TAKE_EFFECT.saturating_sub(FINAL_CHECKPOINT + Duration::from_secs(2));
                    Instant::now() + settled >= p.until || self.ended.contains_key(&p.stream)
                }
                Effect::Paused(_) | Effect::Stopped => {
                    let now = if matches!(p.effect, Effect::Paused(false)) { Now::Running } else { Now::Paused };
                    let here = self.runs.get(&p.stream).map(|r| r.wish.now());
                    here == Some(now) || (here.is_some() && waits) || self.ended.contains_key(&p.stream)
                }
                Effect::Respec => {
                    let here = self.runs.get(&p.stream);
                    here.zip(entry).is_some_and(|(r, e)| r.entry.spec == e.spec) || self.ended.contains_key(&p.stream)
                }
            };
            let refused = match self.ended.get(&p.stream).filter(|_| p.effect != Effect::Gone) {
                Some(Err(why)) => Some(Some(CatalogRefusal::Invalid {
                    reason: match p.effect {
                        Effect::Start => format!("the stream was created but cannot run on node {node}: {why}"),
                        _ => format!("the stream's catalog changed, but it no longer runs on node {node}: {why}"),
                    },
                })),
                // Stopped: paused here, at a savepoint (else paused without one: said, and left so).
                _ if done && p.effect == Effect::Stopped => {
                    let saved = match entry {
                        Some(e) if matches!(e.state, StreamState::Paused { .. }) => self.savepoint_last(e),
                        _ => {
                            Err(CatalogError::Invalid { reason: "it is no longer paused (resumed or dropped)".into() })
                        }
                    };
                    Some(saved.err().map(|e| {
                        let reason = format!("{}: {e}", crate::stream_cmd::NO_SAVEPOINT);
                        match e.is_retryable() {
                            true => CatalogRefusal::Unavailable { reason },
                            false => CatalogRefusal::Invalid { reason },
                        }
                    }))
                }
                _ if done => Some(None),
                _ if Instant::now() >= p.until => {
                    let what = match p.effect {
                        Effect::Start => "start",
                        Effect::Gone => "stop",
                        Effect::Paused(true) | Effect::Stopped => "pause",
                        Effect::Paused(false) => "resume",
                        Effect::Respec => "start again with its new parallelism",
                    };
                    let reason = format!("the stream did not {what} on node {node} within {}s", TAKE_EFFECT.as_secs());
                    Some(Some(CatalogRefusal::Unavailable { reason }))
                }
                _ => None,
            };
            if let Some(refused) = refused {
                let streams = entry.cloned().into_iter().collect();
                self.parts.node.answer(p.from, &CatalogRsp { request: p.request, node, streams, refused });
            } else {
                still.push(p);
            }
        }
        self.pending = still;
    }
}

/// A change lands only on the catalog this node has seen (one lost or reset since is refused:
/// retryable once it is restored).
fn seen(mark: &super::HighWater, c: &Catalog) -> Result<(), CatalogError> {
    mark.check(c).map_err(|reason| CatalogError::Unavailable { reason })
}

/// What a failed change or read says to the client: retryable or not, as the error is.
fn refusal(e: &CatalogError) -> CatalogRefusal {
    let reason = e.to_string();
    if e.is_retryable() { CatalogRefusal::Unavailable { reason } } else { CatalogRefusal::Invalid { reason } }
}
