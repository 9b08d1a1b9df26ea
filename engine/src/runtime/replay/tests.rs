use std::time::{Duration, Instant};

use super::*;

fn point(from: u64, taken: &[(u64, u64)]) -> ReplayPoint {
    ReplayPoint { from: CheckpointId(from), taken: taken.to_vec(), ..Default::default() }
}

#[test]
fn an_aggs_replay_point_counts_the_rows_since_its_oldest_named_window_was_born() {
    let mut r = AggReplay::new(true, 2, None);
    r.take(0, 10);
    r.take(1, 5);
    assert_eq!(r.checkpoint(1, Some(0), vec![], vec![]).unwrap(), point(0, &[(0, 10), (0, 5)]));
    r.take(0, 7);
    let p = r.checkpoint(2, Some(1), vec![], vec![]).unwrap();
    assert_eq!(p, point(1, &[(10, 17), (5, 5)]));
    let all = r.checkpoint(3, None, vec![7], vec![]).unwrap();
    assert_eq!(all, ReplayPoint { written: vec![7], ..point(3, &[(17, 17), (5, 5)]) }, "every window written");
    // The restore: upstream 0 sends 7 rows again, upstream 1 none.
    let mut back = AggReplay::new(true, 2, None);
    back.restore_replay(2, &p).unwrap();
    assert!(back.replaying());
    assert_eq!(back.take(0, 4), 4);
    assert_eq!(back.take(1, 3), 0, "upstream 1 owes nothing: its rows are new");
    assert_eq!(back.take(0, 5), 3, "the last 2 of this message are new");
    assert!(!back.replaying());
    assert_eq!(back.checkpoint(3, Some(2), vec![], vec![]).unwrap().taken, vec![(17, 19), (5, 8)]);
}

#[test]
fn a_window_older_than_the_sources_remember_is_written() {
    let mut r = AggReplay::new(true, 1, None);
    let last = OFFSET_HISTORY as u64 - 1;
    for id in 1..last {
        assert_eq!(r.cutoff(id), 0, "checkpoint {id}");
        assert!(r.checkpoint(id, Some(0), vec![], vec![]).is_some(), "checkpoint {id}");
    }
    assert!(r.cutoff(last + 1) > 0, "the sources no longer know where chk-0's rows began");
    assert_eq!(r.checkpoint(last + 1, Some(0), vec![], vec![]), None, "no point can start there");
    assert!(r.checkpoint(last + 2, Some(last + 1), vec![], vec![]).is_some(), "that window fired: replay again");
}

#[test]
fn windows_born_before_the_budgets_rows_are_written() {
    let mut r = AggReplay::new(true, 1, Some(Duration::from_secs(1)));
    let t0 = Instant::now();
    assert_eq!(r.cutoff(1), 0, "no rate measured yet: no bound");
    // 1,000 rows a second, a checkpoint a second, one window held since the start.
    for id in 1..=5 {
        r.take(0, 1000);
        r.observe(t0 + Duration::from_secs(id));
        r.checkpoint(id, Some(0), vec![], vec![]).unwrap();
    }
    r.take(0, 1000);
    r.observe(t0 + Duration::from_secs(6));
    assert_eq!(r.cutoff(6), 5, "a second of rows is the budget: windows born before 5 are written");
    let unbounded = AggReplay::new(true, 1, None);
    assert_eq!(unbounded.cutoff(6), 0);
}

#[test]
fn a_checkpoint_during_a_replay_resumes_it_where_it_stood() {
    let mut back = AggReplay::new(true, 2, None);
    back.restore_replay(2, &point(1, &[(10, 17), (5, 9)])).unwrap();
    assert_eq!(back.left(), 11);
    assert_eq!(back.take(0, 3), 3);
    let mid = back.checkpoint(3, None, vec![], vec![20]).unwrap();
    assert_eq!(
        mid,
        ReplayPoint { partial: vec![20], resume: true, ..point(3, &[(13, 17), (5, 9)]) },
        "per upstream: the rows had again, and the end of those owed"
    );
    let mut again = AggReplay::new(true, 2, None);
    again.restore_replay(3, &mid).unwrap();
    assert_eq!(again.left(), 8, "only the rest");
    assert_eq!(again.take(0, 4), 4);
    assert_eq!(again.take(1, 6), 4, "2 new rows after the 4 owed");
    assert!(!again.replaying());
    assert_eq!(again.take(0, 2), 0);
    assert_eq!(
        again.checkpoint(4, Some(3), vec![], vec![]).unwrap().taken,
        vec![(17, 19), (9, 11)],
        "a window born at the resumed checkpoint counts from the end of the rows owed"
    );
}

#[test]
fn a_replay_point_of_the_wrong_shape_is_refused() {
    let mut r = AggReplay::new(true, 2, None);
    let p = point(1, &[(1, 2)]);
    assert!(r.restore_replay(2, &p).unwrap_err().to_string().contains("1 upstreams, the agg has 2"));
    let p = point(1, &[(1, 2), (3, 2)]);
    assert!(r.restore_replay(2, &p).is_err());
}

#[test]
fn a_source_replays_each_output_from_its_own_offset() {
    let mut s = SourceReplay::default();
    for (id, o) in [(1, 100), (2, 250), (3, 400)] {
        s.checkpoint(CheckpointId(id), o, 2);
    }
    assert!(s.outputs.is_empty(), "no replay: positions only");
    assert_eq!(s.offset_at(CheckpointId(0)).unwrap(), 0);
    assert_eq!(s.offset_at(CheckpointId(2)).unwrap(), 250);
    assert!(
        s.offset_at(CheckpointId(9))
            .unwrap_err()
            .to_string()
            .contains("remembers its last 3 checkpoints (chk-1 to chk-3)")
    );
    assert_eq!(s.start(vec![250, 100], 400), 100);
    assert_eq!((s.skip_below.clone(), s.skip_until), (vec![250, 100], 250));
    assert_eq!(s.start(vec![400, 400], 400), 400, "nothing to replay");
    assert!(s.skip_below.is_empty());
    s.start(vec![250, 400], 400);
    assert_eq!(s.position(250), Version(400), "mid-replay: the restored offset");
    assert_eq!(s.position(420), Version(420));
}

#[test]
fn a_source_records_where_each_outputs_replay_stood() {
    let mut s = SourceReplay::default();
    s.checkpoint(CheckpointId(3), 400, 2);
    s.start(vec![250, 100], 400);
    s.checkpoint(CheckpointId(4), 200, 2);
    assert_eq!(s.offset_at(CheckpointId(4)).unwrap(), 400, "the position: the restored offset");
    assert_eq!(s.output_offset_at(CheckpointId(4), 0, 2).unwrap(), 250, "output 0's replay had not begun");
    assert_eq!(s.output_offset_at(CheckpointId(4), 1, 2).unwrap(), 200);
    assert_eq!(s.output_offset_at(CheckpointId(3), 1, 2).unwrap(), 400, "no replay then: the position");
    assert!(s.output_offset_at(CheckpointId(4), 0, 3).is_err(), "another number of outputs");
    s.checkpoint(CheckpointId(5), 450, 2);
    assert_eq!(s.outputs.len(), 1, "past the replay: nothing more to record");
}
