//! Savepoints: asked for until one commits, and told to the sources.

use super::coordinator::{ok_report, started, step, tick};
use super::*;
use crate::checkpoint::TaskFailure;
use weir_wire::msg::TriggerKind;

/// The kind of the source request among `out`, if any.
fn kind_asked(out: &[CoordAction]) -> Option<TriggerKind> {
    out.iter().find_map(|a| match a {
        CoordAction::SendSourceReq { kind, .. } => Some(kind.clone()),
        _ => None,
    })
}

#[test]
fn a_savepoint_is_asked_for_until_one_commits() {
    let mut c = started();
    let out = step(&mut c, CoordInput::Trigger { savepoint: true });
    assert_eq!(kind_asked(&out), Some(TriggerKind::Savepoint), "{out:?}");
    // The savepoint fails (an agg replaying refuses it): the next checkpoint is one again.
    let mut bad = ok_report(C1, T1, 0);
    bad.outcome = Err(TaskFailure::Reported { reason: "replaying".into() });
    let out = c.handle(CoordInput::Report { task: TaskId(10), report: bad });
    assert!(out.iter().any(|a| matches!(a, CoordAction::Finished { id: C1, savepoint: true, outcome: Err(_), .. })));
    let out = tick(&mut c, 1_500);
    assert_eq!(kind_asked(&out), Some(TriggerKind::Savepoint), "{out:?}");
    let id = c.in_flight().expect("started");
    for t in [1, 10, 20] {
        c.handle(CoordInput::Report { task: TaskId(t), report: ok_report(id, TransId(2), 0) });
    }
    let out = c.handle(CoordInput::CommitDurable { id });
    assert!(out.iter().any(|a| matches!(a, CoordAction::Finished { savepoint: true, outcome: Ok(()), .. })), "{out:?}");
    // Committed: the next checkpoints are periodic ones.
    let out = tick(&mut c, 3_000);
    assert_eq!(kind_asked(&out), Some(TriggerKind::Periodic), "{out:?}");
}

#[test]
fn a_manual_checkpoint_is_no_savepoint() {
    let mut c = started();
    let out = step(&mut c, CoordInput::Trigger { savepoint: false });
    assert_eq!(kind_asked(&out), Some(TriggerKind::Manual), "{out:?}");
}

#[test]
fn a_source_asked_for_a_savepoint_queues_a_savepoint_trigger() {
    let mut m = source();
    let out = m.handle(TaskInput::SourceReq { id: C1, trans: T1, kind: TriggerKind::Savepoint, expire_at: u64::MAX });
    assert_eq!(out, vec![TaskAction::QueueSourceTrigger { id: C1, trans: T1, savepoint: true }]);
}
