//! One test per scenario of [`Supervisor`] and [`RestartPolicy`].

use std::time::Duration;

use super::*;

fn policy(strategy: Strategy, max_restarts: u32) -> RestartPolicy {
    RestartPolicy { strategy, max_restarts, window: Duration::from_secs(60) }
}

fn fixed(max_restarts: u32) -> RestartPolicy {
    policy(Strategy::FixedDelay(Duration::from_secs(1)), max_restarts)
}

fn failed(why: &str) -> RunEnd {
    RunEnd::Failed { why: why.into(), newer: None }
}

#[test]
fn fixed_delay_restarts_until_the_window_holds_max_restarts() {
    let p = fixed(3);
    assert_eq!(p.next(&[], 100_000), Ok(Duration::from_secs(1)));
    assert_eq!(p.next(&[90_000, 95_000], 100_000), Ok(Duration::from_secs(1)));
    let err = p.next(&[90_000, 95_000, 99_000], 100_000).unwrap_err();
    assert_eq!(err, GaveUp::TooMany { recent: 3, window: "1m".into(), max: 3 });
    assert!(err.to_string().contains("3 restarts within 1m"), "{err}");
    // Restarts older than the window do not count.
    assert_eq!(p.next(&[1_000, 2_000, 99_000], 100_000), Ok(Duration::from_secs(1)));
}

#[test]
fn backoff_doubles_with_recent_restarts_up_to_the_maximum() {
    let p = policy(Strategy::Backoff { first: Duration::from_secs(1), max: Duration::from_secs(5) }, 100);
    let delays: Vec<u64> = (0..5).map(|n| p.next(&vec![99_000; n], 100_000).unwrap().as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 5, 5]);
    assert_eq!(p.next(&[1_000; 4], 100_000), Ok(Duration::from_secs(1)), "old restarts reset the backoff");
}

#[test]
fn strategy_none_fails_the_stream_at_once() {
    let mut s = Supervisor::new(policy(Strategy::None, 10), 0);
    assert_eq!(s.ended(failed("a gap"), false, 0), Next::GiveUp { why: "a gap".into(), gave_up: GaveUp::NoRestarts });
}

#[test]
fn incarnations_grow_past_the_last_and_reach_a_newer_peer() {
    assert_eq!(Supervisor::new(fixed(3), 0).incarnation(), 1);
    assert_eq!(Supervisor::new(fixed(3), 41).incarnation(), 42);
    assert_eq!(next_incarnation(1, Some(7)), 7);
    assert_eq!(next_incarnation(7, Some(3)), 8);
}

#[test]
fn a_start_runs_at_or_above_its_placements_floor() {
    let mut s = Supervisor::new(fixed(3), 5);
    assert_eq!(s.start(0), 6);
    assert_eq!(s.start(2), placement_floor(2));
    assert_eq!(s.start(1), placement_floor(2), "never down, whatever placement is read");
}

#[test]
fn a_failure_restarts_after_the_delay_at_a_newer_incarnation_and_is_listed() {
    let mut s = Supervisor::new(fixed(3), 0);
    s.start(0);
    let next = s.ended(failed("peer 2 lost"), false, 10_000);
    assert_eq!(next, Next::Restart { delay: Duration::from_secs(1), incarnation: 2 });
    assert!(!s.restarts().is_empty());
    assert_eq!(s.restarts(), [RestartInfo { at_ms: 10_000, incarnation: 2, reason: "peer 2 lost".into() }]);
}

#[test]
fn a_peer_at_a_newer_incarnation_restarts_the_node_at_once_at_that_incarnation() {
    let mut s = Supervisor::new(fixed(3), 0);
    s.start(0);
    let next = s.ended(RunEnd::Failed { why: "a newer peer".into(), newer: Some(9) }, false, 0);
    assert_eq!(next, Next::Restart { delay: Duration::ZERO, incarnation: 9 });
}

#[test]
fn a_peer_seen_newer_during_the_delay_raises_the_restarts_incarnation() {
    let mut s = Supervisor::new(fixed(3), 0);
    s.start(0);
    s.ended(failed("lost"), false, 0);
    s.woke(Waited::Restart, Some(12));
    assert_eq!(s.incarnation(), 12);
    assert_eq!(s.restarts().last().map(|r| r.incarnation), Some(12), "status lists where it restarted");
}

#[test]
fn restarts_end_once_the_window_holds_max_restarts() {
    let mut s = Supervisor::new(fixed(2), 0);
    assert!(matches!(s.ended(failed("1"), false, 1_000), Next::Restart { .. }));
    assert!(matches!(s.ended(failed("2"), false, 2_000), Next::Restart { .. }));
    let next = s.ended(failed("3"), false, 3_000);
    assert!(
        matches!(&next, Next::GiveUp { why, gave_up: GaveUp::TooMany { recent: 2, .. } } if why == "3"),
        "{next:?}"
    );
    // Past the window the strategy allows restarts again.
    assert!(matches!(s.ended(failed("4"), false, 70_000), Next::Restart { .. }));
}

#[test]
fn a_lost_lease_waits_for_one_at_a_newer_incarnation_without_counting_as_a_failure() {
    let mut s = Supervisor::new(fixed(1), 0);
    s.start(0);
    for i in 0..5 {
        assert_eq!(s.ended(RunEnd::Fenced { why: "lease ended".into() }, false, i * 1_000), Next::AwaitLease);
    }
    assert_eq!(s.incarnation(), 6);
    assert_eq!(s.restarts().last().map(|r| r.reason.as_str()), Some("lost its lease: lease ended"));
    assert!(
        matches!(s.ended(failed("then a failure"), false, 9_000), Next::Restart { .. }),
        "the strategy's one restart is left"
    );
}

#[test]
fn a_pause_or_resume_starts_the_next_run_at_once_at_a_newer_incarnation_without_counting_as_a_failure() {
    let mut s = Supervisor::new(fixed(1), 0);
    s.start(0);
    assert_eq!(s.ended(RunEnd::Switched { newer: None }, false, 1_000), Next::Continue { incarnation: 2 });
    // A peer switched first: the next run joins its run.
    assert_eq!(s.ended(RunEnd::Switched { newer: Some(9) }, false, 2_000), Next::Continue { incarnation: 9 });
    assert_eq!(s.ended(RunEnd::Switched { newer: Some(3) }, false, 3_000), Next::Continue { incarnation: 10 });
    assert!(s.restarts().is_empty(), "no failure is listed");
    assert!(
        matches!(s.ended(failed("then a failure"), false, 9_000), Next::Restart { incarnation: 11, .. }),
        "the strategy's one restart is left"
    );
}

#[test]
fn a_stop_asked_for_stops_the_node_whatever_else_ended_the_run() {
    for end in [
        failed("lost"),
        RunEnd::Fenced { why: "lease".into() },
        RunEnd::StopRequested,
        RunEnd::Switched { newer: None },
    ] {
        let mut s = Supervisor::new(fixed(3), 0);
        assert_eq!(s.ended(end, true, 0), Next::Exit("weir stop"));
        assert!(s.restarts().is_empty());
    }
    let mut s = Supervisor::new(fixed(3), 0);
    assert_eq!(s.ended(RunEnd::Signal, false, 0), Next::Exit("signal"));
    assert_eq!(s.ended(RunEnd::Done, false, 0), Next::Exit("stream ended"));
}

#[test]
fn a_node_that_waited_idle_or_for_a_lease_starts_at_least_at_the_newest_peer_seen() {
    let mut s = Supervisor::new(fixed(3), 0);
    assert_eq!(s.idle_at(3), placement_floor(3));
    s.woke(Waited::Idle, Some(placement_floor(4) + 2));
    assert_eq!(s.incarnation(), placement_floor(4) + 2);
    assert_eq!(s.idle_at(3), placement_floor(4) + 2, "a peer seen newer");
    s.woke(Waited::Lease, None);
    assert_eq!(s.incarnation(), placement_floor(4) + 2, "nothing ran while it waited for a lease");
    s.woke(Waited::Idle, None);
    assert_eq!(s.incarnation(), placement_floor(4) + 3, "an idle node's next start is newer than it answered at");
}

#[test]
fn a_run_heard_of_before_a_start_raises_the_start_to_it_and_never_lowers_it() {
    let mut s = Supervisor::new(fixed(3), 4);
    s.heard(Some(9));
    assert_eq!(s.start(0), 9, "joins the run its peers are in");
    s.heard(Some(2));
    s.heard(None);
    assert_eq!(s.start(0), 9);
    // A failure after it restarts above it.
    assert!(matches!(s.ended(failed("lost"), false, 0), Next::Restart { incarnation: 10, .. }));
}
