//! [`Tenure`]: until when a node may act as a member, shared lock-free between the thread that
//! renews its lease and the engine's paths that must stop at once when it may have ended (the
//! acknowledgement of ingest appends).
//!
//! Invariant: [`Tenure::holds`] is never true later than the bound last set, which the setter
//! takes from the member's own lower bound of its lease's end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A deadline readable without a lock.
#[derive(Debug)]
pub struct Tenure {
    base: Instant,
    /// Microseconds after `base` until which the node holds (0: it does not).
    until_us: AtomicU64,
}

impl Default for Tenure {
    fn default() -> Self {
        Self { base: Instant::now(), until_us: AtomicU64::new(0) }
    }
}

impl Tenure {
    /// Sets the deadline (`None`: the node holds nothing now).
    pub fn set(&self, until: Option<Instant>) {
        let us = until.map_or(0, |t| t.saturating_duration_since(self.base).as_micros().max(1) as u64);
        self.until_us.store(us, Ordering::Release);
    }

    /// Whether the node holds at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        let until = self.until_us.load(Ordering::Acquire);
        until != 0 && (now.saturating_duration_since(self.base).as_micros() as u64) < until
    }

    /// Whether the node holds now.
    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_tenure_holds_until_its_deadline_and_not_after_or_once_cleared() {
        let t = Tenure::default();
        let now = Instant::now();
        assert!(!t.holds_at(now), "nothing set: it does not hold");
        t.set(Some(now + Duration::from_secs(2)));
        assert!(t.holds_at(now + Duration::from_millis(1999)));
        assert!(!t.holds_at(now + Duration::from_secs(2)));
        t.set(None);
        assert!(!t.holds_at(now));
    }
}
