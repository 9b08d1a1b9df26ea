//! One test per protocol scenario, named after it.

use weir_wire::msg::TriggerRspCode;
use weir_wire::{CheckpointId, NodeId, Seq, StreamId, TaskId, TransId, Version};

use super::coordinator::*;
use super::task::*;

const C1: CheckpointId = CheckpointId(1);
const C2: CheckpointId = CheckpointId(2);
const C3: CheckpointId = CheckpointId(3);
const T1: TransId = TransId(1);

fn setup(task: u32, role: Role, ups: &[u32], downs: &[u32]) -> TaskSetup {
    TaskSetup {
        stream: StreamId(1),
        task: TaskId(task),
        node: NodeId(1),
        role,
        upstreams: ups.iter().map(|u| (TaskId(*u), NodeId(1))).collect(),
        downstreams: downs.iter().map(|d| (TaskId(*d), NodeId(1))).collect(),
        trigger_timeout_ms: 10_000,
        ready_resend_ms: 1_000,
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
    m.handle(TaskInput::Ready { from: TaskId(20), id });
    m.handle(TaskInput::Ready { from: TaskId(21), id });
    m.handle(TaskInput::Update { id, version: Version(0), ts: 5 });
}

// ---- source requests -------------------------------------------------------------------------

#[test]
fn source_request_to_a_non_source_is_refused() {
    let mut m = agg();
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C1, trans: T1, answer: SourceAnswer::NotSource }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn source_enters_checkpointing_and_queues_the_trigger_behind_its_data() {
    let mut m = source();
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::QueueSourceTrigger { id: C1, trans: T1 }]);
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    assert_eq!(m.started, 1);
    let out = m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(4096) });
    assert_eq!(out, vec![TaskAction::Snapshot { id: C1, trans: T1, offset: Version(4096) }]);
}

#[test]
fn request_at_or_below_the_completed_id_is_answered_not_acted_on() {
    let mut m = source();
    m.handle(TaskInput::Update { id: C2, version: Version(10), ts: 0 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: T1, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: T1, answer: SourceAnswer::AlreadyCompleted(C2) }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn request_at_or_below_the_failed_id_is_answered_not_acted_on() {
    let mut m = source();
    m.handle(TaskInput::Reset { failed: C2 });
    let out = m.handle(TaskInput::SourceReq { id: C1.next(), trans: T1, expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: T1, answer: SourceAnswer::AlreadyFailed(C2) }]);
    assert_eq!(m.state(), TaskState::Ready);
}

#[test]
fn stale_source_request_is_discarded() {
    let mut m = source();
    m.handle(TaskInput::Tick { now: 500 });
    assert_eq!(
        m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 }),
        vec![TaskAction::Discarded(Discard::Stale)]
    );
    assert_eq!(m.state(), TaskState::Ready);
}

// ---- triggers --------------------------------------------------------------------------------

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
    m.handle(TaskInput::Reset { failed: C2 });
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

// ---- alignment, snapshot, readiness -------------------------------------------------------------

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
        m.handle(TaskInput::Ready { from: TaskId(20), id: C1 }),
        vec![TaskAction::SendReadyRsp { to: TaskId(20), id: C1 }]
    );
    assert!(m.handle(TaskInput::Uploaded { id: C1, result: Ok(up(7, 100)) }).is_empty(), "21 is not ready yet");
    let out = m.handle(TaskInput::Ready { from: TaskId(21), id: C1 });
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
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(77) });
    m.handle(TaskInput::SnapshotTaken { id: C1, result: Ok(()) });
    m.handle(TaskInput::Uploaded { id: C1, result: Ok(up(1, 2)) });
    let out = m.handle(TaskInput::Ready { from: TaskId(10), id: C1 });
    assert_eq!(out[1], TaskAction::SendSourceRsp { id: C1, trans: T1, answer: SourceAnswer::Done(Version(77)) });
    assert!(matches!(&out[2], TaskAction::SendReport(r) if r.outcome == Ok(Version(77))));
}

#[test]
fn ready_messages_are_matched_by_task_not_node() {
    // Both downstreams run on the same node: one's ready must not count for the other.
    let mut m = agg();
    complete_until_upload(&mut m, C1);
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1 });
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1 });
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
    let out = m.handle(TaskInput::Ready { from: TaskId(21), id: C1 });
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
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1 });
    let out = m.handle(TaskInput::Ready { from: TaskId(20), id: C1 });
    assert_eq!(out, vec![TaskAction::SendReadyRsp { to: TaskId(20), id: C1 }]);
}

#[test]
fn unconfirmed_ready_is_resent_until_confirmed() {
    let mut m = agg();
    complete_until_upload(&mut m, C1);
    m.handle(TaskInput::Ready { from: TaskId(20), id: C1 });
    m.handle(TaskInput::Ready { from: TaskId(21), id: C1 });
    m.handle(TaskInput::ReadyRsp { from: TaskId(1), id: C1 });
    let out = m.handle(TaskInput::Tick { now: 1_000 });
    assert!(out.contains(&TaskAction::SendReady { to: TaskId(2), node: NodeId(1), id: C1, trans: T1 }));
    assert!(!out.iter().any(|a| matches!(a, TaskAction::SendReady { to: TaskId(1), .. })), "1 confirmed");
    m.handle(TaskInput::ReadyRsp { from: TaskId(2), id: C1 });
    let out = m.handle(TaskInput::Tick { now: 2_000 });
    assert!(!out.iter().any(|a| matches!(a, TaskAction::SendReady { .. })));
    m.handle(TaskInput::Update { id: C1, version: Version(0), ts: 0 });
    assert!(m.handle(TaskInput::Tick { now: 3_000 }).is_empty(), "the checkpoint ended: nothing more is resent");
}

// ---- missing triggers --------------------------------------------------------------------------

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
    assert!(matches!(&ask(&mut m, C1)[0], TaskAction::SendTriggerRsp { code: TriggerRspCode::Invalid, .. }));
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
    assert!(matches!(&ask(&mut m, C2)[0], TaskAction::SendTriggerRsp { code: TriggerRspCode::Invalid, id: C1, .. }));
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
        next_seq: Seq(9),
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
        next_seq: Seq(7),
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
        next_seq: Seq(3),
    };
    assert!(m.handle(rsp).is_empty());
    assert_eq!(m.state(), TaskState::Checkpointing(C1));
}

// ---- commit, reset, failure --------------------------------------------------------------------

#[test]
fn update_at_or_below_the_current_id_is_ignored() {
    let mut m = agg();
    complete(&mut m, C2);
    assert!(m.handle(TaskInput::Update { id: C2, version: Version(0), ts: 9 }).is_empty());
    assert!(m.handle(TaskInput::Update { id: C1, version: Version(0), ts: 9 }).is_empty());
    assert_eq!(m.latest(), C2);
}

#[test]
fn update_persists_the_commit_and_returns_to_ready() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    let out = m.handle(TaskInput::Update { id: C1, version: Version(55), ts: 9 });
    assert_eq!(
        out,
        vec![
            TaskAction::PersistCommitted { id: C1, version: Version(55), ts: 9 },
            TaskAction::ReopenAllInputs,
            TaskAction::DeleteSnapshotsBefore(C1)
        ]
    );
    assert_eq!((m.state(), m.latest(), m.latest_version()), (TaskState::Ready, C1, Version(55)));
}

#[test]
fn reset_records_the_failed_id_drops_the_snapshot_and_returns_to_ready() {
    let mut m = agg();
    m.handle(trig(1, C1));
    let out = m.handle(TaskInput::Reset { failed: C1 });
    assert_eq!(out, vec![TaskAction::DropSnapshot(C1), TaskAction::ReopenAllInputs]);
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
    let out = m.handle(TaskInput::Uploaded { id: C1, result: Err("store unreachable".into()) });
    assert!(
        matches!(&out[0], TaskAction::SendReport(r) if r.outcome.as_ref().unwrap_err().contains("store unreachable"))
    );
    assert_eq!((m.state(), m.failed()), (TaskState::Ready, Some(C1)));
}

#[test]
fn a_failed_source_says_so_to_the_coordinator() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    m.handle(TaskInput::SourceReachedTrigger { id: C1, offset: Version(1) });
    let out = m.handle(TaskInput::SnapshotTaken { id: C1, result: Err("disk full".into()) });
    assert!(
        matches!(&out[0], TaskAction::SendSourceRsp { answer: SourceAnswer::Failed(w), .. } if w.contains("disk full"))
    );
}

// ---- coordinator -------------------------------------------------------------------------------

fn coord_cfg() -> CoordinatorConfig {
    CoordinatorConfig {
        stream: StreamId(1),
        tasks: vec![
            (TaskId(1), NodeId(1), Role::Source),
            (TaskId(10), NodeId(1), Role::Agg),
            (TaskId(20), NodeId(2), Role::Sink),
        ],
        interval_ms: 1_000,
        min_pause_ms: 200,
        timeout_ms: 5_000,
        first_delay_ms: 300,
        tolerable_failures: 1,
        consensus_wait_ms: 2_000,
    }
}

fn started() -> Coordinator {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, next_id: C1, last_commit: None });
    for t in [1, 10, 20] {
        c.handle(CoordInput::Consensus { task: TaskId(t), latest: CheckpointId(0) });
    }
    c
}

fn ok_report(id: CheckpointId, trans: TransId, v: u64) -> Report {
    Report { id, trans, outcome: Ok(Version(v)), manifest_crc: 1, stats: Default::default() }
}

#[test]
fn first_checkpoint_waits_for_the_start_delay_then_persists_the_id_before_asking_sources() {
    let mut c = started();
    assert!(c.handle(CoordInput::Tick { now: 299 }).is_empty());
    let out = c.handle(CoordInput::Tick { now: 300 });
    assert_eq!(out[0], CoordAction::PersistNextId(CheckpointId(1 + ID_BLOCK)));
    assert_eq!(
        out[1],
        CoordAction::SendSourceReq { task: TaskId(1), node: NodeId(1), id: C1, trans: T1, expire_at: 5_300 }
    );
    assert_eq!(out.len(), 2, "only sources get the request");
}

#[test]
fn at_most_one_checkpoint_is_in_flight() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    assert!(c.handle(CoordInput::Tick { now: 2_000 }).is_empty());
    assert!(c.handle(CoordInput::Trigger).is_empty());
    assert_eq!(c.in_flight(), Some(C1));
}

#[test]
fn report_with_another_id_or_transaction_is_rejected() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    let out = c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C2, T1, 5) });
    assert!(matches!(&out[0], CoordAction::RejectedReport { task: TaskId(1), .. }));
    let out = c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, TransId(9), 5) });
    assert!(matches!(&out[0], CoordAction::RejectedReport { .. }));
}

#[test]
fn commit_is_written_durably_before_any_task_hears_of_it() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    assert!(c.handle(CoordInput::Report { task: TaskId(20), report: ok_report(C1, T1, 0) }).is_empty());
    assert!(c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(C1, T1, 0) }).is_empty());
    let out = c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 4096) });
    match &out[..] {
        [CoordAction::WriteCommit(r)] => {
            assert_eq!(r.id, C1);
            assert_eq!(r.versions.get(&TaskId(1)), Some(&Version(4096)));
            assert_eq!(r.manifests.len(), 3);
        }
        other => panic!("expected only WriteCommit, got {other:?}"),
    }
    assert!(c.last_commit().is_none());
    let out = c.handle(CoordInput::CommitDurable { id: C1 });
    let updates = out.iter().filter(|a| matches!(a, CoordAction::SendUpdate { .. })).count();
    assert_eq!(updates, 3);
    assert!(out.contains(&CoordAction::SendUpdate {
        task: TaskId(1),
        node: NodeId(1),
        id: C1,
        trans: T1,
        version: Version(4096),
        ts: 300
    }));
    assert_eq!(c.last_commit().map(|r| r.id), Some(C1));
}

#[test]
fn nothing_commits_without_every_report() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 1) });
    c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 1) }); // resent
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(C1, T1, 0) });
    assert!(out.is_empty());
}

#[test]
fn failure_report_resets_every_task_and_the_next_checkpoint_goes_ahead() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    let mut bad = ok_report(C1, T1, 0);
    bad.outcome = Err("upload failed".into());
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: bad });
    let resets = out.iter().filter(|a| matches!(a, CoordAction::SendReset { failed: C1, .. })).count();
    assert_eq!(resets, 3);
    assert!(out.iter().any(|a| matches!(a, CoordAction::Finished { id: C1, outcome: Err(_), .. })));
    assert_eq!(c.in_flight(), None);
    assert!(c.handle(CoordInput::Tick { now: 400 }).is_empty(), "the minimum pause holds");
    let out = c.handle(CoordInput::Tick { now: 1_300 });
    assert!(!out.iter().any(|a| matches!(a, CoordAction::PersistNextId(_))), "id 2 is in the reserved block");
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C2, .. })));
}

#[test]
fn ids_are_reserved_in_blocks_and_a_restart_never_reuses_one() {
    let mut c = started();
    let mut persisted = CheckpointId(1);
    let mut last = CheckpointId(0);
    for n in 0..(ID_BLOCK + 5) {
        let mut out = c.handle(CoordInput::Tick { now: 1_000 + n * 10_000 });
        out.extend(c.handle(CoordInput::Trigger));
        let id = out.iter().find_map(|a| match a {
            CoordAction::SendSourceReq { id, .. } => Some(*id),
            _ => None,
        });
        let id = id.expect("a checkpoint starts");
        if let Some(CoordAction::PersistNextId(p)) = out.first() {
            persisted = *p;
        }
        assert!(id > last && id < persisted, "id {id} used before it was reserved (reserved below {persisted})");
        last = id;
        // End it so the next one can start.
        c.handle(CoordInput::Tick { now: 1_000 + n * 10_000 + 6_000 });
    }
    // A restart from the persisted value starts past every id used.
    let mut r = Coordinator::new(coord_cfg());
    r.handle(CoordInput::Start { now: 0, next_id: persisted, last_commit: None });
    for t in [TaskId(1), TaskId(10), TaskId(20)] {
        r.handle(CoordInput::Consensus { task: t, latest: CheckpointId(0) });
    }
    let mut out = r.handle(CoordInput::Tick { now: 1_000 });
    out.extend(r.handle(CoordInput::Trigger));
    let id = out.iter().find_map(|a| match a {
        CoordAction::SendSourceReq { id, .. } => Some(*id),
        _ => None,
    });
    assert!(id.expect("a checkpoint starts") > last);
}

#[test]
fn checkpoint_running_past_the_timeout_fails() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    assert!(c.handle(CoordInput::Tick { now: 5_299 }).is_empty());
    let out = c.handle(CoordInput::Tick { now: 5_300 });
    assert!(out.iter().any(|a| matches!(a, CoordAction::Finished { outcome: Err(w), .. } if w.contains("timed out"))));
}

#[test]
fn losing_a_node_fails_the_checkpoint() {
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    let out = c.handle(CoordInput::NodeLost { node: NodeId(2) });
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendReset { .. })));
    assert!(c.handle(CoordInput::NodeLost { node: NodeId(3) }).is_empty());
}

#[test]
fn a_checkpoint_due_while_a_node_is_down_fails_at_once_until_the_node_is_back() {
    let mut c = started();
    assert!(c.handle(CoordInput::NodeLost { node: NodeId(2) }).is_empty(), "nothing in flight to fail");
    let out = c.handle(CoordInput::Tick { now: 300 });
    assert!(!out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { .. })), "{out:?}");
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::Finished { id: C1, outcome: Err(w), .. } if w.contains("down"))),
        "{out:?}"
    );
    assert_eq!(c.in_flight(), None);
    // A client going away is not a member going away.
    c.handle(CoordInput::NodeLost { node: NodeId(900) });
    c.handle(CoordInput::NodeUp { node: NodeId(2) });
    let out = c.handle(CoordInput::Tick { now: 1_300 });
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C2, .. })), "{out:?}");
}

#[test]
fn consecutive_failures_past_the_limit_make_the_stream_unhealthy_until_a_commit() {
    let mut c = started();
    let mut now = 300;
    for i in 0..2u64 {
        c.handle(CoordInput::Tick { now });
        let out = c.handle(CoordInput::NodeLost { node: NodeId(1) });
        c.handle(CoordInput::NodeUp { node: NodeId(1) }); // back at once: only this checkpoint fails
        let health = out.iter().find_map(|a| match a {
            CoordAction::Health { healthy, .. } => Some(*healthy),
            _ => None,
        });
        assert_eq!(health, if i == 0 { None } else { Some(false) });
        now += 1_000;
    }
    assert!(!c.healthy());
    c.handle(CoordInput::Tick { now });
    let id = c.in_flight().unwrap();
    let trans = TransId(3);
    for t in [1, 10, 20] {
        c.handle(CoordInput::Report { task: TaskId(t), report: ok_report(id, trans, 0) });
    }
    let out = c.handle(CoordInput::CommitDurable { id });
    assert!(out.contains(&CoordAction::Health { healthy: true, consecutive_failures: 0 }));
}

#[test]
fn manual_trigger_starts_a_checkpoint_now() {
    let mut c = started();
    let out = c.handle(CoordInput::Trigger);
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C1, .. })));
}

#[test]
fn restart_restores_the_last_commit_and_never_reuses_an_id() {
    let mut c = Coordinator::new(coord_cfg());
    let record = CommitRecord {
        id: CheckpointId(7),
        trans: TransId(7),
        versions: [(TaskId(1), Version(900))].into_iter().collect(),
        manifests: Default::default(),
        ts: 1,
    };
    let out = c.handle(CoordInput::Start { now: 0, next_id: CheckpointId(5), last_commit: Some(record) });
    assert_eq!(out.len(), 3);
    assert!(out.contains(&CoordAction::SendRestore {
        task: TaskId(1),
        node: NodeId(1),
        id: Some(CheckpointId(7)),
        version: Version(900),
        committed: true
    }));
    let out = c.handle(CoordInput::Trigger);
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: CheckpointId(8), .. })));
}

#[test]
fn restart_without_a_commit_record_uses_the_minimum_of_the_tasks_latest_ids() {
    let mut c = Coordinator::new(coord_cfg());
    assert!(c.handle(CoordInput::Start { now: 0, next_id: C1, last_commit: None }).is_empty());
    c.handle(CoordInput::Consensus { task: TaskId(1), latest: CheckpointId(4) });
    c.handle(CoordInput::Consensus { task: TaskId(10), latest: CheckpointId(3) });
    let out = c.handle(CoordInput::Consensus { task: TaskId(20), latest: CheckpointId(4) });
    assert!(
        out.iter().all(|a| matches!(a, CoordAction::SendRestore { id: Some(CheckpointId(3)), committed: false, .. }))
    );
    assert_eq!(out.len(), 3);
}

#[test]
fn consensus_gives_up_waiting_and_counts_silent_tasks_as_empty() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, next_id: C1, last_commit: None });
    c.handle(CoordInput::Consensus { task: TaskId(1), latest: CheckpointId(4) });
    let out = c.handle(CoordInput::Tick { now: 2_000 });
    assert!(out.iter().all(|a| matches!(a, CoordAction::SendRestore { id: None, .. })));
}

#[test]
fn a_task_that_asks_again_gets_the_restore_point_already_chosen() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, next_id: C1, last_commit: None });
    for (t, l) in [(1, 4), (10, 3), (20, 4)] {
        c.handle(CoordInput::Consensus { task: TaskId(t), latest: CheckpointId(l) });
    }
    // Its answer was lost: the task asks again with what it has, and the choice stands.
    let out = c.handle(CoordInput::Consensus { task: TaskId(10), latest: CheckpointId(3) });
    assert_eq!(
        out,
        vec![CoordAction::SendRestore {
            task: TaskId(10),
            node: NodeId(1),
            id: Some(CheckpointId(3)),
            version: Version(0),
            committed: false
        }]
    );
    assert!(c.handle(CoordInput::Consensus { task: TaskId(99), latest: C1 }).is_empty(), "not a task of the stream");
}

#[test]
fn a_task_asking_after_the_wait_gets_the_same_restore_point_as_the_others() {
    let mut c = Coordinator::new(coord_cfg());
    assert!(c.handle(CoordInput::Consensus { task: TaskId(1), latest: C2 }).is_empty(), "before start: ask again");
    c.handle(CoordInput::Start { now: 0, next_id: C1, last_commit: None });
    c.handle(CoordInput::Consensus { task: TaskId(1), latest: CheckpointId(4) });
    c.handle(CoordInput::Consensus { task: TaskId(10), latest: CheckpointId(4) });
    let out = c.handle(CoordInput::Tick { now: 2_000 });
    assert_eq!(out.len(), 3);
    // Task 20 comes late, with a checkpoint: it starts empty like the others, or the cut breaks.
    let out = c.handle(CoordInput::Consensus { task: TaskId(20), latest: CheckpointId(4) });
    assert!(matches!(out[..], [CoordAction::SendRestore { task: TaskId(20), id: None, .. }]), "{out:?}");
}

#[test]
fn late_reset_of_an_older_checkpoint_leaves_a_newer_alignment_alone() {
    let mut m = agg();
    m.handle(trig(1, C2));
    assert!(m.handle(TaskInput::Reset { failed: C1 }).is_empty(), "input 0 must stay closed");
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
    assert_eq!(m.failed(), Some(C1));
}

#[test]
fn late_update_of_an_older_checkpoint_leaves_a_newer_alignment_alone() {
    let mut m = agg();
    m.handle(trig(1, C2));
    let out = m.handle(TaskInput::Update { id: C1, version: Version(0), ts: 0 });
    assert_eq!(
        out,
        vec![
            TaskAction::PersistCommitted { id: C1, version: Version(0), ts: 0 },
            TaskAction::DeleteSnapshotsBefore(C1)
        ]
    );
    assert_eq!((m.state(), m.latest()), (TaskState::Checkpointing(C2), C1));
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
    assert!(m.handle(TaskInput::Reset { failed: C2 }).is_empty());
    assert_eq!(m.handle(trig(1, C2)), vec![TaskAction::Discarded(Discard::Failed)]);
}

#[test]
fn source_request_for_a_newer_id_ends_the_abandoned_checkpoint() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C1, trans: T1, expire_at: 100 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: TransId(2), expire_at: 100 });
    assert_eq!(out, vec![TaskAction::ReopenAllInputs, TaskAction::QueueSourceTrigger { id: C2, trans: TransId(2) }]);
    assert_eq!(m.state(), TaskState::Checkpointing(C2));
}

#[test]
fn request_older_than_the_active_checkpoint_says_busy() {
    let mut m = source();
    m.handle(TaskInput::SourceReq { id: C3, trans: T1, expire_at: 100 });
    let out = m.handle(TaskInput::SourceReq { id: C2, trans: TransId(3), expire_at: 100 });
    assert_eq!(out, vec![TaskAction::SendSourceRsp { id: C2, trans: TransId(3), answer: SourceAnswer::Busy(C3) }]);
    let again = m.handle(TaskInput::SourceReq { id: C3, trans: T1, expire_at: 100 });
    assert_eq!(again, vec![TaskAction::Discarded(Discard::Duplicate)]);
}
