//! Checkpoint-protocol inputs on the wire: the state machines speak `TaskInput`/`CoordInput`; between
//! nodes those travel as the protocol's rkyv messages. This module converts both ways.

use weir_wire::msg::{
    CannotRestoreReq, CheckpointReady, CheckpointReadyRsp, CheckpointReport, CheckpointSourceReq, CheckpointSourceRsp,
    ConsensusReq, ReportOutcome, Restore, RestoreBasis, RetrieveTriggerReq, SourceOutcome, TaskReset, TriggerRsp,
    UpdateCheckpointInfo,
};
use weir_wire::{CheckpointId, EncodedFrame, Epoch, Frame, FrameEncoder, Kind, NodeId, StreamId, TaskId, Version};

use crate::checkpoint::{CoordInput, Report, SourceAnswer, TaskInput};

/// A run of a stream: what every protocol message names, and what the router matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Run {
    pub(crate) stream: StreamId,
    pub(crate) epoch: Epoch,
}

/// Where a received protocol frame goes.
#[derive(Debug)]
pub(crate) enum Routed {
    /// To a task's machine.
    ToTask(TaskId, TaskInput),
    /// To the coordinator.
    ToCoord(CoordInput),
    /// The coordinator's restore point for a starting task.
    Restore {
        /// Task.
        task: TaskId,
        /// Checkpoint (none: start empty).
        checkpoint: Option<CheckpointId>,
        /// Source offset (none: the one in the checkpoint's manifest).
        version: Option<Version>,
        /// How it was chosen.
        basis: RestoreBasis,
        /// The task's request it answers.
        request: u64,
    },
}

/// Encodes `input` for task `to` on node `to_node`, sent by this node. `None` for inputs that never
/// cross nodes (completions of the task's own I/O, ticks).
pub(crate) fn encode_task_input(
    enc: &mut FrameEncoder,
    run: Run,
    me: NodeId,
    to: TaskId,
    to_node: NodeId,
    input: &TaskInput,
) -> Option<EncodedFrame> {
    let r = match input.clone() {
        TaskInput::Ready { from, id, trans } => enc.encode(&CheckpointReady {
            stream: run.stream,
            epoch: run.epoch,
            checkpoint: id,
            trans,
            downstream: from,
            downstream_node: me,
            upstream: to,
            upstream_node: to_node,
        }),
        TaskInput::ReadyRsp { from, id } => enc.encode(&CheckpointReadyRsp {
            stream: run.stream,
            epoch: run.epoch,
            checkpoint: id,
            upstream: from,
            downstream: to,
        }),
        TaskInput::RetrieveTrigger { from, id } => enc.encode(&RetrieveTriggerReq {
            stream: run.stream,
            epoch: run.epoch,
            checkpoint: id,
            upstream: to,
            upstream_node: to_node,
            downstream: from,
            downstream_node: me,
        }),
        TaskInput::TriggerRsp { from, id, trans, code, trigger_seq, .. } => enc.encode(&TriggerRsp {
            stream: run.stream,
            epoch: run.epoch,
            checkpoint: id,
            trans,
            upstream: from,
            downstream: to,
            code,
            trigger_seq,
        }),
        TaskInput::SourceReq { id, trans, kind, expire_at } => enc.encode(&CheckpointSourceReq {
            stream: run.stream,
            epoch: run.epoch,
            checkpoint: id,
            trans,
            task: to,
            node: to_node,
            kind,
            expire_at_ms: expire_at,
        }),
        TaskInput::Update { id, trans, version, ts } => enc.encode(&UpdateCheckpointInfo {
            stream: run.stream,
            epoch: run.epoch,
            task: to,
            checkpoint: id,
            trans,
            version,
            checkpoint_ts_ms: ts,
        }),
        TaskInput::Reset { failed, trans, reason } => {
            enc.encode(&TaskReset { stream: run.stream, epoch: run.epoch, task: to, failed, trans, reason })
        }
        _ => return None,
    };
    r.map_err(|e| tracing::error!(error = %e, "cannot encode a protocol message")).ok()
}

/// Encodes a task's message for the coordinator (a report, a source's answer, a consensus
/// request), sent from this node. `None` for inputs that never cross nodes.
pub(crate) fn encode_coord_input(
    enc: &mut FrameEncoder,
    run: Run,
    me: NodeId,
    input: &CoordInput,
) -> Option<EncodedFrame> {
    match input {
        CoordInput::Report { task, report } => encode_report(enc, run, *task, me, report),
        CoordInput::Consensus { task, latest, request } => {
            let msg = ConsensusReq {
                stream: run.stream,
                epoch: run.epoch,
                task: *task,
                node: me,
                latest: *latest,
                request: *request,
            };
            enc.encode(&msg).map_err(|e| tracing::error!(error = %e, "cannot encode a consensus request")).ok()
        }
        CoordInput::CannotRestore { task, id, restorable, reason, request } => {
            let msg = CannotRestoreReq {
                stream: run.stream,
                epoch: run.epoch,
                task: *task,
                node: me,
                checkpoint: *id,
                restorable: restorable.clone(),
                reason: reason.clone(),
                request: *request,
            };
            enc.encode(&msg).map_err(|e| tracing::error!(error = %e, "cannot encode a fallback request")).ok()
        }
        CoordInput::SourceRsp { task, id, trans, answer } => {
            let outcome = match answer.clone() {
                SourceAnswer::Done(version) => SourceOutcome::Done { version },
                SourceAnswer::NotSource => SourceOutcome::NotSource,
                SourceAnswer::AlreadyCompleted(latest) => SourceOutcome::AlreadyCompleted { latest },
                SourceAnswer::AlreadyFailed(failed) => SourceOutcome::AlreadyFailed { failed },
                SourceAnswer::Busy(active) => SourceOutcome::Busy { active },
                SourceAnswer::Failed(reason) => SourceOutcome::Failed { reason },
                SourceAnswer::NotRestored => SourceOutcome::NotRestored,
            };
            let msg = CheckpointSourceRsp {
                stream: run.stream,
                epoch: run.epoch,
                checkpoint: *id,
                trans: *trans,
                task: *task,
                node: me,
                outcome,
            };
            enc.encode(&msg).map_err(|e| tracing::error!(error = %e, "cannot encode a source answer")).ok()
        }
        _ => None,
    }
}

/// Encodes a task's report for the coordinator.
fn encode_report(enc: &mut FrameEncoder, run: Run, task: TaskId, node: NodeId, r: &Report) -> Option<EncodedFrame> {
    let (outcome, version) = match &r.outcome {
        Ok(v) => (ReportOutcome::Done, *v),
        Err(reason) => (ReportOutcome::Failed { reason: reason.to_string() }, weir_wire::Version(0)),
    };
    let msg = CheckpointReport {
        stream: run.stream,
        epoch: run.epoch,
        task,
        node,
        checkpoint: r.id,
        trans: r.trans,
        outcome,
        version,
        checkpoint_ts_ms: r.stats.trigger_at_us / 1000,
        manifest_crc: r.manifest_crc,
        stats: r.stats.clone(),
    };
    enc.encode(&msg).map_err(|e| tracing::error!(error = %e, "cannot encode a report")).ok()
}

/// Encodes the coordinator's restore point for `task`.
pub(crate) fn encode_restore(
    enc: &mut FrameEncoder,
    run: Run,
    task: TaskId,
    checkpoint: Option<CheckpointId>,
    version: Option<Version>,
    basis: RestoreBasis,
    request: u64,
) -> Option<EncodedFrame> {
    let msg = Restore { stream: run.stream, epoch: run.epoch, task, checkpoint, basis, version, request };
    enc.encode(&msg).map_err(|e| tracing::error!(error = %e, "cannot encode a restore message")).ok()
}

/// Decodes a protocol frame (validated by `Frame::to_owned`) into its stream's run and where it goes.
/// `None` for other kinds.
pub(crate) fn decode(frame: &Frame) -> Option<(Run, Routed)> {
    let routed = match frame.kind() {
        Kind::CheckpointReady => {
            let m = frame.to_owned::<CheckpointReady>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToTask(m.upstream, TaskInput::Ready { from: m.downstream, id: m.checkpoint, trans: m.trans }),
            )
        }
        Kind::CheckpointReadyRsp => {
            let m = frame.to_owned::<CheckpointReadyRsp>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToTask(m.downstream, TaskInput::ReadyRsp { from: m.upstream, id: m.checkpoint }),
            )
        }
        Kind::RetrieveTriggerReq => {
            let m = frame.to_owned::<RetrieveTriggerReq>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToTask(m.upstream, TaskInput::RetrieveTrigger { from: m.downstream, id: m.checkpoint }),
            )
        }
        Kind::TriggerRsp => {
            let m = frame.to_owned::<TriggerRsp>().ok()?;
            let input = TaskInput::TriggerRsp {
                from: m.upstream,
                id: m.checkpoint,
                trans: m.trans,
                code: m.code,
                trigger_seq: m.trigger_seq,
                next_seq: None, // filled in by the receiving task's driver
            };
            (Run { stream: m.stream, epoch: m.epoch }, Routed::ToTask(m.downstream, input))
        }
        Kind::CheckpointSourceReq => {
            let m = frame.to_owned::<CheckpointSourceReq>().ok()?;
            let input =
                TaskInput::SourceReq { id: m.checkpoint, trans: m.trans, kind: m.kind, expire_at: m.expire_at_ms };
            (Run { stream: m.stream, epoch: m.epoch }, Routed::ToTask(m.task, input))
        }
        Kind::CheckpointSourceRsp => {
            let m = frame.to_owned::<CheckpointSourceRsp>().ok()?;
            let answer = match m.outcome {
                SourceOutcome::Done { version } => SourceAnswer::Done(version),
                SourceOutcome::NotSource => SourceAnswer::NotSource,
                SourceOutcome::AlreadyCompleted { latest } => SourceAnswer::AlreadyCompleted(latest),
                SourceOutcome::AlreadyFailed { failed } => SourceAnswer::AlreadyFailed(failed),
                SourceOutcome::Busy { active } => SourceAnswer::Busy(active),
                SourceOutcome::Failed { reason } => SourceAnswer::Failed(reason),
                SourceOutcome::NotRestored => SourceAnswer::NotRestored,
            };
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToCoord(CoordInput::SourceRsp { task: m.task, id: m.checkpoint, trans: m.trans, answer }),
            )
        }
        Kind::UpdateCheckpointInfo => {
            let m = frame.to_owned::<UpdateCheckpointInfo>().ok()?;
            let input =
                TaskInput::Update { id: m.checkpoint, trans: m.trans, version: m.version, ts: m.checkpoint_ts_ms };
            (Run { stream: m.stream, epoch: m.epoch }, Routed::ToTask(m.task, input))
        }
        Kind::TaskReset => {
            let m = frame.to_owned::<TaskReset>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToTask(m.task, TaskInput::Reset { failed: m.failed, trans: m.trans, reason: m.reason }),
            )
        }
        Kind::CheckpointReport => {
            let m = frame.to_owned::<CheckpointReport>().ok()?;
            let outcome = match m.outcome {
                ReportOutcome::Done => Ok(m.version),
                ReportOutcome::Failed { reason } => Err(crate::checkpoint::TaskFailure::Reported { reason }),
            };
            let report =
                Report { id: m.checkpoint, trans: m.trans, outcome, manifest_crc: m.manifest_crc, stats: m.stats };
            (Run { stream: m.stream, epoch: m.epoch }, Routed::ToCoord(CoordInput::Report { task: m.task, report }))
        }
        Kind::ConsensusReq => {
            let m = frame.to_owned::<ConsensusReq>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToCoord(CoordInput::Consensus { task: m.task, latest: m.latest, request: m.request }),
            )
        }
        Kind::CannotRestoreReq => {
            let m = frame.to_owned::<CannotRestoreReq>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::ToCoord(CoordInput::CannotRestore {
                    task: m.task,
                    id: m.checkpoint,
                    restorable: m.restorable,
                    reason: m.reason,
                    request: m.request,
                }),
            )
        }
        Kind::Restore => {
            let m = frame.to_owned::<Restore>().ok()?;
            (
                Run { stream: m.stream, epoch: m.epoch },
                Routed::Restore {
                    task: m.task,
                    checkpoint: m.checkpoint,
                    version: m.version,
                    basis: m.basis,
                    request: m.request,
                },
            )
        }
        _ => return None,
    };
    Some(routed)
}

#[cfg(test)]
mod tests {
    use weir_wire::msg::{TaskCheckpointStats, TriggerKind, TriggerRspCode};
    use weir_wire::{Seq, TransId};

    use super::*;

    /// Stream 9's run at epoch 4.
    const RUN: Run = Run { stream: StreamId(9), epoch: Epoch(4) };

    #[test]
    fn protocol_inputs_cross_the_wire_unchanged() {
        let mut enc = FrameEncoder::new();
        let c = CheckpointId(7);
        let cases = vec![
            (TaskId(3), TaskInput::Ready { from: TaskId(5), id: c, trans: TransId(2) }),
            (TaskId(5), TaskInput::ReadyRsp { from: TaskId(3), id: c }),
            (TaskId(3), TaskInput::RetrieveTrigger { from: TaskId(5), id: c }),
            (TaskId(5), TaskInput::SourceReq { id: c, trans: TransId(2), kind: TriggerKind::Manual, expire_at: 99 }),
            (TaskId(5), TaskInput::Update { id: c, trans: TransId(2), version: Version(4), ts: 8 }),
            (TaskId(5), TaskInput::Reset { failed: c, trans: TransId(2), reason: "node n2 was lost".into() }),
            (
                TaskId(5),
                TaskInput::TriggerRsp {
                    from: TaskId(3),
                    id: c,
                    trans: TransId(2),
                    code: TriggerRspCode::Success,
                    trigger_seq: Seq(11),
                    next_seq: None,
                },
            ),
        ];
        for (to, input) in cases {
            let f = encode_task_input(&mut enc, RUN, NodeId(1), to, NodeId(2), &input).unwrap();
            let frame = weir_wire::frame::decode_one(f.as_bytes(), 1 << 20).unwrap();
            match decode(&frame) {
                Some((RUN, Routed::ToTask(t, back))) => assert_eq!((t, back), (to, input)),
                other => panic!("{other:?}"),
            }
        }
        let r = Report {
            id: c,
            trans: TransId(2),
            outcome: Ok(Version(9)),
            manifest_crc: 5,
            stats: TaskCheckpointStats {
                trigger_at_us: 1_000,
                align_us: 3,
                snapshot_us: 4,
                upload_bytes: 6,
                upload_us: 7,
                files: 8,
                reported_at_us: 9_000,
            },
        };
        let to_coord = vec![
            CoordInput::Report { task: TaskId(4), report: r },
            CoordInput::Consensus { task: TaskId(4), latest: Some(c), request: 77 },
            CoordInput::CannotRestore {
                task: TaskId(4),
                id: c,
                restorable: vec![CheckpointId(2)],
                reason: "corrupt object k".into(),
                request: 77,
            },
            CoordInput::SourceRsp {
                task: TaskId(4),
                id: c,
                trans: TransId(2),
                answer: SourceAnswer::Busy(CheckpointId(9)),
            },
            CoordInput::SourceRsp { task: TaskId(4), id: c, trans: TransId(2), answer: SourceAnswer::Done(Version(5)) },
            CoordInput::SourceRsp {
                task: TaskId(4),
                id: c,
                trans: TransId(2),
                answer: SourceAnswer::Failed("disk full".into()),
            },
        ];
        for input in to_coord {
            let f = encode_coord_input(&mut enc, RUN, NodeId(2), &input).unwrap();
            match decode(&weir_wire::frame::decode_one(f.as_bytes(), 1 << 20).unwrap()) {
                Some((RUN, Routed::ToCoord(back))) => assert_eq!(back, input),
                other => panic!("{other:?}"),
            }
        }
        let f =
            encode_restore(&mut enc, RUN, TaskId(4), Some(c), Some(Version(8)), RestoreBasis::Consensus, 77).unwrap();
        match decode(&weir_wire::frame::decode_one(f.as_bytes(), 1 << 20).unwrap()) {
            Some((RUN, Routed::Restore { task, checkpoint, version, basis, request })) => {
                assert_eq!(
                    (task, checkpoint, version, basis, request),
                    (TaskId(4), Some(c), Some(Version(8)), RestoreBasis::Consensus, 77)
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
