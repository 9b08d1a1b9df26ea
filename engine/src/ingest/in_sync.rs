//! A replicated partition's place in its in-sync set, on the primary's writer: whether its
//! appends wait for the follower's copy, and when to ask the control store to change that
//! (`crate::cluster::ControlInSync` holds the set).
//!
//! Invariants (with those of the set's key):
//! - An acknowledgement goes out on this node's sync alone only in [`CopySet::Alone`], which is
//!   entered only once the control store answered that the key says the copy is out.
//! - Asking the copy back in ([`CopySet::Joining`]) happens only when it holds everything
//!   durable here (so every row acknowledged or read so far), and appends wait for it from
//!   that moment: any answer but a written key leaves them waiting ([`CopySet::InSync`]),
//!   which is always safe.
//! - The writer never blocks on the control store: requests go out and answers come back
//!   through [`InSyncSet`].

use std::time::{Duration, Instant};

/// The control store's side, as the writer sees it.
pub trait InSyncSet: Send {
    /// Asks that partition `partition`'s follower copy leave (`in_sync` false) or rejoin the set;
    /// the answer comes back from [`Self::answer`] with `seq`. Never blocks.
    fn request(&mut self, partition: u32, in_sync: bool, seq: u64);
    /// An answer to a request, if one came: the partition, the request's `seq`, and whether the
    /// key now says what was asked.
    fn answer(&mut self) -> Option<(u32, u64, bool)>;
}

/// Where a partition's copy stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopySet {
    /// In the set: appends wait for the copy.
    InSync,
    /// Asked out (request `seq`): appends still wait.
    Leaving(u64),
    /// Out: appends are acknowledged on this node's sync alone.
    Alone,
    /// Asked back in (request `seq`): appends wait again.
    Joining(u64),
}

/// One partition's state and timers.
#[derive(Debug)]
pub struct Membership {
    /// Where the copy stands.
    pub set: CopySet,
    /// No request before this (after one that failed).
    not_before: Instant,
}

impl Membership {
    /// A copy starting `alone` (the key says so for this primary and follower) or in the set.
    pub fn new(alone: bool) -> Self {
        Self { set: if alone { CopySet::Alone } else { CopySet::InSync }, not_before: Instant::now() }
    }

    /// Whether an acknowledgement waits for the copy.
    pub fn waits(&self) -> bool {
        self.set != CopySet::Alone
    }

    /// Whether a request is out.
    pub fn asking(&self) -> bool {
        matches!(self.set, CopySet::Leaving(_) | CopySet::Joining(_))
    }

    /// In the set with an acknowledgement waiting since `oldest` for longer than `lag`: ask the
    /// copy out (request `seq`). Returns whether to send it.
    pub fn leave_if_late(&mut self, oldest: Option<Instant>, lag: Duration, now: Instant, seq: u64) -> bool {
        let late = oldest.is_some_and(|t| now.duration_since(t) >= lag);
        if self.set == CopySet::InSync && late && now >= self.not_before {
            self.set = CopySet::Leaving(seq);
            return true;
        }
        false
    }

    /// Out of the set with the copy holding everything durable here (`copy` ≥ `durable`): ask
    /// it back in (request `seq`); appends wait for it from now on. Returns whether to send it.
    pub fn join_if_caught_up(&mut self, copy: Option<u64>, durable: u64, now: Instant, seq: u64) -> bool {
        if self.set == CopySet::Alone && copy.is_some_and(|c| c >= durable) && now >= self.not_before {
            self.set = CopySet::Joining(seq);
            return true;
        }
        false
    }

    /// The answer to request `seq`: whether the key now says what was asked. Returns the copy's
    /// new standing when it changed (`Some(true)`: now out, release what waits; `Some(false)`:
    /// back in).
    pub fn answered(&mut self, seq: u64, done: bool, now: Instant, retry: Duration) -> Option<bool> {
        match self.set {
            CopySet::Leaving(s) if s == seq && done => {
                self.set = CopySet::Alone;
                Some(true)
            }
            CopySet::Joining(s) if s == seq => {
                // Not written, or unknown: waiting for the copy is safe either way; if it lags
                // again it is asked out again.
                self.set = CopySet::InSync;
                if !done {
                    self.not_before = now + retry;
                }
                Some(false)
            }
            CopySet::Leaving(s) if s == seq => {
                self.set = CopySet::InSync;
                self.not_before = now + retry;
                None
            }
            _ => None, // an answer to an older request
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: Duration = Duration::from_secs(5);

    #[test]
    fn a_copy_is_asked_out_only_when_an_acknowledgement_waited_longer_than_the_lag() {
        let t0 = Instant::now();
        let mut m = Membership::new(false);
        assert!(m.waits());
        assert!(!m.leave_if_late(None, LAG, t0 + LAG * 2, 1), "nothing waits");
        assert!(!m.leave_if_late(Some(t0), LAG, t0 + LAG / 2, 1));
        assert!(m.leave_if_late(Some(t0), LAG, t0 + LAG, 1));
        assert!(m.waits(), "until the key says it is out");
        assert_eq!(m.answered(1, true, t0 + LAG, LAG), Some(true));
        assert!(!m.waits());
    }

    #[test]
    fn a_refused_leave_keeps_waiting_and_is_tried_again_after_the_retry() {
        let t0 = Instant::now();
        let mut m = Membership::new(false);
        assert!(m.leave_if_late(Some(t0), LAG, t0 + LAG, 1));
        assert_eq!(m.answered(1, false, t0 + LAG, LAG), None);
        assert!(m.waits());
        assert!(!m.leave_if_late(Some(t0), LAG, t0 + LAG + LAG / 2, 2), "not before the retry");
        assert!(m.leave_if_late(Some(t0), LAG, t0 + LAG * 2, 2));
        assert_eq!(m.answered(1, true, t0 + LAG * 2, LAG), None, "an answer to the older request");
        assert!(m.waits());
    }

    #[test]
    fn a_copy_rejoins_only_once_caught_up_and_waits_from_the_request_whatever_the_answer() {
        let mut m = Membership::new(true);
        let t0 = Instant::now();
        assert!(!m.join_if_caught_up(None, 10, t0, 1), "no answer from the copy yet");
        assert!(!m.join_if_caught_up(Some(9), 10, t0, 1));
        assert!(m.join_if_caught_up(Some(10), 10, t0, 1));
        assert!(m.waits(), "appends wait from the request on");
        assert_eq!(m.answered(1, false, t0, LAG), Some(false), "not written: waiting stays safe");
        assert!(m.waits());
        let mut m = Membership::new(true);
        let t0 = Instant::now();
        assert!(m.join_if_caught_up(Some(12), 10, t0, 1));
        assert_eq!(m.answered(1, true, t0, LAG), Some(false));
        assert_eq!(m.set, CopySet::InSync);
    }
}
