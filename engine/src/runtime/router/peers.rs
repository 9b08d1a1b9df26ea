//! Frames from the stream's peers: which run of its stream a frame reaches ([`place`], by the
//! epoch it names), what the peers say of runs (a later run in their heartbeats, a failed run
//! in [`RunFailed`]) and what this node tells them, and handing channel and protocol messages
//! to the attached run's tasks and coordinator.

use std::time::Duration;

use weir_wire::msg::{RunFailed, TaskHeartbeat, Watermark, WindowResults};
use weir_wire::{Epoch, Frame, Kind, NodeId, Seq, StreamId, TaskId};

use super::super::channel::{Msg, Rows};
use super::super::protocol_wire::Run;
use super::Routing;
use crate::operator::window::WindowResult;

/// What becomes of a peer's frame of a stream's run at `epoch`, the stream's run `attached` here.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// To the attached run: its own.
    Deliver,
    /// Kept until its run attaches: none does now.
    Wait,
    /// Dropped: an earlier run's.
    Stale,
    /// Kept for its run, which is later than the one attached (which fails: its peers moved on).
    Later,
}

fn place(attached: Option<weir_wire::Epoch>, epoch: weir_wire::Epoch) -> Place {
    match attached {
        None => Place::Wait,
        Some(a) if a == epoch => Place::Deliver,
        Some(a) if epoch < a => Place::Stale,
        Some(_) => Place::Later,
    }
}

/// The run a received message names.
pub(super) fn run(stream: &weir_wire::ids::ArchivedStreamId, epoch: &weir_wire::ids::ArchivedEpoch) -> Run {
    Run { stream: stream.get(), epoch: epoch.get() }
}

impl Routing {
    /// `frame` from `node`, of `run`, back when `run` is attached and `node` speaks for it;
    /// otherwise it waits for its run, or is dropped (see the module's invariants).
    pub(super) fn admit(&mut self, node: NodeId, run: Run, frame: Frame, what: &str) -> Option<Frame> {
        let now = std::time::Instant::now();
        let s = self.streams.get(&run.stream);
        match place(s.map(|s| s.epoch), run.epoch) {
            Place::Deliver => s.filter(|s| s.heeds(node, what)).map(|_| frame),
            Place::Wait => {
                let later = self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(&run.stream).copied();
                if later.is_some_and(|l| l > run.epoch) {
                    // A later run exists: this node will never attach this one.
                    let (stream, epoch) = (run.stream, run.epoch);
                    tracing::debug!(%stream, %epoch, %node, "{what} of a superseded run dropped");
                    return None;
                }
                self.saw(run.stream, run.epoch);
                self.early.hold(run, node, frame, now);
                None
            }
            Place::Stale => {
                let (stream, epoch) = (run.stream, run.epoch);
                tracing::debug!(%stream, %epoch, %node, "{what} of an earlier run dropped");
                None
            }
            Place::Later => {
                self.saw(run.stream, run.epoch);
                // Every frame of the later run comes this way until the earlier detaches: the
                // warning for a node that does not run the stream is given once.
                if let Some(s) = self.streams.get_mut(&run.stream) {
                    let heeded = if s.superseded { s.status.peers.contains(&node) } else { s.heeds(node, what) };
                    if heeded {
                        s.supersede(
                            run.epoch,
                            format!("node {node} started a later run of the stream (epoch {})", run.epoch),
                        );
                    }
                }
                self.early.hold(run, node, frame, now);
                None
            }
        }
    }

    /// A peer's heartbeat: each attached stream takes its own tasks' summaries, and one whose
    /// node runs a later run of it fails (its node restarts it at that run's epoch).
    pub(super) fn heard(&mut self, from: NodeId, tasks: &[TaskHeartbeat]) {
        tasks.iter().for_each(|t| self.saw(t.stream, t.epoch));
        for (stream, s) in self.streams.iter_mut() {
            // Only this run's tasks' summaries: another run's would mix into its status.
            let own: Vec<TaskHeartbeat> = tasks.iter().filter(|t| t.epoch == s.epoch).cloned().collect();
            s.status.heard(from, &own);
            let later = tasks.iter().filter(|t| t.stream == *stream && t.epoch > s.epoch).map(|t| t.epoch).max();
            if let Some(e) = later.filter(|_| s.status.peers.contains(&from)) {
                s.supersede(e, format!("node {from} runs a later run of the stream (epoch {e})"));
            }
        }
    }

    /// A run of `stream` at `epoch` exists on some node (for a stream that attaches later, or
    /// a node between runs: [`super::Node::newest_epoch`]).
    pub(super) fn saw(&mut self, stream: StreamId, epoch: Epoch) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.get(&stream).is_none_or(|e| *e < epoch) {
            seen.insert(stream, epoch);
            drop(seen);
            // Frames of earlier runs waiting here (from queues meant for an earlier process of
            // this node, say) would only take room from this run's.
            self.early.forget_below(stream, epoch);
        }
    }

    /// Tells the other nodes of each attached run that failed here since the last call (once
    /// per run; a run that a later one superseded has no peers left in it): theirs end too,
    /// without waiting for this one to wind down.
    pub(super) fn tell_failed(&mut self) {
        let mut notices = Vec::new();
        for (stream, s) in self.streams.iter_mut().filter(|(_, s)| !s.told && !s.superseded) {
            // A run asked to stop ends with its peers (a failure as it stops is no news).
            let stopping = s.status.stop_requested.load(std::sync::atomic::Ordering::Acquire);
            if let Some(why) = s.shared.failure.get().filter(|_| !stopping) {
                s.told = true;
                let reason: String = why.chars().take(512).collect();
                notices.push((RunFailed { stream: *stream, epoch: s.epoch, reason }, s.status.peers.clone()));
            }
        }
        let me = self.node;
        // A peer not connected has lost this node: its run fails on that already.
        let up = self.up.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (msg, peers) in notices {
            for peer in peers.iter().filter(|p| **p != me && up.contains(p)) {
                self.reply(*peer, &msg, Duration::from_secs(1), "failed run's notice");
                // Delivered even if the node stops before the peer takes it.
                if !self.deliver_at_exit.contains(peer) {
                    self.deliver_at_exit.push(*peer);
                }
            }
        }
    }

    /// Another node says its part of a run failed: that run ends here too, or, not attached
    /// here yet, fails as it attaches.
    pub(super) fn on_run_failed(&mut self, node: NodeId, frame: &Frame) {
        let Ok(m) = frame.access::<RunFailed>() else { return };
        let (stream, epoch) = (m.stream.get(), m.epoch.get());
        let reason: String = m.reason.chars().take(512).flat_map(char::escape_debug).collect();
        self.saw(stream, epoch);
        match self.streams.get_mut(&stream) {
            Some(s) if s.epoch == epoch => s.peer_failed(node, &reason),
            // An earlier run's end changes nothing now.
            Some(s) if s.epoch > epoch => {}
            // A later run, before it attached here (the earlier one still winds down).
            _ => self.early.fail(Run { stream, epoch }, node, &reason),
        }
    }

    /// Hands a channel message to `run`'s task (`frame` makes the message), if it is attached.
    pub(super) fn deliver(&mut self, node: NodeId, run: Run, from: TaskId, to: TaskId, seq: Seq, frame: Frame) {
        let Some(frame) = self.admit(node, run, frame, "channel frame") else { return };
        let Some(s) = self.streams.get_mut(&run.stream) else { return };
        let msg = match frame.kind() {
            Kind::Data => Msg::Rows(Rows::Remote(frame)),
            Kind::Watermark => match frame.access::<Watermark>() {
                Ok(w) => Msg::Progress(w.watermark_ms.to_native()),
                Err(_) => return,
            },
            Kind::WindowResults => match frame.access::<WindowResults>() {
                Ok(w) => Msg::Results(
                    (0..w.key.len())
                        .map(|i| WindowResult {
                            key: w.key[i].to_native(),
                            start: w.start[i].to_native(),
                            count: w.count[i].to_native(),
                            sum: w.sum[i].to_native(),
                            min: w.min[i].to_native(),
                            max: w.max[i].to_native(),
                        })
                        .collect(),
                ),
                Err(_) => return,
            },
            Kind::EndOfStream => Msg::End,
            Kind::CheckpointTrigger => match frame.access::<weir_wire::msg::CheckpointTrigger>() {
                Ok(t) => Msg::Trigger { id: t.checkpoint.get(), trans: t.trans.get(), savepoint: t.savepoint },
                Err(_) => return,
            },
            _ => return,
        };
        s.deliver(from, to, seq, msg);
    }

    /// A checkpoint protocol message (admitted) for `stream`'s tasks or coordinator.
    pub(super) fn on_protocol(&self, node: NodeId, stream: StreamId, routed: super::super::protocol_wire::Routed) {
        use super::super::control::Control;
        use super::super::protocol_wire::Routed;
        let Some(s) = self.streams.get(&stream) else { return };
        match routed {
            Routed::ToTask(t, input) => match s.proto.0.get(&t) {
                Some(h) => {
                    h.try_send(Control::Protocol(input));
                }
                None => tracing::warn!(%stream, task = %t, %node, "protocol message for a task not on this node"),
            },
            Routed::ToCoord(input) => match &s.proto.1 {
                Some(inbox) => {
                    let _ = inbox.send(input);
                }
                None => tracing::warn!(%stream, %node, "report for a coordinator not on this node"),
            },
            Routed::Restore { task, checkpoint, version, basis, request } => match s.proto.0.get(&task) {
                Some(h) => {
                    h.try_send(Control::Restore { checkpoint, version, basis, request });
                }
                None => tracing::warn!(%stream, %task, %node, "restore point for a task not on this node"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use weir_wire::Epoch;

    use super::{Place, place};

    #[test]
    fn a_frame_reaches_only_the_run_its_epoch_names() {
        assert_eq!(place(Some(Epoch(3)), Epoch(3)), Place::Deliver);
        assert_eq!(place(Some(Epoch(3)), Epoch(2)), Place::Stale);
        assert_eq!(place(Some(Epoch(3)), Epoch(0)), Place::Stale);
        assert_eq!(place(Some(Epoch(3)), Epoch(4)), Place::Later);
        assert_eq!(place(None, Epoch(0)), Place::Wait);
    }
}
