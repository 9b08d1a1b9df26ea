//! Checks of the cluster file that its types cannot make: ids, addresses, the placement, the
//! control table.

use anyhow::{Context, bail};
use weir_engine::wire::role::MAX_MEMBER_ID;

use super::{ClusterFile, PlacementFile, StreamFile};

impl ClusterFile {
    /// Checks what the types cannot: ids, addresses, the placement.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nodes.is_empty() {
            bail!("the config lists no nodes ([[nodes]] with id and addr)");
        }
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            if n.id == 0 || n.id > MAX_MEMBER_ID {
                bail!("node {}: node ids are 1 to {MAX_MEMBER_ID} (clients take the ids above)", n.id);
            }
            if !seen.insert(n.id) {
                bail!("node {} is listed twice", n.id);
            }
            if n.workers == Some(0) {
                bail!("node {}: workers must be at least 1", n.id);
            }
        }
        if self.workers == 0 {
            bail!("workers must be at least 1");
        }
        self.client_roles()?;
        if self.nodes.len() > 1 && self.control.is_none() {
            bail!(
                "this file lists {} nodes and no [control] table: a cluster of several nodes keeps its membership, \
                 placement and commit point in etcd, so that no node decides alone (docs/cluster.md, \
                 \"Cluster control on etcd\"); add [control] with etcd = [\"http://HOST:2379\"], or set \
                 WEIR_CONTROL__ETCD=http://HOST:2379",
                self.nodes.len()
            );
        }
        if let Some(c) = &self.control {
            c.validate()?;
            let after = self.restart.move_after;
            if !after.is_zero() && after < c.lease {
                bail!(
                    "restart.move_after = {} is shorter than control.lease = {}: a node's tasks move only once its lease can have ended",
                    humantime::format_duration(after),
                    humantime::format_duration(c.lease)
                );
            }
            let history = weir_engine::cluster::HISTORY;
            if self.checkpoint.retain > history {
                bail!(
                    "checkpoint.retain = {} with [control]: etcd lists the last {history} commits, and a record it \
                     does not list is no commit; keep at most {history}",
                    self.checkpoint.retain
                );
            }
        }
        if !["fixed-delay", "exponential-backoff", "none"].contains(&self.restart.strategy.as_str()) {
            bail!(
                "restart.strategy = {:?}: \"fixed-delay\", \"exponential-backoff\" or \"none\"",
                self.restart.strategy
            );
        }
        // The file's stream seeds the stream catalog: its name and id must be a catalog's.
        let name = self.stream_name();
        if !weir_engine::wire::msg::valid_stream_name(&name) {
            bail!(
                "stream.name = {name:?}: 1 to {} letters, digits, '-' or '_', starting with a letter",
                weir_engine::wire::msg::MAX_STREAM_NAME
            );
        }
        if self.stream.id == 0 || self.stream.id == u64::MAX {
            bail!("stream.id = {}: 1 to {}", self.stream.id, u64::MAX - 1);
        }
        self.stream.validate(&seen)
    }
}

impl StreamFile {
    /// Checks what the types cannot, for a cluster of nodes `nodes`.
    pub fn validate(&self, nodes: &std::collections::BTreeSet<u32>) -> anyhow::Result<()> {
        let seen = nodes;
        if !["generator", "ingest"].contains(&self.source.as_str()) {
            bail!("stream.source = {:?}: \"generator\" or \"ingest\"", self.source);
        }
        if self.ingest.segment.is_some_and(|s| s < 1 << 20) {
            bail!("stream.ingest.segment must be at least 1M (a segment file of the ingest log)");
        }
        let lag = self.ingest.in_sync_lag;
        if !lag.is_zero() && lag < std::time::Duration::from_secs(2) {
            bail!(
                "stream.ingest.in_sync_lag = {}: at least 2s (a node finds it is cut off from the others by probes a \
                 second apart; before then it must not take its copies out), or \"0s\" (appends always wait for the copy)",
                humantime::format_duration(lag)
            );
        }
        match self.ingest.replicas {
            1 => {}
            2 if seen.len() >= 2 => {}
            2 => bail!("stream.ingest.replicas = 2 needs a second node to keep the copies; this file lists one"),
            r => bail!("stream.ingest.replicas = {r}: 1 or 2 (each partition's log on one node, or on two)"),
        }
        if let PlacementFile::Named(n) = &self.placement
            && n != "spread"
        {
            bail!("stream.placement = {n:?}: \"spread\" or a table of task id = node id");
        }
        if let PlacementFile::Explicit(m) = &self.placement {
            for (task, node) in m {
                task.parse::<u32>().with_context(|| format!("stream.placement: {task:?} is not a task id"))?;
                if !seen.contains(node) {
                    bail!("stream.placement: task {task} on node {node}, which is not listed");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ClusterFile;

    #[test]
    fn with_etcd_no_more_commits_are_retained_than_etcd_lists() {
        let file = |retain: usize, control: bool| -> ClusterFile {
            let mut t = format!(
                "[stream]\nid = 1\npartitions = 1\naggs = 1\nsinks = 1\n[checkpoint]\nretain = {retain}\n\
                 [[nodes]]\nid = 1\naddr = \"127.0.0.1:7101\"\n"
            );
            if control {
                t.push_str("[control]\netcd = [\"http://127.0.0.1:2379\"]\n");
            }
            toml::from_str(&t).unwrap()
        };
        file(32, true).validate().unwrap();
        file(33, false).validate().unwrap();
        let e = file(33, true).validate().unwrap_err().to_string();
        assert!(e.contains("checkpoint.retain = 33 with [control]") && e.contains("at most 32"), "{e}");
    }

    #[test]
    fn a_cluster_of_several_nodes_without_etcd_is_refused_and_one_node_runs_without_it() {
        let file = |nodes: u32, control: bool| -> ClusterFile {
            let mut t = String::from("[stream]\nid = 1\npartitions = 1\naggs = 1\nsinks = 1\n");
            for n in 1..=nodes {
                t.push_str(&format!("[[nodes]]\nid = {n}\naddr = \"127.0.0.1:{}\"\n", 7100 + n));
            }
            if control {
                t.push_str("[control]\netcd = [\"http://127.0.0.1:2379\"]\n");
            }
            toml::from_str(&t).unwrap()
        };
        file(1, false).validate().unwrap();
        file(1, true).validate().unwrap();
        file(3, true).validate().unwrap();
        let e = file(3, false).validate().unwrap_err().to_string();
        assert!(e.contains("lists 3 nodes and no [control] table") && e.contains("WEIR_CONTROL__ETCD"), "{e}");
    }

    #[test]
    fn an_in_sync_lag_shorter_than_the_probes_can_tell_is_refused() {
        let file = |lag: &str| -> ClusterFile {
            let t = format!(
                "[stream]\nid = 1\npartitions = 1\naggs = 1\nsinks = 1\n[stream.ingest]\nin_sync_lag = \"{lag}\"\n\
                 [[nodes]]\nid = 1\naddr = \"127.0.0.1:7101\"\n"
            );
            toml::from_str(&t).unwrap()
        };
        file("0s").validate().unwrap();
        file("2s").validate().unwrap();
        let e = file("1s").validate().unwrap_err().to_string();
        assert!(e.contains("in_sync_lag = 1s: at least 2s"), "{e}");
    }
}
