//! What the cluster file means for one node: the stream it describes, where the file places
//! each task, the node's engine settings and the remote store.

use std::time::Duration;

use anyhow::Context;
use weir_engine::ingest::SyncPolicy;
use weir_engine::operator::generator::GeneratorSpec;
use weir_engine::operator::window::WindowSpec;
use weir_engine::runtime::{CheckpointSettings, EngineConfig, Remote};
use weir_engine::spec::{Placement, SourceKind, StreamSpec};
use weir_engine::wire::transport::{PeerConfig, TransportConfig};
use weir_engine::wire::{NodeId, StreamId, TaskId};

use crate::config::{ClusterFile, NodeEntry, PlacementFile, StreamFile};
use crate::remote::RemoteArgs;

/// The stream the file describes.
pub fn stream_spec(file: &ClusterFile) -> anyhow::Result<StreamSpec> {
    spec_of(&file.stream)
}

/// The stream a `[stream]` table describes.
pub fn spec_of(s: &StreamFile) -> anyhow::Result<StreamSpec> {
    let mut spec = StreamSpec::generator(StreamId(s.id), s.partitions, s.aggs, s.sinks);
    spec.first_agg_task = s.first_agg_task;
    if let Some(name) = &s.name {
        spec.name = name.clone();
    }
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    spec.window = match s.slide {
        Some(slide) => WindowSpec::hopping(ms(s.window), ms(slide)),
        None => WindowSpec::tumbling(ms(s.window)),
    };
    spec.watermark_delay_ms = ms(s.watermark_delay);
    let g = &s.generator;
    if s.is_ingest() {
        spec.source = SourceKind::IngestLog;
        spec.validate().context("stream")?;
        return Ok(spec);
    }
    spec.source = SourceKind::Generator {
        spec: GeneratorSpec {
            seed: g.seed,
            keys: g.keys,
            rows_per_ms: g.rows_per_ms,
            out_of_order: g.out_of_order,
            max_disorder_ms: ms(g.max_disorder),
            ..GeneratorSpec::default()
        },
        limit: g.events,
        rate: g.rate,
    };
    spec.validate().context("stream")?;
    Ok(spec)
}

/// Where `stream` (a `[stream]` table) puts each task on the file's nodes.
pub fn placement_of(file: &ClusterFile, stream: &StreamFile, spec: &StreamSpec) -> Placement {
    let mut ids: Vec<NodeId> = file.nodes.iter().map(|n| NodeId(n.id)).collect();
    ids.sort();
    match &stream.placement {
        PlacementFile::Named(_) => Placement::spread(&spec.topology(), &ids),
        PlacementFile::Explicit(m) => {
            let mut p = Placement::single(ids[0]);
            for (task, node) in m {
                p.assign(TaskId(task.parse().expect("validated")), NodeId(*node));
            }
            p
        }
    }
}

/// This node's engine settings.
pub fn engine_config(file: &ClusterFile, me: &NodeEntry) -> anyhow::Result<EngineConfig> {
    let data_dir = me.data_dir.clone().unwrap_or_else(|| file.data_dir.join(format!("node-{}", me.id)));
    let mut cfg = EngineConfig::new(NodeId(me.id), &data_dir);
    cfg.workers = me.workers.unwrap_or(file.workers);
    cfg.pin_workers = me.pin_workers.unwrap_or(file.pin_workers);
    cfg.state_budget = file.state_budget.map(|b| b as usize);
    apply_stream(&mut cfg, &file.stream);
    let mut t = TransportConfig::new(&file.cluster, NodeId(me.id), file.secret()?);
    t.listen = Some(me.addr);
    t.clients = file.client_roles()?;
    t.tls = file.tls.as_ref().map(crate::config::TlsFile::member).transpose()?;
    // Each pair connects once: the higher id dials the lower (reconnects retry with backoff, so
    // the start order does not matter).
    t.peers = file
        .nodes
        .iter()
        .filter(|n| n.id != me.id)
        .map(|n| PeerConfig { node: NodeId(n.id), addr: (n.id < me.id).then_some(n.addr) })
        .collect();
    // A restarted peer is redialled within a second (the default backoff reaches 5 s).
    t.reconnect_max = Duration::from_secs(1);
    cfg.transport = Some(t);
    let ck = &file.checkpoint;
    if !ck.interval.is_zero() {
        let mut s = CheckpointSettings::every(ck.interval.as_millis().max(1) as u64, file.data_dir.join("remote"));
        s.remote = Remote::Store(remote_store(file)?.1);
        s.timeout_ms = ck.timeout.as_millis() as u64;
        s.retain = ck.retain;
        s.upload_limit = ck.upload_limit;
        s.uploaders = ck.uploaders.max(1);
        s.replay = ck.snapshots;
        s.recovery_budget = ck.recovery_budget;
        cfg.checkpoint = Some(s);
    }
    Ok(cfg)
}

/// Sets what `stream` (a `[stream]` table) says of a node's engine: its ingest logs.
pub fn apply_stream(cfg: &mut EngineConfig, stream: &StreamFile) {
    let commit = stream.ingest.group_commit;
    cfg.sync = if commit.is_zero() { SyncPolicy::EveryAppend } else { SyncPolicy::GroupCommit(commit) };
    let idle = stream.ingest.idle_after;
    cfg.idle_after = (!idle.is_zero()).then_some(idle);
    cfg.ingest_replicas = stream.ingest.replicas;
    cfg.log.segment_bytes = stream.ingest.segment.unwrap_or(64 << 20);
}

/// The file's remote store (default `file://<data_dir>/remote`): its URL, opened.
pub fn remote_store(file: &ClusterFile) -> anyhow::Result<(String, std::sync::Arc<dyn weir_engine::backup::Store>)> {
    let ck = &file.checkpoint;
    let url = ck.remote.clone().unwrap_or_else(|| format!("file://{}", file.data_dir.join("remote").display()));
    let remote = RemoteArgs {
        remote: Some(url.clone()),
        s3_endpoint: ck.s3_endpoint.clone(),
        s3_region: ck.s3_region.clone(),
        rsync_password_file: ck.rsync_password_file.clone(),
        scratch_dir: Some(file.data_dir.clone()),
    };
    let store = remote.open(&url)?;
    Ok((url, store))
}
