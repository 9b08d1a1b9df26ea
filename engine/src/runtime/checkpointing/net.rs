//! [`ProtoNet`]: protocol messages to tasks and the coordinator on other nodes, as wire frames
//! (`protocol_wire.rs` converts). A full send queue or a lost frame is a lost control message:
//! the protocol resends or times out, as it must anyway.

use std::collections::HashMap;
use std::sync::Arc;

use weir_wire::msg::RestoreBasis;
use weir_wire::transport::TransportSender;
use weir_wire::{CheckpointId, FrameEncoder, NodeId, TaskId, Version};

use super::super::protocol_wire as pw;
use crate::checkpoint::{CoordInput, TaskInput};

/// The sending side of the protocol on a node.
pub(crate) struct ProtoNet {
    pub(crate) sender: TransportSender,
    pub(crate) enc: FrameEncoder,
    pub(crate) me: NodeId,
    pub(crate) run: pw::Run,
    pub(crate) node_of: Arc<HashMap<TaskId, NodeId>>,
}

impl ProtoNet {
    /// A protocol message to task `to` on another node.
    pub(crate) fn send_task(&mut self, to: TaskId, input: &TaskInput) {
        let Some(node) = self.node_of.get(&to).copied() else { return };
        if let Some(f) = pw::encode_task_input(&mut self.enc, self.run, self.me, to, node, input) {
            let _ = self.sender.try_send(node, f);
        }
    }

    /// A message for the coordinator on node `coord`, from `task` of this node.
    pub(crate) fn send_coord(&mut self, coord: NodeId, input: &CoordInput) {
        if let Some(f) = pw::encode_coord_input(&mut self.enc, self.run, self.me, input) {
            let _ = self.sender.try_send(coord, f);
        }
    }

    /// The coordinator's restore point for `task`.
    pub(crate) fn send_restore(
        &mut self,
        task: TaskId,
        checkpoint: Option<CheckpointId>,
        version: Option<Version>,
        basis: RestoreBasis,
        request: u64,
    ) {
        let Some(node) = self.node_of.get(&task).copied() else { return };
        if let Some(f) = pw::encode_restore(&mut self.enc, self.run, task, checkpoint, version, basis, request) {
            let _ = self.sender.try_send(node, f);
        }
    }
}
