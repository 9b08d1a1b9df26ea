//! An upload bandwidth limit: a store whose puts are paced to at most a number of bytes per
//! second, shared by every thread that uploads through it. Reads (restores) are not limited.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Store, StoreError};

/// When each put may start: a virtual clock that advances by every put's bytes at the rate.
#[derive(Debug)]
struct Pacer {
    bytes_per_sec: u64,
    next: Option<Instant>,
}

impl Pacer {
    /// How long a put of `bytes` issued at `now` waits before it starts.
    fn reserve(&mut self, now: Instant, bytes: u64) -> Duration {
        let start = self.next.map_or(now, |n| n.max(now));
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec.max(1) as f64);
        self.next = Some(start + cost);
        start - now
    }
}

/// `inner` with its puts limited to `bytes_per_sec`.
#[derive(Debug)]
pub struct Throttled {
    inner: Arc<dyn Store>,
    pacer: Mutex<Pacer>,
}

impl Throttled {
    /// Limits `inner`'s uploads to `bytes_per_sec`.
    pub fn new(inner: Arc<dyn Store>, bytes_per_sec: u64) -> Self {
        Self { inner, pacer: Mutex::new(Pacer { bytes_per_sec, next: None }) }
    }

    fn pace(&self, bytes: u64) {
        let wait = self.pacer.lock().map_or(Duration::ZERO, |mut p| p.reserve(Instant::now(), bytes));
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

impl Store for Throttled {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.pace(bytes.len() as u64);
        self.inner.put(key, bytes)
    }

    fn put_file(&self, key: &str, path: &Path) -> Result<(), StoreError> {
        self.pace(std::fs::metadata(path).map_or(0, |m| m.len()));
        self.inner.put_file(key, path)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }

    fn get_at_most(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_at_most(key, max)
    }

    fn get_to_file(&self, key: &str, max: u64, dest: &Path) -> Result<u64, StoreError> {
        self.inner.get_to_file(key, max, dest)
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.inner.size(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }

    fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        self.inner.delete_many(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_are_paced_to_the_rate_and_an_idle_store_does_not_bank_bandwidth() {
        let mut p = Pacer { bytes_per_sec: 1_000_000, next: None };
        let t0 = Instant::now();
        assert_eq!(p.reserve(t0, 500_000), Duration::ZERO, "the first put starts at once");
        assert_eq!(p.reserve(t0, 500_000), Duration::from_millis(500), "the next waits for the first's half second");
        assert_eq!(p.reserve(t0, 1), Duration::from_secs(1));
        // Long idle: the next put starts at once, and does not get the idle time as credit.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve(later, 2_000_000), Duration::ZERO);
        assert_eq!(p.reserve(later, 1), Duration::from_secs(2));
    }
}
