//! Unit tests of `weir status`'s text.

use weir_engine::wire::msg::{TaskState, TaskStatus};
use weir_engine::wire::{StreamId, TaskId};

fn replaying(rows: u64, replayed: u64, ms: u64) -> TaskStatus {
    TaskStatus {
        stream: StreamId(1),
        task: TaskId(2),
        state: TaskState::Ready,
        latest: None,
        active: None,
        failed: None,
        rows_in: 0,
        rows_out: 0,
        watermark_ms: None,
        queued: 0,
        replay_rows: rows,
        replayed,
        replay_ms: ms,
    }
}

#[test]
fn the_in_sync_sets_say_which_copy_is_out_and_a_stale_read_says_so() {
    use weir_engine::wire::NodeId;
    use weir_engine::wire::msg::{InSyncEntry, MemberInfo};
    let entry = |partition, primary, follower, in_sync| InSyncEntry {
        partition,
        primary: NodeId(primary),
        follower: NodeId(follower),
        in_sync,
    };
    let mut m = MemberInfo {
        leader: NodeId(1),
        lease_left_ms: 2_000,
        placement: 1,
        elections: 1,
        lease_losses: 0,
        fenced_writes: 0,
        error: String::new(),
        withheld: false,
        unreachable: Vec::new(),
        in_sync: vec![entry(0, 1, 2, true), entry(1, 2, 3, false)],
        in_sync_age_ms: 900,
    };
    assert_eq!(super::in_sync_line(&m), "in-sync sets (source node+copy node): p0 1+2, p1 2 (copy on 3 out)");
    m.in_sync_age_ms = 12_300;
    assert!(
        super::in_sync_line(&m).ends_with("(read 12s ago: etcd has not answered since)"),
        "{}",
        super::in_sync_line(&m)
    );
}

#[test]
fn a_replay_says_how_far_it_is_and_the_time_left_at_its_pace() {
    assert_eq!(
        super::replay_progress(&replaying(4_000_000, 1_000_000, 2_000)),
        "1000000 of 4000000 rows (25 %) in 2s, about 6s left"
    );
    assert_eq!(super::replay_progress(&replaying(10, 0, 0)), "0 of 10 rows (0 %) in 0s, time left unknown yet");
}
