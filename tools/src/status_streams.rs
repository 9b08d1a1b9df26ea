//! `weir status`'s overview of the catalog's streams, shown when it holds more than one and no
//! `--stream` is named: each stream's state in the catalog and, node by node, what the node does
//! with it (runs it at an epoch, paused, idle, restarting, down) and the newest commit its tasks
//! report. One status request per stream and node.

use std::fmt::Write;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use weir_engine::wire::msg::{CatalogReq, CatalogRsp, StatusRsp, StreamEntry, StreamState};

use crate::client::Target;

type Ids = std::collections::HashMap<SocketAddr, u32>;

/// One stream of the overview.
pub struct Row {
    entry: StreamEntry,
    /// Per node asked: its answer, or why there is none.
    nodes: Vec<(SocketAddr, Result<StatusRsp, String>)>,
}

/// The overview, or `None` when the catalog holds one stream or none, or cannot be read (the
/// nodes' own answers say it all then).
pub fn overview(t: &Target, timeout: Duration) -> anyhow::Result<Option<Vec<Row>>> {
    let Some(streams) = catalog(t, timeout) else { return Ok(None) };
    if streams.iter().filter(|e| e.state.is_kept()).count() < 2 {
        return Ok(None);
    }
    let mut rows = Vec::new();
    for entry in streams {
        // A dropping stream runs nowhere: its nodes are not asked.
        let mut nodes = Vec::new();
        for addr in t.nodes.iter().filter(|_| entry.state.is_kept()) {
            nodes.push((*addr, crate::client::status_of(t, *addr, Some(entry.id), timeout)?));
        }
        rows.push(Row { entry, nodes });
    }
    Ok(Some(rows))
}

/// The catalog, from the first node that answers with it.
pub fn catalog(t: &Target, timeout: Duration) -> Option<Vec<StreamEntry>> {
    for addr in &t.nodes {
        let Ok(f) = crate::client::request(t, *addr, &CatalogReq { request: 1, name: String::new() }, timeout) else {
            continue;
        };
        match f.to_owned::<CatalogRsp>() {
            Ok(rsp) if rsp.refused.is_none() => return Some(rsp.streams),
            _ => continue,
        }
    }
    None
}

fn state(s: &StreamState) -> &'static str {
    match s {
        StreamState::Running => "running",
        StreamState::Paused { .. } => "paused",
        StreamState::Dropping { .. } => "dropping",
    }
}

/// What node answer `r` says it does with the stream.
fn doing(r: &Result<StatusRsp, String>) -> String {
    match r {
        Err(_) => "down".into(),
        Ok(s) if s.paused => format!("paused e{}", s.incarnation),
        Ok(s) if s.idle => "idle".into(),
        Ok(s) if s.restarting => "restarting".into(),
        Ok(s) if s.tasks.is_empty() => "none".into(),
        Ok(s) => format!("runs e{}", s.incarnation),
    }
}

/// The newest commit the stream's tasks report on the nodes.
fn last_commit(row: &Row) -> Option<u64> {
    row.nodes
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|s| s.tasks.iter().filter(|t| t.stream == row.entry.id).filter_map(|t| t.latest))
        .map(|c| c.0)
        .max()
}

/// The overview as text: one line per stream.
pub fn text(rows: &[Row], ids: &Ids) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<20} {:>5}  {:<9} {:<12} ON THE NODES", "STREAM", "ID", "STATE", "LAST COMMIT");
    for row in rows {
        let nodes: Vec<String> = row
            .nodes
            .iter()
            .map(|(addr, r)| {
                let id = ids.get(addr).map_or_else(|| addr.to_string(), |i| format!("node {i}"));
                format!("{id} {}", doing(r))
            })
            .collect();
        let last = last_commit(row).map_or("-".to_string(), |c| format!("chk-{c}"));
        let nodes = if nodes.is_empty() { "-".to_string() } else { nodes.join(", ") };
        let (name, id) = (&row.entry.name, row.entry.id.0);
        let _ = writeln!(out, "{name:<20} {id:>5}  {:<9} {last:<12} {nodes}", state(&row.entry.state));
    }
    out
}

/// The overview as JSON (`catalog` of `weir status --json`).
pub fn json(rows: &[Row], ids: &Ids) -> Value {
    let streams: Vec<Value> = rows
        .iter()
        .map(|row| {
            let nodes: Vec<Value> = row
                .nodes
                .iter()
                .map(|(addr, r)| {
                    json!({
                        "addr": addr.to_string(), "node": ids.get(addr),
                        "doing": doing(r).split(' ').next().unwrap_or_default(),
                        "incarnation": r.as_ref().ok().map(|s| s.incarnation),
                    })
                })
                .collect();
            json!({
                "name": row.entry.name, "id": row.entry.id.0, "state": state(&row.entry.state),
                "last_commit": last_commit(row), "nodes": nodes,
            })
        })
        .collect();
    Value::Array(streams)
}
