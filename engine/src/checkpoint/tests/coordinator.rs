//! The coordinator.

use super::*;
use crate::checkpoint::{CheckpointFailure, TaskFailure};
use weir_wire::msg::RestoreBasis;

pub(super) fn coord_cfg() -> CoordinatorConfig {
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
        store_timeout_ms: 1_000,
    }
}

/// Feeds `input`; a `PersistIds` among the actions is answered at once (the store is quick).
pub(super) fn step(c: &mut Coordinator, input: CoordInput) -> Vec<CoordAction> {
    let mut out = c.handle(input);
    let persisted: Vec<IdRecord> =
        out.iter().filter_map(|a| if let CoordAction::PersistIds(r) = a { Some(*r) } else { None }).collect();
    for r in persisted {
        out.extend(c.handle(CoordInput::IdsPersisted(r)));
    }
    out
}

pub(super) fn tick(c: &mut Coordinator, now: u64) -> Vec<CoordAction> {
    step(c, CoordInput::Tick { now })
}

fn trigger(c: &mut Coordinator) -> Vec<CoordAction> {
    step(c, CoordInput::Trigger { savepoint: false })
}

pub(super) fn started() -> Coordinator {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    for t in [1, 10, 20] {
        c.handle(CoordInput::Consensus { task: TaskId(t), latest: None, request: 1 });
    }
    c
}

pub(super) fn ok_report(id: CheckpointId, trans: TransId, v: u64) -> Report {
    Report { id, trans, outcome: Ok(Version(v)), manifest_crc: 1, stats: Default::default() }
}

#[test]
fn first_checkpoint_waits_for_the_start_delay_then_persists_the_id_before_asking_sources() {
    let mut c = started();
    assert!(tick(&mut c, 299).is_empty());
    let out = tick(&mut c, 300);
    let reserved = IdRecord { next_id: CheckpointId(1 + ID_BLOCK), next_trans: TransId(1 + ID_BLOCK) };
    assert_eq!(out[0], CoordAction::PersistIds(reserved));
    assert_eq!(
        out[1],
        CoordAction::SendSourceReq {
            task: TaskId(1),
            node: NodeId(1),
            id: C1,
            trans: T1,
            kind: weir_wire::msg::TriggerKind::Periodic,
            expire_at: 5_300
        }
    );
    assert_eq!(out.len(), 2, "only sources get the request");
}

#[test]
fn at_most_one_checkpoint_is_in_flight() {
    let mut c = started();
    tick(&mut c, 300);
    assert!(tick(&mut c, 2_000).is_empty());
    assert!(trigger(&mut c).is_empty());
    assert_eq!(c.in_flight(), Some(C1));
}

#[test]
fn report_with_another_id_or_transaction_is_rejected() {
    let mut c = started();
    tick(&mut c, 300);
    let out = c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C2, T1, 5) });
    assert!(matches!(&out[0], CoordAction::RejectedReport { task: TaskId(1), .. }));
    let out = c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, TransId(9), 5) });
    assert!(matches!(&out[0], CoordAction::RejectedReport { .. }));
}

#[test]
fn a_report_from_a_task_outside_the_stream_is_rejected_and_does_not_count() {
    let mut c = started();
    tick(&mut c, 300);
    let out = c.handle(CoordInput::Report { task: TaskId(99), report: ok_report(C1, T1, 5) });
    assert!(matches!(&out[0], CoordAction::RejectedReport { task: TaskId(99), .. }), "{out:?}");
    c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 5) });
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(C1, T1, 0) });
    assert!(out.is_empty(), "two of three tasks reported: {out:?}");
}

#[test]
fn commit_is_written_durably_before_any_task_hears_of_it() {
    let mut c = started();
    tick(&mut c, 300);
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
    tick(&mut c, 300);
    c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 1) });
    c.handle(CoordInput::Report { task: TaskId(1), report: ok_report(C1, T1, 1) }); // resent
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(C1, T1, 0) });
    assert!(out.is_empty());
}

#[test]
fn failure_report_resets_every_task_and_the_next_checkpoint_goes_ahead() {
    let mut c = started();
    tick(&mut c, 300);
    let mut bad = ok_report(C1, T1, 0);
    bad.outcome = Err(TaskFailure::Reported { reason: "upload failed".into() });
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: bad });
    let resets = out.iter().filter(|a| matches!(a, CoordAction::SendReset { failed: C1, .. })).count();
    assert_eq!(resets, 3);
    assert!(out.iter().any(|a| matches!(a, CoordAction::Finished { id: C1, outcome: Err(_), .. })));
    assert_eq!(c.in_flight(), None);
    assert!(tick(&mut c, 400).is_empty(), "the minimum pause holds");
    let out = tick(&mut c, 1_300);
    assert!(!out.iter().any(|a| matches!(a, CoordAction::PersistIds(_))), "id 2 is in the reserved block");
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C2, .. })));
}

#[test]
fn ids_are_reserved_in_blocks_and_a_restart_never_reuses_one() {
    let mut c = started();
    let mut persisted = IdRecord::default();
    let mut last = CheckpointId(0);
    for n in 0..(ID_BLOCK + 5) {
        let mut out = tick(&mut c, 1_000 + n * 10_000);
        out.extend(trigger(&mut c));
        let id = out.iter().find_map(|a| match a {
            CoordAction::SendSourceReq { id, .. } => Some(*id),
            _ => None,
        });
        let id = id.expect("a checkpoint starts");
        if let Some(CoordAction::PersistIds(p)) = out.first() {
            persisted = *p;
        }
        assert!(id > last && id < persisted.next_id, "id {id} used before it was reserved ({persisted:?})");
        last = id;
        // End it so the next one can start.
        tick(&mut c, 1_000 + n * 10_000 + 6_000);
    }
    // A restart from the persisted value starts past every id used.
    let mut r = Coordinator::new(coord_cfg());
    r.handle(CoordInput::Start { now: 0, ids: persisted, last_commit: None });
    for t in [TaskId(1), TaskId(10), TaskId(20)] {
        r.handle(CoordInput::Consensus { task: t, latest: None, request: 1 });
    }
    // Ids were used: the start from nothing is recorded, under an id of its own.
    r.handle(CoordInput::CommitDurable { id: persisted.next_id });
    let mut out = tick(&mut r, 1_000);
    out.extend(trigger(&mut r));
    let id = out.iter().find_map(|a| match a {
        CoordAction::SendSourceReq { id, .. } => Some(*id),
        _ => None,
    });
    let id = id.expect("a checkpoint starts");
    assert!(id > last);
    // The persisted record's own ids are past the reserved block: the first start reserves.
    assert_eq!(id, persisted.next_id.next());
    assert!(matches!(out[0], CoordAction::PersistIds(r) if r.next_id > id), "{out:?}");
}

#[test]
fn a_checkpoint_needs_its_transaction_reserved_as_well_as_its_id() {
    let mut c = started();
    let out = c.handle(CoordInput::Tick { now: 300 });
    let CoordAction::PersistIds(r) = out[0] else { panic!("{out:?}") };
    // A record that reserves ids but not transactions (as a damaged or foreign one could).
    let half = IdRecord { next_trans: TransId(1), ..r };
    assert!(c.handle(CoordInput::IdsPersisted(half)).is_empty(), "no checkpoint on an unreserved transaction");
    assert_eq!(c.in_flight(), None);
    // Nor the other way round.
    let mut c = started();
    c.handle(CoordInput::Tick { now: 300 });
    let half = IdRecord { next_id: C1, ..r };
    assert!(c.handle(CoordInput::IdsPersisted(half)).is_empty(), "no checkpoint on an unreserved id");
    assert_eq!(c.in_flight(), None);
}

#[test]
fn failed_id_reservations_count_against_the_streams_health() {
    let mut c = started();
    let mut now = 300;
    let mut health = Vec::new();
    for _ in 0..3 {
        c.handle(CoordInput::Tick { now });
        let out = c.handle(CoordInput::IdsFailed { reason: "store down".into() });
        health.push(out.iter().find_map(|a| match a {
            CoordAction::Health { healthy, consecutive_failures } => Some((*healthy, *consecutive_failures)),
            _ => None,
        }));
        now += 1_000;
    }
    assert_eq!(health, vec![None, Some((false, 2)), Some((false, 3))], "tolerable: 1");
    assert!(!c.healthy());
}

#[test]
fn checkpoint_running_past_the_timeout_fails() {
    let mut c = started();
    tick(&mut c, 300);
    assert!(tick(&mut c, 5_299).is_empty());
    let out = tick(&mut c, 5_300);
    assert!(
        out.iter().any(|a| matches!(
            a,
            CoordAction::Finished {
                started_at: 300,
                duration_ms: 5_000,
                outcome: Err(CheckpointFailure::TimedOut { after_ms: 5_000 }),
                ..
            }
        )),
        "{out:?}"
    );
}

#[test]
fn losing_a_node_fails_the_checkpoint() {
    let mut c = started();
    tick(&mut c, 300);
    let out = c.handle(CoordInput::NodeLost { node: NodeId(2) });
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendReset { .. })));
    assert!(c.handle(CoordInput::NodeLost { node: NodeId(3) }).is_empty());
}

#[test]
fn a_checkpoint_due_while_a_node_is_down_fails_at_once_until_the_node_is_back() {
    let mut c = started();
    assert!(c.handle(CoordInput::NodeLost { node: NodeId(2) }).is_empty(), "nothing in flight to fail");
    let out = tick(&mut c, 300);
    assert!(!out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { .. })), "{out:?}");
    assert!(
        out.iter().any(|a| matches!(
            a,
            CoordAction::Finished { id: C1, outcome: Err(CheckpointFailure::NodeDown { .. }), .. }
        )),
        "{out:?}"
    );
    assert_eq!(c.in_flight(), None);
    // A client going away is not a member going away.
    c.handle(CoordInput::NodeLost { node: NodeId(900) });
    c.handle(CoordInput::NodeUp { node: NodeId(2) });
    let out = tick(&mut c, 1_300);
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C2, .. })), "{out:?}");
}

#[test]
fn consecutive_failures_past_the_limit_make_the_stream_unhealthy_until_a_commit() {
    let mut c = started();
    assert!(c.healthy());
    let mut now = 300;
    for i in 0..2u64 {
        tick(&mut c, now);
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
    tick(&mut c, now);
    let id = c.in_flight().unwrap();
    let trans = TransId(3);
    for t in [1, 10, 20] {
        c.handle(CoordInput::Report { task: TaskId(t), report: ok_report(id, trans, 0) });
    }
    let out = c.handle(CoordInput::CommitDurable { id });
    assert!(out.contains(&CoordAction::Health { healthy: true, consecutive_failures: 0 }));
    assert!(c.healthy());
}

#[test]
fn manual_trigger_starts_a_checkpoint_now() {
    let mut c = started();
    let out = trigger(&mut c);
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C1, .. })));
}

/// Task `t` asks for its restore point with what it has; its request is `100 + t`.
fn ask(c: &mut Coordinator, t: u32, latest: u64) -> Vec<CoordAction> {
    c.handle(CoordInput::Consensus {
        task: TaskId(t),
        latest: (latest > 0).then_some(CheckpointId(latest)),
        request: 100 + u64::from(t),
    })
}

#[test]
fn restart_restores_the_last_commit_and_never_reuses_an_id() {
    let mut c = Coordinator::new(coord_cfg());
    let record = CommitRecord {
        id: CheckpointId(7),
        kind: RecordKind::Commit(TransId(7)),
        versions: [(TaskId(1), Version(900))].into_iter().collect(),
        manifests: Default::default(),
        ts: 1,
        shape: None,
        savepoint: false,
    };
    let ids = IdRecord { next_id: CheckpointId(5), next_trans: TransId(5) };
    // The tasks restore the record themselves; one that asks gets it, with its offset.
    assert!(c.handle(CoordInput::Start { now: 0, ids, last_commit: Some(record) }).is_empty());
    assert_eq!(
        ask(&mut c, 1, 3),
        vec![CoordAction::SendRestore {
            task: TaskId(1),
            node: NodeId(1),
            id: Some(CheckpointId(7)),
            version: Some(Version(900)),
            basis: RestoreBasis::Committed,
            request: 101
        }]
    );
    let out = trigger(&mut c);
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: CheckpointId(8), trans: TransId(8), .. })),
        "past the commit's id and transaction: {out:?}"
    );
}

/// The record `out` writes, once its id's reservation (answered by [`step`]) is durable.
fn written(out: &[CoordAction]) -> &CommitRecord {
    match out {
        [CoordAction::PersistIds(ids), CoordAction::WriteCommit(r)] if r.id < ids.next_id => r,
        _ => panic!("the choice's id is reserved, then the choice recorded: {out:?}"),
    }
}

/// `out` writes the record of the consensus's choice: it becomes durable, and the answers follow.
fn recorded(c: &mut Coordinator, out: Vec<CoordAction>) -> Vec<CoordAction> {
    let id = written(&out).id;
    c.handle(CoordInput::CommitDurable { id })
}

#[test]
fn restart_without_a_commit_record_uses_the_minimum_of_the_tasks_latest_ids() {
    let mut c = Coordinator::new(coord_cfg());
    assert!(c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None }).is_empty());
    ask(&mut c, 1, 4);
    ask(&mut c, 10, 3);
    // The choice is recorded before any task hears of it: a coordinator that restarts before
    // every task restored finds it, instead of choosing again without the restored tasks.
    let out = ask(&mut c, 20, 4);
    // Under an id of its own, past every id a task holds (4), reserved durably before the record
    // is written: no record key is written twice (a late write of an earlier coordinator
    // cannot land under it, nor a later one choose it again).
    let record = CommitRecord::consensus(CheckpointId(5), CheckpointId(3), 0);
    let ids = IdRecord { next_id: CheckpointId(6), next_trans: TransId(1) };
    assert_eq!(out, vec![CoordAction::PersistIds(ids)]);
    assert!(c.handle(CoordInput::Tick { now: 999 }).is_empty());
    assert_eq!(c.handle(CoordInput::Tick { now: 1_000 }), vec![CoordAction::PersistIds(ids)], "asked again");
    assert_eq!(c.handle(CoordInput::IdsPersisted(ids)), vec![CoordAction::WriteCommit(record.clone())]);
    assert!(c.handle(CoordInput::CommitFailed { id: CheckpointId(5), reason: "store down".into() }).is_empty());
    assert!(tick(&mut c, 1_050).is_empty());
    assert_eq!(tick(&mut c, 1_100), vec![CoordAction::WriteCommit(record)]);
    let out = c.handle(CoordInput::CommitDurable { id: CheckpointId(5) });
    assert_eq!(out.len(), 3);
    for (t, node, request) in [(1, 1, 101), (10, 1, 110), (20, 2, 120)] {
        assert!(
            out.contains(&CoordAction::SendRestore {
                task: TaskId(t),
                node: NodeId(node),
                id: Some(CheckpointId(3)),
                version: None,
                basis: RestoreBasis::Consensus,
                request
            }),
            "{out:?}"
        );
    }
    let last = c.last_commit().expect("the consensus record");
    assert_eq!((last.id, last.restore_point()), (CheckpointId(5), Some(CheckpointId(3))));
    // A task still reporting the chosen checkpoint hears it committed (every task had it), under
    // that checkpoint's id, not the record's.
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(CheckpointId(3), TransId(3), 0) });
    assert!(
        out.iter().any(|a| matches!(
            a,
            CoordAction::SendUpdate { task: TaskId(10), id: CheckpointId(3), trans: TransId(3), .. }
        )),
        "{out:?}"
    );
    let out = trigger(&mut c);
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: CheckpointId(6), .. })),
        "the next checkpoint is past the record's id: {out:?}"
    );
}

#[test]
fn consensus_gives_up_waiting_and_counts_silent_tasks_as_empty() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    ask(&mut c, 1, 4);
    let out = tick(&mut c, 2_000);
    // Under an id past the 4 task 1 holds, though no id was ever reserved: the next
    // checkpoints must not take ids its snapshots have.
    assert_eq!(written(&out), &CommitRecord::fresh(CheckpointId(5), 2_000), "start from nothing, recorded");
    let out = recorded(&mut c, out);
    assert!(matches!(out[..], [CoordAction::SendRestore { id: None, request: 101, .. }]), "{out:?}");
    let out = trigger(&mut c);
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: CheckpointId(6), .. })),
        "past the record's id: {out:?}"
    );
}

#[test]
fn a_new_stream_starts_from_nothing_without_a_record() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    ask(&mut c, 1, 0);
    ask(&mut c, 10, 0);
    let out = ask(&mut c, 20, 0);
    assert_eq!(out.len(), 3, "answered at once: {out:?}");
    assert!(out.iter().all(|a| matches!(a, CoordAction::SendRestore { id: None, .. })), "{out:?}");
    assert!(trigger(&mut c).iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C1, .. })));
}

#[test]
fn a_start_from_nothing_is_recorded_and_a_restarted_coordinator_makes_it_again() {
    // Commit records lost: the tasks committed 4 once, but task 10 and 20 stay silent.
    let ids = IdRecord { next_id: CheckpointId(17), next_trans: TransId(17) };
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids, last_commit: None });
    ask(&mut c, 1, 4);
    let out = tick(&mut c, 2_000);
    let fresh = CommitRecord::fresh(CheckpointId(17), 2_000);
    assert_eq!(written(&out), &fresh);
    assert_eq!(recorded(&mut c, out).len(), 1, "task 1 starts from nothing");
    // The coordinator dies. The next one reads the record; task 1 does not ask again, but a
    // stale request of it (from before it restored) still says 4, as do the two others.
    let mut r = Coordinator::new(coord_cfg());
    assert!(r.handle(CoordInput::Start { now: 0, ids, last_commit: Some(fresh) }).is_empty());
    for t in [1, 10, 20] {
        let out = ask(&mut r, t, 4);
        assert!(
            matches!(out[..], [CoordAction::SendRestore { id: None, .. }]),
            "t{t} starts from nothing too: {out:?}"
        );
    }
    let out = trigger(&mut r);
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: CheckpointId(18), .. })),
        "past the record's id: {out:?}"
    );
}

#[test]
fn a_task_that_asks_again_gets_the_restore_point_already_chosen() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    for (t, l) in [(1, 4), (10, 3), (20, 4)] {
        ask(&mut c, t, l);
    }
    // The record of the choice of 3, under an id of its own.
    c.handle(CoordInput::CommitDurable { id: CheckpointId(5) });
    // Its answer was lost: the task asks again with what it has, and the choice stands.
    let again = CoordInput::Consensus { task: TaskId(10), latest: Some(CheckpointId(3)), request: 7 };
    assert_eq!(
        c.handle(again),
        vec![CoordAction::SendRestore {
            task: TaskId(10),
            node: NodeId(1),
            id: Some(CheckpointId(3)),
            version: None,
            basis: RestoreBasis::Consensus,
            request: 7
        }]
    );
    assert!(ask(&mut c, 99, 1).is_empty(), "not a task of the stream");
}

#[test]
fn a_task_asking_after_the_wait_gets_the_same_restore_point_as_the_others() {
    let mut c = Coordinator::new(coord_cfg());
    assert!(ask(&mut c, 1, 2).is_empty(), "before start: ask again");
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    ask(&mut c, 1, 4);
    ask(&mut c, 10, 4);
    let out = tick(&mut c, 2_000);
    let out = recorded(&mut c, out);
    assert_eq!(out.len(), 2, "the two that asked: {out:?}");
    // Task 20 comes late, with a checkpoint: it starts empty like the others, or the cut breaks.
    let out = ask(&mut c, 20, 4);
    assert!(matches!(out[..], [CoordAction::SendRestore { task: TaskId(20), id: None, .. }]), "{out:?}");
}

#[test]
fn a_checkpoint_never_starts_when_its_ids_could_not_be_made_durable() {
    let mut c = started();
    let out = c.handle(CoordInput::Tick { now: 300 });
    assert!(matches!(out[..], [CoordAction::PersistIds(_)]), "only the reservation: {out:?}");
    assert_eq!(c.in_flight(), None, "nothing starts before the ids are durable");
    let out = c.handle(CoordInput::IdsFailed { reason: "store down".into() });
    assert!(matches!(&out[0], CoordAction::IdsNotDurable { .. }), "{out:?}");
    assert!(!out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { .. })));
    assert_eq!(c.in_flight(), None);
    // The next attempt reserves again (after the pause), and starts once the record is durable.
    assert!(c.handle(CoordInput::Tick { now: 400 }).is_empty(), "the minimum pause holds");
    let out = c.handle(CoordInput::Tick { now: 600 });
    let CoordAction::PersistIds(r) = out[0] else { panic!("{out:?}") };
    let out = c.handle(CoordInput::IdsPersisted(r));
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C1, trans: T1, .. })), "{out:?}");
}

#[test]
fn an_id_record_write_that_never_answers_fails_after_the_store_timeout() {
    let mut c = started();
    let out = c.handle(CoordInput::Tick { now: 300 });
    let CoordAction::PersistIds(r) = out[0] else { panic!("{out:?}") };
    assert!(c.handle(CoordInput::Tick { now: 1_299 }).is_empty());
    let out = c.handle(CoordInput::Tick { now: 1_300 });
    assert!(matches!(&out[0], CoordAction::IdsNotDurable { .. }), "{out:?}");
    assert_eq!(c.in_flight(), None);
    // The write lands after all: nothing starts on the late answer, but its ids are reserved,
    // so the next checkpoint starts without another write.
    assert!(c.handle(CoordInput::IdsPersisted(r)).is_empty());
    assert_eq!(c.in_flight(), None);
    let out = c.handle(CoordInput::Tick { now: 1_600 });
    assert!(matches!(out[..], [CoordAction::SendSourceReq { id: C1, .. }]), "{out:?}");
}

#[test]
fn transaction_ids_survive_restarts() {
    let mut c = started();
    let out = tick(&mut c, 300);
    let reserved = out
        .iter()
        .find_map(|a| if let CoordAction::PersistIds(r) = a { Some(*r) } else { None })
        .expect("a reservation");
    // Restarted from the durable record: both the id and the transaction come from past it.
    let mut r = Coordinator::new(coord_cfg());
    r.handle(CoordInput::Start { now: 0, ids: reserved, last_commit: None });
    for t in [1, 10, 20] {
        r.handle(CoordInput::Consensus { task: TaskId(t), latest: None, request: 1 });
    }
    r.handle(CoordInput::CommitDurable { id: reserved.next_id });
    let out = trigger(&mut r);
    let started = out.iter().find_map(|a| match a {
        CoordAction::SendSourceReq { id, trans, .. } => Some((*id, *trans)),
        _ => None,
    });
    let (id, trans) = started.expect("a checkpoint starts");
    assert!(id >= reserved.next_id && trans >= reserved.next_trans, "({id}, {trans}) reused below {reserved:?}");
}

#[test]
fn a_source_refusal_ends_the_checkpoint_at_once() {
    for answer in [
        SourceAnswer::Busy(C3),
        SourceAnswer::AlreadyCompleted(C2),
        SourceAnswer::AlreadyFailed(C2),
        SourceAnswer::NotSource,
        SourceAnswer::Failed("disk full".into()),
        SourceAnswer::NotRestored,
    ] {
        let mut c = started();
        tick(&mut c, 300);
        let done = CoordInput::SourceRsp { task: TaskId(1), id: C1, trans: T1, answer: SourceAnswer::Done(Version(5)) };
        assert!(c.handle(done).is_empty(), "a source that built its part reports");
        let stale = CoordInput::SourceRsp { task: TaskId(1), id: C2, trans: T1, answer: answer.clone() };
        assert!(c.handle(stale).is_empty(), "an answer for another checkpoint changes nothing");
        let out = c.handle(CoordInput::SourceRsp { task: TaskId(1), id: C1, trans: T1, answer: answer.clone() });
        assert!(
            out.iter().any(|a| matches!(
                a,
                CoordAction::Finished { id: C1, outcome: Err(CheckpointFailure::SourceRefused { .. }), .. }
            )),
            "{answer:?}: {out:?}"
        );
        assert_eq!(out.iter().filter(|a| matches!(a, CoordAction::SendReset { failed: C1, .. })).count(), 3);
        assert_eq!(c.in_flight(), None);
    }
}

#[test]
fn a_commit_write_that_never_answers_fails_and_a_late_answer_makes_it_the_last_commit() {
    let mut c = started();
    tick(&mut c, 300);
    for t in [1, 10, 20] {
        c.handle(CoordInput::Report { task: TaskId(t), report: ok_report(C1, T1, 7) });
    }
    assert!(tick(&mut c, 1_299).is_empty());
    let out = tick(&mut c, 1_300);
    assert!(
        out.iter().any(|a| matches!(
            a,
            CoordAction::Finished { id: C1, outcome: Err(CheckpointFailure::CommitUnanswered { .. }), .. }
        )),
        "{out:?}"
    );
    assert!(c.last_commit().is_none());
    // The record did become visible: it is a restore point, though no task heard of it.
    assert!(c.handle(CoordInput::CommitDurable { id: C1 }).is_empty());
    assert_eq!(c.last_commit().map(|r| r.id), Some(C1));
}

/// Checkpoint `id` of `c` (started) with every report in: its commit record is being written.
fn committing(c: &mut Coordinator, now: u64) -> (CheckpointId, Vec<CoordAction>) {
    tick(c, now);
    let id = c.in_flight().expect("a checkpoint in flight");
    let trans = TransId(id.0);
    let mut out = Vec::new();
    for t in [1, 10, 20] {
        out = c.handle(CoordInput::Report { task: TaskId(t), report: ok_report(id, trans, 0) });
    }
    assert!(matches!(out[..], [CoordAction::WriteCommit(_)]), "{out:?}");
    (id, out)
}

#[test]
fn a_late_answer_about_an_older_commit_changes_neither_the_flight_nor_the_last_commit() {
    let mut c = started();
    // C1 commits.
    let (c1, _) = committing(&mut c, 300);
    c.handle(CoordInput::CommitDurable { id: c1 });
    // C2's write does not answer in time: given up, outcome unknown.
    let (c2, _) = committing(&mut c, 1_300);
    tick(&mut c, 2_300);
    assert_eq!(c.in_flight(), None);
    // C3 commits; then C2's write turns out durable: C3 stays the last commit.
    let (c3, _) = committing(&mut c, 2_600);
    // A late failure of C2's write says nothing about C3's.
    assert!(c.handle(CoordInput::CommitFailed { id: c2, reason: "late".into() }).is_empty());
    assert_eq!(c.in_flight(), Some(c3));
    c.handle(CoordInput::CommitDurable { id: c3 });
    assert!(c.handle(CoordInput::CommitDurable { id: c2 }).is_empty());
    assert_eq!(c.last_commit().map(|r| r.id), Some(c3));
}

#[test]
fn a_late_answer_about_a_newer_commit_makes_it_the_last_commit() {
    let mut c = started();
    let (c1, _) = committing(&mut c, 300);
    c.handle(CoordInput::CommitDurable { id: c1 });
    let (c2, _) = committing(&mut c, 1_300);
    tick(&mut c, 2_300); // given up
    c.handle(CoordInput::CommitDurable { id: c2 });
    assert_eq!(c.last_commit().map(|r| r.id), Some(c2));
}

#[test]
fn the_consensus_record_is_written_again_while_the_store_does_not_answer() {
    let mut c = Coordinator::new(coord_cfg());
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    for t in [1, 10, 20] {
        ask(&mut c, t, 4);
    }
    let again = vec![CoordAction::WriteCommit(CommitRecord::consensus(CheckpointId(5), CheckpointId(4), 0))];
    assert!(tick(&mut c, 999).is_empty(), "no answer yet: wait the store timeout");
    // The reservation of its id first (answered at once here), then the record.
    let ids = CoordAction::PersistIds(IdRecord { next_id: CheckpointId(6), next_trans: TransId(1) });
    assert_eq!(tick(&mut c, 1_000), [vec![ids], again.clone()].concat());
    assert!(tick(&mut c, 1_001).is_empty());
    assert!(tick(&mut c, 1_999).is_empty());
    assert_eq!(tick(&mut c, 2_000), again);
}

#[test]
fn an_interval_of_zero_turns_periodic_checkpoints_off_and_manual_ones_still_run() {
    let mut c = Coordinator::new(CoordinatorConfig { interval_ms: 0, ..coord_cfg() });
    c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None });
    for t in [1, 10, 20] {
        ask(&mut c, t, 0);
    }
    for now in [300, 1_000, 10_000, 100_000] {
        assert!(tick(&mut c, now).is_empty(), "no checkpoint at {now}");
    }
    assert!(trigger(&mut c).iter().any(|a| matches!(a, CoordAction::SendSourceReq { id: C1, .. })));
}

#[test]
fn a_commit_after_failures_reports_the_stream_healthy_again_and_a_plain_commit_says_nothing() {
    let mut c = started();
    let (c1, _) = committing(&mut c, 300);
    let out = c.handle(CoordInput::CommitDurable { id: c1 });
    assert!(!out.iter().any(|a| matches!(a, CoordAction::Health { .. })), "{out:?}");
    // One failure: still within the tolerable one, so healthy, but the count starts.
    tick(&mut c, 1_300);
    c.handle(CoordInput::NodeLost { node: NodeId(1) });
    c.handle(CoordInput::NodeUp { node: NodeId(1) });
    assert!(c.healthy());
    let (c3, _) = committing(&mut c, 2_300);
    let out = c.handle(CoordInput::CommitDurable { id: c3 });
    assert!(out.contains(&CoordAction::Health { healthy: true, consecutive_failures: 0 }), "{out:?}");
}

#[test]
fn a_task_still_reporting_an_ended_checkpoint_is_told_again_how_it_ended() {
    let mut c = started();
    // C1 fails; task 20's reset is lost, so it keeps resending its report of C1.
    tick(&mut c, 300);
    c.handle(CoordInput::NodeLost { node: NodeId(2) });
    c.handle(CoordInput::NodeUp { node: NodeId(2) });
    let out = c.handle(CoordInput::Report { task: TaskId(20), report: ok_report(C1, T1, 0) });
    assert!(out.iter().any(|a| matches!(a, CoordAction::SendReset { task: TaskId(20), failed: C1, .. })), "{out:?}");
    // C2 commits; task 10's update is lost.
    let (c2, _) = committing(&mut c, 1_300);
    c.handle(CoordInput::CommitDurable { id: c2 });
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(c2, TransId(2), 0) });
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::SendUpdate { task: TaskId(10), id, .. } if *id == c2)),
        "{out:?}"
    );
    // A report of C1 still, after C2 committed: C1 failed, whatever committed since.
    let out = c.handle(CoordInput::Report { task: TaskId(20), report: ok_report(C1, T1, 0) });
    assert!(
        matches!(
            out[..],
            [CoordAction::RejectedReport { .. }, CoordAction::SendReset { task: TaskId(20), failed: C1, .. }]
        ),
        "{out:?}"
    );
    // Reports of the checkpoint in flight, or of one not allocated yet, are only rejected.
    tick(&mut c, 2_300);
    let now = c.in_flight().unwrap();
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(now, TransId(9), 0) });
    assert!(matches!(out[..], [CoordAction::RejectedReport { .. }]), "{out:?}");
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: ok_report(CheckpointId(99), T1, 0) });
    assert!(matches!(out[..], [CoordAction::RejectedReport { .. }]), "{out:?}");
}
