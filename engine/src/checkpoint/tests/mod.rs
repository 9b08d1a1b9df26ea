//! One test per protocol scenario, named after it: the task machine's in `task.rs`, the
//! coordinator's in `coordinator.rs`, its fallback to an older commit in `fallback.rs`; shared setups here.

mod coordinator;
mod fallback;
mod savepoint;
mod task;

use weir_wire::msg::TriggerKind::Periodic;

use weir_wire::msg::TriggerRspCode;

use weir_wire::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

use super::CheckpointError;

use super::coordinator::*;

use super::task::*;

const C1: CheckpointId = CheckpointId(1);

const C2: CheckpointId = CheckpointId(2);

const C3: CheckpointId = CheckpointId(3);

const T1: TransId = TransId(1);

/// Task `task` of stream 1 on node 1 with these upstreams and downstreams (also the drivers' tests').
pub(in crate::checkpoint) fn setup(task: u32, role: Role, ups: &[u32], downs: &[u32]) -> TaskSetup {
    TaskSetup {
        stream: StreamId(1),
        task: TaskId(task),
        node: NodeId(1),
        role,
        upstreams: ups.iter().map(|u| (TaskId(*u), NodeId(1))).collect(),
        downstreams: downs.iter().map(|d| (TaskId(*d), NodeId(1))).collect(),
        trigger_timeout_ms: 10_000,
        ready_resend_ms: 1_000,
        hold_inputs: role != Role::Sink,
    }
}

fn ready(m: TaskMachine) -> TaskMachine {
    let mut m = m;
    m.handle(TaskInput::Restored { id: None, version: Version(0) });
    m
}

/// An agg (task 10) with upstreams 1 and 2 and downstreams 20 and 21.
fn agg() -> TaskMachine {
    ready(TaskMachine::new(setup(10, Role::Agg, &[1, 2], &[20, 21])))
}

fn source() -> TaskMachine {
    ready(TaskMachine::new(setup(1, Role::Source, &[], &[10])))
}

fn up(manifest_crc: u32, bytes: u64) -> UploadDone {
    UploadDone { manifest_crc, bytes, files: 3, upload_us: 1000 }
}

fn trig(from: u32, id: CheckpointId) -> TaskInput {
    TaskInput::Trigger { from: TaskId(from), id, trans: T1 }
}

/// Drives an agg through checkpoint `id` to the commit.
fn complete(m: &mut TaskMachine, id: CheckpointId) {
    m.handle(trig(1, id));
    m.handle(trig(2, id));
    m.handle(TaskInput::SnapshotTaken { id, result: Ok(()) });
    m.handle(TaskInput::Uploaded { id, result: Ok(up(7, 100)) });
    m.handle(TaskInput::Ready { from: TaskId(20), id, trans: T1 });
    m.handle(TaskInput::Ready { from: TaskId(21), id, trans: T1 });
    m.handle(TaskInput::Update { id, trans: T1, version: Version(0), ts: 5 });
}

#[test]
fn errors_say_whether_retrying_can_help() {
    let (t, id) = (TaskId(1), C1);
    let retryable = [
        CheckpointError::Store { op: "put", key: "k".into(), reason: "down".into(), retryable: true },
        CheckpointError::Timeout { op: "put", key: "k".into(), ms: 10 },
        CheckpointError::Snapshot { task: t, id, reason: "disk full".into() },
        CheckpointError::Upload { task: t, id, reason: "reset".into(), retryable: true },
        CheckpointError::Unavailable { stream: StreamId(1), reason: "stopped".into() },
    ];
    let fatal = [
        CheckpointError::Store { op: "get", key: "k".into(), reason: "corrupt".into(), retryable: false },
        CheckpointError::Upload { task: t, id, reason: "corrupt".into(), retryable: false },
        CheckpointError::Meta { task: t, path: "p".into(), reason: "garbage".into() },
        CheckpointError::Restore { task: t, id: Some(id), reason: "no manifest".into() },
        CheckpointError::NotCoordinator { stream: StreamId(1), coordinator: NodeId(1) },
    ];
    assert!(retryable.iter().all(CheckpointError::is_retryable));
    assert!(!fatal.iter().any(CheckpointError::is_retryable));
}
