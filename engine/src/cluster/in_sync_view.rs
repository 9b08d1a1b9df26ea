//! A stream's in-sync sets as the control store holds them, for status
//! ([`weir_wire::msg::MemberInfo::in_sync`]): a thread of its own reads every partition's key
//! about once a period, so any node shows every set, also one whose primary is down (the
//! primary's own status shows only what it last wrote).
//!
//! Invariants: the view only ever holds what one read found, in partition order; a read that
//! fails leaves the last one standing; a key that does not decode is left out (and logged).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_wire::StreamId;
use weir_wire::msg::InSyncEntry;

use super::{InSyncRecord, Keys};
use crate::control::{ControlError, ControlStore};

/// Keys read at most per pass: far more partitions than a stream has.
const MAX_KEYS: usize = 4096;

/// The last read of a stream's in-sync keys, refreshed by its thread until dropped.
pub struct InSyncView {
    entries: Arc<Mutex<(Vec<InSyncEntry>, Option<Instant>)>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl InSyncView {
    /// Reads stream `stream`'s in-sync keys on `store` now and every `every` after.
    pub fn start(
        store: Arc<dyn ControlStore>,
        keys: &Keys,
        stream: StreamId,
        every: Duration,
    ) -> std::io::Result<Self> {
        let entries = Arc::new(Mutex::new((Vec::new(), None)));
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s, prefix) = (entries.clone(), stop.clone(), keys.in_sync_prefix(stream));
        let thread = std::thread::Builder::new().name("in-sync-view".into()).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                match read(store.as_ref(), &prefix) {
                    Ok(found) => *e.lock().unwrap_or_else(|p| p.into_inner()) = (found, Some(Instant::now())),
                    Err(err) => tracing::debug!(error = %err, "cannot read the in-sync sets for status"),
                }
                while !s.load(Ordering::Relaxed) && started.elapsed() < every {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })?;
        Ok(Self { entries, stop, thread: Some(thread) })
    }

    /// The sets as last read (none before the first read).
    pub fn entries(&self) -> Vec<InSyncEntry> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// How long ago the last read that succeeded was (`None`: none yet).
    pub fn age(&self) -> Option<Duration> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).1.map(|t| t.elapsed())
    }
}

impl Drop for InSyncView {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Every record under `prefix`, in partition order.
pub(super) fn read(store: &dyn ControlStore, prefix: &str) -> Result<Vec<InSyncEntry>, ControlError> {
    let mut found: Vec<InSyncEntry> = store
        .list(prefix, MAX_KEYS)?
        .into_iter()
        .filter_map(|(key, entry)| {
            let partition: u32 = key.strip_prefix(prefix)?.parse().ok()?;
            match InSyncRecord::decode(&key, &entry.value) {
                Ok(r) => Some(InSyncEntry { partition, primary: r.primary, follower: r.follower, in_sync: r.in_sync }),
                Err(e) => {
                    tracing::warn!(key, error = %e, "an in-sync key that does not decode: left out of status");
                    None
                }
            }
        })
        .collect();
    found.sort_by_key(|e| e.partition);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ControlInSync, Fence};
    use crate::control::{MemControl, Op};
    use weir_wire::NodeId;

    /// Partitions 0 and 2 written by node 2's run (0 in, 2 out), and a damaged key beside them.
    fn written(store: &Arc<MemControl>, keys: &Keys) {
        let lease = store.grant(Duration::from_secs(5)).unwrap();
        let member = Op::Put { key: keys.member(NodeId(2)), value: b"m".to_vec(), lease: Some(lease) };
        store.txn(&[], &[member]).unwrap();
        let fence = Fence::new(keys, StreamId(1), NodeId(2), lease, 0);
        let isr = ControlInSync::new(store.clone(), keys, StreamId(1), NodeId(2), fence);
        isr.set(2, NodeId(3), false, 1).unwrap();
        isr.set(0, NodeId(1), true, 2).unwrap();
        let damaged = Op::Put { key: keys.in_sync(StreamId(1), 1), value: b"not a record".to_vec(), lease: None };
        // Another stream's set is not this one's.
        let other = Op::Put { key: keys.in_sync(StreamId(10), 0), value: b"x".to_vec(), lease: None };
        store.txn(&[], &[damaged, other]).unwrap();
    }

    #[test]
    fn the_view_holds_every_partitions_set_in_order_and_leaves_out_a_damaged_key() {
        let store = Arc::new(MemControl::new());
        let keys = Keys::new("c");
        written(&store, &keys);
        let got = read(store.as_ref(), &keys.in_sync_prefix(StreamId(1))).unwrap();
        let want = vec![
            InSyncEntry { partition: 0, primary: NodeId(2), follower: NodeId(1), in_sync: true },
            InSyncEntry { partition: 2, primary: NodeId(2), follower: NodeId(3), in_sync: false },
        ];
        assert_eq!(got, want);
        // The thread's view, read at once.
        let view = InSyncView::start(store.clone(), &keys, StreamId(1), Duration::from_secs(60)).unwrap();
        let t0 = Instant::now();
        while view.entries().is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(10), "the view never read the keys");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(view.entries(), want);
        assert!(view.age().is_some_and(|a| a < Duration::from_secs(60)), "{:?}", view.age());
    }
}
