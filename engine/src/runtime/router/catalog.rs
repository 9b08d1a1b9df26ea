//! The router's side of the stream catalog: it hands catalog requests from clients (their role
//! checked by the transport: reads for any client, changes for admins) to whoever serves the
//! catalog on this node ([`Node::serve_catalog`](crate::runtime::Node::serve_catalog)), and
//! refuses them itself when nobody does. The catalog's changes take effect outside the router
//! thread, which never waits for them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};
use weir_wire::msg::{CatalogChange, CatalogRefusal, CatalogRsp};
use weir_wire::{Frame, Kind, NodeId};

use super::Routing;

/// Catalog requests waiting for the node's catalog service, at most (more are refused as
/// retryable: a change takes seconds to take effect).
pub(crate) const DESK_QUEUE: usize = 64;

/// A client's catalog request, for the node's catalog service.
#[derive(Debug)]
pub enum CatalogCall {
    /// The catalog, or the stream named (empty: all).
    Read {
        /// The client.
        from: NodeId,
        /// Its request id.
        request: u64,
        /// The stream asked for.
        name: String,
    },
    /// A change (the client is an admin).
    Change {
        /// The client.
        from: NodeId,
        /// Its request id.
        request: u64,
        /// The change.
        change: CatalogChange,
    },
}

/// Where the router hands catalog requests (`None`: nobody serves the catalog here).
pub(crate) type Desk = Arc<Mutex<Option<Sender<CatalogCall>>>>;

impl Routing {
    /// A catalog request from client `from`: to the catalog service, or refused here.
    pub(super) fn on_catalog(&mut self, from: NodeId, frame: &Frame) {
        let call = match frame.kind() {
            Kind::CatalogReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::CatalogReq>() else { return };
                CatalogCall::Read { from, request: req.request, name: req.name }
            }
            Kind::CatalogChangeReq => {
                let Ok(req) = frame.to_owned::<weir_wire::msg::CatalogChangeReq>() else { return };
                CatalogCall::Change { from, request: req.request, change: req.change }
            }
            _ => return,
        };
        let request = match &call {
            CatalogCall::Read { request, .. } | CatalogCall::Change { request, .. } => *request,
        };
        let desk = self.desk.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let refused = match desk.map(|d| d.try_send(call)) {
            Some(Ok(())) => return,
            Some(Err(TrySendError::Full(_))) => CatalogRefusal::Unavailable {
                reason: format!("node {} has too many catalog requests waiting", self.node),
            },
            None => CatalogRefusal::Invalid { reason: format!("node {} keeps no stream catalog", self.node) },
            Some(Err(TrySendError::Disconnected(_))) => {
                CatalogRefusal::Unavailable { reason: format!("node {} is stopping", self.node) }
            }
        };
        let rsp = CatalogRsp { request, node: self.node, streams: Vec::new(), refused: Some(refused) };
        self.reply(from, &rsp, Duration::from_secs(1), "catalog refusal");
    }
}
