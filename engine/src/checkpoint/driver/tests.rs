//! The drivers' own scenarios, with a port and effects that record what they are asked to do and
//! a clock the test moves.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use weir_wire::msg::{RestoreBasis, TriggerKind, TriggerRspCode};
use weir_wire::{CheckpointId, Seq, TaskId, TransId, Version};

use super::*;
use crate::checkpoint::tests::setup;
use crate::checkpoint::{CheckpointError, CoordInput, Role, TaskInput, TaskMachine, TaskSetup, UploadDone};

const C1: CheckpointId = CheckpointId(1);
const T1: TransId = TransId(1);
/// The wall clock's epoch in these tests (µs): wall = epoch + monotonic.
const EPOCH_US: u64 = 1_700_000_000_000_000;

/// What the fakes saw, and the clock (µs, monotonic).
#[derive(Default)]
struct Seen {
    clock: Cell<u64>,
    /// Each `capture` takes this long.
    capture_us: Cell<u64>,
    closed: RefCell<Vec<usize>>,
    /// `close_input` cuts instead of closing.
    cut: Cell<bool>,
    queued: RefCell<Vec<CheckpointId>>,
    forwarded: RefCell<Vec<CheckpointId>>,
    next_seq: Cell<Option<Seq>>,
    restored: RefCell<Vec<Option<RestorePoint>>>,
    to_tasks: RefCell<Vec<(TaskId, TaskInput)>>,
    to_coord: RefCell<Vec<CoordInput>>,
    uploads: RefCell<Vec<(CheckpointId, Version, u64)>>,
    pauses: RefCell<Vec<u64>>,
    aligning: RefCell<Vec<bool>>,
    basis: RefCell<Vec<(RestoreBasis, Option<CheckpointId>)>>,
    committed: RefCell<Option<(CheckpointId, Version)>>,
}

struct Port(Rc<Seen>);
struct Fx(Rc<Seen>);

impl TaskPort for Port {
    type Captured = u64;
    fn close_input(&mut self, i: usize, _id: CheckpointId) -> Hold {
        if self.0.cut.get() {
            return Hold::Cut;
        }
        self.0.closed.borrow_mut().push(i);
        Hold::Closed
    }
    fn reopen_input(&mut self, _i: usize) {}
    fn reopen_all_inputs(&mut self) {}
    fn queue_source_trigger(&mut self, id: CheckpointId, _savepoint: bool) {
        self.0.queued.borrow_mut().push(id);
    }
    fn capture(&mut self, _id: CheckpointId) -> Result<u64, CheckpointError> {
        self.0.clock.set(self.0.clock.get() + self.0.capture_us.get());
        Ok(42)
    }
    fn forward_trigger(&mut self, id: CheckpointId, _trans: TransId) -> Result<Vec<(TaskId, Seq)>, CheckpointError> {
        self.0.forwarded.borrow_mut().push(id);
        Ok(vec![(TaskId(20), Seq(7))])
    }
    fn next_seq(&self, _from: TaskId) -> Option<Seq> {
        self.0.next_seq.get()
    }
    fn restore(&mut self, point: Option<RestorePoint>) -> Result<Version, CheckpointError> {
        self.0.restored.borrow_mut().push(point);
        Ok(point.and_then(|p| p.version).unwrap_or(Version(0)))
    }
}

impl Clock for Fx {
    fn wall_us(&self) -> u64 {
        EPOCH_US + self.0.clock.get()
    }
    fn mono_us(&self) -> u64 {
        self.0.clock.get()
    }
}

impl TaskEffects<u64> for Fx {
    fn send_task(&mut self, to: TaskId, input: TaskInput) {
        self.0.to_tasks.borrow_mut().push((to, input));
    }
    fn send_coord(&mut self, input: CoordInput) {
        self.0.to_coord.borrow_mut().push(input);
    }
    fn upload(&mut self, job: UploadRequest<u64>) {
        self.0.uploads.borrow_mut().push((job.id, job.version, job.captured));
    }
    fn read_committed(&mut self) -> Result<Option<(CheckpointId, Version)>, CheckpointError> {
        Ok(*self.0.committed.borrow())
    }
    fn persist_committed(&mut self, id: CheckpointId, version: Version, _ts: u64) -> Result<(), CheckpointError> {
        *self.0.committed.borrow_mut() = Some((id, version));
        Ok(())
    }
    fn delete_snapshots_before(&mut self, _id: CheckpointId) {}
    fn drop_snapshot(&mut self, _id: CheckpointId) {}
    fn paused(&mut self, _id: CheckpointId, pause_us: u64) {
        self.0.pauses.borrow_mut().push(pause_us);
    }
    fn aligning(&mut self, on: bool) {
        self.0.aligning.borrow_mut().push(on);
    }
    fn restored(&mut self, basis: RestoreBasis, id: Option<CheckpointId>) {
        self.0.basis.borrow_mut().push((basis, id));
    }
}

/// A ready driver of `setup`, with its fakes.
fn driver(setup: TaskSetup) -> (TaskDriver<u64>, Port, Fx, Rc<Seen>) {
    let seen = Rc::new(Seen::default());
    let (mut port, mut fx) = (Port(seen.clone()), Fx(seen.clone()));
    let mut d = TaskDriver::new(TaskMachine::new(setup), 77);
    d.restore(&mut port, &mut fx, None, RestoreBasis::Fresh, None).unwrap();
    (d, port, fx, seen)
}

fn reports(seen: &Seen) -> Vec<crate::checkpoint::Report> {
    seen.to_coord
        .borrow()
        .iter()
        .filter_map(|i| if let CoordInput::Report { report, .. } = i { Some(report.clone()) } else { None })
        .collect()
}

#[test]
fn a_report_carries_when_the_barrier_came_and_how_long_alignment_and_snapshot_took() {
    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1, 2], &[20]));
    seen.clock.set(1_000);
    assert!(!d.aligning());
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: C1, trans: T1 }).unwrap();
    assert_eq!(*seen.closed.borrow(), vec![0], "the first barrier's input is held back");
    assert_eq!(*seen.aligning.borrow(), vec![true]);
    assert!(d.aligning());
    seen.clock.set(1_250);
    seen.capture_us.set(40);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(2), id: C1, trans: T1 }).unwrap();
    assert_eq!(*seen.forwarded.borrow(), vec![C1]);
    assert_eq!(*seen.aligning.borrow(), vec![true, false], "aligning ends with the snapshot");
    assert!(!d.aligning());
    assert_eq!(*seen.pauses.borrow(), vec![290], "alignment 250 µs plus the 40 µs copy");
    assert_eq!(*seen.uploads.borrow(), vec![(C1, Version(0), 42)], "the captured state goes to the uploader");
    seen.clock.set(9_000);
    let done = UploadDone { manifest_crc: 5, bytes: 100, files: 1, upload_us: 3_000 };
    d.handle(&mut p, &mut fx, TaskInput::Uploaded { id: C1, result: Ok(done) }).unwrap();
    d.handle(&mut p, &mut fx, TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 }).unwrap();
    let r = reports(&seen);
    assert_eq!(r.len(), 1, "{:?}", seen.to_coord.borrow());
    assert_eq!((r[0].manifest_crc, r[0].outcome.clone()), (5, Ok(Version(0))));
    let s = &r[0].stats;
    assert_eq!(
        (s.trigger_at_us, s.align_us, s.snapshot_us, s.reported_at_us, s.upload_us, s.upload_bytes, s.files),
        (EPOCH_US + 1_000, 250, 40, EPOCH_US + 9_000, 3_000, 100, 1)
    );
    // Ready went upstream to both, with the checkpoint's transaction.
    let readies: Vec<_> = seen
        .to_tasks
        .borrow()
        .iter()
        .filter(|(_, i)| matches!(i, TaskInput::Ready { id: C1, trans: T1, from: TaskId(10) }))
        .map(|(to, _)| *to)
        .collect();
    assert_eq!(readies, vec![TaskId(1), TaskId(2)]);
}

#[test]
fn a_sink_holds_no_input_and_pauses_for_its_snapshot_only() {
    let (mut d, mut p, mut fx, seen) = driver(setup(20, Role::Sink, &[10, 11], &[]));
    seen.clock.set(1_000);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(10), id: C1, trans: T1 }).unwrap();
    assert!(seen.closed.borrow().is_empty(), "nothing held back");
    assert!(!d.aligning() && seen.aligning.borrow().is_empty(), "nothing waits on it");
    seen.clock.set(9_000);
    seen.capture_us.set(40);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(11), id: C1, trans: T1 }).unwrap();
    assert_eq!(*seen.pauses.borrow(), vec![40], "the 8 ms between its barriers paused nothing");
    assert_eq!(seen.uploads.borrow().len(), 1);
}

#[test]
fn an_agg_that_cuts_its_inputs_pauses_for_its_snapshot_only() {
    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1, 2], &[20]));
    seen.cut.set(true);
    seen.clock.set(1_000);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: C1, trans: T1 }).unwrap();
    assert!(seen.closed.borrow().is_empty(), "nothing held back");
    assert!(!d.aligning() && seen.aligning.borrow().is_empty(), "its worker need not hurry it");
    seen.clock.set(9_000);
    seen.capture_us.set(40);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(2), id: C1, trans: T1 }).unwrap();
    assert_eq!(*seen.pauses.borrow(), vec![40], "the 8 ms between its barriers paused nothing");
    assert_eq!(*seen.forwarded.borrow(), vec![C1]);
    // The next checkpoint holds its inputs again: the pause counts the alignment.
    seen.cut.set(false);
    let c2 = CheckpointId(2);
    seen.clock.set(20_000);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: c2, trans: TransId(2) }).unwrap();
    assert!(d.aligning());
    seen.clock.set(20_100);
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(2), id: c2, trans: TransId(2) }).unwrap();
    assert_eq!(*seen.pauses.borrow(), vec![40, 140]);
}

#[test]
fn a_source_snapshots_at_its_queued_trigger_and_answers_the_coordinator() {
    let (mut d, mut p, mut fx, seen) = driver(setup(1, Role::Source, &[], &[20]));
    let req = TaskInput::SourceReq { id: C1, trans: T1, kind: TriggerKind::Manual, expire_at: u64::MAX };
    d.handle(&mut p, &mut fx, req).unwrap();
    assert_eq!(*seen.queued.borrow(), vec![C1]);
    assert!(d.aligning(), "a source aligns until it reaches its trigger");
    seen.clock.set(500);
    d.signal(&mut p, &mut fx, Signal::ReachedTrigger { id: C1, offset: Version(4096) }).unwrap();
    assert_eq!(*seen.uploads.borrow(), vec![(C1, Version(4096), 42)], "the offset goes with the snapshot");
    let done = UploadDone::default();
    d.handle(&mut p, &mut fx, TaskInput::Uploaded { id: C1, result: Ok(done) }).unwrap();
    d.handle(&mut p, &mut fx, TaskInput::Ready { from: TaskId(20), id: C1, trans: T1 }).unwrap();
    let to_coord = seen.to_coord.borrow();
    assert!(to_coord.iter().any(|i| matches!(
        i,
        CoordInput::SourceRsp {
            task: TaskId(1),
            id: C1,
            answer: crate::checkpoint::SourceAnswer::Done(Version(4096)),
            ..
        }
    )));
    assert!(
        to_coord.iter().any(|i| matches!(i, CoordInput::Report { report, .. } if report.outcome == Ok(Version(4096))))
    );
}

#[test]
fn a_trigger_response_reaches_the_machine_with_the_channel_position_here() {
    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1, 2], &[20]));
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: C1, trans: T1 }).unwrap();
    let rsp = |seq| TaskInput::TriggerRsp {
        from: TaskId(2),
        id: C1,
        trans: T1,
        code: TriggerRspCode::Success,
        trigger_seq: Seq(9),
        next_seq: seq,
    };
    // Whatever the message says, the position is this side's.
    seen.next_seq.set(Some(Seq(9)));
    d.handle(&mut p, &mut fx, rsp(Some(Seq(3)))).unwrap();
    assert_eq!(d.machine().injected, 1, "frame 9 is next here: the barrier is injected");
    assert_eq!(*seen.forwarded.borrow(), vec![C1]);

    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1, 2], &[20]));
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: C1, trans: T1 }).unwrap();
    seen.next_seq.set(Some(Seq(5)));
    d.handle(&mut p, &mut fx, rsp(Some(Seq(9)))).unwrap();
    assert_eq!(d.machine().injected, 0, "frames 5 to 8 are missing here");
    assert!(reports(&seen).iter().any(|r| r.outcome.is_err()));
}

#[test]
fn a_task_asks_for_its_restore_point_every_500_ms_and_takes_only_the_answer_to_its_own_start() {
    let seen = Rc::new(Seen::default());
    let (mut p, mut fx) = (Port(seen.clone()), Fx(seen.clone()));
    *seen.committed.borrow_mut() = Some((CheckpointId(4), Version(40)));
    let mut d: TaskDriver<u64> = TaskDriver::new(TaskMachine::new(setup(1, Role::Source, &[], &[20])), 77);
    let asked =
        |seen: &Seen| seen.to_coord.borrow().iter().filter(|i| matches!(i, CoordInput::Consensus { .. })).count();
    assert!(!d.poll(&mut p, &mut fx).unwrap(), "no data before the restore point");
    assert_eq!(
        seen.to_coord.borrow()[0],
        CoordInput::Consensus { task: TaskId(1), latest: Some(CheckpointId(4)), request: 77 }
    );
    seen.clock.set(499_999);
    assert!(!d.poll(&mut p, &mut fx).unwrap());
    assert_eq!(asked(&seen), 1);
    seen.clock.set(500_000);
    d.poll(&mut p, &mut fx).unwrap();
    assert_eq!(asked(&seen), 2, "asked again after 500 ms");
    let point = Some(RestorePoint { id: CheckpointId(4), version: Some(Version(40)), manifest_crc: None });
    d.restore(&mut p, &mut fx, point, RestoreBasis::Consensus, Some(76)).unwrap();
    assert!(d.uninit() && seen.restored.borrow().is_empty(), "an answer to an earlier start is ignored");
    d.restore(&mut p, &mut fx, point, RestoreBasis::Consensus, Some(77)).unwrap();
    assert!(!d.uninit());
    assert_eq!(*seen.restored.borrow(), vec![point]);
    assert_eq!(*seen.basis.borrow(), vec![(RestoreBasis::Consensus, Some(CheckpointId(4)))]);
    assert_eq!(d.machine().latest(), Some(CheckpointId(4)));
    d.restore(&mut p, &mut fx, None, RestoreBasis::Fresh, Some(77)).unwrap();
    assert_eq!(seen.restored.borrow().len(), 1, "a task restored already ignores another answer");
    assert!(d.poll(&mut p, &mut fx).unwrap(), "ready: data may move");
}

#[test]
fn the_machine_gets_a_tick_every_100_ms() {
    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1, 2], &[20]));
    d.poll(&mut p, &mut fx).unwrap(); // the machine learns the time
    d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id: C1, trans: T1 }).unwrap();
    let retrieves = |seen: &Seen| {
        seen.to_tasks.borrow().iter().filter(|(_, i)| matches!(i, TaskInput::RetrieveTrigger { .. })).count()
    };
    // The trigger timeout is 10 s of the machine's time (milliseconds of the wall clock).
    let start = seen.clock.get();
    for step in 1..=100u64 {
        seen.clock.set(start + step * 100_000);
        d.poll(&mut p, &mut fx).unwrap();
    }
    assert_eq!(retrieves(&seen), 1, "after 10 s of ticks the missing barrier is asked for");
    seen.clock.set(start + 10_000_000 + 99_999);
    d.poll(&mut p, &mut fx).unwrap();
    assert_eq!(retrieves(&seen), 1);
}

#[test]
fn each_checkpoint_is_timed_from_its_own_first_barrier() {
    let (mut d, mut p, mut fx, seen) = driver(setup(10, Role::Agg, &[1], &[20]));
    let c2 = CheckpointId(2);
    for (id, at) in [(C1, 1_000), (c2, 5_000)] {
        seen.clock.set(at);
        d.signal(&mut p, &mut fx, Signal::Barrier { from: TaskId(1), id, trans: T1 }).unwrap();
        let done = UploadDone::default();
        d.handle(&mut p, &mut fx, TaskInput::Uploaded { id, result: Ok(done) }).unwrap();
        d.handle(&mut p, &mut fx, TaskInput::Ready { from: TaskId(20), id, trans: T1 }).unwrap();
        d.handle(&mut p, &mut fx, TaskInput::Update { id, trans: T1, version: Version(0), ts: 0 }).unwrap();
    }
    let at: Vec<_> = reports(&seen).iter().map(|r| (r.id, r.stats.trigger_at_us)).collect();
    assert_eq!(at, vec![(C1, EPOCH_US + 1_000), (c2, EPOCH_US + 5_000)]);
}
