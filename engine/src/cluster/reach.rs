//! Whether a node that still reaches the control store is cut off from the rest of the cluster:
//! it cannot reach most of the other nodes that are members, for long. Such a node gives up its
//! membership (its lease), so that it runs nothing and the leader moves its tasks like those of
//! a lost node, instead of every stream restarting for as long as the cut lasts.
//!
//! Invariant: only a strict majority of the live others, each unreachable for at least `after`
//! since a link that was up went down, cuts a node off; with fewer than two live others nothing
//! does (two nodes that cannot reach each other cannot tell which one is cut off), and a link
//! never up since this node started says nothing (its peer may still be starting).

use std::time::Duration;

use weir_wire::NodeId;
use weir_wire::msg::PeerLink;

/// The live others (members other than `me`) that `links` show unreachable for at least
/// `after` at `now_ms`.
pub fn unreachable(others: &[NodeId], links: &[PeerLink], now_ms: u64, after: Duration) -> Vec<NodeId> {
    let after = after.as_millis() as u64;
    others
        .iter()
        .copied()
        .filter(|n| {
            links
                .iter()
                .find(|l| l.node == *n)
                .is_some_and(|l| !l.up && l.since_ms > 0 && now_ms.saturating_sub(l.since_ms) >= after)
        })
        .collect()
}

/// Whether a node whose live others are `others` is cut off from them (see the module).
pub fn cut_off(others: &[NodeId], links: &[PeerLink], now_ms: u64, after: Duration) -> bool {
    others.len() >= 2 && 2 * unreachable(others, links, now_ms, after).len() > others.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(node: u32, up: bool, since_ms: u64) -> PeerLink {
        PeerLink { node: NodeId(node), up, since_ms, reason: String::new() }
    }

    const AFTER: Duration = Duration::from_secs(2);

    #[test]
    fn a_node_that_reaches_no_live_other_for_long_is_cut_off() {
        let others = [NodeId(1), NodeId(2)];
        let down = [link(1, false, 1_000), link(2, false, 1_500)];
        assert!(!cut_off(&others, &down, 3_000, AFTER), "not long enough for node 2");
        assert!(cut_off(&others, &down, 3_500, AFTER));
        // One of two reachable: not a majority unreachable (the other side of a cut node).
        assert!(!cut_off(&others, &[link(1, true, 1_000), link(2, false, 1_000)], 9_000, AFTER));
    }

    #[test]
    fn two_nodes_or_links_never_up_cut_nobody_off() {
        assert!(!cut_off(&[NodeId(2)], &[link(2, false, 1_000)], 9_000, AFTER), "one live other");
        let never = [link(1, false, 0), link(2, false, 0)];
        assert!(!cut_off(&[NodeId(1), NodeId(2)], &never, 9_000, AFTER), "peers still starting");
        // Absent nodes (no member key) do not count: the lease already tells of them.
        assert!(!cut_off(&[NodeId(1)], &[link(1, false, 1_000), link(2, false, 1_000)], 9_000, AFTER));
    }
}
