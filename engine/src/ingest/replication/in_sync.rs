//! The primary's side of the in-sync sets, on the writer thread: it takes the control store's
//! answers and steps each replicated partition's [`crate::ingest::in_sync::Membership`], asking
//! for the writes it needs and releasing what waited for a copy written out.

use std::time::Instant;

use super::{RETRY, Replicator};
use crate::ingest::in_sync::{Standing, Step};
use crate::ingest::log::IngestLog;
use crate::ingest::service::Appended;

impl<T> Replicator<T> {
    /// Takes the control store's answers and moves copies out of (or back into) their sets.
    pub(super) fn in_sync_step(&mut self, logs: &mut [IngestLog]) -> Vec<(Appended<T>, Instant)> {
        let mut released = Vec::new();
        let Some(set) = self.in_sync.as_mut() else { return released };
        let now = Instant::now();
        while let Some((p, seq, done)) = set.answer() {
            if let Some(s) = self.shipping.get_mut(&p) {
                s.set.answered(seq, done, now, self.lag.min(RETRY));
            }
        }
        for (&p, s) in &mut self.shipping {
            let log = &mut logs[p as usize];
            let seq = self.seq + 1;
            match s.set.step(s.acked, log.durable_version(), now, self.lag, set.may_leave(), seq) {
                Step::Nothing => {}
                Step::Request(in_sync) => {
                    set.request(p, in_sync, seq);
                    self.seq = seq;
                }
                Step::GoAlone => {
                    tracing::warn!(partition = p, follower = %s.follower, lag = ?self.lag,
                        "the follower's copy left the in-sync set: appends are acknowledged on this node alone until it catches up");
                    released.extend(s.held.drain(..).map(|(a, taken, _)| (a, taken)));
                }
                Step::Wait => {
                    tracing::info!(partition = p, follower = %s.follower, "the follower's copy keeps up again: appends wait for it");
                }
            }
            let standing = s.set.standing();
            if log.standing() != standing {
                if standing == Standing::In {
                    tracing::info!(partition = p, follower = %s.follower, "the follower's copy is in the in-sync set");
                }
                log.set_standing(standing);
            }
        }
        released
    }
}
