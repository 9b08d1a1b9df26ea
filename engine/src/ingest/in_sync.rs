//! A replicated partition's place in its in-sync set, on the primary's writer: whether its
//! appends wait for the follower's copy, and what to ask the control store to write
//! (`crate::cluster::ControlInSync` holds the set, one key per partition).
//!
//! Invariants (with those of the key's writes, each compared with the revision this run last
//! confirmed, so a write of this run lands only if no other landed since):
//! - Appends are acknowledged on this node's sync alone only while this run has confirmed that
//!   the key says the copy is out, and has no write of "in" whose fate is unknown.
//! - The key says "in" only through a write asked for once the copy held everything durable
//!   here when appends started waiting for it again, and appends wait for it from that moment.
//! - Every run writes the key before it goes alone or counts the copy in, so the writes of a
//!   run before it can no longer land.
//! - The writer never blocks on the control store: requests go out and answers come back
//!   through [`InSyncSet`].

use std::time::{Duration, Instant};

use weir_wire::Version;

/// The control store's side, as the writer sees it.
pub trait InSyncSet: Send {
    /// Asks that the key say partition `partition`'s follower copy is in the set (`in_sync`)
    /// or out; the answer comes back from [`Self::answer`] with `seq`. Never blocks.
    fn request(&mut self, partition: u32, in_sync: bool, seq: u64);
    /// An answer to a request, if one came: the partition, the request's `seq`, and whether the
    /// key now holds what was asked.
    fn answer(&mut self) -> Option<(u32, u64, bool)>;
    /// Whether this node may write a late copy out: it reaches most of the other members (a
    /// primary cut off from its peers but not from the store would otherwise take every copy
    /// out and acknowledge alone, on the side that is about to give up).
    fn may_leave(&self) -> bool {
        true
    }
}

/// Where the copy stands, for status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Standing {
    /// No in-sync set: appends always wait for the copy.
    NoSet = 0,
    /// The key says the copy is in: appends wait for it.
    In = 1,
    /// Not known yet, or being written: appends wait for the copy.
    Unknown = 2,
    /// The key says the copy is out; appends still wait for it (it keeps up, or has not lagged
    /// for long).
    Out = 3,
    /// The key says the copy is out, and appends are acknowledged on this node alone.
    Alone = 4,
}

/// What a step asks of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Nothing,
    /// Send this request (its value) with the step's `seq`.
    Request(bool),
    /// Acknowledge alone from now on: release what waits for the copy.
    GoAlone,
    /// Wait for the copy again (the source reads only what it holds from now on).
    Wait,
}

/// One partition's place in its set.
#[derive(Debug)]
pub struct Membership {
    /// The key's value as this run last confirmed it (`None`: not yet, or a write's fate is
    /// unknown).
    confirmed: Option<bool>,
    /// The request out, with its value.
    pending: Option<(u64, bool)>,
    /// Acknowledgements go out without the copy.
    alone: bool,
    /// Once the copy holds this (what was durable here when appends last started waiting for
    /// it, or at the run's start), it holds every row acknowledged or read: it may be written in.
    join_at: Option<Version>,
    /// The copy is late when it has not reached `target` (what was durable here at `since`)
    /// within the lag; it keeps up when it reached the last one in time (`timely`).
    target: Version,
    since: Instant,
    timely: bool,
    /// The copy's data is gone or being replaced: it must be written out before anything else.
    lost: bool,
    /// No request before this (after one that failed).
    not_before: Instant,
}

impl Membership {
    /// A copy at a run's start: nothing confirmed, appends waiting for it.
    pub fn new(now: Instant) -> Self {
        Self {
            confirmed: None,
            pending: None,
            alone: false,
            join_at: None,
            target: Version(0),
            since: now,
            timely: false,
            lost: false,
            not_before: now,
        }
    }

    /// Whether an acknowledgement waits for the copy.
    pub fn waits(&self) -> bool {
        !self.alone
    }

    /// Whether a request is out.
    pub fn asking(&self) -> bool {
        self.pending.is_some()
    }

    /// Where the copy stands.
    pub fn standing(&self) -> Standing {
        match (self.alone, self.confirmed, self.pending) {
            (true, _, _) => Standing::Alone,
            (false, Some(true), None) => Standing::In,
            (false, Some(false), None) => Standing::Out,
            _ => Standing::Unknown,
        }
    }

    /// The copy's data is gone or being replaced (it diverged, or shrank): unless the key
    /// surely says out already, it is written out before anything else, and it must hold all
    /// that is durable from now on before it is written in again.
    pub fn copy_lost(&mut self) {
        self.join_at = None;
        if self.confirmed != Some(false) || self.pending.is_some() {
            self.lost = true;
        }
    }

    /// One step at `now`: the copy holds everything below `copy` (`None`: no answer of this
    /// session yet) and everything below `durable` is durable here. With a lag of
    /// `Duration::MAX` the copy is never late: appends always wait for it.
    /// A late copy is written out only when `may_leave`; a lost one always is.
    pub fn step(
        &mut self,
        copy: Option<Version>,
        durable: Version,
        now: Instant,
        lag: Duration,
        may_leave: bool,
        seq: u64,
    ) -> Step {
        let copy = copy.unwrap_or(Version(0));
        if copy >= self.target {
            self.timely = now.duration_since(self.since) < lag;
            self.target = durable;
            self.since = now;
        }
        let late = now.duration_since(self.since) >= lag;
        if self.pending.is_some() || now < self.not_before {
            return Step::Nothing;
        }
        if self.alone {
            if late || !self.timely {
                return Step::Nothing;
            }
            // The copy keeps up again: appends wait for it from here, and once it holds what
            // is durable now (all that was acknowledged or read alone) it is written in.
            self.alone = false;
            self.join_at = Some(durable);
            return Step::Wait;
        }
        if self.confirmed != Some(true) && !self.lost {
            let join_at = *self.join_at.get_or_insert(durable);
            if copy >= join_at {
                return self.ask(seq, true);
            }
        }
        if (self.lost || late && may_leave) && self.confirmed != Some(false) {
            return self.ask(seq, false);
        }
        if late && self.confirmed == Some(false) {
            self.join_at = None;
            self.alone = true;
            return Step::GoAlone;
        }
        Step::Nothing
    }

    fn ask(&mut self, seq: u64, in_sync: bool) -> Step {
        self.pending = Some((seq, in_sync));
        Step::Request(in_sync)
    }

    /// The answer to request `seq`: whether the key now holds what it asked. A failure leaves
    /// the key's value unknown (the write may still land, until a later one of this run does).
    pub fn answered(&mut self, seq: u64, done: bool, now: Instant, retry: Duration) {
        let Some((s, value)) = self.pending else { return };
        if s != seq {
            return;
        }
        self.pending = None;
        if done {
            self.confirmed = Some(value);
            if value {
                self.join_at = None;
            } else {
                self.lost = false;
            }
        } else {
            self.confirmed = None;
            self.not_before = now.checked_add(retry).unwrap_or(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: Duration = Duration::from_secs(5);

    fn v(n: u64) -> Option<Version> {
        Some(Version(n))
    }

    /// `m` with its copy in the set (the run's first write), the log at 10.
    fn started_in(t0: Instant) -> Membership {
        let mut m = Membership::new(t0);
        assert_eq!(m.standing(), Standing::Unknown);
        assert_eq!(m.step(v(10), Version(10), t0, LAG, true, 1), Step::Request(true));
        m.answered(1, true, t0, LAG);
        assert_eq!(m.standing(), Standing::In);
        m
    }

    /// `m` alone since `t0 + LAG`: its copy stopped at 0 with the log at 10.
    fn gone_alone(t0: Instant) -> Membership {
        let mut m = Membership::new(t0);
        assert_eq!(m.step(v(0), Version(10), t0, LAG, true, 1), Step::Nothing, "not yet all it must hold");
        assert_eq!(m.step(v(0), Version(10), t0 + LAG, LAG, true, 1), Step::Request(false));
        m.answered(1, true, t0 + LAG, LAG);
        assert_eq!(m.standing(), Standing::Out);
        assert_eq!(m.step(v(0), Version(10), t0 + LAG, LAG, true, 2), Step::GoAlone);
        m
    }

    #[test]
    fn a_copy_holding_all_is_written_in_and_keeping_up_under_load_stays_in() {
        let t0 = Instant::now();
        let mut m = started_in(t0);
        assert!(m.waits());
        for i in 1..100u64 {
            let t = t0 + Duration::from_millis(100 * i);
            assert_eq!(m.step(v(10 * i), Version(10 * i + 5), t, LAG, true, 2), Step::Nothing);
        }
    }

    #[test]
    fn a_run_writes_its_copy_in_only_once_it_holds_what_was_durable_at_the_start() {
        let t0 = Instant::now();
        let mut m = Membership::new(t0);
        assert_eq!(m.step(None, Version(10), t0, LAG, true, 1), Step::Nothing, "no answer yet");
        // The log grows; the copy reaching the start's end is enough.
        assert_eq!(m.step(v(8), Version(30), t0, LAG, true, 1), Step::Nothing);
        assert_eq!(m.step(v(10), Version(40), t0, LAG, true, 1), Step::Request(true));
    }

    #[test]
    fn a_late_copy_is_written_out_and_appends_go_alone_only_once_the_key_says_so() {
        let t0 = Instant::now();
        let mut m = started_in(t0);
        // The copy stops at 10 while the log grows.
        assert_eq!(m.step(v(10), Version(20), t0, LAG, true, 2), Step::Nothing);
        assert_eq!(m.step(v(10), Version(30), t0 + LAG / 2, LAG, true, 2), Step::Nothing);
        assert_eq!(m.step(v(10), Version(30), t0 + LAG, LAG, true, 2), Step::Request(false));
        assert!(m.waits(), "until the key says it is out");
        m.answered(2, true, t0 + LAG, LAG);
        assert_eq!(m.step(v(10), Version(30), t0 + LAG, LAG, true, 3), Step::GoAlone);
        assert!(!m.waits());
        assert_eq!(m.standing(), Standing::Alone);
    }

    #[test]
    fn a_failed_write_leaves_the_key_unknown_and_appends_waiting_until_one_lands() {
        let t0 = Instant::now();
        let mut m = started_in(t0);
        assert_eq!(m.step(v(10), Version(20), t0, LAG, true, 2), Step::Nothing);
        assert_eq!(m.step(v(10), Version(20), t0 + LAG, LAG, true, 2), Step::Request(false));
        m.answered(2, false, t0 + LAG, LAG);
        assert_eq!(m.standing(), Standing::Unknown);
        assert_eq!(m.step(v(10), Version(20), t0 + LAG, LAG, true, 3), Step::Nothing, "not before the retry");
        assert_eq!(m.step(v(10), Version(20), t0 + LAG * 2, LAG, true, 3), Step::Request(false));
        m.answered(2, true, t0 + LAG * 2, LAG);
        assert!(m.waits(), "an answer to an older request counts for nothing");
        m.answered(3, true, t0 + LAG * 2, LAG);
        assert_eq!(m.step(v(10), Version(20), t0 + LAG * 2, LAG, true, 4), Step::GoAlone);
    }

    #[test]
    fn a_copy_back_is_waited_for_once_it_keeps_up_and_written_in_once_it_holds_all() {
        let t0 = Instant::now();
        let mut m = gone_alone(t0);
        // Back after a long while: reaching a target set long ago is not keeping up.
        let t1 = t0 + LAG * 10;
        assert_eq!(m.step(v(10), Version(50), t1, LAG, true, 2), Step::Nothing);
        assert!(!m.waits());
        // It reaches the next one in time: appends wait for it from here.
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(m.step(v(50), Version(60), t2, LAG, true, 2), Step::Wait);
        assert!(m.waits());
        assert_eq!(m.step(v(55), Version(70), t2, LAG, true, 2), Step::Nothing, "not yet all it must hold");
        assert_eq!(m.step(v(60), Version(70), t2, LAG, true, 2), Step::Request(true));
        m.answered(2, false, t2, LAG);
        assert!(m.waits(), "unknown: appends keep waiting");
        assert_eq!(m.step(v(70), Version(70), t2 + LAG, LAG, true, 3), Step::Request(true), "written in again");
        m.answered(3, true, t2 + LAG, LAG);
        assert_eq!(m.standing(), Standing::In);
    }

    #[test]
    fn a_copy_that_lags_again_before_it_is_in_goes_alone_without_a_write() {
        let t0 = Instant::now();
        let mut m = gone_alone(t0);
        let t1 = t0 + LAG * 2;
        m.step(v(10), Version(50), t1, LAG, true, 2);
        assert_eq!(m.step(v(50), Version(60), t1, LAG, true, 2), Step::Wait);
        assert_eq!(m.step(v(55), Version(80), t1 + LAG, LAG, true, 2), Step::GoAlone, "the key still says out");
    }

    #[test]
    fn a_lost_copy_is_written_out_at_once_and_in_again_only_once_it_holds_all() {
        let t0 = Instant::now();
        let mut m = started_in(t0);
        m.copy_lost();
        assert_eq!(m.step(None, Version(10), t0, LAG, true, 2), Step::Request(false));
        m.answered(2, true, t0, LAG);
        assert_eq!(m.step(v(0), Version(10), t0, LAG, true, 3), Step::Nothing, "waits for the copy, not alone");
        assert_eq!(m.step(v(10), Version(10), t0, LAG, true, 3), Step::Request(true));
    }

    #[test]
    fn a_copy_lost_while_alone_can_come_back() {
        let t0 = Instant::now();
        let mut m = gone_alone(t0);
        m.copy_lost();
        let t1 = t0 + LAG * 2;
        assert_eq!(m.step(v(0), Version(10), t1, LAG, true, 2), Step::Nothing);
        assert_eq!(m.step(v(10), Version(20), t1, LAG, true, 2), Step::Nothing, "a target set long ago");
        assert_eq!(m.step(v(20), Version(20), t1, LAG, true, 2), Step::Wait);
        assert_eq!(m.step(v(20), Version(20), t1, LAG, true, 2), Step::Request(true));
    }

    #[test]
    fn with_no_lag_appends_always_wait_and_the_key_is_still_written() {
        let t0 = Instant::now();
        let mut m = Membership::new(t0);
        let never = Duration::MAX;
        assert_eq!(m.step(v(0), Version(10), t0 + LAG * 100, never, true, 1), Step::Nothing);
        assert_eq!(m.step(v(10), Version(10), t0 + LAG * 100, never, true, 1), Step::Request(true));
        m.answered(1, true, t0, never);
        m.copy_lost();
        assert_eq!(m.step(None, Version(10), t0 + LAG * 200, never, true, 2), Step::Request(false));
        m.answered(2, true, t0, never);
        assert_eq!(m.step(None, Version(20), t0 + LAG * 300, never, true, 3), Step::Nothing, "never alone");
        assert!(m.waits());
    }

    #[test]
    fn a_node_that_reaches_too_few_members_writes_no_late_copy_out() {
        let t0 = Instant::now();
        let mut m = started_in(t0);
        assert_eq!(m.step(v(10), Version(20), t0, LAG, false, 2), Step::Nothing);
        assert_eq!(m.step(v(10), Version(20), t0 + LAG, LAG, false, 2), Step::Nothing, "cut off: appends wait");
        assert!(m.waits());
        m.copy_lost();
        assert_eq!(m.step(v(10), Version(20), t0 + LAG, LAG, false, 2), Step::Request(false), "a lost copy is");
    }
}
