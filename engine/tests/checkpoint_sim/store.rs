//! The remote store the simulation runs on: in memory, with the faults a real one has (puts
//! that fail, puts that fail after storing, gets that fail), deterministic from its own seed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use weir_engine::backup::{Store, StoreError};

use super::world::Rng;

/// What the store does with one put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PutFault {
    None,
    /// Not stored; an error.
    Fail,
    /// Stored, but the answer says it failed.
    FailAfterWrite,
}

#[derive(Debug, Default)]
struct StoreState {
    objects: BTreeMap<String, Vec<u8>>,
    rng: u64,
    faults: bool,
    put_failures: u64,
    visible_despite_error: u64,
    get_failures: u64,
}

/// An in-memory store that injects faults when asked to: puts that fail, puts that fail after
/// storing, gets that fail. Deterministic (its own seeded random source).
#[derive(Debug)]
pub struct FaultyStore {
    state: Mutex<StoreState>,
}

impl FaultyStore {
    pub fn new(seed: u64) -> Self {
        Self { state: Mutex::new(StoreState { rng: seed | 1, ..StoreState::default() }) }
    }

    pub fn set_faults(&self, on: bool) {
        self.state.lock().unwrap().faults = on;
    }

    /// Runs `f` with the store's faults off (the checker reading through the engine's code).
    pub fn calm<T>(&self, f: impl FnOnce() -> T) -> T {
        let was = std::mem::replace(&mut self.state.lock().unwrap().faults, false);
        let out = f();
        self.state.lock().unwrap().faults = was;
        out
    }

    /// The object under `key`, without faults (for the checker).
    pub fn peek(&self, key: &str) -> Option<Vec<u8>> {
        self.state.lock().unwrap().objects.get(key).cloned()
    }

    /// Keys under `prefix`, without faults (for the checker).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.state.lock().unwrap().objects.keys().filter(|k| k.starts_with(prefix)).cloned().collect()
    }

    /// Removes every key under `prefix` (a lost disk).
    pub fn wipe(&self, prefix: &str) {
        self.state.lock().unwrap().objects.retain(|k, _| !k.starts_with(prefix));
    }

    /// (put failures, stored despite an error, get failures) so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = self.state.lock().unwrap();
        (s.put_failures, s.visible_despite_error, s.get_failures)
    }

    fn roll(s: &mut StoreState, per_mille: u64) -> bool {
        let mut r = Rng(s.rng);
        let hit = s.faults && r.chance(per_mille);
        s.rng = r.0;
        hit
    }
}

impl Store for FaultyStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let mut s = self.state.lock().unwrap();
        // Commit records are few (most checkpoints of the faulty phase fail earlier): fail
        // their writes more often, so every seed set sees some.
        let fail = if key.contains("/checkpoints/") { 150 } else { 30 };
        let fault = if Self::roll(&mut s, fail) {
            PutFault::Fail
        } else if Self::roll(&mut s, 20) {
            PutFault::FailAfterWrite
        } else {
            PutFault::None
        };
        if fault != PutFault::Fail {
            s.objects.insert(key.to_string(), bytes.to_vec());
        }
        match fault {
            PutFault::None => Ok(()),
            PutFault::Fail => {
                s.put_failures += 1;
                Err(StoreError::Unavailable { op: "put", key: key.into(), reason: "injected".into() })
            }
            PutFault::FailAfterWrite => {
                s.visible_despite_error += 1;
                Err(StoreError::Unavailable { op: "put", key: key.into(), reason: "answer lost".into() })
            }
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let mut s = self.state.lock().unwrap();
        if Self::roll(&mut s, 50) {
            s.get_failures += 1;
            return Err(StoreError::Unavailable { op: "get", key: key.into(), reason: "injected".into() });
        }
        s.objects.get(key).cloned().ok_or_else(|| StoreError::NotFound { key: key.into() })
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.state.lock().unwrap().objects.get(key).map(|v| v.len() as u64))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.keys(prefix))
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.state.lock().unwrap().objects.remove(key);
        Ok(())
    }
}
