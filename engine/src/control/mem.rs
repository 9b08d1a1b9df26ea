//! [`MemControl`]: the control store in process, for `weir run`, a one-node cluster and the
//! simulator. One mutex makes it linearizable; leases end on its clock, which the simulator and
//! tests drive by hand ([`ManualClock`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Compare, ControlError, ControlStore, Entry, LeaseId, Op, TxnOutcome};

/// A clock the caller moves ([`MemControl::with_clock`]).
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<Mutex<Duration>>);

impl ManualClock {
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += d;
    }

    fn now(&self) -> Duration {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
enum Clock {
    Real(Instant),
    Manual(ManualClock),
}

impl Clock {
    fn now(&self) -> Duration {
        match self {
            Clock::Real(start) => start.elapsed(),
            Clock::Manual(c) => c.now(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    revision: i64,
    keys: BTreeMap<String, Entry>,
    /// Live leases: their TTL and when they end.
    leases: HashMap<LeaseId, (Duration, Duration)>,
    next_lease: i64,
}

impl State {
    /// Ends the leases whose time is up, and their keys.
    fn expire(&mut self, now: Duration) {
        let ended: Vec<LeaseId> = self.leases.iter().filter(|(_, (_, end))| *end <= now).map(|(l, _)| *l).collect();
        for l in ended {
            self.end(l);
        }
    }

    fn end(&mut self, lease: LeaseId) {
        if self.leases.remove(&lease).is_some() {
            let before = self.keys.len();
            self.keys.retain(|_, e| e.lease != Some(lease));
            if self.keys.len() != before {
                self.revision += 1;
            }
        }
    }

    fn holds(&self, c: &Compare) -> bool {
        match c {
            Compare::ModRevision(k, r) => self.keys.get(k).map_or(0, |e| e.mod_revision) == *r,
            Compare::LeaseIs(k, l) => self.keys.get(k).is_some_and(|e| e.lease == Some(*l)),
        }
    }
}

/// The control store in process.
#[derive(Debug)]
pub struct MemControl {
    state: Mutex<State>,
    clock: Clock,
}

impl Default for MemControl {
    fn default() -> Self {
        Self::new()
    }
}

impl MemControl {
    /// A store whose leases end on the real clock.
    pub fn new() -> Self {
        Self { state: Mutex::default(), clock: Clock::Real(Instant::now()) }
    }

    /// A store whose leases end on `clock`.
    pub fn with_clock(clock: ManualClock) -> Self {
        Self { state: Mutex::default(), clock: Clock::Manual(clock) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.expire(self.clock.now());
        s
    }
}

fn refused(op: &'static str, reason: &str) -> ControlError {
    ControlError::Refused { endpoint: "in-process".into(), op, reason: reason.into() }
}

impl ControlStore for MemControl {
    fn grant(&self, ttl: Duration) -> Result<LeaseId, ControlError> {
        if ttl.is_zero() {
            return Err(refused("grant", "a lease needs a positive TTL"));
        }
        // Whole seconds, as etcd grants them.
        let ttl = Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0));
        let now = self.clock.now();
        let mut s = self.state();
        s.next_lease += 1;
        let id = LeaseId(s.next_lease);
        s.leases.insert(id, (ttl, now + ttl));
        Ok(id)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, ControlError> {
        let now = self.clock.now();
        let mut s = self.state();
        Ok(s.leases.get_mut(&lease).map(|(ttl, end)| {
            *end = now + *ttl;
            *ttl
        }))
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), ControlError> {
        self.state().end(lease);
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, ControlError> {
        Ok(self.state().keys.get(key).cloned())
    }

    fn list(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Entry)>, ControlError> {
        let s = self.state();
        let under = s.keys.range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix));
        Ok(under.take(limit).map(|(k, e)| (k.clone(), e.clone())).collect())
    }

    fn txn(&self, when: &[Compare], then: &[Op]) -> Result<TxnOutcome, ControlError> {
        let mut s = self.state();
        for op in then {
            if let Op::Put { lease: Some(l), .. } = op
                && !s.leases.contains_key(l)
            {
                return Err(refused("txn", "requested lease not found"));
            }
        }
        if !when.iter().all(|c| s.holds(c)) {
            return Ok(TxnOutcome { succeeded: false, revision: s.revision });
        }
        if !then.is_empty() {
            s.revision += 1;
            let rev = s.revision;
            for op in then {
                match op {
                    Op::Put { key, value, lease } => {
                        s.keys.insert(key.clone(), Entry { value: value.clone(), mod_revision: rev, lease: *lease });
                    }
                    Op::Delete(key) => {
                        s.keys.remove(key);
                    }
                }
            }
        }
        Ok(TxnOutcome { succeeded: true, revision: s.revision })
    }
}
