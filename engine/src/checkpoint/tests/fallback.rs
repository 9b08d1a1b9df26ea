//! The coordinator taking the stream back to an older commit when a task cannot restore the last.

use super::coordinator::{coord_cfg, step, tick};
use super::*;
use weir_wire::msg::RestoreBasis;

const TASKS: [(u32, u32); 3] = [(1, 1), (10, 1), (20, 2)];

fn commit(id: u64) -> CommitRecord {
    CommitRecord {
        id: CheckpointId(id),
        kind: RecordKind::Commit(TransId(id)),
        versions: [(TaskId(1), Version(id * 100))].into_iter().collect(),
        manifests: Default::default(),
        ts: 1,
        shape: None,
        savepoint: false,
    }
}

/// A coordinator restarted with commit 7 as its last record.
fn restarted_at_7() -> Coordinator {
    let mut c = Coordinator::new(coord_cfg());
    let ids = IdRecord { next_id: CheckpointId(8), next_trans: TransId(8) };
    assert!(c.handle(CoordInput::Start { now: 0, ids, last_commit: Some(commit(7)) }).is_empty());
    c
}

/// Task `t` cannot restore `id`; its node can restore `restorable`.
fn cannot(c: &mut Coordinator, t: u32, id: u64, restorable: &[u64]) -> Vec<CoordAction> {
    step(c, cannot_input(t, id, restorable))
}

fn cannot_input(t: u32, id: u64, restorable: &[u64]) -> CoordInput {
    CoordInput::CannotRestore {
        task: TaskId(t),
        id: CheckpointId(id),
        restorable: restorable.iter().map(|r| CheckpointId(*r)).collect(),
        reason: format!("corrupt object of t{t}"),
        request: 100 + u64::from(t),
    }
}

fn restores(out: &[CoordAction]) -> Vec<(TaskId, Option<CheckpointId>, RestoreBasis)> {
    out.iter()
        .filter_map(|a| match a {
            CoordAction::SendRestore { task, id, basis, .. } => Some((*task, *id, basis.clone())),
            _ => None,
        })
        .collect()
}

fn written(out: &[CoordAction]) -> Option<CommitRecord> {
    out.iter().find_map(|a| if let CoordAction::WriteCommit(r) = a { Some(r.clone()) } else { None })
}

#[test]
fn a_damaged_restore_point_takes_the_whole_stream_back_to_the_newest_commit_every_task_can_restore() {
    let mut c = restarted_at_7();
    // Node 1 found task 10's files of 7 damaged: both its tasks ask; node 2 can go back to 5 only.
    assert!(cannot(&mut c, 1, 7, &[6, 5, 4]).is_empty(), "waits for every task");
    assert!(cannot(&mut c, 10, 7, &[6, 5, 4]).is_empty());
    let out = cannot(&mut c, 20, 7, &[5, 4]);
    assert!(
        matches!(&out[0], CoordAction::FallingBack { from, to: Some(to), reason }
            if *from == CheckpointId(7) && *to == CheckpointId(5) && reason.contains("t10")),
        "one line saying what was wrong: {out:?}"
    );
    // Recorded before any task hears it, under an id of its own above 7.
    let record = written(&out).expect("the fallback is recorded");
    assert_eq!(record.kind, RecordKind::Fallback(CheckpointId(5)));
    assert!(record.id > CheckpointId(7), "{record:?}");
    assert_eq!(record.restore_point(), Some(CheckpointId(5)));
    assert!(restores(&out).is_empty(), "no task hears it before it is durable");
    let out = step(&mut c, CoordInput::CommitDurable { id: record.id });
    let mut got = restores(&out);
    got.sort_by_key(|r| r.0);
    let want: Vec<_> = TASKS.iter().map(|(t, _)| (TaskId(*t), Some(CheckpointId(5)), RestoreBasis::Fallback)).collect();
    assert_eq!(got, want);
    // The next checkpoint takes an id above the fallback record's.
    let out = step(&mut c, CoordInput::Trigger { savepoint: false });
    let first = out.iter().find_map(|a| if let CoordAction::SendSourceReq { id, .. } = a { Some(*id) } else { None });
    assert!(first.is_some_and(|id| id > record.id), "{out:?}");
}

#[test]
fn a_restarted_coordinator_finds_the_fallback_record_and_every_task_restores_its_checkpoint() {
    let mut c = Coordinator::new(coord_cfg());
    let record = CommitRecord::fallback(CheckpointId(9), CheckpointId(5), 3);
    let ids = IdRecord { next_id: CheckpointId(10), next_trans: TransId(8) };
    assert!(c.handle(CoordInput::Start { now: 0, ids, last_commit: Some(record) }).is_empty());
    let out = step(&mut c, CoordInput::Consensus { task: TaskId(20), latest: Some(CheckpointId(7)), request: 4 });
    assert_eq!(restores(&out), vec![(TaskId(20), Some(CheckpointId(5)), RestoreBasis::Fallback)]);
}

#[test]
fn with_no_older_commit_every_task_can_restore_the_stream_halts_instead_of_starting_empty() {
    let mut c = restarted_at_7();
    cannot(&mut c, 1, 7, &[6]);
    cannot(&mut c, 10, 7, &[6]);
    let out = cannot(&mut c, 20, 7, &[5]);
    assert!(written(&out).is_none(), "nothing recorded: {out:?}");
    assert!(restores(&out).is_empty(), "no task starts, least of all from nothing: {out:?}");
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::Halt { reason } if reason.contains("does not start empty"))),
        "{out:?}"
    );
    assert!(tick(&mut c, 10_000).is_empty(), "halted: no checkpoint starts");
}

#[test]
fn tasks_that_restored_the_damaged_point_already_halt_the_stream_once_the_fallback_is_recorded() {
    let mut c = restarted_at_7();
    // Node 2 restored 7 from the record and runs; node 1 cannot.
    cannot(&mut c, 1, 7, &[6]);
    cannot(&mut c, 10, 7, &[6]);
    assert!(tick(&mut c, 1_999).is_empty(), "waits for the others up to the consensus wait");
    let out = tick(&mut c, 2_000);
    let record = written(&out).expect("recorded, so a restart of every node goes back together");
    assert_eq!(record.restore_point(), Some(CheckpointId(6)));
    let out = step(&mut c, CoordInput::CommitDurable { id: record.id });
    assert!(restores(&out).is_empty(), "{out:?}");
    assert!(
        out.iter().any(|a| matches!(a, CoordAction::Halt { reason } if reason.contains("t20") && reason.contains("restart every node"))),
        "{out:?}"
    );
}

/// Every task asks to go back from `id`, able to restore `best` only; returns the record written.
fn all_cannot(c: &mut Coordinator, id: u64, best: u64) -> CommitRecord {
    let mut out = Vec::new();
    for (t, _) in TASKS {
        out = cannot(c, t, id, &[best]);
    }
    written(&out).expect("decided on the last request")
}

#[test]
fn a_task_that_cannot_restore_the_fallback_point_either_takes_the_stream_further_back() {
    let mut c = restarted_at_7();
    let r1 = all_cannot(&mut c, 7, 6);
    assert_eq!(r1.restore_point(), Some(CheckpointId(6)));
    assert_eq!(restores(&step(&mut c, CoordInput::CommitDurable { id: r1.id })).len(), 3);
    // A task finds 6 damaged as it restores it: the stream goes further back, recorded anew.
    let r2 = all_cannot(&mut c, 6, 4);
    assert_eq!(r2.restore_point(), Some(CheckpointId(4)));
    assert!(r2.id > r1.id, "sorts above the first fallback: {r2:?} {r1:?}");
    let got = restores(&step(&mut c, CoordInput::CommitDurable { id: r2.id }));
    assert!(got.len() == 3 && got.iter().all(|r| r.1 == Some(CheckpointId(4))), "{got:?}");
}

#[test]
fn a_stale_cannot_restore_for_a_point_given_up_already_is_answered_with_the_current_one() {
    let mut c = restarted_at_7();
    let record = all_cannot(&mut c, 7, 5);
    step(&mut c, CoordInput::CommitDurable { id: record.id });
    // Task 10's request, sent again before the answer reached it.
    let out = cannot(&mut c, 10, 7, &[6]);
    assert_eq!(restores(&out), vec![(TaskId(10), Some(CheckpointId(5)), RestoreBasis::Fallback)]);
}

#[test]
fn the_stream_goes_back_to_the_newest_commit_that_every_node_can_restore_not_the_oldest_of_their_newest() {
    let mut c = restarted_at_7();
    // Node 1 can restore 6 and 4 (5 is damaged there); node 2 can restore 5 and 4.
    cannot(&mut c, 1, 7, &[6, 4]);
    cannot(&mut c, 10, 7, &[6, 4]);
    let record = written(&cannot(&mut c, 20, 7, &[5, 4])).expect("decided");
    assert_eq!(record.restore_point(), Some(CheckpointId(4)), "5 is not restorable on node 1");
}

#[test]
fn a_task_asking_plainly_during_a_fallback_may_hold_the_damaged_point_and_the_stream_halts() {
    let mut c = restarted_at_7();
    cannot(&mut c, 1, 7, &[6, 5]);
    cannot(&mut c, 10, 7, &[6, 5]);
    // Node 2 found nothing wrong: it may have been told 7 by an earlier coordinator already.
    let out = step(&mut c, CoordInput::Consensus { task: TaskId(20), latest: Some(CheckpointId(7)), request: 9 });
    assert!(out.is_empty(), "{out:?}");
    let record = written(&tick(&mut c, 2_000)).expect("recorded at the wait's end");
    assert_eq!(record.restore_point(), Some(CheckpointId(6)));
    let out = step(&mut c, CoordInput::CommitDurable { id: record.id });
    assert!(out.iter().any(|a| matches!(a, CoordAction::Halt { reason } if reason.contains("t20"))), "{out:?}");
}

#[test]
fn a_task_told_the_damaged_point_already_cannot_go_back_with_the_others_even_when_it_asks_again() {
    let mut c = restarted_at_7();
    // Task 20 asks first and is told 7; its answer may still be on its way when it asks again.
    let ask = |c: &mut Coordinator| step(c, CoordInput::Consensus { task: TaskId(20), latest: None, request: 9 });
    assert_eq!(restores(&ask(&mut c)), vec![(TaskId(20), Some(CheckpointId(7)), RestoreBasis::Committed)]);
    cannot(&mut c, 1, 7, &[6]);
    cannot(&mut c, 10, 7, &[6]);
    assert!(ask(&mut c).is_empty(), "not counted as going back");
    let record = written(&tick(&mut c, 2_000)).expect("recorded at the wait's end");
    let out = step(&mut c, CoordInput::CommitDurable { id: record.id });
    assert!(restores(&out).is_empty(), "{out:?}");
    assert!(out.iter().any(|a| matches!(a, CoordAction::Halt { reason } if reason.contains("t20"))), "{out:?}");
}

#[test]
fn a_fallback_while_a_block_of_ids_is_on_its_way_neither_moves_the_id_record_back_nor_starts_a_checkpoint_early() {
    let mut c = restarted_at_7();
    // A checkpoint is due: its block of ids is asked for, and the answer has not come yet.
    let out = c.handle(CoordInput::Tick { now: 300 });
    let Some(CoordAction::PersistIds(block)) = out.first().cloned() else { panic!("{out:?}") };
    // Meanwhile every task finds 7 damaged: the fallback record's id is reserved first.
    assert!(c.handle(cannot_input(1, 7, &[5])).is_empty());
    assert!(c.handle(cannot_input(10, 7, &[5])).is_empty());
    let out = c.handle(cannot_input(20, 7, &[5]));
    let asked = out.iter().find_map(|a| if let CoordAction::PersistIds(r) = a { Some(*r) } else { None });
    let asked = asked.expect("the fallback's id is reserved before its record is written");
    // Written after the block (the store writes in order, each write replacing the last): it
    // asks for at least as much, or a restarted coordinator would reuse the block's ids.
    assert!(asked.next_id >= block.next_id && asked.next_trans >= block.next_trans, "{asked:?} after {block:?}");
    // The block's answer comes while the fallback is being recorded: no checkpoint starts
    // (and the record, whose id the block covers, may be written already).
    let mut out = c.handle(CoordInput::IdsPersisted(block));
    assert!(!out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { .. })), "{out:?}");
    out.extend(c.handle(CoordInput::IdsPersisted(asked)));
    assert!(!out.iter().any(|a| matches!(a, CoordAction::SendSourceReq { .. })), "{out:?}");
    let record = written(&out).expect("then the record");
    let out = step(&mut c, CoordInput::CommitDurable { id: record.id });
    assert_eq!(restores(&out).len(), TASKS.len());
    // Once the tasks heard it, the next checkpoint starts, above the record's id.
    let out = tick(&mut c, 2_000);
    let first = out.iter().find_map(|a| if let CoordAction::SendSourceReq { id, .. } = a { Some(*id) } else { None });
    assert!(first.is_some_and(|id| id > record.id), "{out:?}");
}

#[test]
fn a_task_that_cannot_restore_during_a_consensus_keeps_the_damaged_checkpoints_id_from_being_taken_again() {
    // No commit record and no id record: the tasks say what they hold.
    let mut c = Coordinator::new(coord_cfg());
    assert!(c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None }).is_empty());
    assert!(c.handle(cannot_input(1, 9, &[5])).is_empty());
    assert!(
        c.handle(CoordInput::Consensus { task: TaskId(10), latest: Some(CheckpointId(5)), request: 110 }).is_empty()
    );
    let out = step(&mut c, CoordInput::Consensus { task: TaskId(20), latest: Some(CheckpointId(5)), request: 120 });
    let record = written(&out).expect("the consensus is recorded");
    assert_eq!(record.restore_point(), Some(CheckpointId(5)));
    assert!(record.id > CheckpointId(9), "not under the damaged checkpoint's key: {record:?}");
}

#[test]
fn a_damaged_checkpoint_heard_of_while_the_consensus_is_recorded_is_never_taken_by_a_later_checkpoint() {
    let mut c = Coordinator::new(coord_cfg());
    assert!(c.handle(CoordInput::Start { now: 0, ids: IdRecord::default(), last_commit: None }).is_empty());
    for t in [10, 20] {
        let _ = c.handle(CoordInput::Consensus { task: TaskId(t), latest: Some(CheckpointId(5)), request: 100 });
    }
    // Task 1 is silent: at the deadline the choice (from nothing) is recorded.
    let out = tick(&mut c, 2_000);
    let record = written(&out).expect("the choice is recorded");
    // Task 1 then says it cannot restore its checkpoint 9 (the id record was behind).
    let _ = c.handle(cannot_input(1, 9, &[5]));
    let _ = step(&mut c, CoordInput::CommitDurable { id: record.id });
    let out = step(&mut c, CoordInput::Trigger { savepoint: false });
    let first = out.iter().find_map(|a| if let CoordAction::SendSourceReq { id, .. } = a { Some(*id) } else { None });
    assert!(first.is_some_and(|id| id > CheckpointId(9)), "{out:?}");
}
