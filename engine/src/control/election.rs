//! Leader election on the control store: candidates race to create one key with their lease;
//! the candidate whose create lands leads while its lease lives, and the key goes with the lease
//! (revoked, or expired when its holder stopped renewing it: died, paused, or cut off from the
//! store's majority), so the next round's race elects another.
//!
//! Two guards, so that two leaders never act at once:
//! - Writes a leader makes in the store are fenced: they compare the key's lease with the
//!   leader's ([`Election::fence`]), so a deposed or isolated leader's writes are refused by the
//!   store itself.
//! - A leader stops acting on its own before its lease can have ended in the store
//!   ([`Election::leads`]): the store starts a renewal's TTL when it receives it, after the
//!   candidate sent it, so the candidate's send time plus the TTL is an upper bound, less a
//!   margin for the two clocks' rates.
//!
//! Invariants: `lease` is the only lease the candidate holds; `valid_until` is set only by a
//! renewal or grant that succeeded, and only while the candidate leads.

use std::time::{Duration, Instant};

use super::{Compare, ControlError, ControlStore, LeaseId, Op};

/// What a candidate is after an [`Election::step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// It leads (holding `lease`) until its next step or [`Election::leads`] says otherwise.
    Leader { lease: LeaseId },
    /// Another leads (its name, when there is one).
    Follower { leader: Option<String> },
}

/// One candidate in the election of `key`.
#[derive(Debug)]
pub struct Election {
    key: String,
    me: String,
    ttl: Duration,
    lease: Option<LeaseId>,
    /// It led at its last step, and may act as leader until then.
    valid_until: Option<Instant>,
    /// Its lease lives in the store at least until then (the last renewal that succeeded,
    /// less the margin), whatever its role and whatever the steps since.
    held_until: Option<Instant>,
}

impl Election {
    /// Candidate `me` in the election of `key`, with leases of `ttl` (whole seconds, at least
    /// etcd's minimum of 2 s for a default etcd): steps come every third of it.
    pub fn new(key: impl Into<String>, me: impl Into<String>, ttl: Duration) -> Self {
        Self { key: key.into(), me: me.into(), ttl, lease: None, valid_until: None, held_until: None }
    }

    /// The margin a leader keeps below its lease's end: a tenth of the TTL (clock rates differ
    /// by far less), and at least 100 ms.
    fn margin(&self) -> Duration {
        (self.ttl / 10).max(Duration::from_millis(100))
    }

    /// One round at `now`: renews the lease (or takes a new one if it ended), then leads if the
    /// key is free or already this candidate's. On an error the candidate stops leading (it
    /// cannot know whether its lease lives) and the next step tries again.
    pub fn step(&mut self, store: &dyn ControlStore, now: Instant) -> Result<Role, ControlError> {
        let r = self.round(store, now);
        if !matches!(r, Ok(Role::Leader { .. })) {
            self.valid_until = None;
        }
        r
    }

    fn round(&mut self, store: &dyn ControlStore, now: Instant) -> Result<Role, ControlError> {
        let live_until = now + self.ttl.saturating_sub(self.margin());
        let lease = match self.lease {
            Some(l) if store.keep_alive(l)?.is_some() => l,
            _ => {
                self.lease = None;
                self.valid_until = None;
                self.held_until = None;
                let l = store.grant(self.ttl)?;
                self.lease = Some(l);
                l
            }
        };
        self.held_until = Some(live_until);
        let put = Op::Put { key: self.key.clone(), value: self.me.clone().into_bytes(), lease: Some(lease) };
        let created = store.txn(&[Compare::ModRevision(self.key.clone(), 0)], &[put])?.succeeded;
        let entry = if created { None } else { store.get(&self.key)? };
        if created || entry.as_ref().is_some_and(|e| e.lease == Some(lease)) {
            self.valid_until = Some(live_until);
            return Ok(Role::Leader { lease });
        }
        Ok(Role::Follower { leader: entry.map(|e| String::from_utf8_lossy(&e.value).into_owned()) })
    }

    /// Whether this candidate may act as leader at `now`.
    pub fn leads(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|t| now < t)
    }

    /// Whether this candidate's lease surely lives in the store at `now` (leader or not): a
    /// member whose lease may have ended must stop acting as one.
    pub fn holds(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t)
    }

    /// Until when the candidate's lease surely lives (`None`: it holds none, or cannot tell).
    pub fn held_until(&self) -> Option<Instant> {
        self.held_until
    }

    /// The candidate's lease, once granted: the keys it writes as a member live by it.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    /// The condition every write of the leader carries: the election's key still lives by its
    /// lease. `None` when it does not lead.
    pub fn fence(&self) -> Option<Compare> {
        self.valid_until.and(self.lease).map(|l| Compare::LeaseIs(self.key.clone(), l))
    }

    /// Gives the leadership up now (a clean stop): the lease and the key go, so another
    /// candidate leads at its next step instead of after the TTL.
    pub fn resign(&mut self, store: &dyn ControlStore) -> Result<(), ControlError> {
        self.valid_until = None;
        self.held_until = None;
        match self.lease.take() {
            Some(l) => store.revoke(l),
            None => Ok(()),
        }
    }
}
