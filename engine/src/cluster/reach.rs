//! Whether a node that still reaches the control store is cut off from the rest of the cluster:
//! it is on the smaller side of a split of the live members (itself and the other nodes with a
//! member key). Such a node gives up its membership (its lease), so that it runs nothing and
//! the leader moves its tasks like those of a lost node, instead of every stream restarting for
//! as long as the cut lasts.
//!
//! Invariants: a node counts itself and every live other it reaches (or lost only for less than
//! `after`); it is cut off when that side is less than half of the live members, or exactly
//! half without the lowest live node (so of two sides of an even split exactly one stays, and
//! of two nodes that lose each other the higher one gives way). With no live other, nothing is
//! cut off.

use std::time::Duration;

use weir_wire::NodeId;
use weir_wire::msg::PeerLink;

/// The live others (members other than this node) that `links` show unreachable for at least
/// `after` at `now_ms` (a node without a link yet counts as reachable).
pub fn unreachable(others: &[NodeId], links: &[PeerLink], now_ms: u64, after: Duration) -> Vec<NodeId> {
    let after = after.as_millis() as u64;
    let down = |l: &PeerLink| !l.up && l.since_ms > 0 && now_ms.saturating_sub(l.since_ms) >= after;
    others.iter().copied().filter(|n| links.iter().find(|l| l.node == *n).is_some_and(down)).collect()
}

/// Whether node `me`, whose live others are `others`, is cut off from them (see the module).
pub fn cut_off(me: NodeId, others: &[NodeId], links: &[PeerLink], now_ms: u64, after: Duration) -> bool {
    if others.is_empty() {
        return false;
    }
    let gone = unreachable(others, links, now_ms, after);
    let side: Vec<NodeId> = others.iter().copied().filter(|n| !gone.contains(n)).chain([me]).collect();
    let all = others.len() + 1;
    if 2 * side.len() != all {
        return 2 * side.len() < all;
    }
    let lowest = others.iter().copied().chain([me]).min();
    !lowest.is_some_and(|l| side.contains(&l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(node: u32, up: bool, since_ms: u64) -> PeerLink {
        PeerLink { node: NodeId(node), up, since_ms, reason: String::new() }
    }

    const AFTER: Duration = Duration::from_secs(2);

    #[test]
    fn a_node_that_reaches_no_live_other_for_long_is_cut_off_and_the_other_side_stays() {
        let down = [link(1, false, 1_000), link(2, false, 1_500)];
        assert!(!cut_off(NodeId(3), &[NodeId(1), NodeId(2)], &down, 3_000, AFTER), "not long enough for node 2");
        assert!(cut_off(NodeId(3), &[NodeId(1), NodeId(2)], &down, 3_500, AFTER));
        // Nodes 1 and 2 reach each other, not node 3: two of three stay.
        let from_1 = [link(2, true, 1_000), link(3, false, 1_000)];
        assert!(!cut_off(NodeId(1), &[NodeId(2), NodeId(3)], &from_1, 9_000, AFTER));
    }

    #[test]
    fn of_an_even_split_the_side_of_the_lowest_live_node_stays() {
        // Four nodes, {1, 2} | {3, 4}.
        let from_2 = [link(1, true, 1), link(3, false, 1), link(4, false, 1)];
        assert!(!cut_off(NodeId(2), &[NodeId(1), NodeId(3), NodeId(4)], &from_2, 9_000, AFTER));
        let from_3 = [link(1, false, 1), link(2, false, 1), link(4, true, 1)];
        assert!(cut_off(NodeId(3), &[NodeId(1), NodeId(2), NodeId(4)], &from_3, 9_000, AFTER));
        // Two nodes that lose each other: the higher gives way.
        assert!(cut_off(NodeId(2), &[NodeId(1)], &[link(1, false, 1)], 9_000, AFTER));
        assert!(!cut_off(NodeId(1), &[NodeId(2)], &[link(2, false, 1)], 9_000, AFTER));
    }

    #[test]
    fn no_live_other_or_no_probe_yet_cuts_nobody_off() {
        assert!(!cut_off(NodeId(3), &[], &[link(1, false, 1)], 9_000, AFTER), "alone: it takes everything over");
        assert!(!cut_off(NodeId(3), &[NodeId(1), NodeId(2)], &[], 9_000, AFTER), "not probed yet");
        // Absent nodes (no member key) do not count: the lease already tells of them.
        let links = [link(1, false, 1), link(2, true, 1)];
        assert!(!cut_off(NodeId(3), &[NodeId(2)], &links, 9_000, AFTER));
    }
}
