//! The task machine.

use super::*;

#[test]
fn source_request_to_a_non_source_is_refused() {
    let mut m = agg();
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C1, trans: T1, answer: SourceAnswer::NotSource }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn source_enters_checkpointing_and_queues_the_trigger_behind_its_data() {
    let mut m = source();
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::QueueSourceTrigger { id: C1, trans: T1, savepoint: false }]);
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    assert_eq!(m.started, 1);
    let out = m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(4096) });
    assert_eq!(out, vec![TaskAction::Snapshot { id: C1, trans: T1, offset: Version(4096) }]);
}

#[test]
fn request_at_or_below_the_completed_id_is_answered_not_acted_on() {
    let mut m = source();
    m.handle(TaskInput::Update { id: C2, trans: T1, version: Version(10), ts: 0 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: T1, answer: SourceAnswer::AlreadyCompleted(C2) }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn request_at_or_below_the_failed_id_is_answered_not_acted_on() {
    let mut m = source();
    m.handle(TaskInput::Reset { failed: C2, trans: T1, reason: String::new() });
    let out = m.handle(TaskInput::SourceReq { id: C1.next(), trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: T1, answer: SourceAnswer::AlreadyFailed(C2) }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn stale_source_request_is_discarded() {
    let mut m = source();
    m.handle(TaskInput::Tick { now: 500 });
    assert_eq!(
        m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 }),
        vec![TaskAction::Discarded(Discard::Stale)]
    );
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn expired_trigger_is_discarded() {
    let mut m = agg();
    complete(&mut m, C2);
    assert_eq!(m.handle(trig(1, C1)), vec![TaskAction::Discarded(Discard::Expired)]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn trigger_at_or_below_the_failed_id_is_discarded() {
    let mut m = agg();
    m.handle(TaskInput::Reset { failed: C2, trans: T1, reason: String::new() });
    assert_eq!(m.handle(trig(1, C2)), vec![TaskAction::Discarded(Discard::Failed)]);
    assert_eq!(m.handle(trig(1, C1)), vec![TaskAction::Discarded(Discard::Failed)]);
    assert_eq!(m.state(), TaskState::Ready, "a discarded trigger is not processed");
}

#[test]
fn trigger_for_the_completed_id_resends_ready_and_reopens_the_input() {
    let mut m = agg();
    complete(&mut m, C1);
    let out = m.handle(trig(2, C1));
    assert_eq!(
        out,
        vec![TaskAction::SendReady { to: TaskId(2), node: NodeId(1), id: C1, trans: T1 }, TaskAction::ReopenInput(1)]
    );
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn second_trigger_from_the_same_upstream_is_a_duplicate() {
    let mut m = agg();
    m.handle(trig(1, C1));
    assert_eq!(m.handle(trig(1, C1)), vec![TaskAction::Discarded(Discard::Duplicate)]);
    m.handle(trig(2, C1));
    assert_eq!(m.handle(trig(2, C1)), vec![TaskAction::Discarded(Discard::Duplicate)], "all triggers are in");
    assert_eq!(m.discarded, 2);
}

#[test]
fn trigger_from_a_task_that_is_not_an_upstream_is_discarded() {
    let mut m = agg();
    assert_eq!(m.handle(trig(99, C1)), vec![TaskAction::Discarded(Discard::Misdirected)]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn alignment_closes_inputs_until_every_trigger_arrived_then_snapshots() {
    let mut m = agg();
    assert_eq!(m.handle(trig(2, C1)), vec![TaskAction::CloseInput(1)]);
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    assert_eq!(
        m.handle(trig(1, C1)),
        vec![TaskAction::CloseInput(0), TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }]
    );
}

#[test]
fn a_sink_keeps_its_inputs_open_while_it_aligns() {
    let mut m = ready(TaskMachine::new(setup(20, Role::Sink, &[1, 2], &[])));
    assert_eq!(m.handle(trig(2, C1)), vec![], "upstream 2 is not held back");
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    assert_eq!(m.handle(trig(1, C1)), vec![TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }]);
    // A newer trigger on an open input: the older checkpoint is over (one is in flight at a time).
    let mut m = ready(TaskMachine::new(setup(20, Role::Sink, &[1, 2], &[])));
    m.handle(trig(2, C1));
    let out = m.handle(trig(2, C2));
    assert!(
        out.contains(&TaskAction::ReopenAllInputs) && !out.iter().any(|a| matches!(a, TaskAction::Snapshot { .. }))
    );
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
}

#[test]
fn an_upstream_that_ended_counts_as_aligned_now_and_in_later_checkpoints() {
    let mut m = agg();
    // Waiting for upstream 2's trigger when it ends instead: the alignment is complete.
    m.handle(trig(1, C1));
    assert_eq!(
        m.handle(TaskInput::UpstreamEnded { from: TaskId(2) }),
        vec![TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }]
    );
    // The next checkpoint needs upstream 1 only.
    let mut m = agg();
    assert!(m.handle(TaskInput::UpstreamEnded { from: TaskId(2) }).is_empty());
    assert_eq!(
        m.handle(trig(1, C1)),
        vec![TaskAction::CloseInput(0), TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }]
    );
    assert_eq!(
        m.handle(TaskInput::UpstreamEnded { from: TaskId(7) }),
        vec![TaskAction::Discarded(Discard::Misdirected)]
    );
}

#[test]
fn snapshot_reopens_every_input_at_once_and_uploads_in_the_background() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    let out = m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    assert_eq!(out, vec![TaskAction::ReopenAllInputs, TaskAction::Upload { id: C1 }]);
    assert_eq!(m.state(), TaskState::Checkpointing(C1), "the checkpoint goes on, the pipeline does not wait");
}

#[test]
fn ready_waits_for_a_durable_upload_and_every_downstream() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    assert_eq!(
        m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 }),
        vec![TaskAction::SendReadyRsp { to: TaskId(20), id: C1 }]
    );
    assert!(m.handle(TaskInput::Uploaded { id: C1, result: Ok(up(7, 100)) }).is_empty(), "21 is not ready yet");
    let out = m.handle(TaskInput::Ready { from: TaskId(21), id: C1, trans: T1 });
    assert_eq!(out[0], TaskAction::SendReadyRsp { to: TaskId(21), id: C1 });
    assert_eq!(out[1], TaskAction::SendReady { to: TaskId(1), node: NodeId(1), id: C1, trans: T1 });
    assert_eq!(out[2], TaskAction::SendReady { to: TaskId(2), node: NodeId(1), id: C1, trans: T1 });
    match &out[3] {
        TaskAction::SendReport(r) => {
            assert_eq!((r.id, r.manifest_crc, r.stats.upload_bytes, r.outcome.clone()), (C1, 7, 100, Ok(Version(0))))
        }
        other => panic!("expected a report, got {other:?}"),
    }
}

#[test]
fn a_source_answers_the_coordinator_instead_of_sending_ready() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(77) });
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    m.handle(TaskInput::Uploaded { id: C1, result: Ok(up(1, 2)) });
    let out = m.handle(TaskInput::Ready { from: TaskId(10), id: C1, trans: T1 });
    assert_eq!(out[1], TaskAction::SendSourceRsp { id: C1, trans: T1, answer: SourceAnswer::Done(Version(77)) });
    assert!(matches!(&out[2], TaskAction::SendReport(r) if r.outcome == Ok(Version(77))));
}

#[test]
fn ready_messages_are_matched_by_task_not_node() {
    // Both downstreams run on the same node: one's ready must not count for the other.
    let mut m = agg();
    complete_until_upload(&mut m, C1);
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    let out = m.handle(TaskInput::Ready { from: TaskId(21), id: C1, trans: T1 });
    assert!(out.iter().any(|a| matches!(a, TaskAction::SendReport(_))));
}

fn complete_until_upload(m: &mut TaskMachine, id: CheckpointId) {
    m.handle(trig(1, id));
    m.handle(trig(2, id));
    m.handle(TaskInput::SnapshotTaken { id, result: Ok(()) });
    m.handle(TaskInput::Uploaded { id, result: Ok(up(7, 100)) });
}

#[test]
fn duplicate_ready_is_confirmed_and_otherwise_ignored() {
    let mut m = agg();
    complete_until_upload(&mut m, C1);
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    let out = m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    assert_eq!(out, vec![TaskAction::SendReadyRsp { to: TaskId(20), id: C1 }]);
}

#[test]
fn unconfirmed_ready_is_resent_until_confirmed() {
    let mut m = agg();
    complete_until_upload(&mut m, C1);
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    m.handle(TaskInput::Ready { from: TaskId(21), id: C1, trans: T1 });
    m.handle(TaskInput::ReadyRsp { from: TaskId(1), id: C1 });
    let out = m.handle(TaskInput::Tick { now: 1_000 });
    assert!(out.contains(&TaskAction::SendReady { to: TaskId(2), node: NodeId(1), id: C1, trans: T1 }));
    assert!(!out.iter().any(|a| matches!(a, TaskAction::SendReady { to: TaskId(1), .. })), "1 confirmed");
    m.handle(TaskInput::ReadyRsp { from: TaskId(2), id: C1 });
    let out = m.handle(TaskInput::Tick { now: 2_000 });
    assert!(!out.iter().any(|a| matches!(a, TaskAction::SendReady { .. })));
    m.handle(TaskInput::Update { id: C1, trans: T1, version: Version(0), ts: 0 });
    assert!(m.handle(TaskInput::Tick { now: 3_000 }).is_empty(), "the checkpoint ended: nothing more is resent");
}

#[test]
fn missing_trigger_is_retrieved_after_timeout() {
    let mut m = agg();
    m.handle(trig(1, C1));
    assert!(m.handle(TaskInput::Tick { now: 9_999 }).is_empty());
    let out = m.handle(TaskInput::Tick { now: 10_000 });
    assert_eq!(
        out,
        vec![TaskAction::ReopenInput(1), TaskAction::SendRetrieveTrigger { to: TaskId(2), node: NodeId(1), id: C1 }]
    );
}

#[test]
fn retrieve_is_answered_success_in_progress_or_invalid() {
    let mut m = agg();
    let ask = |m: &mut TaskMachine, id| m.handle(TaskInput::RetrieveTrigger { from: TaskId(21), id });
    m.handle(trig(1, C1));
    assert!(matches!(&ask(&mut m, C1)[0], TaskAction::SendTriggerRsp { code: TriggerRspCode::InProgress, .. }));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    m.handle(TaskInput::TriggerDispatched { to: TaskId(21), seq: Seq(41) });
    assert_eq!(
        ask(&mut m, C1),
        vec![TaskAction::SendTriggerRsp {
            to: TaskId(21),
            id: C1,
            trans: T1,
            code: TriggerRspCode::Success,
            trigger_seq: Seq(41)
        }]
    );
    // Over here: completed, or overtaken by a newer checkpoint.
    complete(&mut m, C1);
    assert!(matches!(&ask(&mut m, C1)[0], TaskAction::SendTriggerRsp { code: TriggerRspCode::Invalid, id: C1, .. }));
    m.handle(trig(1, C3));
    assert!(matches!(&ask(&mut m, C2)[0], TaskAction::SendTriggerRsp { code: TriggerRspCode::Invalid, id: C3, .. }));
}

#[test]
fn an_upstream_that_has_not_reached_the_id_answers_not_yet() {
    let mut m = agg();
    let ask = |m: &mut TaskMachine, id| m.handle(TaskInput::RetrieveTrigger { from: TaskId(21), id });
    // Nothing started here yet, or an older checkpoint still running: the barrier will come.
    let not_yet = |out: Vec<TaskAction>| {
        matches!(&out[..], [TaskAction::SendTriggerRsp { code: TriggerRspCode::InProgress, id: C2, .. }])
    };
    assert!(not_yet(ask(&mut m, C2)), "{:?}", ask(&mut m, C2));
    m.handle(trig(1, C1));
    assert!(not_yet(ask(&mut m, C2)));
    assert_eq!(m.state(), TaskState::Checkpointing(C1), "answering changes nothing here");
}

#[test]
fn a_slow_upstream_is_asked_again_at_every_timeout_and_never_fails_the_checkpoint() {
    let mut m = agg();
    m.handle(trig(1, C1));
    for round in 1..=3u64 {
        let out = m.handle(TaskInput::Tick { now: round * 10_000 });
        assert!(out.contains(&TaskAction::SendRetrieveTrigger { to: TaskId(2), node: NodeId(1), id: C1 }), "{out:?}");
        let rsp = TaskInput::TriggerRsp {
            from: TaskId(2),
            id: C1,
            trans: TransId(0),
            code: TriggerRspCode::InProgress,
            trigger_seq: Seq(0),
            next_seq: Some(Seq(3)),
        };
        assert!(m.handle(rsp).is_empty());
        assert_eq!(m.state(), TaskState::Checkpointing(C1));
    }
}

#[test]
fn retrieved_trigger_is_injected_when_everything_before_it_arrived() {
    let mut m = agg();
    m.handle(trig(1, C1));
    let rsp = TaskInput::TriggerRsp {
        from: TaskId(2),
        id: C1,
        trans: T1,
        code: TriggerRspCode::Success,
        trigger_seq: Seq(9),
        next_seq: Some(Seq(9)),
    };
    let out = m.handle(rsp);
    assert_eq!(out[0], TaskAction::InjectTrigger { from: TaskId(2) });
    assert!(out.contains(&TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }));
}

#[test]
fn retrieved_trigger_with_data_missing_before_it_fails_the_checkpoint() {
    let mut m = agg();
    m.handle(trig(1, C1));
    let rsp = TaskInput::TriggerRsp {
        from: TaskId(2),
        id: C1,
        trans: T1,
        code: TriggerRspCode::Success,
        trigger_seq: Seq(9),
        next_seq: Some(Seq(7)),
    };
    let out = m.handle(rsp);
    assert!(matches!(&out[0], TaskAction::SendReport(r) if r.outcome.is_err()));
    assert_eq!(m.state(), TaskState::Ready);
    assert_eq!(m.failed(), Some(C1));
}

#[test]
fn retrieve_answered_in_progress_waits_for_the_next_timeout() {
    let mut m = agg();
    m.handle(trig(1, C1));
    let rsp = TaskInput::TriggerRsp {
        from: TaskId(2),
        id: C1,
        trans: T1,
        code: TriggerRspCode::InProgress,
        trigger_seq: Seq(0),
        next_seq: Some(Seq(3)),
    };
    assert!(m.handle(rsp).is_empty());
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
}

#[test]
fn update_at_or_below_the_current_id_is_ignored() {
    let mut m = agg();
    complete(&mut m, C2);
    assert!(m.handle(TaskInput::Update { id: C2, trans: T1, version: Version(0), ts: 9 }).is_empty());
    assert!(m.handle(TaskInput::Update { id: C1, trans: T1, version: Version(0), ts: 9 }).is_empty());
    assert_eq!(m.latest(), Some(C2));
}

#[test]
fn update_persists_the_commit_and_returns_to_ready() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    let out = m.handle(TaskInput::Update { id: C1, trans: T1, version: Version(55), ts: 9 });
    assert_eq!(
        out,
        vec![
            TaskAction::PersistCommitted { id: C1, version: Version(55), ts: 9 },
            TaskAction::ReopenAllInputs,
            TaskAction::DeleteSnapshotsBefore(C1)
        ]
    );
    assert_eq!((m.state(), m.latest(), m.latest_version()), (TaskState::Ready, Some(C1), Version(55)));
    assert_eq!(m.latest_ts(), Some(9));
    assert_eq!(source().latest_ts(), None, "a start from nothing committed nothing");
}

#[test]
fn reset_records_the_failed_id_keeps_the_snapshot_a_commit_may_name_and_returns_to_ready() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    // The coordinator gave up on the commit (its write did not answer): the record may still
    // appear, so the snapshot it names stays until a later commit collects it.
    let out = m.handle(TaskInput::Reset { failed: C1, trans: T1, reason: String::new() });
    assert_eq!(out, vec![TaskAction::ReopenAllInputs]);
    assert_eq!((m.state(), m.failed()), (TaskState::Ready, Some(C1)));
    // The next checkpoint goes ahead.
    assert_eq!(m.handle(trig(1, C2)), vec![TaskAction::CloseInput(0)]);
}

#[test]
fn upload_failure_fails_the_checkpoint_and_reports_why() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    let out = m.handle(TaskInput::Uploaded {
        id: C1,
        result: Err(CheckpointError::Upload {
            task: TaskId(10),
            id: C1,
            reason: "store unreachable".into(),
            retryable: true,
        }),
    });
    assert!(
        matches!(&out[0], TaskAction::SendReport(r) if matches!(&r.outcome, Err(f @ crate::checkpoint::TaskFailure::Upload(_)) if f.is_retryable() && f.to_string().contains("store unreachable")))
    );
    assert_eq!((m.state(), m.failed()), (TaskState::Ready, Some(C1)));
}

#[test]
fn a_failed_source_says_so_to_the_coordinator() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(1) });
    let out = m.handle(TaskInput::SnapshotTaken {
        id: C1,
        result: Err(CheckpointError::Snapshot { task: TaskId(1), id: C1, reason: "disk full".into() }),
    });
    assert!(
        matches!(&out[0], TaskAction::SendSourceRsp { answer: SourceAnswer::Failed(w), .. } if w.contains("disk full"))
    );
}

#[test]
fn late_reset_of_an_older_checkpoint_leaves_a_newer_alignment_alone() {
    let mut m = agg();
    m.handle(trig(1, C2));
    assert!(
        m.handle(TaskInput::Reset { failed: C1, trans: T1, reason: String::new() }).is_empty(),
        "input 0 must stay closed"
    );
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
    assert_eq!(m.failed(), Some(C1));
}

#[test]
fn late_update_of_an_older_checkpoint_leaves_a_newer_alignment_alone() {
    let mut m = agg();
    m.handle(trig(1, C2));
    let out = m.handle(TaskInput::Update { id: C1, trans: T1, version: Version(0), ts: 0 });
    assert_eq!(
        out,
        vec![
            TaskAction::PersistCommitted { id: C1, version: Version(0), ts: 0 },
            TaskAction::DeleteSnapshotsBefore(C1)
        ]
    );
    assert_eq!((m.state(), m.latest()), (TaskState::Checkpointing(C2), Some(C1)));
}

#[test]
fn trigger_for_the_completed_id_keeps_an_input_held_for_a_newer_alignment() {
    let mut m = agg();
    complete(&mut m, C1);
    m.handle(trig(2, C2));
    let out = m.handle(trig(2, C1));
    assert_eq!(out, vec![TaskAction::SendReady { to: TaskId(2), node: NodeId(1), id: C1, trans: T1 }]);
}

#[test]
fn trigger_for_an_older_id_than_the_active_one_is_invalid_and_discarded() {
    let mut m = agg();
    m.handle(trig(1, C3));
    assert_eq!(m.handle(trig(2, C2)), vec![TaskAction::Discarded(Discard::Invalid)]);
    assert_eq!(m.state(), TaskState::Checkpointing(C3));
}

#[test]
fn trigger_for_a_newer_id_ends_the_abandoned_checkpoint_and_starts_the_new_one() {
    // The reset of C2 was overtaken by C3's trigger.
    let mut m = agg();
    m.handle(trig(1, C2));
    let out = m.handle(trig(2, C3));
    assert_eq!(out, vec![TaskAction::ReopenAllInputs, TaskAction::CloseInput(1)]);
    assert_eq!((m.state(), m.failed()), (TaskState::Checkpointing(C3), Some(C2)));
    // The late reset changes nothing, and C2's own late trigger is discarded.
    assert!(m.handle(TaskInput::Reset { failed: C2, trans: T1, reason: String::new() }).is_empty());
    assert_eq!(m.handle(trig(1, C2)), vec![TaskAction::Discarded(Discard::Failed)]);
}

#[test]
fn source_request_for_a_newer_id_ends_the_abandoned_checkpoint() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: TransId(2), kind: Periodic, expire_at: 100 });
    assert_eq!(
        out,
        vec![
            TaskAction::ReopenAllInputs,
            TaskAction::QueueSourceTrigger { id: C2, trans: TransId(2), savepoint: false }
        ]
    );
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
}

#[test]
fn request_older_than_the_active_checkpoint_says_busy() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C3, trans: T1, kind: Periodic, expire_at: 100 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: TransId(3), kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: TransId(3), answer: SourceAnswer::Busy(C3) }]);
    let again = m.handle(TaskInput::SourceReq { id: C3, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(again, vec![TaskAction::Discarded(Discard::Duplicate)]);
}

#[test]
fn a_source_asked_to_checkpoint_before_it_restored_says_so() {
    let mut m = TaskMachine::new(setup(1, Role::Source, &[], &[10]));
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: T1, answer: SourceAnswer::NotRestored }]);
    assert_eq!(m.state(), TaskState::Uninit, "it takes no part in the checkpoint");
}

#[test]
fn a_reset_before_the_task_restored_is_remembered() {
    let mut m = TaskMachine::new(setup(10, Role::Agg, &[1, 2], &[20, 21]));
    assert!(m.handle(TaskInput::Reset { failed: C2, trans: T1, reason: String::new() }).is_empty());
    m.handle(TaskInput::Restored { id: Some(C1), version: Version(0) });
    // A barrier of the failed checkpoint, still on its way, is not acted on.
    assert_eq!(m.handle(trig(1, C2)), vec![TaskAction::Discarded(Discard::Failed)]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn a_stale_or_repeated_reached_trigger_is_discarded() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C2, trans: T1, kind: Periodic, expire_at: 100 });
    let stale = m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(5) });
    assert_eq!(stale, vec![TaskAction::Discarded(Discard::Invalid)], "a trigger queued for an older checkpoint");
    m.handle(TaskInput::SourceReachedTrigger { id: C2, offset: Version(6) });
    m.handle(TaskInput::SnapshotTaken { id: C2, result: Ok(()) });
    let again = m.handle(TaskInput::SourceReachedTrigger { id: C2, offset: Version(9) });
    assert_eq!(again, vec![TaskAction::Discarded(Discard::Invalid)], "the snapshot is taken already");
    // Only a source queues triggers.
    let mut a = agg();
    a.handle(trig(1, C1));
    let out = a.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(1) });
    assert_eq!(out, vec![TaskAction::Discarded(Discard::Invalid)]);
}

#[test]
fn an_upstream_that_ends_after_its_barrier_or_the_snapshot_changes_nothing() {
    let mut m = agg();
    m.handle(trig(1, C1));
    assert!(m.handle(TaskInput::UpstreamEnded { from: TaskId(1) }).is_empty(), "its barrier is in already");
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    assert!(m.handle(TaskInput::UpstreamEnded { from: TaskId(2) }).is_empty(), "no second snapshot");
}

#[test]
fn a_stale_or_repeated_snapshot_completion_is_ignored() {
    let mut m = agg();
    m.handle(trig(1, C2));
    m.handle(trig(2, C2));
    assert!(m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) }).is_empty(), "another checkpoint's");
    assert!(m.aligning());
    assert_eq!(
        m.handle(TaskInput::SnapshotTaken { id: C2, result: Ok(()) }),
        vec![TaskAction::ReopenAllInputs, TaskAction::Upload { id: C2 }]
    );
    assert!(m.handle(TaskInput::SnapshotTaken { id: C2, result: Ok(()) }).is_empty(), "one upload per snapshot");
}

#[test]
fn a_source_request_at_its_expiry_time_is_still_taken() {
    let mut m = source();
    m.handle(TaskInput::Tick { now: 100 });
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::QueueSourceTrigger { id: C1, trans: T1, savepoint: false }]);
    let mut m = source();
    m.handle(TaskInput::Tick { now: 101 });
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: Periodic, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::Discarded(Discard::Stale)]);
}

#[test]
fn ready_messages_are_matched_by_id_and_transaction() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    m.handle(TaskInput::Uploaded { id: C1, result: Ok(up(7, 100)) });
    let other_trans = TaskInput::Ready { from: TaskId(20), id: C1, trans: TransId(9) };
    assert_eq!(m.handle(other_trans), vec![TaskAction::Discarded(Discard::Invalid)]);
    let other_id = TaskInput::Ready { from: TaskId(21), id: C2, trans: T1 };
    assert_eq!(m.handle(other_id), vec![TaskAction::Discarded(Discard::Invalid)], "not started here");
    // Neither counted: with only 21 ready, nothing goes upstream.
    let out = m.handle(TaskInput::Ready { from: TaskId(21), id: C1, trans: T1 });
    assert_eq!(out, vec![TaskAction::SendReadyRsp { to: TaskId(21), id: C1 }]);
    let out = m.handle(TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 });
    assert!(out.iter().any(|a| matches!(a, TaskAction::SendReady { to: TaskId(1), id: C1, .. })), "{out:?}");
}

#[test]
fn late_ready_messages_of_finished_checkpoints_are_confirmed_so_they_stop() {
    let mut m = agg();
    complete(&mut m, C2);
    m.handle(trig(1, C3));
    m.handle(TaskInput::Reset { failed: C3, trans: T1, reason: String::new() });
    let ready = |id| TaskInput::Ready { from: TaskId(20), id, trans: T1 };
    let confirmed = |id| vec![TaskAction::SendReadyRsp { to: TaskId(20), id }];
    assert_eq!(m.handle(ready(C1)), confirmed(C1), "older than the last commit");
    assert_eq!(m.handle(ready(C2)), confirmed(C2), "the last commit");
    assert_eq!(m.handle(ready(C3)), confirmed(C3), "the failed one");
    let c4 = CheckpointId(4);
    assert_eq!(m.handle(ready(c4)), vec![TaskAction::Discarded(Discard::Invalid)], "not started here");
}

#[test]
fn retrieve_answers_depend_on_what_is_over_here() {
    let mut m = agg();
    let ask = |m: &mut TaskMachine, id| match &m.handle(TaskInput::RetrieveTrigger { from: TaskId(21), id })[..] {
        [TaskAction::SendTriggerRsp { code, .. }] => code.clone(),
        other => panic!("{other:?}"),
    };
    complete(&mut m, C1);
    assert_eq!(ask(&mut m, C1), TriggerRspCode::Invalid, "committed here");
    assert_eq!(ask(&mut m, C2), TriggerRspCode::InProgress, "not reached yet");
    m.handle(trig(1, C2));
    m.handle(TaskInput::Reset { failed: C2, trans: T1, reason: String::new() });
    assert_eq!(ask(&mut m, C2), TriggerRspCode::Invalid, "failed here");
    assert_eq!(ask(&mut m, C3), TriggerRspCode::InProgress, "past every failed one: not yet");
}

#[test]
fn a_trigger_response_for_a_barrier_already_in_or_another_checkpoint_is_discarded() {
    let mut m = agg();
    m.handle(trig(1, C1));
    m.handle(trig(2, C1));
    let rsp = |id, code| TaskInput::TriggerRsp {
        from: TaskId(2),
        id,
        trans: T1,
        code,
        trigger_seq: Seq(4),
        next_seq: Some(Seq(4)),
    };
    // The retrieve crossed the barrier: the answer is stale and must not fail or inject anything.
    assert_eq!(m.handle(rsp(C1, TriggerRspCode::Invalid)), vec![TaskAction::Discarded(Discard::Invalid)]);
    assert_eq!(m.handle(rsp(C1, TriggerRspCode::Success)), vec![TaskAction::Discarded(Discard::Invalid)]);
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    let mut m = agg();
    m.handle(trig(1, C2));
    assert_eq!(m.handle(rsp(C1, TriggerRspCode::Invalid)), vec![TaskAction::Discarded(Discard::Invalid)]);
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
}

#[test]
fn an_upstream_that_moved_on_to_a_newer_checkpoint_ends_the_one_waiting_for_it() {
    let mut m = agg();
    m.handle(trig(1, C2));
    // Upstream 2 answers the retrieve of C2 from inside C3: C2 ended, and its reset was lost.
    let moved_on = TaskInput::TriggerRsp {
        from: TaskId(2),
        id: C3,
        trans: TransId(3),
        code: TriggerRspCode::Invalid,
        trigger_seq: Seq(0),
        next_seq: Some(Seq(4)),
    };
    let out = m.handle(moved_on);
    assert!(
        out.iter().any(|a| matches!(a, TaskAction::SendReport(r) if r.id == C2 && r.outcome.is_err())),
        "C2 fails here: {out:?}"
    );
}

#[test]
fn an_ended_upstream_completes_an_alignment_only_when_every_other_barrier_is_in() {
    let mut m = ready(TaskMachine::new(setup(10, Role::Agg, &[1, 2, 3], &[20])));
    m.handle(trig(1, C1));
    assert!(m.handle(TaskInput::UpstreamEnded { from: TaskId(2) }).is_empty(), "3's barrier is still due");
    assert!(m.aligning());
    assert_eq!(
        m.handle(trig(3, C1)),
        vec![TaskAction::CloseInput(2), TaskAction::Snapshot { id: C1, trans: T1, offset: Version(0) }]
    );
}
