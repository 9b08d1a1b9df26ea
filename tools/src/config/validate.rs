//! Checks of the cluster file that its types cannot make: ids, addresses, the coordinator, the
//! placement, the control table.

use anyhow::{Context, bail};
use weir_engine::wire::role::MAX_MEMBER_ID;

use super::{ClusterFile, PlacementFile};

impl ClusterFile {
    /// Checks what the types cannot: ids, addresses, the coordinator, the placement.
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
        }
        let lowest = *seen.first().expect("nodes");
        if let Some(c) = self.coordinator {
            if !seen.contains(&c) {
                bail!("coordinator = {c} is not a listed node");
            }
            if c != lowest {
                bail!("coordinator = {c}: the coordinator runs on the lowest node id ({lowest}); renumber the nodes");
            }
        }
        if !["fixed-delay", "exponential-backoff", "none"].contains(&self.restart.strategy.as_str()) {
            bail!(
                "restart.strategy = {:?}: \"fixed-delay\", \"exponential-backoff\" or \"none\"",
                self.restart.strategy
            );
        }
        if !["generator", "ingest"].contains(&self.stream.source.as_str()) {
            bail!("stream.source = {:?}: \"generator\" or \"ingest\"", self.stream.source);
        }
        if self.stream.ingest.segment.is_some_and(|s| s < 1 << 20) {
            bail!("stream.ingest.segment must be at least 1M (a segment file of the ingest log)");
        }
        match self.stream.ingest.replicas {
            1 => {}
            2 if seen.len() >= 2 => {}
            2 => bail!("stream.ingest.replicas = 2 needs a second node to keep the copies; this file lists one"),
            r => bail!("stream.ingest.replicas = {r}: 1 or 2 (each partition's log on one node, or on two)"),
        }
        if let PlacementFile::Named(n) = &self.stream.placement
            && n != "spread"
        {
            bail!("stream.placement = {n:?}: \"spread\" or a table of task id = node id");
        }
        if let PlacementFile::Explicit(m) = &self.stream.placement {
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
