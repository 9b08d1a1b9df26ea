//! `weir status --json`: every node's answer as one JSON object (the fields are documented in
//! docs/cluster.md).

use std::net::SocketAddr;

use serde_json::{Value, json};

use super::{Answer, Ids, lost_since, outcome, state, upload_us};

pub(super) fn to_json(answers: &[(SocketAddr, Answer)], ids: &Ids) -> Value {
    let nodes: Vec<Value> = answers
        .iter()
        .map(|(addr, a)| match a {
            Answer::Up(r) => json!({
                "addr": addr.to_string(), "node": r.node.0, "up": true, "uptime_ms": r.uptime_ms,
                "incarnation": r.incarnation, "placement": r.incarnation >> 32,
                "restarting": r.restarting, "idle": r.idle, "paused": r.paused,
                "stream": r.stream.as_ref().map(|i| json!({
                    "id": i.stream.0, "name": i.name, "ingest": i.ingest, "partitions": i.partitions,
                    "aggs": i.aggs, "sinks": i.sinks, "window_ms": i.window_ms, "slide_ms": i.slide_ms,
                })),
                "member": r.member.as_ref().map(|m| json!({
                    "leader": (m.leader.0 != 0).then_some(m.leader.0), "lease_left_ms": m.lease_left_ms,
                    "placement": m.placement, "elections": m.elections, "lease_losses": m.lease_losses,
                    "fenced_writes": m.fenced_writes, "error": (!m.error.is_empty()).then_some(&m.error),
                    "withheld": m.withheld, "unreachable": m.unreachable.iter().map(|n| n.0).collect::<Vec<_>>(),
                    "in_sync": m.in_sync.iter().map(|e| json!({
                        "partition": e.partition, "primary": e.primary.0, "follower": e.follower.0, "in": e.in_sync,
                    })).collect::<Vec<_>>(),
                    "in_sync_age_ms": (!m.in_sync.is_empty()).then_some(m.in_sync_age_ms),
                })),
                "peers": r.peers.iter().map(|p| json!({
                    "node": p.node.0, "up": p.up, "since_ms": p.since_ms, "reason": p.reason,
                })).collect::<Vec<_>>(),
                "restarts": r.restarts.iter().map(|x| json!({
                    "at_ms": x.at_ms, "incarnation": x.incarnation, "reason": x.reason,
                })).collect::<Vec<_>>(),
                "tasks": r.tasks.iter().map(|t| json!({
                    "stream": t.stream.0, "task": t.task.0, "state": state(&t.state),
                    "rows_in": t.rows_in, "rows_out": t.rows_out,
                    "watermark_ms": t.watermark_ms, "queued": t.queued,
                    "latest_committed": t.latest.map(|c| c.0), "active": t.active.map(|c| c.0),
                    "last_failed": t.failed.map(|c| c.0),
                    "replay": (t.replay_rows > 0).then(|| json!({
                        "rows": t.replay_rows, "replayed": t.replayed, "ms": t.replay_ms,
                    })),
                })).collect::<Vec<_>>(),
                "streams": r.streams.iter().map(|s| json!({
                    "stream": s.stream.0, "healthy": s.healthy, "consecutive_failures": s.consecutive_failures,
                    "committed": s.committed, "failed": s.failed, "not_started": s.not_started, "interval_ms": s.interval_ms,
                    "cause": (!s.cause.is_empty()).then_some(&s.cause),
                })).collect::<Vec<_>>(),
                "logs": r.logs.iter().map(|l| json!({
                    "partition": l.partition, "source": l.source, "first": l.first.0, "end": l.end.0,
                    "readable": l.readable.0, "bytes": l.bytes,
                    "follower": (l.follower.0 != 0).then_some(l.follower.0),
                    "in_sync": match (l.source && l.follower.0 != 0, l.in_sync) {
                        (true, 1) => Some("in"),
                        (true, 2) => Some("unknown"),
                        (true, 3) => Some("out"),
                        (true, 4) => Some("alone"),
                        _ => None,
                    },
                })).collect::<Vec<_>>(),
                "checkpoints": r.checkpoints.iter().map(|c| json!({
                    "stream": c.stream.0, "checkpoint": c.checkpoint.0, "started_at_ms": c.started_at_ms,
                    "duration_us": c.duration_us, "max_align_us": c.max_align_us,
                    "max_snapshot_us": c.max_snapshot_us, "max_upload_us": upload_us(c),
                    "upload_bytes": c.upload_bytes, "outcome": outcome(&c.outcome),
                })).collect::<Vec<_>>(),
            }),
            Answer::Down(why) => {
                let lost = ids.get(addr).and_then(|id| lost_since(answers, *id));
                json!({
                    "addr": addr.to_string(), "node": ids.get(addr), "up": false, "error": why,
                    "down_since_ms": lost.as_ref().map(|l| l.0), "down_reason": lost.map(|l| l.2),
                })
            }
        })
        .collect();
    json!({ "nodes": nodes })
}
