//! The follower's side of ingest replication: it writes what a partition's primary ships, as
//! it is, syncs it with its own appends (at its group commit), and answers where its copy ends
//! with the copy's chain there (`ingest/chain.rs`), so that its primary can tell whether the
//! copy is a prefix of its log.

use weir_wire::msg::{Replicate, ReplicateAck};
use weir_wire::{NodeId, StreamId, Version};

use super::Replicator;
use crate::ingest::log::{IngestLog, LogError};

/// Who a follower answers: the primary, the partition, and the session of its last message.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answer {
    pub(super) primary: NodeId,
    pub(super) stream: StreamId,
    pub(super) partition: u32,
    pub(super) session: u64,
}

impl<T> Replicator<T> {
    /// A follower's side: writes what the primary shipped, answering after the next sync (or
    /// at once when the entries were refused or there were none).
    pub(super) fn copy(&mut self, from: NodeId, msg: Replicate, logs: &mut [IngestLog]) {
        let p = msg.partition;
        let to = Answer { primary: from, stream: msg.stream, partition: p, session: msg.session };
        let Some(log) = logs.get_mut(p as usize) else {
            let error = format!("no partition {p} on this node ({} partitions)", logs.len());
            return self.answer_now(to, Version(0), error, None);
        };
        let wrote = (|| {
            if msg.reset {
                // At the primary's first version, whose chain the message names (entries it
                // ships from further on are refused until it ships from there).
                log.restart_at(msg.log_first, msg.log_first_chain)?;
            } else if log.next_version() < msg.log_first {
                // The primary's log begins past this copy's end (truncated): the copy starts
                // again there, and entries shipped from further on are refused until the
                // primary ships from its start (a copy with a hole would serve a source).
                log.restart_at(msg.log_first, msg.log_first_chain)?;
            }
            log.adopt_producers(&msg.producers)?;
            log.append_entries(msg.at, &msg.entries)
        })();
        match wrote {
            // Where the copy ends, written and synced (a primary's first question compares it
            // with its own log: unsynced entries here count too).
            Ok(_) if msg.entries.is_empty() && !msg.reset && log.durable_version() == log.next_version() => {
                let next = log.durable_version();
                self.answer_now(to, next, String::new(), Some(log.chain));
            }
            Ok(_) => {
                // One answer per primary and partition after the sync, naming the latest session.
                self.owed.retain(|o| (o.primary, o.stream, o.partition) != (to.primary, to.stream, to.partition));
                self.owed.push(to);
            }
            Err(e) => {
                if !matches!(e, LogError::Replica { .. }) {
                    tracing::error!(partition = p, primary = %from, error = %e, "ingest replica cannot write");
                }
                let next = log.durable_version().min(log.next_version());
                self.answer_now(to, next, e.to_string(), None);
            }
        }
    }

    fn answer_now(&mut self, to: Answer, next: Version, error: String, chain: Option<u32>) {
        if let Some(link) = self.link.as_mut() {
            let Answer { primary, stream, partition, session } = to;
            link.answer(primary, &ReplicateAck { stream, partition, next, error, session, chain });
        }
    }

    /// Syncs the copies written since the last call and answers their primaries.
    pub(in crate::ingest) fn sync_copies(&mut self, logs: &mut [IngestLog]) {
        for to in std::mem::take(&mut self.owed) {
            let log = &mut logs[to.partition as usize];
            let (next, error, chain) = match log.sync() {
                Ok(next) => (next, String::new(), Some(log.chain)),
                Err(e) => {
                    tracing::error!(partition = to.partition, error = %e, "ingest replica sync failed");
                    (log.durable_version(), format!("not durable: {e}"), None)
                }
            };
            self.answer_now(to, next, error, chain);
        }
    }
}
